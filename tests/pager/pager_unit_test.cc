// Pager pieces that need no userfaultfd: page table, lists, config,
// prefetch decisions and the replacement policy simulation.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "pager/config.h"
#include "pager/page_table.h"
#include "pager/prefetch.h"
#include "pager/replacement_sim.h"
#include "pager/uffd.h"
#include "pager/zap.h"

namespace farmem {
namespace {

TEST(PageTableTest, TransitionTableMatchesTheDrawing) {
  using S = PageState;
  EXPECT_TRUE(page_transition_allowed(S::kEmpty, S::kFetching));
  EXPECT_TRUE(page_transition_allowed(S::kRemote, S::kFetching));
  EXPECT_TRUE(page_transition_allowed(S::kFetching, S::kPresent));
  EXPECT_TRUE(page_transition_allowed(S::kFetching, S::kVictim));
  EXPECT_TRUE(page_transition_allowed(S::kPresent, S::kDemoting));
  EXPECT_TRUE(page_transition_allowed(S::kVictim, S::kWriting));
  EXPECT_TRUE(page_transition_allowed(S::kWriting, S::kRemote));
  EXPECT_TRUE(page_transition_allowed(S::kVictim, S::kEmpty));
  // A clean block a prefetch stream mapped ahead, dropped without the victim
  // cache ("s" in the drawing; demote_batch() checks clean and remote).
  EXPECT_TRUE(page_transition_allowed(S::kDemoting, S::kRemote));
  // Never: a dirty path straight to Remote, mapping without a fetch, or
  // leaving a transient state for another transient one.
  EXPECT_FALSE(page_transition_allowed(S::kPresent, S::kRemote));
  EXPECT_FALSE(page_transition_allowed(S::kRemote, S::kPresent));
  EXPECT_FALSE(page_transition_allowed(S::kEmpty, S::kPresent));
  EXPECT_FALSE(page_transition_allowed(S::kFetching, S::kWriting));
  EXPECT_FALSE(page_transition_allowed(S::kWriting, S::kPresent));
  EXPECT_FALSE(page_transition_allowed(S::kDemoting, S::kEmpty));
  int allowed = 0;
  for (int f = 0; f < kNumPageStates; ++f)
    for (int t = 0; t < kNumPageStates; ++t)
      allowed += page_transition_allowed(static_cast<S>(f), static_cast<S>(t));
  EXPECT_EQ(allowed, 23);
  EXPECT_STREQ(page_state_name(S::kWriting), "writing");
}

TEST(PageTableTest, WordPacksStateFlagsAndSlot) {
  PageTable pt;
  ASSERT_TRUE(pt.init(1000).ok());
  EXPECT_EQ(sizeof(BlockMeta), 12u);
  EXPECT_EQ(PageTable::state_of(pt.load(999)), PageState::kEmpty);
  EXPECT_EQ(pt.remote(5), 0u);
  uint32_t w = pt.load(5);
  ASSERT_TRUE(pt.try_transition(5, w, PageTable::make(PageState::kFetching, 0, 12345)));
  pt.finish(5, PageTable::make(PageState::kVictim, PageTable::kDirty, 12345));
  uint32_t v = pt.load(5);
  EXPECT_EQ(PageTable::state_of(v), PageState::kVictim);
  EXPECT_EQ(PageTable::slot_of(v), 12345u);
  EXPECT_TRUE(v & PageTable::kDirty);
  // A stale expected word fails the CAS and is refreshed.
  uint32_t stale = w;
  EXPECT_FALSE(pt.try_transition(5, stale, PageTable::make(PageState::kFetching, 0, 0)));
  EXPECT_EQ(stale, v);
  EXPECT_EQ(pt.init(0).code(), Errc::kInvalidArgument);
}

// block_hash() (the written hint of guessed blocks): the same bytes give
// the same hash, and a change of any one byte, at any position of a 4 KiB
// block (each of the four lanes and the last word), gives another.
// The metadata budget (pager/page_table.h): a block that is resident and
// on a list pays 12 bytes (word and links); its remote unit is written only
// when it is first written back, so a heap that fits its budget never
// touches that array (reading it maps the zero page).
TEST(PageTableTest, ResidentBlocksPayTwelveBytesUntilWrittenBack) {
  constexpr uint32_t kBlocks = 1u << 16;  // 768 KiB of words and links
  PageTable pt;
  ASSERT_TRUE(pt.init(1u << 22).ok());
  const size_t empty = pt.resident_bytes();
  BlockList active(&pt);
  uint64_t remote_sum = 0;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    uint32_t w = pt.load(b);
    ASSERT_TRUE(pt.try_transition(b, w, PageTable::make(PageState::kFetching, 0, 0)));
    pt.finish(b, PageTable::make(PageState::kPresent, 0, 0));
    active.push_front(b);
    remote_sum += pt.remote(b);  // never written back: 0, and a zero page
  }
  EXPECT_EQ(remote_sum, 0u);
  const size_t resident = pt.resident_bytes();
  ASSERT_GT(resident, 0u) << "no Rss for the table in /proc/self/smaps";
  EXPECT_GE(resident - empty, size_t{kBlocks} * 12 - 4096);
  EXPECT_LE(resident - empty, size_t{kBlocks} * 12 + 8192);
  for (uint32_t b = 0; b < kBlocks; ++b) pt.remote(b) = b + 1;  // all written back
  const size_t written = pt.resident_bytes();
  EXPECT_GE(written - resident, size_t{kBlocks} * 4 - 4096);
  EXPECT_LE(written - resident, size_t{kBlocks} * 4 + 8192);
  for (uint32_t b = kBlocks; b-- > 0;) active.remove(b);
  EXPECT_TRUE(active.empty());
}

TEST(PageTableTest, BlockHashSeesEveryByte) {
  std::vector<uint8_t> blk(4096);
  std::mt19937 rng(7);
  for (auto& x : blk) x = static_cast<uint8_t>(rng());
  const uint32_t h0 = block_hash(blk.data(), blk.size());
  EXPECT_EQ(block_hash(blk.data(), blk.size()), h0);
  for (size_t i = 0; i < blk.size(); ++i) {
    blk[i] ^= 0x01;
    ASSERT_NE(block_hash(blk.data(), blk.size()), h0) << "byte " << i;
    blk[i] ^= 0x01;
  }
  // Two words swapped within a lane and across lanes: not the same hash.
  std::vector<uint8_t> sw = blk;
  std::swap_ranges(sw.begin(), sw.begin() + 8, sw.begin() + 32);
  EXPECT_NE(block_hash(sw.data(), sw.size()), h0);
  sw = blk;
  std::swap_ranges(sw.begin(), sw.begin() + 8, sw.begin() + 8 + 8);
  EXPECT_NE(block_hash(sw.data(), sw.size()), h0);
  // Zeros vs. one set bit in the tail past the last whole 32-byte group.
  std::vector<uint8_t> z(4096 + 8, 0);
  const uint32_t hz = block_hash(z.data(), z.size());
  z.back() = 0x80;
  EXPECT_NE(block_hash(z.data(), z.size()), hz);
}

// ZapBatch (pager/zap.h): the ranges added, scattered and adjacent, read
// back as zeros after a flush, every page between them keeps its bytes,
// more ranges than one call takes are flushed as they come, and the
// fallback (one madvise() per range, for kernels without the batched
// call) does the same.
void zap_batch_drops_exactly_the_ranges(bool batching) {
  ZapBatch::set_batching_for_testing(batching);
  constexpr size_t kPages = 4096;
  const size_t pg = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, kPages * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* mem = static_cast<uint8_t*>(m);
  for (size_t i = 0; i < kPages; ++i) memset(mem + i * pg, static_cast<int>(i % 251) + 1, pg);
  std::vector<bool> zapped(kPages, false);
  std::mt19937 rng(11);
  ZapBatch z;
  // ~700 scattered ranges (more than kMaxRanges), some runs of 2-3 pages.
  for (int k = 0; k < 900; ++k) {
    size_t p = rng() % (kPages - 3);
    size_t len = 1 + rng() % 3;
    bool fresh = true;
    for (size_t i = 0; i < len; ++i) fresh = fresh && !zapped[p + i];
    if (!fresh) continue;
    // Added in ascending order within a run: adjacent ranges merge.
    for (size_t i = 0; i < len; ++i) {
      ASSERT_EQ(z.add(mem + (p + i) * pg, pg), 0);
      zapped[p + i] = true;
    }
  }
  ASSERT_EQ(z.flush(), 0);
  EXPECT_EQ(z.pending(), 0u);
  EXPECT_EQ(z.flush(), 0);  // nothing left: a no-op
  for (size_t i = 0; i < kPages; ++i) {
    const uint8_t want = zapped[i] ? 0 : static_cast<uint8_t>(i % 251 + 1);
    ASSERT_EQ(mem[i * pg], want) << "page " << i;
    ASSERT_EQ(mem[i * pg + pg - 1], want) << "page " << i;
  }
  if (batching && ZapBatch::batching_available()) {
    EXPECT_GT(z.batched_calls(), 1u);  // more ranges than one call takes
    EXPECT_LE(z.batched_calls(), 3u);
  } else {
    EXPECT_EQ(z.batched_calls(), 0u);
    EXPECT_GT(z.single_calls(), 1u);
  }
  munmap(m, kPages * pg);
  ZapBatch::set_batching_for_testing(true);
}

TEST(ZapBatchTest, DropsExactlyTheRangesAdded) {
  zap_batch_drops_exactly_the_ranges(true);
}
TEST(ZapBatchTest, FallbackDropsExactlyTheRangesAdded) {
  zap_batch_drops_exactly_the_ranges(false);
}

TEST(PageTableDeathTest, IllegalTransitionIsABug) {
  PageTable pt;
  ASSERT_TRUE(pt.init(4).ok());
  uint32_t w = pt.load(1);
  EXPECT_DEATH((void)pt.try_transition(1, w, PageTable::make(PageState::kPresent, 0, 0)), "BUG");
}

TEST(BlockListTest, FifoOrderAndRemoval) {
  PageTable pt;
  ASSERT_TRUE(pt.init(10).ok());
  BlockList l(&pt);
  for (uint32_t b : {1u, 2u, 3u, 4u}) l.push_front(b);
  EXPECT_EQ(l.size(), 4u);
  EXPECT_EQ(l.back(), 1u);
  l.remove(1);
  EXPECT_EQ(l.back(), 2u);
  l.remove(3);
  EXPECT_EQ(l.prev_of(2), 4u);
  l.remove(4);
  l.remove(2);
  EXPECT_TRUE(l.empty());
  EXPECT_EQ(l.back(), kNil);
}

TEST(PagerConfigTest, ValidatesWithClearErrors) {
  PagerConfig c;
  EXPECT_TRUE(c.validate().ok());
  c.block_size = 12288;
  Status s = c.validate();
  EXPECT_EQ(s.code(), Errc::kInvalidArgument);
  EXPECT_NE(s.message().find("power of two"), std::string::npos) << s.message();
  c = PagerConfig{};
  c.local_budget = 16 * 4096;
  s = c.validate();
  EXPECT_NE(s.message().find("FARMEM_LOCAL_MEM"), std::string::npos) << s.message();
  c = PagerConfig{};
  c.low_watermark = 0.99;
  EXPECT_EQ(c.validate().code(), Errc::kInvalidArgument);
  c = PagerConfig{};
  c.region_size = 4096 * 3 + 1;
  EXPECT_EQ(c.validate().code(), Errc::kInvalidArgument);
}

TEST(PagerConfigTest, ParsesLocalMem) {
  auto a = parse_local_mem("512M");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 512ull << 20);
  auto b = parse_local_mem("50%");
  ASSERT_TRUE(b.ok());
  EXPECT_GT(*b, 0u);
  auto bad = parse_local_mem("lots");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("FARMEM_LOCAL_MEM"), std::string::npos);
}

TEST(PagerConfigTest, FromEnvReadsVariables) {
  setenv("FARMEM_LOCAL_MEM", "64M", 1);
  setenv("FARMEM_PAGER_THREADS", "3", 1);
  setenv("FARMEM_BLOCK_SIZE", "64K", 1);
  auto c = PagerConfig::from_env(PagerConfig{});
  unsetenv("FARMEM_LOCAL_MEM");
  unsetenv("FARMEM_PAGER_THREADS");
  unsetenv("FARMEM_BLOCK_SIZE");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->local_budget, 64ull << 20);
  EXPECT_EQ(c->handler_threads, 3u);
  EXPECT_EQ(c->block_size, 65536u);
  setenv("FARMEM_PAGER_THREADS", "0", 1);
  auto bad = PagerConfig::from_env(PagerConfig{});
  unsetenv("FARMEM_PAGER_THREADS");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("FARMEM_PAGER_THREADS"), std::string::npos);
}

TEST(PagerConfigTest, FromEnvZeroChunkAndBlockingRead) {
  setenv("FARMEM_ZERO_CHUNK", "16", 1);
  setenv("FARMEM_BLOCKING_READ", "0", 1);
  auto c = PagerConfig::from_env(PagerConfig{});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->zero_chunk, 16u);
  EXPECT_FALSE(c->blocking_read);
  EXPECT_TRUE(PagerConfig{}.blocking_read);
  setenv("FARMEM_BLOCKING_READ", "2", 1);
  auto bad = PagerConfig::from_env(PagerConfig{});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("FARMEM_BLOCKING_READ"), std::string::npos);
  setenv("FARMEM_BLOCKING_READ", "1", 1);
  setenv("FARMEM_ZERO_CHUNK", "24", 1);
  auto bad_chunk = PagerConfig::from_env(PagerConfig{});
  unsetenv("FARMEM_ZERO_CHUNK");
  unsetenv("FARMEM_BLOCKING_READ");
  ASSERT_FALSE(bad_chunk.ok());
  EXPECT_NE(bad_chunk.status().message().find("power of two"), std::string::npos)
      << bad_chunk.status().message();
}

TEST(PagerConfigTest, FromEnvZeroPage) {
  EXPECT_TRUE(PagerConfig{}.zero_page);
  setenv("FARMEM_ZERO_PAGE", "0", 1);
  auto c = PagerConfig::from_env(PagerConfig{});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->zero_page);
  setenv("FARMEM_ZERO_PAGE", "yes", 1);
  auto bad = PagerConfig::from_env(PagerConfig{});
  unsetenv("FARMEM_ZERO_PAGE");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("FARMEM_ZERO_PAGE"), std::string::npos)
      << bad.status().message();
}

TEST(PagerConfigTest, FromEnvPinHandlersAndWrittenWritable) {
  EXPECT_TRUE(PagerConfig{}.pin_handlers);
  EXPECT_TRUE(PagerConfig{}.written_writable);
  setenv("FARMEM_PIN_HANDLERS", "0", 1);
  setenv("FARMEM_WRITTEN_WRITABLE", "0", 1);
  auto c = PagerConfig::from_env(PagerConfig{});
  unsetenv("FARMEM_WRITTEN_WRITABLE");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->pin_handlers);
  EXPECT_FALSE(c->written_writable);
  setenv("FARMEM_PIN_HANDLERS", "2", 1);
  auto bad = PagerConfig::from_env(PagerConfig{});
  unsetenv("FARMEM_PIN_HANDLERS");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("FARMEM_PIN_HANDLERS"), std::string::npos);
  // One handler per allowed CPU when pinned; the old cores / 2 otherwise.
  const size_t cpus = allowed_cpus().size();
  ASSERT_GE(cpus, 1u);
  EXPECT_EQ(default_handler_threads(true), std::min<size_t>(cpus, 64));
  EXPECT_GE(default_handler_threads(false), 1u);
  EXPECT_LE(default_handler_threads(false), 8u);
}

TEST(PrefetcherTest, SequentialStreamPrefetchesAhead) {
  Prefetcher pf(16, 1000);
  uint32_t out[16];
  EXPECT_EQ(pf.on_fault(10, false, out, 16), 0u);
  EXPECT_EQ(pf.on_fault(11, false, out, 16), 0u);  // one delta: no trend yet
  size_t n = pf.on_fault(12, false, out, 16);
  ASSERT_EQ(n, 4u);
  EXPECT_EQ(out[0], 13u);
  EXPECT_EQ(out[3], 16u);
  // Hits on prefetched blocks grow the window.
  n = pf.on_fault(13, true, out, 16);
  EXPECT_EQ(n, 8u);
  n = pf.on_fault(14, true, out, 16);
  EXPECT_EQ(n, 16u);
  // Stops at the end of the region.
  Prefetcher edge(16, 20);
  edge.on_fault(17, false, out, 16);
  edge.on_fault(18, false, out, 16);
  n = edge.on_fault(19, false, out, 16);
  EXPECT_EQ(n, 0u);
}

// A confirmed read stream whose mapped-ahead blocks are then written (a
// read-modify-write scan) maps its next windows writable; a block no
// stream mapped ahead changes nothing.
TEST(PrefetcherTest, WrittenAheadMakesAReadStreamMapWritable) {
  Prefetcher pf(16, 1000);
  uint32_t out[16];
  Prefetcher::Plan plan;
  pf.on_fault(10, false, false, out, 16, &plan);
  pf.on_fault(11, false, false, out, 16, &plan);
  ASSERT_EQ(pf.on_fault(12, false, false, out, 16, &plan), 4u);
  ASSERT_EQ(pf.on_fault(13, true, false, out, 16, &plan), 8u);  // a hit: confirmed
  EXPECT_TRUE(plan.confirmed);
  EXPECT_FALSE(plan.write);
  EXPECT_FALSE(pf.on_written_ahead(500));  // nobody's block
  ASSERT_EQ(pf.on_fault(14, true, false, out, 16, &plan), 16u);
  EXPECT_FALSE(plan.write);
  EXPECT_TRUE(pf.on_written_ahead(16));  // mapped ahead by the stream, then written
  ASSERT_GT(pf.on_fault(15, true, false, out, 16, &plan), 0u);
  EXPECT_TRUE(plan.write) << "the stream writes what it walks: map writable";
  // A stream not confirmed yet maps nothing at once: its blocks are not
  // "mapped ahead".
  Prefetcher fresh(16, 1000);
  fresh.on_fault(100, false, false, out, 16, &plan);
  fresh.on_fault(101, false, false, out, 16, &plan);
  EXPECT_FALSE(fresh.on_written_ahead(102));
}

TEST(PrefetcherTest, StridedAndMajorityTrend) {
  Prefetcher pf(8, 100000);
  uint32_t out[8];
  pf.on_fault(100, false, out, 8);
  pf.on_fault(103, false, out, 8);
  size_t n = pf.on_fault(106, false, out, 8);
  ASSERT_EQ(n, 4u);
  EXPECT_EQ(out[0], 109u);
  EXPECT_EQ(out[1], 112u);
  // Majority: +2 in 6 of 8 deltas, interleaved with noise.
  int64_t d[8] = {2, 2, 50, 2, 2, -7, 2, 2};
  int64_t m = 0;
  EXPECT_TRUE(Prefetcher::majority(d, 8, &m));
  EXPECT_EQ(m, 2);
  int64_t e[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_FALSE(Prefetcher::majority(e, 8, &m));
  // Random faults: no trend, no prefetch.
  Prefetcher rnd(8, 100000);
  uint32_t seq[] = {500, 17, 9000, 42, 31337, 777, 12, 60000, 4};
  size_t total = 0;
  for (uint32_t b : seq) total += rnd.on_fault(b, false, out, 8);
  EXPECT_EQ(total, 0u);
}

// The pager's side of prefetch, modelled for the Prefetcher tests: a
// candidate still remote is fetched; on a confirmed stream it is mapped at
// once (never faults) but for the plan's marker, otherwise it waits in the
// victim cache (a fault on it is a prefetch hit). Nothing is evicted.
struct PrefetchModel {
  PrefetchModel(uint32_t max_window, uint64_t n) : pf(max_window, n), state(n, kRemote) {}
  enum : uint8_t { kRemote, kVictim, kMapped };
  Prefetcher pf;
  std::vector<uint8_t> state;
  std::vector<uint8_t> fetched_by_prefetch = std::vector<uint8_t>(state.size(), 0);
  size_t demand = 0, hits = 0, issued = 0, candidates = 0;
  size_t write_plans = 0, read_plans = 0, wrong_side = 0;
  int last_dir = 0;  // direction of the last stream plan's candidates

  void access(uint32_t b, bool write = false) {
    if (state[b] == kMapped) return;
    const bool hit = state[b] == kVictim;
    ++(hit ? hits : demand);
    state[b] = kMapped;
    uint32_t out[64];
    Prefetcher::Plan plan;
    const size_t n = pf.on_fault(b, hit, write, out, 64, &plan);
    candidates += n;
    if (n > 0) ++(plan.write ? write_plans : read_plans);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t c = out[i];
      // Nearest first, all on one side of the fault.
      const int dir = c > b ? 1 : -1;
      if (i == 0) last_dir = dir;
      if (dir != last_dir) ++wrong_side;
      if (state[c] != kRemote) continue;
      ++issued;
      fetched_by_prefetch[c] = 1;
      state[c] = plan.confirmed && c != plan.marker ? kMapped : kVictim;
    }
  }
  // Blocks fetched by prefetch that [lo, hi) of the streams never read.
  size_t wasted(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) const {
    size_t w = 0;
    for (size_t c = 0; c < state.size(); ++c) {
      if (!fetched_by_prefetch[c]) continue;
      bool in = false;
      for (auto [lo, hi] : ranges) in = in || (c >= lo && c < hi);
      w += in ? 0 : 1;
    }
    return w;
  }
};

// STREAM's kernels walk 2 or 3 arrays in lockstep: the faults interleave
// ascending streams thousands of blocks apart, which one delta history
// cannot follow (no delta holds a majority). Each stream is followed on its
// own: after its first 3 faults (2 sequential steps) every block of it is
// prefetched, and what is prefetched is read.
TEST(PrefetcherTest, TwoInterleavedAscendingStreams) {
  const uint32_t kLen = 4096, kGap = 5461;
  PrefetchModel m(32, 1u << 20);
  const uint32_t a = 1000, b = a + kGap;
  for (uint32_t i = 0; i < kLen; ++i) {
    m.access(a + i);
    m.access(b + i);
  }
  EXPECT_EQ(m.demand, 2u * 3u);  // 3 faults each before its stream is taken
  EXPECT_EQ(m.demand + m.issued, 2u * kLen + m.wasted({{a, a + kLen}, {b, b + kLen}}));
  // Only the window past each stream's end is read for nothing.
  EXPECT_LE(m.wasted({{a, a + kLen}, {b, b + kLen}}), 2u * 32u);
  // Marker faults keep each stream a window ahead: about one per half window.
  EXPECT_LE(m.hits, 2u * (kLen / 16 + 8));
  EXPECT_EQ(m.wrong_side, 0u);
  EXPECT_EQ(m.write_plans, 0u);
}

TEST(PrefetcherTest, ThreeInterleavedAscendingStreamsOneWriting) {
  // c[i] = a[i] + b[i]: a and b read, c written.
  const uint32_t kLen = 3000, kGap = 5461;
  PrefetchModel m(32, 1u << 20);
  const uint32_t a = 7, b = a + kGap, c = b + kGap;
  for (uint32_t i = 0; i < kLen; ++i) {
    m.access(a + i);
    m.access(b + i);
    m.access(c + i, /*write=*/true);
  }
  const std::vector<std::pair<uint32_t, uint32_t>> r = {
      {a, a + kLen}, {b, b + kLen}, {c, c + kLen}};
  EXPECT_EQ(m.demand, 3u * 3u);
  EXPECT_EQ(m.demand + m.issued, 3u * kLen + m.wasted(r));
  EXPECT_LE(m.wasted(r), 3u * 32u);
  EXPECT_LE(m.hits, 3u * (kLen / 16 + 8));
  EXPECT_EQ(m.wrong_side, 0u);
  // The written stream's blocks may be mapped writable, the others not.
  EXPECT_GT(m.write_plans, 0u);
  EXPECT_GT(m.read_plans, 2 * m.write_plans - 4);
  EXPECT_LT(m.read_plans, 2 * m.write_plans + 4);
}

TEST(PrefetcherTest, DescendingStream) {
  const uint32_t kTop = 9000, kLen = 5000;
  PrefetchModel m(32, 1u << 20);
  for (uint32_t i = 0; i < kLen; ++i) m.access(kTop - i);
  EXPECT_EQ(m.demand, 3u);
  EXPECT_LE(m.wasted({{kTop - kLen + 1, kTop + 1}}), 32u);
  EXPECT_EQ(m.demand + m.issued, kLen + m.wasted({{kTop - kLen + 1, kTop + 1}}));
  EXPECT_EQ(m.wrong_side, 0u);
  EXPECT_EQ(m.last_dir, -1);
  // Down to block 0: no candidate below it.
  PrefetchModel low(32, 1000);
  for (uint32_t i = 0; i < 100; ++i) low.access(99 - i);
  EXPECT_EQ(low.wasted({{0, 100}}), 0u);
}

// A descending and an ascending stream interleaved, next to each other.
TEST(PrefetcherTest, OppositeStreamsSideBySide) {
  PrefetchModel m(16, 100000);
  for (uint32_t i = 0; i < 2000; ++i) {
    m.access(50000 - i);
    m.access(50001 + i);
  }
  EXPECT_EQ(m.demand, 2u * 3u);
  // Only the windows past both ends are read for nothing.
  EXPECT_LE(m.wasted({{48001, 52001}}), 2u * 16u);
  EXPECT_EQ(m.wrong_side, 0u);
}

// Random faults continue no stream: (almost) no candidates, over a large
// region and over one small enough that neighbours are common.
TEST(PrefetcherTest, RandomFaultsPrefetchAlmostNothing) {
  for (uint32_t blocks : {1u << 22, 1u << 14}) {
    PrefetchModel m(32, blocks);
    std::mt19937 rng(12345);  // fixed seed: the same sequence everywhere
    const size_t kFaults = 20000;
    for (size_t i = 0; i < kFaults; ++i) {
      const uint32_t b = static_cast<uint32_t>(rng() % blocks);
      m.state[b] = PrefetchModel::kRemote;  // as if evicted again: every access faults
      m.access(b);
    }
    printf("random over %u blocks: %zu candidates for %zu faults\n", blocks, m.candidates, kFaults);
    EXPECT_LE(m.candidates, kFaults / 200) << blocks << " blocks";
  }
}

TEST(PrefetcherTest, StillAheadFollowsTheStream) {
  Prefetcher pf(8, 100000);
  uint32_t out[8];
  Prefetcher::Plan plan;
  pf.on_fault(100, false, false, out, 8, &plan);
  pf.on_fault(101, false, false, out, 8, &plan);
  ASSERT_EQ(pf.on_fault(102, false, false, out, 8, &plan), 4u);
  const uint32_t tag = plan.stream;
  ASSERT_NE(tag, Prefetcher::kNoStream);
  EXPECT_FALSE(plan.confirmed);
  EXPECT_TRUE(pf.still_ahead(tag, 103));
  EXPECT_TRUE(pf.still_ahead(tag, 106));
  EXPECT_FALSE(pf.still_ahead(tag, 107));  // past the window
  EXPECT_FALSE(pf.still_ahead(tag, 102));  // the stream is there already
  // A hit confirms the stream (map at once) and grows its window.
  ASSERT_EQ(pf.on_fault(103, true, false, out, 8, &plan), 8u);
  EXPECT_TRUE(plan.confirmed);
  EXPECT_EQ(plan.stream, tag);
  EXPECT_EQ(plan.marker, 108u);  // half a window ahead
  EXPECT_FALSE(pf.still_ahead(tag, 103));
  EXPECT_TRUE(pf.still_ahead(tag, 111));
  // Unused prefetches shrink it.
  for (int i = 0; i < 4; ++i) pf.on_unused();
  EXPECT_EQ(pf.stream_window(104), 4u);
  // Once its entry is taken by other streams, its leftovers are no longer wanted.
  for (uint32_t k = 0; k < Prefetcher::kStreams; ++k) pf.on_fault(50000 + 1000 * k, false, out, 8);
  EXPECT_FALSE(pf.still_ahead(tag, 105));
  EXPECT_FALSE(pf.still_ahead(Prefetcher::kNoStream, 105));
}

// The replacement policy the pager implements, against FIFO and exact LRU
// on a zipfian (theta 0.99) trace with a budget of 25% of the items.
TEST(ReplacementTest, VictimFifoWithinFivePointsOfLru) {
  const uint32_t items = 100000;
  auto trace = zipf_trace(items, 2000000, 0.99, 42);
  const size_t cap = items / 4;
  SimResult fifo = simulate_fifo(trace, items, cap);
  SimResult lru = simulate_lru(trace, items, cap);
  SimResult ours = simulate_victim_fifo(trace, items, cap, 0.25);
  printf("zipf 0.99, 25%% budget: FIFO %.4f  victim-FIFO %.4f (victim hits %.4f)  LRU %.4f\n",
         fifo.hit_ratio(), ours.hit_ratio(),
         static_cast<double>(ours.victim_hits) / static_cast<double>(ours.accesses),
         lru.hit_ratio());
  EXPECT_GT(ours.hit_ratio(), fifo.hit_ratio());
  EXPECT_GE(ours.hit_ratio(), lru.hit_ratio() - 0.05);
  // With no victim cache the policy is FIFO exactly.
  SimResult none = simulate_victim_fifo(trace, items, cap, 0.0);
  EXPECT_EQ(none.hits, fifo.hits);
}

TEST(ReplacementTest, ZipfTraceIsSkewed) {
  auto t = zipf_trace(1000, 100000, 0.99, 7);
  size_t top = 0;
  for (uint32_t x : t) {
    ASSERT_LT(x, 1000u);
    top += x < 10;
  }
  // The 10 hottest of 1000 items take roughly 39% of the accesses at 0.99.
  EXPECT_GT(top, 30000u);
  EXPECT_LT(top, 50000u);
}

TEST(UffdTest, PermissionErrorNamesTheFixes) {
  Status s = uffd_permission_error(EPERM, EACCES);
  EXPECT_EQ(s.code(), Errc::kPermissionDenied);
  EXPECT_NE(s.message().find("CAP_SYS_PTRACE"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("vm.unprivileged_userfaultfd=1"), std::string::npos);
  EXPECT_NE(s.message().find("/dev/userfaultfd"), std::string::npos);
  EXPECT_NE(s.message().find("Operation not permitted"), std::string::npos);
}

TEST(PagerConfigTest, UffdMoveModeFromEnv) {
  EXPECT_EQ(PagerConfig{}.uffd_move, UffdMoveMode::kAuto);  // on where present: see config.h
  const std::pair<const char*, UffdMoveMode> cases[] = {
      {"auto", UffdMoveMode::kAuto}, {"on", UffdMoveMode::kOn}, {"off", UffdMoveMode::kOff}};
  for (const auto& [text, mode] : cases) {
    setenv("FARMEM_UFFD_MOVE", text, 1);
    auto c = PagerConfig::from_env(PagerConfig{});
    unsetenv("FARMEM_UFFD_MOVE");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->uffd_move, mode) << text;
    EXPECT_STREQ(uffd_move_name(mode), text);
  }
  setenv("FARMEM_UFFD_MOVE", "yes", 1);
  auto bad = PagerConfig::from_env(PagerConfig{});
  unsetenv("FARMEM_UFFD_MOVE");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("FARMEM_UFFD_MOVE=yes"), std::string::npos);
}

// UFFDIO_MOVE between a MISSING|WP region and a WP-only slot area, as the
// pager uses it: bytes arrive intact, the source is left unmapped, and the
// refusals the pager falls back on carry their errno.
TEST(UffdTest, MoveBetweenRegionAndSlots) {
  auto u = Uffd::open();
  if (!u.ok()) GTEST_SKIP() << u.status().to_string();
  if (!u->features().move) GTEST_SKIP() << "no UFFDIO_MOVE: " << u->features().to_string();
  constexpr size_t kPg = 4096, kLen = 4 * kPg;
  auto map = [] {
    void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    (void)madvise(p, kLen, MADV_NOHUGEPAGE);
    return static_cast<char*>(p);
  };
  char* region = map();
  char* slots = map();
  ASSERT_TRUE(u->register_range(region, kLen).ok());
  ASSERT_TRUE(u->register_wp_only(slots, kLen).ok());
  std::vector<char> pattern(kPg);
  for (size_t i = 0; i < kPg; ++i) pattern[i] = static_cast<char>(i * 7 + 1);
  ASSERT_EQ(u->copy(region, pattern.data(), kPg, /*write_protect=*/true), Errc::kOk);

  // Out: region page 0 -> slot 0. The region page is gone (mincore), so
  // nothing here touches it again (it would fault with no handler).
  ASSERT_EQ(u->move(slots, region, kPg, /*wake=*/false), Errc::kOk);
  EXPECT_EQ(memcmp(slots, pattern.data(), kPg), 0);
  unsigned char vec[4] = {};
  ASSERT_EQ(mincore(region, kLen, vec), 0);
  EXPECT_EQ(vec[0] & 1, 0);
  // In: slot 0 -> region page 1, mapped writable.
  ASSERT_EQ(u->move(region + kPg, slots, kPg, /*wake=*/true), Errc::kOk);
  EXPECT_EQ(memcmp(region + kPg, pattern.data(), kPg), 0);
  region[kPg] = 42;  // writable: no WP fault (none could be served here)
  EXPECT_EQ(region[kPg], 42);
  ASSERT_EQ(mincore(slots, kLen, vec), 0);
  EXPECT_EQ(vec[0] & 1, 0);

  // Refusals: a mapped destination (EEXIST), a missing source (ENOENT).
  slots[kPg] = 1;
  int err = 0;
  EXPECT_EQ(u->move(slots + kPg, region + kPg, kPg, false, &err), Errc::kIo);
  EXPECT_EQ(err, EEXIST);
  err = 0;
  EXPECT_EQ(u->move(slots + 2 * kPg, region + 2 * kPg, kPg, false, &err), Errc::kIo);
  EXPECT_EQ(err, ENOENT);
  EXPECT_EQ(region[kPg], 42);  // a refused move leaves the source alone

  ASSERT_TRUE(u->unregister_range(region, kLen).ok());
  ASSERT_TRUE(u->unregister_range(slots, kLen).ok());
  munmap(region, kLen);
  munmap(slots, kLen);
}

TEST(UffdTest, DetectsFeaturesWhenAvailable) {
  auto u = Uffd::open();
  if (!u.ok()) {
    EXPECT_EQ(u.status().code(), Errc::kPermissionDenied) << u.status().to_string();
    GTEST_SKIP() << u.status().to_string();
  }
  const UffdFeatures& f = u->features();
  EXPECT_TRUE(f.missing_wp);
  EXPECT_EQ(f.to_string().rfind("missing+wp", 0), 0u) << f.to_string();
  EXPECT_GE(u->fd(), 0);
  printf("userfaultfd features: %s (raw 0x%llx)\n", f.to_string().c_str(),
         static_cast<unsigned long long>(f.raw));
}

}  // namespace
}  // namespace farmem
