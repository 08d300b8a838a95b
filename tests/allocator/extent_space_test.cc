// Extent hooks: alloc, dalloc, destroy, commit, decommit, purge, split and
// merge, called through the extent_hooks_t table exactly as jemalloc calls
// them, over a fake backing that records what the pager would be told.
#include "allocator/extent_space.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <vector>

namespace farmem {
namespace {

constexpr size_t kPage = 4096;

// Plain anonymous memory standing in for a pager region; discard() is
// MADV_DONTNEED (reads zeros afterwards), as the pager's is.
class FakeBacking final : public FarBacking {
 public:
  FakeBacking(size_t size, uint32_t block) : size_(size), block_(block) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) abort();
    base_ = static_cast<char*>(p);
  }
  ~FakeBacking() override { munmap(base_, size_); }
  void* base() const override { return base_; }
  size_t size() const override { return size_; }
  uint32_t block_size() const override { return block_; }
  Status discard(void* addr, size_t len) override {
    discards.push_back({static_cast<char*>(addr) - base_, len});
    if ((static_cast<char*>(addr) - base_) % block_ != 0 || len % block_ != 0) {
      return make_error(Errc::kInvalidArgument, "unaligned discard");
    }
    madvise(addr, len, MADV_DONTNEED);
    return ok_status();
  }
  PagerStats stats() const override { return {}; }
  const char* transport_name() const override { return "fake"; }

  struct Call {
    ptrdiff_t offset;
    size_t len;
    bool operator==(const Call&) const = default;
  };
  std::vector<Call> discards;
  char* base_;

 private:
  size_t size_;
  uint32_t block_;
};

class ExtentHooksTest : public ::testing::Test {
 protected:
  explicit ExtentHooksTest(uint32_t block = kPage, size_t cap = 64)
      : backing_(64 << 20, block), space_(&backing_, cap), h_(space_.hooks()) {}

  void* alloc(size_t size, size_t align = kPage, void* at = nullptr) {
    bool zero = false, commit = false;
    void* p = h_->alloc(h_, at, size, align, &zero, &commit, 7);
    if (p) {
      EXPECT_TRUE(zero) << "extents handed out must be known-zero";
      EXPECT_TRUE(commit);
    }
    return p;
  }
  ptrdiff_t off(void* p) const { return static_cast<char*>(p) - backing_.base_; }

  FakeBacking backing_;
  ExtentSpace space_;
  extent_hooks_t* h_;
};

TEST_F(ExtentHooksTest, AllocBumpsContiguouslyAndAligned) {
  void* a = alloc(2 * kPage);
  void* b = alloc(3 * kPage);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(off(a), 0);
  EXPECT_EQ(off(b), static_cast<ptrdiff_t>(2 * kPage));
  void* c = alloc(kPage, 1 << 20);
  EXPECT_EQ(off(c), 1 << 20);
  // The alignment gap went to the free list and serves the next fit.
  EXPECT_EQ(space_.stats().free_bytes, (1u << 20) - 5 * kPage);
  void* d = alloc(kPage);
  EXPECT_EQ(off(d), static_cast<ptrdiff_t>(5 * kPage));
  EXPECT_EQ(space_.stats().allocs, 4u);
  EXPECT_TRUE(backing_.discards.empty()) << "allocation never drops pages";
}

TEST_F(ExtentHooksTest, AllocRejectsBadSizesAndExhaustion) {
  EXPECT_EQ(alloc(100), nullptr) << "not a page multiple";
  EXPECT_EQ(alloc(kPage, 3 * kPage), nullptr) << "alignment not a power of two";
  EXPECT_EQ(alloc(128 << 20), nullptr) << "larger than the region";
  ASSERT_NE(alloc(64 << 20), nullptr);
  EXPECT_EQ(alloc(kPage), nullptr) << "region exhausted";
}

TEST_F(ExtentHooksTest, DallocDropsPagesAndReusesTheRange) {
  char* a = static_cast<char*>(alloc(4 * kPage));
  char* b = static_cast<char*>(alloc(4 * kPage));  // keeps a off the bump edge
  ASSERT_NE(b, nullptr);
  memset(a, 0xab, 4 * kPage);
  EXPECT_FALSE(h_->dalloc(h_, a, 4 * kPage, true, 7)) << "dalloc accepted";
  EXPECT_EQ(backing_.discards, (std::vector<FakeBacking::Call>{{0, 4 * kPage}}));
  for (size_t i = 0; i < 4 * kPage; ++i) ASSERT_EQ(a[i], 0) << "byte " << i;
  EXPECT_EQ(space_.stats().free_bytes, 4 * kPage);
  // Reused first fit, and reported zeroed.
  EXPECT_EQ(alloc(2 * kPage), a);
  EXPECT_EQ(alloc(2 * kPage), a + 2 * kPage);
  EXPECT_EQ(space_.stats().free_bytes, 0u);
  EXPECT_EQ(space_.stats().dallocs, 1u);
}

TEST_F(ExtentHooksTest, DallocOfUncommittedRangeDoesNotDropAgain) {
  void* a = alloc(kPage);
  ASSERT_NE(alloc(kPage), nullptr);
  EXPECT_FALSE(h_->dalloc(h_, a, kPage, /*committed=*/false, 7));
  EXPECT_TRUE(backing_.discards.empty());
}

TEST_F(ExtentHooksTest, DallocAtTheBumpEdgeLowersIt) {
  void* a = alloc(kPage);
  void* b = alloc(2 * kPage);
  EXPECT_FALSE(h_->dalloc(h_, a, kPage, true, 7));
  EXPECT_EQ(space_.stats().free_ranges, 1u);
  EXPECT_FALSE(h_->dalloc(h_, b, 2 * kPage, true, 7));
  ExtentSpace::Stats s = space_.stats();
  EXPECT_EQ(s.free_ranges, 0u) << "both ranges folded back into the bump space";
  EXPECT_EQ(s.bump_bytes, 0u);
  EXPECT_EQ(alloc(kPage), a);
}

TEST_F(ExtentHooksTest, FreeRangesCoalesce) {
  char* a = static_cast<char*>(alloc(kPage));
  char* b = static_cast<char*>(alloc(kPage));
  char* c = static_cast<char*>(alloc(kPage));
  ASSERT_NE(alloc(kPage), nullptr);  // guard: keeps c off the bump edge
  EXPECT_FALSE(h_->dalloc(h_, a, kPage, true, 7));
  EXPECT_FALSE(h_->dalloc(h_, c, kPage, true, 7));
  EXPECT_EQ(space_.stats().free_ranges, 2u);
  EXPECT_FALSE(h_->dalloc(h_, b, kPage, true, 7));
  EXPECT_EQ(space_.stats().free_ranges, 1u);
  EXPECT_EQ(space_.stats().free_bytes, 3 * kPage);
  EXPECT_EQ(alloc(3 * kPage), a) << "one range again";
}

TEST_F(ExtentHooksTest, NewAddrIsHonouredOrRefused) {
  char* a = static_cast<char*>(alloc(kPage));
  // Exactly at the bump pointer: granted.
  EXPECT_EQ(alloc(kPage, kPage, a + kPage), a + kPage);
  // An address in use: refused.
  EXPECT_EQ(alloc(kPage, kPage, a), nullptr);
  // Inside a free range: carved out of it.
  ASSERT_NE(alloc(kPage), nullptr);
  EXPECT_FALSE(h_->dalloc(h_, a, 2 * kPage, true, 7));
  EXPECT_EQ(alloc(kPage, kPage, a + kPage), a + kPage);
  EXPECT_EQ(space_.stats().free_bytes, kPage);
  // Outside the region: refused.
  EXPECT_EQ(alloc(kPage, kPage, backing_.base_ + (64 << 20)), nullptr);
}

TEST_F(ExtentHooksTest, CommitSucceedsDecommitAndPurgeDrop) {
  char* a = static_cast<char*>(alloc(8 * kPage));
  memset(a, 0x5a, 8 * kPage);
  EXPECT_FALSE(h_->commit(h_, a, 8 * kPage, 0, 8 * kPage, 7));
  EXPECT_TRUE(backing_.discards.empty()) << "commit has nothing to do";

  EXPECT_FALSE(h_->decommit(h_, a, 8 * kPage, kPage, 2 * kPage, 7));
  EXPECT_FALSE(h_->purge_forced(h_, a, 8 * kPage, 4 * kPage, kPage, 7));
  EXPECT_FALSE(h_->purge_lazy(h_, a, 8 * kPage, 6 * kPage, kPage, 7));
  EXPECT_EQ(backing_.discards,
            (std::vector<FakeBacking::Call>{{static_cast<ptrdiff_t>(kPage), 2 * kPage},
                                            {static_cast<ptrdiff_t>(4 * kPage), kPage},
                                            {static_cast<ptrdiff_t>(6 * kPage), kPage}}));
  // Dropped pages read zeros (invariant 2), the others kept their bytes.
  const char expect[8] = {0x5a, 0, 0, 0x5a, 0, 0x5a, 0, 0x5a};
  for (int pg = 0; pg < 8; ++pg) {
    for (size_t i = 0; i < kPage; i += 512) {
      ASSERT_EQ(a[pg * kPage + i], expect[pg]) << "page " << pg;
    }
  }
  ExtentSpace::Stats s = space_.stats();
  EXPECT_EQ(s.commits, 1u);
  EXPECT_EQ(s.decommits, 1u);
  EXPECT_EQ(s.purges, 2u);
  // A range past the extent is refused, and nothing is dropped.
  EXPECT_TRUE(h_->decommit(h_, a, 8 * kPage, 7 * kPage, 2 * kPage, 7));
  EXPECT_TRUE(h_->purge_forced(h_, a, 8 * kPage, 9 * kPage, kPage, 7));
  EXPECT_EQ(backing_.discards.size(), 3u);
}

TEST_F(ExtentHooksTest, SplitAndMerge) {
  char* a = static_cast<char*>(alloc(4 * kPage));
  char* b = static_cast<char*>(alloc(2 * kPage));
  EXPECT_FALSE(h_->split(h_, a, 4 * kPage, kPage, 3 * kPage, true, 7));
  EXPECT_TRUE(h_->split(h_, a, 4 * kPage, kPage, kPage, true, 7)) << "sizes do not add up";
  EXPECT_FALSE(h_->merge(h_, a, 4 * kPage, b, 2 * kPage, true, 7));
  EXPECT_TRUE(h_->merge(h_, a, 2 * kPage, b, 2 * kPage, true, 7)) << "not adjacent";
  char outside[kPage];
  EXPECT_TRUE(h_->merge(h_, outside, kPage, outside + kPage, kPage, true, 7)) << "not ours";
  EXPECT_TRUE(h_->split(h_, outside, 2 * kPage, kPage, kPage, true, 7)) << "not ours";
  ExtentSpace::Stats s = space_.stats();
  EXPECT_EQ(s.splits, 1u);
  EXPECT_EQ(s.merges, 1u);
}

class SmallFreeListTest : public ExtentHooksTest {
 protected:
  SmallFreeListTest() : ExtentHooksTest(kPage, 2) {}
};

TEST_F(SmallFreeListTest, FullFreeListRefusesDallocAndDestroyLeaks) {
  std::vector<char*> p;
  for (int i = 0; i < 8; ++i) p.push_back(static_cast<char*>(alloc(kPage)));
  EXPECT_FALSE(h_->dalloc(h_, p[0], kPage, true, 7));
  EXPECT_FALSE(h_->dalloc(h_, p[2], kPage, true, 7));
  // Not adjacent to either: needs a third entry.
  EXPECT_TRUE(h_->dalloc(h_, p[4], kPage, true, 7)) << "refused: jemalloc retains it";
  EXPECT_EQ(space_.stats().dalloc_refused, 1u);
  h_->destroy(h_, p[6], kPage, true, 7);
  EXPECT_EQ(space_.stats().leaked_bytes, kPage);
  // Adjacent to a free range: still accepted (coalesces, no new entry).
  EXPECT_FALSE(h_->dalloc(h_, p[1], kPage, true, 7));
}

class BigBlockTest : public ExtentHooksTest {
 protected:
  BigBlockTest() : ExtentHooksTest(16 * 1024, 64) {}
};

TEST_F(BigBlockTest, PartialBlocksAreZeroedNotDiscarded) {
  constexpr size_t kBlock = 16 * 1024;
  char* a = static_cast<char*>(alloc(4 * kBlock));
  memset(a, 0x77, 4 * kBlock);
  // [1 page, 1 page + 2 blocks): a partial edge on each side, one whole block.
  EXPECT_FALSE(h_->purge_forced(h_, a, 4 * kBlock, kPage, 2 * kBlock, 7));
  EXPECT_EQ(backing_.discards,
            (std::vector<FakeBacking::Call>{{static_cast<ptrdiff_t>(kBlock), kBlock}}));
  for (size_t i = 0; i < 4 * kBlock; ++i) {
    const bool dropped = i >= kPage && i < kPage + 2 * kBlock;
    ASSERT_EQ(a[i], dropped ? 0 : 0x77) << "byte " << i;
  }
  // Less than a block: memset only.
  EXPECT_FALSE(h_->decommit(h_, a, 4 * kBlock, 3 * kBlock, kPage, 7));
  EXPECT_EQ(backing_.discards.size(), 1u);
  EXPECT_EQ(a[3 * kBlock], 0);
  EXPECT_EQ(a[3 * kBlock + kPage], 0x77);
}

}  // namespace
}  // namespace farmem
