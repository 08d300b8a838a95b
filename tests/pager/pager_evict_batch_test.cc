// Eviction batching (pager.h "Eviction batching"): dirty blocks demoted
// together are write-protected one UFFDIO_WRITEPROTECT per run of adjacent
// blocks and dropped one MADV_DONTNEED per run; evict_round() demotes at
// least min(64, budget / 16) blocks at once; demote_batch() closes gaps of
// one or two resident blocks between the blocks it demotes. Each test checks
// the bytes after eviction, the budget (sampled) and the call counters.
#include <gtest/gtest.h>

#include "tests/pager/pager_harness.h"

namespace farmem::testing {
namespace {

// The batching counters hold for runs of dirty blocks on the copy path,
// which UFFDIO_MOVE keeps for them (only a dirty block with no dirty
// neighbour in its batch moves); WP_ASYNC (FARMEM_TEST_WP_ASYNC) demotes
// without these calls.
bool copy_path(const P& p) {
  return !p.uses_wp_async();
}

TEST(PagerEvictBatch, SequentialDirtyBlocksLeaveInRunsByteExact) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 1024, kPages = 4096;
  LoopbackRig rig;
  P& p = start_without_prefetch(rig, kBudget, 2 * kPages);
  auto* mem = static_cast<uint8_t*>(p.base());
  ResidentSampler sampler([&] { return p.resident_bytes(); }, mem, kPages * kPage);
  // A sequential writer: the oldest blocks (the active list's tail) are
  // adjacent, so every demotion batch is one run.
  for (size_t pg = 0; pg < kPages; ++pg) fill_page(mem + pg * kPage, pg, 0);
  const PagerStats s = p.stats();
  const uint64_t wp = p.evict_wp_calls(), dn = p.evict_dontneed_calls();
  // Everything past the budget was demoted at least once, every block dirty.
  ASSERT_GE(s.demotions, kPages - kBudget) << s.to_string();
  if (copy_path(p)) {
    // One call per block before batching; runs of up to 64 (80 with gap
    // fills) now. Leave room for short runs at the edges of a batch.
    EXPECT_GT(wp, 0u);
    EXPECT_LE(wp * 8, s.demotions) << "wp calls " << wp << ", " << s.to_string();
    EXPECT_LE(dn * 8, s.demotions) << "dontneed calls " << dn << ", " << s.to_string();
    // Runs are copied, not moved one block at a time (a lone block at the
    // edge of a batch may move).
    EXPECT_LE(s.moves_out * 8, s.demotions) << s.to_string();
  }
  // Read everything back (remote faults and victim hits): byte-exact.
  EXPECT_EQ(first_bad_page(mem, kPages, 0), kPages);
  // And once more after writing a second version over the first.
  for (size_t pg = 0; pg < kPages; ++pg) fill_page(mem + pg * kPage, pg, 1);
  EXPECT_EQ(first_bad_page(mem, kPages, 1), kPages);
  sampler.stop();
  EXPECT_GT(sampler.samples(), 0u);
  EXPECT_LE(sampler.max_counter(), p.budget_bytes() + P::kSlackBytes);
  EXPECT_LE(p.stats().resident_peak_bytes, p.budget_bytes() + P::kSlackBytes);
}

// With UFFDIO_MOVE, scattered dirty blocks (no dirty neighbour in their
// batch) move into their victim slots, one ioctl each and no write-protect
// or drop, while a sequential run beside them is copied; both come back
// byte-exact.
TEST(PagerEvictBatch, ScatteredDirtyBlocksMoveRunsAreCopiedByteExact) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 256, kScattered = 512, kRun = 512;
  LoopbackRig rig;
  PagerConfig c = small_config(kBudget, 8192);
  c.prefetch = false;
  c.zero_fault_around = 0;  // one block per first-touch fault
  c.zero_chunk = 0;
  c.uffd_move = UffdMoveMode::kAuto;
  P& p = rig.start(c);
  if (!p.uses_move()) GTEST_SKIP() << "no UFFDIO_MOVE on this kernel";
  auto* mem = static_cast<uint8_t*>(p.base());
  // Every third page (no two adjacent), then a run of adjacent pages, twice
  // the budget each.
  for (size_t k = 0; k < kScattered; ++k) fill_page(mem + 3 * k * kPage, 3 * k, 0);
  const PagerStats s1 = p.stats();
  const size_t run0 = 3 * kScattered + 16;
  for (size_t pg = run0; pg < run0 + kRun; ++pg) fill_page(mem + pg * kPage, pg, 0);
  const PagerStats s2 = p.stats();
  // The scattered pages' demotions moved where their slot was empty (69-83
  // of 156-312 here; a slot a written-back victim left its page in takes a
  // copy into that page instead); the run's were copied.
  EXPECT_GT(s1.moves_out, 0u) << s1.to_string();
  EXPECT_GE(s1.moves_out * 8, s1.demotions) << s1.to_string();
  EXPECT_LE((s2.moves_out - s1.moves_out) * 4, s2.demotions - s1.demotions) << s2.to_string();
  EXPECT_GT(p.evict_wp_calls(), 0u) << s2.to_string();
  for (size_t k = 0; k < kScattered; ++k) {
    ASSERT_EQ(first_bad_page(mem, 3 * k + 1, 0, 3 * k), 3 * k + 1) << "page " << 3 * k;
  }
  EXPECT_EQ(first_bad_page(mem, run0 + kRun, 0, run0), run0 + kRun);
  EXPECT_LE(p.stats().resident_peak_bytes, p.budget_bytes() + P::kSlackBytes);
}

TEST(PagerEvictBatch, GapOfOneYoungerBlockIsDemotedWithItsNeighbours) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 1024, kPages = 4096, kFirst = 512, kGap = 10;
  LoopbackRig rig;
  P& p = start_without_prefetch(rig, kBudget, 2 * kPages);
  auto* mem = static_cast<uint8_t*>(p.base());
  // Half the budget: the evictor has nothing to do yet.
  for (size_t pg = 0; pg < kFirst; ++pg) fill_page(mem + pg * kPage, pg, 0);
  // Block kGap leaves now and comes back with a read: it is then the
  // youngest block on the active list, between blocks that are the oldest.
  ASSERT_TRUE(p.evict(mem + kGap * kPage, kPage).ok());
  ASSERT_EQ(p.state_of(mem + kGap * kPage), PageState::kRemote);
  EXPECT_EQ(first_bad_page(mem, kGap + 1, 0, kGap), kGap + 1);
  // The copy wakes this thread before the handler marks the block Present.
  ASSERT_TRUE(
      wait_until([&] { return p.state_of(mem + kGap * kPage) == PageState::kPresent; }, 30000));
  const uint64_t fills0 = p.evict_gap_fills();
  ResidentSampler sampler([&] { return p.resident_bytes(); }, mem, kPages * kPage);
  // Three budgets more: the first demotion batch takes the tail, blocks
  // 0..9 and 11..64, and block 10 with them (no eviction has run yet, so
  // nothing else can have reordered the tail).
  for (size_t pg = kFirst; pg < kPages; ++pg) fill_page(mem + pg * kPage, pg, 0);
  sampler.stop();
  if (copy_path(p)) {
    EXPECT_GE(p.evict_gap_fills(), fills0 + 1);
  }
  EXPECT_NE(p.state_of(mem + kGap * kPage), PageState::kPresent);
  EXPECT_EQ(first_bad_page(mem, kPages, 0), kPages);
  EXPECT_GT(sampler.samples(), 0u);
  EXPECT_LE(sampler.max_counter(), p.budget_bytes() + P::kSlackBytes);
}

// Prefetch installs by run: a confirmed stream's blocks that land together
// are mapped by one UFFDIO_COPY (flush_run()).
TEST(PagerEvictBatch, PrefetchedRunsAreMappedByOneCopyByteExact) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 1024, kPages = 4096;
  LoopbackRig rig;
  PagerConfig c = small_config(kBudget, 2 * kPages);
  c.prefetch = true;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  for (size_t pg = 0; pg < kPages; ++pg) fill_page(mem + pg * kPage, pg, 0);
  // Everything but the last budget's worth is remote or a victim now.
  ASSERT_TRUE(p.evict(mem, kPages * kPage).ok());
  const PagerStats s0 = p.stats();
  const uint64_t runs0 = p.prefetch_run_copies();
  ResidentSampler sampler([&] { return p.resident_bytes(); }, mem, kPages * kPage);
  // Two sequential passes, ascending then descending: both kinds of run.
  EXPECT_EQ(first_bad_page(mem, kPages, 0), kPages);
  uint8_t expect[kPage];
  for (size_t pg = kPages; pg-- > 0;) {
    fill_page(expect, pg, 0);
    ASSERT_EQ(memcmp(mem + pg * kPage, expect, kPage), 0) << "page " << pg;
  }
  sampler.stop();
  const PagerStats s = p.stats();
  // The stream is confirmed within a few windows; from then on most blocks
  // are mapped at once, and a window's blocks complete together.
  EXPECT_GT(s.prefetch_mapped - s0.prefetch_mapped, kPages / 2) << s.to_string();
  EXPECT_GT(p.prefetch_run_copies() - runs0, 0u) << s.to_string();
  EXPECT_GT(sampler.samples(), 0u);
  EXPECT_LE(sampler.max_counter(), p.budget_bytes() + P::kSlackBytes);
  EXPECT_LE(s.resident_peak_bytes, p.budget_bytes() + P::kSlackBytes);
}

// Scan resistance: blocks a confirmed stream mapped ahead and that are
// still clean leave without the victim cache (no copy, no slot, no I/O);
// a clean scan writes nothing back, and the bytes stay exact.
TEST(PagerEvictBatch, CleanScanDropsMappedAheadBlocksWithoutVictimCacheByteExact) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 1024, kPages = 4096;
  LoopbackRig rig;
  PagerConfig c = small_config(kBudget, 2 * kPages);
  c.prefetch = true;
  // Exact: no demand-faulted block comes back writable on the guess that
  // it is written again (fault_path.h "Written blocks come back
  // writable"), so a read-only scan writes nothing back.
  c.written_writable = false;
  P& p = rig.start(c);
  // The window a confirmed stream may reach: budget / 16 blocks here.
  EXPECT_EQ(p.config().prefetch_max_window, kBudget / 16);
  auto* mem = static_cast<uint8_t*>(p.base());
  for (size_t pg = 0; pg < kPages; ++pg) fill_page(mem + pg * kPage, pg, 0);
  ASSERT_TRUE(p.evict(mem, kPages * kPage).ok());  // written back: all clean now
  const PagerStats s0 = p.stats();
  const uint64_t drops0 = p.evict_ahead_drops();
  ResidentSampler sampler([&] { return p.resident_bytes(); }, mem, kPages * kPage);
  // Two read passes over four budgets.
  EXPECT_EQ(first_bad_page(mem, kPages, 0), kPages);
  EXPECT_EQ(first_bad_page(mem, kPages, 0), kPages);
  sampler.stop();
  const PagerStats s = p.stats();
  // Nothing was written, so nothing is written back.
  EXPECT_EQ(s.writes - s0.writes, 0u) << s.to_string();
  EXPECT_EQ(s.evictions_dirty - s0.evictions_dirty, 0u) << s.to_string();
  if (copy_path(p)) {
    // At least 2 * (kPages - kBudget) blocks left; most of them were mapped
    // ahead and dropped straight from the active list.
    const uint64_t drops = p.evict_ahead_drops() - drops0;
    EXPECT_GT(drops, kPages) << s.to_string();
    EXPECT_LE(drops, s.evictions_clean - s0.evictions_clean) << s.to_string();
    EXPECT_LT(s.demotions - s0.demotions, drops) << s.to_string();
  }
  EXPECT_GT(sampler.samples(), 0u);
  EXPECT_LE(sampler.max_counter(), p.budget_bytes() + P::kSlackBytes);
  EXPECT_LE(s.resident_peak_bytes, p.budget_bytes() + P::kSlackBytes);
}

// A block mapped ahead by a read stream and then written is dirty: it goes
// through the victim cache and is written back, never dropped clean.
TEST(PagerEvictBatch, MappedAheadBlockWrittenLaterIsWrittenBackByteExact) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 1024, kPages = 4096, kTail = 256;
  LoopbackRig rig;
  PagerConfig c = small_config(kBudget, 2 * kPages);
  c.prefetch = true;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  for (size_t pg = 0; pg < kPages; ++pg) fill_page(mem + pg * kPage, pg, 0);
  ASSERT_TRUE(p.evict(mem, kPages * kPage).ok());
  // A read pass maps the tail ahead (write-protected, clean) ...
  EXPECT_EQ(first_bad_page(mem, kPages, 0), kPages);
  const PagerStats s0 = p.stats();
  // ... then it is written (a new version) and pushed out by two more
  // read passes over the rest.
  for (size_t pg = kPages - kTail; pg < kPages; ++pg) fill_page(mem + pg * kPage, pg, 1);
  EXPECT_EQ(first_bad_page(mem, kPages - kTail, 0), kPages - kTail);
  EXPECT_EQ(first_bad_page(mem, kPages - kTail, 0), kPages - kTail);
  const PagerStats s = p.stats();
  EXPECT_GT(s.evictions_dirty - s0.evictions_dirty, 0u) << s.to_string();
  EXPECT_EQ(first_bad_page(mem, kPages, 1, kPages - kTail), kPages);
  EXPECT_EQ(first_bad_page(mem, kPages - kTail, 0), kPages - kTail);
}

}  // namespace
}  // namespace farmem::testing
