// malloc/free throughput: glibc vs the far heap (FarHeap on a loopback
// pager with a budget that holds everything, so this measures the
// allocator path, not paging) vs plain jemalloc: Debian's libjemalloc 5.3.0
// (the private copy of its libjemalloc_pic.a, allocator/CMakeLists.txt),
// default arena with its thread cache, mallocx. Sizes around FARMEM_MIN_FAR.
// BM_X: 64 x (malloc, write 1 byte), 64 x free; BM_XTouch: the same but
// every byte written (the FARMEM_MIN_FAR measurement, allocator/options.cc).
//
//   build/bench/farmem_bench_alloc --benchmark_min_time=0.1 --benchmark_repetitions=5
//
// Measured (2 cores shared with other jobs, load average ~7, so +-30%;
// items/s, median of 5; 2T = two threads, each its own batch):
//   size   glibc 1T  jemalloc 1T  far 1T | glibc 2T  jemalloc 2T  far 2T
//   64       105.5M       18.3M   17.5M  |   51.8M       1.45M    874k
//   1K        29.5M       10.8M   11.2M  |   30.1M       1.04M    674k
//   4K         143k        5.1M    3.6M  |    110k        293k    291k
//   16K         76k        3.4M    2.9M  |     67k        807k    207k
//   32K         74k        2.5M     38k* |     72k        1.6M    251k
//   64K         62k        3.0M    1.2M  |     53k        213k    224k
//   1M          44k         82k    3.1M  |     20k         99k    266k
// glibc from 4K up: freeing the batch gives 256K+ back to the top chunk,
// over M_TRIM_THRESHOLD, so every round trims and refaults the heap (and
// 1M blocks are mmap/munmap each time); jemalloc 1M: purged (decay) and
// refaulted. The far heap keeps its extents (its decay purges them after
// FARMEM_DECAY_MS). *: a decay storm, see below. 2T on two loaded cores
// mostly measures scheduling. Touch (1T, every byte written; these run
// after BM_Glibc/1M, whose freed mmap chunk raised glibc's dynamic mmap
// threshold to 1M and trim threshold to 2M: glibc trims only from 64K):
//   size   glibc   jemalloc   far      size   glibc   jemalloc   far
//   1K     21.4M    8.6M      5.6M     16K    4.2M    1.5M       1.9M
//   2K     17.8M    5.9M      3.9M     24K    3.0M    1.3M       1.4M
//   4K     10.7M    3.5M      4.5M     32K    2.3M    1.3M       4k*
//   8K      7.2M    2.9M      3.3M     64K    4k      673k       1k*
//   12K     5.3M    2.9M      2.7M     256K   1k      165k       0.2k*
// *: the far heap's decay storm: a batch freed and reallocated at once
// looks idle to jemalloc's decay (dirty pages counted at the instants it
// samples), so after FARMEM_DECAY_MS it purges the reused working set each
// epoch (decay/200) and every page is refaulted through userfaultfd; once
// a round is slower than an epoch, every round is purged. Not a bench
// artefact: any program that frees and reallocates the same large blocks
// under the preload library meets it (a pager/decay-policy fix is needed).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "allocator/far_runtime.h"
#include "allocator/je.h"
#include "pager/uffd.h"

namespace {

farmem::FarRuntime* runtime() {
  static std::unique_ptr<farmem::FarRuntime> rt = [] {
    farmem::FarOptions o;
    o.transport = farmem::FarTransport::kLoopback;
    o.loopback_capacity = 1ull << 30;
    o.pager.local_budget = 768ull << 20;
    auto r = farmem::FarRuntime::start(o);
    return r.ok() ? std::move(*r) : nullptr;
  }();
  return rt.get();
}

// The preload library's heap: jemalloc's thread caches on the far arena
// (FarOptions::thread_cache). Its own runtime: a process may have one such
// heap only (far_heap.h), and BM_Jemalloc's default arena uses the same
// automatic caches, so each benchmark using it flushes its thread's cache
// before and after.
farmem::FarRuntime* cached_runtime() {
  static std::unique_ptr<farmem::FarRuntime> rt = [] {
    farmem::FarOptions o;
    o.transport = farmem::FarTransport::kLoopback;
    o.loopback_capacity = 512ull << 20;
    o.pager.local_budget = 256ull << 20;
    o.thread_cache = true;
    o.stats_socket = false;
    auto r = farmem::FarRuntime::start(o);
    return r.ok() ? std::move(*r) : nullptr;
  }();
  return rt.get();
}

void flush_tcache() {
  (void)farmem_je_mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
}

// Allocate a batch of 64 blocks, touch one byte each (touch_all: write
// every byte, as a program filling a buffer does), free them.
template <class Alloc, class Free>
void churn(benchmark::State& state, Alloc alloc, Free release, bool touch_all = false) {
  const size_t n = static_cast<size_t>(state.range(0));
  void* p[64];
  for (auto _ : state) {
    for (auto& q : p) {
      q = alloc(n);
      if (q == nullptr) {
        state.SkipWithError("allocation failed");
        return;
      }
      if (touch_all) {
        memset(q, 0x5a, n);
      } else {
        static_cast<char*>(q)[0] = 1;
      }
    }
    benchmark::ClobberMemory();
    for (auto& q : p) release(q);
  }
  state.SetItemsProcessed(state.iterations() * 64);
  if (touch_all) state.SetBytesProcessed(state.iterations() * 64 * static_cast<int64_t>(n));
}

void BM_Glibc(benchmark::State& state) {
  churn(
      state, [](size_t n) { return malloc(n); }, [](void* q) { free(q); });
}
void BM_Jemalloc(benchmark::State& state) {
  churn(
      state, [](size_t n) { return farmem_je_mallocx(n, 0); },
      [](void* q) { farmem_je_dallocx(q, 0); });
}
void BM_FarHeap(benchmark::State& state) {
  if (!farmem::Uffd::unavailable_reason().empty() || runtime() == nullptr) {
    state.SkipWithError("userfaultfd / loopback runtime unavailable");
    return;
  }
  farmem::FarHeap* h = &runtime()->heap();
  churn(
      state, [h](size_t n) { return h->alloc(n); }, [h](void* q) { h->free(q); });
}

void BM_FarHeapCached(benchmark::State& state) {
  if (!farmem::Uffd::unavailable_reason().empty() || cached_runtime() == nullptr) {
    state.SkipWithError("userfaultfd / loopback runtime unavailable");
    return;
  }
  farmem::FarHeap* h = &cached_runtime()->heap();
  flush_tcache();
  churn(
      state, [h](size_t n) { return h->alloc(n); }, [h](void* q) { h->free(q); });
  flush_tcache();
}

// Small objects, as a program's heap is mostly made of (python's dicts and
// strings, perl's SVs, sqlite's rows): the FARMEM_MIN_FAR = 0 measurement.
// BM_XSmall: 64 x (malloc, write 1 byte), 64 x free of one size; the far
// heap without (FarHeap) and with (FarHeapCached) jemalloc's thread caches.
BENCHMARK(BM_Glibc)->Name("BM_GlibcSmall")->Arg(16)->Arg(64)->Arg(256)->Arg(1024)->Threads(1);
BENCHMARK(BM_FarHeap)->Name("BM_FarHeapSmall")->Arg(16)->Arg(64)->Arg(256)->Arg(1024)->Threads(1);
BENCHMARK(BM_FarHeapCached)
    ->Name("BM_FarHeapCachedSmall")
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Threads(1)
    ->Threads(2);

// Touch-and-free (every byte written): the FARMEM_MIN_FAR measurement.
void BM_GlibcTouch(benchmark::State& state) {
  churn(
      state, [](size_t n) { return malloc(n); }, [](void* q) { free(q); }, true);
}
void BM_JemallocTouch(benchmark::State& state) {
  churn(
      state, [](size_t n) { return farmem_je_mallocx(n, 0); },
      [](void* q) { farmem_je_dallocx(q, 0); }, true);
}
void BM_FarHeapTouch(benchmark::State& state) {
  if (!farmem::Uffd::unavailable_reason().empty() || runtime() == nullptr) {
    state.SkipWithError("userfaultfd / loopback runtime unavailable");
    return;
  }
  farmem::FarHeap* h = &runtime()->heap();
  churn(
      state, [h](size_t n) { return h->alloc(n); }, [h](void* q) { h->free(q); }, true);
}

// Small and large sizes, the ones around FARMEM_MIN_FAR (16K) densely; one
// and two threads (each thread churns its own batch).
#define SIZES         \
  Arg(64)             \
      ->Arg(1024)     \
      ->Arg(4096)     \
      ->Arg(8 << 10)  \
      ->Arg(12 << 10) \
      ->Arg(16 << 10) \
      ->Arg(24 << 10) \
      ->Arg(32 << 10) \
      ->Arg(64 << 10) \
      ->Arg(1 << 20)  \
      ->Threads(1)    \
      ->Threads(2)
BENCHMARK(BM_Glibc)->SIZES;
BENCHMARK(BM_Jemalloc)->SIZES;
BENCHMARK(BM_FarHeap)->SIZES;  // runtime() is a function-local static: thread-safe
BENCHMARK(BM_FarHeapCached)->SIZES;

// 1K .. 256K, one thread: where far stops costing more than local.
#define TOUCH_SIZES \
  RangeMultiplier(2)->Range(1 << 10, 256 << 10)->Arg(12 << 10)->Arg(24 << 10)->Threads(1)
BENCHMARK(BM_GlibcTouch)->TOUCH_SIZES;
BENCHMARK(BM_JemallocTouch)->TOUCH_SIZES;
BENCHMARK(BM_FarHeapTouch)->TOUCH_SIZES;

}  // namespace

BENCHMARK_MAIN();
