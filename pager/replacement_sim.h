// Trace-driven model of the pager's replacement policy next to FIFO and
// exact LRU, at block granularity, for measuring hit ratios.
//
//   auto trace = farmem::zipf_trace(/*items=*/100000, /*length=*/2000000, 0.99, /*seed=*/1);
//   auto lru = farmem::simulate_lru(trace, 25000);
//   auto ours = farmem::simulate_victim_fifo(trace, 25000, 0.25);
//   printf("%.3f vs %.3f\n", ours.hit_ratio(), lru.hit_ratio());
//
// The pager cannot see accesses to mapped pages, only faults. Its policy
// ("victim FIFO"): mapped blocks age in FIFO order; the oldest is unmapped
// into a local victim cache (a share of the same budget) instead of being
// dropped; a fault on a victim maps it back at the head (a local, I/O-free
// fault that stands in for an accessed bit) and the oldest victim leaves.
// A "hit" is an access served without a remote READ; victim hits are
// counted separately because they still cost a local fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace farmem {

struct SimResult {
  uint64_t accesses = 0;
  uint64_t hits = 0;         // no remote READ (includes victim_hits)
  uint64_t victim_hits = 0;  // served by a local fault from the victim cache
  double hit_ratio() const {
    return accesses ? static_cast<double>(hits) / static_cast<double>(accesses) : 0.0;
  }
};

// Zipfian item ids in [0, items) with exponent theta (YCSB's generator),
// hottest item 0.
std::vector<uint32_t> zipf_trace(uint32_t items, size_t length, double theta, uint64_t seed);

SimResult simulate_fifo(const std::vector<uint32_t>& trace, uint32_t items, size_t capacity);
SimResult simulate_lru(const std::vector<uint32_t>& trace, uint32_t items, size_t capacity);
SimResult simulate_victim_fifo(const std::vector<uint32_t>& trace, uint32_t items, size_t capacity,
                               double victim_fraction);

// The pager's adaptive victim cache (evictor.h "Adaptive victim cache"): the
// same policy, but the victim share moves between min_victims and
// max_fraction * capacity, one step per epoch of kVictimEpochFaults faults
// (victim + remote) by adapt_victim_target(). victims_out (optional) gets
// the share at the end.
SimResult simulate_victim_adaptive(const std::vector<uint32_t>& trace, uint32_t items,
                                   size_t capacity, size_t min_victims, double max_fraction,
                                   size_t* victims_out = nullptr);

// One step of the controller both the pager's evictor and the model use:
// victim faults are the victim cache's cost, remote faults what it exists
// to avoid. When victim faults in the epoch exceed kVictimCostNum /
// kVictimCostDen of the remote faults, the cache costs more than it can
// save (a working set that nearly fits, or uniform access: it only turns
// mapped blocks into faults); the target shrinks by a quarter. Otherwise
// (thrashing, a skewed set much larger than the budget) it grows by a
// quarter (at least `step`). Clamped to [lo, hi].
constexpr uint64_t kVictimEpochFaults = 64;
constexpr uint64_t kVictimCostNum = 1, kVictimCostDen = 4;
inline uint64_t adapt_victim_target(uint64_t cur, uint64_t victim_faults, uint64_t remote_faults,
                                    uint64_t lo, uint64_t hi, uint64_t step) {
  if (victim_faults * kVictimCostDen > remote_faults * kVictimCostNum) {
    cur -= cur / 4;
  } else {
    cur += cur / 4 > step ? cur / 4 : step;
  }
  return cur < lo ? lo : (cur > hi ? hi : cur);
}

}  // namespace farmem
