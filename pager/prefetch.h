// Prefetch decisions from the fault history of one region.
//
//   farmem::Prefetcher pf(/*max_window=*/32, n_blocks);
//   uint32_t cand[32];
//   farmem::Prefetcher::Plan plan;
//   size_t n = pf.on_fault(block, /*prefetch_hit=*/false, /*write=*/false, cand, 32, &plan);
//   // post READs for cand[0..n) whose blocks are still remote; what cannot
//   // be posted now may be retried while pf.still_ahead(plan.stream, c)
//
// Two detectors, both fed by every remote or victim fault:
//   * a table of kStreams concurrent sequential streams (ascending or
//     descending), replaced LRU, each with its own next expected block, its
//     own adaptive window and its own prefetch front, as Linux readahead
//     keeps per-stream state. Interleaved streams (STREAM's c[i] = a[i] +
//     b[i] faults a, b, c, a+1, b+1, c+1, ...) are each followed on their
//     own. A stream is taken after two sequential steps (3 faults); a fault
//     anywhere from its next block to just past its prefetch front
//     continues it (prefetched blocks that were mapped at once never fault,
//     so the next fault lands past them).
//   * one delta history with a majority vote over it (as Leap does), for a
//     single strided stream (stride up to kMaxStride blocks) and a trend
//     with noise; used only when the fault continues no sequential stream.
// Windows start at 4 blocks, double on a prefetch hit or a fault just past
// the front (up to max_window) and halve after every 4 prefetched blocks
// dropped unused. A confirmed stream's prefetches are mapped at once but
// for one marker block half a window ahead (Plan::marker), whose fault
// keeps the stream a window ahead without a demand fault.
//
// Cost: one short critical section per remote or victim fault (a scan of
// kStreams entries); nothing allocates after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace farmem {

class Prefetcher {
 public:
  static constexpr int kHistory = 32;  // deltas remembered
  static constexpr int kStreams = 32;  // concurrent sequential streams
  static constexpr uint32_t kNoStream = 0xffffffffu;

  // What to do with the candidates of one fault.
  struct Plan {
    // The stream is proven: the fault was a prefetch hit, or it landed
    // past blocks prefetched for it (they were mapped at once and so never
    // faulted). Its prefetches can be mapped at once.
    bool confirmed = false;
    // The stream's last fault was a write: blocks mapped at once can be
    // mapped writable (and dirty), saving a write-protect fault each.
    bool write = false;
    // The sequential stream the candidates belong to (still_ahead()), or
    // kNoStream for the strided / majority trend.
    uint32_t stream = kNoStream;
    // On a confirmed stream, the candidate (window / 2 ahead) that should
    // NOT be mapped at once but wait in the victim cache: the stream's
    // fault on it (a prefetch hit) asks for the next window while half of
    // this one is still ahead, as Linux readahead's PG_readahead marker
    // does. kNoStream when none.
    uint32_t marker = kNoStream;
  };

  Prefetcher(uint32_t max_window, uint64_t n_blocks);

  // Records a fault on block b; prefetch_hit says it was a prefetched block
  // (the window grows), write that the access was a write. Writes up to
  // cap candidate blocks (nearest first) and fills *plan.
  size_t on_fault(uint32_t b, bool prefetch_hit, bool write, uint32_t* out, size_t cap, Plan* plan);
  // The same without the write flag; *confirmed as Plan::confirmed.
  size_t on_fault(uint32_t b, bool prefetch_hit, uint32_t* out, size_t cap,
                  bool* confirmed = nullptr);
  // A prefetched block was dropped without use (windows shrink).
  void on_unused();
  // A block a confirmed stream mapped ahead write-protected (a read
  // stream) was then written (a WP fault): the stream reads and writes
  // what it walks (a read-modify-write scan, an UPDATE), so its next
  // windows are mapped writable (Plan::write) until it is replaced. Returns
  // whether b belonged to a stream.
  bool on_written_ahead(uint32_t b);
  // True while block b is still ahead of stream `stream` (a Plan::stream):
  // the stream was not replaced and has not faulted at or past b. A
  // candidate that could not be posted at once is worth posting later only
  // then.
  bool still_ahead(uint32_t stream, uint32_t b);

  // Eviction behind streams: up to cap blocks from behind the confirmed
  // sequential streams (the most recently used first), for each the blocks
  // from gap to gap + span - 1 steps behind its latest fault, nearest
  // first, inside [0, n_blocks). The evictor takes those still mapped
  // ahead by a stream (pager/evictor.h "Eviction behind streams").
  size_t behind(uint32_t gap, uint32_t span, uint32_t* out, size_t cap);

  // The trend detector's window (statistics; read racily).
  uint32_t window() const { return window_; }
  // The window of the stream that block b would continue, 0 when none
  // (tests).
  uint32_t stream_window(uint32_t b);

  // Majority element of the last w deltas (Boyer-Moore vote); sets *delta
  // and returns true when one holds more than half of them. Exposed for tests.
  static bool majority(const int64_t* deltas, int n, int64_t* delta);

 private:
  struct Stream {
    int64_t last = -1;    // the stream's latest fault; -1: free entry
    int64_t front = -1;   // furthest candidate handed out (== last when none)
    int64_t marker = -1;  // the last Plan::marker handed out, -1: none
    int dir = 0;          // +1 / -1 once two faults agree; 0 after one fault
    uint32_t run = 0;     // sequential steps seen (capped)
    uint32_t window = 0;  // 0 until the stream is taken
    uint32_t gen = 0;     // bumped when the entry is reused (stale tags stop matching)
    uint64_t stamp = 0;   // last use (LRU replacement)
    bool confirmed = false;
    bool write = false;
    bool writes_ahead = false;  // on_written_ahead() saw its blocks written
  };

  // Returns the trend delta or 0 when the history shows none.
  int64_t trend_locked() const;
  // The entry b continues (established streams first), or -1.
  int match_locked(int64_t b) const;
  // Steps from s.last to b along s.dir (may be <= 0).
  static int64_t steps(const Stream& s, int64_t b) { return (b - s.last) * s.dir; }
  uint32_t tag(int i) const { return static_cast<uint32_t>(i) | (streams_[i].gen << 5); }

  const uint32_t max_window_;
  const uint64_t n_blocks_;
  std::mutex mu_;
  Stream streams_[kStreams];       // guarded by mu_
  uint64_t clock_ = 0;             // guarded by mu_
  int64_t deltas_[kHistory] = {};  // ring, guarded by mu_
  int count_ = 0;                  // valid entries, guarded by mu_
  int pos_ = 0;                    // next write, guarded by mu_
  int64_t last_block_ = -1;        // guarded by mu_
  int64_t last_trend_ = 0;         // guarded by mu_
  uint32_t window_ = 0;            // guarded by mu_ (read racily for stats)
  uint32_t unused_streak_ = 0;     // guarded by mu_
};

}  // namespace farmem
