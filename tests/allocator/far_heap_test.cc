// FarHeap on a real pager (loopback donor): jemalloc arena + extent hooks,
// data integrity under eviction, dropping of freed pages (invariant 2),
// metadata kept local.
#include "allocator/far_heap.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "far_heap_rig.h"
#include "pager/pager.h"
#include "pager/remote_map.h"
#include "pager/uffd.h"
#include "runtime/loopback_transport.h"

namespace farmem {
namespace {

using Rig = testing::FarHeapRig;
using P = Rig::P;

uint8_t pattern(size_t obj, size_t i) {
  return static_cast<uint8_t>((obj * 131 + i * 7 + (i >> 12)) & 0xff);
}

TEST(FarHeap, MetadataStaysLocal) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(16 << 20, 1000);
  // Creating the arena carved nothing: its metadata is in local memory.
  EXPECT_EQ(r.heap->space().stats().bump_bytes, 0u);
  EXPECT_EQ(r.heap->space().stats().allocs, 0u);
  void* p = r.heap->alloc(64);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(r.heap->contains(p));
  EXPECT_GT(r.heap->space().stats().allocs, 0u);
  // jemalloc's arena bookkeeping never faulted a far page in: the only
  // resident far page is the one the test touches now.
  EXPECT_EQ(r.pager->stats().faults_zero, 0u);
  memset(p, 1, 64);
  EXPECT_EQ(r.pager->stats().faults_zero, 1u);
  r.heap->free(p);
}

TEST(FarHeap, DataSurvivesEvictionByteExact) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(4 << 20, 1000);  // 4 MiB budget, 24 MiB of data
  constexpr size_t kObjs = 24, kSize = 1 << 20;
  std::vector<uint8_t*> objs;
  for (size_t o = 0; o < kObjs; ++o) {
    auto* p = static_cast<uint8_t*>(r.heap->alloc(kSize));
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(r.heap->contains(p));
    for (size_t i = 0; i < kSize; ++i) p[i] = pattern(o, i);
    objs.push_back(p);
  }
  for (size_t o = 0; o < kObjs; ++o) {
    for (size_t i = 0; i < kSize; ++i) {
      ASSERT_EQ(objs[o][i], pattern(o, i)) << "object " << o << " byte " << i;
    }
  }
  PagerStats s = r.pager->stats();
  EXPECT_GT(s.evictions_dirty, 0u);
  EXPECT_GT(s.faults_remote, 0u);
  EXPECT_LE(s.resident_peak_bytes, 4u << 20);
  for (uint8_t* p : objs) r.heap->free(p);
}

TEST(FarHeap, FreedPagesAreDroppedAndReadAsZeros) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(4 << 20, 0);  // decay 0: jemalloc purges on free
  constexpr size_t kSize = 2 << 20;
  std::vector<uint8_t*> objs;
  for (int o = 0; o < 8; ++o) {
    auto* p = static_cast<uint8_t*>(r.heap->alloc(kSize));
    ASSERT_NE(p, nullptr);
    memset(p, 0xee, kSize);
    objs.push_back(p);
  }
  EXPECT_GT(r.pager->stats().remote_bytes, 0u) << "16 MiB through a 4 MiB budget";
  for (uint8_t* p : objs) r.heap->free(p);
  r.heap->purge();
  PagerStats s = r.pager->stats();
  EXPECT_EQ(s.remote_bytes, 0u) << "freed memory keeps no remote space";
  // Nor local memory: no page of a freed object is mapped any more, and
  // what is (zero fault-around may map a few blocks past the end of an
  // object it saw written, which no allocation covers; at eviction they go
  // back to empty without I/O) reads as zeros.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* base = static_cast<uint8_t*>(r.pager->base());
  std::vector<unsigned char> in_core(r.pager->size() / page);
  ASSERT_EQ(mincore(base, r.pager->size(), in_core.data()), 0) << strerror(errno);
  for (size_t i = 0; i < in_core.size(); ++i) {
    if ((in_core[i] & 1) == 0) continue;
    uint8_t* pg = base + i * page;
    for (uint8_t* p : objs) {
      ASSERT_FALSE(pg >= p && pg < p + kSize)
          << "page " << static_cast<void*>(pg) << " of a freed object is still mapped";
    }
    for (size_t j = 0; j < page; ++j) ASSERT_EQ(pg[j], 0) << static_cast<void*>(pg + j);
  }
  EXPECT_LE(s.resident_bytes,
            objs.size() * r.pager->config().zero_fault_around * r.pager->block_size())
      << "freed memory keeps no local budget";
  ExtentSpace::Stats es = r.heap->space().stats();
  EXPECT_GT(es.dallocs + es.decommits + es.purges, 0u);
  // Memory jemalloc hands out again as zeroed really is zero.
  const uint64_t reads_before = r.pager->stats().reads;
  auto* z = static_cast<uint8_t*>(r.heap->alloc_zeroed(8 << 20));
  ASSERT_NE(z, nullptr);
  for (size_t i = 0; i < (8u << 20); ++i) ASSERT_EQ(z[i], 0) << "byte " << i;
  EXPECT_EQ(r.pager->stats().reads, reads_before) << "zeros come without network traffic";
  r.heap->free(z);
}

// A large allocation of N pages spans exactly N blocks of the budget:
// jemalloc's cache-oblivious offset (a random start inside an extra page)
// would make it span N + 1 (a 64 MiB table did not fit a 64 MiB budget).
TEST(FarHeap, LargeAllocationsArePageAligned) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(16 << 20, 1000);
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 4096 == 0; };
  std::vector<void*> live;
  for (size_t size : {size_t{16} << 10, size_t{20} << 10, size_t{1} << 20, size_t{5} << 20,
                      (size_t{3} << 20) + 100}) {
    void* p = r.heap->alloc(size);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(aligned(p)) << "alloc(" << size << ") = " << p;
    void* z = r.heap->alloc_zeroed(size);
    ASSERT_NE(z, nullptr);
    EXPECT_TRUE(aligned(z)) << "alloc_zeroed(" << size << ") = " << z;
    void* a = r.heap->alloc_aligned(64, size);
    ASSERT_NE(a, nullptr);
    EXPECT_TRUE(aligned(a)) << "alloc_aligned(64, " << size << ") = " << a;
    live.insert(live.end(), {p, z, a});
  }
  // Growing a small allocation into a large one moves it to an aligned one,
  // contents intact.
  auto* g = static_cast<uint8_t*>(r.heap->alloc(3000));
  ASSERT_NE(g, nullptr);
  for (size_t i = 0; i < 3000; ++i) g[i] = pattern(7, i);
  g = static_cast<uint8_t*>(r.heap->realloc(g, 200 << 10));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(aligned(g)) << static_cast<void*>(g);
  for (size_t i = 0; i < 3000; ++i) ASSERT_EQ(g[i], pattern(7, i)) << i;
  live.push_back(g);
  // Small allocations keep jemalloc's packing: many fit one page.
  void* s1 = r.heap->alloc(48);
  void* s2 = r.heap->alloc(48);
  ASSERT_NE(s1, nullptr);
  ASSERT_NE(s2, nullptr);
  EXPECT_FALSE(aligned(s1) && aligned(s2)) << s1 << " " << s2;
  live.insert(live.end(), {s1, s2});
  for (void* p : live) r.heap->free(p);
}

TEST(FarHeap, ReallocAlignedAndUsableSize) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(16 << 20, 1000);
  auto* p = static_cast<uint8_t*>(r.heap->alloc(100000));
  ASSERT_NE(p, nullptr);
  EXPECT_GE(r.heap->usable_size(p), 100000u);
  for (size_t i = 0; i < 100000; ++i) p[i] = pattern(1, i);
  p = static_cast<uint8_t*>(r.heap->realloc(p, 5 << 20));
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(r.heap->contains(p));
  for (size_t i = 0; i < 100000; ++i) ASSERT_EQ(p[i], pattern(1, i));
  r.heap->free(p);
  void* a = r.heap->alloc_aligned(1 << 21, 3 << 20);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % (1 << 21), 0u);
  r.heap->free(a);
  EXPECT_EQ(r.heap->alloc(1ull << 40), nullptr) << "larger than the region: nullptr, no throw";
}

// A buffer that grows by realloc (a vector doubling, as sqlite's sorter
// does) leaves no old copy resident: each chunk of it is dropped as soon as
// it is copied (FarHeap::grow_large), where jemalloc's rallocx kept the old
// copy next to the new one and then, freed but unpurged, resident.
TEST(FarHeap, GrowingReallocLeavesNoOldCopyResident) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(96 << 20, -1);  // decay off: a freed page would stay resident
  size_t size = 512 << 10;
  auto* p = static_cast<uint8_t*>(r.heap->alloc(size));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < size; ++i) p[i] = pattern(2, i);
  int moved = 0;
  while (size < (16u << 20)) {
    const size_t next = size * 2;
    auto* q = static_cast<uint8_t*>(r.heap->realloc(p, next));
    ASSERT_NE(q, nullptr);
    moved += q != p;
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(q[i], pattern(2, i)) << next << " byte " << i;
    for (size_t i = size; i < next; ++i) q[i] = pattern(2, i);
    p = q;
    size = next;
    // The live buffer, and a chunk of fault-around slack; the old copies
    // (8 + 4 + 2 + 1 + 0.5 MiB by 16 MiB) would add up to twice as much.
    EXPECT_LE(r.pager->resident_bytes(), size + (1u << 20)) << "at " << size;
  }
  EXPECT_GT(moved, 0) << "no step copied: the test did not exercise the copy";
  // At no moment were two copies resident: at most the last copy's target,
  // its source's last chunk and the slack.
  EXPECT_LE(r.pager->stats().resident_peak_bytes, size + (2u << 20));
  r.heap->free(p);
}

// The same chain through a budget a quarter of its size: the copy reads
// evicted blocks back and its target is evicted in turn, byte-exact.
TEST(FarHeap, GrowingReallocByteExactUnderEviction) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(4 << 20, 1000, 0.75);
  size_t size = 1 << 20;
  auto* p = static_cast<uint8_t*>(r.heap->alloc(size));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < size; ++i) p[i] = pattern(3, i);
  while (size < (16u << 20)) {
    const size_t next = size * 2;
    auto* q = static_cast<uint8_t*>(r.heap->realloc(p, next));
    ASSERT_NE(q, nullptr);
    for (size_t i = size; i < next; ++i) q[i] = pattern(3, i);
    p = q;
    size = next;
  }
  for (size_t i = 0; i < size; ++i) ASSERT_EQ(p[i], pattern(3, i)) << "byte " << i;
  PagerStats s = r.pager->stats();
  EXPECT_GT(s.faults_remote, 0u);
  EXPECT_LE(s.resident_peak_bytes, 4u << 20);
  r.heap->free(p);
}

// With blocks larger than a page, a large allocation may share its first
// and last blocks with neighbours: those are copied but never dropped.
TEST(FarHeap, GrowingReallocSparesNeighboursInSharedBlocks) {
  FARMEM_SKIP_WITHOUT_UFFD();
  PagerConfig c = Rig::pager_config(32 << 20);
  c.block_size = 64 << 10;
  FarHeapOptions o = Rig::heap_options(-1, 0);
  Rig r(c, o);
  std::vector<uint8_t*> others;
  size_t size = 300 << 10;  // not a multiple of the block
  auto* p = static_cast<uint8_t*>(r.heap->alloc(size));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < size; ++i) p[i] = pattern(4, i);
  constexpr size_t kOther = 20 << 10;  // large (page-granular), under a block
  for (int step = 0; step < 6; ++step) {
    for (int k = 0; k < 8; ++k) {  // neighbours on both sides of each copy
      auto* x = static_cast<uint8_t*>(r.heap->alloc(kOther));
      ASSERT_NE(x, nullptr);
      for (size_t i = 0; i < kOther; ++i) x[i] = pattern(100 + others.size(), i);
      others.push_back(x);
    }
    const size_t next = size * 2 + (12 << 10);
    auto* q = static_cast<uint8_t*>(r.heap->realloc(p, next));
    ASSERT_NE(q, nullptr);
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(q[i], pattern(4, i)) << next << " byte " << i;
    for (size_t i = size; i < next; ++i) q[i] = pattern(4, i);
    p = q;
    size = next;
    for (size_t o2 = 0; o2 < others.size(); ++o2) {
      for (size_t i = 0; i < kOther; ++i) {
        ASSERT_EQ(others[o2][i], pattern(100 + o2, i)) << "neighbour " << o2 << " byte " << i;
      }
    }
  }
  for (uint8_t* x : others) r.heap->free(x);
  r.heap->free(p);
}

TEST(FarHeap, ThreadsAllocateConcurrently) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(8 << 20, 100);
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::vector<std::pair<uint8_t*, size_t>> live;
      for (int k = 0; k < 400; ++k) {
        size_t n = 1000 + static_cast<size_t>((k * 7919 + t * 104729) % 60000);
        auto* p = static_cast<uint8_t*>(r.heap->alloc(n));
        if (!p) {
          bad++;
          continue;
        }
        memset(p, t * 16 + (k & 15), n);
        live.emplace_back(p, n);
        if (live.size() > 20) {
          auto [q, m] = live.front();
          live.erase(live.begin());
          const uint8_t want = q[0];
          for (size_t i = 0; i < m; i += 97) {
            if (q[i] != want) bad++;
          }
          r.heap->free(q);
        }
      }
      for (auto [q, m] : live) r.heap->free(q);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(r.heap->stats().allocated, 0u);
}

// FarHeapOptions::thread_cache (the preload library's heap): small objects
// through jemalloc's thread caches, freed on the other thread half of the
// time, with a budget small enough that their pages are evicted and read
// back; every object comes from the region and keeps its bytes.
TEST(FarHeap, ThreadCacheSmallObjectsAcrossThreads) {
  FARMEM_SKIP_WITHOUT_UFFD();
  FarHeapOptions o = testing::FarHeapRig::heap_options(100, 0);
  o.thread_cache = true;
  testing::FarHeapRig r(testing::FarHeapRig::pager_config(2 << 20), o);
  std::atomic<int> bad{0};
  std::mutex mu;
  std::vector<std::pair<uint8_t*, size_t>> handed;  // freed by the other thread
  auto check = [&](uint8_t* q, size_t m) {
    for (size_t i = 0; i < m; ++i) {
      if (q[i] != static_cast<uint8_t>((reinterpret_cast<uintptr_t>(q) >> 4) + i)) {
        bad++;
        return;
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t) {
    ts.emplace_back([&, t] {
      std::vector<std::pair<uint8_t*, size_t>> live;
      for (int k = 0; k < 60000; ++k) {
        const size_t n = 16 + static_cast<size_t>((k * 7919 + t * 104729) % 500);
        auto* p = static_cast<uint8_t*>(r.heap->alloc(n));
        if (p == nullptr || !r.heap->contains(p) || r.heap->usable_size(p) < n) {
          bad++;
          continue;
        }
        for (size_t i = 0; i < n; ++i) {
          p[i] = static_cast<uint8_t>((reinterpret_cast<uintptr_t>(p) >> 4) + i);
        }
        live.emplace_back(p, n);
        if (k % 3 == 0) {  // a third of the objects die young, half of them elsewhere
          auto [q, m] = live[live.size() / 2];
          live[live.size() / 2] = live.back();
          live.pop_back();
          check(q, m);
          if (k % 2 == 0) {
            r.heap->free(q);
          } else {
            std::lock_guard<std::mutex> lk(mu);
            handed.emplace_back(q, m);
          }
        }
        if (k % 64 == 0) {
          std::lock_guard<std::mutex> lk(mu);
          for (auto [q, m] : handed) r.heap->free(q);
          handed.clear();
        }
      }
      for (auto [q, m] : live) {
        check(q, m);
        r.heap->free(q);
      }
    });
  }
  for (auto& t : ts) t.join();
  for (auto [q, m] : handed) r.heap->free(q);
  r.heap->flush_thread_cache();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(r.pager->stats().evictions_dirty, 0u);  // the objects really left
  EXPECT_EQ(r.heap->stats().allocated, 0u);
}

}  // namespace
}  // namespace farmem
