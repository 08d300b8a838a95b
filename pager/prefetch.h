// Prefetch decisions from the fault history of one region: sequential and
// strided streams, and a majority trend over the recent deltas (as Leap
// does), with a window that grows while prefetched blocks are used and
// shrinks when they are not.
//
//   farmem::Prefetcher pf(/*max_window=*/32, n_blocks);
//   uint32_t cand[32];
//   size_t n = pf.on_fault(block, /*prefetch_hit=*/false, cand, 32);
//   // post READs for cand[0..n) whose blocks are still remote
//
// Cost: one short critical section per remote or victim fault; nothing
// allocates after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace farmem {

class Prefetcher {
 public:
  static constexpr int kHistory = 32;  // deltas remembered

  Prefetcher(uint32_t max_window, uint64_t n_blocks);

  // Records a fault on block b; prefetch_hit says it was a prefetched block
  // (the window grows). Writes up to cap candidate blocks (nearest first).
  // *confirmed (optional) says the stream is proven: the fault was a
  // prefetch hit, or it landed just past blocks prefetched on the current
  // trend (they were mapped at once and so never faulted).
  size_t on_fault(uint32_t b, bool prefetch_hit, uint32_t* out, size_t cap,
                  bool* confirmed = nullptr);
  // A prefetched block was dropped without use (the window shrinks).
  void on_unused();

  uint32_t window() const { return window_; }

  // Majority element of the last w deltas (Boyer-Moore vote); sets *delta
  // and returns true when one holds more than half of them. Exposed for tests.
  static bool majority(const int64_t* deltas, int n, int64_t* delta);

 private:
  // Returns the trend delta or 0 when the history shows none.
  int64_t trend_locked() const;

  const uint32_t max_window_;
  const uint64_t n_blocks_;
  std::mutex mu_;
  int64_t deltas_[kHistory] = {};  // ring, guarded by mu_
  int count_ = 0;                  // valid entries, guarded by mu_
  int pos_ = 0;                    // next write, guarded by mu_
  int64_t last_block_ = -1;        // guarded by mu_
  int64_t last_trend_ = 0;         // guarded by mu_
  uint32_t window_ = 0;            // guarded by mu_ (read racily for stats)
  uint32_t unused_streak_ = 0;     // guarded by mu_
};

}  // namespace farmem
