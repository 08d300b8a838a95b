// FarHeap: a jemalloc arena whose extents come from a pager region.
//
//   auto heap = farmem::FarHeap::create(&backing, {});   // Result<unique_ptr>
//   void* p = (*heap)->alloc(1 << 20);                   // far memory
//   (*heap)->free(p);
//
// Data-path calls are noexcept, never allocate locally and return nullptr
// (not an exception) when the region is exhausted.
//
// Thread caches (FarHeapOptions::thread_cache). By default jemalloc's
// thread caches are bypassed (MALLOCX_TCACHE_NONE): a thread's automatic
// cache is shared by every arena the thread uses and could hand an object
// of one arena to a caller of another; without it every object provably
// comes from this arena, and the heap can be destroyed at any time. With
// thread_cache on, allocations and frees use the calling thread's automatic
// cache of the private jemalloc copy (small and large classes up to
// jemalloc's tcache_max, 32 KiB): a malloc/free pair is a pop and a push on
// a thread-local stack, no arena lock. That is only correct when this heap
// is the only user of those caches in the process: one heap with
// thread_cache on at a time, and nothing else calling the private jemalloc
// with its automatic cache (flags without MALLOCX_TCACHE_NONE) on the
// threads that use the heap. The preload library has exactly one heap and
// never destroys it; FarRuntime sets it from FarOptions::thread_cache
// (only the preload library turns it on). Destroying such a heap flushes
// the destroying thread's cache; other threads that used the heap must have
// exited (jemalloc flushes a thread's cache when it exits) or called
// flush_thread_cache() first.
//
// Purging freed pages: jemalloc keeps freed pages "dirty" (resident,
// counted in the budget) and later purges them through the hooks, and the
// pager drops them (invariant 2: they read as zeros, their budget and
// remote space are freed). When depends on the budget (purge_at):
//
//   resident / budget      decay (arena.N.dirty_decay_ms)   on entering
//   ---------------------  -------------------------------  -------------
//   below purge_at         off (-1): freed pages are kept   -
//   reaches purge_at       dirty_decay_ms                   purge all now
//   falls below purge_at/2 off again                        -
//
// Why: a decayed page that is reused faults again (zero-fill, through the
// pager) and, before that, was dropped through the pager: a program that
// frees and reallocates a working set that fits in the budget paid both on
// every decay epoch (bench/alloc_bench.cc, BM_FarHeapTouch from 32K: once a
// round took longer than an epoch, every round was purged and re-faulted).
// A freed page that nobody reuses costs nothing while the budget has room;
// once it is tight, freed pages must go first, else the evictor would write
// them back to the donor. The check is a relaxed load of the pager's
// resident counter after each far allocation and free; a switch (rare, with
// hysteresis) takes a mutex and two mallctls. purge_at = 0 (or a backing
// that reports no budget): decay alone, always dirty_decay_ms.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "allocator/extent_space.h"
#include "allocator/far_backing.h"
#include "allocator/fine_pool.h"
#include "runtime/status.h"

namespace farmem {

struct FarHeapOptions {
  int64_t dirty_decay_ms = 1000;  // -1: never purge; 0: purge at once
  // Share of the backing's budget at which freed pages start to be purged
  // (see above); 0: always dirty_decay_ms.
  double purge_at = 0;
  size_t free_list_capacity = ExtentSpace::kDefaultFreeListCapacity;
  // Allocation-time zero fill (see above): at most this many bytes of each
  // allocation (from its start; of a realloc, from the old end) are mapped
  // as zeros when it is made, where never written. 0: off.
  size_t populate_max = 0;
  // Use jemalloc's per-thread caches (see above); false: MALLOCX_TCACHE_NONE.
  bool thread_cache = false;
  // Objects of 513 B to 14 KiB in finer size classes (allocator/fine_pool.h).
  bool fine_classes = false;
};

class FarHeap {
 public:
  static Result<std::unique_ptr<FarHeap>> create(FarBacking* backing, const FarHeapOptions& o);
  ~FarHeap();  // destroys the arena: every allocation from it is gone
  FarHeap(const FarHeap&) = delete;
  FarHeap& operator=(const FarHeap&) = delete;

  void* alloc(size_t size) noexcept {
    void* p = alloc_raw(size);
    populate(p, size);
    check_pressure();
    return p;
  }
  void* alloc_zeroed(size_t size) noexcept;
  // alignment: a power of two (callers check).
  void* alloc_aligned(size_t alignment, size_t size, bool zero = false) noexcept;
  // ptr must be a live allocation of this heap; nullptr (ptr intact) on failure.
  void* realloc(void* ptr, size_t size) noexcept;
  void free(void* ptr) noexcept {
    free_raw(ptr);
    check_pressure();
  }
  size_t usable_size(const void* ptr) const noexcept;

  bool contains(const void* p) const noexcept {
    return reinterpret_cast<uintptr_t>(p) - base_ < size_;
  }
  unsigned arena() const { return arena_; }
  ExtentSpace& space() { return *space_; }
  FarBacking& backing() { return *backing_; }

  struct Stats {
    uint64_t allocated = 0;  // bytes in live allocations (jemalloc's view)
    uint64_t active = 0;     // bytes in pages with live allocations
    uint64_t dirty = 0;      // freed pages not yet purged
    uint64_t nmalloc = 0, ndalloc = 0;
    uint64_t pressure_purges = 0;   // times purge_at was reached (everything freed purged)
    uint64_t populated_blocks = 0;  // blocks mapped as zeros at allocation time (populate_max)
    bool under_pressure = false;    // dirty_decay_ms applies now
    FinePool::Stats fine;           // the finer size classes (fine_classes)
  };
  Stats stats() const;  // control path: refreshes jemalloc's statistics epoch
  // Purges every unused dirty page now (tests, fm_evict of free space).
  void purge() noexcept;
  // Returns what the calling thread's cache holds to the arena (thread_cache
  // only; a no-op otherwise).
  void flush_thread_cache() noexcept;
  bool thread_cache() const { return opts_.thread_cache; }

 private:
  FarHeap(FarBacking* b, const FarHeapOptions& o);
  Status init();
  void* alloc_raw(size_t size) noexcept;
  bool is_fine(const void* p) const noexcept { return fine_ != nullptr && fine_->owns(p); }
  // realloc() of a large allocation to a larger size (see far_heap.cc): in
  // place, or copied kMoveChunk at a time with the old copy dropped behind.
  static constexpr size_t kMoveMin = 256 << 10;
  static constexpr size_t kMoveChunk = 1 << 20;
  void* grow_large(void* ptr, size_t old, size_t size) noexcept;
  // flags_, plus page alignment for a large allocation (see far_heap.cc).
  int flags_for(size_t size) const noexcept;
  void free_raw(void* ptr) noexcept;
  // Budget-pressure purging (see the header comment).
  void check_pressure() noexcept {
    if (pressure_hi_ == 0) return;
    const uint64_t r = backing_->resident_bytes();
    const bool on = pressured_.load(std::memory_order_relaxed);
    if (__builtin_expect(on ? r < pressure_lo_ : r >= pressure_hi_, 0)) set_pressure(!on);
  }
  void set_pressure(bool on) noexcept;
  // Allocation-time zero fill of the first populate_max bytes of [p, p+n).
  // Small objects (below kPopulateMin) are left alone: they share slabs,
  // whose pages the fault path's zero-fill chunk maps (FARMEM_ZERO_CHUNK),
  // and a call into the pager per small malloc would cost more than it saves.
  static constexpr size_t kPopulateMin = 16 << 10;
  void populate(void* p, size_t n) noexcept {
    if (opts_.populate_max == 0 || n < kPopulateMin || p == nullptr) return;
    const size_t got = backing_->populate_zero(p, n < opts_.populate_max ? n : opts_.populate_max);
    if (got != 0) populated_.fetch_add(got, std::memory_order_relaxed);
  }

  FarBacking* const backing_;
  const FarHeapOptions opts_;
  const uintptr_t base_;
  const size_t size_;
  std::unique_ptr<ExtentSpace> space_;
  std::unique_ptr<FinePool> fine_;  // fine_classes only
  unsigned arena_ = 0;
  bool have_arena_ = false;
  int flags_ = 0;             // MALLOCX_ARENA [| MALLOCX_TCACHE_NONE]
  int free_flags_ = 0;        // 0 (the thread's cache) or MALLOCX_TCACHE_NONE
  uint64_t pressure_hi_ = 0;  // resident bytes that switch purging on; 0: no gating
  uint64_t pressure_lo_ = 0;  // ... and off again
  std::atomic<bool> pressured_{false};
  std::atomic<uint64_t> pressure_purges_{0};
  std::atomic<uint64_t> populated_{0};
  std::mutex pressure_mu_;  // serializes switches; never held by a data-path caller otherwise
};

}  // namespace farmem
