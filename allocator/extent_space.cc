#include "allocator/extent_space.h"

#include <cstring>

#include "allocator/local_scope.h"
#include "runtime/log.h"

namespace farmem {
namespace {

constexpr size_t kPage = 4096;

uintptr_t align_up(uintptr_t v, size_t a) {
  return (v + a - 1) & ~(uintptr_t{a} - 1);
}
uintptr_t align_down(uintptr_t v, size_t a) {
  return v & ~(uintptr_t{a} - 1);
}
void bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
  c.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace

ExtentSpace::ExtentSpace(FarBacking* backing, size_t free_list_capacity)
    : backing_(backing),
      base_(reinterpret_cast<uintptr_t>(backing->base())),
      end_(reinterpret_cast<uintptr_t>(backing->base()) + backing->size()),
      block_(backing->block_size()),
      bump_(reinterpret_cast<uintptr_t>(backing->base())),
      free_(new Range[free_list_capacity < 2 ? 2 : free_list_capacity]),
      free_cap_(free_list_capacity < 2 ? 2 : free_list_capacity) {
  FARMEM_BUG_ON(base_ % kPage != 0);
  hooks_.table =
      extent_hooks_t{&hook_alloc, &hook_dalloc, &hook_destroy, &hook_commit, &hook_decommit,
                     &hook_purge, &hook_purge,  &hook_split,   &hook_merge};
  hooks_.self = this;
}

bool ExtentSpace::contains(const void* addr, size_t size) const {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  return a >= base_ && a <= end_ && size <= end_ - a;
}

bool ExtentSpace::insert_locked(uintptr_t b, uintptr_t e) {
  if (b == e) return true;
  // A range that ends at the bump pointer lowers it instead (and swallows
  // the last free range if that one now touches it): the list stays short.
  if (e == bump_) {
    bump_ = b;
    if (n_free_ > 0 && free_[n_free_ - 1].end == bump_) {
      bump_ = free_[n_free_ - 1].begin;
      free_bytes_ -= free_[n_free_ - 1].end - free_[n_free_ - 1].begin;
      --n_free_;
    }
    return true;
  }
  size_t i = 0;  // first range starting after b
  while (i < n_free_ && free_[i].begin < b) ++i;
  FARMEM_BUG_ON(i > 0 && free_[i - 1].end > b);      // overlaps the previous range
  FARMEM_BUG_ON(i < n_free_ && free_[i].begin < e);  // overlaps the next range
  const bool join_prev = i > 0 && free_[i - 1].end == b;
  const bool join_next = i < n_free_ && free_[i].begin == e;
  if (join_prev && join_next) {
    free_[i - 1].end = free_[i].end;
    memmove(&free_[i], &free_[i + 1], (n_free_ - i - 1) * sizeof(Range));
    --n_free_;
  } else if (join_prev) {
    free_[i - 1].end = e;
  } else if (join_next) {
    free_[i].begin = b;
  } else {
    if (n_free_ == free_cap_) return false;
    memmove(&free_[i + 1], &free_[i], (n_free_ - i) * sizeof(Range));
    free_[i] = Range{b, e};
    ++n_free_;
  }
  free_bytes_ += e - b;
  return true;
}

void* ExtentSpace::take_locked(uintptr_t want, size_t size, size_t alignment) {
  for (size_t i = 0; i < n_free_; ++i) {
    Range& r = free_[i];
    uintptr_t a;
    if (want != 0) {
      if (!(r.begin <= want && want < r.end && size <= r.end - want)) continue;
      a = want;
    } else {
      a = align_up(r.begin, alignment);
      if (a >= r.end || size > r.end - a) continue;
    }
    const bool front = a > r.begin;
    const bool back = a + size < r.end;
    if (front && back) {
      if (n_free_ == free_cap_) continue;  // no room to split this one
      memmove(&free_[i + 2], &free_[i + 1], (n_free_ - i - 1) * sizeof(Range));
      free_[i + 1] = Range{a + size, r.end};
      ++n_free_;
      free_[i].end = a;
    } else if (front) {
      r.end = a;
    } else if (back) {
      r.begin = a + size;
    } else {
      memmove(&free_[i], &free_[i + 1], (n_free_ - i - 1) * sizeof(Range));
      --n_free_;
    }
    free_bytes_ -= size;
    return reinterpret_cast<void*>(a);
  }
  return nullptr;
}

void* ExtentSpace::alloc(void* new_addr, size_t size, size_t alignment) {
  if (size == 0 || size % kPage != 0 || size > end_ - base_) return nullptr;
  if (alignment < kPage) alignment = kPage;
  if ((alignment & (alignment - 1)) != 0) return nullptr;
  const uintptr_t want = reinterpret_cast<uintptr_t>(new_addr);
  if (want != 0 && (want % alignment != 0 || !contains(new_addr, size))) return nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  if (want != 0) {
    if (want == bump_ && size <= end_ - bump_) {
      bump_ += size;
      return new_addr;
    }
    if (want > bump_ && size <= end_ - want) {
      // Beyond the bump pointer: the gap goes to the free list.
      if (!insert_locked(bump_, want)) return nullptr;
      bump_ = want + size;
      return new_addr;
    }
    return take_locked(want, size, alignment);
  }
  if (void* p = take_locked(0, size, alignment)) return p;
  const uintptr_t a = align_up(bump_, alignment);
  if (a < bump_ || a > end_ || size > end_ - a) return nullptr;
  if (a > bump_ && !insert_locked(bump_, a)) {
    // No room to remember the alignment gap: its address space is lost,
    // nothing else (it was never touched).
    leaked_bytes_.fetch_add(a - bump_, std::memory_order_relaxed);
  }
  bump_ = a + size;
  return reinterpret_cast<void*>(a);
}

bool ExtentSpace::drop(void* addr, size_t size) {
  // In a fork()ed child the pages stay: dropping them would make the
  // parent refill them from the fork snapshot, not read zeros. jemalloc
  // takes the failure and keeps them (retained or committed).
  if (backing_->in_fork_child()) return false;
  bump(dropped_bytes_, size);
  const uintptr_t b = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t e = b + size;
  const uintptr_t fb = align_up(b, block_);
  const uintptr_t fe = align_down(e, block_);
  if (fb >= fe) {
    // Inside one block that neighbours may still use: zero our part.
    memset(addr, 0, size);
    return true;
  }
  Status st = backing_->discard(reinterpret_cast<void*>(fb), fe - fb);
  if (!st.ok()) {
    FARMEM_LOG(kError, "far heap: dropping pages [%p, +%zu) failed: %s", addr, size,
               st.to_string().c_str());
    return false;
  }
  if (fb > b) memset(addr, 0, fb - b);
  if (e > fe) memset(reinterpret_cast<void*>(fe), 0, e - fe);
  return true;
}

bool ExtentSpace::give_back(void* addr, size_t size, bool committed, bool force) {
  if (!contains(addr, size) || size == 0) return false;
  if (committed && !drop(addr, size)) return false;
  const uintptr_t b = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lk(mu_);
  if (insert_locked(b, b + size)) return true;
  if (force) leaked_bytes_.fetch_add(size, std::memory_order_relaxed);
  return false;
}

ExtentSpace::Stats ExtentSpace::stats() const {
  Stats s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.bump_bytes = bump_ - base_;
    s.free_bytes = free_bytes_;
    s.free_ranges = n_free_;
  }
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.allocs = ld(allocs_);
  s.dallocs = ld(dallocs_);
  s.dalloc_refused = ld(dalloc_refused_);
  s.destroys = ld(destroys_);
  s.commits = ld(commits_);
  s.decommits = ld(decommits_);
  s.purges = ld(purges_);
  s.splits = ld(splits_);
  s.merges = ld(merges_);
  s.dropped_bytes = ld(dropped_bytes_);
  s.leaked_bytes = ld(leaked_bytes_);
  return s;
}

// ---- the hooks: jemalloc's conventions (bool: false = success) -------------

void* ExtentSpace::hook_alloc(extent_hooks_t* h, void* new_addr, size_t size, size_t alignment,
                              bool* zero, bool* commit, unsigned) {
  LocalScope local;
  ExtentSpace* s = from(h);
  void* p = s->alloc(new_addr, size, alignment);
  if (p == nullptr) return nullptr;
  bump(s->allocs_);
  // Fresh bump space was never touched; free-list ranges were dropped when
  // they came back: both read as zeros, and the pager keeps them readable.
  *zero = true;
  *commit = true;
  return p;
}

bool ExtentSpace::hook_dalloc(extent_hooks_t* h, void* addr, size_t size, bool committed,
                              unsigned) {
  LocalScope local;
  ExtentSpace* s = from(h);
  if (!s->give_back(addr, size, committed, /*force=*/false)) {
    bump(s->dalloc_refused_);
    return true;
  }
  bump(s->dallocs_);
  return false;
}

void ExtentSpace::hook_destroy(extent_hooks_t* h, void* addr, size_t size, bool committed,
                               unsigned) {
  LocalScope local;
  ExtentSpace* s = from(h);
  bump(s->destroys_);
  (void)s->give_back(addr, size, committed, /*force=*/true);
}

bool ExtentSpace::hook_commit(extent_hooks_t* h, void* addr, size_t size, size_t offset,
                              size_t length, unsigned) {
  ExtentSpace* s = from(h);
  bump(s->commits_);
  return !(offset <= size && length <= size - offset &&
           s->contains(static_cast<char*>(addr) + offset, length));
}

bool ExtentSpace::hook_decommit(extent_hooks_t* h, void* addr, size_t size, size_t offset,
                                size_t length, unsigned) {
  LocalScope local;
  ExtentSpace* s = from(h);
  if (offset > size || length > size - offset) return true;
  void* p = static_cast<char*>(addr) + offset;
  if (!s->contains(p, length)) return true;
  bump(s->decommits_);
  return !s->drop(p, length);
}

bool ExtentSpace::hook_purge(extent_hooks_t* h, void* addr, size_t size, size_t offset,
                             size_t length, unsigned) {
  LocalScope local;
  ExtentSpace* s = from(h);
  if (offset > size || length > size - offset) return true;
  void* p = static_cast<char*>(addr) + offset;
  if (!s->contains(p, length)) return true;
  bump(s->purges_);
  return !s->drop(p, length);
}

bool ExtentSpace::hook_split(extent_hooks_t* h, void* addr, size_t size, size_t size_a,
                             size_t size_b, bool, unsigned) {
  ExtentSpace* s = from(h);
  if (size_a + size_b != size || !s->contains(addr, size)) return true;
  bump(s->splits_);
  return false;
}

bool ExtentSpace::hook_merge(extent_hooks_t* h, void* addr_a, size_t size_a, void* addr_b,
                             size_t size_b, bool, unsigned) {
  ExtentSpace* s = from(h);
  if (!s->contains(addr_a, size_a) || !s->contains(addr_b, size_b) ||
      static_cast<char*>(addr_a) + size_a != addr_b) {
    return true;
  }
  bump(s->merges_);
  return false;
}

}  // namespace farmem
