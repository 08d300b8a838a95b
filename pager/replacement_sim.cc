#include "pager/replacement_sim.h"

#include <cmath>
#include <random>

namespace farmem {
namespace {

constexpr uint32_t kNone = UINT32_MAX;

// Doubly linked lists over item ids; `where` says which list an item is on.
struct Lists {
  std::vector<uint32_t> prev, next;
  std::vector<uint8_t> where;  // 0 none, 1 first list, 2 second list
  uint32_t head[3] = {kNone, kNone, kNone}, tail[3] = {kNone, kNone, kNone};
  size_t size[3] = {0, 0, 0};
  explicit Lists(uint32_t n) : prev(n, kNone), next(n, kNone), where(n, 0) {}
  void push_front(int l, uint32_t x) {
    prev[x] = kNone;
    next[x] = head[l];
    if (head[l] != kNone) prev[head[l]] = x;
    head[l] = x;
    if (tail[l] == kNone) tail[l] = x;
    where[x] = static_cast<uint8_t>(l);
    ++size[l];
  }
  void remove(uint32_t x) {
    int l = where[x];
    if (prev[x] != kNone)
      next[prev[x]] = next[x];
    else
      head[l] = next[x];
    if (next[x] != kNone)
      prev[next[x]] = prev[x];
    else
      tail[l] = prev[x];
    where[x] = 0;
    --size[l];
  }
};

}  // namespace

std::vector<uint32_t> zipf_trace(uint32_t items, size_t length, double theta, uint64_t seed) {
  // Gray et al., "Quickly generating billion-record synthetic databases".
  double zetan = 0;
  for (uint32_t i = 1; i <= items; ++i) zetan += 1.0 / std::pow(static_cast<double>(i), theta);
  double zeta2 = 1.0 + 1.0 / std::pow(2.0, theta);
  double alpha = 1.0 / (1.0 - theta);
  double eta = (1.0 - std::pow(2.0 / items, 1.0 - theta)) / (1.0 - zeta2 / zetan);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<uint32_t> out(length);
  for (size_t k = 0; k < length; ++k) {
    double x = u(rng);
    double uz = x * zetan;
    uint32_t v;
    if (uz < 1.0)
      v = 0;
    else if (uz < zeta2)
      v = 1;
    else
      v = static_cast<uint32_t>(static_cast<double>(items) * std::pow(eta * x - eta + 1.0, alpha));
    out[k] = v < items ? v : items - 1;
  }
  return out;
}

SimResult simulate_fifo(const std::vector<uint32_t>& trace, uint32_t items, size_t capacity) {
  Lists l(items);
  SimResult r;
  for (uint32_t x : trace) {
    ++r.accesses;
    if (l.where[x]) {
      ++r.hits;
      continue;
    }
    l.push_front(1, x);
    if (l.size[1] > capacity) l.remove(l.tail[1]);
  }
  return r;
}

SimResult simulate_lru(const std::vector<uint32_t>& trace, uint32_t items, size_t capacity) {
  Lists l(items);
  SimResult r;
  for (uint32_t x : trace) {
    ++r.accesses;
    if (l.where[x]) {
      ++r.hits;
      l.remove(x);
    }
    l.push_front(1, x);
    if (l.size[1] > capacity) l.remove(l.tail[1]);
  }
  return r;
}

SimResult simulate_victim_fifo(const std::vector<uint32_t>& trace, uint32_t items, size_t capacity,
                               double victim_fraction) {
  // A fixed share is the adaptive model with its bounds equal.
  const size_t victims = static_cast<size_t>(victim_fraction * static_cast<double>(capacity));
  return simulate_victim_adaptive(trace, items, capacity, victims, victim_fraction);
}

SimResult simulate_victim_adaptive(const std::vector<uint32_t>& trace, uint32_t items,
                                   size_t capacity, size_t min_victims, double max_fraction,
                                   size_t* victims_out) {
  Lists l(items);  // list 1: mapped (active), list 2: victim cache
  SimResult r;
  const size_t hi = static_cast<size_t>(max_fraction * static_cast<double>(capacity));
  const size_t lo = min_victims < hi ? min_victims : hi;
  size_t victims = lo;
  uint64_t ev = 0, er = 0;  // victim and remote faults in this epoch
  for (uint32_t x : trace) {
    ++r.accesses;
    if (l.where[x] == 1) {
      ++r.hits;
      continue;
    }
    if (l.where[x] == 2) {
      ++r.hits;
      ++r.victim_hits;
      ++ev;
      l.remove(x);
    } else {
      ++er;
    }
    if (ev + er >= kVictimEpochFaults) {
      victims = adapt_victim_target(victims, ev, er, lo, hi, 1);
      ev = er = 0;
    }
    l.push_front(1, x);
    // A smaller target does not push victims out: they leave as drops do.
    while (l.size[1] > capacity - victims) {
      uint32_t old = l.tail[1];
      l.remove(old);
      l.push_front(2, old);
    }
    while (l.size[1] + l.size[2] > capacity) l.remove(l.tail[2]);
  }
  if (victims_out) *victims_out = victims;
  return r;
}

}  // namespace farmem
