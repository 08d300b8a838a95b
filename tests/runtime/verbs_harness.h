// The verbs backend's harness for the transport conformance suite (contract
// in transport_harness.h): an in-process DonorServer serving verbs on the
// RDMA interface's address, one DonorSession and a VerbsTransport on top.
//
//   #include "tests/runtime/verbs_harness.h"   // defines FARMEM_VERBS_HARNESS
//   using Backends = ::testing::Types<... FARMEM_VERBS_HARNESS>;
//
// Active only when the test target defines FARMEM_VERBS_CONFORMANCE and links
// farmem::verbs (tests/runtime/CMakeLists.txt does both when rdma-core is
// found). On a host without an RDMA device every verbs test is skipped with
// the reason; in the Soft-RoCE guest (tools/softroce/verbs_tests.sh) they
// run for real against rxe0 at 10.0.0.1 (FARMEM_VERBS_TEST_ADDR overrides).
#pragma once

#if defined(FARMEM_VERBS_CONFORMANCE)

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/verbs_transport.h"
#include "runtime/wire.h"

namespace farmem::testing {

inline std::string verbs_test_addr() {
  const char* a = std::getenv("FARMEM_VERBS_TEST_ADDR");
  return a != nullptr && *a != '\0' ? a : "10.0.0.1";
}

struct VerbsHarness {
  using Backend = VerbsTransport;
  static constexpr const char* kName = "verbs";
  // An op already executed by the responder may complete kOk after the
  // donor stopped; the rest complete kUnavailable.
  static constexpr bool kKillFailsOutstanding = false;
  static constexpr uint64_t kSlabSize = 2 * uint64_t{wire::kMaxIoLength};
  static constexpr ServerId kServer = 7;

  void SetUp() {
    const std::string addr = verbs_test_addr();
    std::string why;
    if (!verbs::reachable(addr, &why))
      GTEST_SKIP() << "verbs: no RDMA device reaches " << addr << " (" << why
                   << "); run it in the Soft-RoCE guest: tools/softroce/verbs_tests.sh";
    DonorOptions o;
    o.listen = {addr, 0};
    o.capacity = 4 * kSlabSize;
    o.slab_size = kSlabSize;
    o.token = "verbs-conformance-token";
    o.try_hugepages = false;
    o.transport = DonorTransportMode::kVerbs;
    auto srv = DonorServer::start(o);
    ASSERT_TRUE(srv.ok()) << srv.status().to_string();
    server_ = std::move(*srv);

    DonorClientOptions c;
    c.server = {addr, server_->port()};
    c.token = o.token;
    c.io_timeout_ms = 5000;
    auto s = DonorSession::connect(c);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    session_ = std::move(*s);

    auto t = VerbsTransport::create();
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    transport_ = std::move(*t);
    Status st = transport_->add_server(kServer, session_.get());
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto lease = session_->lease(2 * kSlabSize);
    ASSERT_TRUE(lease.ok()) << lease.status().to_string();
    slabs_ = *lease;
    ASSERT_EQ(slabs_.size(), 2u);
    for (const SlabDesc& d : slabs_) {
      ASSERT_NE(d.rkey, 0u) << "slab " << d.slab << " leased without an rkey";
      st = transport_->add_slab(kServer, d);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
  }
  void TearDown() {
    transport_.reset();
    session_.reset();
    server_.reset();
  }

  Backend& transport() { return *transport_; }
  ServerId server() const { return kServer; }
  const std::vector<SlabDesc>& slabs() const { return slabs_; }
  void kill_server() {
    if (server_) server_->stop();
  }
  ServerId unknown_server() const { return kServer + 1; }

 private:
  std::unique_ptr<DonorServer> server_;
  std::unique_ptr<DonorSession> session_;
  std::unique_ptr<VerbsTransport> transport_;
  std::vector<SlabDesc> slabs_;
};

}  // namespace farmem::testing

#define FARMEM_VERBS_HARNESS , ::farmem::testing::VerbsHarness

#endif  // FARMEM_VERBS_CONFORMANCE
