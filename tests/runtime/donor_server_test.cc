// DonorServer against raw clients: the protocol round trip, the tcp data
// path, and above all invariant 7 (DESIGN.md): every bad input is refused
// with a clear error, the daemon keeps serving everyone else, and no client
// reaches another's memory. Each hostile test ends by checking that a fresh,
// well-behaved client is still served byte-exact.
#include "runtime/donor_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "tests/runtime/local_donor.h"
#include "tests/runtime/raw_client.h"

namespace farmem {
namespace {

using test::RawClient;
using ::testing::HasSubstr;
using wire::MsgType;

constexpr char kToken[] = "donor-test-token";
constexpr uint64_t kSlab = 1 << 20;

DonorOptions test_opts() {
  DonorOptions o;
  o.listen = {"127.0.0.1", 0};
  o.capacity = 16 * kSlab;
  o.slab_size = kSlab;
  o.token = kToken;
  o.try_hugepages = false;
  o.heartbeat_ms = 1000;
  o.grace_ms = 20000;
  o.handshake_timeout_ms = 3000;
  o.send_timeout_ms = 3000;
  o.local_clients = false;  // the wire path; LocalClients* turn it on
  return o;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A frame header with arbitrary (possibly invalid) fields.
std::vector<uint8_t> raw_header(uint16_t type, uint32_t len, uint16_t flags = 0, uint64_t tag = 9) {
  std::vector<uint8_t> b(wire::kHeaderSize);
  wire::put_u32(b.data(), len);
  wire::put_u16(b.data() + 4, type);
  wire::put_u16(b.data() + 6, flags);
  wire::put_u64(b.data() + 8, tag);
  return b;
}

// Polls `cond` until it holds or the deadline passes (a bounded wait on a
// condition, not a sleep standing in for synchronisation).
bool eventually(const std::function<bool()>& cond, int timeout_ms = 5000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A well-behaved client: a control session and one data connection.
struct Client {
  RawClient ctl, data;
  wire::Welcome welcome;
};

class DonorServerTest : public ::testing::Test {
 protected:
  void start(const DonorOptions& o = test_opts()) {
    auto r = DonorServer::start(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    srv_ = std::move(*r);
  }
  uint16_t port() const { return srv_->port(); }

  void connect(Client* c, uint64_t client_id = 1) {
    ASSERT_TRUE(c->ctl.connect(port()).ok());
    auto w = c->ctl.handshake_control(kToken, client_id);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    c->welcome = *w;
    ASSERT_TRUE(c->data.connect(port()).ok());
    Status st = c->data.attach(w->session_id, w->secret);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }

  // A fresh client leases, writes, reads back byte-exact and releases.
  void expect_served(uint32_t seed = 77) {
    SCOPED_TRACE("a well-behaved client afterwards");
    Client c;
    ASSERT_NO_FATAL_FAILURE(connect(&c, 1000 + seed));
    auto l = c.ctl.lease(kSlab);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    ASSERT_EQ(l->size(), 1u);
    uint32_t s = (*l)[0].slab;
    auto data = pattern(8192, seed);
    Status st = c.data.write(s, 4096, data);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto back = c.data.read(s, 4096, 8192);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, data);
    ASSERT_TRUE(c.ctl.release(s).ok());
  }

  wire::StatsReply stats() const { return srv_->stats(); }

  std::unique_ptr<DonorServer> srv_;
};

// ---- Authentication and the handshake -----------------------------------------

TEST_F(DonorServerTest, WrongTokenIsRefused) {
  start();
  RawClient c;
  ASSERT_TRUE(c.connect(port()).ok());
  auto w = c.handshake_control("not-the-token");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Errc::kUnauthenticated);
  EXPECT_THAT(w.status().message(), HasSubstr("token does not match"));
  EXPECT_TRUE(c.wait_closed());
  EXPECT_EQ(stats().errors, 1u);
  EXPECT_EQ(stats().clients, 0u);
  expect_served();
}

TEST_F(DonorServerTest, ZeroMacIsRefused) {
  start();
  RawClient c;
  ASSERT_TRUE(c.connect(port()).ok());
  auto w = c.handshake_control("");  // all-zero MAC
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Errc::kUnauthenticated);
  EXPECT_TRUE(c.wait_closed());
  expect_served();
}

TEST_F(DonorServerTest, InsecureDonorAcceptsAnyMac) {
  DonorOptions o = test_opts();
  o.token.clear();
  o.insecure = true;
  start(o);
  RawClient c;
  ASSERT_TRUE(c.connect(port()).ok());
  auto w = c.handshake_control("");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_NE(w->session_id, 0u);
}

TEST_F(DonorServerTest, WrongVersionIsRefused) {
  start();
  RawClient c;
  ASSERT_TRUE(c.connect(port()).ok());
  std::vector<uint8_t> b;
  wire::Hello h;
  h.version = wire::kVersion + 1;
  wire::encode_hello(b, 5, h);
  ASSERT_TRUE(c.send_raw(b).ok());
  Status st = c.expect_error();
  EXPECT_EQ(st.code(), Errc::kVersionMismatch) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("version 2"));
  EXPECT_TRUE(c.wait_closed());
  expect_served();
}

TEST_F(DonorServerTest, BadMagicIsRefused) {
  start();
  RawClient c;
  ASSERT_TRUE(c.connect(port()).ok());
  std::vector<uint8_t> b;
  wire::Hello h;
  h.magic = 0x50545448;  // "HTTP"
  wire::encode_hello(b, 5, h);
  ASSERT_TRUE(c.send_raw(b).ok());
  Status st = c.expect_error();
  EXPECT_EQ(st.code(), Errc::kProtocol) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("magic"));
  EXPECT_TRUE(c.wait_closed());
  expect_served();
}

TEST_F(DonorServerTest, RequestBeforeHandshakeIsRefused) {
  start();
  RawClient c;
  ASSERT_TRUE(c.connect(port()).ok());
  std::vector<uint8_t> b;
  wire::encode_lease(b, 5, {kSlab});
  ASSERT_TRUE(c.send_raw(b).ok());
  Status st = c.expect_error();
  EXPECT_EQ(st.code(), Errc::kProtocol) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("expected HELLO as the first frame, got LEASE"));
  EXPECT_TRUE(c.wait_closed());
  EXPECT_EQ(stats().leased, 0u);
  expect_served();
}

TEST_F(DonorServerTest, SilentConnectionIsClosedAfterHandshakeTimeout) {
  DonorOptions o = test_opts();
  o.handshake_timeout_ms = 300;
  start(o);
  RawClient c;
  ASSERT_TRUE(c.connect(port()).ok());
  Status st = c.expect_error(5000);
  EXPECT_EQ(st.code(), Errc::kTimeout) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("300 ms handshake timeout"));
  EXPECT_TRUE(c.wait_closed());
  // Half a handshake is bounded by the same deadline.
  RawClient d;
  ASSERT_TRUE(d.connect(port()).ok());
  ASSERT_TRUE(d.hello(wire::Role::kControl).ok());
  st = d.expect_error(5000);
  EXPECT_EQ(st.code(), Errc::kTimeout) << st.to_string();
  EXPECT_TRUE(d.wait_closed());
  expect_served();
}

TEST_F(DonorServerTest, AttachWithWrongSecretIsRefused) {
  start();
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  RawClient d;
  ASSERT_TRUE(d.connect(port()).ok());
  auto secret = a.welcome.secret;
  secret[0] ^= 1;
  Status st = d.attach(a.welcome.session_id, secret);
  EXPECT_EQ(st.code(), Errc::kUnauthenticated) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("session secret"));
  EXPECT_TRUE(d.wait_closed());
  // The session under attack is unharmed.
  auto l = a.ctl.lease(kSlab);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto data = pattern(100, 1);
  ASSERT_TRUE(a.data.write((*l)[0].slab, 0, data).ok());
  expect_served();
}

TEST_F(DonorServerTest, AttachToUnknownSessionIsRefused) {
  start();
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  RawClient d;
  ASSERT_TRUE(d.connect(port()).ok());
  Status st = d.attach(a.welcome.session_id ^ 0x5555, a.welcome.secret);
  EXPECT_EQ(st.code(), Errc::kNotFound) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("does not exist"));
  EXPECT_TRUE(d.wait_closed());
  expect_served();
}

TEST_F(DonorServerTest, MaxClientsIsEnforced) {
  DonorOptions o = test_opts();
  o.max_clients = 2;
  start(o);
  Client a, b;
  ASSERT_NO_FATAL_FAILURE(connect(&a, 1));
  ASSERT_NO_FATAL_FAILURE(connect(&b, 2));
  RawClient c;
  ASSERT_TRUE(c.connect(port()).ok());
  auto w = c.handshake_control(kToken, 3);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), Errc::kResourceExhausted);
  EXPECT_THAT(w.status().message(), HasSubstr("--max-clients"));
  a.ctl.close();
  ASSERT_TRUE(eventually([&] { return stats().clients == 1; }));
  expect_served();
}

TEST_F(DonorServerTest, ConnectionLimitsAreEnforced) {
  DonorOptions o = test_opts();
  o.max_connections_per_session = 2;
  o.max_connections = 5;
  start(o);
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));  // control + data 1
  RawClient d2, d3;
  ASSERT_TRUE(d2.connect(port()).ok());
  ASSERT_TRUE(d2.attach(a.welcome.session_id, a.welcome.secret).ok());
  ASSERT_TRUE(d3.connect(port()).ok());
  Status st = d3.attach(a.welcome.session_id, a.welcome.secret);
  EXPECT_EQ(st.code(), Errc::kResourceExhausted) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("already has 2 data connections"));
  EXPECT_TRUE(d3.wait_closed());
  ASSERT_TRUE(eventually([&] { return stats().connections == 3; }));
  // Two more connections fill the server; the next is refused at once.
  RawClient e1, e2, e3;
  ASSERT_TRUE(e1.connect(port()).ok());
  ASSERT_TRUE(e2.connect(port()).ok());
  ASSERT_TRUE(eventually([&] { return stats().connections == 5; }));
  ASSERT_TRUE(e3.connect(port()).ok());
  st = e3.expect_error();
  EXPECT_EQ(st.code(), Errc::kResourceExhausted) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("5 connections open"));
  EXPECT_TRUE(e3.wait_closed());
  e1.close();
  e2.close();
  d2.close();
  ASSERT_TRUE(eventually([&] { return stats().connections == 2; }));
  expect_served();
}

TEST_F(DonorServerTest, IdleDataConnectionIsClosedButTheSessionStays) {
  DonorOptions o = test_opts();
  o.idle_data_timeout_ms = 200;
  start(o);
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  auto l = a.ctl.lease(kSlab);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(a.data.wait_closed());
  ASSERT_TRUE(a.ctl.heartbeat().ok());
  EXPECT_EQ(stats().leased, kSlab);
  RawClient d;
  ASSERT_TRUE(d.connect(port()).ok());
  ASSERT_TRUE(d.attach(a.welcome.session_id, a.welcome.secret).ok());
  auto data = pattern(64, 2);
  ASSERT_TRUE(d.write((*l)[0].slab, 0, data).ok());
}

// ---- Malformed frames -------------------------------------------------------------

TEST_F(DonorServerTest, TruncatedFrameEndsOnlyThatClient) {
  start();
  // Mid-handshake: HELLO header, 5 of its 16 payload bytes, then close.
  {
    RawClient c;
    ASSERT_TRUE(c.connect(port()).ok());
    std::vector<uint8_t> b;
    wire::encode_hello(b, 1, {});
    ASSERT_TRUE(c.send_raw({b.data(), wire::kHeaderSize + 5}).ok());
  }
  // In a session holding leases: LEASE header and 3 bytes, then close.
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  ASSERT_TRUE(a.ctl.lease(3 * kSlab).ok());
  EXPECT_EQ(stats().leased, 3 * kSlab);
  std::vector<uint8_t> b;
  wire::encode_lease(b, 7, {kSlab});
  ASSERT_TRUE(a.ctl.send_raw({b.data(), wire::kHeaderSize + 3}).ok());
  a.ctl.close();
  EXPECT_TRUE(a.data.wait_closed());  // the session's data connection goes too
  ASSERT_TRUE(eventually([&] { return stats().leased == 0 && stats().clients == 0; }));
  expect_served();
}

TEST_F(DonorServerTest, OversizedLengthFieldIsRefused) {
  start();
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  // Control connection: a LEASE claiming 4 GiB of payload.
  ASSERT_TRUE(a.ctl.send_raw(raw_header(static_cast<uint16_t>(MsgType::kLease), 0xFFFFFFFF)).ok());
  Status st = a.ctl.expect_error();
  EXPECT_EQ(st.code(), Errc::kProtocol) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("payload length"));
  EXPECT_TRUE(a.ctl.wait_closed());
  // Data connection of another session: a WRITE one byte over the limit.
  Client b;
  ASSERT_NO_FATAL_FAILURE(connect(&b, 2));
  ASSERT_TRUE(b.data
                  .send_raw(raw_header(static_cast<uint16_t>(MsgType::kWrite),
                                       wire::kIoReqSize + wire::kMaxIoLength + 1))
                  .ok());
  st = b.data.expect_error();
  EXPECT_EQ(st.code(), Errc::kProtocol) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("exceeds the maximum"));
  EXPECT_TRUE(b.data.wait_closed());
  // A WRITE whose length field disagrees with its frame.
  Client c;
  ASSERT_NO_FATAL_FAILURE(connect(&c, 3));
  auto l = c.ctl.lease(kSlab);
  ASSERT_TRUE(l.ok());
  auto hdr = raw_header(static_cast<uint16_t>(MsgType::kWrite), wire::kIoReqSize + 8);
  uint8_t pre[wire::kIoReqSize + 8] = {};
  wire::put_u32(pre, (*l)[0].slab);
  wire::put_u32(pre + 4, 4096);  // claims 4096, carries 8
  hdr.insert(hdr.end(), pre, pre + sizeof pre);
  ASSERT_TRUE(c.data.send_raw(hdr).ok());
  st = c.data.expect_error();
  EXPECT_EQ(st.code(), Errc::kProtocol) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("says 4096 bytes but its frame carries 8"));
  EXPECT_TRUE(c.data.wait_closed());
  EXPECT_EQ(stats().errors, 3u);
  expect_served();
}

TEST_F(DonorServerTest, UnknownOpcodeIsRefused) {
  start();
  for (int where = 0; where < 3; ++where) {
    SCOPED_TRACE(where);
    Client a;
    RawClient* conn = &a.ctl;
    if (where == 0) {
      ASSERT_TRUE(a.ctl.connect(port()).ok());  // before the handshake
    } else {
      ASSERT_NO_FATAL_FAILURE(connect(&a, 10 + where));
      if (where == 2) conn = &a.data;
    }
    ASSERT_TRUE(conn->send_raw(raw_header(99, 0)).ok());
    Status st = conn->expect_error();
    EXPECT_EQ(st.code(), Errc::kProtocol) << st.to_string();
    EXPECT_THAT(st.message(), HasSubstr("unknown message type"));
    EXPECT_TRUE(conn->wait_closed());
  }
  expect_served();
}

TEST_F(DonorServerTest, NonZeroFlagsAreRefused) {
  start();
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  ASSERT_TRUE(
      a.ctl.send_raw(raw_header(static_cast<uint16_t>(MsgType::kHeartbeat), 0, /*flags=*/1)).ok());
  Status st = a.ctl.expect_error();
  EXPECT_EQ(st.code(), Errc::kProtocol) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("non-zero flags"));
  EXPECT_TRUE(a.ctl.wait_closed());
  expect_served();
}

TEST_F(DonorServerTest, WrongMessageForConnectionRoleIsRefused) {
  start();
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  std::vector<uint8_t> b;
  wire::encode_io_req(b, MsgType::kRead, 3, {0, 16, 0}, nullptr);
  ASSERT_TRUE(a.ctl.send_raw(b).ok());
  Status st = a.ctl.expect_error();
  EXPECT_EQ(st.code(), Errc::kProtocol);
  EXPECT_THAT(st.message(), HasSubstr("READ is not allowed on a control connection"));
  b.clear();
  wire::encode_lease(b, 4, {kSlab});
  ASSERT_TRUE(a.data.send_raw(b).ok());
  st = a.data.expect_error();
  EXPECT_EQ(st.code(), Errc::kProtocol);
  EXPECT_THAT(st.message(), HasSubstr("LEASE is not allowed on a data connection"));
  expect_served();
}

TEST_F(DonorServerTest, RandomGarbageNeverHurtsTheDaemon) {
  start();
  std::mt19937 rng(20240611);
  for (int round = 0; round < 12; ++round) {
    SCOPED_TRACE(round);
    Client a;
    RawClient* conn = &a.ctl;
    int where = round % 3;  // before the handshake, on control, on data
    if (where == 0) {
      ASSERT_TRUE(a.ctl.connect(port()).ok());
    } else {
      ASSERT_NO_FATAL_FAILURE(connect(&a, 100 + round));
      ASSERT_TRUE(a.ctl.lease(kSlab).ok());
      if (where == 2) conn = &a.data;
    }
    std::vector<uint8_t> junk(1 + rng() % 700);
    for (auto& x : junk) x = static_cast<uint8_t>(rng());
    ASSERT_TRUE(conn->send_raw(junk).ok());
    shutdown(conn->fd(), SHUT_WR);
    EXPECT_TRUE(conn->wait_closed());
  }
  ASSERT_TRUE(eventually([&] { return stats().leased == 0 && stats().clients == 0; }));
  EXPECT_GE(stats().errors, 1u);
  expect_served();
}

// ---- Leases and the data path --------------------------------------------------------

TEST_F(DonorServerTest, ReadAndWriteOutsideOwnLeaseAreRefused) {
  start();
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  auto l = a.ctl.lease(kSlab);
  ASSERT_TRUE(l.ok());
  uint32_t s = (*l)[0].slab;
  auto data = pattern(4096, 3);
  ASSERT_TRUE(a.data.write(s, 0, data).ok());

  auto r = a.data.read(s, kSlab - 100, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kOutOfRange);
  EXPECT_THAT(r.status().message(),
              HasSubstr("READ of 4096 bytes at offset 1048476 is outside slab"));
  Status st = a.data.write(s, kSlab, data);
  EXPECT_EQ(st.code(), Errc::kOutOfRange) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("WRITE of 4096 bytes at offset 1048576 is outside slab"));
  st = a.data.write(s, UINT64_MAX - 10, data);  // must not wrap around
  EXPECT_EQ(st.code(), Errc::kOutOfRange) << st.to_string();

  uint32_t unleased = s == 15 ? 14 : 15;
  r = a.data.read(unleased, 0, 64);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("holds no lease"));
  st = a.data.write(1000000, 0, data);  // no such slab
  EXPECT_EQ(st.code(), Errc::kNotFound) << st.to_string();
  r = a.data.read(s, 0, 0);
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  r = a.data.read(s, 0, wire::kMaxIoLength + 1);
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);

  // Per-request refusals keep the connection; nothing was written.
  auto back = a.data.read(s, 0, 4096);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, data);
  EXPECT_EQ(stats().errors, 7u);
  EXPECT_EQ(stats().writes, 1u);
  expect_served();
}

TEST_F(DonorServerTest, AnotherClientsLeaseIsUnreachable) {
  start();
  Client a, b;
  ASSERT_NO_FATAL_FAILURE(connect(&a, 1));
  ASSERT_NO_FATAL_FAILURE(connect(&b, 2));
  auto la = a.ctl.lease(kSlab);
  auto lb = b.ctl.lease(kSlab);
  ASSERT_TRUE(la.ok() && lb.ok());
  uint32_t sa = (*la)[0].slab;
  auto secret = pattern(kSlab, 11);
  ASSERT_TRUE(a.data.write(sa, 0, secret).ok());

  auto r = b.data.read(sa, 0, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kPermissionDenied);
  EXPECT_THAT(r.status().message(), HasSubstr("leased to another client"));
  auto junk = pattern(65536, 12);
  Status st = b.data.write(sa, 4096, junk);
  EXPECT_EQ(st.code(), Errc::kPermissionDenied) << st.to_string();
  st = b.data.write(sa, kSlab * 4, junk);  // out of range too: still "not yours"
  EXPECT_EQ(st.code(), Errc::kPermissionDenied) << st.to_string();

  // A's bytes are untouched; B's connection still serves B.
  auto back = a.data.read(sa, 0, kSlab);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, secret);
  ASSERT_TRUE(b.data.write((*lb)[0].slab, 0, junk).ok());
  auto bb = b.data.read((*lb)[0].slab, 0, 65536);
  ASSERT_TRUE(bb.ok());
  EXPECT_EQ(*bb, junk);
  expect_served();
}

TEST_F(DonorServerTest, ReleaseOfAnotherClientsSlabIsRefused) {
  start();
  Client a, b;
  ASSERT_NO_FATAL_FAILURE(connect(&a, 1));
  ASSERT_NO_FATAL_FAILURE(connect(&b, 2));
  auto la = a.ctl.lease(kSlab);
  ASSERT_TRUE(la.ok());
  uint32_t sa = (*la)[0].slab;
  auto data = pattern(512, 5);
  ASSERT_TRUE(a.data.write(sa, 0, data).ok());
  Status st = b.ctl.release(sa);
  EXPECT_EQ(st.code(), Errc::kPermissionDenied) << st.to_string();
  EXPECT_THAT(st.message(), HasSubstr("leased to another client"));
  st = b.ctl.release(sa == 15 ? 14 : 15);
  EXPECT_EQ(st.code(), Errc::kNotFound) << st.to_string();
  EXPECT_EQ(stats().leased, kSlab);
  auto back = a.data.read(sa, 0, 512);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, data);
  ASSERT_TRUE(b.ctl.heartbeat().ok());  // per-request refusal: still connected
  expect_served();
}

TEST_F(DonorServerTest, LeaseBeyondCapacityIsRefused) {
  start();
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  auto l = a.ctl.lease(17 * kSlab);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Errc::kResourceExhausted);
  EXPECT_THAT(l.status().message(), HasSubstr("whole capacity"));
  ASSERT_TRUE(a.ctl.lease(10 * kSlab).ok());
  l = a.ctl.lease(7 * kSlab);  // fits the capacity, not what is left
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Errc::kResourceExhausted);
  EXPECT_THAT(l.status().message(), HasSubstr("only 6 of 16"));
  l = a.ctl.lease(0);
  EXPECT_EQ(l.status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(stats().leased, 10 * kSlab);
  ASSERT_TRUE(a.ctl.heartbeat().ok());
  expect_served();
}

TEST_F(DonorServerTest, LeaseBeyondQuotaIsRefused) {
  DonorOptions o = test_opts();
  o.quota_per_client = 2 * kSlab;
  start(o);
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  EXPECT_EQ(a.welcome.quota, 2 * kSlab);
  auto l = a.ctl.lease(3 * kSlab);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Errc::kResourceExhausted);
  EXPECT_THAT(l.status().message(), HasSubstr("quota"));
  ASSERT_TRUE(a.ctl.lease(2 * kSlab).ok());
  l = a.ctl.lease(1);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Errc::kResourceExhausted);
  EXPECT_EQ(stats().leased, 2 * kSlab);
  expect_served();  // a different client has its own quota
}

TEST_F(DonorServerTest, ClientThatNeverReadsRepliesIsDisconnected) {
  DonorOptions o = test_opts();
  o.send_timeout_ms = 300;
  start(o);
  Client a;
  ASSERT_TRUE(a.ctl.connect(port()).ok());
  auto w = a.ctl.handshake_control(kToken);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(a.data.connect(port(), /*rcvbuf=*/4096).ok());
  ASSERT_TRUE(a.data.attach(w->session_id, w->secret).ok());
  auto l = a.ctl.lease(kSlab);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(stats().connections, 2u);
  // 64 MiB of replies requested; none read.
  std::vector<uint8_t> b;
  for (int i = 0; i < 64; ++i)
    wire::encode_io_req(b, MsgType::kRead, i, {(*l)[0].slab, static_cast<uint32_t>(kSlab), 0},
                        nullptr);
  ASSERT_TRUE(a.data.send_raw(b).ok());
  Client c;  // served while A's connection is stuck
  ASSERT_NO_FATAL_FAILURE(connect(&c, 9));
  ASSERT_TRUE(c.ctl.heartbeat().ok());
  ASSERT_TRUE(eventually([&] { return stats().connections == 3; }, 10000))
      << "connections: " << stats().connections;
  EXPECT_LT(stats().reads, 64u);
  EXPECT_TRUE(a.data.wait_closed());
  ASSERT_TRUE(a.ctl.heartbeat().ok());  // only the stuck connection went
  expect_served();
}

TEST_F(DonorServerTest, EveryMessageRoundTrips) {
  start();
  RawClient ctl;
  ASSERT_TRUE(ctl.connect(port()).ok());
  auto ch = ctl.hello(wire::Role::kControl, 0xC11E);
  ASSERT_TRUE(ch.ok()) << ch.status().to_string();
  EXPECT_EQ(ch->version, wire::kVersion);
  EXPECT_EQ(ch->instance_id, srv_->instance_id());
  // AUTH by hand on top of the CHALLENGE seen above.
  std::vector<uint8_t> b;
  wire::Auth au;
  au.mac =
      auth_mac({reinterpret_cast<const uint8_t*>(kToken), sizeof kToken - 1}, ch->nonce, 0xC11E);
  wire::encode_auth(b, 77, au);
  ASSERT_TRUE(ctl.send_raw(b).ok());
  auto f = ctl.recv_frame();
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->header.type, MsgType::kWelcome);
  EXPECT_EQ(f->header.tag, 77u);
  wire::Welcome w;
  ASSERT_TRUE(wire::decode_welcome(f->payload, &w).ok());
  EXPECT_NE(w.session_id, 0u);
  EXPECT_EQ(w.capacity, 16 * kSlab);
  EXPECT_EQ(w.slab_size, kSlab);
  EXPECT_EQ(w.quota, 16 * kSlab);  // no per-client quota: all of it
  EXPECT_EQ(w.heartbeat_ms, 1000u);
  EXPECT_EQ(w.grace_ms, 20000u);
  EXPECT_EQ(w.instance_id, srv_->instance_id());

  RawClient data;
  ASSERT_TRUE(data.connect(port()).ok());
  ASSERT_TRUE(data.attach(w.session_id, w.secret).ok());

  auto l = ctl.lease(2 * kSlab);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  ASSERT_EQ(l->size(), 2u);
  for (const auto& d : *l) {
    EXPECT_EQ(d.size, kSlab);
    EXPECT_EQ(d.addr, 0u);  // tcp
    EXPECT_EQ(d.rkey, 0u);
  }
  ASSERT_TRUE(ctl.heartbeat().ok());

  // Pipelined: 32 WRITEs and 32 READs in one burst, answered in order.
  constexpr int kN = 32;
  std::vector<std::vector<uint8_t>> blocks;
  b.clear();
  for (int i = 0; i < kN; ++i) {
    blocks.push_back(pattern(1000 + 37 * i, 100 + i));
    wire::encode_io_req(
        b, MsgType::kWrite, 1000 + i,
        {(*l)[i % 2].slab, static_cast<uint32_t>(blocks[i].size()), uint64_t(i / 2) * 8192},
        blocks[i].data());
  }
  for (int i = 0; i < kN; ++i)
    wire::encode_io_req(
        b, MsgType::kRead, 2000 + i,
        {(*l)[i % 2].slab, static_cast<uint32_t>(blocks[i].size()), uint64_t(i / 2) * 8192},
        nullptr);
  ASSERT_TRUE(data.send_raw(b).ok());
  uint64_t bytes = 0;
  for (int i = 0; i < kN; ++i) {
    auto r = data.recv_frame();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->header.type, MsgType::kWritten);
    EXPECT_EQ(r->header.tag, uint64_t(1000 + i));
    bytes += blocks[i].size();
  }
  for (int i = 0; i < kN; ++i) {
    auto r = data.recv_frame();
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->header.type, MsgType::kReadData);
    EXPECT_EQ(r->header.tag, uint64_t(2000 + i));
    EXPECT_EQ(r->payload, blocks[i]);
  }

  auto s = ctl.stats();
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->capacity, 16 * kSlab);
  EXPECT_EQ(s->leased, 2 * kSlab);
  EXPECT_EQ(s->slab_size, kSlab);
  EXPECT_EQ(s->clients, 1u);
  EXPECT_EQ(s->connections, 2u);
  EXPECT_EQ(s->bytes_read, bytes);
  EXPECT_EQ(s->bytes_written, bytes);
  EXPECT_EQ(s->reads, uint64_t{kN});
  EXPECT_EQ(s->writes, uint64_t{kN});
  EXPECT_EQ(s->errors, 0u);
  EXPECT_EQ(s->sessions_expired, 0u);
  EXPECT_EQ(s->instance_id, srv_->instance_id());

  ASSERT_TRUE(ctl.release((*l)[0].slab).ok());
  ASSERT_TRUE(ctl.release((*l)[1].slab).ok());
  s = ctl.stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->leased, 0u);
}

TEST_F(DonorServerTest, CapacityNeverExceededUnder32ConcurrentClients) {
  start();
  constexpr int kClients = 32;
  constexpr uint32_t kSlabs = 16;
  std::vector<std::atomic<int>> owner(kSlabs);
  std::atomic<uint64_t> held{0};  // bytes the clients hold, by their own count
  std::atomic<bool> done{false};
  std::atomic<int> failures{0}, granted{0}, refused{0};

  std::thread sampler([&] {
    RawClient c;
    if (!c.connect(port()).ok() || !c.handshake_control(kToken, 999).ok()) {
      ++failures;
      return;
    }
    int samples = 0;
    while (!done.load() || samples == 0) {
      uint64_t mine = held.load();
      auto s = c.stats();
      if (!s.ok() || s->leased > s->capacity || mine > s->capacity) ++failures;
      ++samples;
    }
  });
  std::vector<std::thread> ts;
  for (int t = 1; t <= kClients; ++t) {
    ts.emplace_back([&, t] {
      RawClient c;
      if (!c.connect(port()).ok() || !c.handshake_control(kToken, t).ok()) {
        ++failures;
        return;
      }
      std::mt19937 rng(t);
      for (int i = 0; i < 25; ++i) {
        auto l = c.lease((rng() % 3 + 1) * kSlab);
        if (!l.ok()) {
          if (l.status().code() != Errc::kResourceExhausted) ++failures;
          ++refused;
          continue;
        }
        ++granted;
        held += l->size() * kSlab;
        for (const auto& d : *l) {
          int zero = 0;
          if (d.slab >= kSlabs || !owner[d.slab].compare_exchange_strong(zero, t)) ++failures;
        }
        for (const auto& d : *l) {
          if (d.slab < kSlabs) owner[d.slab].store(0);
          held -= kSlab;  // before the donor can lend it again
          if (!c.release(d.slab).ok()) ++failures;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  done = true;
  sampler.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(granted.load(), 0);
  EXPECT_EQ(granted.load() + refused.load(), kClients * 25);
  ASSERT_TRUE(eventually([&] { return stats().clients == 0 && stats().leased == 0; }));
}

TEST_F(DonorServerTest, LeasesReleasedOnDisconnect) {
  start();
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  ASSERT_TRUE(a.ctl.lease(5 * kSlab).ok());
  EXPECT_EQ(stats().leased, 5 * kSlab);
  EXPECT_EQ(stats().clients, 1u);
  a.ctl.close();
  EXPECT_TRUE(a.data.wait_closed());
  ASSERT_TRUE(eventually([&] { return stats().leased == 0; }));
  EXPECT_EQ(stats().clients, 0u);
  EXPECT_EQ(stats().sessions_expired, 0u);
  expect_served();
}

TEST_F(DonorServerTest, LeasesReleasedOnMissedHeartbeats) {
  DonorOptions o = test_opts();
  // B must survive a thread descheduled for a few hundred ms (ASan, ctest
  // -j2 on a loaded 2-core machine): grace is 20 heartbeat intervals.
  o.heartbeat_ms = 50;
  o.grace_ms = 1000;
  start(o);
  Client a, b;
  ASSERT_NO_FATAL_FAILURE(connect(&a, 1));
  ASSERT_NO_FATAL_FAILURE(connect(&b, 2));
  EXPECT_EQ(a.welcome.grace_ms, 1000u);
  ASSERT_TRUE(a.ctl.lease(3 * kSlab).ok());
  auto lb = b.ctl.lease(kSlab);
  ASSERT_TRUE(lb.ok());
  // A falls silent; B keeps heartbeating until A is gone.
  bool b_ok = true;
  ASSERT_TRUE(eventually(
      [&] {
        b_ok = b_ok && b.ctl.heartbeat().ok();
        return stats().sessions_expired == 1;
      },
      20000));
  EXPECT_TRUE(b_ok);
  EXPECT_TRUE(a.ctl.wait_closed());
  EXPECT_TRUE(a.data.wait_closed());
  EXPECT_EQ(stats().leased, kSlab);  // only B's
  EXPECT_EQ(stats().clients, 1u);
  auto data = pattern(256, 8);
  ASSERT_TRUE(b.data.write((*lb)[0].slab, 0, data).ok());
  ASSERT_TRUE(b.ctl.heartbeat().ok());
  EXPECT_EQ(stats().sessions_expired, 1u);
}

TEST_F(DonorServerTest, SlabsAreZeroedBetweenClients) {
  DonorOptions o = test_opts();
  o.capacity = kSlab;  // one slab: B must get A's
  start(o);
  uint32_t slab;
  {
    Client a;
    ASSERT_NO_FATAL_FAILURE(connect(&a, 1));
    auto l = a.ctl.lease(kSlab);
    ASSERT_TRUE(l.ok());
    slab = (*l)[0].slab;
    ASSERT_TRUE(a.data.write(slab, 0, pattern(kSlab, 9)).ok());
  }
  ASSERT_TRUE(eventually([&] { return stats().leased == 0; }));
  Client b;
  ASSERT_NO_FATAL_FAILURE(connect(&b, 2));
  auto l = b.ctl.lease(kSlab);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  ASSERT_EQ((*l)[0].slab, slab);
  auto r = b.data.read(slab, 0, kSlab);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::vector<uint8_t>(kSlab, 0));
}

// "Local clients" (donor_server.cc): a client on loopback gets, per slab,
// a view in the donor (addr) and the donor's pid (rkey), with its session
// secret right after the view; the view is the slab (what the wire
// writes, the view reads, and the other way round); RELEASE and the
// session's end take the view away before the slab is zeroed and lent
// again.
TEST_F(DonorServerTest, LocalClientsGetAViewOfEachSlabUntilItLeaves) {
  if (!testing::one_sided_allowed()) GTEST_SKIP() << "process_vm_readv is not allowed here";
  DonorOptions o = test_opts();
  o.local_clients = true;
  o.capacity = 2 * kSlab;
  start(o);
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a, 1));
  auto l = a.ctl.lease(2 * kSlab);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  ASSERT_EQ(l->size(), 2u);
  for (const auto& d : *l) {
    ASSERT_NE(d.addr, 0u);
    EXPECT_EQ(d.rkey, static_cast<uint32_t>(getpid()));
    uint8_t proof[wire::kSecretSize];
    ASSERT_EQ(testing::read_own_memory(d.addr + d.size, proof, sizeof proof), 0);
    EXPECT_EQ(std::memcmp(proof, a.welcome.secret.data(), sizeof proof), 0);
  }
  EXPECT_EQ(srv_->local_slabs_lent(), 2u);
  const auto& d0 = (*l)[0];
  const auto& d1 = (*l)[1];
  // The wire's WRITE is in the view; a write to the view is what READ sees.
  const auto pat = pattern(8192, 5);
  ASSERT_TRUE(a.data.write(d0.slab, 4096, pat).ok());
  std::vector<uint8_t> seen(8192);
  ASSERT_EQ(testing::read_own_memory(d0.addr + 4096, seen.data(), seen.size()), 0);
  EXPECT_EQ(seen, pat);
  const auto pat2 = pattern(4096, 6);
  iovec lw{const_cast<uint8_t*>(pat2.data()), pat2.size()};
  iovec rw{reinterpret_cast<void*>(d1.addr), pat2.size()};
  ASSERT_EQ(process_vm_writev(getpid(), &lw, 1, &rw, 1, 0), static_cast<ssize_t>(pat2.size()));
  auto r = a.data.read(d1.slab, 0, 4096);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, pat2);

  // RELEASE: the view and its proof go at once.
  ASSERT_TRUE(a.ctl.release(d0.slab).ok());
  EXPECT_EQ(testing::read_own_memory(d0.addr, seen.data(), 16), EFAULT);
  EXPECT_EQ(testing::read_own_memory(d0.addr + d0.size, seen.data(), 16), EFAULT);
  EXPECT_EQ(testing::read_own_memory(d1.addr, seen.data(), 16), 0)
      << "the other slab keeps its view";
  // The session's end takes the rest.
  a.ctl = RawClient();
  a.data = RawClient();
  ASSERT_TRUE(eventually([&] { return stats().leased == 0; }));
  EXPECT_EQ(testing::read_own_memory(d1.addr, seen.data(), 16), EFAULT);

  // The next client's slabs are zeroed (shared memory: MADV_REMOVE) and
  // have views of their own.
  Client b;
  ASSERT_NO_FATAL_FAILURE(connect(&b, 2));
  auto lb = b.ctl.lease(2 * kSlab);
  ASSERT_TRUE(lb.ok()) << lb.status().to_string();
  for (const auto& d : *lb) {
    auto z = b.data.read(d.slab, 0, kSlab);
    ASSERT_TRUE(z.ok());
    EXPECT_EQ(*z, std::vector<uint8_t>(kSlab, 0)) << "slab " << d.slab;
    uint8_t proof[wire::kSecretSize];
    ASSERT_EQ(testing::read_own_memory(d.addr + d.size, proof, sizeof proof), 0);
    EXPECT_EQ(std::memcmp(proof, b.welcome.secret.data(), sizeof proof), 0);
    EXPECT_NE(d.addr, d0.addr);
    EXPECT_NE(d.addr, d1.addr);
  }
  // A's views, looked at late, still fault: B's are elsewhere.
  EXPECT_EQ(testing::read_own_memory(d0.addr, seen.data(), 16), EFAULT);
  EXPECT_EQ(testing::read_own_memory(d1.addr, seen.data(), 16), EFAULT);
}

TEST_F(DonorServerTest, LocalClientsOffKeepsEveryClientOnTheWire) {
  start();  // test_opts(): local_clients off
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a, 1));
  auto l = a.ctl.lease(kSlab);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)[0].addr, 0u);
  EXPECT_EQ((*l)[0].rkey, 0u);
  EXPECT_EQ(srv_->local_slabs_lent(), 0u);
}

TEST_F(DonorServerTest, CleanStopWithConnectionsOpen) {
  start();
  Client a, b;
  ASSERT_NO_FATAL_FAILURE(connect(&a, 1));
  ASSERT_NO_FATAL_FAILURE(connect(&b, 2));
  ASSERT_TRUE(a.ctl.lease(2 * kSlab).ok());
  RawClient idle, partial;
  ASSERT_TRUE(idle.connect(port()).ok());  // mid-handshake
  ASSERT_TRUE(partial.connect(port()).ok());
  ASSERT_TRUE(partial.hello(wire::Role::kData).ok());
  std::vector<uint8_t> half = raw_header(static_cast<uint16_t>(MsgType::kWrite), 4096);
  ASSERT_TRUE(b.data.send_raw(half).ok());  // a WRITE whose data never comes
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    srv_->wait();
    waited = true;
  });
  srv_->stop();
  waiter.join();
  EXPECT_TRUE(waited.load());
  for (RawClient* c : {&a.ctl, &a.data, &b.ctl, &b.data, &idle, &partial})
    EXPECT_TRUE(c->wait_closed());
  EXPECT_EQ(stats().connections, 0u);
  EXPECT_EQ(stats().clients, 0u);
  EXPECT_EQ(stats().leased, 0u);
  srv_->stop();  // idempotent
  RawClient late;
  EXPECT_FALSE(late.connect(port()).ok());
}

TEST(DonorServerStart, RefusesUnsafeOrImpossibleOptions) {
  DonorOptions o = test_opts();
  o.token.clear();
  auto r = DonorServer::start(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("--insecure"));

  o = test_opts();
  o.transport = DonorTransportMode::kVerbs;
  r = DonorServer::start(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kUnavailable);
  // No RDMA device on the host (or none in the build): verbs forced fails.
  EXPECT_THAT(r.status().message(), HasSubstr("--transport verbs, but verbs cannot serve"));

  o = test_opts();
  o.capacity = 3 * kSlab + 1;
  r = DonorServer::start(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Errc::kInvalidArgument);

  o = test_opts();
  o.grace_ms = o.heartbeat_ms;
  r = DonorServer::start(o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("grace"));

  // Two starts get different instance ids.
  auto a = DonorServer::start(test_opts());
  auto b = DonorServer::start(test_opts());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->instance_id(), (*b)->instance_id());
  EXPECT_NE((*a)->port(), (*b)->port());
}

TEST_F(DonorServerTest, PipelinedMixedRequestsAnsweredInOrder) {
  start();
  Client a;
  ASSERT_NO_FATAL_FAILURE(connect(&a));
  auto l = a.ctl.lease(2 * kSlab);
  ASSERT_TRUE(l.ok());
  const uint32_t s0 = (*l)[0].slab, s1 = (*l)[1].slab;
  const uint32_t unleased =
      15 - ((s0 == 15 || s1 == 15) ? 1 : 0) - ((s0 == 14 || s1 == 14) ? 1 : 0);
  auto small = pattern(4096, 1);
  auto big = pattern(kSlab, 2);          // > the 256 KiB receive buffer
  auto refused = pattern(300 << 10, 3);  // refused WRITE, body straddles the buffer
  std::vector<uint8_t> b;
  uint64_t tag = 100;
  wire::encode_io_req(b, MsgType::kWrite, tag++, {s0, 4096, 0}, small.data());
  for (int i = 0; i < 50; ++i)
    wire::encode_io_req(b, MsgType::kRead, tag++, {s0, 4096, 0}, nullptr);
  wire::encode_io_req(b, MsgType::kRead, tag++, {s0, 4096, kSlab - 100}, nullptr);  // out of range
  wire::encode_io_req(b, MsgType::kRead, tag++, {unleased, 64, 0}, nullptr);        // not leased
  wire::encode_io_req(b, MsgType::kWrite, tag++, {s1, static_cast<uint32_t>(kSlab), 0}, big.data());
  wire::encode_io_req(b, MsgType::kWrite, tag++,
                      {unleased, static_cast<uint32_t>(refused.size()), 0}, refused.data());
  wire::encode_io_req(b, MsgType::kRead, tag++, {s1, static_cast<uint32_t>(kSlab), 0}, nullptr);
  for (int i = 0; i < 300; ++i)
    wire::encode_io_req(b, MsgType::kRead, tag++, {s1, 4096, 4096u * (i % 256)}, nullptr);
  std::thread sender([&] { ASSERT_TRUE(a.data.send_raw(b).ok()); });
  uint64_t want = 100;
  auto next = [&]() {
    auto f = a.data.recv_frame();
    EXPECT_TRUE(f.ok());
    EXPECT_EQ(f->header.tag, want++);
    return *f;
  };
  EXPECT_EQ(next().header.type, MsgType::kWritten);
  for (int i = 0; i < 50; ++i) {
    auto f = next();
    ASSERT_EQ(f.header.type, MsgType::kReadData);
    EXPECT_EQ(f.payload, small);
  }
  EXPECT_EQ(RawClient::to_status(next()).code(), Errc::kOutOfRange);
  EXPECT_EQ(RawClient::to_status(next()).code(), Errc::kNotFound);
  EXPECT_EQ(next().header.type, MsgType::kWritten);
  EXPECT_EQ(RawClient::to_status(next()).code(), Errc::kNotFound);
  auto f = next();
  ASSERT_EQ(f.header.type, MsgType::kReadData);
  EXPECT_EQ(f.payload, big);
  for (int i = 0; i < 300; ++i) {
    auto g = next();
    ASSERT_EQ(g.header.type, MsgType::kReadData);
    EXPECT_TRUE(std::equal(g.payload.begin(), g.payload.end(), big.begin() + 4096 * (i % 256)));
  }
  sender.join();
  EXPECT_EQ(stats().reads, 351u);
  EXPECT_EQ(stats().writes, 2u);
  EXPECT_EQ(stats().errors, 3u);
  expect_served();
}

}  // namespace
}  // namespace farmem
