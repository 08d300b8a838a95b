// ExtentSpace: jemalloc extent hooks that carve extents out of one pager
// region.
//
//   farmem::ExtentSpace space(&backing);                 // backing: FarBacking
//   farmem::JeArenaConfig cfg{space.hooks(), false};     // metadata stays local
//   farmem_je_mallctl("experimental.arenas_create_ext", &arena, &sz, &cfg, sizeof cfg);
//
// The region is virtual memory the pager serves: every byte is always
// readable (a never-written page reads as zeros, a remote one is fetched),
// so "committed" is always true and the hooks' job is bookkeeping plus
// telling the pager when pages no longer matter.
//
// Hook semantics (jemalloc convention: a bool hook returns false on success):
//   alloc     first fit from the free list, else bump; *zero = *commit = true
//             (everything handed out reads as zeros, see dalloc/decommit);
//             new_addr != null: exactly that range, or failure.
//   dalloc    drop the pages (pager discard), then keep the range on the free
//             list for reuse; refused (true) when the fixed-size list is full,
//             and jemalloc then retains the range itself (decommitted).
//   destroy   as dalloc, never refused (a full list leaks the range's address
//             space, not memory).
//   commit    nothing to do: succeeds.
//   decommit  drop: the range reads as zeros, its budget and remote space
//             are freed.
//   purge_lazy, purge_forced   drop, as decommit.
//   split     succeeds (one region, no per-extent state).
//   merge     succeeds when both halves lie in this region.
//
// In a fork()ed child (FarBacking::in_fork_child()) every drop fails, so
// dalloc, decommit and purge report failure and jemalloc keeps the pages.
//
// Drop granularity is the pager block: whole blocks inside the range are
// discarded; the partial edges of a block that the range shares with a
// neighbour (only when FARMEM_BLOCK_SIZE > 4K) are zeroed with memset.
//
// No allocation after construction: the hooks run inside jemalloc with its
// locks held, and in the preload library a malloc there would re-enter.
#pragma once

#include <jemalloc/jemalloc.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "allocator/far_backing.h"

namespace farmem {

class ExtentSpace {
 public:
  static constexpr size_t kDefaultFreeListCapacity = 4096;

  explicit ExtentSpace(FarBacking* backing, size_t free_list_capacity = kDefaultFreeListCapacity);
  ExtentSpace(const ExtentSpace&) = delete;
  ExtentSpace& operator=(const ExtentSpace&) = delete;

  // The hooks table bound to this object; stable for its lifetime.
  extent_hooks_t* hooks() { return &hooks_.table; }

  // The C++ operations the hooks call (tests call them directly too).
  // nullptr when the region is exhausted or new_addr is not available.
  void* alloc(void* new_addr, size_t size, size_t alignment);
  // false when refused (free list full); the range is dropped either way
  // unless `committed` is false (already dropped).
  bool give_back(void* addr, size_t size, bool committed, bool force);
  // Makes the range read as zeros and releases its pages. false on error.
  bool drop(void* addr, size_t size);

  bool contains(const void* addr, size_t size) const;

  struct Stats {
    uint64_t bump_bytes = 0;   // high-water mark of the bump pointer
    uint64_t free_bytes = 0;   // on the free list
    uint64_t free_ranges = 0;  // entries on the free list
    uint64_t allocs = 0, dallocs = 0, dalloc_refused = 0, destroys = 0, commits = 0, decommits = 0,
             purges = 0, splits = 0, merges = 0;
    uint64_t dropped_bytes = 0;  // total handed to drop()
    uint64_t leaked_bytes = 0;   // destroyed with a full free list
  };
  Stats stats() const;

 private:
  struct Range {
    uintptr_t begin;
    uintptr_t end;
  };
  struct Bound {
    extent_hooks_t table;  // first member: the hooks recover `this` from it
    ExtentSpace* self;
  };
  static ExtentSpace* from(extent_hooks_t* h) { return reinterpret_cast<Bound*>(h)->self; }

  static void* hook_alloc(extent_hooks_t*, void*, size_t, size_t, bool*, bool*, unsigned);
  static bool hook_dalloc(extent_hooks_t*, void*, size_t, bool, unsigned);
  static void hook_destroy(extent_hooks_t*, void*, size_t, bool, unsigned);
  static bool hook_commit(extent_hooks_t*, void*, size_t, size_t, size_t, unsigned);
  static bool hook_decommit(extent_hooks_t*, void*, size_t, size_t, size_t, unsigned);
  static bool hook_purge(extent_hooks_t*, void*, size_t, size_t, size_t, unsigned);
  static bool hook_split(extent_hooks_t*, void*, size_t, size_t, size_t, bool, unsigned);
  static bool hook_merge(extent_hooks_t*, void*, size_t, void*, size_t, bool, unsigned);

  // Free list helpers; mu_ held.
  bool insert_locked(uintptr_t b, uintptr_t e);
  void* take_locked(uintptr_t want, size_t size, size_t alignment);

  FarBacking* const backing_;
  const uintptr_t base_;
  const uintptr_t end_;
  const size_t block_;
  Bound hooks_;

  mutable std::mutex mu_;
  uintptr_t bump_;                 // guarded by mu_
  std::unique_ptr<Range[]> free_;  // sorted by begin, disjoint, not adjacent; guarded by mu_
  size_t n_free_ = 0;              // guarded by mu_
  const size_t free_cap_;
  uint64_t free_bytes_ = 0;  // guarded by mu_

  std::atomic<uint64_t> allocs_{0}, dallocs_{0}, dalloc_refused_{0}, destroys_{0}, commits_{0},
      decommits_{0}, purges_{0}, splits_{0}, merges_{0}, dropped_bytes_{0}, leaked_bytes_{0};
};

}  // namespace farmem
