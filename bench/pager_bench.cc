// Pager fault costs next to their lower bounds, in one run:
//   BM_KernelFirstTouch    anonymous page, first touch (kernel fault)
//   BM_BareUffd            userfaultfd round trip: one handler thread, read()
//                          + UFFDIO_COPY of a zero page, nothing else (one
//                          unpinned handler: ~9 us where the kernel keeps it
//                          on the faulting thread's CPU, ~43 us across;
//                          BM_ColdFault compares strategy for strategy)
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
// Each reports p50_us / p99_us per fault (or per page for scans). The
// pagers run the default handlers, one pinned per CPU (before 2026-12-07
// one unpinned handler: p50 ~10 or ~44 us by where the kernel put it).
//
// Issue 3's set, each on loopback (backend:0, the pager's own cost: the
// loopback transport completes inline in the handler's poll, one memcpy, no
// thread) and on tcp (backend:1, an in-process DonorServer -- the code
// farmemd runs -- on 127.0.0.1:0, with a DonorSession and TcpTransport):
//   BM_ColdFault           kernel first touch, bare userfaultfd round trip and
//                          pager cold remote fault in interleaved rounds of 256
//                          (load hits all three alike), each in random page
//                          order (same page-walk misses); the pager's budget has
//                          room, so no eviction runs while it is timed (evict()
//                          between rounds). Reports each p50/p99 and
//                          ratio_bare = pager/bare, ratio_kernel = pager/kernel
//                          (p50), added_us = pager p50 - bare p50; also the
//                          transport's own 4 KiB READ of a cold donor page
//                          (transport_read_p50_us: post to completion, the
//                          memcpy standing in for the NIC's DMA on loopback)
//                          and pager_own_us = added_us - that: what the pager
//                          itself adds to a bare round trip plus one READ.
//                          64 rounds of 256 (16384 faults of each kind; 40
//                          rounds before 2026-12). Steadier forms of
//                          the last two: added_round_med_us and
//                          pager_own_round_med_us (median over rounds of the
//                          round's own p50 differences; bare, READ and pager
//                          faults of a round run back to back, so each
//                          difference sees one machine state),
//                          pager_own_round_iqr_us (their spread across the
//                          rounds of a run), added_iqm_us / pager_own_iqm_us
//                          (the same differences of interquartile means).
//                          pinned:1 (the pager's default): one handler per
//                          CPU, each pinned to its CPU, for the pager AND the
//                          bare rig; pinned:0: one unpinned handler each
//                          (strategy for strategy; fault_path.h "Handlers
//                          per CPU"). cross_cpu_faults: the pager's faults
//                          served by a handler on another CPU than the
//                          bench thread's (fault_path.h "Parked handlers").
//   BM_FaultThroughput     random remote read faults/s with 1 and 2
//                          application threads, working set 4x the budget
//                          (eviction in the background), default handlers.
//   BM_SeqScan             sequential read of every byte of a region 4x the
//                          budget, prefetch off/on, next to the same scan of
//                          all-local memory: GB/s and ratio = pager/local.
//   BM_RandomRMW           random 4 KiB read-modify-write (every word of the
//                          page) over 64 MiB at 25/50/75% budgets: ops/s.
//   BM_ZipfReplacement     the pager's hit ratio on a zipfian (0.99) trace at
//                          a 25% budget (loopback), next to FIFO, exact LRU
//                          and the policy's model on the same trace.
//   BM_ZapScattered        dropping scattered pages: a madvise() each vs one
//                          ZapBatch (process_madvise), with and without
//                          another thread of the process running: us/page.
//
//   ./build/bench/farmem_bench_pager   (every benchmark runs one iteration)
//   build-P/bench/farmem_bench_pager --benchmark_filter=ColdFault --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true
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
#include "pager/replacement_sim.h"
#include "pager/uffd.h"
#include "pager/zap.h"
#include "runtime/loopback_transport.h"
#if defined(FARMEM_BENCH_TCP)
#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/tcp_transport.h"
#include "tests/runtime/local_donor.h"
#endif

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
  c.handler_threads = 0;  // the default: one per CPU, pinned (fault_path.h "Handlers per CPU")
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

// ---- issue 3: cold fault ratios, throughput, scan, random RMW --------------

// The far side of a pager: a backend, its donor and a slab source. Members
// are destroyed in reverse order (source, transport, then the donor).
struct LoopbackEnv {
  using B = LoopbackTransport;
  static constexpr const char* kName = "loopback";
  LoopbackDonor donor{1ull << 30, 4ull << 20};
  LoopbackTransport t;
  LoopbackSlabSource src{0, &donor};
  std::string error;
  LoopbackEnv() { (void)t.add_server(0, &donor); }
  uint64_t donor_reads() const { return donor.reads(); }
};

#if defined(FARMEM_BENCH_TCP)
struct TcpEnv {
  using B = TcpTransport;
  static constexpr const char* kName = "tcp";
  std::unique_ptr<testing::LocalDonor> donor;
  std::unique_ptr<TcpTransport> tp;
  std::unique_ptr<DonorSessionSlabSource> srcp;
  TcpTransport& t = *(tp = std::make_unique<TcpTransport>());
  std::string error;
  TcpEnv() {
    auto d = testing::LocalDonor::start(
        testing::local_donor_options("pager-bench-token", 1ull << 30, 4ull << 20));
    if (!d.ok()) {
      error = d.status().to_string();
      return;
    }
    donor = std::move(*d);
    Status st = t.add_server(0, donor->session());
    if (!st.ok()) {
      error = st.to_string();
      return;
    }
    srcp = std::make_unique<DonorSessionSlabSource>(0, donor->session());
  }
  ~TcpEnv() {
    srcp.reset();
    tp.reset();
    donor.reset();
  }
  SlabSource* source() { return srcp.get(); }
  uint64_t donor_reads() const {
    auto st = donor->session()->stats();
    return st.ok() ? st->reads : 0;
  }
};
#endif

template <class Env>
SlabSource* source_of(Env& e) {
  if constexpr (requires { e.source(); }) {
    return e.source();
  } else {
    return &e.src;
  }
}

// A pager on a fresh Env; the pager is destroyed before the Env.
template <class Env>
struct PagerRig {
  Env env;
  std::unique_ptr<Pager<typename Env::B>> p;
  bool start(benchmark::State& state, const PagerConfig& c) {
    if (!env.error.empty()) {
      state.SkipWithError(env.error.c_str());
      return false;
    }
    auto r = Pager<typename Env::B>::create(c, &env.t, source_of(env));
    if (!r.ok()) {
      state.SkipWithError(r.status().to_string().c_str());
      return false;
    }
    p = std::move(*r);
    return true;
  }
  ~PagerRig() { p.reset(); }
  char* mem() const { return static_cast<char*>(p->base()); }
};

// Runs body<Env>(state) on loopback (backend 0) or tcp (backend 1).
template <template <class> class Body>
void by_backend(benchmark::State& state) {
  if (state.range(0) == 0) {
    Body<LoopbackEnv>::run(state);
    return;
  }
#if defined(FARMEM_BENCH_TCP)
  Body<TcpEnv>::run(state);
#else
  state.SkipWithError("built without farmem::donor: no tcp backend");
#endif
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// Interquartile mean: the mean of the middle half (a trimmed mean that, unlike
// the median, uses every sample between the quartiles).
double iqm(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t lo = v.size() / 4, hi = v.size() - v.size() / 4;
  double sum = 0;
  for (size_t i = lo; i < hi; ++i) sum += v[i];
  return sum / static_cast<double>(hi - lo);
}

// A bare userfaultfd round trip kept running across rounds: handler
// threads doing read() + UFFDIO_COPY of a resident zero page, nothing else:
// one unpinned, or (pinned) one per allowed CPU, each pinned to its CPU,
// as the pager's handlers.
struct BareUffdRig {
  Uffd u;
  void* mem = nullptr;
  size_t len = 0;
  size_t n_bells = 1;  // the last n_bells pages: stop doorbells, one per handler
  std::atomic<bool> stop{false};
  bool blocking = false;
  std::vector<std::thread> handlers;
  alignas(4096) char zero[kPage] = {};
  bool start(size_t pages, std::string* err, bool pinned = false) {
    const std::vector<int> cpus = pinned ? allowed_cpus() : std::vector<int>{};
    n_bells = cpus.empty() ? 1 : cpus.size();
    auto r = Uffd::open();
    if (!r.ok()) {
      *err = r.status().to_string();
      return false;
    }
    u = std::move(*r);
    len = (pages + n_bells) * kPage;  // + the stop doorbells, never touched by a run
    mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
               -1, 0);
    if (mem == MAP_FAILED) {
      mem = nullptr;
      *err = "mmap failed";
      return false;
    }
    madvise(mem, len, MADV_NOHUGEPAGE);
    Status st = u.register_range(mem, len);
    if (!st.ok()) {
      *err = st.to_string();
      return false;
    }
    // The bare round trip at its cheapest, as the pager's idle handlers do
    // it: one blocking read() per fault where the kernel allows it (else
    // poll() + read()). The last page is the stop doorbell.
    blocking = u.enable_blocking_reads();
    for (size_t t = 0; t < n_bells; ++t) {
      handlers.emplace_back([this] {
        uffd_msg m[16];
        pollfd pfd{u.fd(), POLLIN, 0};
        while (!stop.load(std::memory_order_relaxed)) {
          if (!blocking && poll(&pfd, 1, 10) <= 0) continue;
          ssize_t got = read(u.fd(), m, sizeof m);
          for (ssize_t i = 0; i < got / static_cast<ssize_t>(sizeof(uffd_msg)); ++i) {
            void* page = reinterpret_cast<void*>(m[i].arg.pagefault.address & ~(kPage - 1));
            (void)u.copy(page, zero, kPage, false);
          }
        }
      });
      if (!cpus.empty()) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[t], &set);
        (void)pthread_setaffinity_np(handlers.back().native_handle(), sizeof set, &set);
      }
    }
    return true;
  }
  ~BareUffdRig() {
    stop = true;
    if (blocking) {
      // Wakes the blocked read()s: one fault per handler on its own doorbell
      // page, each resolved by a handler that then sees stop and returns.
      for (size_t t = 0; t < handlers.size(); ++t)
        (void)*static_cast<volatile char*>(static_cast<char*>(mem) + len - (t + 1) * kPage);
    }
    for (auto& h : handlers)
      if (h.joinable()) h.join();
    if (mem) {
      (void)u.unregister_range(mem, len);
      munmap(mem, len);
    }
  }
};

// The transport's own 4 KiB READ, post to completion, from the bench
// thread, of donor pages written once and long out of the caches: on
// loopback the memcpy that stands in for the NIC's DMA (plus post/poll), on
// tcp the network round trip. The pager's cold fault does one of these;
// the bare round trip does not, so pager_own_us = added_us - this.
template <class Env>
struct ReadProbe {
  std::unique_ptr<typename Env::B::Queue> q;
  std::vector<RemoteAddr> pages;
  std::vector<SlabSource::Slab> slabs;
  SlabSource* src = nullptr;
  char* buf = nullptr;
  typename Env::B* t = nullptr;

  bool start(Env& env, size_t n, std::string* err) {
    t = &env.t;
    src = source_of(env);
    auto l = src->lease(n * kPage);
    if (!l.ok()) {
      *err = l.status().to_string();
      return false;
    }
    slabs = std::move(*l);
    for (const auto& sl : slabs) {
      Status st = t->add_slab(sl.server, sl.desc);
      if (!st.ok()) {
        *err = st.to_string();
        return false;
      }
      for (uint64_t off = 0; off + kPage <= sl.desc.size && pages.size() < n; off += kPage)
        pages.push_back(RemoteAddr{sl.server, sl.desc.slab, off});
    }
    buf = static_cast<char*>(aligned_alloc(kPage, kPage));
    memset(buf, 0x5a, kPage);
    auto qr = t->open_queue();
    Status st = qr.ok() ? t->register_buffer(buf, kPage) : qr.status();
    if (!st.ok() || pages.size() < n) {
      *err = st.ok() ? "the donor leased less than asked" : st.to_string();
      return false;
    }
    q = std::move(*qr);
    for (const RemoteAddr& a : pages) {  // every page written once: donor memory backed
      if (!io(IoKind::kWrite, a)) {
        *err = "probe WRITE failed";
        return false;
      }
    }
    return true;
  }
  bool io(IoKind k, const RemoteAddr& a) {
    IoOp op{k, static_cast<uint32_t>(kPage), a, buf, 1};
    if (q->post({&op, 1}) != Errc::kOk) return false;
    IoCompletion c[1];
    while (q->wait(c, 1000) == 0) {
    }
    return c[0].status == Errc::kOk;
  }
  ~ReadProbe() {
    q.reset();
    if (buf) {
      (void)t->unregister_buffer(buf);
      free(buf);
    }
    for (const auto& sl : slabs) {
      (void)t->remove_slab(sl.server, sl.desc.slab);
      (void)src->release(sl.server, sl.desc.slab);
    }
  }
};

template <class Env>
struct ColdFault {
  static void run(benchmark::State& state) {
    constexpr size_t kRound = 256, kRounds = 64, kWritten = 16384;
    PagerConfig c;
    c.region_size = 256ull << 20;
    c.local_budget = 128ull << 20;  // room for every page: nothing evicted while timed
    // Strategy for strategy with the bare rig: one unpinned handler each,
    // or one pinned handler per CPU each (the pager's default).
    const bool pinned = state.range(1) != 0;
    c.handler_threads = pinned ? 0 : 1;
    c.pin_handlers = pinned;
    c.prefetch = false;
    PagerRig<Env> rig;
    if (!rig.start(state, c)) return;
    std::string err;
    BareUffdRig bare;
    if (!bare.start(kRound * kRounds, &err, pinned)) {
      state.SkipWithError(err.c_str());
      return;
    }
    ReadProbe<Env> probe;
    if (!probe.start(rig.env, kRound * kRounds, &err)) {
      state.SkipWithError(err.c_str());
      return;
    }
    const size_t kernel_len = kRound * kRounds * kPage;
    void* kmem = mmap(nullptr, kernel_len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    madvise(kmem, kernel_len, MADV_NOHUGEPAGE);
    char* mem = rig.mem();
    for (size_t i = 0; i < kWritten; ++i) mem[i * kPage] = static_cast<char>(i | 1);
    if (!rig.p->evict(mem, kWritten * kPage).ok()) {
      state.SkipWithError("evict failed");
      return;
    }
    std::vector<uint32_t> order(kWritten);
    for (size_t i = 0; i < kWritten; ++i) order[i] = static_cast<uint32_t>(i);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
    // The kernel and bare faults take their pages in random order too, so
    // that all three pay the same page-table-walk and TLB misses.
    std::vector<uint32_t> lorder(kRound * kRounds);
    for (size_t i = 0; i < lorder.size(); ++i) lorder[i] = static_cast<uint32_t>(i);
    std::shuffle(lorder.begin(), lorder.end(), std::mt19937_64(2));
    std::vector<double> k_us, b_us, p_us, t_us;
    // Per round: pager p50 - bare p50 - transport p50 of that round's 256
    // faults each, taken back to back (the same machine state for all
    // three), and pager p50 - bare p50.
    std::vector<double> own_r, added_r;
    const PagerStats s0 = rig.p->stats();
    auto* kv = static_cast<volatile char*>(kmem);
    auto* bv = static_cast<volatile char*>(bare.mem);
    auto* pv = reinterpret_cast<volatile char*>(mem);
    for (auto _ : state) {
      size_t next = 0;
      for (size_t r = 0; r < kRounds; ++r) {
        const size_t base = r * kRound;
        for (size_t i = 0; i < kRound; ++i)
          k_us.push_back(time_us([&] { kv[size_t{lorder[base + i]} * kPage] = 1; }));
        for (size_t i = 0; i < kRound; ++i)
          b_us.push_back(time_us([&] { bv[size_t{lorder[base + i]} * kPage] = 1; }));
        for (size_t i = 0; i < kRound; ++i)
          t_us.push_back(
              time_us([&] { (void)probe.io(IoKind::kRead, probe.pages[lorder[base + i]]); }));
        // Writes, as above: installed writable and dirty in one fault.
        for (size_t i = 0; i < kRound; ++i, ++next) {
          const size_t pg = order[next % kWritten];
          p_us.push_back(time_us([&] { pv[pg * kPage] = 2; }));
        }
        auto round_p50 = [&](const std::vector<double>& v) {
          return pct(std::vector<double>(v.end() - kRound, v.end()), 0.5);
        };
        const double rb = round_p50(b_us), rp = round_p50(p_us), rt = round_p50(t_us);
        added_r.push_back(rp - rb);
        own_r.push_back(rp - rb - rt);
        // Back to remote (untimed) so that a later round faults them again.
        for (size_t i = next - kRound; i < next; ++i) {
          (void)rig.p->evict(mem + size_t{order[i % kWritten]} * kPage, kPage);
        }
      }
    }
    munmap(kmem, kernel_len);
    const PagerStats s = rig.p->stats();
    const double kp50 = pct(k_us, 0.5), bp50 = pct(b_us, 0.5), pp50 = pct(p_us, 0.5);
    state.counters["kernel_p50_us"] = kp50;
    state.counters["kernel_p99_us"] = pct(k_us, 0.99);
    state.counters["bare_p50_us"] = bp50;
    state.counters["bare_p99_us"] = pct(b_us, 0.99);
    state.counters["pager_p50_us"] = pp50;
    state.counters["pager_p99_us"] = pct(p_us, 0.99);
    state.counters["ratio_bare"] = bp50 > 0 ? pp50 / bp50 : 0;
    state.counters["ratio_kernel"] = kp50 > 0 ? pp50 / kp50 : 0;
    state.counters["added_us"] = pp50 - bp50;
    const double tp50 = pct(t_us, 0.5);
    state.counters["transport_read_p50_us"] = tp50;
    state.counters["pager_own_us"] = pp50 - bp50 - tp50;
    // Steadier estimates of the same two quantities (pager_own_us is a
    // difference of ~30 us medians): the median over rounds of each round's
    // difference, its interquartile range across rounds (the spread within
    // one run), and the difference of interquartile means.
    state.counters["added_round_med_us"] = pct(added_r, 0.5);
    state.counters["pager_own_round_med_us"] = pct(own_r, 0.5);
    state.counters["pager_own_round_iqr_us"] = pct(own_r, 0.75) - pct(own_r, 0.25);
    state.counters["added_iqm_us"] = iqm(p_us) - iqm(b_us);
    state.counters["pager_own_iqm_us"] = iqm(p_us) - iqm(b_us) - iqm(t_us);
    state.counters["remote_faults"] = static_cast<double>(s.faults_remote - s0.faults_remote);
    state.counters["cross_cpu_faults"] =
        static_cast<double>(s.faults_cross_cpu - s0.faults_cross_cpu);
    state.counters["faults"] = static_cast<double>(p_us.size());
    state.SetLabel(Env::kName);
  }
};

void BM_ColdFault(benchmark::State& state) {
  by_backend<ColdFault>(state);
}

// Written pages of a region, then all of them evicted (remote).
template <class Env>
bool write_and_evict(benchmark::State& state, PagerRig<Env>& rig, size_t pages) {
  char* mem = rig.mem();
  for (size_t i = 0; i < pages; ++i) {
    uint64_t v = i * 0x9E3779B97F4A7C15ull;
    for (size_t w = 0; w < kPage; w += 512) memcpy(mem + i * kPage + w, &v, 8);
  }
  Status st = rig.p->evict(mem, pages * kPage);
  if (!st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return false;
  }
  return true;
}

template <class Env>
struct FaultThroughput {
  static void run(benchmark::State& state) {
    const int threads = static_cast<int>(state.range(1));
    constexpr size_t kPages = 16384, kFaults = 16384;  // 4x the budget
    PagerConfig c;
    c.region_size = 256ull << 20;
    c.local_budget = 16ull << 20;
    c.handler_threads = 0;  // default_handler_threads(): nproc-aware
    c.prefetch = false;
    PagerRig<Env> rig;
    if (!rig.start(state, c)) return;
    if (!write_and_evict(state, rig, kPages)) return;
    auto* v = reinterpret_cast<volatile char*>(rig.mem());
    const PagerStats s0 = rig.p->stats();
    double secs = 0;
    for (auto _ : state) {
      auto t0 = Clock::now();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          std::mt19937_64 rng(11 + t);
          for (size_t i = 0; i < kFaults / threads; ++i) (void)v[(rng() % kPages) * kPage];
        });
      }
      for (auto& th : ts) th.join();
      secs = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    const PagerStats s = rig.p->stats();
    const double faults = static_cast<double>(s.faults_remote - s0.faults_remote + s.faults_victim -
                                              s0.faults_victim);
    state.counters["faults_per_s"] = faults / secs;
    state.counters["remote_per_s"] = static_cast<double>(s.faults_remote - s0.faults_remote) / secs;
    state.counters["accesses_per_s"] = static_cast<double>(kFaults) / secs;
    state.counters["handlers"] = static_cast<double>(rig.p->config().handler_threads);
    state.SetLabel(Env::kName);
  }
};

void BM_FaultThroughput(benchmark::State& state) {
  by_backend<FaultThroughput>(state);
}

// Reads every 8-byte word of [mem, mem+len); returns their sum.
uint64_t scan_sum(const char* mem, size_t len) {
  uint64_t sum = 0;
  for (size_t off = 0; off < len; off += kPage) {
    const auto* w = reinterpret_cast<const volatile uint64_t*>(mem + off);
    for (size_t i = 0; i < kPage / 8; ++i) sum += w[i];
  }
  return sum;
}

template <class Env>
struct SeqScan {
  static void run(benchmark::State& state) {
    const bool prefetch = state.range(1) != 0;
    constexpr size_t kPages = 16384;  // 64 MiB, 4x the budget
    PagerConfig c;
    c.region_size = 256ull << 20;
    c.local_budget = 16ull << 20;
    c.handler_threads = 0;
    c.prefetch = prefetch;
    PagerRig<Env> rig;
    if (!rig.start(state, c)) return;
    if (!write_and_evict(state, rig, kPages)) return;
    const size_t len = kPages * kPage;
    // The same scan over all-local memory, same contents.
    char* local = static_cast<char*>(
        mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (size_t i = 0; i < kPages; ++i) {
      uint64_t v = i * 0x9E3779B97F4A7C15ull;
      for (size_t w = 0; w < kPage; w += 512) memcpy(local + i * kPage + w, &v, 8);
    }
    const PagerStats s0 = rig.p->stats();
    const uint64_t dn0 = rig.p->evict_dontneed_calls(), wp0 = rig.p->evict_wp_calls();
    const uint64_t rc0 = rig.p->prefetch_run_copies();
    double pager_s = 1e9, local_s = 1e9;
    uint64_t sum_p = 0, sum_l = 0;
    for (auto _ : state) {
      // Two passes each, interleaved; the best of each counts.
      for (int pass = 0; pass < 2; ++pass) {
        auto t0 = Clock::now();
        sum_l = scan_sum(local, len);
        local_s = std::min(local_s, std::chrono::duration<double>(Clock::now() - t0).count());
        t0 = Clock::now();
        sum_p = scan_sum(rig.mem(), len);
        pager_s = std::min(pager_s, std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    munmap(local, len);
    if (sum_p != sum_l) {
      state.SkipWithError("the pager's scan read different bytes than the local one");
      return;
    }
    const PagerStats s = rig.p->stats();
    const double gb = static_cast<double>(len) / 1e9;
    state.counters["pager_GBps"] = gb / pager_s;
    state.counters["local_GBps"] = gb / local_s;
    state.counters["ratio"] = local_s / pager_s;
    state.counters["remote_faults"] = static_cast<double>(s.faults_remote - s0.faults_remote);
    state.counters["prefetch_issued"] = static_cast<double>(s.prefetch_issued - s0.prefetch_issued);
    state.counters["prefetch_hits"] = static_cast<double>(s.prefetch_used - s0.prefetch_used +
                                                          s.prefetch_mapped - s0.prefetch_mapped);
    state.counters["faults_waited"] = static_cast<double>(s.faults_waited - s0.faults_waited);
    state.counters["demotions"] = static_cast<double>(s.demotions - s0.demotions);
    state.counters["dontneed_calls"] = static_cast<double>(rig.p->evict_dontneed_calls() - dn0);
    state.counters["wp_calls"] = static_cast<double>(rig.p->evict_wp_calls() - wp0);
    state.counters["run_copies"] = static_cast<double>(rig.p->prefetch_run_copies() - rc0);
    state.SetLabel(Env::kName);
  }
};

void BM_SeqScan(benchmark::State& state) {
  by_backend<SeqScan>(state);
}

template <class Env>
struct RandomRMW {
  static void run(benchmark::State& state) {
    const int budget_pct = static_cast<int>(state.range(1));
    constexpr size_t kPages = 16384;  // 64 MiB working set
    const size_t ops = Env::kName[0] == 't' ? 12000 : 30000;
    PagerConfig c;
    c.region_size = 256ull << 20;
    c.local_budget = kPages * kPage * static_cast<uint64_t>(budget_pct) / 100;
    c.handler_threads = 0;
    PagerRig<Env> rig;
    if (!rig.start(state, c)) return;
    if (!write_and_evict(state, rig, kPages)) return;
    char* mem = rig.mem();
    std::mt19937_64 rng(3);
    // Warm-up: fill the budget, so that the timed part is steady state.
    for (size_t i = 0; i < kPages * static_cast<size_t>(budget_pct) / 100; ++i) {
      (void)*reinterpret_cast<volatile char*>(mem + (rng() % kPages) * kPage);
    }
    const PagerStats s0 = rig.p->stats();
    const uint64_t dn0 = rig.p->evict_dontneed_calls(), wp0 = rig.p->evict_wp_calls();
    double secs = 0;
    for (auto _ : state) {
      auto t0 = Clock::now();
      for (size_t i = 0; i < ops; ++i) {
        auto* w = reinterpret_cast<uint64_t*>(mem + (rng() % kPages) * kPage);
        for (size_t k = 0; k < kPage / 8; ++k) w[k] += 1;  // read-modify-write, whole page
      }
      secs = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    const PagerStats s = rig.p->stats();
    state.counters["ops_per_s"] = static_cast<double>(ops) / secs;
    state.counters["remote_fault_ratio"] =
        static_cast<double>(s.faults_remote - s0.faults_remote) / static_cast<double>(ops);
    state.counters["victim_hit_ratio"] =
        static_cast<double>(s.faults_victim - s0.faults_victim) / static_cast<double>(ops);
    state.counters["dirty_evictions"] = static_cast<double>(s.evictions_dirty - s0.evictions_dirty);
    state.counters["faults_waited"] = static_cast<double>(s.faults_waited - s0.faults_waited);
    state.counters["dontneed_calls"] = static_cast<double>(rig.p->evict_dontneed_calls() - dn0);
    state.counters["wp_calls"] = static_cast<double>(rig.p->evict_wp_calls() - wp0);
    state.SetLabel(Env::kName);
  }
};

void BM_RandomRMW(benchmark::State& state) {
  by_backend<RandomRMW>(state);
}

// The replacement policy on the real pager: a zipfian (theta 0.99) trace of
// page reads over 64 MiB with a 25% budget, prefetch off, every page
// written back and dropped first (so the first touch of a page is a remote
// fault, as in the model). hit_ratio = 1 - remote faults / accesses (a
// victim-cache fault is a hit: no READ; victim_fault_ratio says how many
// there were). On the same trace and capacity (the budget in blocks): plain
// FIFO, exact LRU and the pager's policy as modelled by replacement_sim.h.
// victim:0 runs the pager with victim_fraction 0 (plain FIFO), victim:1
// with the default configuration. The real pager's capacity is a little
// below the model's: the evictor works down to the low watermark.
void BM_ZipfReplacement(benchmark::State& state) {
  const bool victims = state.range(0) != 0;
  constexpr uint32_t kItems = 16384;  // 64 MiB of 4 KiB pages
  constexpr size_t kAccesses = 300000;
  const size_t cap = kItems / 4;
  PagerConfig c;
  c.region_size = 256ull << 20;
  c.local_budget = cap * kPage;
  c.handler_threads = 0;
  c.prefetch = false;
  if (!victims) c.victim_fraction = 0;
  PagerRig<LoopbackEnv> rig;
  if (!rig.start(state, c)) return;
  if (!write_and_evict(state, rig, kItems)) return;
  // Hot items scattered over the region, as a hash table would place them.
  std::vector<uint32_t> perm(kItems);
  for (uint32_t i = 0; i < kItems; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
  std::vector<uint32_t> trace = zipf_trace(kItems, kAccesses, 0.99, 11);
  for (uint32_t& t : trace) t = perm[t];
  auto* mem = reinterpret_cast<volatile char*>(rig.mem());
  const PagerStats s0 = rig.p->stats();
  double secs = 0;
  uint64_t sum = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    for (uint32_t b : trace) sum += static_cast<unsigned char>(mem[uint64_t{b} * kPage + 8]);
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  benchmark::DoNotOptimize(sum);
  const PagerStats s = rig.p->stats();
  const double n = static_cast<double>(kAccesses);
  state.counters["hit_ratio"] = 1.0 - static_cast<double>(s.faults_remote - s0.faults_remote) / n;
  state.counters["victim_fault_ratio"] =
      static_cast<double>(s.faults_victim - s0.faults_victim) / n;
  state.counters["accesses_per_s"] = n / secs;
  state.counters["faults_waited"] = static_cast<double>(s.faults_waited - s0.faults_waited);
  state.counters["fifo_model"] = simulate_fifo(trace, kItems, cap).hit_ratio();
  state.counters["lru_model"] = simulate_lru(trace, kItems, cap).hit_ratio();
  state.counters["pager_model"] =
      victims ? simulate_victim_adaptive(trace, kItems, cap, 32, 0.25).hit_ratio()
              : simulate_fifo(trace, kItems, cap).hit_ratio();
  state.SetLabel(victims ? "victim cache (default)" : "victim_fraction 0 (FIFO)");
}

BENCHMARK(BM_ColdFault)
    ->ArgNames({"backend", "pinned"})
    ->ArgsProduct({{0, 1}, {1, 0}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FaultThroughput)
    ->ArgNames({"backend", "threads"})
    ->ArgsProduct({{0, 1}, {1, 2}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SeqScan)
    ->ArgNames({"backend", "prefetch"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RandomRMW)
    ->ArgNames({"backend", "budget_pct"})
    ->ArgsProduct({{0, 1}, {25, 50, 75}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ZipfReplacement)
    ->ArgName("victim")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// BM_ZapScattered/batched: the cost of dropping scattered pages, per page,
// the way a demotion batch does (pager/zap.h): batched:1 one
// process_madvise() per batch of `pages` (ZapBatch), batched:0 a madvise()
// per page, in interleaved rounds; `others`:1 with another thread of the
// process spinning on another CPU (the program running while the evictor
// demotes: every flush is then a cross-CPU interrupt). Pages at random
// addresses in 256 MiB, written before each round. Reports us_per_page
// (median round) for both and the ratio single / batched.
void BM_ZapScattered(benchmark::State& state) {
  const size_t pages = static_cast<size_t>(state.range(0));
  const bool others = state.range(1) != 0;
  constexpr size_t kSpan = 256u << 20;
  void* m = mmap(nullptr, kSpan, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    state.SkipWithError("mmap failed");
    return;
  }
  auto* mem = static_cast<char*>(m);
  std::atomic<bool> stop{false};
  std::thread spinner;
  if (others) {
    spinner = std::thread([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  std::mt19937_64 rng(5);
  std::vector<char*> at(pages);
  std::vector<double> single_us, batched_us;
  for (auto _ : state) {
    for (int round = 0; round < 64; ++round) {
      for (int mode = 0; mode < 2; ++mode) {
        for (auto& p : at) {
          p = mem + (rng() % (kSpan / 4096)) * 4096;
          *p = 1;
        }
        std::sort(at.begin(), at.end());
        const auto t0 = std::chrono::steady_clock::now();
        if (mode == 0) {
          for (char* p : at) (void)madvise(p, 4096, MADV_DONTNEED);
        } else {
          ZapBatch z;
          for (char* p : at) (void)z.add(p, 4096);
          (void)z.flush();
        }
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count() /
            static_cast<double>(pages);
        (mode == 0 ? single_us : batched_us).push_back(us);
      }
    }
  }
  stop = true;
  if (spinner.joinable()) spinner.join();
  munmap(m, kSpan);
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  state.counters["single_us_per_page"] = med(single_us);
  state.counters["batched_us_per_page"] = med(batched_us);
  state.counters["ratio"] = med(batched_us) > 0 ? med(single_us) / med(batched_us) : 0.0;
  state.counters["batching_available"] = ZapBatch::batching_available() ? 1 : 0;
}
BENCHMARK(BM_ZapScattered)
    ->ArgNames({"pages", "others"})
    ->ArgsProduct({{16, 64, 256}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace farmem

BENCHMARK_MAIN();
