// Pager fault costs next to their lower bounds, in one run:
//   BM_KernelFirstTouch    anonymous page, first touch (kernel fault)
//   BM_BareUffd            userfaultfd round trip: one handler thread, read()
//                          + UFFDIO_COPY of a zero page, nothing else
//   BM_PagerZeroFault      pager, never-written page
//   BM_PagerRemoteFault    pager on loopback, page written back and dropped
//                          (READ + install), prefetch off, random order
//   BM_PagerScan/prefetch  sequential scan of written-back pages, prefetch off/on
//   BM_VictimHit/write     victim-cache hit faults (random accesses over 1.1x
//                          the budget, half of it victim cache), UFFDIO_MOVE
//                          vs copy in interleaved rounds: move_p50_us /
//                          copy_p50_us per fault
//   BM_EvictCycle/write    the same accesses timed per pass: demotions/s
//                          (median pass), move vs copy
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

// Two pagers, UFFDIO_MOVE on and off, fed the same random accesses in
// alternating rounds so that load from elsewhere hits both alike. Half the
// budget is victim cache and the pages touched are 1.1x the budget, so that
// (prefetch off) about 40% of accesses hit a victim and the evictor demotes
// all the time. Latency is kept only for accesses to a block that was a
// victim just before (page table state), i.e. victim-hit faults.
struct MovePair {
  Rig on, off;
  static constexpr size_t kPages = 4500;  // budget 4096
  static constexpr size_t kPerPass = 20000;
  std::vector<uint32_t> order;
  bool start(benchmark::State& state) {
    PagerConfig c = bench_config(false);
    c.victim_fraction = 0.5;
    c.uffd_move = UffdMoveMode::kOn;
    if (!on.start(state, c)) return false;
    c.uffd_move = UffdMoveMode::kOff;
    if (!off.start(state, c)) return false;
    std::mt19937_64 rng(7);
    order.resize(kPerPass);
    for (auto& o : order) o = static_cast<uint32_t>(rng() % kPages);
    return true;
  }
  // One pass; victim-hit latencies appended to us (if any).
  void pass(Rig& r, bool write, std::vector<double>* us) const {
    auto* v = static_cast<volatile char*>(r.p->base());
    for (uint32_t pg : order) {
      volatile char* a = v + size_t{pg} * kPage;
      bool victim = r.p->state_of(const_cast<const char*>(a)) == PageState::kVictim;
      double t = write ? time_us([&] { *a = static_cast<char>(pg); }) : time_us([&] { (void)*a; });
      if (us && victim) us->push_back(t);
    }
  }
  // Writes every page once (dirty: a read then hits dirty victims, which
  // move too) and runs a warm-up pass.
  void warm(bool write) {
    for (Rig* r : {&on, &off}) {
      auto* m = static_cast<char*>(r->p->base());
      for (size_t i = 0; i < kPages; ++i) m[i * kPage] = 1;
      pass(*r, write, nullptr);
    }
  }
};

double p50(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_VictimHit(benchmark::State& state) {
  MovePair m;
  if (!m.start(state)) return;
  const bool write = state.range(0) != 0;
  m.warm(write);
  const PagerStats b_on = m.on.p->stats(), b_off = m.off.p->stats();
  std::vector<double> on_us, off_us;
  for (auto _ : state) {
    for (int round = 0; round < 5; ++round) {
      m.pass(m.on, write, &on_us);
      m.pass(m.off, write, &off_us);
    }
  }
  const PagerStats s_on = m.on.p->stats(), s_off = m.off.p->stats();
  state.counters["move_p50_us"] = p50(on_us);
  state.counters["copy_p50_us"] = p50(off_us);
  state.counters["move_victim_hits"] = static_cast<double>(s_on.faults_victim - b_on.faults_victim);
  state.counters["copy_victim_hits"] =
      static_cast<double>(s_off.faults_victim - b_off.faults_victim);
  state.counters["moved_in"] = static_cast<double>(s_on.moves_in - b_on.moves_in);
  state.counters["moved_out"] = static_cast<double>(s_on.moves_out - b_on.moves_out);
  state.counters["move_fallbacks"] = static_cast<double>(s_on.move_fallbacks);
}

void BM_EvictCycle(benchmark::State& state) {
  MovePair m;
  if (!m.start(state)) return;
  const bool write = state.range(0) != 0;
  m.warm(write);
  const PagerStats b_on = m.on.p->stats(), b_off = m.off.p->stats();
  std::vector<double> on_rate, off_rate;
  for (auto _ : state) {
    for (int round = 0; round < 5; ++round) {
      for (int k = 0; k < 2; ++k) {
        Rig& r = k == 0 ? m.on : m.off;
        uint64_t d0 = r.p->stats().demotions;
        double t = time_us([&] { m.pass(r, write, nullptr); });
        uint64_t d = r.p->stats().demotions - d0;
        (k == 0 ? on_rate : off_rate).push_back(static_cast<double>(d) / t * 1e6);
      }
    }
  }
  const PagerStats s_on = m.on.p->stats(), s_off = m.off.p->stats();
  state.counters["move_demotions_per_s"] = p50(on_rate);
  state.counters["copy_demotions_per_s"] = p50(off_rate);
  state.counters["move_demotions"] = static_cast<double>(s_on.demotions - b_on.demotions);
  state.counters["copy_demotions"] = static_cast<double>(s_off.demotions - b_off.demotions);
  state.counters["moved_out"] = static_cast<double>(s_on.moves_out - b_on.moves_out);
  state.counters["move_fallbacks"] = static_cast<double>(s_on.move_fallbacks);
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
BENCHMARK(BM_VictimHit)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("write")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EvictCycle)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("write")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace farmem

BENCHMARK_MAIN();
