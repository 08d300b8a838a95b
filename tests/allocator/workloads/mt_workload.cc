// A multi-threaded program for the preload tests: 4 threads build, mutate,
// grow and hash large buffers and containers concurrently (new/delete,
// realloc through std::vector growth, std::string), and free each other's
// blocks through a shared hand-off. Deterministic output.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

std::mutex g_mu;
std::atomic<uint64_t> g_bad{0};
std::vector<std::unique_ptr<std::vector<uint64_t>>> g_handoff;  // freed by another thread

uint64_t work(int t) {
  uint64_t h = 0;
  std::vector<std::vector<uint64_t>> keep;
  for (int round = 0; round < 40; ++round) {
    std::vector<uint64_t> v;
    const size_t n = 20000 + static_cast<size_t>(mix(t * 1000 + round) % 60000);
    for (size_t i = 0; i < n; ++i) v.push_back(mix(i + static_cast<uint64_t>(t) * 7919 + round));
    std::sort(v.begin(), v.end());
    for (size_t i = 0; i < v.size(); i += 17) h = mix(h ^ v[i]);
    std::string s(200000 + round * 1000, static_cast<char>('a' + (t + round) % 26));
    s[round] = 'Z';
    for (size_t i = 0; i < s.size(); i += 4096) h = mix(h + static_cast<uint64_t>(s[i]));
    if (round % 2 == 0) keep.push_back(std::move(v));
    auto mine = std::make_unique<std::vector<uint64_t>>(50000, mix(round + t));
    std::unique_ptr<std::vector<uint64_t>> theirs;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      g_handoff.push_back(std::move(mine));
      if (g_handoff.size() > 3) {
        theirs = std::move(g_handoff.front());
        g_handoff.erase(g_handoff.begin());
      }
    }
    // Another thread's block, freed here: its contents are checked (the
    // result must not depend on which block arrives, only on its being intact).
    if (theirs) {
      const uint64_t want = (*theirs)[0];
      for (uint64_t x : *theirs) g_bad += x != want;
    }
  }
  for (auto& v : keep) {
    for (size_t i = 0; i < v.size(); i += 101) h = mix(h ^ v[i]);
  }
  return h;
}

}  // namespace

int main() {
  constexpr int kThreads = 4;
  std::vector<uint64_t> result(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) ts.emplace_back([&result, t] { result[t] = work(t); });
  for (auto& th : ts) th.join();
  for (int t = 0; t < kThreads; ++t) {
    printf("thread %d: %016llx\n", t, static_cast<unsigned long long>(result[t]));
  }
  printf("corrupt words seen: %llu\n", static_cast<unsigned long long>(g_bad.load()));
  return g_bad.load() == 0 ? 0 : 1;
}
