// malloc/free throughput: glibc vs the far heap (FarHeap on a loopback
// pager with a budget that holds everything, so this measures the
// allocator path, not paging) vs jemalloc's own default arena (the private
// copy, plain mallocx). Sizes around FARMEM_MIN_FAR.
//
//   build/bench/farmem_bench_alloc --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdlib>
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

// Allocate a batch of 64 blocks, touch one byte each, free them.
template <class Alloc, class Free>
void churn(benchmark::State& state, Alloc alloc, Free release) {
  const size_t n = static_cast<size_t>(state.range(0));
  void* p[64];
  for (auto _ : state) {
    for (auto& q : p) {
      q = alloc(n);
      static_cast<char*>(q)[0] = 1;
    }
    for (auto& q : p) release(q);
  }
  state.SetItemsProcessed(state.iterations() * 64);
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

#define SIZES Arg(64)->Arg(4096)->Arg(16 << 10)->Arg(64 << 10)->Arg(1 << 20)
BENCHMARK(BM_Glibc)->SIZES;
BENCHMARK(BM_Jemalloc)->SIZES;
BENCHMARK(BM_FarHeap)->SIZES;

}  // namespace

BENCHMARK_MAIN();
