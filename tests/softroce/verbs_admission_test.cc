// Connection admission over verbs (invariant 7, issue 5), on real verbs
// hardware (Soft-RoCE in the guest: tools/softroce/verbs_tests.sh, built
// into verbs_isolation_test so that it runs in the same guest boot).
//
// The donor admits an rdma_cm connect only when its private data names a
// live session and proves that session's secret with a MAC over a fresh
// nonce (wire format drawn in runtime/verbs_transport.h). Here a hostile
// client builds raw rdma_cm connects with the helpers of farmem::verbs and
// sends what a legitimate transport never would:
//
//   test                         | private data                      | donor's reject code
//   -----------------------------+-----------------------------------+---------------------
//   WrongMac...                  | live session, MAC not of its      | kUnauthenticated
//                                | secret / bit flipped / nonce swap |
//   UnknownSession...            | session id nobody holds; a session| kUnauthenticated
//                                | that has ended                    |
//   ReplayedConnect...           | byte-for-byte copy of an accepted | kUnauthenticated
//                                | request (same nonce)              |
//   ShortOrGarbage...            | nothing, a prefix, random bytes,  | kProtocol / kVersion-
//                                | another version                   | Mismatch / (padded) kUnauth.
//
// After every refusal a legitimate client connects a fresh queue pair (a new
// admission with a new nonce) and does a byte-exact WRITE and READ: the
// daemon keeps serving. Skipped on a host without an RDMA device.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/verbs_transport.h"
#include "runtime/wire.h"

namespace farmem {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kSlab = 1u << 20;
constexpr ServerId kServer = 1;
constexpr size_t kIo = 64 * 1024;  // bytes written and read back per check
constexpr const char* kToken = "verbs-admission-token";
constexpr int kTimeoutMs = 10000;

using Blob = std::array<uint8_t, verbs::kConnectDataSize>;

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

// The private data a legitimate client sends: header, session, nonce, and
// the MAC of (session, nonce) under `secret`.
Blob connect_blob(uint64_t session, uint64_t nonce, std::span<const uint8_t> secret) {
  verbs::ConnectData cd;
  cd.session_id = session;
  cd.nonce = nonce;
  cd.mac = verbs::connect_mac(secret, session, nonce);
  Blob b{};
  verbs::encode_connect(cd, b.data());
  return b;
}

// How a raw connect ended.
struct Outcome {
  bool established = false;
  Errc reject = Errc::kOk;   // the donor's code in the reject's private data
  int status = 0;            // rdma_cm's event status
  uint64_t instance_id = 0;  // from the accept's private data
};

std::string describe(const Outcome& o) {
  return o.established ? "established"
                       : std::string("rejected with ") + errc_name(o.reject) + " (rdma_cm status " +
                             std::to_string(o.status) + ")";
}

// One hostile rdma_cm client: any private data, nothing checked on our side.
// Owns, in creation order, the event channel, the id, a PD, a CQ and the QP;
// the destructor frees them in reverse.
class RawConnect {
 public:
  RawConnect() = default;
  RawConnect(const RawConnect&) = delete;
  RawConnect& operator=(const RawConnect&) = delete;
  ~RawConnect() {
    if (connected_) rdma_disconnect(id_);
    if (id_ != nullptr && id_->qp != nullptr) rdma_destroy_qp(id_);
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    if (id_ != nullptr) rdma_destroy_id(id_);
    if (ch_ != nullptr) rdma_destroy_event_channel(ch_);
  }

  // Resolves `ep`, creates an RC QP and sends rdma_connect with `len` bytes
  // of `pdata` as private data; then waits for ESTABLISHED or REJECTED.
  Result<Outcome> connect(const Endpoint& ep, const void* pdata, size_t len) {
    FARMEM_RETURN_IF_ERROR(setup(ep));
    rdma_conn_param p{};
    p.private_data = pdata;
    p.private_data_len = static_cast<uint8_t>(len);
    p.initiator_depth = 1;
    p.responder_resources = 0;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    if (rdma_connect(id_, &p) != 0)
      return make_error(Errc::kIo, "rdma_connect with %zu bytes of private data: %s", len,
                        std::strerror(errno));
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    for (;;) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ch_, &ev) == 0) {
        Outcome o;
        o.status = ev->status;
        const rdma_conn_param& got = ev->param.conn;
        const rdma_cm_event_type type = ev->event;
        if (type == RDMA_CM_EVENT_ESTABLISHED) {
          o.established = true;
          connected_ = true;
          if (got.private_data != nullptr && got.private_data_len >= verbs::kAcceptDataSize) {
            const auto* b = static_cast<const uint8_t*>(got.private_data);
            if (wire::get_u32(b) == verbs::kConnMagic) o.instance_id = wire::get_u64(b + 8);
          }
        } else if (type == RDMA_CM_EVENT_REJECTED) {
          o.reject = verbs::decode_reject(got.private_data, got.private_data_len);
        }
        rdma_ack_cm_event(ev);
        if (type != RDMA_CM_EVENT_ESTABLISHED && type != RDMA_CM_EVENT_REJECTED)
          return make_error(Errc::kProtocol, "raw connect: unexpected rdma_cm event %s (status %d)",
                            rdma_event_str(type), o.status);
        return o;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return make_error(Errc::kIo, "rdma_get_cm_event: %s", std::strerror(errno));
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0)
        return make_error(Errc::kTimeout, "raw connect to %s: no answer within %d ms",
                          ep.to_string().c_str(), kTimeoutMs);
      pollfd pfd{ch_->fd, POLLIN, 0};
      ::poll(&pfd, 1, static_cast<int>(left));
    }
  }

 private:
  Status setup(const Endpoint& ep) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(ep.port);
    if (int rc = getaddrinfo(ep.host.c_str(), service.c_str(), &hints, &res);
        rc != 0 || res == nullptr)
      return make_error(Errc::kInvalidArgument, "cannot resolve '%s': %s", ep.host.c_str(),
                        gai_strerror(rc));
    sockaddr_storage dst{};
    std::memcpy(&dst, res->ai_addr, std::min<size_t>(res->ai_addrlen, sizeof dst));
    freeaddrinfo(res);
    ch_ = rdma_create_event_channel();
    if (ch_ == nullptr)
      return make_error(Errc::kIo, "rdma_create_event_channel: %s", std::strerror(errno));
    // verbs::wait_cm_event polls: the channel must not block.
    const int flags = fcntl(ch_->fd, F_GETFL);
    if (flags < 0 || fcntl(ch_->fd, F_SETFL, flags | O_NONBLOCK) < 0)
      return make_error(Errc::kIo, "fcntl(O_NONBLOCK): %s", std::strerror(errno));
    if (rdma_create_id(ch_, &id_, nullptr, RDMA_PS_TCP) != 0)
      return make_error(Errc::kIo, "rdma_create_id: %s", std::strerror(errno));
    if (rdma_resolve_addr(id_, nullptr, reinterpret_cast<sockaddr*>(&dst), kTimeoutMs) != 0)
      return make_error(Errc::kIo, "rdma_resolve_addr: %s", std::strerror(errno));
    auto ev = verbs::wait_cm_event(ch_, RDMA_CM_EVENT_ADDR_RESOLVED, kTimeoutMs);
    if (!ev.ok()) return ev.status();
    rdma_ack_cm_event(*ev);
    if (rdma_resolve_route(id_, kTimeoutMs) != 0)
      return make_error(Errc::kIo, "rdma_resolve_route: %s", std::strerror(errno));
    ev = verbs::wait_cm_event(ch_, RDMA_CM_EVENT_ROUTE_RESOLVED, kTimeoutMs);
    if (!ev.ok()) return ev.status();
    rdma_ack_cm_event(*ev);
    pd_ = ibv_alloc_pd(id_->verbs);
    if (pd_ == nullptr) return make_error(Errc::kIo, "ibv_alloc_pd: %s", std::strerror(errno));
    cq_ = ibv_create_cq(id_->verbs, 4, nullptr, nullptr, 0);
    if (cq_ == nullptr) return make_error(Errc::kIo, "ibv_create_cq: %s", std::strerror(errno));
    ibv_qp_init_attr qa{};
    qa.send_cq = cq_;
    qa.recv_cq = cq_;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 1;
    qa.cap.max_recv_wr = 1;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(id_, pd_, &qa) != 0)
      return make_error(Errc::kIo, "rdma_create_qp: %s", std::strerror(errno));
    return ok_status();
  }

  rdma_event_channel* ch_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  bool connected_ = false;
};

// A legitimate client: a session, a transport, a registered buffer, a lease.
struct Client {
  std::unique_ptr<DonorSession> session;
  std::unique_ptr<VerbsTransport> transport;
  std::vector<uint8_t> buf = std::vector<uint8_t>(2 * kIo);
  SlabDesc slab;

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
    ASSERT_EQ(l->size(), 1u);
    slab = (*l)[0];
    st = transport->add_slab(kServer, slab);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  ~Client() {
    transport.reset();
    session.reset();
  }

  const wire::Welcome& welcome() const { return session->welcome(); }
};

Errc run_op(VerbsTransport::Queue& q, IoKind kind, uint64_t offset, uint32_t len, uint8_t* local,
            SlabId slab) {
  IoOp op{kind, len, {kServer, slab, offset}, local, 41};
  if (Errc e = q.post({&op, 1}); e != Errc::kOk) return e;
  IoCompletion c[1];
  const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
  while (Clock::now() < deadline) {
    if (q.wait(c, 1000) == 1) {
      EXPECT_EQ(c[0].cookie, 41u);
      return c[0].status;
    }
  }
  return Errc::kTimeout;
}

class VerbsAdmission : public ::testing::Test {
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
    ep_ = Endpoint{addr, server_->port()};
    good_.open(ep_);
    if (HasFatalFailure()) return;
    // Data written now must survive every hostile connect below.
    fill_pattern(good_.buf.data(), kIo, 1);
    auto q = good_.transport->open_queue();
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    ASSERT_EQ(run_op(**q, IoKind::kWrite, 0, kIo, good_.buf.data(), good_.slab.slab), Errc::kOk);
  }

  // A raw connect with `len` bytes of `pdata` must be refused.
  Errc refused(const void* pdata, size_t len) {
    RawConnect rc;
    auto o = rc.connect(ep_, pdata, len);
    EXPECT_TRUE(o.ok()) << o.status().to_string();
    if (!o.ok()) return Errc::kOk;
    EXPECT_FALSE(o->established) << "the donor admitted a hostile connect";
    return o->established ? Errc::kOk : o->reject;
  }
  Errc refused(const Blob& b) { return refused(b.data(), b.size()); }

  // The daemon keeps serving: the legitimate client connects a new queue
  // pair (a fresh admission), reads back the bytes written in SetUp, then
  // writes and reads a new pattern at another offset, byte for byte.
  void expect_serving(uint32_t seed) {
    auto q = good_.transport->open_queue();
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    uint8_t* in = good_.buf.data() + kIo;
    std::memset(in, 0, kIo);
    ASSERT_EQ(run_op(**q, IoKind::kRead, 0, kIo, in, good_.slab.slab), Errc::kOk);
    std::vector<uint8_t> want(kIo);
    fill_pattern(want.data(), kIo, 1);
    ASSERT_EQ(std::memcmp(in, want.data(), kIo), 0) << "the bytes written before changed";
    uint8_t* out = good_.buf.data();
    fill_pattern(out, kIo, seed);
    const uint64_t off = kSlab - kIo;  // the slab's last 64 KiB
    ASSERT_EQ(run_op(**q, IoKind::kWrite, off, kIo, out, good_.slab.slab), Errc::kOk);
    std::memset(in, 0, kIo);
    ASSERT_EQ(run_op(**q, IoKind::kRead, off, kIo, in, good_.slab.slab), Errc::kOk);
    ASSERT_EQ(std::memcmp(in, out, kIo), 0) << "READ after WRITE differs (seed " << seed << ")";
    // Restore the SetUp pattern in the local buffer's first half.
    fill_pattern(good_.buf.data(), kIo, 1);
  }

  uint64_t session() const { return good_.welcome().session_id; }
  std::span<const uint8_t> secret() const { return good_.welcome().secret; }

  // Destroyed in reverse: the client before the server.
  std::unique_ptr<DonorServer> server_;
  Endpoint ep_;
  Client good_;
};

TEST_F(VerbsAdmission, LegitimateRawConnectIsAcceptedWithTheInstanceId) {
  // The raw client itself is sound: with the right proof it gets in, and
  // the accept names this donor instance.
  const Blob b = connect_blob(session(), 0x1111222233334444u, secret());
  RawConnect rc;
  auto o = rc.connect(ep_, b.data(), b.size());
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  ASSERT_TRUE(o->established) << describe(*o);
  EXPECT_EQ(o->instance_id, server_->instance_id());
  EXPECT_EQ(o->instance_id, good_.welcome().instance_id);
  expect_serving(2);
}

TEST_F(VerbsAdmission, WrongMacIsRefused) {
  // A MAC made with a secret that is not the session's (one bit off).
  wire::Welcome w = good_.welcome();
  w.secret[0] ^= 0x01;
  EXPECT_EQ(refused(connect_blob(session(), 0xA1, w.secret)), Errc::kUnauthenticated);
  expect_serving(3);

  // The right MAC with one bit of it flipped in transit.
  Blob b = connect_blob(session(), 0xA2, secret());
  b[24 + 17] ^= 0x80;
  EXPECT_EQ(refused(b), Errc::kUnauthenticated);
  expect_serving(4);

  // A genuine MAC for nonce 0xA3 with the nonce field changed: the MAC
  // covers the nonce, so it no longer matches.
  b = connect_blob(session(), 0xA3, secret());
  wire::put_u64(b.data() + 16, 0xA4);
  EXPECT_EQ(refused(b), Errc::kUnauthenticated);
  expect_serving(5);

  // An all-zero MAC.
  b = connect_blob(session(), 0xA5, secret());
  std::memset(b.data() + 24, 0, wire::kMacSize);
  EXPECT_EQ(refused(b), Errc::kUnauthenticated);
  expect_serving(6);
}

TEST_F(VerbsAdmission, UnknownSessionIsRefused) {
  // A session id nobody holds, with a MAC made for that id under a secret
  // the attacker does know (its own).
  const uint64_t unknown = session() ^ 0x5A5A5A5A00000001u;
  EXPECT_EQ(refused(connect_blob(unknown, 0xB1, secret())), Errc::kUnauthenticated);
  expect_serving(7);
  EXPECT_EQ(refused(connect_blob(0, 0xB2, secret())), Errc::kUnauthenticated);
  expect_serving(8);

  // A session that has ended: its id and secret were genuine once.
  Client gone;
  gone.open(ep_);
  ASSERT_FALSE(HasFatalFailure());
  const wire::Welcome old = gone.welcome();
  ASSERT_EQ(server_->stats().clients, 2u);
  gone.transport.reset();
  gone.session->close();
  // The donor ends the session when it sees the control connection close.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (server_->stats().clients != 1u && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(server_->stats().clients, 1u) << "the closed session did not end within 10 s";
  EXPECT_EQ(refused(connect_blob(old.session_id, 0xB3, old.secret)), Errc::kUnauthenticated);
  expect_serving(9);
}

TEST_F(VerbsAdmission, ReplayedConnectIsRefused) {
  const Blob b = connect_blob(session(), 0xC0FFEE0000000001u, secret());
  {
    RawConnect first;
    auto o = first.connect(ep_, b.data(), b.size());
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    ASSERT_TRUE(o->established) << describe(*o);
    // The same bytes again while the first QP is up...
    EXPECT_EQ(refused(b), Errc::kUnauthenticated);
    expect_serving(10);
  }
  // ...and after it is gone: the donor remembers the nonce, not the QP.
  EXPECT_EQ(refused(b), Errc::kUnauthenticated);
  expect_serving(11);
  // The same session with a fresh nonce and its MAC is admitted.
  RawConnect again;
  auto o = again.connect(ep_, connect_blob(session(), 0xC0FFEE0000000002u, secret()).data(),
                         verbs::kConnectDataSize);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_TRUE(o->established) << describe(*o);
  expect_serving(12);
}

TEST_F(VerbsAdmission, ShortOrGarbagePrivateDataIsRefused) {
  // IB/RoCE CM delivers a connect request's private data zero-padded to
  // its full 56 bytes, so a short request reaches the donor either short
  // (kProtocol) or as a full-length one whose missing tail reads as zeros:
  // then the zero MAC or the unknown session 0 is refused (kUnauthenticated).
  // Either way it is refused with the donor's reason.
  auto short_refused = [](Errc e) { return e == Errc::kProtocol || e == Errc::kUnauthenticated; };

  // No private data at all: magic 0.
  EXPECT_EQ(refused(nullptr, 0), Errc::kProtocol);
  expect_serving(13);

  // The header alone (magic, version): session 0, no MAC.
  const Blob full = connect_blob(session(), 0xD1, secret());
  Errc e = refused(full.data(), 8);
  EXPECT_TRUE(short_refused(e)) << errc_name(e);
  expect_serving(14);

  // Everything but the MAC.
  e = refused(full.data(), 24);
  EXPECT_TRUE(short_refused(e)) << errc_name(e);
  expect_serving(15);

  // One byte short of a genuine request. Pick a nonce whose MAC does not
  // end in 0, so that zero padding cannot complete it by chance.
  uint64_t nonce = 0xD2;
  Blob almost = connect_blob(session(), nonce, secret());
  while (almost[verbs::kConnectDataSize - 1] == 0)
    almost = connect_blob(session(), ++nonce, secret());
  e = refused(almost.data(), verbs::kConnectDataSize - 1);
  EXPECT_TRUE(short_refused(e)) << errc_name(e);
  expect_serving(16);

  // 56 bytes of garbage (magic forced wrong).
  Blob garbage{};
  fill_pattern(garbage.data(), garbage.size(), 77);
  if (wire::get_u32(garbage.data()) == verbs::kConnMagic) garbage[0] ^= 0xFF;
  EXPECT_EQ(refused(garbage), Errc::kProtocol);
  expect_serving(17);

  // A genuine request of another protocol version.
  Blob v2 = connect_blob(session(), 0xD3, secret());
  wire::put_u16(v2.data() + 4, verbs::kConnVersion + 1);
  EXPECT_EQ(refused(v2), Errc::kVersionMismatch);
  expect_serving(18);

  // The right header and everything else 0xFF.
  Blob ff;
  ff.fill(0xFF);
  std::memcpy(ff.data(), full.data(), 8);
  EXPECT_EQ(refused(ff), Errc::kUnauthenticated);
  expect_serving(19);
}

}  // namespace
}  // namespace farmem
