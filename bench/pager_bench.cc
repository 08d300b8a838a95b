// Pager fault costs next to their lower bounds, in one run:
//   BM_KernelFirstTouch    anonymous page, first touch (kernel fault)
//   BM_BareUffd            userfaultfd round trip: one handler thread, read()
//                          + UFFDIO_COPY of a zero page, nothing else
//   BM_PagerZeroFault      pager, never-written page
//   BM_PagerRemoteFault    pager on loopback, page written back and dropped
//                          (READ + install), prefetch off, random order
//   BM_PagerScan/prefetch  sequential scan of written-back pages, prefetch off/on
// Each reports p50_us / p99_us per fault (or per page for scans).
//
//   ./build/bench/farmem_bench_pager --benchmark_min_time=1x
#include <benchmark/benchmark.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "pager/pager.h"
#include "pager/remote_map.h"
#include "pager/uffd.h"
#include "runtime/loopback_transport.h"

namespace farmem {
namespace {

constexpr size_t kPage = 4096;
using Clock = std::chrono::steady_clock;

void report(benchmark::State& state, std::vector<double>& us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  state.counters["p50_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[us.size() * 99 / 100];
  state.counters["faults"] = static_cast<double>(us.size());
}

template <class F>
double time_us(F f) {
  auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

void BM_KernelFirstTouch(benchmark::State& state) {
  const size_t n = 20000;
  std::vector<double> us;
  for (auto _ : state) {
    void* p = mmap(nullptr, n * kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    madvise(p, n * kPage, MADV_NOHUGEPAGE);
    auto* c = static_cast<volatile char*>(p);
    for (size_t i = 0; i < n; ++i) us.push_back(time_us([&] { c[i * kPage] = 1; }));
    munmap(p, n * kPage);
  }
  report(state, us);
}

void BM_BareUffd(benchmark::State& state) {
  auto u = Uffd::open();
  if (!u.ok()) {
    state.SkipWithError(u.status().to_string().c_str());
    return;
  }
  const size_t n = 20000;
  std::vector<double> us;
  for (auto _ : state) {
    void* p = mmap(nullptr, n * kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    madvise(p, n * kPage, MADV_NOHUGEPAGE);
    if (!u->register_range(p, n * kPage).ok()) {
      state.SkipWithError("register");
      return;
    }
    static char zero[kPage] __attribute__((aligned(4096)));
    std::atomic<bool> stop{false};
    std::thread handler([&] {
      uffd_msg m[16];
      pollfd pfd{u->fd(), POLLIN, 0};
      while (!stop) {
        if (poll(&pfd, 1, 10) <= 0) continue;
        ssize_t r = read(u->fd(), m, sizeof m);
        for (ssize_t i = 0; i < r / static_cast<ssize_t>(sizeof(uffd_msg)); ++i) {
          void* page = reinterpret_cast<void*>(m[i].arg.pagefault.address & ~(kPage - 1));
          (void)u->copy(page, zero, kPage, false);
        }
      }
    });
    auto* c = static_cast<volatile char*>(p);
    for (size_t i = 0; i < n; ++i) us.push_back(time_us([&] { c[i * kPage] = 1; }));
    stop = true;
    handler.join();
    (void)u->unregister_range(p, n * kPage);
    munmap(p, n * kPage);
  }
  report(state, us);
}

struct Rig {
  LoopbackDonor donor{512ull << 20, 4ull << 20};
  LoopbackTransport t;
  LoopbackSlabSource src{0, &donor};
  std::unique_ptr<Pager<LoopbackTransport>> p;
  bool start(benchmark::State& state, PagerConfig c) {
    (void)t.add_server(0, &donor);
    auto r = Pager<LoopbackTransport>::create(c, &t, &src);
    if (!r.ok()) {
      state.SkipWithError(r.status().to_string().c_str());
      return false;
    }
    p = std::move(*r);
    return true;
  }
};

PagerConfig bench_config(bool prefetch) {
  PagerConfig c;
  c.region_size = 256ull << 20;
  c.local_budget = 16ull << 20;  // 4096 pages
  c.handler_threads = 1;
  c.prefetch = prefetch;
  return c;
}

void BM_PagerZeroFault(benchmark::State& state) {
  Rig rig;
  if (!rig.start(state, bench_config(false))) return;
  auto* c = static_cast<volatile char*>(rig.p->base());
  std::vector<double> us;
  size_t next = 0;
  for (auto _ : state) {
    for (size_t i = 0; i < 20000; ++i, ++next)
      us.push_back(time_us([&] { (void)c[next * kPage]; }));
  }
  report(state, us);
}

// Writes `pages` pages, then streams reads through 2x the budget so that
// they are all written back and dropped.
void push_out(char* mem, size_t pages, size_t budget_pages) {
  for (size_t i = 0; i < pages; ++i) mem[i * kPage] = static_cast<char>(i | 1);
  auto* v = reinterpret_cast<volatile char*>(mem);
  for (size_t i = 0; i < 2 * budget_pages; ++i) (void)v[(pages + i) * kPage];
}

void BM_PagerRemoteFault(benchmark::State& state) {
  Rig rig;
  if (!rig.start(state, bench_config(false))) return;
  auto* mem = static_cast<char*>(rig.p->base());
  const size_t n = 16384;
  push_out(mem, n, 4096);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
  std::vector<double> us;
  auto* v = reinterpret_cast<volatile char*>(mem);
  for (auto _ : state) {
    // The first 4096 random touches fill the budget; measure the rest (each
    // a remote READ, with the evictor working in the background).
    for (size_t i = 0; i < n; ++i) {
      double t = time_us([&] { (void)v[order[i] * kPage]; });
      if (i >= 4096) us.push_back(t);
    }
  }
  report(state, us);
  PagerStats s = rig.p->stats();
  state.counters["fetch_p50_us"] = static_cast<double>(s.fetch_latency.percentile_us(0.5));
}

void BM_PagerScan(benchmark::State& state) {
  Rig rig;
  const bool prefetch = state.range(0) != 0;
  if (!rig.start(state, bench_config(prefetch))) return;
  auto* mem = static_cast<char*>(rig.p->base());
  const size_t n = 16384;
  push_out(mem, n, 4096);
  auto* v = reinterpret_cast<volatile char*>(mem);
  const PagerStats b = rig.p->stats();
  double total = 0;
  for (auto _ : state) {
    total = time_us([&] {
      for (size_t i = 0; i < n; ++i) (void)v[i * kPage];
    });
  }
  PagerStats s = rig.p->stats();
  auto d = [](uint64_t after, uint64_t before) { return static_cast<double>(after - before); };
  state.counters["us_per_page"] = total / static_cast<double>(n);
  state.counters["remote_faults"] = d(s.faults_remote, b.faults_remote);
  state.counters["faults"] = d(s.faults_remote + s.faults_victim + s.faults_zero + s.faults_wp,
                               b.faults_remote + b.faults_victim + b.faults_zero + b.faults_wp);
  state.counters["prefetch_used"] = d(s.prefetch_used, b.prefetch_used);
  state.counters["prefetch_mapped"] = d(s.prefetch_mapped, b.prefetch_mapped);
  state.counters["prefetch_issued"] = d(s.prefetch_issued, b.prefetch_issued);
}

BENCHMARK(BM_KernelFirstTouch)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BareUffd)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PagerZeroFault)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PagerRemoteFault)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PagerScan)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("prefetch")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace farmem

BENCHMARK_MAIN();
