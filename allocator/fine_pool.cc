#include "allocator/fine_pool.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "allocator/local_scope.h"
#include "runtime/log.h"

namespace farmem {

namespace {
std::mutex g_pools_mu;        // guards g_pools; held across a fork
FinePool* g_pools = nullptr;  // live pools, linked through next_pool_
std::once_flag g_atfork_once;
}  // namespace

// Every class lock of every pool, in one order, so that no thread is
// inside a pool (or waits in one for jemalloc) while the process forks.
void FinePool::prefork() noexcept {
  g_pools_mu.lock();
  for (FinePool* p = g_pools; p != nullptr; p = p->next_pool_) {
    for (Class& k : p->classes_) k.mu.lock();
  }
}

// Parent and child alike: the forking thread owns every lock it took.
void FinePool::postfork() noexcept {
  for (FinePool* p = g_pools; p != nullptr; p = p->next_pool_) {
    for (Class& k : p->classes_) k.mu.unlock();
  }
  g_pools_mu.unlock();
}

// Local memory. Slot i is free when bit i of free_map is set.
struct FinePool::Slab {
  char* base = nullptr;
  Slab* prev = nullptr;
  Slab* next = nullptr;
  uint32_t cls = 0;
  uint32_t nfree = 0;
  uint64_t dropped = 0;  // bit u: unit u was dropped and no slot over it taken since
  static constexpr uint32_t kWords = kSlab / (kMin + 16) / 64 + 1;  // 496 slots at most
  uint64_t free_map[kWords] = {};
};

FinePool::FinePool(uintptr_t base, size_t size, const SlabSource& src) : src_(src) {
  first_slab_ = base >> kSlabShift;
  n_slabs_ = ((base + size + kSlab - 1) >> kSlabShift) - first_slab_;
  table_bytes_ = n_slabs_ * sizeof(std::atomic<Slab*>);
  void* t = mmap(nullptr, table_bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (t == MAP_FAILED) {
    FARMEM_LOG(kWarn, "far heap: no table for the fine size classes (%s); jemalloc's classes only",
               strerror(errno));
    return;
  }
  table_ = static_cast<std::atomic<Slab*>*>(t);  // zero-filled: every entry nullptr
  if (src_.unit != 0 && kSlab % src_.unit == 0 && kSlab / src_.unit <= 64 &&
      src_.unit <= kSlab / 8) {
    unit_ = src_.unit;
  }
  for (int c = 0; c < kClasses; ++c) {
    const size_t sz = class_size(c);
    classes_[c].size = static_cast<uint32_t>(sz);
    classes_[c].nslots = static_cast<uint32_t>(kSlab / sz);
    // Worth a pool when a slot, with its share of the slab's tail, is
    // still smaller than jemalloc's class for the size.
    use_[c] = kSlab / classes_[c].nslots < src_.rounds_to(src_.ctx, sz);
  }
  std::call_once(g_atfork_once, [] {
    if (pthread_atfork(&prefork, &postfork, &postfork) != 0) {
      FARMEM_LOG(kWarn,
                 "far heap: pthread_atfork failed: a fork() while another thread "
                 "allocates may leave the child's fine size classes locked");
    }
  });
  std::lock_guard<std::mutex> lk(g_pools_mu);
  next_pool_ = g_pools;
  g_pools = this;
}

FinePool::~FinePool() {
  LocalScope local;
  if (table_ != nullptr) {
    std::lock_guard<std::mutex> lk(g_pools_mu);
    for (FinePool** p = &g_pools; *p != nullptr; p = &(*p)->next_pool_) {
      if (*p == this) {
        *p = next_pool_;
        break;
      }
    }
  }
  // Every slab, full or not, has its entry in the table (full slabs are on
  // no list).
  if (table_ == nullptr) return;
  for (size_t i = 0; i < n_slabs_; ++i) delete table_[i].load(std::memory_order_relaxed);
  munmap(table_, table_bytes_);
}

void FinePool::unlink(Class& k, Slab* s) noexcept {
  if (s->prev != nullptr)
    s->prev->next = s->next;
  else
    k.partial = s->next;
  if (s->next != nullptr) s->next->prev = s->prev;
  s->prev = s->next = nullptr;
}

void FinePool::push(Class& k, Slab* s) noexcept {
  s->prev = nullptr;
  s->next = k.partial;
  if (k.partial != nullptr) k.partial->prev = s;
  k.partial = s;
}

FinePool::Slab* FinePool::new_slab(int c) noexcept {
  Class& k = classes_[c];
  void* mem = src_.alloc(src_.ctx);
  if (mem == nullptr) return nullptr;
  const uintptr_t at = (reinterpret_cast<uintptr_t>(mem) >> kSlabShift) - first_slab_;
  FARMEM_BUG_ON(at >= n_slabs_);  // the far arena allocates inside the region only
  Slab* s;
  {
    LocalScope local;
    s = new (std::nothrow) Slab;
  }
  if (s == nullptr) {
    src_.free(src_.ctx, mem);
    return nullptr;
  }
  s->base = static_cast<char*>(mem);
  s->cls = static_cast<uint32_t>(c);
  s->nfree = k.nslots;
  for (uint32_t i = 0; i < k.nslots; ++i) s->free_map[i / 64] |= uint64_t{1} << (i % 64);
  table_[at].store(s, std::memory_order_release);
  push(k, s);
  ++k.slabs;
  return s;
}

void* FinePool::alloc(int c) noexcept {
  Class& k = classes_[c];
  std::lock_guard<std::mutex> lk(k.mu);
  Slab* s = k.partial;
  if (s == nullptr && (s = new_slab(c)) == nullptr) return nullptr;
  if (s == k.empty) {
    k.empty = nullptr;
    kept_.fetch_sub(1, std::memory_order_relaxed);
  }
  uint32_t w = 0;
  while (s->free_map[w] == 0) ++w;  // nfree > 0: a bit is set
  const uint32_t i = w * 64 + static_cast<uint32_t>(__builtin_ctzll(s->free_map[w]));
  s->free_map[w] &= s->free_map[w] - 1;
  if (--s->nfree == 0) unlink(k, s);
  if (s->dropped != 0) {  // the slot's units are in use again
    const size_t a = size_t{i} * k.size, b = a + k.size - 1;
    for (size_t u = a / unit_; u <= b / unit_; ++u) s->dropped &= ~(uint64_t{1} << u);
  }
  ++k.live;
  return s->base + size_t{i} * k.size;
}

void FinePool::free(void* p) noexcept {
  Slab* s = slab_of(p);
  if (s == nullptr) fatal("BUG: FinePool::free(%p): not in a slab of the pool", p);
  Class& k = classes_[s->cls];
  const size_t off = static_cast<size_t>(static_cast<char*>(p) - s->base);
  const uint32_t i = static_cast<uint32_t>(off / k.size);
  if (off % k.size != 0 || i >= k.nslots) {
    fatal("free(%p): not the start of an object of the far heap (inside a %u-byte slot)", p,
          k.size);
  }
  Slab* drop = nullptr;
  {
    std::lock_guard<std::mutex> lk(k.mu);
    uint64_t& word = s->free_map[i / 64];
    const uint64_t bit = uint64_t{1} << (i % 64);
    if (word & bit) fatal("free(%p): the far-heap object was freed already (double free)", p);
    word |= bit;
    --k.live;
    if (s->nfree++ == 0) push(k, s);
    if (s->nfree == k.nslots) {
      if (k.empty == nullptr && kept_.fetch_add(1, std::memory_order_relaxed) < kMaxKept) {
        k.empty = s;  // kept (on partial) for the next malloc of the class
      } else {
        if (k.empty == nullptr) kept_.fetch_sub(1, std::memory_order_relaxed);  // over the cap
        unlink(k, s);
        table_[(reinterpret_cast<uintptr_t>(s->base) >> kSlabShift) - first_slab_].store(
            nullptr, std::memory_order_release);
        --k.slabs;
        drop = s;
      }
    }
    if (drop == nullptr && unit_ != 0 && src_.pressured(src_.ctx)) drop_free_units(k, s, i, i);
  }
  if (drop != nullptr) {
    src_.free(src_.ctx, drop->base);
    LocalScope local;
    delete drop;
  }
}

// A unit is free when every slot that overlaps it is (the slab's tail past
// its last slot is never handed out). Runs of such units go in one drop.
void FinePool::drop_free_units(Class& k, Slab* s, uint32_t lo, uint32_t hi) noexcept {
  const size_t first = size_t{lo} * k.size / unit_;
  const size_t last = (size_t{hi} * k.size + k.size - 1) / unit_;
  auto is_free = [&](size_t u) {
    if (s->dropped & (uint64_t{1} << u)) return false;  // gone already
    const size_t a = u * unit_;
    if (a >= size_t{k.nslots} * k.size) return false;  // the tail: never touched
    const uint32_t i0 = static_cast<uint32_t>(a / k.size);
    const uint32_t i1 =
        static_cast<uint32_t>(std::min<size_t>((a + unit_ - 1) / k.size, size_t{k.nslots} - 1));
    for (uint32_t i = i0; i <= i1; ++i) {
      if (!(s->free_map[i / 64] & (uint64_t{1} << (i % 64)))) return false;
    }
    return true;
  };
  size_t run = 0;
  for (size_t u = first; u <= last + 1; ++u) {
    if (u <= last && is_free(u)) {
      ++run;
      continue;
    }
    if (run == 0) continue;
    const size_t u0 = u - run;
    src_.drop(src_.ctx, s->base + u0 * unit_, run * unit_);
    for (size_t v = u0; v < u; ++v) s->dropped |= uint64_t{1} << v;
    k.dropped += run;
    run = 0;
  }
}

void FinePool::purge() noexcept {
  if (unit_ == 0) return;
  for (Class& k : classes_) {
    std::lock_guard<std::mutex> lk(k.mu);
    for (Slab* s = k.partial; s != nullptr; s = s->next) drop_free_units(k, s, 0, k.nslots - 1);
  }
}

size_t FinePool::usable_size(const void* p) const noexcept {
  const Slab* s = slab_of(p);
  if (s == nullptr) fatal("BUG: FinePool::usable_size(%p): not in a slab of the pool", p);
  return classes_[s->cls].size;
}

FinePool::Stats FinePool::stats() const noexcept {
  Stats st;
  for (const Class& k : classes_) {
    std::lock_guard<std::mutex> lk(const_cast<std::mutex&>(k.mu));
    st.slabs += k.slabs;
    st.live += k.live;
    st.live_bytes += k.live * k.size;
    st.dropped_units += k.dropped;
  }
  return st;
}

}  // namespace farmem
