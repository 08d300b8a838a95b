// Isolation over verbs (invariant 7), on real verbs hardware (Soft-RoCE in
// the guest: tools/softroce/verbs_tests.sh). Two clients of one farmemd,
// each with its own session and transport (as two processes would have):
// a client that uses the other's address and rkey is refused by the
// hardware path (its op completes kPermissionDenied), moves no byte, and the
// other client goes on unharmed. Skipped on a host without an RDMA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/verbs_transport.h"
#include "runtime/wire.h"

namespace farmem {
namespace {

constexpr uint64_t kSlab = 1u << 20;
constexpr ServerId kServer = 1;
constexpr size_t kBuf = 1u << 20;
constexpr const char* kToken = "verbs-isolation-token";

std::string test_addr() {
  const char* a = std::getenv("FARMEM_VERBS_TEST_ADDR");
  return a != nullptr && *a != '\0' ? a : "10.0.0.1";
}

void fill_pattern(uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<uint8_t>(x >> 24);
  }
}

// One client: a session, a transport, a registered buffer, a queue, a lease.
struct Client {
  std::unique_ptr<DonorSession> session;
  std::unique_ptr<VerbsTransport> transport;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kBuf);
  std::unique_ptr<VerbsTransport::Queue> q;
  std::vector<SlabDesc> slabs;

  void open(const Endpoint& ep) {
    DonorClientOptions c;
    c.server = ep;
    c.token = kToken;
    auto s = DonorSession::connect(c);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    session = std::move(*s);
    auto t = VerbsTransport::create();
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    transport = std::move(*t);
    Status st = transport->add_server(kServer, session.get());
    ASSERT_TRUE(st.ok()) << st.to_string();
    st = transport->register_buffer(buf.data(), buf.size());
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto l = session->lease(kSlab);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    slabs = *l;
    ASSERT_EQ(slabs.size(), 1u);
    st = transport->add_slab(kServer, slabs[0]);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto qq = transport->open_queue();
    ASSERT_TRUE(qq.ok()) << qq.status().to_string();
    q = std::move(*qq);
  }
  ~Client() {
    q.reset();
    transport.reset();
    session.reset();
  }

  Errc run(IoKind kind, SlabId slab, uint64_t offset, uint32_t len, uint8_t* local) {
    IoOp op{kind, len, {kServer, slab, offset}, local, 77};
    if (Errc e = q->post({&op, 1}); e != Errc::kOk) return e;
    IoCompletion c[1];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (q->wait(c, 1000) == 1) {
        EXPECT_EQ(c[0].cookie, 77u);
        return c[0].status;
      }
    }
    return Errc::kTimeout;
  }
};

class VerbsIsolation : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string addr = test_addr();
    std::string why;
    if (!verbs::reachable(addr, &why))
      GTEST_SKIP() << "no RDMA device reaches " << addr << " (" << why
                   << "); run in the Soft-RoCE guest: tools/softroce/verbs_tests.sh";
    DonorOptions o;
    o.listen = {addr, 0};
    o.capacity = 4 * kSlab;
    o.slab_size = kSlab;
    o.token = kToken;
    o.try_hugepages = false;
    o.transport = DonorTransportMode::kVerbs;
    auto srv = DonorServer::start(o);
    ASSERT_TRUE(srv.ok()) << srv.status().to_string();
    server_ = std::move(*srv);
    const Endpoint ep{addr, server_->port()};
    a_.open(ep);
    if (HasFatalFailure()) return;
    b_.open(ep);
  }

  // B's first 64 KiB hold a known pattern, written and read back by B.
  void seed_b() {
    fill_pattern(b_.buf.data(), 65536, 5);
    ASSERT_EQ(b_.run(IoKind::kWrite, b_.slabs[0].slab, 0, 65536, b_.buf.data()), Errc::kOk);
  }
  void expect_b_intact() {
    uint8_t* dst = b_.buf.data() + 65536;
    std::memset(dst, 0, 65536);
    ASSERT_EQ(b_.run(IoKind::kRead, b_.slabs[0].slab, 0, 65536, dst), Errc::kOk);
    EXPECT_EQ(std::memcmp(dst, b_.buf.data(), 65536), 0) << "B's bytes changed";
  }
  // A's queue works again on A's own slab (it reconnects after the error).
  void expect_a_works() {
    fill_pattern(a_.buf.data(), 8192, 9);
    ASSERT_EQ(a_.run(IoKind::kWrite, a_.slabs[0].slab, 4096, 8192, a_.buf.data()), Errc::kOk);
    std::memset(a_.buf.data() + 8192, 0, 8192);
    ASSERT_EQ(a_.run(IoKind::kRead, a_.slabs[0].slab, 4096, 8192, a_.buf.data() + 8192), Errc::kOk);
    EXPECT_EQ(std::memcmp(a_.buf.data(), a_.buf.data() + 8192, 8192), 0);
  }

  // Destroyed in reverse: clients before the server.
  std::unique_ptr<DonorServer> server_;
  Client a_, b_;
};

TEST_F(VerbsIsolation, SlabsOfEachSessionHaveTheirOwnKeys) {
  ASSERT_NE(a_.slabs[0].slab, b_.slabs[0].slab);
  EXPECT_NE(a_.slabs[0].rkey, b_.slabs[0].rkey);
  EXPECT_NE(a_.slabs[0].addr, 0u);
  EXPECT_EQ(a_.slabs[0].size, kSlab);
}

TEST_F(VerbsIsolation, AnotherClientsAddressAndRkeyAreRefusedByTheHardware) {
  seed_b();
  // A adds B's slab exactly as B leased it: address, rkey, size.
  Status st = a_.transport->add_slab(kServer, b_.slabs[0]);
  ASSERT_TRUE(st.ok()) << st.to_string();
  uint8_t* dst = a_.buf.data() + 65536;
  std::memset(dst, 0xAB, 65536);
  EXPECT_EQ(a_.run(IoKind::kRead, b_.slabs[0].slab, 0, 65536, dst), Errc::kPermissionDenied);
  EXPECT_TRUE(std::all_of(dst, dst + 65536, [](uint8_t x) { return x == 0xAB; }))
      << "a refused READ delivered bytes";
  std::memset(a_.buf.data(), 0x5A, 4096);
  EXPECT_EQ(a_.run(IoKind::kWrite, b_.slabs[0].slab, 0, 4096, a_.buf.data()),
            Errc::kPermissionDenied);
  expect_b_intact();
  expect_a_works();
  // And B goes on writing and reading.
  seed_b();
  expect_b_intact();
}

TEST_F(VerbsIsolation, OwnRkeyDoesNotReachBeyondOwnSlab) {
  seed_b();
  // A's own rkey with B's address: the MR covers A's slab only.
  SlabDesc forged = a_.slabs[0];
  forged.slab = a_.slabs[0].slab + 1000;
  forged.addr = b_.slabs[0].addr;
  Status st = a_.transport->add_slab(kServer, forged);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(a_.run(IoKind::kWrite, forged.slab, 0, 4096, a_.buf.data()), Errc::kPermissionDenied);
  EXPECT_EQ(a_.run(IoKind::kRead, forged.slab, 0, 4096, a_.buf.data()), Errc::kPermissionDenied);
  expect_b_intact();
  expect_a_works();
}

TEST_F(VerbsIsolation, ReleasedSlabsKeyIsRevoked) {
  const SlabDesc old = a_.slabs[0];
  fill_pattern(a_.buf.data(), 4096, 11);
  ASSERT_EQ(a_.run(IoKind::kWrite, old.slab, 0, 4096, a_.buf.data()), Errc::kOk);
  Status st = a_.session->release(old.slab);
  ASSERT_TRUE(st.ok()) << st.to_string();
  // The transport still has the slab, but the donor deregistered its MR.
  EXPECT_EQ(a_.run(IoKind::kRead, old.slab, 0, 4096, a_.buf.data()), Errc::kPermissionDenied);
  // B leases it next (it is the only free slab B could get first? not
  // necessarily): whichever B gets reads as zeros.
  auto l = b_.session->lease(kSlab);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  st = b_.transport->add_slab(kServer, (*l)[0]);
  ASSERT_TRUE(st.ok()) << st.to_string();
  uint8_t* dst = b_.buf.data();
  std::memset(dst, 0xEE, 4096);
  ASSERT_EQ(b_.run(IoKind::kRead, (*l)[0].slab, 0, 4096, dst), Errc::kOk);
  EXPECT_TRUE(std::all_of(dst, dst + 4096, [](uint8_t x) { return x == 0; }));
}

}  // namespace
}  // namespace farmem
