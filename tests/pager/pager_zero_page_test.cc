// Reads of never-written memory map the kernel's shared zero page
// (config.zero_page, FARMEM_ZERO_PAGE; pager/zero_fill.h "Reads of
// never-written memory"): they hold no memory and no budget, as for a plain
// program; the first write gives the block a page (a WP fault) and counts
// it; discard, evict(), pin() and eviction treat such blocks right; data
// stays byte-exact under threads that read and write fresh pages at once.
//
//   ctest -R PagerZeroPage
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/pager/integrity_workload.h"
#include "tests/pager/pager_harness.h"

namespace farmem::testing {
namespace {

PagerConfig config(size_t budget_pages, size_t region_pages) {
  PagerConfig c = zero_page_config(budget_pages, region_pages);
  c.prefetch = false;  // every READ a donor sees is a demand fault
  return c;
}

uint64_t sum_pages(const uint8_t* mem, size_t first, size_t pages) {
  uint64_t sum = 0;
  for (size_t pg = first; pg < first + pages; ++pg) {
    for (size_t i = 0; i < kPage; i += 512) {
      sum += static_cast<const volatile uint8_t*>(mem)[pg * kPage + i];
    }
  }
  return sum;
}

TEST(PagerZeroPage, ReadsOfNeverWrittenMemoryHoldNoMemory) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  const size_t budget = 64, region = 4096;  // reads of 64 times the budget
  P& p = rig.start(config(budget, region));
  auto* mem = static_cast<uint8_t*>(p.base());
  ASSERT_EQ(sum_pages(mem, 0, region), 0u);
  ASSERT_EQ(sum_pages(mem, 0, region), 0u);  // still mapped: no second fault
  const PagerStats s = p.stats();
  EXPECT_EQ(s.zero_mapped, region) << s.to_string();
  EXPECT_LT(s.faults_zero, region / 4) << "fault-around maps runs of zero pages" << s.to_string();
  EXPECT_EQ(s.demotions, 0u) << "nothing held memory, so nothing was pushed out" << s.to_string();
  EXPECT_EQ(p.resident_bytes(), 0u);
  EXPECT_EQ(s.resident_peak_bytes, 0u) << s.to_string();
  EXPECT_EQ(rig.donor.reads() + rig.donor.writes(), 0u);
  for (size_t pg = 0; pg < region; pg += 97) {
    ASSERT_EQ(p.state_of(mem + pg * kPage), PageState::kPresent) << pg;
  }
  EXPECT_LE(mapped_pages(mem, region * kPage), 8u) << "the kernel's view: zero pages only";
}

TEST(PagerZeroPage, FirstWriteGivesAPageCountedAndKeptAcrossEviction) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  const size_t budget = 64, region = 2048;
  P& p = rig.start(config(budget, region));
  auto* mem = static_cast<uint8_t*>(p.base());
  const size_t n = 16;
  ASSERT_EQ(sum_pages(mem, 0, n), 0u);  // zero-mapped
  const uint64_t wp0 = p.stats().faults_wp;
  uint8_t expect[kPage];
  for (size_t pg = 0; pg < n; ++pg) {
    fill_page(expect, pg, 1);
    memcpy(mem + pg * kPage, expect, kPage);
  }
  PagerStats s = p.stats();
  EXPECT_EQ(s.zero_mapped_written, n) << s.to_string();
  EXPECT_EQ(s.faults_wp - wp0, n) << "one WP fault per written zero page" << s.to_string();
  EXPECT_EQ(p.resident_bytes(), n * kPage);
  EXPECT_GE(mapped_pages(mem, n * kPage), n);
  EXPECT_EQ(first_bad_page(mem, n, 1), n) << "the writes landed";
  // Push them out with writes elsewhere: they go to the donor and come back.
  for (size_t pg = 100; pg < 100 + 8 * budget; ++pg) mem[pg * kPage] = 1;
  ASSERT_TRUE(wait_until([&] { return p.state_of(mem) == PageState::kRemote; }));
  EXPECT_GE(rig.donor.writes(), 1u);
  EXPECT_EQ(first_bad_page(mem, n, 1), n) << "byte-exact after eviction";
  EXPECT_LE(p.stats().resident_peak_bytes, budget * kPage + P::kSlackBytes);
}

TEST(PagerZeroPage, DiscardEvictAndPinOfZeroMappedBlocks) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  const size_t budget = 64, region = 1024;
  P& p = rig.start(config(budget, region));
  auto* mem = static_cast<uint8_t*>(p.base());
  ASSERT_EQ(sum_pages(mem, 0, 96), 0u);
  ASSERT_EQ(p.state_of(mem), PageState::kPresent);
  // discard: back to Empty, no budget given back (none was taken).
  ASSERT_TRUE(p.discard(mem, 32 * kPage).ok());
  EXPECT_EQ(p.state_of(mem), PageState::kEmpty);
  EXPECT_EQ(p.resident_bytes(), 0u);
  // evict(): a zero-mapped block leaves as never written (Empty), no I/O.
  ASSERT_TRUE(p.evict(mem + 32 * kPage, 32 * kPage).ok());
  EXPECT_EQ(p.state_of(mem + 40 * kPage), PageState::kEmpty);
  EXPECT_EQ(p.resident_bytes(), 0u);
  EXPECT_EQ(rig.donor.reads() + rig.donor.writes(), 0u);
  // pin(): a pinned block holds a page of its own (counted), still zeros.
  ASSERT_TRUE(p.pin(mem + 64 * kPage, 4 * kPage).ok());
  EXPECT_EQ(p.resident_bytes(), 4 * kPage);
  EXPECT_GE(mapped_pages(mem + 64 * kPage, 4 * kPage), 4u);
  EXPECT_EQ(sum_pages(mem, 64, 4), 0u);
  mem[65 * kPage + 7] = 9;
  ASSERT_TRUE(p.unpin(mem + 64 * kPage, 4 * kPage).ok());
  EXPECT_EQ(mem[65 * kPage + 7], 9);
  // Everything reads zeros again where it was dropped.
  EXPECT_EQ(sum_pages(mem, 0, 64), 0u);
}

// Threads first-touch the same fresh pages at once, some reading and some
// writing, so that writes race with the zero page being mapped (a write
// between UFFDIO_ZEROPAGE and its write-protect gets a private page with no
// event). Every page's bytes end as the writer left them, and the budget
// holds, by the counter and by the kernel's view.
TEST(PagerZeroPage, ConcurrentFirstReadsAndWritesStayByteExact) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  const size_t budget = 128, region = 4096;
  P& p = rig.start(config(budget, region));
  auto* mem = static_cast<uint8_t*>(p.base());
  constexpr int kReaders = 3;
  std::atomic<bool> go{false};
  std::atomic<int> readers_ready{0};
  std::atomic<uint64_t> bad{0};
  std::vector<std::thread> ts;
  // One writer per page parity; readers walk the same pages just ahead.
  // Each reader first reads one page of its own at the end of the range
  // before the writers start, so that some first touches are surely reads
  // whatever the scheduling (under load the writers could otherwise be
  // ahead of every reader).
  for (int t = 0; t < 2; ++t) {
    ts.emplace_back([&, t] {
      while (!go.load() || readers_ready.load() < kReaders) {
      }
      for (size_t pg = static_cast<size_t>(t); pg < region; pg += 2) {
        uint64_t v = pg * 2654435761u + 1;
        memcpy(mem + pg * kPage + 8 * (pg % 500), &v, sizeof v);
      }
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    ts.emplace_back([&, r] {
      while (!go.load()) {
      }
      {
        const size_t own = region - 1 - static_cast<size_t>(r);
        uint64_t v = 0;
        memcpy(&v, mem + own * kPage + 8 * (own % 500), sizeof v);
        if (v != 0) bad.fetch_add(1);  // nobody writes before readers_ready
        readers_ready.fetch_add(1);
      }
      for (size_t pg = static_cast<size_t>(r); pg < region; pg += 1) {
        uint64_t v = 0;
        memcpy(&v, mem + pg * kPage + 8 * (pg % 500), sizeof v);
        if (v != 0 && v != pg * 2654435761u + 1) bad.fetch_add(1);
      }
    });
  }
  ResidentSampler sampler([&] { return p.resident_bytes(); }, mem, region * kPage);
  go = true;
  for (auto& t : ts) t.join();
  sampler.stop();
  EXPECT_EQ(bad.load(), 0u) << "a reader saw bytes nobody wrote";
  for (size_t pg = 0; pg < region; ++pg) {
    uint64_t v = 0;
    memcpy(&v, mem + pg * kPage + 8 * (pg % 500), sizeof v);
    ASSERT_EQ(v, pg * 2654435761u + 1) << "page " << pg << p.stats().to_string();
  }
  const PagerStats s = p.stats();
  EXPECT_GT(s.zero_mapped, 0u) << s.to_string();
  EXPECT_LE(sampler.max_counter(), budget * kPage + P::kSlackBytes) << s.to_string();
  EXPECT_LE(sampler.max_mapped(), budget * kPage + P::kSlackBytes) << s.to_string();
}

TEST(PagerZeroPage, OffMapsPrivateZeroBlocksInTheBudget) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  PagerConfig c = config(64, 1024);
  c.zero_page = false;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  ASSERT_EQ(sum_pages(mem, 0, 32), 0u);
  const PagerStats s = p.stats();
  EXPECT_EQ(s.zero_mapped, 0u) << s.to_string();
  EXPECT_GE(p.resident_bytes(), 32 * kPage);
}

}  // namespace
}  // namespace farmem::testing
