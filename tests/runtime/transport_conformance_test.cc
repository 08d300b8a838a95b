// The transport conformance suite: every backend passes the same typed tests
// (the semantics of runtime/transport.h). Harnesses: transport_harness.h.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/transport.h"
#include "runtime/wire.h"
#include "tests/runtime/transport_harness.h"

// Optional backends: each header defines its harness and the macro below
// only when that backend is built.
#if __has_include("tests/runtime/tcp_harness.h")
#include "tests/runtime/tcp_harness.h"
#endif
#if __has_include("tests/runtime/verbs_harness.h")
#include "tests/runtime/verbs_harness.h"
#endif
#ifndef FARMEM_TCP_HARNESS
#define FARMEM_TCP_HARNESS
#endif
#ifndef FARMEM_VERBS_HARNESS
#define FARMEM_VERBS_HARNESS
#endif

namespace farmem::testing {
namespace {

// One line per backend (see "Adding a backend" in transport_harness.h).
using Backends = ::testing::Types<LoopbackHarness, LoopbackFaultyHarness   //
                                                       FARMEM_TCP_HARNESS  //
                                                           FARMEM_VERBS_HARNESS>;

struct HarnessName {
  template <class H>
  static std::string GetName(int) {
    return H::kName;
  }
};

constexpr int kReapTimeoutMs = 10000;
constexpr size_t kBufSize = 8u << 20;

// Deterministic, position-dependent bytes, different per seed.
void fill_pattern(uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<uint8_t>(x >> 24);
  }
}

template <class H>
class TransportConformance : public ::testing::Test {
 protected:
  using Backend = typename H::Backend;
  using Queue = typename Backend::Queue;

  void SetUp() override {
    buf_.assign(kBufSize, 0);
    h_.SetUp();
    if (HasFatalFailure() || IsSkipped()) return;  // skipped: no such hardware here
    Status st = h_.transport().register_buffer(buf_.data(), buf_.size());
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  void TearDown() override { h_.TearDown(); }

  std::unique_ptr<Queue> open() {
    auto q = h_.transport().open_queue();
    EXPECT_TRUE(q.ok()) << q.status().to_string();
    return q.ok() ? std::move(*q) : nullptr;
  }

  IoOp op(IoKind kind, size_t slab_index, uint64_t offset, uint32_t length, void* local,
          uint64_t cookie) {
    return IoOp{kind, length, {h_.server(), h_.slabs().at(slab_index).slab, offset}, local, cookie};
  }

  // Reaps exactly n completions (never more: the span is cut to what is
  // still missing) or gives up at the deadline.
  std::vector<IoCompletion> reap(Queue& q, size_t n, int timeout_ms = kReapTimeoutMs) {
    std::vector<IoCompletion> got;
    IoCompletion c[32];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (got.size() < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) break;
      const size_t k = q.wait(std::span(c, std::min<size_t>(std::size(c), n - got.size())),
                              static_cast<int>(left));
      got.insert(got.end(), c, c + k);
    }
    return got;
  }

  // Posts one op and returns its completion status.
  Errc run1(Queue& q, const IoOp& o) {
    const Errc e = q.post({&o, 1});
    if (e != Errc::kOk) return e;
    auto c = reap(q, 1);
    if (c.size() != 1) return Errc::kTimeout;
    EXPECT_EQ(c[0].cookie, o.cookie);
    return c[0].status;
  }

  // WRITE then READ back through `q` and compare: proves the queue still works.
  void expect_round_trip(Queue& q, uint64_t offset, uint32_t len, uint32_t seed) {
    uint8_t* src = buf_.data() + (6u << 20);
    uint8_t* dst = src + len;
    fill_pattern(src, len, seed);
    memset(dst, 0, len);
    ASSERT_EQ(run1(q, op(IoKind::kWrite, 1, offset, len, src, 900)), Errc::kOk);
    ASSERT_EQ(run1(q, op(IoKind::kRead, 1, offset, len, dst, 901)), Errc::kOk);
    ASSERT_EQ(memcmp(src, dst, len), 0);
  }

  std::vector<uint8_t> buf_;  // registered; declared before h_ so it outlives the transport
  H h_;
};

TYPED_TEST_SUITE(TransportConformance, Backends, HarnessName);

TYPED_TEST(TransportConformance, SingleWriteReadRoundTripIsByteExact) {
  auto q = this->open();
  ASSERT_NE(q, nullptr);
  EXPECT_GE(q->depth(), 8u);
  EXPECT_EQ(q->outstanding(), 0u);
  uint8_t* src = this->buf_.data();
  uint8_t* dst = src + 8192;
  fill_pattern(src, 4096, 1);
  memset(dst, 0xEE, 4096);

  IoOp w = this->op(IoKind::kWrite, 0, 4096, 4096, src, 42);
  ASSERT_EQ(q->post({&w, 1}), Errc::kOk);
  EXPECT_EQ(q->outstanding(), 1u);
  auto c = this->reap(*q, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].cookie, 42u);
  EXPECT_EQ(c[0].status, Errc::kOk);
  EXPECT_EQ(q->outstanding(), 0u);

  IoOp r = this->op(IoKind::kRead, 0, 4096, 4096, dst, 43);
  ASSERT_EQ(q->post({&r, 1}), Errc::kOk);
  c = this->reap(*q, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].cookie, 43u);
  EXPECT_EQ(c[0].status, Errc::kOk);
  EXPECT_EQ(memcmp(src, dst, 4096), 0);

  // The neighbouring, never-written page of a fresh slab reads as zeros.
  memset(dst, 0xEE, 4096);
  EXPECT_EQ(this->run1(*q, this->op(IoKind::kRead, 0, 0, 4096, dst, 44)), Errc::kOk);
  EXPECT_TRUE(std::all_of(dst, dst + 4096, [](uint8_t b) { return b == 0; }));
}

TYPED_TEST(TransportConformance, MixedBatchInOnePost) {
  auto q = this->open();
  ASSERT_NE(q, nullptr);
  constexpr uint32_t kLen = 1000;
  constexpr int kN = 8;
  uint8_t* pre = this->buf_.data();                    // first write, to be read back
  uint8_t* fresh = this->buf_.data() + (1u << 20);     // written by the batch
  uint8_t* readback = this->buf_.data() + (2u << 20);  // filled by the batch's READs
  uint8_t* verify = this->buf_.data() + (3u << 20);
  fill_pattern(pre, kN * kLen, 7);
  fill_pattern(fresh, kN * kLen, 8);
  memset(readback, 0, kN * kLen);

  // Ranges [0, kN*kLen) of slab 0 hold `pre`.
  std::vector<IoOp> ops;
  for (int i = 0; i < kN; ++i)
    ops.push_back(this->op(IoKind::kWrite, 0, i * kLen, kLen, pre + i * kLen, 100 + i));
  ASSERT_EQ(q->post(ops), Errc::kOk);
  auto c = this->reap(*q, kN);
  ASSERT_EQ(c.size(), size_t{kN});
  for (auto& x : c) ASSERT_EQ(x.status, Errc::kOk);

  // One post: READs of what is there, WRITEs to other ranges (and slab 1),
  // interleaved.
  ops.clear();
  for (int i = 0; i < kN; ++i) {
    ops.push_back(this->op(IoKind::kRead, 0, i * kLen, kLen, readback + i * kLen, 200 + i));
    ops.push_back(
        this->op(IoKind::kWrite, i % 2, 100000 + i * kLen, kLen, fresh + i * kLen, 300 + i));
  }
  ASSERT_EQ(q->post(ops), Errc::kOk);
  EXPECT_EQ(q->outstanding(), ops.size());
  c = this->reap(*q, ops.size());
  ASSERT_EQ(c.size(), ops.size());
  std::map<uint64_t, int> seen;
  for (auto& x : c) {
    EXPECT_EQ(x.status, Errc::kOk) << "cookie " << x.cookie;
    ++seen[x.cookie];
  }
  ASSERT_EQ(seen.size(), ops.size());
  for (auto& o : ops) EXPECT_EQ(seen[o.cookie], 1) << "cookie " << o.cookie;
  EXPECT_EQ(memcmp(readback, pre, kN * kLen), 0);

  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(this->run1(*q, this->op(IoKind::kRead, i % 2, 100000 + i * kLen, kLen,
                                      verify + i * kLen, 400 + i)),
              Errc::kOk);
  }
  EXPECT_EQ(memcmp(verify, fresh, kN * kLen), 0);
}

TYPED_TEST(TransportConformance, WriteIsVisibleToLaterReadOnAnotherQueue) {
  auto q1 = this->open();
  auto q2 = this->open();
  ASSERT_NE(q1, nullptr);
  ASSERT_NE(q2, nullptr);
  uint8_t* src = this->buf_.data();
  uint8_t* dst = src + 65536;
  for (uint32_t round = 0; round < 4; ++round) {
    fill_pattern(src, 12288, 20 + round);
    memset(dst, 0, 12288);
    ASSERT_EQ(this->run1(*q1, this->op(IoKind::kWrite, 1, 8192, 12288, src, round)), Errc::kOk);
    ASSERT_EQ(this->run1(*q2, this->op(IoKind::kRead, 1, 8192, 12288, dst, 10 + round)), Errc::kOk);
    ASSERT_EQ(memcmp(src, dst, 12288), 0) << "round " << round;
    std::swap(q1, q2);
  }
}

TYPED_TEST(TransportConformance, LargestRangeAtSlabEnd) {
  auto q = this->open();
  ASSERT_NE(q, nullptr);
  constexpr uint32_t kLen = wire::kMaxIoLength;
  const uint64_t end = this->h_.slabs()[0].size;
  uint8_t* src = this->buf_.data();
  uint8_t* dst = src + kLen + 4096;  // clear of src + 1 + kLen
  fill_pattern(src, kLen, 3);
  memset(dst, 0, kLen);
  // Exactly up to the last byte of the slab.
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kWrite, 0, end - kLen, kLen, src, 1)), Errc::kOk);
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kRead, 0, end - kLen, kLen, dst, 2)), Errc::kOk);
  EXPECT_EQ(memcmp(src, dst, kLen), 0);
  // And at offset 0, from an unaligned local address.
  fill_pattern(src + 1, kLen, 4);
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kWrite, 0, 0, kLen, src + 1, 3)), Errc::kOk);
  memset(dst, 0, kLen);
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kRead, 0, 0, kLen, dst, 4)), Errc::kOk);
  EXPECT_EQ(memcmp(src + 1, dst, kLen), 0);
}

TYPED_TEST(TransportConformance, UnalignedRangesAcrossPageBoundaries) {
  auto q = this->open();
  ASSERT_NE(q, nullptr);
  // A model of the first 1 MiB of slab 1.
  std::vector<uint8_t> model(1u << 20, 0);
  struct Range {
    uint64_t offset;
    uint32_t length;
  };
  const Range ranges[] = {{1, 1},         {4095, 2},       {4093, 4099},     {8191, 8190},
                          {12289, 65537}, {300001, 77777}, {524287, 131073}, {7, 3}};
  uint8_t* src = this->buf_.data();
  uint64_t cookie = 0;
  for (const Range& r : ranges) {
    // Local addresses are odd too, and differ from the remote alignment.
    uint8_t* local = src + 3 + (cookie * 5) % 61;
    fill_pattern(local, r.length, static_cast<uint32_t>(cookie + 30));
    ASSERT_EQ(this->run1(*q, this->op(IoKind::kWrite, 1, r.offset, r.length, local, cookie++)),
              Errc::kOk);
    memcpy(model.data() + r.offset, local, r.length);
  }
  // Read back ranges that straddle the written ones and unwritten bytes.
  uint8_t* dst = this->buf_.data() + (2u << 20) + 1;
  const Range reads[] = {{0, 9}, {4090, 12300}, {12000, 70000}, {299999, 300000}, {1, 1048574}};
  for (const Range& r : reads) {
    memset(dst, 0xCD, r.length);
    ASSERT_EQ(this->run1(*q, this->op(IoKind::kRead, 1, r.offset, r.length, dst, cookie++)),
              Errc::kOk);
    ASSERT_EQ(memcmp(dst, model.data() + r.offset, r.length), 0)
        << "read at " << r.offset << " length " << r.length;
  }
}

TYPED_TEST(TransportConformance, ManyOutstandingUpToDepthEachCompletesOnce) {
  auto q = this->open();
  ASSERT_NE(q, nullptr);
  const size_t depth = q->depth();
  ASSERT_GE(depth, 4u);
  constexpr uint32_t kLen = 512;
  ASSERT_LE(depth * kLen * 2, kBufSize);
  uint8_t* src = this->buf_.data();
  fill_pattern(src, depth * kLen, 50);

  // Fill the queue in batches of 3 and singles.
  std::vector<IoOp> ops;
  for (size_t i = 0; i < depth; ++i)
    ops.push_back(this->op(IoKind::kWrite, 0, i * kLen, kLen, src + i * kLen, 1000 + i));
  size_t posted = 0;
  while (posted < depth) {
    const size_t n = std::min<size_t>(posted % 2 == 0 ? 3 : 1, depth - posted);
    ASSERT_EQ(q->post(std::span(ops).subspan(posted, n)), Errc::kOk);
    posted += n;
  }
  EXPECT_EQ(q->outstanding(), depth);

  // Full: one more is refused and nothing is posted.
  IoOp extra = this->op(IoKind::kWrite, 0, 0, kLen, src, 7777);
  EXPECT_EQ(q->post({&extra, 1}), Errc::kResourceExhausted);
  EXPECT_EQ(q->outstanding(), depth);

  // Reap one at a time with a one-entry span first.
  std::map<uint64_t, int> seen;
  IoCompletion one[1];
  size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got < 3 && std::chrono::steady_clock::now() < deadline) {
    const size_t k = q->wait(one, 1000);
    ASSERT_LE(k, 1u);
    if (k == 1) {
      EXPECT_EQ(one[0].status, Errc::kOk);
      ++seen[one[0].cookie];
      ++got;
    }
  }
  ASSERT_EQ(got, 3u);
  EXPECT_EQ(q->outstanding(), depth - 3);

  // A batch that does not fit as a whole is refused as a whole.
  std::vector<IoOp> four(4, extra);
  EXPECT_EQ(q->post(four), Errc::kResourceExhausted);
  EXPECT_EQ(q->outstanding(), depth - 3);

  auto rest = this->reap(*q, depth - 3);
  ASSERT_EQ(rest.size(), depth - 3);
  for (auto& c : rest) {
    EXPECT_EQ(c.status, Errc::kOk);
    ++seen[c.cookie];
  }
  EXPECT_EQ(q->outstanding(), 0u);
  IoCompletion c[4];
  EXPECT_EQ(q->poll(c), 0u);
  ASSERT_EQ(seen.size(), depth);
  for (size_t i = 0; i < depth; ++i) EXPECT_EQ(seen[1000 + i], 1) << "cookie " << 1000 + i;

  // All the data landed: read it back in one full-depth batch.
  uint8_t* dst = this->buf_.data() + depth * kLen;
  memset(dst, 0, depth * kLen);
  ops.clear();
  for (size_t i = 0; i < depth; ++i)
    ops.push_back(this->op(IoKind::kRead, 0, i * kLen, kLen, dst + i * kLen, 5000 + i));
  ASSERT_EQ(q->post(ops), Errc::kOk);
  auto reads = this->reap(*q, depth);
  ASSERT_EQ(reads.size(), depth);
  for (auto& x : reads) EXPECT_EQ(x.status, Errc::kOk);
  EXPECT_EQ(memcmp(src, dst, depth * kLen), 0);
}

TYPED_TEST(TransportConformance, ErrorsCompleteWithTheirCodeAndTheQueueKeepsWorking) {
  auto q = this->open();
  ASSERT_NE(q, nullptr);
  const uint64_t size = this->h_.slabs()[1].size;
  // Known content at the end of slab 1, to prove a refused WRITE moved nothing.
  uint8_t* tail = this->buf_.data() + (1u << 20);
  fill_pattern(tail, 64, 60);
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kWrite, 1, size - 64, 64, tail, 1)), Errc::kOk);

  std::vector<uint8_t> unregistered(8192, 0xAB);
  uint8_t* reg = this->buf_.data();
  fill_pattern(reg, 8192, 61);

  SlabId not_added = 1;
  for (const SlabDesc& s : this->h_.slabs()) not_added = std::max(not_added, s.slab + 1000);

  struct Case {
    const char* what;
    IoOp op;
    Errc want;
  };
  const Case cases[] = {
      {"READ into unregistered memory",
       this->op(IoKind::kRead, 0, 0, 4096, unregistered.data(), 10), Errc::kInvalidArgument},
      {"WRITE from unregistered memory",
       this->op(IoKind::kWrite, 1, size - 64, 64, unregistered.data(), 11), Errc::kInvalidArgument},
      {"local range running past the registered buffer's end",
       this->op(IoKind::kRead, 0, 0, 4096, this->buf_.data() + kBufSize - 100, 12),
       Errc::kInvalidArgument},
      {"length 0", this->op(IoKind::kRead, 0, 0, 0, reg, 13), Errc::kInvalidArgument},
      {"length kMaxIoLength + 1", this->op(IoKind::kRead, 0, 0, wire::kMaxIoLength + 1, reg, 14),
       Errc::kInvalidArgument},
      {"unknown server",
       IoOp{IoKind::kRead, 64, {this->h_.unknown_server(), this->h_.slabs()[0].slab, 0}, reg, 15},
       Errc::kInvalidArgument},
      {"slab not added", IoOp{IoKind::kWrite, 64, {this->h_.server(), not_added, 0}, reg, 16},
       Errc::kInvalidArgument},
      {"WRITE one byte past the slab end", this->op(IoKind::kWrite, 1, size - 63, 64, reg, 17),
       Errc::kOutOfRange},
      {"READ starting at the slab end", this->op(IoKind::kRead, 1, size, 1, reg, 18),
       Errc::kOutOfRange},
      {"offset + length overflows", this->op(IoKind::kRead, 1, ~uint64_t{0} - 10, 64, reg, 19),
       Errc::kOutOfRange},
  };
  uint32_t seed = 70;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(this->run1(*q, c.op), c.want);
    EXPECT_EQ(q->outstanding(), 0u);
    this->expect_round_trip(*q, 4096 * seed, 3000, seed);
    ++seed;
  }
  // Nothing moved: the unregistered buffer and the slab's tail are intact.
  EXPECT_TRUE(
      std::all_of(unregistered.begin(), unregistered.end(), [](uint8_t b) { return b == 0xAB; }));
  uint8_t* check = this->buf_.data() + 16384;
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kRead, 1, size - 64, 64, check, 2)), Errc::kOk);
  EXPECT_EQ(memcmp(check, tail, 64), 0);

  // Errors mixed into one batch with good ops: each completes with its own code.
  std::vector<IoOp> batch;
  std::map<uint64_t, Errc> want;
  for (int i = 0; i < 3; ++i) {
    batch.push_back(this->op(IoKind::kRead, 0, i * 64, 64, reg + i * 64, 500 + i));
    want[500 + i] = Errc::kOk;
    batch.push_back(cases[(i * 4) % std::size(cases)].op);
    batch.back().cookie = 600 + i;
    want[600 + i] = cases[(i * 4) % std::size(cases)].want;
  }
  ASSERT_EQ(q->post(batch), Errc::kOk);
  auto got = this->reap(*q, batch.size());
  ASSERT_EQ(got.size(), batch.size());
  for (auto& c : got) {
    ASSERT_EQ(want.count(c.cookie), 1u) << "unexpected or repeated cookie " << c.cookie;
    EXPECT_EQ(c.status, want[c.cookie]) << "cookie " << c.cookie;
    want.erase(c.cookie);
  }
}

TYPED_TEST(TransportConformance, KilledServerCompletesOutstandingAndLaterOpsUnavailable) {
  auto q = this->open();
  ASSERT_NE(q, nullptr);
  uint8_t* src = this->buf_.data();
  fill_pattern(src, 65536, 80);
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kWrite, 0, 0, 4096, src, 1)), Errc::kOk);

  constexpr size_t kN = 16;
  std::vector<IoOp> ops;
  for (size_t i = 0; i < kN; ++i)
    ops.push_back(this->op(i % 2 ? IoKind::kRead : IoKind::kWrite, 0, i * 4096, 4096,
                           src + i * 4096, 100 + i));
  ASSERT_EQ(q->post(ops), Errc::kOk);
  this->h_.kill_server();

  auto got = this->reap(*q, kN);
  ASSERT_EQ(got.size(), kN);
  std::map<uint64_t, int> seen;
  for (auto& c : got) {
    ++seen[c.cookie];
    if (TypeParam::kKillFailsOutstanding) {
      EXPECT_EQ(c.status, Errc::kUnavailable) << "cookie " << c.cookie;
    } else {
      EXPECT_TRUE(c.status == Errc::kUnavailable || c.status == Errc::kOk)
          << "cookie " << c.cookie << ": " << errc_name(c.status);
    }
  }
  EXPECT_EQ(seen.size(), kN);
  EXPECT_EQ(q->outstanding(), 0u);

  // Later ops: refused by post() on a broken queue, or accepted and
  // completed kUnavailable. Either way never kOk, and exactly once.
  for (int i = 0; i < 3; ++i) {
    IoOp later = this->op(IoKind::kRead, 0, 0, 4096, src, 200 + i);
    const Errc e = q->post({&later, 1});
    if (e == Errc::kUnavailable) continue;
    ASSERT_EQ(e, Errc::kOk);
    auto c = this->reap(*q, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].cookie, 200u + i);
    EXPECT_EQ(c[0].status, Errc::kUnavailable);
  }
  // A queue opened after the death sees the same.
  auto q2 = this->open();
  if (q2 != nullptr) {
    IoOp later = this->op(IoKind::kWrite, 1, 0, 64, src, 300);
    const Errc e = q2->post({&later, 1});
    if (e != Errc::kUnavailable) {
      ASSERT_EQ(e, Errc::kOk);
      auto c = this->reap(*q2, 1);
      ASSERT_EQ(c.size(), 1u);
      EXPECT_EQ(c[0].status, Errc::kUnavailable);
    }
  }
}

TYPED_TEST(TransportConformance, WaitAndPollWithNothingOutstandingReturnZero) {
  auto q = this->open();
  ASSERT_NE(q, nullptr);
  IoCompletion c[4];
  EXPECT_EQ(q->poll(c), 0u);
  // Must not sit out the timeout: nothing can ever complete.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(q->wait(c, 20000), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // Same after a completed op was reaped.
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kRead, 0, 0, 64, this->buf_.data(), 1)), Errc::kOk);
  EXPECT_EQ(q->wait(c, 20000), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(q->outstanding(), 0u);
}

TYPED_TEST(TransportConformance, RegisterRulesRefuseOverlapAndUnknownUnregister) {
  auto& t = this->h_.transport();
  uint8_t* b = this->buf_.data();  // [b, b + kBufSize) is registered by the fixture
  std::vector<uint8_t> other(3 * 65536);
  uint8_t* o = other.data();

  EXPECT_EQ(t.register_buffer(b, kBufSize).code(), Errc::kInvalidArgument);     // same
  EXPECT_EQ(t.register_buffer(b + 4096, 4096).code(), Errc::kInvalidArgument);  // inside
  EXPECT_EQ(t.unregister_buffer(b + 4096).code(), Errc::kNotFound);             // not a start
  EXPECT_EQ(t.unregister_buffer(o).code(), Errc::kNotFound);                    // never

  // Adjacent buffers are fine; overlapping either edge or containing is not.
  Status st = t.register_buffer(o + 65536, 65536);
  ASSERT_TRUE(st.ok()) << st.to_string();
  st = t.register_buffer(o, 65536);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(t.register_buffer(o + 65536 - 1, 2).code(), Errc::kInvalidArgument);
  EXPECT_EQ(t.register_buffer(o + 2 * 65536 - 1, 100).code(), Errc::kInvalidArgument);
  EXPECT_EQ(t.register_buffer(o + 100, 3 * 65536 - 100).code(), Errc::kInvalidArgument);
  st = t.register_buffer(o + 2 * 65536, 65536);
  ASSERT_TRUE(st.ok()) << st.to_string();

  auto q = this->open();
  ASSERT_NE(q, nullptr);
  fill_pattern(o, other.size(), 90);
  // An op inside one of them works; an op spanning two adjacent registrations
  // is not "wholly inside a registered buffer".
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kWrite, 0, 0, 65536, o + 65536, 1)), Errc::kOk);
  EXPECT_EQ(this->run1(*q, this->op(IoKind::kWrite, 0, 0, 4096, o + 65536 - 2048, 2)),
            Errc::kInvalidArgument);

  // After unregister the memory is refused; registering it again restores it.
  st = t.unregister_buffer(o + 65536);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(t.unregister_buffer(o + 65536).code(), Errc::kNotFound);
  EXPECT_EQ(this->run1(*q, this->op(IoKind::kRead, 0, 0, 4096, o + 65536, 3)),
            Errc::kInvalidArgument);
  st = t.register_buffer(o + 65536, 65536);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const std::vector<uint8_t> written(o + 65536, o + 2 * 65536);
  memset(o + 65536, 0, 65536);
  ASSERT_EQ(this->run1(*q, this->op(IoKind::kRead, 0, 0, 65536, o + 65536, 4)), Errc::kOk);
  EXPECT_EQ(memcmp(o + 65536, written.data(), 65536), 0);
  for (int i = 0; i < 3; ++i) {
    st = t.unregister_buffer(o + i * 65536);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
}

#if defined(FARMEM_TCP_CONFORMANCE)
// Threads of this process whose allowed CPUs are exactly {cpu}.
int threads_pinned_to(int cpu) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream st(std::string("/proc/self/task/") + e->d_name + "/status");
    std::string line;
    while (std::getline(st, line)) {
      if (line.rfind("Cpus_allowed_list:", 0) != 0) continue;
      std::string v = line.substr(line.find_first_not_of(" \t", 18));
      n += v == std::to_string(cpu);
    }
  }
  closedir(d);
  return n;
}

// A data connection from this host is served on the CPU that sends its
// requests (DonorOptions::follow_local_senders, donor_server.cc
// "follow_sender_cpu"): a client thread pinned to CPU a, then another one
// pinned to CPU b, each doing READs on the same queue; once it is gone, the
// donor's data thread is the one thread left pinned to that CPU, and every
// READ is byte-exact. Off, no thread is pinned.
TEST(TcpDonorFollowCpu, DataThreadFollowsTheSendersCpu) {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  for (bool follow : {true, false}) {
    SCOPED_TRACE(follow ? "follow on" : "follow off");
    std::vector<uint8_t> buf(3 * 4096);
    TcpHarness h;
    h.SetUp(follow);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    ASSERT_TRUE(h.transport().register_buffer(buf.data(), buf.size()).ok());
    auto q = h.transport().open_queue();
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    auto run1 = [&](IoKind k, uint8_t* local) {
      IoOp o{k, 4096, {h.server(), h.slabs()[0].slab, 8192}, local, 1};
      if ((*q)->post({&o, 1}) != Errc::kOk) return false;
      IoCompletion c[1];
      for (int i = 0; i < 500 && (*q)->wait(c, 10) == 0; ++i) {
      }
      return c[0].status == Errc::kOk;
    };
    fill_pattern(buf.data(), 4096, 7);
    ASSERT_TRUE(run1(IoKind::kWrite, buf.data()));
    for (int cpu : {cpus[0], cpus[1], cpus[0]}) {
      bool ok = true;
      std::thread t([&] {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        ok = sched_setaffinity(0, sizeof one, &one) == 0;
        for (int i = 0; ok && i < 64; ++i) {
          memset(buf.data() + 4096, 0, 4096);
          ok = run1(IoKind::kRead, buf.data() + 4096) &&
               memcmp(buf.data(), buf.data() + 4096, 4096) == 0;
        }
      });
      t.join();
      ASSERT_TRUE(ok) << "READs from CPU " << cpu;
      EXPECT_EQ(threads_pinned_to(cpu), follow ? 1 : 0) << "CPU " << cpu;
    }
    q->reset();
    h.TearDown();
  }
}

// "Local donors" (tcp_transport.cc): a slab is read one-sided only once
// the session secret was found through the pid and address it came with.
// Told another address, or a pid that is not the donor's, the transport
// keeps the slab on the wire, and its ops are still right: what one
// transport writes on the wire, another reads one-sided.
TEST(TcpLocalDonor, UnprovenSlabsStayOnTheWire) {
  TcpLocalHarness h;
  ASSERT_NO_FATAL_FAILURE(h.SetUp());
  if (IsSkipped()) return;
  ASSERT_EQ(h.transport().local_slabs(), 2u);
  auto tp = std::make_unique<TcpTransport>();  // destroyed before the session
  TcpTransport& t = *tp;
  ASSERT_TRUE(t.add_server(h.server(), &h.session()).ok());
  SlabDesc moved = h.slabs()[0];
  moved.addr += 4096;  // no proof after this "view"
  SlabDesc other = h.slabs()[1];
  other.rkey = static_cast<uint32_t>(getppid());  // a live process, not the donor
  ASSERT_TRUE(t.add_slab(h.server(), moved).ok());
  ASSERT_TRUE(t.add_slab(h.server(), other).ok());
  EXPECT_EQ(t.local_slabs(), 0u);

  std::vector<uint8_t> buf(3 * 4096);
  for (size_t i = 0; i < 4096; ++i) buf[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_TRUE(t.register_buffer(buf.data(), buf.size()).ok());
  ASSERT_TRUE(h.transport().register_buffer(buf.data() + 4096, 2 * 4096).ok());
  auto wire_q = t.open_queue();
  auto local_q = h.transport().open_queue();
  ASSERT_TRUE(wire_q.ok() && local_q.ok());
  auto run1 = [](TcpTransport::Queue& q, const IoOp& op) {
    if (q.post({&op, 1}) != Errc::kOk) return Errc::kInternal;
    IoCompletion c[1];
    return q.wait(c, 5000) == 1 ? c[0].status : Errc::kTimeout;
  };
  const auto st0 = h.session().stats();
  ASSERT_TRUE(st0.ok());
  for (const SlabDesc& d : {moved, other}) {
    SCOPED_TRACE(d.slab);
    ASSERT_EQ(run1(**wire_q, IoOp{IoKind::kWrite, 4096, {h.server(), d.slab, 8192}, buf.data(), 1}),
              Errc::kOk);
    ASSERT_EQ(run1(**local_q,
                   IoOp{IoKind::kRead, 4096, {h.server(), d.slab, 8192}, buf.data() + 4096, 2}),
              Errc::kOk);
    EXPECT_EQ(memcmp(buf.data(), buf.data() + 4096, 4096), 0);
  }
  const auto st1 = h.session().stats();
  ASSERT_TRUE(st1.ok());
  EXPECT_EQ(st1->writes - st0->writes, 2u) << "the unproven slabs' WRITEs went on the wire";
  EXPECT_EQ(st1->reads - st0->reads, 0u) << "the proven slabs' READs did not";
  wire_q->reset();
  local_q->reset();
  tp.reset();
  h.TearDown();
}

// "Local donors", the slab's file: with pidfd_getfd allowed every local
// slab is read and written through its memfd. A single op is one pread /
// pwrite, a post that is one run of consecutive offsets in one slab one
// preadv / pwritev, and the donor's own mapping (the wire) sees the same
// bytes. Once the donor takes the slab back (RELEASE) its file is empty:
// a late READ or WRITE through it completes kUnavailable, and the slab,
// lent again, is zero.
TEST(TcpLocalDonor, SlabFilesAreByteExactAndARevokedFileFailsItsOps) {
  TcpLocalHarness h;
  ASSERT_NO_FATAL_FAILURE(h.SetUp());
  if (IsSkipped()) return;
  if (!take_fd_allowed()) GTEST_SKIP() << "pidfd_getfd is not allowed here: no slab files";
  ASSERT_EQ(h.transport().local_files(), 2u);
  auto tp = std::make_unique<TcpTransport>();  // on the wire; destroyed before the session
  TcpTransport& wire = *tp;
  ASSERT_TRUE(wire.add_server(h.server(), &h.session()).ok());
  for (SlabDesc d : h.slabs()) {
    d.addr = 0;
    d.rkey = 0;
    ASSERT_TRUE(wire.add_slab(h.server(), d).ok());
  }
  constexpr size_t kPage = 4096;
  std::vector<uint8_t> buf(16 * kPage);
  ASSERT_TRUE(h.transport().register_buffer(buf.data(), 8 * kPage).ok());
  ASSERT_TRUE(wire.register_buffer(buf.data() + 8 * kPage, 8 * kPage).ok());
  uint8_t* mine = buf.data();
  uint8_t* seen = buf.data() + 8 * kPage;
  fill_pattern(mine, 4 * kPage, 17);
  auto q = h.transport().open_queue();
  auto wq = wire.open_queue();
  ASSERT_TRUE(q.ok() && wq.ok());
  auto run = [](TcpTransport::Queue& queue, std::vector<IoOp> ops) {
    std::map<uint64_t, Errc> out;
    if (queue.post(ops) != Errc::kOk) return out;
    std::vector<IoCompletion> c(ops.size());
    size_t got = 0;
    for (int i = 0; i < 50 && got < ops.size(); ++i)
      got += queue.wait(std::span(c).subspan(got), 100);
    for (size_t i = 0; i < got; ++i) out[c[i].cookie] = c[i].status;
    return out;
  };
  const ServerId sv = h.server();
  const SlabId s0 = h.slabs()[0].slab, s1 = h.slabs()[1].slab;
  const auto st0 = h.session().stats();
  ASSERT_TRUE(st0.ok());
  const uint64_t calls0 = (*q)->local_calls();
  // One op: one call, and the donor's mapping holds what it wrote.
  auto out = run(**q, {IoOp{IoKind::kWrite, kPage, {sv, s0, 3 * kPage}, mine, 1}});
  EXPECT_EQ(out[1], Errc::kOk);
  EXPECT_EQ((*q)->local_calls() - calls0, 1u);
  out = run(**wq, {IoOp{IoKind::kRead, kPage, {sv, s0, 3 * kPage}, seen, 2}});
  ASSERT_EQ(out[2], Errc::kOk);
  EXPECT_EQ(memcmp(mine, seen, kPage), 0);
  // A run of three consecutive pages from scattered buffers: one call;
  // read back through the wire and through the file, byte-exact.
  out = run(**q, {IoOp{IoKind::kWrite, kPage, {sv, s1, 10 * kPage}, mine + 3 * kPage, 3},
                  IoOp{IoKind::kWrite, kPage, {sv, s1, 11 * kPage}, mine + 1 * kPage, 4},
                  IoOp{IoKind::kWrite, kPage, {sv, s1, 12 * kPage}, mine + 2 * kPage, 5}});
  EXPECT_EQ(out[3], Errc::kOk);
  EXPECT_EQ(out[4], Errc::kOk);
  EXPECT_EQ(out[5], Errc::kOk);
  EXPECT_EQ((*q)->local_calls() - calls0, 2u);
  out = run(**wq, {IoOp{IoKind::kRead, 3 * kPage, {sv, s1, 10 * kPage}, seen, 6}});
  ASSERT_EQ(out[6], Errc::kOk);
  EXPECT_EQ(memcmp(seen, mine + 3 * kPage, kPage), 0);
  EXPECT_EQ(memcmp(seen + kPage, mine + kPage, 2 * kPage), 0);
  uint8_t* back = mine + 4 * kPage;
  out = run(**q, {IoOp{IoKind::kRead, kPage, {sv, s1, 11 * kPage}, back, 7},
                  IoOp{IoKind::kRead, kPage, {sv, s1, 12 * kPage}, back + kPage, 8}});
  EXPECT_EQ(out[7], Errc::kOk);
  EXPECT_EQ(out[8], Errc::kOk);
  EXPECT_EQ((*q)->local_calls() - calls0, 3u);
  EXPECT_EQ(memcmp(back, mine + kPage, 2 * kPage), 0);
  const auto st1 = h.session().stats();
  ASSERT_TRUE(st1.ok());
  EXPECT_EQ(st1->writes - st0->writes, 0u) << "the file path's WRITEs went on the wire";
  EXPECT_EQ(st1->reads - st0->reads, 2u);  // the wire transport's two

  // Revoked: the donor took slab 0 back. A late READ through its file
  // fails (and fails the donor for that queue); a late WRITE, on a queue
  // that has not failed yet, fails too and reaches nothing.
  ASSERT_TRUE(h.session().release(s0).ok());
  out = run(**q, {IoOp{IoKind::kRead, kPage, {sv, s0, 3 * kPage}, back, 9}});
  EXPECT_EQ(out[9], Errc::kUnavailable);
  auto q2 = h.transport().open_queue();
  ASSERT_TRUE(q2.ok());
  out = run(**q2, {IoOp{IoKind::kWrite, kPage, {sv, s0, 3 * kPage}, mine, 10}});
  EXPECT_EQ(out[10], Errc::kUnavailable);
  auto again = h.session().lease(h.slabs()[0].size);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  ASSERT_EQ((*again)[0].slab, s0) << "the donor lends the last slab it took back first";
  memset(seen, 0xEE, kPage);
  out = run(**wq, {IoOp{IoKind::kRead, kPage, {sv, s0, 3 * kPage}, seen, 11}});
  ASSERT_EQ(out[11], Errc::kOk);
  EXPECT_TRUE(std::all_of(seen, seen + kPage, [](uint8_t b) { return b == 0; }))
      << "a slab lent again must start zeroed, whatever the late client did";
  q->reset();
  q2->reset();
  wq->reset();
  tp.reset();
  h.TearDown();
}

// One post's run of one-sided ops of one kind is one system call
// ("Local donors", Batches). A full queue of WRITEs then of READs reads
// back byte-exact, off the wire. When the call fails (here: one op's own
// buffer faults), each op is done again on its own: the ops before it
// complete kOk, it fails, and so does the rest (the donor is failed for
// the queue, as with a single op).
TEST(TcpLocalDonor, BatchesAreByteExactAndAFailureIsTheFailingOps) {
  TcpLocalHarness h;
  ASSERT_NO_FATAL_FAILURE(h.SetUp());
  if (IsSkipped()) return;
  ASSERT_EQ(h.transport().local_slabs(), 2u);
  const long page = sysconf(_SC_PAGESIZE);
  constexpr size_t kLen = 1024;
  auto q = h.transport().open_queue();
  ASSERT_TRUE(q.ok());
  const size_t n = (*q)->depth();
  ASSERT_GE(n, 8u);
  const size_t bytes = (2 * n * kLen + page - 1) / page * page + page;
  auto* buf = static_cast<uint8_t*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(buf, MAP_FAILED);
  ASSERT_TRUE(h.transport().register_buffer(buf, bytes).ok());
  uint8_t* src = buf;
  uint8_t* dst = buf + n * kLen;
  fill_pattern(src, n * kLen, 91);
  memset(dst, 0, n * kLen);
  const auto st0 = h.session().stats();
  ASSERT_TRUE(st0.ok());
  auto post_all = [&](IoKind kind, uint8_t* local, uint64_t cookie0) {
    std::vector<IoOp> ops;
    for (size_t i = 0; i < n; ++i)
      ops.push_back(IoOp{kind,
                         static_cast<uint32_t>(kLen),
                         {h.server(), h.slabs()[i % 2].slab, 4096 + (i / 2) * kLen},
                         local + i * kLen,
                         cookie0 + i});
    EXPECT_EQ((*q)->post(ops), Errc::kOk);
    std::vector<IoCompletion> c(n);
    size_t got = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got < n && std::chrono::steady_clock::now() < end)
      got += (*q)->wait(std::span(c).subspan(got), 1000);
    EXPECT_EQ(got, n);
    // Once each, in the order posted.
    std::map<uint64_t, Errc> out;
    for (size_t i = 0; i < got; ++i) {
      EXPECT_EQ(c[i].cookie, cookie0 + i);
      EXPECT_TRUE(out.emplace(c[i].cookie, c[i].status).second);
    }
    return out;
  };
  // Both slabs, one donor, one kind: one run, so one call, per post.
  const uint64_t calls0 = (*q)->local_calls();
  for (const auto& [cookie, st] : post_all(IoKind::kWrite, src, 1000))
    EXPECT_EQ(st, Errc::kOk) << cookie;
  EXPECT_EQ((*q)->local_calls() - calls0, 1u);
  for (const auto& [cookie, st] : post_all(IoKind::kRead, dst, 2000))
    EXPECT_EQ(st, Errc::kOk) << cookie;
  EXPECT_EQ((*q)->local_calls() - calls0, 2u);
  EXPECT_EQ(memcmp(src, dst, n * kLen), 0);
  const auto st1 = h.session().stats();
  ASSERT_TRUE(st1.ok());
  EXPECT_EQ(st1->reads - st0->reads, 0u);
  EXPECT_EQ(st1->writes - st0->writes, 0u);

  // Op `bad`'s buffer faults: the batch's call fails part way.
  const size_t bad = n / 2;
  uint8_t* hole = src + bad * kLen;
  uint8_t* hole_page = buf + ((hole - buf) / page) * page;
  ASSERT_EQ(mprotect(hole_page, page, PROT_NONE), 0);
  const size_t first_bad = static_cast<size_t>(hole_page - src) / kLen;  // the page holds more
  const auto out = post_all(IoKind::kWrite, src, 3000);
  ASSERT_EQ(out.size(), n);
  for (const auto& [cookie, st] : out) {
    const size_t i = cookie - 3000;
    if (i < first_bad)
      EXPECT_EQ(st, Errc::kOk) << "op " << i << ", before the faulting buffer";
    else
      EXPECT_EQ(st, Errc::kUnavailable) << "op " << i << ", at or after it";
  }
  ASSERT_EQ(mprotect(hole_page, page, PROT_READ | PROT_WRITE), 0);
  q->reset();
  munmap(buf, bytes);
  h.TearDown();
}
#endif  // FARMEM_TCP_CONFORMANCE

}  // namespace
}  // namespace farmem::testing
