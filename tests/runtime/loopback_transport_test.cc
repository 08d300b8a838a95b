// Loopback-only behaviour: injected latency, reordering, the fault hook,
// kill(), counters and the donor's lease bookkeeping. What every backend
// must do is in transport_conformance_test.cc.
#include "runtime/loopback_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace farmem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSlab = 1u << 20;
constexpr ServerId kServer = 1;

class LoopbackTest : public ::testing::Test {
 protected:
  void SetUp() override { build(LoopbackTransport::Options{}); }

  void build(LoopbackTransport::Options o) {
    transport_ = std::make_unique<LoopbackTransport>(o);
    Status st = transport_->add_server(kServer, &donor_);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto l = donor_.lease(2 * kSlab);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    slabs_ = *l;
    for (auto& s : slabs_) {
      st = transport_->add_slab(kServer, s);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
    buf_.assign(1u << 20, 0);
    st = transport_->register_buffer(buf_.data(), buf_.size());
    ASSERT_TRUE(st.ok()) << st.to_string();
  }

  std::unique_ptr<LoopbackTransport::Queue> open() {
    auto q = transport_->open_queue();
    EXPECT_TRUE(q.ok()) << q.status().to_string();
    return std::move(*q);
  }

  IoOp op(IoKind k, uint64_t offset, uint32_t len, uint64_t cookie, size_t slab = 0) {
    return IoOp{k, len, {kServer, slabs_[slab].slab, offset}, buf_.data() + offset, cookie};
  }

  std::vector<IoCompletion> reap(LoopbackTransport::Queue& q, size_t n, int timeout_ms = 10000) {
    std::vector<IoCompletion> got;
    IoCompletion c[64];
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (got.size() < n && Clock::now() < deadline) {
      const size_t k = q.wait(std::span(c, std::min<size_t>(64, n - got.size())), 100);
      got.insert(got.end(), c, c + k);
    }
    return got;
  }

  LoopbackDonor donor_{8 * kSlab, kSlab};
  std::unique_ptr<LoopbackTransport> transport_;  // destroyed before donor_
  std::vector<SlabDesc> slabs_;
  std::vector<uint8_t> buf_;
};

TEST_F(LoopbackTest, NameAndDepth) {
  EXPECT_STREQ(transport_->name(), "loopback");
  EXPECT_EQ(open()->depth(), 256u);
  LoopbackTransport small({.depth = 4});
  auto q = small.open_queue();
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*q)->depth(), 4u);
  LoopbackTransport zero({.depth = 0});
  EXPECT_EQ(zero.open_queue().status().code(), Errc::kInvalidArgument);
}

TEST_F(LoopbackTest, OpDoesNotCompleteBeforeItsLatency) {
  constexpr auto kLatency = std::chrono::milliseconds(30);
  donor_.set_faults({.latency_us = 30000});
  auto q = open();
  for (int i = 0; i < 3; ++i) {
    IoOp o = op(IoKind::kWrite, 0, 4096, i);
    const auto t0 = Clock::now();
    ASSERT_EQ(q->post({&o, 1}), Errc::kOk);
    IoCompletion c[1];
    size_t n = 0;
    while (n == 0 && Clock::now() - t0 < std::chrono::seconds(10)) n = q->poll(c);
    const auto done = Clock::now();
    ASSERT_EQ(n, 1u);
    EXPECT_EQ(c[0].status, Errc::kOk);
    // Completion is no earlier than post + latency (a lower bound only).
    EXPECT_GE(done - t0, kLatency);
  }
  // wait() also honours it, sleeping rather than returning early.
  IoOp o = op(IoKind::kRead, 0, 64, 9);
  const auto t0 = Clock::now();
  ASSERT_EQ(q->post({&o, 1}), Errc::kOk);
  IoCompletion c[1];
  size_t n = 0;
  while (n == 0 && Clock::now() - t0 < std::chrono::seconds(10)) n = q->wait(c, 5);
  ASSERT_EQ(n, 1u);
  EXPECT_GE(Clock::now() - t0, kLatency);
  // A wait() shorter than the latency times out with the op still pending.
  donor_.set_faults({.latency_us = 5'000'000});
  ASSERT_EQ(q->post({&o, 1}), Errc::kOk);
  EXPECT_EQ(q->wait(c, 10), 0u);
  EXPECT_EQ(q->outstanding(), 1u);
}

std::vector<uint64_t> completion_order(LoopbackTransport::Queue& q, std::vector<IoOp>& ops) {
  EXPECT_EQ(q.post(ops), Errc::kOk);
  std::vector<uint64_t> order;
  IoCompletion c[256];
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (order.size() < ops.size() && Clock::now() < deadline) {
    const size_t n = q.wait(c, 100);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(c[i].status, Errc::kOk);
      order.push_back(c[i].cookie);
    }
  }
  return order;
}

TEST_F(LoopbackTest, WithoutReorderReadyOpsCompleteInPostOrder) {
  auto q = open();
  std::vector<IoOp> ops;
  for (uint64_t i = 0; i < 64; ++i) ops.push_back(op(IoKind::kWrite, i * 64, 64, i));
  auto order = completion_order(*q, ops);
  ASSERT_EQ(order.size(), 64u);
  for (uint64_t i = 0; i < 64; ++i) EXPECT_EQ(order[i], i);
}

TEST_F(LoopbackTest, ReorderReordersAndIsReproducibleFromTheSeed) {
  donor_.set_faults({.reorder = true});
  std::vector<IoOp> ops;
  for (uint64_t i = 0; i < 64; ++i) ops.push_back(op(IoKind::kWrite, i * 64, 64, i));

  auto q = open();
  auto order = completion_order(*q, ops);
  ASSERT_EQ(order.size(), 64u);
  std::vector<uint64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t i = 0; i < 64; ++i) ASSERT_EQ(sorted[i], i);  // each exactly once
  std::vector<uint64_t> post_order(64);
  for (uint64_t i = 0; i < 64; ++i) post_order[i] = i;
  EXPECT_NE(order, post_order);

  // Same seed, same queue index => same order.
  LoopbackTransport again({.seed = 1});
  ASSERT_TRUE(again.add_server(kServer, &donor_).ok());
  for (auto& s : slabs_) ASSERT_TRUE(again.add_slab(kServer, s).ok());
  ASSERT_TRUE(again.register_buffer(buf_.data(), buf_.size()).ok());
  auto q2 = again.open_queue().value();
  EXPECT_EQ(completion_order(*q2, ops), order);
}

TEST_F(LoopbackTest, HookFailCompletesWithItsErrorAndMovesNothing) {
  std::atomic<int> calls{0};
  donor_.set_faults({.hook = [&](const IoOp& o) {
    ++calls;
    if (o.kind == IoKind::kWrite) return LoopbackVerdict{LoopbackVerdict::kFail, Errc::kIo};
    return LoopbackVerdict{};
  }});
  auto q = open();
  memset(buf_.data(), 0x5A, 4096);
  IoOp w = op(IoKind::kWrite, 0, 4096, 1);
  ASSERT_EQ(q->post({&w, 1}), Errc::kOk);
  auto c = reap(*q, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, Errc::kIo);
  auto mem = donor_.slab_memory(slabs_[0].slab);
  ASSERT_EQ(mem.size(), kSlab);
  EXPECT_TRUE(std::all_of(mem.begin(), mem.begin() + 4096, [](uint8_t b) { return b == 0; }));
  EXPECT_EQ(donor_.writes(), 0u);

  IoOp r = op(IoKind::kRead, 0, 4096, 2);
  ASSERT_EQ(q->post({&r, 1}), Errc::kOk);
  c = reap(*q, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, Errc::kOk);
  EXPECT_EQ(donor_.reads(), 1u);
  EXPECT_EQ(calls.load(), 2);

  // Refused-at-post ops never reach the hook.
  IoOp bad = op(IoKind::kRead, 0, 0, 3);
  ASSERT_EQ(q->post({&bad, 1}), Errc::kOk);
  c = reap(*q, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, Errc::kInvalidArgument);
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(LoopbackTest, DeferredOpCompletesOnlyAfterRelease) {
  std::atomic<bool> hold{true};
  std::atomic<int> asked{0};
  donor_.set_faults({.hook = [&](const IoOp& o) {
    if (o.cookie == 7 && hold.load()) {
      ++asked;
      return LoopbackVerdict{LoopbackVerdict::kDefer};
    }
    return LoopbackVerdict{};
  }});
  auto q = open();
  memset(buf_.data(), 0x11, 8192);
  IoOp ops[2] = {op(IoKind::kWrite, 0, 4096, 7), op(IoKind::kWrite, 4096, 4096, 8)};
  ASSERT_EQ(q->post(ops), Errc::kOk);

  // The other op completes; the held one does not, however often we ask.
  auto c = reap(*q, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].cookie, 8u);
  IoCompletion more[2];
  for (int i = 0; i < 5; ++i) EXPECT_EQ(q->wait(more, 5), 0u);
  EXPECT_EQ(q->poll(more), 0u);
  EXPECT_EQ(q->outstanding(), 1u);
  EXPECT_GE(asked.load(), 2);
  auto mem = donor_.slab_memory(slabs_[0].slab);
  EXPECT_EQ(mem[0], 0);
  EXPECT_EQ(mem[4096], 0x11);

  hold = false;
  c = reap(*q, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].cookie, 7u);
  EXPECT_EQ(c[0].status, Errc::kOk);
  EXPECT_EQ(mem[0], 0x11);
  EXPECT_EQ(q->outstanding(), 0u);
}

TEST_F(LoopbackTest, ReleasingFromAnotherThreadWakesABlockedWait) {
  std::atomic<bool> hold{true};
  donor_.set_faults({.hook = [&](const IoOp&) {
    return hold.load() ? LoopbackVerdict{LoopbackVerdict::kDefer} : LoopbackVerdict{};
  }});
  auto q = open();
  IoOp o = op(IoKind::kRead, 0, 64, 5);
  ASSERT_EQ(q->post({&o, 1}), Errc::kOk);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    hold = false;
  });
  IoCompletion c[1];
  const size_t n = q->wait(c, 20000);
  releaser.join();
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(c[0].status, Errc::kOk);
}

TEST_F(LoopbackTest, KillFailsPendingDeferredAndLaterOps) {
  donor_.set_faults({.hook = [](const IoOp& o) {
    return o.cookie == 1 ? LoopbackVerdict{LoopbackVerdict::kDefer} : LoopbackVerdict{};
  }});
  auto q = open();
  IoOp held = op(IoKind::kWrite, 0, 64, 1);
  ASSERT_EQ(q->post({&held, 1}), Errc::kOk);
  IoCompletion c[4];
  EXPECT_EQ(q->poll(c), 0u);
  EXPECT_FALSE(donor_.dead());
  donor_.kill();
  EXPECT_TRUE(donor_.dead());
  auto got = reap(*q, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].cookie, 1u);
  EXPECT_EQ(got[0].status, Errc::kUnavailable);

  IoOp later = op(IoKind::kRead, 0, 64, 2);
  ASSERT_EQ(q->post({&later, 1}), Errc::kOk);
  got = reap(*q, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, Errc::kUnavailable);
  EXPECT_EQ(donor_.writes() + donor_.reads(), 0u);
  EXPECT_EQ(donor_.lease(kSlab).status().code(), Errc::kUnavailable);
  // The memory stays inspectable.
  EXPECT_EQ(donor_.slab_memory(slabs_[0].slab).size(), kSlab);
}

TEST_F(LoopbackTest, KillFromAnotherThreadEndsAWaitUnderLongLatency) {
  donor_.set_faults({.latency_us = 60'000'000});
  auto q = open();
  IoOp o = op(IoKind::kRead, 0, 64, 3);
  ASSERT_EQ(q->post({&o, 1}), Errc::kOk);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    donor_.kill();
  });
  IoCompletion c[1];
  const size_t n = q->wait(c, -1);  // would hang for a minute without kill()
  killer.join();
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(c[0].status, Errc::kUnavailable);
}

TEST_F(LoopbackTest, KillAffectsOnlyThatDonor) {
  LoopbackDonor other(2 * kSlab, kSlab);
  ASSERT_TRUE(transport_->add_server(kServer + 1, &other).ok());
  auto l = other.lease(kSlab);
  ASSERT_TRUE(l.ok());
  ASSERT_TRUE(transport_->add_slab(kServer + 1, l->front()).ok());
  donor_.kill();
  auto q = open();
  IoOp ops[2] = {op(IoKind::kWrite, 0, 64, 1),
                 IoOp{IoKind::kWrite, 64, {kServer + 1, l->front().slab, 0}, buf_.data(), 2}};
  ASSERT_EQ(q->post(ops), Errc::kOk);
  auto got = reap(*q, 2);
  ASSERT_EQ(got.size(), 2u);
  for (auto& c : got) EXPECT_EQ(c.status, c.cookie == 1 ? Errc::kUnavailable : Errc::kOk);
  EXPECT_EQ(other.writes(), 1u);
  q.reset();
  transport_.reset();  // before `other` goes away
}

TEST_F(LoopbackTest, CountersCountSuccessfulOpsAndBytes) {
  auto q = open();
  std::vector<IoOp> ops = {op(IoKind::kWrite, 0, 100, 1), op(IoKind::kWrite, 100, 4000, 2),
                           op(IoKind::kRead, 0, 333, 3), op(IoKind::kRead, 0, 0, 4),  // refused
                           op(IoKind::kWrite, kSlab - 1, 2, 5)};                      // refused
  ASSERT_EQ(q->post(ops), Errc::kOk);
  ASSERT_EQ(reap(*q, ops.size()).size(), ops.size());
  EXPECT_EQ(donor_.writes(), 2u);
  EXPECT_EQ(donor_.bytes_written(), 4100u);
  EXPECT_EQ(donor_.reads(), 1u);
  EXPECT_EQ(donor_.bytes_read(), 333u);
  donor_.reset_counters();
  EXPECT_EQ(donor_.writes() + donor_.reads() + donor_.bytes_written() + donor_.bytes_read(), 0u);
}

TEST_F(LoopbackTest, SlabMemoryIsWhatOpsSee) {
  auto q = open();
  auto mem = donor_.slab_memory(slabs_[1].slab);
  ASSERT_EQ(mem.size(), kSlab);
  for (size_t i = 0; i < 4096; ++i) mem[1000 + i] = static_cast<uint8_t>(i * 7);
  IoOp r = op(IoKind::kRead, 1000, 4096, 1, 1);
  ASSERT_EQ(q->post({&r, 1}), Errc::kOk);
  ASSERT_EQ(reap(*q, 1).size(), 1u);
  EXPECT_EQ(memcmp(buf_.data() + 1000, mem.data() + 1000, 4096), 0);
  EXPECT_TRUE(donor_.slab_memory(9999).empty());
}

TEST(LoopbackDonorTest, LeaseReleaseCapacityAndZeroing) {
  LoopbackDonor d(4 * kSlab, kSlab);
  EXPECT_EQ(d.capacity(), 4 * kSlab);
  EXPECT_EQ(d.slab_size(), kSlab);
  EXPECT_EQ(d.leased_bytes(), 0u);
  EXPECT_EQ(d.lease(0).status().code(), Errc::kInvalidArgument);

  auto a = d.lease(1);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->size(), 1u);
  EXPECT_EQ((*a)[0].size, kSlab);
  EXPECT_EQ((*a)[0].addr, 0u);
  EXPECT_EQ((*a)[0].rkey, 0u);
  auto b = d.lease(2 * kSlab + 1);  // rounds up to 3 slabs
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->size(), 3u);
  EXPECT_EQ(d.leased_bytes(), 4 * kSlab);
  EXPECT_EQ(d.lease(1).status().code(), Errc::kResourceExhausted);
  EXPECT_EQ(d.leased_bytes(), 4 * kSlab);

  // Dirty a slab, release it, lease again: the memory comes back zeroed.
  const SlabId victim = (*b)[1].slab;
  auto mem = d.slab_memory(victim);
  ASSERT_EQ(mem.size(), kSlab);
  memset(mem.data(), 0xFF, kSlab);
  ASSERT_TRUE(d.release(victim).ok());
  EXPECT_EQ(d.leased_bytes(), 3 * kSlab);
  EXPECT_TRUE(d.slab_memory(victim).empty());
  EXPECT_EQ(d.release(victim).code(), Errc::kNotFound);
  EXPECT_EQ(d.release(0).code(), Errc::kNotFound);
  auto c = d.lease(kSlab);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), 1u);
  EXPECT_NE((*c)[0].slab, victim);  // ids are never reused
  auto fresh = d.slab_memory((*c)[0].slab);
  ASSERT_EQ(fresh.size(), kSlab);
  EXPECT_TRUE(std::all_of(fresh.begin(), fresh.end(), [](uint8_t x) { return x == 0; }));
}

TEST(LoopbackDonorTest, SlabIdsAreUniqueAcrossLeaseCycles) {
  LoopbackDonor d(3 * kSlab, kSlab);
  std::set<SlabId> ids;
  size_t total = 0;
  for (int i = 0; i < 200; ++i) {
    auto l = d.lease(i % 3 == 0 ? 3 * kSlab : kSlab);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    for (auto& s : *l) {
      EXPECT_NE(s.slab, 0u);
      ids.insert(s.slab);
      ++total;
    }
    for (auto& s : *l) ASSERT_TRUE(d.release(s.slab).ok());
  }
  EXPECT_EQ(ids.size(), total);
  EXPECT_EQ(d.leased_bytes(), 0u);
}

TEST_F(LoopbackTest, OpOnAReleasedSlabIsNotFound) {
  auto q = open();
  ASSERT_TRUE(donor_.release(slabs_[1].slab).ok());  // still added to the transport
  IoOp w = op(IoKind::kWrite, 0, 64, 1, 1);
  ASSERT_EQ(q->post({&w, 1}), Errc::kOk);
  auto c = reap(*q, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, Errc::kNotFound);
  EXPECT_EQ(donor_.writes(), 0u);
}

TEST_F(LoopbackTest, ControlPathErrors) {
  EXPECT_EQ(transport_->add_server(kServer, &donor_).code(), Errc::kInvalidArgument);
  EXPECT_EQ(transport_->add_server(9, nullptr).code(), Errc::kInvalidArgument);
  EXPECT_EQ(transport_->add_slab(9, slabs_[0]).code(), Errc::kInvalidArgument);
  EXPECT_EQ(transport_->add_slab(kServer, slabs_[0]).code(), Errc::kInvalidArgument);
  SlabDesc empty = slabs_[0];
  empty.slab = 12345;
  empty.size = 0;
  EXPECT_EQ(transport_->add_slab(kServer, empty).code(), Errc::kInvalidArgument);
  EXPECT_EQ(transport_->register_buffer(nullptr, 10).code(), Errc::kInvalidArgument);
  EXPECT_EQ(transport_->register_buffer(buf_.data(), 0).code(), Errc::kInvalidArgument);

  // remove_slab: later ops on it are refused at post.
  ASSERT_TRUE(transport_->remove_slab(kServer, slabs_[1].slab).ok());
  EXPECT_EQ(transport_->remove_slab(kServer, slabs_[1].slab).code(), Errc::kNotFound);
  auto q = open();
  IoOp w = op(IoKind::kWrite, 0, 64, 1, 1);
  ASSERT_EQ(q->post({&w, 1}), Errc::kOk);
  auto c = reap(*q, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, Errc::kInvalidArgument);
}

// Several owner threads, each with its own queue, on disjoint ranges, with
// jitter and reordering: the shape of the pager's handler threads.
TEST_F(LoopbackTest, ConcurrentQueuesOnDisjointRanges) {
  donor_.set_faults({.jitter_us = 200, .reorder = true});
  constexpr int kThreads = 4;
  constexpr uint32_t kLen = 4096;
  constexpr int kOps = 32;  // per thread, per round
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto q = open();
      uint8_t* base = buf_.data() + t * kOps * kLen / 2;  // 64 KiB per thread in buf_
      const uint64_t remote = uint64_t(t) * kOps * kLen;
      for (int round = 0; round < 5; ++round) {
        std::vector<IoOp> ops;
        for (int i = 0; i < kOps / 2; ++i) {
          memset(base + i * kLen, t * 16 + round + i, kLen);
          ops.push_back(IoOp{IoKind::kWrite,
                             kLen,
                             {kServer, slabs_[0].slab, remote + i * kLen},
                             base + i * kLen,
                             uint64_t(i)});
        }
        if (q->post(ops) != Errc::kOk) ++failures;
        auto got = reap(*q, ops.size());
        failures += got.size() != ops.size();
        for (auto& c : got) failures += c.status != Errc::kOk;
        for (auto& o : ops) {
          memset(o.local, 0, kLen);
          o.kind = IoKind::kRead;
        }
        if (q->post(ops) != Errc::kOk) ++failures;
        got = reap(*q, ops.size());
        failures += got.size() != ops.size();
        for (auto& c : got) failures += c.status != Errc::kOk;
        for (int i = 0; i < kOps / 2; ++i) {
          const uint8_t want = static_cast<uint8_t>(t * 16 + round + i);
          failures += !std::all_of(base + i * kLen, base + (i + 1) * kLen,
                                   [&](uint8_t b) { return b == want; });
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(donor_.writes(), uint64_t{kThreads} * 5 * (kOps / 2));
  EXPECT_EQ(donor_.reads(), uint64_t{kThreads} * 5 * (kOps / 2));
}

}  // namespace
}  // namespace farmem
