// Zero-fill chunks (config.zero_chunk, FARMEM_ZERO_CHUNK; pager.h
// "Zero-fill chunks"): a zero fault that continues no first-touch stream
// also maps the never-filled blocks of the aligned chunk around it. Exact
// counts: one zero fault per chunk for scattered first touches, blocks read
// as zeros, written bytes survive eviction, blocks mapped and never written
// cost no I/O, the fill stops at the high watermark, memory freed
// (discarded) inside a chunk is not mapped again, and chunk 0 gives the old
// one-fault-per-block counts.
//
//   ctest -R PagerZeroChunk
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "tests/pager/pager_harness.h"

namespace farmem::testing {
namespace {

constexpr size_t kChunk = 32;

PagerConfig chunk_config(size_t budget_pages, size_t region_pages, uint32_t chunk) {
  PagerConfig c = small_config(budget_pages, region_pages);
  c.prefetch = false;  // every READ a donor sees is a demand fault
  c.zero_chunk = chunk;
  return c;
}

// A scattered first-touch order over chunks [0, chunks): the chunks in a
// shuffled order, each first touched at an offset in [2, 29] (so that no
// first touch is next to another one, which would continue its stream),
// then every other page of the region in a shuffled order.
struct Scatter {
  std::vector<size_t> first;  // one page per chunk
  std::vector<size_t> rest;
};

Scatter scatter(size_t chunks, uint32_t seed) {
  std::mt19937 rng(seed);
  Scatter s;
  std::vector<size_t> order(chunks);
  for (size_t i = 0; i < chunks; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t c : order) s.first.push_back(c * kChunk + 2 + rng() % (kChunk - 4));
  for (size_t pg = 0; pg < chunks * kChunk; ++pg) {
    if (std::find(s.first.begin(), s.first.end(), pg) == s.first.end()) s.rest.push_back(pg);
  }
  std::shuffle(s.rest.begin(), s.rest.end(), rng);
  return s;
}

// Waits until the handler has left Fetching on every page of [0, pages)
// (the copy that woke the faulting thread comes just before).
bool settled(P& p, const uint8_t* mem, size_t pages) {
  return wait_until(
      [&] {
        for (size_t pg = 0; pg < pages; ++pg)
          if (p.state_of(mem + pg * kPage) == PageState::kFetching) return false;
        return true;
      },
      30000);
}

// Scattered first writes: one zero fault per chunk, the other 31 blocks of
// each mapped writable with it (no WP fault when written), and every byte
// back after eviction.
TEST(PagerZeroChunk, ScatteredWritesTakeOneFaultPerChunk) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kChunks = 48;
  LoopbackRig rig;
  P& p = rig.start(chunk_config(4096, 8192, kChunk));  // nothing evicted
  auto* mem = static_cast<uint8_t*>(p.base());
  const Scatter s = scatter(kChunks, 7);
  for (size_t pg : s.first) fill_page(mem + pg * kPage, pg, 0);
  PagerStats st = p.stats();
  EXPECT_EQ(st.faults_zero, kChunks) << st.to_string();
  EXPECT_EQ(st.zero_around, kChunks * (kChunk - 1)) << st.to_string();
  for (size_t pg : s.rest) fill_page(mem + pg * kPage, pg, 0);
  st = p.stats();
  EXPECT_EQ(st.faults_zero, kChunks) << st.to_string();
  EXPECT_EQ(st.faults_wp, 0u) << st.to_string();
  EXPECT_EQ(st.reads + st.writes, 0u) << st.to_string();
  ASSERT_TRUE(settled(p, mem, kChunks * kChunk));
  EXPECT_EQ(p.resident_bytes(), kChunks * kChunk * kPage);
  // The next chunk was not touched.
  EXPECT_EQ(p.state_of(mem + kChunks * kChunk * kPage), PageState::kEmpty);
  EXPECT_EQ(first_bad_page(mem, kChunks * kChunk, 0), kChunks * kChunk);
  ASSERT_TRUE(p.evict(mem, kChunks * kChunk * kPage).ok());
  EXPECT_EQ(rig.donor.writes(), kChunks * kChunk);
  EXPECT_EQ(first_bad_page(mem, kChunks * kChunk, 0), kChunks * kChunk);
}

// Scattered first reads: one zero fault per chunk, every block reads as
// zeros, all mapped clean (a write is then a WP fault) and dropped without
// I/O.
TEST(PagerZeroChunk, ScatteredReadsReadZerosWithoutIo) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kChunks = 40;
  LoopbackRig rig;
  P& p = rig.start(chunk_config(4096, 8192, kChunk));
  auto* mem = static_cast<volatile uint8_t*>(p.base());
  const Scatter s = scatter(kChunks, 11);
  uint64_t sum = 0;
  for (size_t pg : s.first) sum += mem[pg * kPage + 8];
  for (size_t pg : s.rest)
    for (size_t i = 0; i < kPage; i += 512) sum += mem[pg * kPage + i];
  EXPECT_EQ(sum, 0u);
  PagerStats st = p.stats();
  EXPECT_EQ(st.faults_zero, kChunks) << st.to_string();
  EXPECT_EQ(st.zero_around, kChunks * (kChunk - 1)) << st.to_string();
  EXPECT_EQ(st.faults_wp, 0u) << st.to_string();
  const size_t w = s.rest[5];
  mem[w * kPage] = 0x77;
  st = p.stats();
  EXPECT_EQ(st.faults_wp, 1u) << st.to_string();
  ASSERT_TRUE(settled(p, const_cast<uint8_t*>(mem), kChunks * kChunk));
  ASSERT_TRUE(p.evict(const_cast<uint8_t*>(mem), kChunks * kChunk * kPage).ok());
  EXPECT_EQ(rig.donor.writes(), 1u);  // the one block written
  EXPECT_EQ(mem[w * kPage], 0x77u);
  st = p.stats();
  EXPECT_EQ(st.reads, 1u) << st.to_string();
  EXPECT_EQ(st.zero_cleaned, 0u) << st.to_string();
}

// A write fault maps the chunk writable and dirty; the blocks never written
// are found all-zero at eviction and cost no WRITE.
TEST(PagerZeroChunk, UnwrittenChunkBlocksCostNoIo) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kChunks = 20;
  LoopbackRig rig;
  P& p = rig.start(chunk_config(4096, 8192, kChunk));
  auto* mem = static_cast<uint8_t*>(p.base());
  const Scatter s = scatter(kChunks, 3);
  for (size_t pg : s.first) fill_page(mem + pg * kPage, pg, 0);
  PagerStats st = p.stats();
  EXPECT_EQ(st.faults_zero, kChunks) << st.to_string();
  ASSERT_TRUE(settled(p, mem, kChunks * kChunk));
  ASSERT_TRUE(p.evict(mem, kChunks * kChunk * kPage).ok());
  EXPECT_EQ(rig.donor.writes(), kChunks);
  st = p.stats();
  EXPECT_EQ(st.zero_cleaned, kChunks * (kChunk - 1)) << st.to_string();
  for (size_t pg : s.first) {
    uint8_t expect[kPage];
    fill_page(expect, pg, 0);
    ASSERT_EQ(memcmp(mem + pg * kPage, expect, kPage), 0) << "page " << pg;
  }
  // The dropped blocks are Empty again and read as zeros, without a READ.
  const uint64_t reads = rig.donor.reads();
  for (size_t pg : s.rest) ASSERT_EQ(mem[pg * kPage + 100], 0u) << "page " << pg;
  EXPECT_EQ(rig.donor.reads(), reads);
}

// Pushed out by budget pressure with UFFDIO_MOVE (the default where the
// kernel has it): a dirty block with no dirty neighbour moves into its
// victim slot instead of being copied there, and one that holds only zeros
// and has no remote copy still leaves with no WRITE (a missed check here
// once wrote back every never-written block of a zero-fill run, and a
// WRITE held by the donor then kept the budget full). Scattered pages
// written with zeros (one block per fault: no chunk, no fault-around),
// then three budgets of written pages after them.
TEST(PagerZeroChunk, ZeroBlocksLeavingByMoveCostNoIo) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 256, kZero = 60, kStream = 3 * kBudget;
  LoopbackRig rig;
  PagerConfig c = chunk_config(kBudget, 8192, 0);
  c.zero_fault_around = 0;
  c.uffd_move = UffdMoveMode::kAuto;
  P& p = rig.start(c);
  if (!p.uses_move()) GTEST_SKIP() << "no UFFDIO_MOVE on this kernel";
  auto* mem = static_cast<uint8_t*>(p.base());
  for (size_t k = 0; k < kZero; ++k) memset(mem + 3 * k * kPage, 0, kPage);
  ASSERT_EQ(p.stats().faults_zero, kZero);
  const size_t first_stream = 3 * kZero + 8;
  for (size_t k = 0; k < kStream; ++k) fill_page(mem + (first_stream + k) * kPage, k, 1);
  const PagerStats st = p.stats();
  EXPECT_GE(st.moves_out, kZero / 2) << st.to_string();
  EXPECT_GE(st.zero_cleaned, kZero) << st.to_string();
  // WRITEs: stream pages only, never an all-zero block.
  EXPECT_LE(rig.donor.writes(), kStream) << st.to_string();
  const uint64_t reads = rig.donor.reads();
  for (size_t k = 0; k < kZero; ++k) {
    for (size_t i = 0; i < kPage; i += 512)
      ASSERT_EQ(mem[3 * k * kPage + i], 0u) << "page " << 3 * k;
  }
  EXPECT_EQ(rig.donor.reads(), reads) << "a zero block was written back and read";
  for (size_t k = 0; k < kStream; ++k) {
    uint8_t expect[kPage];
    fill_page(expect, k, 1);
    ASSERT_EQ(memcmp(mem + (first_stream + k) * kPage, expect, kPage), 0) << "stream " << k;
  }
}

// The fill only takes the headroom below the high watermark: with a budget
// of 256 blocks (high 248), eight first touches fill exactly to high (the
// last chunk gets 23 blocks), and scattered first writes over four times
// the budget stay within it and come back byte-exact.
TEST(PagerZeroChunk, FillStopsAtHighWatermark) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 256, kChunks = 4 * kBudget / kChunk;
  LoopbackRig rig;
  PagerConfig c = chunk_config(kBudget, 8192, kChunk);
  P& p = rig.start(c);
  const size_t high = static_cast<size_t>(c.high_watermark * kBudget);
  ASSERT_EQ(high, 248u);
  auto* mem = static_cast<uint8_t*>(p.base());
  const Scatter s = scatter(kChunks, 5);
  for (size_t i = 0; i < 8; ++i) fill_page(mem + s.first[i] * kPage, s.first[i], 0);
  PagerStats st = p.stats();
  EXPECT_EQ(st.faults_zero, 8u) << st.to_string();
  EXPECT_EQ(st.zero_around, 7 * (kChunk - 1) + (high - 7 * kChunk - 1)) << st.to_string();
  EXPECT_EQ(st.resident_peak_bytes, high * kPage) << st.to_string();
  EXPECT_EQ(st.evictions_clean + st.evictions_dirty, 0u) << st.to_string();
  for (size_t i = 8; i < s.first.size(); ++i) fill_page(mem + s.first[i] * kPage, s.first[i], 0);
  for (size_t pg : s.rest) fill_page(mem + pg * kPage, pg, 0);
  EXPECT_EQ(first_bad_page(mem, kChunks * kChunk, 0), kChunks * kChunk);
  st = p.stats();
  EXPECT_LE(st.resident_peak_bytes, st.budget_bytes + P::kSlackBytes) << st.to_string();
  EXPECT_GT(st.evictions_dirty, 0u) << st.to_string();
  ASSERT_TRUE(p.evict(mem, kChunks * kChunk * kPage).ok());
  EXPECT_EQ(first_bad_page(mem, kChunks * kChunk, 0), kChunks * kChunk);
}

// Discarded (freed) blocks inside a chunk are not mapped again by a chunk
// fill: only blocks no zero fill ever mapped are. Blocks filled at
// allocation time (populate_zero) count as mapped too.
TEST(PagerZeroChunk, DiscardedBlocksAreNotMappedAgain) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  P& p = rig.start(chunk_config(4096, 8192, kChunk));
  auto* mem = static_cast<uint8_t*>(p.base());
  // Chunk 1 (blocks 32..63): one fault maps all of it; then 32..47 freed.
  fill_page(mem + 40 * kPage, 40, 0);
  ASSERT_TRUE(settled(p, mem, 64));
  for (size_t pg = 32; pg < 64; ++pg)
    ASSERT_EQ(p.state_of(mem + pg * kPage), PageState::kPresent) << pg;
  ASSERT_TRUE(p.discard(mem + 32 * kPage, 16 * kPage).ok());
  for (size_t pg = 32; pg < 48; ++pg)
    ASSERT_EQ(p.state_of(mem + pg * kPage), PageState::kEmpty) << pg;
  // A first touch at 44 again (not next to 40, no stream) maps 44 alone.
  fill_page(mem + 44 * kPage, 44, 1);
  ASSERT_TRUE(settled(p, mem, 64));
  PagerStats st = p.stats();
  EXPECT_EQ(st.faults_zero, 2u) << st.to_string();
  EXPECT_EQ(st.zero_around, kChunk - 1) << st.to_string();
  for (size_t pg = 32; pg < 48; ++pg) {
    EXPECT_EQ(p.state_of(mem + pg * kPage), pg == 44 ? PageState::kPresent : PageState::kEmpty)
        << pg;
  }
  // Chunk 2 (64..95): 64..71 filled at allocation time, then freed; a first
  // touch at 80 maps the 23 others never filled, not 64..71.
  ASSERT_EQ(p.populate_zero(mem + 64 * kPage, 8 * kPage), 8u);
  ASSERT_TRUE(p.discard(mem + 64 * kPage, 8 * kPage).ok());
  fill_page(mem + 80 * kPage, 80, 0);
  ASSERT_TRUE(settled(p, mem, 96));
  st = p.stats();
  EXPECT_EQ(st.faults_zero, 3u) << st.to_string();
  EXPECT_EQ(st.zero_around, kChunk - 1 + 23) << st.to_string();
  for (size_t pg = 64; pg < 96; ++pg) {
    EXPECT_EQ(p.state_of(mem + pg * kPage), pg < 72 ? PageState::kEmpty : PageState::kPresent)
        << pg;
  }
  EXPECT_EQ(p.resident_bytes(), (16 + 1 + 24) * kPage);
  // Bytes: the writes survive eviction; the freed blocks read zeros.
  ASSERT_TRUE(p.evict(mem, 96 * kPage).ok());
  uint8_t expect[kPage];
  fill_page(expect, 44, 1);
  EXPECT_EQ(memcmp(mem + 44 * kPage, expect, kPage), 0);
  fill_page(expect, 80, 0);
  EXPECT_EQ(memcmp(mem + 80 * kPage, expect, kPage), 0);
  for (size_t pg = 32; pg < 96; ++pg) {
    if (pg == 40 || pg == 44 || pg == 80) continue;
    ASSERT_EQ(mem[pg * kPage + 7], 0u) << pg;
  }
}

// Chunk 0 gives the old counts: first touches two blocks apart, shuffled
// (none continues a stream), take one fault each, and fault-around maps
// nothing; the same touches with chunks take one fault per chunk.
TEST(PagerZeroChunk, ChunkZeroIsOneFaultPerBlock) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kPages = 1024;
  std::vector<size_t> order;
  for (size_t pg = 0; pg < kPages; pg += 2) order.push_back(pg);
  std::mt19937 rng(9);
  std::shuffle(order.begin(), order.end(), rng);
  for (uint32_t chunk : {0u, 32u}) {
    LoopbackRig rig;
    P& p = rig.start(chunk_config(4096, 8192, chunk));
    auto* mem = static_cast<uint8_t*>(p.base());
    for (size_t pg : order) fill_page(mem + pg * kPage, pg, 0);
    const PagerStats st = p.stats();
    EXPECT_EQ(st.faults_zero, chunk == 0 ? order.size() : kPages / kChunk)
        << "chunk " << chunk << " " << st.to_string();
    EXPECT_EQ(st.zero_around, chunk == 0 ? 0u : kPages - kPages / kChunk)
        << "chunk " << chunk << " " << st.to_string();
    for (size_t pg : order) {
      uint8_t expect[kPage];
      fill_page(expect, pg, 0);
      ASSERT_EQ(memcmp(mem + pg * kPage, expect, kPage), 0) << "page " << pg;
    }
  }
}

// FARMEM_ZERO_CHUNK: parsed, and a value that is not 0 or a power of two
// from 2 to 64 is an error naming what is allowed.
TEST(PagerZeroChunk, ConfigValidation) {
  PagerConfig c;
  for (uint32_t ok : {0u, 2u, 16u, 32u, 64u}) {
    c.zero_chunk = ok;
    EXPECT_TRUE(c.validate().ok()) << ok;
  }
  for (uint32_t bad : {1u, 3u, 48u, 128u}) {
    c.zero_chunk = bad;
    const Status st = c.validate();
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.to_string().find("power of two"), std::string::npos) << st.to_string();
  }
}

}  // namespace
}  // namespace farmem::testing
