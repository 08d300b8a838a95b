// The finer size classes of the far heap (allocator/fine_pool.h): tighter
// than jemalloc's where they are used, byte-exact under eviction, churn and
// threads, freed slots dropped under budget pressure, bad frees fatal.
#include "allocator/fine_pool.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "allocator/far_heap.h"
#include "tests/allocator/far_heap_rig.h"

namespace farmem {
namespace {

using Rig = testing::FarHeapRig;

uint8_t pattern(size_t obj, size_t i) {
  return static_cast<uint8_t>((obj * 167 + i * 13 + (i >> 9)) & 0xff);
}

FarHeapOptions fine_options(bool fine, double purge_at = 0) {
  FarHeapOptions o = Rig::heap_options(-1, purge_at);
  o.fine_classes = fine;
  return o;
}

void fill(uint8_t* p, size_t n, size_t obj) {
  for (size_t i = 0; i < n; ++i) p[i] = pattern(obj, i);
}

bool intact(const uint8_t* p, size_t n, size_t obj) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != pattern(obj, i)) return false;
  }
  return true;
}

TEST(FinePool, ClassesFollowThirtySecondsOfAPowerOfTwo) {
  EXPECT_EQ(FinePool::class_size(0), 528u);
  EXPECT_EQ(FinePool::class_size(FinePool::kClasses - 1), 16384u);
  for (size_t n : {513u, 1000u, 1032u, 4097u, 4368u, 9000u, 14336u}) {
    // Each size's class: the smallest multiple of its step at or above it.
    size_t best = SIZE_MAX;
    for (int c = 0; c < FinePool::kClasses; ++c) {
      const size_t sz = FinePool::class_size(c);
      if (sz >= n && sz < best) best = sz;
    }
    EXPECT_LE(best - n, best / 32) << n;
  }
}

TEST(FarHeapFine, MidSizeObjectsTakeTighterSlots) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(Rig::pager_config(64 << 20), fine_options(true));
  void* a = r.heap->alloc(1032);
  void* b = r.heap->alloc(4368);
  void* c = r.heap->alloc(1280);  // jemalloc has this class exactly: not pooled
  void* d = r.heap->alloc(100);   // below the range
  ASSERT_TRUE(a && b && c && d);
  EXPECT_EQ(r.heap->usable_size(a), 1056u);
  EXPECT_EQ(r.heap->usable_size(b), 4480u);
  EXPECT_EQ(r.heap->usable_size(c), 1280u);
  EXPECT_EQ(r.heap->stats().fine.live, 2u);
  for (void* p : {a, b, c, d}) r.heap->free(p);
  EXPECT_EQ(r.heap->stats().fine.live, 0u);
}

// sqlite's page cache entry: 4368 bytes. jemalloc's class is 5120, ours
// 4480: the far heap's footprint for the same objects is ~13% smaller.
TEST(FarHeapFine, FootprintFollowsTheObjects) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kN = 3000, kSize = 4368;
  uint64_t resident[2] = {0, 0};
  for (int fine = 0; fine < 2; ++fine) {
    Rig r(Rig::pager_config(64 << 20), fine_options(fine == 1));
    std::vector<uint8_t*> objs;
    for (size_t o = 0; o < kN; ++o) {
      auto* p = static_cast<uint8_t*>(r.heap->alloc(kSize));
      ASSERT_NE(p, nullptr);
      fill(p, kSize, o);
      objs.push_back(p);
    }
    resident[fine] = r.pager->resident_bytes();
    for (size_t o = 0; o < kN; ++o) ASSERT_TRUE(intact(objs[o], kSize, o)) << o;
    for (uint8_t* p : objs) r.heap->free(p);
  }
  EXPECT_LE(resident[1], kN * 4480 * 103 / 100 + (256 << 10));
  EXPECT_LT(resident[1] * 100, resident[0] * 90) << resident[1] << " vs jemalloc " << resident[0];
}

// Random mallocs, frees and reallocs of pooled and other sizes through a
// budget far smaller than the data, with budget-pressure drops of free
// slots on: every live object reads back byte-exact.
TEST(FarHeapFine, ChurnUnderEvictionIsByteExact) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(Rig::pager_config(2 << 20), fine_options(true, 0.75));
  struct Obj {
    uint8_t* p;
    size_t n;
    size_t id;
  };
  std::vector<Obj> live;
  std::mt19937_64 rng(7);
  size_t next_id = 0;
  auto size = [&] {
    const uint64_t x = rng() % 10;
    if (x < 7) return 513 + rng() % (14336 - 512);  // pooled range
    if (x < 9) return 16 + rng() % 496;
    return 16384 + rng() % 65536;
  };
  for (int op = 0; op < 12000; ++op) {
    const uint64_t x = rng() % 10;
    if (x < 5 || live.size() < 16) {
      const size_t n = size();
      auto* p = static_cast<uint8_t*>(r.heap->alloc(n));
      ASSERT_NE(p, nullptr);
      fill(p, n, next_id);
      live.push_back({p, n, next_id++});
    } else if (x < 8) {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(intact(live[i].p, live[i].n, live[i].id)) << "before free, op " << op;
      r.heap->free(live[i].p);
      live[i] = live.back();
      live.pop_back();
    } else {
      Obj& o = live[rng() % live.size()];
      const size_t n = size();
      auto* q = static_cast<uint8_t*>(r.heap->realloc(o.p, n));
      ASSERT_NE(q, nullptr);
      ASSERT_TRUE(intact(q, std::min(n, o.n), o.id)) << "realloc " << o.n << " -> " << n;
      fill(q, n, o.id);
      o.p = q;
      o.n = n;
    }
  }
  for (const Obj& o : live) ASSERT_TRUE(intact(o.p, o.n, o.id)) << "object " << o.id;
  const PagerStats s = r.pager->stats();
  EXPECT_GT(s.faults_remote, 0u) << "the data did not page: the test proves nothing";
  EXPECT_LE(s.resident_peak_bytes, 2u << 20);
  EXPECT_GT(r.heap->stats().fine.dropped_units, 0u);
  for (const Obj& o : live) r.heap->free(o.p);
  EXPECT_EQ(r.heap->stats().fine.live, 0u);
}

// Under budget pressure the pages of freed slots are dropped (they read
// as zeros and cost no budget and no write-back), not evicted.
TEST(FarHeapFine, FreedSlotsAreDroppedUnderPressure) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(Rig::pager_config(16 << 20), fine_options(true, 0.5));
  constexpr size_t kSize = 1032, kN = 12000;  // 12.1 MiB of 1056-byte slots
  std::vector<uint8_t*> objs;
  for (size_t o = 0; o < kN; ++o) {
    auto* p = static_cast<uint8_t*>(r.heap->alloc(kSize));
    ASSERT_NE(p, nullptr);
    fill(p, kSize, o);
    objs.push_back(p);
  }
  ASSERT_TRUE(r.heap->stats().under_pressure);
  const uint64_t before = r.pager->resident_bytes();
  // Free all but every 64th object: most pages hold no live object then.
  for (size_t o = 0; o < kN; ++o) {
    if (o % 64 != 0) r.heap->free(objs[o]);
  }
  // Dropped until residency fell under half of purge_at (the hysteresis:
  // 4 MiB here), where pressure ends; with the slots kept it would stay.
  const uint64_t after = r.pager->resident_bytes();
  EXPECT_LE(after, (4u << 20) + (512u << 10)) << before << " -> " << after;
  EXPECT_GT(before, 3 * after);
  EXPECT_GT(r.heap->stats().fine.dropped_units, (before - after) / 4096 / 2);
  EXPECT_EQ(r.pager->stats().evictions_dirty, 0u) << "nothing was written back";
  for (size_t o = 0; o < kN; o += 64) ASSERT_TRUE(intact(objs[o], kSize, o)) << o;
  // Reused slots over dropped pages work like fresh ones.
  std::vector<uint8_t*> again;
  for (size_t o = 0; o < kN / 2; ++o) {
    auto* p = static_cast<uint8_t*>(r.heap->alloc(kSize));
    ASSERT_NE(p, nullptr);
    fill(p, kSize, kN + o);
    again.push_back(p);
  }
  for (size_t o = 0; o < again.size(); ++o) ASSERT_TRUE(intact(again[o], kSize, kN + o));
  for (size_t o = 0; o < kN; o += 64) ASSERT_TRUE(intact(objs[o], kSize, o)) << o;
  for (uint8_t* p : again) r.heap->free(p);
  for (size_t o = 0; o < kN; o += 64) r.heap->free(objs[o]);
}

TEST(FarHeapFine, ReallocMovesBetweenClassesAndKeepsBytes) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(Rig::pager_config(64 << 20), fine_options(true));
  auto* p = static_cast<uint8_t*>(r.heap->alloc(300));  // jemalloc
  ASSERT_NE(p, nullptr);
  fill(p, 300, 1);
  p = static_cast<uint8_t*>(r.heap->realloc(p, 1032));  // -> pooled
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(r.heap->usable_size(p), 1056u);
  ASSERT_TRUE(intact(p, 300, 1));
  fill(p, 1032, 2);
  EXPECT_EQ(r.heap->realloc(p, 1050), p) << "same class: in place";
  p = static_cast<uint8_t*>(r.heap->realloc(p, 4368));  // another class
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(intact(p, 1032, 2));
  fill(p, 4368, 3);
  p = static_cast<uint8_t*>(r.heap->realloc(p, 200000));  // -> jemalloc large
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(intact(p, 4368, 3));
  EXPECT_EQ(r.heap->stats().fine.live, 0u);
  r.heap->free(p);
}

TEST(FarHeapFine, ThreadsFreeEachOthersObjects) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(Rig::pager_config(8 << 20), fine_options(true, 0.75));
  constexpr int kThreads = 4, kRounds = 3000;
  std::mutex mu;
  std::vector<std::pair<uint8_t*, size_t>> handed;  // (object, id) for another thread
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < kRounds; ++i) {
        const size_t id = static_cast<size_t>(t) * kRounds + i;
        const size_t n = 513 + (id * 97) % 4000;
        auto* p = static_cast<uint8_t*>(r.heap->alloc(n));
        if (p == nullptr) {
          ADD_FAILURE() << "alloc";
          return;
        }
        fill(p, n, id);
        std::pair<uint8_t*, size_t> take{nullptr, 0};
        {
          std::lock_guard<std::mutex> lk(mu);
          handed.emplace_back(p, id);
          if (handed.size() > 64) {
            const size_t k = rng() % handed.size();
            take = handed[k];
            handed[k] = handed.back();
            handed.pop_back();
          }
        }
        if (take.first != nullptr) {
          const size_t tn = 513 + (take.second * 97) % 4000;
          if (!intact(take.first, tn, take.second)) ADD_FAILURE() << "object " << take.second;
          r.heap->free(take.first);
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  for (auto& [p, id] : handed) {
    EXPECT_TRUE(intact(p, 513 + (id * 97) % 4000, id)) << id;
    r.heap->free(p);
  }
  EXPECT_EQ(r.heap->stats().fine.live, 0u);
}

// fork() while other threads allocate and free in the fine classes: the
// child allocates and frees in the same classes (no class lock is left
// held there by a thread that does not exist in it; fails within the
// child's alarm without the pool's fork handlers).
TEST(FarHeapFine, ForkWhileThreadsAllocate) {
  FARMEM_SKIP_WITHOUT_UFFD();
  Rig r(Rig::pager_config(32 << 20), fine_options(true));
  if (!r.pager->fork_snapshots()) {
    GTEST_SKIP() << "no UFFD_FEATURE_EVENT_FORK for this process (CAP_SYS_PTRACE)";
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t) {
    ts.emplace_back([&] {
      std::vector<void*> v;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 64; ++i) v.push_back(r.heap->alloc(1032 + (i % 4) * 1000));
        for (void* p : v) r.heap->free(p);
        v.clear();
      }
    });
  }
  for (int f = 0; f < 40; ++f) {
    ASSERT_TRUE(r.pager->prepare_fork().ok());
    const pid_t pid = fork();
    if (pid == 0) {
      r.pager->fork_child();
      alarm(5);
      for (int i = 0; i < 4; ++i) {
        void* p = r.heap->alloc(1032 + i * 1000);
        if (p == nullptr) _exit(2);
        r.heap->free(p);
      }
      _exit(0);
    }
    r.pager->fork_parent();
    ASSERT_GT(pid, 0) << strerror(errno);
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "fork " << f << ": status " << st;
  }
  stop = true;
  for (auto& th : ts) th.join();
}

TEST(FarHeapFineDeath, DoubleFreeAndInteriorFreeAreFatal) {
  FARMEM_SKIP_WITHOUT_UFFD();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Rig r(Rig::pager_config(16 << 20), fine_options(true));
        void* p = r.heap->alloc(2000);
        r.heap->free(p);
        r.heap->free(p);
      },
      "double free");
  EXPECT_DEATH(
      {
        Rig r(Rig::pager_config(16 << 20), fine_options(true));
        auto* p = static_cast<char*>(r.heap->alloc(2000));
        r.heap->free(p + 16);
      },
      "not the start of an object");
}

}  // namespace
}  // namespace farmem
