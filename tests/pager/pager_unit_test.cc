// Pager pieces that need no userfaultfd: page table, lists, config,
// prefetch decisions and the replacement policy simulation.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "pager/config.h"
#include "pager/page_table.h"
#include "pager/prefetch.h"
#include "pager/replacement_sim.h"
#include "pager/uffd.h"

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
  // Never: a dirty path straight to Remote, mapping without a fetch, or
  // leaving a transient state for another transient one.
  EXPECT_FALSE(page_transition_allowed(S::kPresent, S::kRemote));
  EXPECT_FALSE(page_transition_allowed(S::kRemote, S::kPresent));
  EXPECT_FALSE(page_transition_allowed(S::kEmpty, S::kPresent));
  EXPECT_FALSE(page_transition_allowed(S::kFetching, S::kWriting));
  EXPECT_FALSE(page_transition_allowed(S::kWriting, S::kPresent));
  EXPECT_FALSE(page_transition_allowed(S::kDemoting, S::kRemote));
  int allowed = 0;
  for (int f = 0; f < kNumPageStates; ++f)
    for (int t = 0; t < kNumPageStates; ++t)
      allowed += page_transition_allowed(static_cast<S>(f), static_cast<S>(t));
  EXPECT_EQ(allowed, 22);
  EXPECT_STREQ(page_state_name(S::kWriting), "writing");
}

TEST(PageTableTest, WordPacksStateFlagsAndSlot) {
  PageTable pt;
  ASSERT_TRUE(pt.init(1000).ok());
  EXPECT_EQ(sizeof(BlockMeta), 16u);
  EXPECT_EQ(PageTable::state_of(pt.load(999)), PageState::kEmpty);
  EXPECT_EQ(pt.meta(5).remote, 0u);
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
  EXPECT_EQ(PagerConfig{}.uffd_move, UffdMoveMode::kOff);  // measured slower: see pager.h
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
