// Pager::pin / unpin: pinned blocks stay resident under eviction pressure,
// over-pinning is refused, unpin makes blocks evictable again, discard
// unpins.
#include "tests/pager/pager_harness.h"

namespace farmem::testing {
namespace {

TEST(PagerPin, PinnedPagesSurvivePressureWithoutReads) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  PagerConfig c = small_config(256, 4096);  // 1 MiB budget, 16 MiB region
  c.prefetch = false;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  constexpr size_t kPinned = 64;
  for (size_t i = 0; i < kPinned; ++i) fill_page(mem + i * kPage, i, 1);
  ASSERT_TRUE(p.evict(mem, kPinned * kPage).ok());
  EXPECT_EQ(p.state_of(mem), PageState::kRemote);
  uint64_t reads0 = p.stats().reads;
  ASSERT_TRUE(p.pin(mem, kPinned * kPage).ok());
  EXPECT_EQ(p.stats().reads - reads0, kPinned);  // fetched back by pin
  EXPECT_EQ(p.pinned_bytes(), kPinned * kPage);
  // 8x the budget through the rest of the region.
  for (size_t i = kPinned; i < 2048; ++i) mem[i * kPage] = static_cast<uint8_t>(i);
  PagerStats mid = p.stats();
  EXPECT_GT(mid.evictions_dirty, 0u);
  EXPECT_LE(mid.resident_bytes, mid.budget_bytes);
  EXPECT_EQ(mapped_pages(mem, kPinned * kPage), kPinned);
  uint8_t want[kPage];
  for (size_t i = 0; i < kPinned; ++i) {
    fill_page(want, i, 1);
    ASSERT_EQ(memcmp(mem + i * kPage, want, kPage), 0) << "page " << i;
  }
  EXPECT_EQ(p.stats().reads, mid.reads);  // zero READs on re-access
  EXPECT_TRUE(p.evict(mem, kPinned * kPage).ok());
  EXPECT_EQ(p.state_of(mem), PageState::kPresent);  // evict() skips pinned blocks

  // Unpinned, they are ordinary again.
  ASSERT_TRUE(p.unpin(mem, kPinned * kPage).ok());
  EXPECT_EQ(p.pinned_bytes(), 0u);
  ASSERT_TRUE(p.evict(mem, kPinned * kPage).ok());
  EXPECT_EQ(p.state_of(mem), PageState::kRemote);
  EXPECT_EQ(p.state_of(mem + (kPinned - 1) * kPage), PageState::kRemote);
  fill_page(want, 0, 1);
  EXPECT_EQ(memcmp(mem, want, kPage), 0);
}

TEST(PagerPin, OverPinningIsRefusedAndLeavesNothingPinned) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  PagerConfig c = small_config(256, 4096);
  P& p = rig.start(c);
  auto* mem = static_cast<char*>(p.base());
  const uint64_t limit = p.pin_limit_bytes();
  // low watermark 0.92 * 256 = 235 blocks, minus max(256/4, 16) = 64.
  EXPECT_EQ(limit, (235u - 64u) * kPage);
  Status st = p.pin(mem, limit + kPage);
  EXPECT_EQ(st.code(), Errc::kResourceExhausted);
  EXPECT_NE(st.message().find("leave the evictor no room"), std::string::npos) << st.to_string();
  EXPECT_EQ(p.pinned_bytes(), 0u);
  ASSERT_TRUE(p.pin(mem, limit).ok());
  EXPECT_EQ(p.pinned_bytes(), limit);
  EXPECT_EQ(p.pin(mem + limit, kPage).code(), Errc::kResourceExhausted);
  // Pinning an already pinned block costs nothing more (a count).
  EXPECT_TRUE(p.pin(mem, kPage).ok());
  EXPECT_EQ(p.pinned_bytes(), limit);
  ASSERT_TRUE(p.unpin(mem, kPage).ok());
  EXPECT_EQ(p.pinned_bytes(), limit);  // still pinned once
  ASSERT_TRUE(p.unpin(mem, limit).ok());
  EXPECT_EQ(p.pinned_bytes(), 0u);
  EXPECT_EQ(p.unpin(mem, kPage).code(), Errc::kInvalidArgument);
  EXPECT_EQ(p.pin(mem + 1, kPage).code(), Errc::kInvalidArgument);  // not block-aligned
}

TEST(PagerPin, DiscardUnpins) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  P& p = rig.start(small_config(256, 4096));
  auto* mem = static_cast<char*>(p.base());
  memset(mem, 0x5A, 8 * kPage);
  ASSERT_TRUE(p.pin(mem, 8 * kPage).ok());
  // 32 pages: the first fault's zero-fill chunk (config.zero_chunk, 32
  // blocks) mapped the aligned chunk around the memset.
  ASSERT_TRUE(p.discard(mem, 32 * kPage).ok());
  EXPECT_EQ(p.pinned_bytes(), 0u);
  EXPECT_EQ(p.state_of(mem), PageState::kEmpty);
  EXPECT_EQ(p.resident_bytes(), 0u);
  EXPECT_EQ(mem[100], 0);  // zeros again
  EXPECT_EQ(p.unpin(mem, kPage).code(), Errc::kInvalidArgument);
}

}  // namespace
}  // namespace farmem::testing
