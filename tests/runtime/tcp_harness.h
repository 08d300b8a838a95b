// The tcp backend's harnesses for the transport conformance suite (contract
// in transport_harness.h): an in-process DonorServer on 127.0.0.1:0, one
// DonorSession and a TcpTransport on top. TcpHarness keeps every op on the
// wire (DonorOptions::local_clients off); TcpLocalHarness lets the client,
// which is on this host, read and write the slabs one-sided
// (tcp_transport.cc "Local donors"), and checks that it does.
//
//   #include "tests/runtime/tcp_harness.h"   // defines FARMEM_TCP_HARNESS
//   using Backends = ::testing::Types<LoopbackHarness FARMEM_TCP_HARNESS>;
//
// Active only when the test target defines FARMEM_TCP_CONFORMANCE and links
// farmem::donor (tests/runtime/CMakeLists.txt does both), so that a build
// without the daemon still compiles the suite for the other backends.
#pragma once

#if defined(FARMEM_TCP_CONFORMANCE)

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/tcp_transport.h"
#include "runtime/wire.h"
#include "tests/runtime/local_donor.h"

namespace farmem::testing {

template <bool kLocal>
struct TcpHarnessT {
  using Backend = TcpTransport;
  static constexpr const char* kName = kLocal ? "tcp-local" : "tcp";
  // An op already on the wire may have been served before the daemon stopped.
  static constexpr bool kKillFailsOutstanding = false;
  static constexpr uint64_t kSlabSize = 2 * uint64_t{wire::kMaxIoLength};
  static constexpr ServerId kServer = 5;

  // follow_cpu: DonorOptions::follow_local_senders (on by default).
  void SetUp(bool follow_cpu = true) {
    if (kLocal && !one_sided_allowed())
      GTEST_SKIP() << "process_vm_readv is not allowed here: no one-sided path";
    DonorOptions o;
    o.follow_local_senders = follow_cpu;
    o.local_clients = kLocal;
    o.listen = {"127.0.0.1", 0};
    o.capacity = 4 * kSlabSize;
    o.slab_size = kSlabSize;
    o.token = "tcp-conformance-token";
    o.try_hugepages = false;
    auto srv = DonorServer::start(o);
    ASSERT_TRUE(srv.ok()) << srv.status().to_string();
    server_ = std::move(*srv);

    DonorClientOptions c;
    c.server = {"127.0.0.1", server_->port()};
    c.token = o.token;
    c.io_timeout_ms = 5000;
    auto s = DonorSession::connect(c);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    session_ = std::move(*s);

    transport_ = std::make_unique<TcpTransport>();
    Status st = transport_->add_server(kServer, session_.get());
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto lease = session_->lease(2 * kSlabSize);
    ASSERT_TRUE(lease.ok()) << lease.status().to_string();
    slabs_ = *lease;
    ASSERT_EQ(slabs_.size(), 2u);
    for (const SlabDesc& d : slabs_) {
      st = transport_->add_slab(kServer, d);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
    ASSERT_EQ(transport_->local_slabs(), kLocal ? slabs_.size() : 0u);
    ASSERT_EQ(transport_->local_files(), kLocal && take_fd_allowed() ? slabs_.size() : 0u);
  }
  // Reverse order of construction: the transport points at the session,
  // the session talks to the server.
  void TearDown() {
    transport_.reset();
    session_.reset();
    server_.reset();
  }

  Backend& transport() { return *transport_; }
  DonorSession& session() { return *session_; }
  ServerId server() const { return kServer; }
  const std::vector<SlabDesc>& slabs() const { return slabs_; }
  void kill_server() {
    if (server_) server_->stop();
  }
  ServerId unknown_server() const { return kServer + 1; }

 private:
  std::unique_ptr<DonorServer> server_;
  std::unique_ptr<DonorSession> session_;
  std::unique_ptr<TcpTransport> transport_;
  std::vector<SlabDesc> slabs_;
};

using TcpHarness = TcpHarnessT<false>;
using TcpLocalHarness = TcpHarnessT<true>;

}  // namespace farmem::testing

#define FARMEM_TCP_HARNESS , ::farmem::testing::TcpHarness, ::farmem::testing::TcpLocalHarness

#endif  // FARMEM_TCP_CONFORMANCE
