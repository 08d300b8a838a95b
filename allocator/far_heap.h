// FarHeap: a jemalloc arena whose extents come from a pager region.
//
//   auto heap = farmem::FarHeap::create(&backing, {});   // Result<unique_ptr>
//   void* p = (*heap)->alloc(1 << 20);                   // far memory
//   (*heap)->free(p);
//
// Data-path calls are noexcept, never allocate locally and return nullptr
// (not an exception) when the region is exhausted. jemalloc's thread caches
// are bypassed (MALLOCX_TCACHE_NONE): a thread cache is shared by every
// arena a thread uses and could hand a far object to a local caller or the
// reverse; without it every object provably comes from this arena.
//
// Decay: freed pages stay dirty (resident, counted in the budget) for
// decay_ms, then jemalloc purges them through the hooks and the pager drops
// them. Short by default: a dirty far page that nobody will read would
// otherwise be written back to the donor when evicted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "allocator/extent_space.h"
#include "allocator/far_backing.h"
#include "runtime/status.h"

namespace farmem {

struct FarHeapOptions {
  int64_t dirty_decay_ms = 1000;  // -1: never purge; 0: purge at once
  size_t free_list_capacity = ExtentSpace::kDefaultFreeListCapacity;
};

class FarHeap {
 public:
  static Result<std::unique_ptr<FarHeap>> create(FarBacking* backing, const FarHeapOptions& o);
  ~FarHeap();  // destroys the arena: every allocation from it is gone
  FarHeap(const FarHeap&) = delete;
  FarHeap& operator=(const FarHeap&) = delete;

  void* alloc(size_t size) noexcept;
  void* alloc_zeroed(size_t size) noexcept;
  // alignment: a power of two (callers check).
  void* alloc_aligned(size_t alignment, size_t size, bool zero = false) noexcept;
  // ptr must be a live allocation of this heap; nullptr (ptr intact) on failure.
  void* realloc(void* ptr, size_t size) noexcept;
  void free(void* ptr) noexcept;
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
  };
  Stats stats() const;  // control path: refreshes jemalloc's statistics epoch
  // Purges every unused dirty page now (tests, fm_evict of free space).
  void purge() noexcept;

 private:
  FarHeap(FarBacking* b, const FarHeapOptions& o);
  Status init();

  FarBacking* const backing_;
  const FarHeapOptions opts_;
  const uintptr_t base_;
  const size_t size_;
  std::unique_ptr<ExtentSpace> space_;
  unsigned arena_ = 0;
  bool have_arena_ = false;
  int flags_ = 0;  // MALLOCX_ARENA | MALLOCX_TCACHE_NONE
};

}  // namespace farmem
