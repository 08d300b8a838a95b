// Finer size classes for mid-size far objects (FarHeap, far_heap.h).
//
//   FinePool pool(base, region_size, {&slab_alloc, &slab_free, ctx});
//   int c = pool.class_of(4368);          // -1: jemalloc's class is as good
//   void* p = pool.alloc(c);              // a 4480-byte slot
//   if (pool.owns(p)) pool.free(p);
//
// Why: jemalloc has four size classes per doubling, so an object just
// above a power of two wastes up to a quarter of itself: 1032 bytes take a
// 1280-byte slot, 4368 (sqlite's page cache entry: a 4 KiB page and its
// header) a 5120-byte one. glibc rounds to 16 bytes. Under the preload
// library that slack is far memory like any other: at a budget equal to
// what the program needs under glibc, sqlite-mem's 145 MB of live objects
// took 174 MB of slots and the evictor wrote the difference to the donor.
// Here a size in (kMin, kMax] rounds up to a step of 1/32 of its power of
// two (1032 -> 1056, 4368 -> 4480: about 2.5% at most 3%), and only the
// classes jemalloc would round up get a pool (class_of() returns -1 for the
// rest: jemalloc's thread caches are faster).
//
// A class's objects live in slabs of kSlab bytes, each a kSlab-aligned
// jemalloc allocation of the far heap (so owns() is one load from a table
// indexed by the address's slab number). Slab metadata (the free map) is
// local memory: a free never touches the far object, so freeing an evicted
// object fetches nothing. A slot is taken lowest-address first, so a slab
// fills (and faults its pages in) from its start. A slab whose last object
// is freed goes back to jemalloc (which purges it under budget pressure
// and reuses it for any size), but one empty slab a class, kMaxKept in all,
// is kept against a free / malloc ping-pong.
// One mutex per class; the slow path (a new slab) takes jemalloc's locks
// under it, never the other way round. fork(): the first pool registers
// pthread_atfork handlers (after jemalloc has registered its own, so that
// its prepare handler runs first) that hold every class lock of every live
// pool across the fork, so that a child never inherits a class half
// updated or locked by a thread that does not exist there.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace farmem {

class FinePool {
 public:
  static constexpr size_t kMin = 512;    // sizes above this ...
  static constexpr size_t kMax = 14336;  // ... up to jemalloc's largest small class
  static constexpr size_t kSlab = 256 << 10;
  static constexpr int kSlabShift = 18;
  static constexpr int kSteps = 32;            // classes per doubling
  static constexpr int kClasses = 5 * kSteps;  // (512, 16384]

  struct SlabSource {
    void* (*alloc)(void* ctx);  // kSlab bytes, kSlab-aligned; nullptr: none left
    void (*free)(void* ctx, void* slab);
    // The size class the fallback allocator (jemalloc) would give n bytes.
    size_t (*rounds_to)(void* ctx, size_t n);
    // Whether freed memory should go now (the budget is under pressure),
    // and the call that drops [addr, addr+len) (whole units of unit bytes,
    // the backing's block; 0: never drop).
    bool (*pressured)(void* ctx);
    void (*drop)(void* ctx, void* addr, size_t len);
    size_t unit;
    void* ctx;
  };

  // [base, base+size) is the far region every slab lies in.
  FinePool(uintptr_t base, size_t size, const SlabSource& src);
  ~FinePool();  // the slabs themselves go with the heap's arena
  FinePool(const FinePool&) = delete;
  FinePool& operator=(const FinePool&) = delete;
  bool ok() const { return table_ != nullptr; }

  // The class of an n-byte object, or -1 (no pool: n out of range, or
  // jemalloc's own class for it is as tight).
  int class_of(size_t n) const noexcept {
    if (n <= kMin || n > kMax) return -1;
    const int c = raw_class(n);
    return use_[c] ? c : -1;
  }
  static size_t class_size(int c) noexcept {
    const int lg = 9 + c / kSteps;
    return (size_t{1} << lg) + (size_t{1} << (lg - 5)) * static_cast<size_t>(c % kSteps + 1);
  }
  void* alloc(int c) noexcept;  // nullptr when no slab can be had

  bool owns(const void* p) const noexcept { return slab_of(p) != nullptr; }
  // p: a live object of the pool (owns(p)). Fatal on a pointer that is not
  // one (inside a slot, or freed already).
  void free(void* p) noexcept;
  size_t usable_size(const void* p) const noexcept;
  // Drops every unit (page) of every slab that holds no live object and
  // was not dropped already: freed slots are garbage, and under budget
  // pressure they must not cost a write-back. free() does the same for the
  // units around the slot it frees while src.pressured() holds; this is the
  // sweep for when pressure starts.
  void purge() noexcept;

  struct Stats {
    uint64_t slabs = 0;          // slabs held now (in use or kept empty)
    uint64_t live = 0;           // objects allocated now
    uint64_t live_bytes = 0;     // ... in their slots' sizes
    uint64_t dropped_units = 0;  // free units dropped, all told
  };
  Stats stats() const noexcept;

 private:
  struct Slab;
  static void prefork() noexcept;
  static void postfork() noexcept;
  FinePool* next_pool_ = nullptr;  // the live pools (the fork handlers' list)
  struct Class {
    std::mutex mu;
    uint32_t size = 0;
    uint32_t nslots = 0;
    Slab* partial = nullptr;  // slabs with a free slot, doubly linked
    Slab* empty = nullptr;    // the one empty slab kept (also on partial)
    uint64_t live = 0;        // objects allocated now
    uint64_t slabs = 0;       // slabs held
    uint64_t dropped = 0;     // units dropped
  };
  static int raw_class(size_t n) noexcept {
    const int lg = 63 - __builtin_clzll(static_cast<unsigned long long>(n - 1));  // 9..13
    const size_t step = size_t{1} << (lg - 5);
    const size_t k = (n - (size_t{1} << lg) + step - 1) / step;  // 1..32
    return (lg - 9) * kSteps + static_cast<int>(k) - 1;
  }
  Slab* slab_of(const void* p) const noexcept {
    const uintptr_t i = (reinterpret_cast<uintptr_t>(p) >> kSlabShift) - first_slab_;
    return i < n_slabs_ ? table_[i].load(std::memory_order_acquire) : nullptr;
  }
  Slab* new_slab(int c) noexcept;  // with classes_[c].mu held
  static void unlink(Class& k, Slab* s) noexcept;
  // Drops the free, undropped units of s that slots [lo, hi] overlap.
  void drop_free_units(Class& k, Slab* s, uint32_t lo, uint32_t hi) noexcept;
  static void push(Class& k, Slab* s) noexcept;

  const SlabSource src_;
  uintptr_t first_slab_ = 0;  // base >> kSlabShift
  size_t n_slabs_ = 0;
  std::atomic<Slab*>* table_ = nullptr;  // lazily backed mapping, n_slabs_ entries
  size_t table_bytes_ = 0;
  size_t unit_ = 0;  // 0: no drops (the backing's block is too large)
  bool use_[kClasses] = {};
  Class classes_[kClasses];
  // Empty slabs kept, over all classes: at most kMaxKept (2 MiB), so that
  // a program touching many classes once does not keep a slab of each.
  static constexpr int kMaxKept = 8;
  std::atomic<int> kept_{0};
};

}  // namespace farmem
