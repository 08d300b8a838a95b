// The pager integrity workload shared by the pager, replication and
// transport tests: random 8-byte read-modify-writes and whole-page compares
// against a reference copy, from several threads at once.
//
//   std::vector<uint8_t> ref(pages * kPage, 0);
//   IntegrityWorkload w{.threads = 2, .ops = 8000, .seed = 99};
//   ResidentSampler sampler([&] { return p.resident_bytes(); }, mem, pages * kPage);
//   EXPECT_EQ(run_integrity_workload(mem, ref, pages, w), 0u);
//   sampler.stop();  // then sampler.max_counter(), max_mapped(), samples()
//   // or, with something done once half-way while the threads go on:
//   EXPECT_EQ(run_integrity_workload(mem, ref, pages, w, [&] { kill_a_donor(); }), 0u);
//
// Thread t owns the pages p % threads == t, so the reference copy needs no
// lock. Depends on nothing but the C and C++ libraries, so that tests on
// every backend (loopback, tcp, verbs, the far runtime) can include it.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "pager/uffd.h"

namespace farmem::testing {

inline constexpr size_t kIntegrityPage = 4096;

struct IntegrityWorkload {
  int threads = 2;
  int ops = 8000;     // in total, split evenly over the threads
  uint64_t seed = 0;  // thread t seeds its generator with seed + t
  // The mix of ops, as weights: whole-page compares, one-word compares and
  // one-word read-modify-writes.
  uint32_t page_compares = 1;
  uint32_t word_compares = 0;
  uint32_t writes = 1;
};

// Runs `w` over [mem, mem + pages * 4096), mirroring every write into
// `ref` (same size); at_half() runs once on the calling thread when half
// of the ops are done. Returns how many page compares found a difference.
template <class AtHalf>
uint64_t run_integrity_workload(uint8_t* mem, std::vector<uint8_t>& ref, size_t pages,
                                const IntegrityWorkload& w, AtHalf at_half) {
  constexpr size_t kPg = kIntegrityPage;
  std::atomic<uint64_t> mismatches{0};
  std::atomic<int> done{0};
  std::vector<std::thread> ts;
  const auto threads = static_cast<size_t>(w.threads);
  const uint32_t mix = w.page_compares + w.word_compares + w.writes;
  for (size_t t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(w.seed + t);
      const size_t mine = pages / threads;
      for (int i = 0; i < w.ops / w.threads; ++i) {
        size_t pg = (rng() % mine) * threads + t;
        size_t off = pg * kPg + (rng() % (kPg / 8)) * 8;
        const uint64_t op = rng() % mix;
        if (op < w.page_compares) {
          if (memcmp(mem + pg * kPg, ref.data() + pg * kPg, kPg) != 0) ++mismatches;
        } else if (op < w.page_compares + w.word_compares) {
          uint64_t a, b;
          memcpy(&a, mem + off, 8);
          memcpy(&b, ref.data() + off, 8);
          if (a != b) ++mismatches;
        } else {
          uint64_t v;
          memcpy(&v, mem + off, 8);
          v = v * 31 + rng();
          memcpy(mem + off, &v, 8);
          memcpy(ref.data() + off, &v, 8);
        }
        done.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  // Bounded by the threads' own progress: each adds ops / threads.
  const int half = (w.ops / w.threads) * w.threads / 2;
  while (done.load() < half) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  at_half();
  for (auto& th : ts) th.join();
  return mismatches.load();
}

inline uint64_t run_integrity_workload(uint8_t* mem, std::vector<uint8_t>& ref, size_t pages,
                                       const IntegrityWorkload& w) {
  return run_integrity_workload(mem, ref, pages, w, [] {});
}

// Pages of [p, p+len) that hold memory right now: the kernel's view, an
// independent check of the pager's own resident counter. PAGEMAP_SCAN
// (Linux >= 6.7) leaves out pages mapped to the shared zero page, which
// hold no memory (the pager maps it for reads of never-written blocks);
// without it, mincore(), which counts them.
inline size_t mapped_pages(void* p, size_t len) {
  static const farmem::Result<farmem::PagemapScan> scan = farmem::PagemapScan::open();
  if (scan.ok()) {
    const long n = scan->memory_pages(p, len);
    if (n >= 0) return static_cast<size_t>(n) * 4096 / kIntegrityPage;
  }
  std::vector<unsigned char> v(len / kIntegrityPage);
  if (mincore(p, len, v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

// Samples a resident-bytes counter and the bytes mapped in [mem, mem+len)
// about every millisecond on its own thread, keeping the peaks: the budget
// is checked during the run (invariant 5), not only at the end.
class ResidentSampler {
 public:
  ResidentSampler(std::function<uint64_t()> counter, void* mem, size_t len)
      : counter_(std::move(counter)), thread_([this, mem, len] {
          while (!done_.load()) {
            const uint64_t r = counter_();
            // A scan is not atomic: a page dropped behind it and another
            // mapped ahead of it while it walks are both counted, so under
            // load one scan can see a page or two more than were ever
            // mapped at once. The smaller of two back-to-back scans is kept
            // (an excess that lasts is seen by both; the pager's own
            // counter is checked exactly, by max_counter()).
            const uint64_t m =
                std::min(mapped_pages(mem, len), mapped_pages(mem, len)) * kIntegrityPage;
            if (r > max_counter_) max_counter_ = r;
            if (m > max_mapped_) max_mapped_ = m;
            ++samples_;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }) {}
  ~ResidentSampler() { stop(); }
  ResidentSampler(const ResidentSampler&) = delete;
  ResidentSampler& operator=(const ResidentSampler&) = delete;

  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t max_counter() const { return max_counter_.load(); }
  uint64_t max_mapped() const { return max_mapped_.load(); }
  uint64_t samples() const { return samples_.load(); }

 private:
  std::function<uint64_t()> counter_;
  std::atomic<bool> done_{false};
  std::atomic<uint64_t> max_counter_{0}, max_mapped_{0}, samples_{0};
  std::thread thread_;  // last: starts once the fields above exist
};

}  // namespace farmem::testing
