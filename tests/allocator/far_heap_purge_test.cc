// FarHeap's budget-pressure purging (allocator/far_heap.h): a freed and
// reallocated working set that fits in the budget is reused without being
// dropped and re-faulted; once residency reaches purge_at, everything freed
// is dropped at once (invariant 2: it reads as zeros) and later frees decay
// until residency falls below half of purge_at.
//
// Every check is synchronous: the heap switches on the thread that
// allocates or frees, so the counts below are exact, with no waiting.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "allocator/far_heap.h"
#include "far_heap_rig.h"
#include "pager/pager.h"
#include "pager/uffd.h"
#include "runtime/loopback_transport.h"

namespace farmem {
namespace {

using Rig = testing::FarHeapRig;
using P = Rig::P;
constexpr size_t kMiB = 1 << 20;

uint8_t pattern(size_t pass, size_t obj, size_t i) {
  return static_cast<uint8_t>((pass * 31 + obj * 131 + i * 7 + (i >> 12)) & 0xff);
}

// One pass: allocate `n` objects of `size`, fill each, check each, free all.
// false (with a gtest failure) when a byte read back differs.
bool churn(FarHeap& heap, size_t pass, size_t n, size_t size) {
  std::vector<uint8_t*> objs(n);
  for (size_t o = 0; o < n; ++o) {
    objs[o] = static_cast<uint8_t*>(heap.alloc(size));
    EXPECT_NE(objs[o], nullptr);
    if (objs[o] == nullptr) return false;
    for (size_t i = 0; i < size; ++i) objs[o][i] = pattern(pass, o, i);
  }
  for (size_t o = 0; o < n; ++o) {
    for (size_t i = 0; i < size; i += 509) {
      if (objs[o][i] != pattern(pass, o, i)) {
        ADD_FAILURE() << "pass " << pass << " object " << o << " byte " << i;
        return false;
      }
    }
  }
  for (uint8_t* p : objs) heap.free(p);
  return true;
}

// A working set of 4 MiB in a 64 MiB budget, freed and reallocated ten
// times: only the first pass faults; nothing is dropped.
TEST(FarHeapPurge, ReusedWorkingSetThatFitsIsNotRefaulted) {
  FARMEM_SKIP_WITHOUT_UFFD();
  // decay 0: were the budget gate not there, every free would drop at once.
  Rig r(64 * kMiB, /*decay_ms=*/0, /*purge_at=*/0.75);
  ASSERT_TRUE(churn(*r.heap, 0, 16, 256 << 10));
  const uint64_t z1 = r.zero_faults();
  EXPECT_GT(z1, 0u);
  EXPECT_EQ(r.dropped(), 0u);
  for (size_t pass = 1; pass < 10; ++pass) ASSERT_TRUE(churn(*r.heap, pass, 16, 256 << 10));
  EXPECT_EQ(r.zero_faults(), z1) << "a freed working set that fits was dropped and re-faulted";
  EXPECT_EQ(r.dropped(), 0u);
  EXPECT_EQ(r.pager->stats().faults_remote, 0u);
  const FarHeap::Stats s = r.heap->stats();
  EXPECT_EQ(s.pressure_purges, 0u);
  EXPECT_FALSE(s.under_pressure);
  // The freed pages are still there for reuse, counted in the budget.
  EXPECT_GE(s.dirty, 4 * kMiB);
}

// The same loop without the gate (purge_at 0, decay 0): every pass drops
// its pages and faults them in again. This is what the gate prevents, and
// shows that the test above can fail.
TEST(FarHeapPurge, WithoutTheGateEveryPassRefaults) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(64 * kMiB, /*decay_ms=*/0, /*purge_at=*/0);
  ASSERT_TRUE(churn(*r.heap, 0, 16, 256 << 10));
  const uint64_t z1 = r.zero_faults();
  ASSERT_GT(z1, 0u);
  for (size_t pass = 1; pass < 3; ++pass) ASSERT_TRUE(churn(*r.heap, pass, 16, 256 << 10));
  EXPECT_GE(r.zero_faults(), 2 * z1);
  EXPECT_GE(r.dropped(), 3 * 4 * kMiB);
}

// Residency reaches purge_at (16 of a 32 MiB budget: well under the pager's
// eviction watermarks, so only the heap drops pages here). 18 objects of
// 1 MiB are touched, then freed one by one with decay 0 under pressure:
//   free 0        resident 18 MiB >= 16: pressure on, everything freed dropped
//   free 1..10    dropped at once (decay 0); resident 16 ... 7 MiB
//   after free 10 resident 7 MiB < 8 (purge_at / 2): pressure off
//   free 11..16   kept for reuse (no decay)
TEST(FarHeapPurge, UnderBudgetPressureFreedMemoryIsDropped) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(32 * kMiB, /*decay_ms=*/0, /*purge_at=*/0.5);
  constexpr size_t kObjs = 18;
  std::vector<uint8_t*> objs(kObjs);
  for (size_t o = 0; o < kObjs; ++o) {
    objs[o] = static_cast<uint8_t*>(r.heap->alloc(kMiB));
    ASSERT_NE(objs[o], nullptr);
  }
  for (size_t o = 0; o < kObjs; ++o) memset(objs[o], static_cast<int>(o + 1), kMiB);
  ASSERT_GE(r.pager->resident_bytes(), 18 * kMiB);
  ASSERT_EQ(r.dropped(), 0u);
  EXPECT_FALSE(r.heap->stats().under_pressure);  // no heap call since the budget filled
  r.heap->free(objs[0]);
  FarHeap::Stats s = r.heap->stats();
  EXPECT_TRUE(s.under_pressure);
  EXPECT_EQ(s.pressure_purges, 1u);
  // One object's extent: 1 MiB plus the page jemalloc pads large
  // allocations with (cache-oblivious placement).
  const uint64_t extent = r.dropped();
  EXPECT_GE(extent, kMiB);
  EXPECT_LE(extent, kMiB + 64 * 1024);
  EXPECT_EQ(s.dirty, 0u);
  for (size_t o = 1; o <= 10; ++o) {
    r.heap->free(objs[o]);
    EXPECT_EQ(r.dropped(), (o + 1) * extent) << "free " << o;
  }
  EXPECT_FALSE(r.heap->stats().under_pressure);
  for (size_t o = 11; o + 1 < kObjs; ++o) r.heap->free(objs[o]);
  s = r.heap->stats();
  EXPECT_EQ(r.dropped(), 11 * extent);
  EXPECT_EQ(s.pressure_purges, 1u);
  EXPECT_GE(s.dirty, 6 * kMiB);
  // 1 MiB live + 6 MiB kept (plus whatever a fault path mapped around
  // them): the 11 MiB dropped gave their budget back, never written back.
  EXPECT_LE(r.pager->resident_bytes(), 8 * kMiB);
  EXPECT_EQ(r.pager->stats().evictions_dirty, 0u);
  for (size_t i = 0; i < kMiB; i += 4093) ASSERT_EQ(objs[kObjs - 1][i], kObjs) << i;
  // The kept pages serve the next allocations without a fault.
  const uint64_t z = r.zero_faults();
  ASSERT_TRUE(churn(*r.heap, 1, 4, kMiB));
  EXPECT_EQ(r.zero_faults(), z);
  EXPECT_EQ(r.dropped(), 11 * extent);
  r.heap->free(objs[kObjs - 1]);
}

}  // namespace
}  // namespace farmem
