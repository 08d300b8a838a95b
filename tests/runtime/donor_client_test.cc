// DonorSession and TcpTransport against an in-process DonorServer on
// 127.0.0.1:0: the handshake, every control call, authentication, many
// concurrent clients, capacity, lease release on disconnect and on missed
// heartbeats, and the tcp data path's behaviour that the conformance suite
// does not reach (remote refusals, several connections per client).
#include "runtime/donor_client.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/donor_server.h"
#include "runtime/tcp_transport.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

namespace farmem {
namespace {

constexpr char kToken[] = "donor-client-test-token";
constexpr uint64_t kSlab = 1u << 20;
constexpr uint64_t kMiB = 1u << 20;

// Polls `pred` until it holds or `ms` pass; a bounded wait on a condition
// that is observable only by asking the donor.
bool eventually(const std::function<bool()>& pred, int ms = 5000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// Posts `ops` and reaps every completion; cookie -> status.
std::map<uint64_t, Errc> run_ops(TcpTransport::Queue& q, std::span<const IoOp> ops) {
  std::map<uint64_t, Errc> got;
  size_t posted = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  IoCompletion c[64];
  while ((posted < ops.size() || q.outstanding() > 0) &&
         std::chrono::steady_clock::now() < deadline) {
    const size_t room = q.depth() - q.outstanding();
    const size_t n = std::min(room, ops.size() - posted);
    if (n > 0) {
      EXPECT_EQ(q.post(ops.subspan(posted, n)), Errc::kOk);
      posted += n;
    }
    const size_t k = q.wait(c, 1000);
    for (size_t i = 0; i < k; ++i) {
      EXPECT_EQ(got.count(c[i].cookie), 0u) << "cookie " << c[i].cookie << " completed twice";
      got[c[i].cookie] = c[i].status;
    }
  }
  EXPECT_EQ(got.size(), ops.size());
  return got;
}

std::unique_ptr<TcpTransport::Queue> open_queue(TcpTransport& t) {
  auto q = t.open_queue();
  EXPECT_TRUE(q.ok()) << q.status().to_string();
  return q.ok() ? std::move(q).value() : nullptr;
}

Errc run1(TcpTransport::Queue& q, const IoOp& op) {
  auto got = run_ops(q, {&op, 1});
  return got.size() == 1 ? got.begin()->second : Errc::kTimeout;
}

class DonorClientTest : public ::testing::Test {
 protected:
  static DonorOptions donor_options() {
    DonorOptions o;
    o.listen = {"127.0.0.1", 0};
    o.capacity = 40 * kSlab;
    o.slab_size = kSlab;
    o.token = kToken;
    o.heartbeat_ms = 100;
    o.try_hugepages = false;
    o.local_clients = false;  // these tests are about the wire
    return o;
  }
  void start(const DonorOptions& o) {
    auto s = DonorServer::start(o);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    server_ = std::move(*s);
  }
  void SetUp() override { start(donor_options()); }

  DonorClientOptions client_options() const {
    DonorClientOptions c;
    c.server = {"127.0.0.1", server_->port()};
    c.token = kToken;
    c.io_timeout_ms = 5000;
    return c;
  }
  std::unique_ptr<DonorSession> connect(DonorClientOptions c) {
    auto s = DonorSession::connect(c);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::unique_ptr<DonorSession> connect() { return connect(client_options()); }
  std::string donor() const { return "127.0.0.1:" + std::to_string(server_->port()); }

  std::unique_ptr<DonorServer> server_;
};

TEST_F(DonorClientTest, HandshakeAndEveryControlCall) {
  DonorClientOptions c = client_options();
  c.client_id = 0x1234;
  auto s = connect(c);
  ASSERT_NE(s, nullptr);
  const wire::Welcome& w = s->welcome();
  EXPECT_NE(w.session_id, 0u);
  EXPECT_EQ(w.capacity, 40 * kSlab);
  EXPECT_EQ(w.slab_size, kSlab);
  EXPECT_EQ(w.heartbeat_ms, 100u);
  EXPECT_EQ(w.grace_ms, donor_options().grace_ms);
  EXPECT_EQ(w.instance_id, server_->instance_id());
  EXPECT_EQ(s->client_id(), 0x1234u);
  EXPECT_EQ(s->endpoint().port, server_->port());

  // 2.5 slabs round up to 3.
  auto lease = s->lease(2 * kSlab + kSlab / 2);
  ASSERT_TRUE(lease.ok()) << lease.status().to_string();
  ASSERT_EQ(lease->size(), 3u);
  std::set<SlabId> ids;
  for (const SlabDesc& d : *lease) {
    EXPECT_EQ(d.size, kSlab);
    EXPECT_EQ(d.addr, 0u);
    EXPECT_EQ(d.rkey, 0u);
    ids.insert(d.slab);
  }
  EXPECT_EQ(ids.size(), 3u);

  auto st = s->stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->capacity, 40 * kSlab);
  EXPECT_EQ(st->leased, 3 * kSlab);
  EXPECT_EQ(st->slab_size, kSlab);
  EXPECT_EQ(st->clients, 1u);
  EXPECT_EQ(st->instance_id, server_->instance_id());

  Status hb = s->heartbeat();
  EXPECT_TRUE(hb.ok()) << hb.to_string();

  Status r = s->release((*lease)[1].slab);
  ASSERT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(server_->stats().leased, 2 * kSlab);

  // The donor's refusals carry its code and message, behind its address.
  r = s->release((*lease)[1].slab);
  EXPECT_EQ(r.code(), Errc::kNotFound) << r.to_string();
  EXPECT_EQ(r.message().rfind("donor " + donor() + ": ", 0), 0u) << r.message();
  auto too_big = s->lease(41 * kSlab);
  EXPECT_EQ(too_big.status().code(), Errc::kResourceExhausted) << too_big.status().to_string();
  // Checked before anything is sent.
  EXPECT_EQ(s->lease(0).status().code(), Errc::kInvalidArgument);

  // Another session may not release this one's slab.
  auto other = connect();
  ASSERT_NE(other, nullptr);
  r = other->release((*lease)[0].slab);
  EXPECT_EQ(r.code(), Errc::kPermissionDenied) << r.to_string();
  EXPECT_EQ(server_->stats().leased, 2 * kSlab);

  // The connection is still in step after the errors.
  st = s->stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->clients, 2u);
}

TEST_F(DonorClientTest, WrongTokenIsUnauthenticatedWithAnActionableMessage) {
  DonorClientOptions c = client_options();
  c.token = "not-the-token";
  auto s = DonorSession::connect(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Errc::kUnauthenticated);
  const std::string want = "donor " + donor() +
                           " refused the token: check FARMEM_TOKEN_FILE matches the donor's "
                           "--token-file";
  EXPECT_EQ(s.status().message().rfind(want, 0), 0u) << s.status().message();

  c.token.clear();
  s = DonorSession::connect(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Errc::kUnauthenticated);
  EXPECT_NE(s.status().message().find("FARMEM_TOKEN_FILE"), std::string::npos)
      << s.status().message();

  // Nothing was leased or left behind by the refused clients.
  EXPECT_TRUE(eventually([&] { return server_->stats().clients == 0; }));
  EXPECT_EQ(server_->stats().leased, 0u);
}

TEST_F(DonorClientTest, NoDonorListeningIsUnavailable) {
  auto probe = tcp_listen({"127.0.0.1", 0});
  ASSERT_TRUE(probe.ok());
  DonorClientOptions c = client_options();
  c.server.port = local_port(probe->get());
  probe->reset();  // nobody listens there now
  auto s = DonorSession::connect(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Errc::kUnavailable) << s.status().to_string();
  EXPECT_NE(s.status().message().find(c.server.to_string()), std::string::npos);
}

TEST_F(DonorClientTest, OneSessionIsSafeToShareBetweenThreads) {
  auto s = connect();
  ASSERT_NE(s, nullptr);
  constexpr int kThreads = 8;
  constexpr int kRounds = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        auto l = s->lease(kSlab);
        if (!l.ok() || l->size() != 1 || !s->release(l->front().slab).ok() ||
            !s->heartbeat().ok() || !s->stats().ok())
          ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(server_->stats().leased, 0u);

  // close() from one thread while others are inside requests: every request
  // either completes or fails with kUnavailable, and none hangs.
  std::atomic<bool> go{true};
  std::atomic<int> other_errors{0}, unavailable{0}, served{0};
  threads.clear();
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (go.load()) {
        auto st = s->stats();
        if (st.ok()) {
          ++served;
          continue;
        }
        if (st.status().code() == Errc::kUnavailable)
          ++unavailable;
        else
          ++other_errors;
        return;
      }
    });
  }
  EXPECT_TRUE(eventually([&] { return served.load() >= 20; }));  // they are mid-stream
  s->close();
  EXPECT_TRUE(eventually([&] { return unavailable.load() + other_errors.load() == 4; }));
  go = false;  // a request that somehow still succeeds must not hang the test
  for (auto& th : threads) th.join();
  EXPECT_EQ(unavailable.load(), 4);
  EXPECT_EQ(other_errors.load(), 0);
}

TEST_F(DonorClientTest, ThirtyTwoConcurrentClientsWriteAndReadBackByteExact) {
  constexpr int kClients = 32;
  constexpr uint32_t kChunk = 16384;
  std::atomic<int> ok_clients{0};
  std::atomic<uint64_t> max_leased{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&, t] {
      auto s = connect();
      if (s == nullptr) return;
      auto lease = s->lease(kSlab);
      ASSERT_TRUE(lease.ok()) << lease.status().to_string();
      const uint64_t leased = server_->stats().leased;
      uint64_t prev = max_leased.load();
      while (leased > prev && !max_leased.compare_exchange_weak(prev, leased)) {
      }
      TcpTransport tr(TcpTransportOptions{.depth = 32});
      ASSERT_TRUE(tr.add_server(0, s.get()).ok());
      ASSERT_TRUE(tr.add_slab(0, lease->front()).ok());
      std::vector<uint8_t> src(kSlab), dst(kSlab, 0);
      std::mt19937_64 rng(1000 + t);
      for (auto& b : src) b = static_cast<uint8_t>(rng());
      ASSERT_TRUE(tr.register_buffer(src.data(), src.size()).ok());
      ASSERT_TRUE(tr.register_buffer(dst.data(), dst.size()).ok());
      auto q = tr.open_queue();
      ASSERT_TRUE(q.ok());
      std::vector<IoOp> writes, reads;
      for (uint32_t off = 0; off < kSlab; off += kChunk) {
        writes.push_back(
            IoOp{IoKind::kWrite, kChunk, {0, lease->front().slab, off}, src.data() + off, off});
        reads.push_back(
            IoOp{IoKind::kRead, kChunk, {0, lease->front().slab, off}, dst.data() + off, off + 1});
      }
      for (auto& [cookie, e] : run_ops(**q, writes)) ASSERT_EQ(e, Errc::kOk) << cookie;
      for (auto& [cookie, e] : run_ops(**q, reads)) ASSERT_EQ(e, Errc::kOk) << cookie;
      ASSERT_EQ(memcmp(src.data(), dst.data(), kSlab), 0) << "client " << t;
      ++ok_clients;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok_clients.load(), kClients);
  EXPECT_LE(max_leased.load(), 40 * kSlab);
  // Every session is gone with its client: all leases are back.
  EXPECT_TRUE(eventually([&] { return server_->stats().leased == 0; })) << server_->stats().leased;
}

TEST_F(DonorClientTest, CapacityIsNeverExceeded) {
  server_.reset();
  DonorOptions o = donor_options();
  o.capacity = 8 * kSlab;
  start(o);

  // 16 clients race for 8 slabs: exactly 8 win, the rest are told why.
  constexpr int kClients = 16;
  std::vector<std::unique_ptr<DonorSession>> sessions(kClients);
  for (auto& s : sessions) {
    s = connect();
    ASSERT_NE(s, nullptr);
  }
  std::atomic<int> won{0}, refused{0};
  std::vector<char> holds(kClients, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto l = sessions[i]->lease(kSlab);
      if (l.ok()) {
        EXPECT_EQ(l->size(), 1u);
        holds[i] = 1;
        ++won;
      } else {
        EXPECT_EQ(l.status().code(), Errc::kResourceExhausted) << l.status().to_string();
        ++refused;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(won.load(), 8);
  EXPECT_EQ(refused.load(), 8);
  EXPECT_EQ(server_->stats().leased, 8 * kSlab);

  // The holders keep theirs: one more is refused, also as a multi-slab ask.
  auto extra = connect();
  ASSERT_NE(extra, nullptr);
  EXPECT_EQ(extra->lease(kSlab).status().code(), Errc::kResourceExhausted);
  EXPECT_EQ(extra->lease(9 * kSlab).status().code(), Errc::kResourceExhausted);
  EXPECT_EQ(server_->stats().leased, 8 * kSlab);

  // One holder leaves; its slab goes to the newcomer, still within capacity.
  const auto holder = std::find(holds.begin(), holds.end(), 1) - holds.begin();
  ASSERT_LT(holder, kClients);
  sessions[holder].reset();
  ASSERT_TRUE(eventually([&] { return server_->stats().leased == 7 * kSlab; }));
  auto got = extra->lease(kSlab);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(server_->stats().leased, 8 * kSlab);
  EXPECT_EQ(extra->lease(kSlab).status().code(), Errc::kResourceExhausted);
}

TEST_F(DonorClientTest, LeasesReleasedWhenTheSessionIsDestroyed) {
  auto s = connect();
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->lease(4 * kSlab).ok());
  EXPECT_EQ(server_->stats().leased, 4 * kSlab);
  s.reset();
  EXPECT_TRUE(eventually([&] { return server_->stats().leased == 0; })) << server_->stats().leased;
  EXPECT_TRUE(eventually([&] { return server_->stats().clients == 0; }));
}

TEST_F(DonorClientTest, LeasesReleasedOnCloseAndLaterRequestsFailClearly) {
  auto s = connect();
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->lease(3 * kSlab).ok());
  s->close();
  EXPECT_TRUE(s->closed());
  EXPECT_TRUE(eventually([&] { return server_->stats().leased == 0; })) << server_->stats().leased;
  auto l = s->lease(kSlab);
  EXPECT_EQ(l.status().code(), Errc::kUnavailable);
  EXPECT_NE(l.status().message().find("closed by this client"), std::string::npos)
      << l.status().message();
  EXPECT_EQ(s->heartbeat().code(), Errc::kUnavailable);
  EXPECT_EQ(s->open_data_connection().status().code(), Errc::kUnavailable);
  s->close();  // idempotent
}

TEST_F(DonorClientTest, LeasesReleasedOnMissedHeartbeats) {
  server_.reset();
  DonorOptions o = donor_options();
  // 60 heartbeats per grace period: the heartbeating session must survive
  // its heartbeat thread (or the server's connection thread) descheduled for
  // a long while (ASan, ctest -j2 on a loaded 2-core machine). With 4 per
  // period (grace 200 ms) a 150 ms stall expired it, and once with 20 per
  // period (grace 1 s) under a load average of ~10.
  o.heartbeat_ms = 50;
  o.grace_ms = 3000;
  start(o);

  DonorClientOptions silent_opts = client_options();
  silent_opts.heartbeat_thread = false;
  auto silent = connect(silent_opts);
  ASSERT_NE(silent, nullptr);
  auto alive = connect();  // heartbeat thread on, every 50 ms
  ASSERT_NE(alive, nullptr);
  ASSERT_TRUE(silent->lease(2 * kSlab).ok());
  ASSERT_TRUE(alive->lease(kSlab).ok());
  EXPECT_EQ(server_->stats().leased, 3 * kSlab);

  // The silent one expires; the one with heartbeats keeps its slab.
  EXPECT_TRUE(eventually([&] { return server_->stats().leased == kSlab; }, 20000))
      << server_->stats().leased;
  EXPECT_TRUE(eventually([&] { return server_->stats().sessions_expired == 1; }, 20000));
  auto l = silent->lease(kSlab);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Errc::kUnavailable) << l.status().to_string();
  EXPECT_NE(l.status().message().find(donor()), std::string::npos) << l.status().message();
  // Later requests say the same without touching the socket again.
  EXPECT_EQ(silent->stats().status().code(), Errc::kUnavailable);

  // Well past another grace period the heartbeating session still holds
  // its slab and can use it.
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * o.grace_ms / 2));
  auto st = alive->stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->leased, kSlab);
  EXPECT_EQ(st->sessions_expired, 1u);
}

TEST_F(DonorClientTest, TwoConnectionsPerClientInParallel) {
  auto s = connect();
  ASSERT_NE(s, nullptr);
  auto lease = s->lease(2 * kSlab);
  ASSERT_TRUE(lease.ok());
  TcpTransport tr;
  ASSERT_TRUE(tr.add_server(0, s.get()).ok());
  for (auto& d : *lease) ASSERT_TRUE(tr.add_slab(0, d).ok());

  constexpr int kQueues = 2;
  std::vector<uint8_t> mem(2 * kQueues * kSlab);
  ASSERT_TRUE(tr.register_buffer(mem.data(), mem.size()).ok());
  std::atomic<int> done{0};
  std::atomic<uint64_t> connections_seen{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kQueues; ++t) {
    threads.emplace_back([&, t] {
      auto q = tr.open_queue();
      ASSERT_TRUE(q.ok());
      uint8_t* src = mem.data() + 2 * t * kSlab;
      uint8_t* dst = src + kSlab;
      std::mt19937_64 rng(77 + t);
      for (uint64_t i = 0; i < kSlab; ++i) src[i] = static_cast<uint8_t>(rng());
      const SlabId slab = (*lease)[t].slab;
      for (int round = 0; round < 4; ++round) {
        std::vector<IoOp> w, r;
        const uint32_t chunk = 4096u << round;  // 4 KiB .. 32 KiB
        for (uint32_t off = 0; off < kSlab; off += chunk) {
          w.push_back(IoOp{IoKind::kWrite, chunk, {0, slab, off}, src + off, off});
          r.push_back(IoOp{IoKind::kRead, chunk, {0, slab, off}, dst + off, off});
        }
        for (auto& [cookie, e] : run_ops(**q, w)) ASSERT_EQ(e, Errc::kOk) << cookie;
        memset(dst, 0, kSlab);
        for (auto& [cookie, e] : run_ops(**q, r)) ASSERT_EQ(e, Errc::kOk) << cookie;
        ASSERT_EQ(memcmp(src, dst, kSlab), 0) << "queue " << t << " round " << round;
        if (round == 0) {
          // Both data connections are open once both queues did I/O.
          ++ready;
          if (eventually([&] { return ready.load() == kQueues; })) {
            uint64_t c = server_->stats().connections;
            uint64_t prev = connections_seen.load();
            while (c > prev && !connections_seen.compare_exchange_weak(prev, c)) {
            }
          }
        }
      }
      ++done;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(done.load(), kQueues);
  // One control connection and one data connection per queue.
  EXPECT_EQ(connections_seen.load(), 1u + kQueues);
}

TEST_F(DonorClientTest, RemoteRefusalsCompleteWithTheDonorsCodeAndTheConnectionSurvives) {
  auto s = connect();
  auto other = connect();
  ASSERT_NE(s, nullptr);
  ASSERT_NE(other, nullptr);
  auto mine = s->lease(kSlab);
  auto theirs = other->lease(kSlab);
  ASSERT_TRUE(mine.ok());
  ASSERT_TRUE(theirs.ok());

  TcpTransport tr;
  ASSERT_TRUE(tr.add_server(0, s.get()).ok());
  ASSERT_TRUE(tr.add_slab(0, mine->front()).ok());
  // Tables that lie: another session's slab, a slab nobody leased, and our
  // own slab claimed twice as large. Only the donor can refuse these.
  ASSERT_TRUE(tr.add_slab(0, theirs->front()).ok());
  SlabId unleased = std::max(mine->front().slab, theirs->front().slab) + 1;
  ASSERT_TRUE(tr.add_slab(0, SlabDesc{unleased, 0, kSlab, 0}).ok());
  std::vector<uint8_t> buf(4 * kMiB, 0x5A);
  ASSERT_TRUE(tr.register_buffer(buf.data(), buf.size()).ok());
  auto q = open_queue(tr);
  const SlabId m = mine->front().slab;
  ASSERT_TRUE(tr.remove_slab(0, m).ok());
  ASSERT_TRUE(tr.add_slab(0, SlabDesc{m, 0, 2 * kSlab, 0}).ok());

  ASSERT_EQ(run1(*q, IoOp{IoKind::kWrite, 4096, {0, m, 0}, buf.data(), 1}), Errc::kOk);
  memset(buf.data() + 3 * kMiB, 0, 4096);
  std::vector<IoOp> ops = {
      {IoKind::kRead, 4096, {0, theirs->front().slab, 0}, buf.data() + 8192, 2},
      {IoKind::kWrite, 65536, {0, theirs->front().slab, 0}, buf.data(), 3},
      {IoKind::kRead, 4096, {0, unleased, 0}, buf.data() + 8192, 4},
      {IoKind::kWrite, 4096, {0, m, kSlab - 100}, buf.data(), 5},
      {IoKind::kWrite, 2 * kMiB, {0, m, 0}, buf.data() + kMiB, 6},
      {IoKind::kRead, 4096, {0, m, 0}, buf.data() + 3 * kMiB, 7},
  };
  auto got = run_ops(*q, ops);
  EXPECT_EQ(got[2], Errc::kPermissionDenied);
  EXPECT_EQ(got[3], Errc::kPermissionDenied);
  EXPECT_EQ(got[4], Errc::kNotFound);
  EXPECT_EQ(got[5], Errc::kOutOfRange);
  EXPECT_EQ(got[6], Errc::kOutOfRange);
  EXPECT_EQ(got[7], Errc::kOk);
  EXPECT_TRUE(std::all_of(buf.data() + 3 * kMiB, buf.data() + 3 * kMiB + 4096,
                          [](uint8_t b) { return b == 0x5A; }));
  // The other session's slab is untouched (fresh slabs read as zeros).
  TcpTransport tr2;
  ASSERT_TRUE(tr2.add_server(0, other.get()).ok());
  ASSERT_TRUE(tr2.add_slab(0, theirs->front()).ok());
  std::vector<uint8_t> check(65536, 0xFF);
  ASSERT_TRUE(tr2.register_buffer(check.data(), check.size()).ok());
  auto q2 = open_queue(tr2);
  ASSERT_EQ(run1(*q2, IoOp{IoKind::kRead, 65536, {0, theirs->front().slab, 0}, check.data(), 9}),
            Errc::kOk);
  EXPECT_TRUE(std::all_of(check.begin(), check.end(), [](uint8_t b) { return b == 0; }));
  EXPECT_GE(server_->stats().errors, 5u);
}

TEST_F(DonorClientTest, LargeReadsAndWritesInterleavedAtFullDepthDoNotDeadlock) {
  // Many 1 MiB READ replies and WRITE requests in flight in both directions
  // at once: more than the socket buffers hold, so the client must keep
  // reading replies while it still has WRITE data to send.
  auto s = connect();
  ASSERT_NE(s, nullptr);
  auto lease = s->lease(16 * kSlab);
  ASSERT_TRUE(lease.ok());
  TcpTransport tr(TcpTransportOptions{.depth = 32});
  ASSERT_TRUE(tr.add_server(0, s.get()).ok());
  for (auto& d : *lease) ASSERT_TRUE(tr.add_slab(0, d).ok());
  constexpr uint32_t kLen = 1u << 20;  // a whole slab per op
  std::vector<uint8_t> src(8 * kLen), dst(8 * kLen, 0);
  std::mt19937_64 rng(5);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(tr.register_buffer(src.data(), src.size()).ok());
  ASSERT_TRUE(tr.register_buffer(dst.data(), dst.size()).ok());
  auto q = open_queue(tr);
  // Slabs 0..7 get the data first; then one batch reads them back while
  // writing the same data to slabs 8..15.
  std::vector<IoOp> ops;
  for (uint32_t i = 0; i < 8; ++i)
    ops.push_back(IoOp{IoKind::kWrite, kLen, {0, (*lease)[i].slab, 0}, src.data() + i * kLen, i});
  for (auto& [cookie, e] : run_ops(*q, ops)) ASSERT_EQ(e, Errc::kOk) << cookie;
  ops.clear();
  for (uint32_t i = 0; i < 8; ++i) {
    ops.push_back(
        IoOp{IoKind::kRead, kLen, {0, (*lease)[i].slab, 0}, dst.data() + i * kLen, 100 + i});
    ops.push_back(
        IoOp{IoKind::kWrite, kLen, {0, (*lease)[8 + i].slab, 0}, src.data() + i * kLen, 200 + i});
  }
  ASSERT_EQ(q->post(ops), Errc::kOk);
  IoCompletion c[32];
  size_t n = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (n < ops.size() && std::chrono::steady_clock::now() < deadline) {
    size_t k = q->wait(c, 1000);
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(c[i].status, Errc::kOk) << c[i].cookie;
    n += k;
  }
  ASSERT_EQ(n, ops.size());
  EXPECT_EQ(memcmp(src.data(), dst.data(), src.size()), 0);
  memset(dst.data(), 0, dst.size());
  ops.clear();
  for (uint32_t i = 0; i < 8; ++i)
    ops.push_back(
        IoOp{IoKind::kRead, kLen, {0, (*lease)[8 + i].slab, 0}, dst.data() + i * kLen, 300 + i});
  for (auto& [cookie, e] : run_ops(*q, ops)) ASSERT_EQ(e, Errc::kOk) << cookie;
  EXPECT_EQ(memcmp(src.data(), dst.data(), src.size()), 0);
}

TEST_F(DonorClientTest, DataConnectionLostCompletesUnavailableAndLaterOpsToo) {
  auto s = connect();
  ASSERT_NE(s, nullptr);
  auto lease = s->lease(kSlab);
  ASSERT_TRUE(lease.ok());
  TcpTransport tr;
  ASSERT_TRUE(tr.add_server(0, s.get()).ok());
  ASSERT_TRUE(tr.add_slab(0, lease->front()).ok());
  std::vector<uint8_t> buf(kSlab);
  ASSERT_TRUE(tr.register_buffer(buf.data(), buf.size()).ok());
  auto q = open_queue(tr);
  const SlabId slab = lease->front().slab;
  ASSERT_EQ(run1(*q, IoOp{IoKind::kWrite, 4096, {0, slab, 0}, buf.data(), 1}), Errc::kOk);

  // The session ends: the donor drops its leases and closes its data
  // connections.
  s->close();
  ASSERT_TRUE(eventually([&] { return server_->stats().leased == 0; }));
  IoOp r{IoKind::kRead, 4096, {0, slab, 0}, buf.data(), 2};
  const Errc e = run1(*q, r);
  EXPECT_TRUE(e == Errc::kUnavailable || e == Errc::kNotFound) << errc_name(e);
  // However the first op ended, the connection is gone by now or goes now.
  ASSERT_TRUE(eventually([&] {
    IoOp again{IoKind::kRead, 4096, {0, slab, 0}, buf.data(), 3};
    return run1(*q, again) == Errc::kUnavailable;
  }));
  // A new queue cannot attach to the closed session.
  auto q2 = open_queue(tr);
  EXPECT_EQ(run1(*q2, IoOp{IoKind::kRead, 4096, {0, slab, 0}, buf.data(), 4}), Errc::kUnavailable);
}

}  // namespace
}  // namespace farmem
