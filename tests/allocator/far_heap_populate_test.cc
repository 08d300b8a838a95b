// Allocation-time zero fill (Pager::populate_zero, FarHeapOptions::
// populate_max): a fresh far allocation's never-written blocks are mapped
// when it is made, so that its first touches take no fault; within the
// budget's headroom only; blocks in any other state untouched; correct with
// eviction, concurrent faults and fork() snapshots (invariant 8).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "allocator/far_heap.h"
#include "tests/allocator/far_heap_rig.h"

namespace farmem::testing {
namespace {

// Pages of [p, p+len) mapped now (mincore), SIZE_MAX on error.
size_t resident_pages(const void* p, size_t len) {
  std::vector<unsigned char> v((len + kPage - 1) / kPage);
  if (mincore(const_cast<void*>(p), len, v.data()) != 0) return SIZE_MAX;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

bool all_zero(const uint8_t* p, size_t len) {
  for (size_t i = 0; i < len; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// A FarHeap with allocation-time zero fill on a loopback pager.
struct PopulateRig : FarHeapRig {
  PopulateRig(size_t budget_pages, size_t region_pages, size_t populate_max)
      : FarHeapRig(small_config(budget_pages, region_pages), options(populate_max)) {}
  static FarHeapOptions options(size_t populate_max) {
    FarHeapOptions o;
    o.dirty_decay_ms = -1;  // nothing purged behind the test's back
    o.populate_max = populate_max;
    return o;
  }
  uint64_t populated() const { return heap->stats().populated_blocks; }
};

TEST(FarHeapPopulate, FreshAllocationIsResidentAndTakesNoFault) {
  FARMEM_SKIP_WITHOUT_UFFD();
  PopulateRig r(16384, 65536, 256 << 10);
  constexpr size_t kSmall = 96 << 10;  // 24 blocks, all under populate_max
  auto* p = static_cast<uint8_t*>(r.heap->alloc(kSmall));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(resident_pages(p, kSmall), kSmall / kPage);
  EXPECT_EQ(r.populated(), kSmall / kPage);
  EXPECT_EQ(r.pager->resident_bytes(), kSmall);
  EXPECT_TRUE(all_zero(p, kSmall));
  for (size_t pg = 0; pg < kSmall / kPage; ++pg) fill_page(p + pg * kPage, pg, 1);
  EXPECT_EQ(first_bad_page(p, kSmall / kPage, 1), kSmall / kPage);
  PagerStats s = r.pager->stats();
  EXPECT_EQ(s.faults_zero, 0u) << s.to_string();
  EXPECT_EQ(s.faults_wp, 0u) << s.to_string();  // mapped writable

  // A large allocation: only its first populate_max bytes.
  constexpr size_t kLarge = 1 << 20;
  auto* q = static_cast<uint8_t*>(r.heap->alloc(kLarge));
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(resident_pages(q, 256 << 10), (256u << 10) / kPage);
  EXPECT_EQ(resident_pages(q + (256 << 10), kLarge - (256 << 10)), 0u);
  EXPECT_EQ(r.populated(), (kSmall + (256 << 10)) / kPage);
  EXPECT_TRUE(all_zero(q, kLarge));  // the rest faults in as zeros
  EXPECT_GT(r.pager->stats().faults_zero, 0u);

  // Blocks already mapped are left alone.
  EXPECT_EQ(r.pager->populate_zero(p, kSmall), 0u);
  EXPECT_EQ(first_bad_page(p, kSmall / kPage, 1), kSmall / kPage);

  // A growing realloc fills the new tail; the old bytes move with it.
  auto* g = static_cast<uint8_t*>(r.heap->realloc(p, 2 * kSmall));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(first_bad_page(g, kSmall / kPage, 1), kSmall / kPage);
  EXPECT_EQ(resident_pages(g + kSmall, kSmall), kSmall / kPage);
  EXPECT_TRUE(all_zero(g + kSmall, kSmall));
  r.heap->free(g);
  r.heap->free(q);
}

TEST(FarHeapPopulate, OffByDefaultInFarHeapOptions) {
  FARMEM_SKIP_WITHOUT_UFFD();
  PopulateRig r(16384, 65536, 0);
  auto* p = static_cast<uint8_t*>(r.heap->alloc(96 << 10));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(resident_pages(p, 96 << 10), 0u);
  EXPECT_EQ(r.populated(), 0u);
  EXPECT_EQ(FarHeapOptions{}.populate_max, 0u);
  r.heap->free(p);
}

// A budget smaller than the allocation: the fill stops at the high
// watermark (never past the budget, never waking the evictor), and the
// whole allocation is byte-exact after being written through eviction.
TEST(FarHeapPopulate, RespectsTheBudget) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 256, kPages = 1024;
  PopulateRig r(kBudget, 8192, kPages * kPage);
  const uint64_t high = static_cast<uint64_t>(PagerConfig{}.high_watermark * kBudget);
  auto* p = static_cast<uint8_t*>(r.heap->alloc(kPages * kPage));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(r.populated(), high);
  EXPECT_EQ(resident_pages(p, kPages * kPage), high);
  EXPECT_EQ(r.pager->resident_bytes(), high * kPage);
  for (size_t pg = 0; pg < kPages; ++pg) fill_page(p + pg * kPage, pg, 3);
  EXPECT_EQ(first_bad_page(p, kPages, 3), kPages);
  PagerStats s = r.pager->stats();
  EXPECT_LE(s.resident_peak_bytes, r.pager->budget_bytes()) << s.to_string();
  EXPECT_GT(s.evictions_dirty, 0u) << s.to_string();
  // Full budget: no headroom left for a second allocation's fill... at most
  // what the evictor freed below the high watermark meanwhile.
  auto* q = static_cast<uint8_t*>(r.heap->alloc(kPages * kPage));
  ASSERT_NE(q, nullptr);
  EXPECT_LE(r.pager->resident_bytes(), r.pager->budget_bytes());
  EXPECT_TRUE(all_zero(q, kPages * kPage));
  EXPECT_EQ(first_bad_page(p, kPages, 3), kPages);
  EXPECT_LE(r.pager->stats().resident_peak_bytes, r.pager->budget_bytes());
  r.heap->free(q);
  r.heap->free(p);
}

// Application threads faulting on blocks being filled: each block is
// mapped exactly once (by the fill or by a fault), every byte reads zero.
TEST(FarHeapPopulate, ConcurrentFaultsOnTheSameBlocks) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kPages = 4096;  // the whole region: nothing maps past it
  for (int round = 0; round < 4; ++round) {
    LoopbackRig rig;
    P& p = rig.start(small_config(2 * kPages, kPages));
    auto* mem = static_cast<uint8_t*>(p.base());
    std::atomic<bool> go{false};
    std::atomic<uint64_t> sum{0};
    std::thread reader([&] {
      while (!go.load(std::memory_order_acquire)) {
      }
      uint64_t s = 0;
      // From the top down, against the fill's bottom-up order.
      for (size_t pg = kPages; pg-- > 0;) s += static_cast<volatile uint8_t*>(mem)[pg * kPage + 8];
      sum.store(s);
    });
    go.store(true, std::memory_order_release);
    const size_t filled = p.populate_zero(mem, kPages * kPage);
    reader.join();
    EXPECT_EQ(sum.load(), 0u);
    EXPECT_TRUE(all_zero(mem, kPages * kPage));
    PagerStats s = p.stats();
    EXPECT_EQ(filled + s.faults_zero + s.zero_around, kPages) << filled << " " << s.to_string();
    EXPECT_EQ(p.resident_bytes(), kPages * kPage);
    EXPECT_EQ(resident_pages(mem, kPages * kPage), kPages);
  }
}

int wait_child(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// fork(): the child sees the filled blocks as they were at the fork (values
// where written, zeros elsewhere); the parent's later writes and fills do
// not reach it, nor its writes the parent. No fill while a fork is
// prepared, none in the child (its uffd is the parent's).
TEST(FarHeapPopulate, ForkSnapshotSeesFilledBlocks) {
  FARMEM_SKIP_WITHOUT_UFFD();
  PopulateRig r(4096, 65536, 1 << 20);
  if (!r.pager->fork_snapshots()) {
    GTEST_SKIP() << "no UFFD_FEATURE_EVENT_FORK for this process (CAP_SYS_PTRACE)";
  }
  constexpr size_t kPages = 64;
  auto* a = static_cast<uint8_t*>(r.heap->alloc(kPages * kPage));
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(resident_pages(a, kPages * kPage), kPages);
  for (size_t pg = 0; pg < kPages / 2; ++pg) fill_page(a + pg * kPage, pg, 5);

  // Prepared: nothing is filled (the snapshot is being taken).
  auto* b = static_cast<uint8_t*>(r.heap->alloc(kPages * kPage));
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(r.pager->prepare_fork().ok());
  auto* c = static_cast<uint8_t*>(r.heap->alloc(kPages * kPage));
  const uint64_t during = r.populated();
  pid_t pid = fork();
  if (pid == 0) {
    r.pager->fork_child();
    if (first_bad_page(a, kPages / 2, 5) != kPages / 2) _exit(10);
    if (!all_zero(a + kPages / 2 * kPage, kPages / 2 * kPage)) _exit(11);
    if (!all_zero(b, kPages * kPage)) _exit(12);
    if (c == nullptr || !all_zero(c, kPages * kPage)) _exit(13);
    // The backing is inert here: no fill through the parent's descriptor.
    if (r.pager->populate_zero(c, kPages * kPage) != 0) _exit(14);
    for (size_t pg = 0; pg < kPages; ++pg) {
      fill_page(a + pg * kPage, pg, 7);
      fill_page(b + pg * kPage, pg, 7);
    }
    if (first_bad_page(a, kPages, 7) != kPages || first_bad_page(b, kPages, 7) != kPages) _exit(15);
    _exit(0);
  }
  r.pager->fork_parent();
  ASSERT_GT(pid, 0) << strerror(errno);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(resident_pages(c, kPages * kPage), 0u);  // not filled while prepared
  EXPECT_EQ(during, 2 * kPages);                     // a and b only
  // The parent goes on filling and writing while the child checks.
  auto* d = static_cast<uint8_t*>(r.heap->alloc(kPages * kPage));
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(resident_pages(d, kPages * kPage), kPages);
  for (size_t pg = 0; pg < kPages; ++pg) {
    fill_page(a + pg * kPage, pg, 6);
    fill_page(d + pg * kPage, pg, 6);
  }
  EXPECT_EQ(wait_child(pid), 0);
  EXPECT_EQ(first_bad_page(a, kPages, 6), kPages);
  EXPECT_EQ(first_bad_page(d, kPages, 6), kPages);
  EXPECT_TRUE(all_zero(b, kPages * kPage));
  EXPECT_TRUE(all_zero(c, kPages * kPage));
}

}  // namespace
}  // namespace farmem::testing
