#include "allocator/far_heap.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "allocator/je.h"
#include "allocator/local_scope.h"
#include "runtime/log.h"

// Options of the private jemalloc copy (a strong definition overrides the
// archive's weak one). Nothing uses its automatic arenas but its own
// bookkeeping: one is enough. Thread caches are on, but only a heap with
// FarHeapOptions::thread_cache uses them (far_heap.h); every other heap
// passes MALLOCX_TCACHE_NONE.
extern "C" {
extern const char* farmem_je_malloc_conf;
const char* farmem_je_malloc_conf = "narenas:1,tcache:true,background_thread:false";
}

namespace farmem {

FarHeap::FarHeap(FarBacking* b, const FarHeapOptions& o)
    : backing_(b), opts_(o), base_(reinterpret_cast<uintptr_t>(b->base())), size_(b->size()) {}

Result<std::unique_ptr<FarHeap>> FarHeap::create(FarBacking* backing, const FarHeapOptions& o) {
  LocalScope local;
  if (!backing || !backing->base() || backing->size() == 0) {
    return make_error(Errc::kInvalidArgument,
                      "FarHeap::create: a non-empty pager region is needed");
  }
  std::unique_ptr<FarHeap> h(new FarHeap(backing, o));
  FARMEM_RETURN_IF_ERROR(h->init());
  return h;
}

Status FarHeap::init() {
  space_ = std::make_unique<ExtentSpace>(backing_, opts_.free_list_capacity);
  JeArenaConfig cfg{space_->hooks(), /*metadata_use_hooks=*/false};
  size_t sz = sizeof(arena_);
  int err = farmem_je_mallctl("experimental.arenas_create_ext", &arena_, &sz, &cfg, sizeof cfg);
  if (err != 0) {
    return make_error(Errc::kInternal,
                      "jemalloc: creating the far arena (experimental.arenas_create_ext) failed: "
                      "%s; this build needs jemalloc 5.3",
                      strerror(err));
  }
  have_arena_ = true;
  flags_ = MALLOCX_ARENA(arena_) | (opts_.thread_cache ? 0 : MALLOCX_TCACHE_NONE);
  free_flags_ = opts_.thread_cache ? 0 : MALLOCX_TCACHE_NONE;
  if (opts_.fine_classes) {
    FinePool::SlabSource src;
    src.alloc = [](void* ctx) -> void* {
      auto* h = static_cast<FarHeap*>(ctx);
      return farmem_je_mallocx(FinePool::kSlab, h->flags_ | MALLOCX_ALIGN(FinePool::kSlab));
    };
    src.free = [](void* ctx, void* slab) {
      farmem_je_dallocx(slab, static_cast<FarHeap*>(ctx)->free_flags_);
    };
    src.rounds_to = [](void* ctx, size_t n) {
      return farmem_je_nallocx(n, static_cast<FarHeap*>(ctx)->flags_);
    };
    src.pressured = [](void* ctx) {
      auto* h = static_cast<FarHeap*>(ctx);
      // No budget to guard (purge_at 0): freed slots go as jemalloc's
      // pages do, by its decay, which never reaches them; keep them.
      return h->pressure_hi_ != 0 && h->pressured_.load(std::memory_order_relaxed);
    };
    src.drop = [](void* ctx, void* addr, size_t len) {
      (void)static_cast<FarHeap*>(ctx)->backing_->discard(addr, len);
    };
    src.unit = backing_->block_size();
    src.ctx = this;
    fine_ = std::make_unique<FinePool>(base_, size_, src);
    if (!fine_->ok()) fine_.reset();
  }
  char name[64];
  const uint64_t budget = backing_->budget_bytes();
  if (opts_.purge_at > 0 && opts_.purge_at <= 1 && budget > 0) {
    pressure_hi_ = static_cast<uint64_t>(opts_.purge_at * static_cast<double>(budget));
    if (pressure_hi_ == 0) pressure_hi_ = 1;
    pressure_lo_ = pressure_hi_ / 2;
  }
  // Gated: no decay until the budget is under pressure (check_pressure).
  ssize_t decay = pressure_hi_ != 0 ? -1 : opts_.dirty_decay_ms;
  snprintf(name, sizeof name, "arena.%u.dirty_decay_ms", arena_);
  err = farmem_je_mallctl(name, nullptr, nullptr, &decay, sizeof decay);
  if (err != 0) {
    return make_error(Errc::kInvalidArgument, "jemalloc: %s = %zd refused: %s", name, decay,
                      strerror(err));
  }
  ssize_t muzzy = 0;  // purge_lazy drops pages anyway: no second stage
  snprintf(name, sizeof name, "arena.%u.muzzy_decay_ms", arena_);
  (void)farmem_je_mallctl(name, nullptr, nullptr, &muzzy, sizeof muzzy);
  return ok_status();
}

FarHeap::~FarHeap() {
  if (!have_arena_) return;
  LocalScope local;
  fine_.reset();         // its slabs go with the arena
  flush_thread_cache();  // thread_cache: cached objects of the arena go back first
  char name[64];
  snprintf(name, sizeof name, "arena.%u.destroy", arena_);
  int err = farmem_je_mallctl(name, nullptr, nullptr, nullptr, 0);
  if (err != 0) FARMEM_LOG(kWarn, "jemalloc: %s failed: %s", name, strerror(err));
}

// Large allocations (jemalloc's large classes start at 16 KiB) are asked
// page-aligned. By default jemalloc starts each large allocation at a random
// cache-line offset inside an extra page ("cache-oblivious"; Debian's build
// has it on and 5.3 has no run-time switch), so an allocation of N pages
// touches N + 1: a 64 MiB table needs 16,385 blocks of a 16,384-block budget
// and every large buffer holds one block of budget more than its size. With
// page alignment jemalloc skips the offset, and the extra page it still
// reserves at the end is never touched, so it is never faulted in.
static constexpr size_t kLargeMin = 16 << 10;

int FarHeap::flags_for(size_t size) const noexcept {
  return size >= kLargeMin ? flags_ | MALLOCX_ALIGN(4096) : flags_;
}

void* FarHeap::alloc_raw(size_t size) noexcept {
  if (fine_ != nullptr) {
    const int c = fine_->class_of(size);
    if (c >= 0) {
      if (void* p = fine_->alloc(c)) return p;
    }
  }
  return farmem_je_mallocx(size == 0 ? 1 : size, flags_for(size));
}

void* FarHeap::alloc_zeroed(size_t size) noexcept {
  void* p = nullptr;
  const int c = fine_ != nullptr ? fine_->class_of(size) : -1;
  if (c >= 0 && (p = fine_->alloc(c)) != nullptr) {
    std::memset(p, 0, size);  // a slot may be reused
  } else {
    p = farmem_je_mallocx(size == 0 ? 1 : size, flags_for(size) | MALLOCX_ZERO);
  }
  populate(p, size);
  check_pressure();
  return p;
}

void* FarHeap::alloc_aligned(size_t alignment, size_t size, bool zero) noexcept {
  // Fine slots are 16-byte aligned (their sizes are multiples of 16).
  if (alignment <= 16 && fine_ != nullptr && fine_->class_of(size) >= 0) {
    return zero ? alloc_zeroed(size) : alloc(size);
  }
  if (size >= kLargeMin && alignment < 4096) alignment = 4096;  // see flags_for()
  void* p = farmem_je_mallocx(size == 0 ? 1 : size,
                              flags_ | MALLOCX_ALIGN(alignment) | (zero ? MALLOCX_ZERO : 0));
  populate(p, size);
  check_pressure();
  return p;
}

void* FarHeap::realloc(void* ptr, size_t size) noexcept {
  const bool fine = is_fine(ptr);
  const int to_class = fine_ != nullptr ? fine_->class_of(size) : -1;
  void* p = nullptr;
  if (!fine && to_class < 0 && size < kPopulateMin) {
    // The common case (a string growing by a few bytes): jemalloc's to
    // jemalloc's, nothing to populate, no large copy (old is not needed).
    p = farmem_je_rallocx(ptr, size == 0 ? 1 : size, flags_for(size));
    check_pressure();
    return p;
  }
  const size_t old = fine ? fine_->usable_size(ptr) : farmem_je_sallocx(ptr, 0);
  if (fine || to_class >= 0) {
    // Into or out of a fine class (or between two): a new object and a copy,
    // unless the slot already has the size's class.
    if (fine && to_class >= 0 && FinePool::class_size(to_class) == old) return ptr;
    p = alloc_raw(size);
    if (p == nullptr) return nullptr;
    std::memcpy(p, ptr, old < size ? old : size);
    free_raw(ptr);
  } else if (size > old && old >= kMoveMin) {
    p = grow_large(ptr, old, size);
  } else {
    p = farmem_je_rallocx(ptr, size == 0 ? 1 : size, flags_for(size));
  }
  // Growth: the new tail is what may be fresh (a block that moved had its
  // old bytes copied, which took their faults).
  if (p != nullptr && size > old) populate(static_cast<char*>(p) + old, size - old);
  check_pressure();
  return p;
}

// A large buffer that grows by realloc (a vector doubling: sqlite's sorter
// went 64 KiB -> 32 MiB twice in bench/eval's sqlite-mem) is where glibc moves
// pages with mremap: its old copy never sits next to the new one, and no
// page of it stays behind. jemalloc's rallocx copies and frees: for a
// moment both copies are resident, and the freed one stays resident
// (dirty) until budget pressure purges it, where the evictor may already
// have written live data back to make room. So: grow in place when the
// next pages are free; else copy a chunk at a time and drop each chunk of
// the old copy as soon as it is copied (it reads as zeros then: realloc
// has made it garbage anyway), so that residency never rises by more than
// a chunk and the old copy costs no budget once the call returns.
void* FarHeap::grow_large(void* ptr, size_t old, size_t size) noexcept {
  const int flags = flags_for(size);
  if (farmem_je_xallocx(ptr, size, 0, flags) >= size) return ptr;
  void* q = farmem_je_mallocx(size, flags);
  if (q == nullptr) return nullptr;
  auto* dst = static_cast<char*>(q);
  auto* src = static_cast<char*>(ptr);
  const uintptr_t bs = backing_->block_size();
  // Only whole blocks of the old copy can be dropped (offsets from the
  // region's base): a large allocation is page-aligned, but a block larger
  // than a page may hold a neighbour too.
  const uintptr_t lo = reinterpret_cast<uintptr_t>(src) - base_;
  const uintptr_t drop_hi = (lo + old) / bs * bs;
  uintptr_t dropped = (lo + bs - 1) / bs * bs;
  for (size_t off = 0; off < old;) {
    const size_t n = old - off < kMoveChunk ? old - off : kMoveChunk;
    // Every byte of the chunk is written next: mapping its never-written
    // blocks as zeros first is no guess (within the headroom, as always).
    if (opts_.populate_max != 0) {
      const size_t got = backing_->populate_zero(dst + off, n);
      if (got != 0) populated_.fetch_add(got, std::memory_order_relaxed);
    }
    std::memcpy(dst + off, src + off, n);
    off += n;
    const uintptr_t to = std::min<uintptr_t>(drop_hi, (lo + off) / bs * bs);
    if (to > dropped) {
      // A failure (a fork()ed child's inert backing) keeps the pages, as
      // jemalloc's purge does: the free below then leaves them dirty.
      (void)backing_->discard(reinterpret_cast<void*>(base_ + dropped), to - dropped);
      dropped = to;
    }
  }
  free_raw(ptr);
  return q;
}

void FarHeap::free_raw(void* ptr) noexcept {
  if (is_fine(ptr)) {
    fine_->free(ptr);
    return;
  }
  farmem_je_dallocx(ptr, free_flags_);
}

void FarHeap::flush_thread_cache() noexcept {
  if (!opts_.thread_cache) return;
  LocalScope local;
  (void)farmem_je_mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
}

// Runs on an application thread right after a far allocation or free
// returned (no jemalloc lock held), rarely: the thresholds have hysteresis.
void FarHeap::set_pressure(bool on) noexcept {
  LocalScope local;
  std::lock_guard<std::mutex> lk(pressure_mu_);
  if (pressured_.load(std::memory_order_relaxed) == on) return;  // another thread switched
  // A fork()ed child keeps every page (ExtentSpace refuses drops there).
  if (backing_->in_fork_child()) return;
  pressured_.store(on, std::memory_order_relaxed);
  char name[64];
  ssize_t decay = on ? opts_.dirty_decay_ms : -1;
  snprintf(name, sizeof name, "arena.%u.dirty_decay_ms", arena_);
  int err = farmem_je_mallctl(name, nullptr, nullptr, &decay, sizeof decay);
  if (err != 0) FARMEM_LOG(kWarn, "jemalloc: %s = %zd refused: %s", name, decay, strerror(err));
  if (!on) return;
  // Everything freed so far goes now: those pages are the cheapest to give
  // up (no write-back, no re-fetch), and the budget needs them.
  pressure_purges_.fetch_add(1, std::memory_order_relaxed);
  snprintf(name, sizeof name, "arena.%u.purge", arena_);
  (void)farmem_je_mallctl(name, nullptr, nullptr, nullptr, 0);
  if (fine_ != nullptr) fine_->purge();  // and the free slots' pages
}

size_t FarHeap::usable_size(const void* ptr) const noexcept {
  if (is_fine(ptr)) return fine_->usable_size(ptr);
  return farmem_je_sallocx(ptr, 0);
}

void FarHeap::purge() noexcept {
  LocalScope local;
  if (fine_ != nullptr) fine_->purge();
  char name[64];
  snprintf(name, sizeof name, "arena.%u.purge", arena_);
  (void)farmem_je_mallctl(name, nullptr, nullptr, nullptr, 0);
}

FarHeap::Stats FarHeap::stats() const {
  LocalScope local;
  Stats s;
  uint64_t epoch = 1;
  size_t sz = sizeof epoch;
  (void)farmem_je_mallctl("epoch", &epoch, &sz, &epoch, sz);
  auto get = [&](const char* leaf) -> uint64_t {
    char name[96];
    snprintf(name, sizeof name, "stats.arenas.%u.%s", arena_, leaf);
    size_t v = 0;
    size_t len = sizeof v;
    if (farmem_je_mallctl(name, &v, &len, nullptr, 0) != 0) return 0;
    return v;
  };
  auto get64 = [&](const char* leaf) -> uint64_t {
    char name[96];
    snprintf(name, sizeof name, "stats.arenas.%u.%s", arena_, leaf);
    uint64_t v = 0;
    size_t len = sizeof v;
    if (farmem_je_mallctl(name, &v, &len, nullptr, 0) != 0) return 0;
    return v;
  };
  s.allocated = get("small.allocated") + get("large.allocated");
  s.active = get("pactive") * 4096;
  s.dirty = get("pdirty") * 4096;
  s.nmalloc = get64("small.nmalloc") + get64("large.nmalloc");
  s.ndalloc = get64("small.ndalloc") + get64("large.ndalloc");
  s.pressure_purges = pressure_purges_.load(std::memory_order_relaxed);
  s.populated_blocks = populated_.load(std::memory_order_relaxed);
  s.under_pressure = pressured_.load(std::memory_order_relaxed);
  if (fine_ != nullptr) {
    // jemalloc sees each slab as one allocation: count its objects instead.
    s.fine = fine_->stats();
    const uint64_t slab_bytes = s.fine.slabs * FinePool::kSlab;
    s.allocated = (s.allocated > slab_bytes ? s.allocated - slab_bytes : 0) + s.fine.live_bytes;
  }
  return s;
}

}  // namespace farmem
