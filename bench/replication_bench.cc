// The cost of replication (issue 7), on loopback (backend:0, the pager's own
// cost) and tcp (backend:1, in-process DonorServers -- the code farmemd runs
// -- on 127.0.0.1:0, a DonorSession and TcpTransport each):
//   BM_ReplicatedRMW  random 4 KiB read-modify-write (every word of the page)
//                     over 64 MiB with a 16 MiB budget, us per op (median of
//                     7 interleaved rounds) for d1_r1 (one donor, one copy:
//                     the single-donor path), d3_r1 and d3_r2 (placement
//                     over 3 donors, 1 or 2 copies), and the ratios; the
//                     goal is d3_r2 at most 1.3x d3_r1 / d1_r1.
//   BM_RestoreFactor  256 MiB written back with 2 replicas over 3 donors,
//                     one donor killed: time until no extent is degraded,
//                     s_per_GiB of restored data, MiB restored, chunks redone.
//
//   build-R/bench/farmem_bench_replication   (one iteration each)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "pager/pager.h"
#include "pager/placement.h"
#include "pager/remote_map.h"
#include "pager/uffd.h"
#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/loopback_transport.h"
#include "runtime/tcp_transport.h"
#include "tests/runtime/local_donor.h"

namespace farmem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kPage = 4096;

// N loopback donors.
struct LoopbackEnv {
  using B = LoopbackTransport;
  static constexpr const char* kName = "loopback";
  std::vector<std::unique_ptr<LoopbackDonor>> donors;
  LoopbackTransport t;
  std::string error;
  explicit LoopbackEnv(int n) {
    for (int i = 0; i < n; ++i) {
      donors.push_back(std::make_unique<LoopbackDonor>(1ull << 30, 4ull << 20));
      (void)t.add_server(static_cast<ServerId>(i), donors.back().get());
    }
  }
  std::unique_ptr<SlabSource> single() {
    return std::make_unique<LoopbackSlabSource>(0, donors[0].get());
  }
  PlacementSource::Donor donor(int i) {
    PlacementSource::Donor d;
    LoopbackDonor* p = donors[static_cast<size_t>(i)].get();
    d.source = std::make_unique<LoopbackSlabSource>(static_cast<ServerId>(i), p);
    d.capacity = p->capacity();
    d.probe = [p] { return p->dead() ? make_error(Errc::kUnavailable, "dead") : ok_status(); };
    return d;
  }
  void kill(int i) { donors[static_cast<size_t>(i)]->kill(); }
};

// N in-process donor servers over tcp.
struct TcpEnv {
  using B = TcpTransport;
  static constexpr const char* kName = "tcp";
  std::vector<std::unique_ptr<testing::LocalDonor>> donors;
  std::unique_ptr<TcpTransport> tp = std::make_unique<TcpTransport>();
  TcpTransport& t = *tp;
  std::string error;
  explicit TcpEnv(int n) {
    for (int i = 0; i < n && error.empty(); ++i) {
      auto d = testing::LocalDonor::start(
          testing::local_donor_options("replication-bench-token", 1ull << 30, 4ull << 20));
      if (!d.ok()) {
        error = d.status().to_string();
        return;
      }
      donors.push_back(std::move(*d));
      Status st = t.add_server(static_cast<ServerId>(i), donors.back()->session());
      if (!st.ok()) error = st.to_string();
    }
  }
  ~TcpEnv() {
    tp.reset();
    donors.clear();
  }
  std::unique_ptr<SlabSource> single() {
    return std::make_unique<DonorSessionSlabSource>(0, donors[0]->session());
  }
  PlacementSource::Donor donor(int i) {
    PlacementSource::Donor d;
    DonorSession* s = donors[static_cast<size_t>(i)]->session();
    d.source = std::make_unique<DonorSessionSlabSource>(static_cast<ServerId>(i), s);
    d.capacity = s->welcome().capacity;
    d.probe = [s] { return s->heartbeat(); };
    return d;
  }
  void kill(int i) { donors[static_cast<size_t>(i)]->stop_server(); }
};

template <class Env>
struct Rig {
  Env env;
  std::unique_ptr<SlabSource> src;
  std::unique_ptr<Pager<typename Env::B>> p;
  Rig(int donors, uint32_t replicas) : env(donors) {
    if (!env.error.empty()) return;
    if (donors == 1 && replicas == 1) {
      src = env.single();
    } else {
      auto place = std::make_unique<PlacementSource>(replicas, 7);
      for (int i = 0; i < donors; ++i) {
        ServerId id;
        (void)place->add_donor(env.donor(i), &id);
      }
      src = std::move(place);
    }
  }
  bool start(benchmark::State& state, const PagerConfig& c) {
    std::string why = Uffd::unavailable_reason();
    if (!why.empty()) {
      state.SkipWithError(("userfaultfd unavailable: " + why).c_str());
      return false;
    }
    if (!env.error.empty()) {
      state.SkipWithError(env.error.c_str());
      return false;
    }
    auto r = Pager<typename Env::B>::create(c, &env.t, src.get());
    if (!r.ok()) {
      state.SkipWithError(r.status().to_string().c_str());
      return false;
    }
    p = std::move(*r);
    return true;
  }
  ~Rig() {
    p.reset();
    src.reset();
  }
};

// The three configurations side by side, in interleaved rounds (the load
// of a shared machine drifts; each round runs all three back to back), the
// median round of each counts.
template <class Env>
void replicated_rmw(benchmark::State& state) {
  constexpr size_t kPages = 16384;  // 64 MiB
  constexpr int kRounds = 7;
  const size_t ops = Env::kName[0] == 't' ? 2000 : 5000;  // per round
  PagerConfig c;
  c.region_size = 256ull << 20;
  c.local_budget = kPages * kPage / 4;
  c.handler_threads = 0;
  struct Config {
    int donors;
    uint32_t replicas;
    const char* name;
  };
  const Config cfgs[] = {{1, 1, "d1_r1"}, {3, 1, "d3_r1"}, {3, 2, "d3_r2"}};
  std::vector<std::unique_ptr<Rig<Env>>> rigs;
  std::vector<std::mt19937_64> rngs;
  for (const Config& k : cfgs) {
    rigs.push_back(std::make_unique<Rig<Env>>(k.donors, k.replicas));
    if (!rigs.back()->start(state, c)) return;
    char* mem = static_cast<char*>(rigs.back()->p->base());
    for (size_t pg = 0; pg < kPages; ++pg) memset(mem + pg * kPage, static_cast<int>(pg), kPage);
    rngs.emplace_back(3);
  }
  std::vector<std::vector<double>> us(3);
  std::vector<uint64_t> writes0(3), writes1(3), dirty0(3), dirty1(3);
  for (size_t i = 0; i < 3; ++i) {
    writes0[i] = rigs[i]->p->stats().writes;
    dirty0[i] = rigs[i]->p->stats().evictions_dirty;
  }
  for (auto _ : state) {
    for (int round = 0; round < kRounds; ++round) {
      for (size_t i = 0; i < 3; ++i) {
        char* mem = static_cast<char*>(rigs[i]->p->base());
        auto t0 = Clock::now();
        for (size_t n = 0; n < ops; ++n) {
          auto* w = reinterpret_cast<uint64_t*>(mem + (rngs[i]() % kPages) * kPage);
          for (size_t k = 0; k < kPage / 8; ++k) w[k] += 1;
        }
        us[i].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                        static_cast<double>(ops));
      }
    }
  }
  double med[3];
  for (size_t i = 0; i < 3; ++i) {
    std::sort(us[i].begin(), us[i].end());
    med[i] = us[i][us[i].size() / 2];
    writes1[i] = rigs[i]->p->stats().writes;
    dirty1[i] = rigs[i]->p->stats().evictions_dirty;
    state.counters[std::string("us_per_op_") + cfgs[i].name] = med[i];
    state.counters[std::string("writes_per_eviction_") + cfgs[i].name] =
        static_cast<double>(writes1[i] - writes0[i]) /
        static_cast<double>(std::max<uint64_t>(1, dirty1[i] - dirty0[i]));
  }
  state.counters["ratio_r2_vs_d3_r1"] = med[2] / med[1];
  state.counters["ratio_r2_vs_d1_r1"] = med[2] / med[0];
  state.SetLabel(Env::kName);
}

template <class Env>
void restore_factor(benchmark::State& state) {
  constexpr size_t kPages = 65536;  // 256 MiB
  PagerConfig c;
  c.region_size = 512ull << 20;
  c.local_budget = 16ull << 20;
  c.handler_threads = 0;
  Rig<Env> rig(3, 2);
  if (!rig.start(state, c)) return;
  char* mem = static_cast<char*>(rig.p->base());
  for (size_t pg = 0; pg < kPages; ++pg) memset(mem + pg * kPage, static_cast<int>(pg), kPage);
  // Let the evictor write back what is over the budget.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  double secs = 0;
  ReplicationStats r{};
  for (auto _ : state) {
    auto t0 = Clock::now();
    rig.env.kill(1);
    // Detection (a heartbeat, at most one probe interval) is part of it.
    while (true) {
      r = rig.p->replication_stats();
      if (r.donors_failed == 1 && r.extents_degraded == 0 && r.extents_restored > 0) break;
      if (Clock::now() - t0 > std::chrono::seconds(120)) {
        state.SkipWithError("re-replication did not finish in 120 s");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const double gib = static_cast<double>(r.bytes_restored) / static_cast<double>(1ull << 30);
  state.counters["restored_MiB"] = static_cast<double>(r.bytes_restored) / 1048576.0;
  state.counters["wall_s"] = secs;
  state.counters["s_per_GiB"] = secs / gib;
  state.counters["copy_s_per_GiB"] = static_cast<double>(r.restore_ns) / 1e9 / gib;
  state.counters["chunks_redone"] = static_cast<double>(r.chunks_redone);
  state.SetLabel(Env::kName);
}

void BM_ReplicatedRMW(benchmark::State& state) {
  if (state.range(0) == 0)
    replicated_rmw<LoopbackEnv>(state);
  else
    replicated_rmw<TcpEnv>(state);
}
void BM_RestoreFactor(benchmark::State& state) {
  if (state.range(0) == 0)
    restore_factor<LoopbackEnv>(state);
  else
    restore_factor<TcpEnv>(state);
}

BENCHMARK(BM_ReplicatedRMW)
    ->ArgNames({"backend"})
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RestoreFactor)
    ->ArgNames({"backend"})
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace farmem

BENCHMARK_MAIN();
