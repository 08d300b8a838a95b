// Pager statistics: a snapshot of plain counters, and the lock-free
// counters the pager threads bump (relaxed atomics, no allocation).
//
//   farmem::PagerStats s = pager->stats();
//   printf("remote faults %llu, p99 fetch %llu us\n", s.faults_remote,
//          s.fetch_latency.percentile_us(0.99));
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace farmem {

// Log2 buckets of microseconds: bucket 0 = [0, 1) us, bucket i = [2^(i-1), 2^i).
struct LatencyHistogram {
  static constexpr int kBuckets = 24;
  std::array<uint64_t, kBuckets> counts{};
  uint64_t total() const;
  // Upper bound (us) of the bucket holding the q-quantile; 0 when empty.
  uint64_t percentile_us(double q) const;
};

struct PagerStats {
  // Faults by how they were served.
  uint64_t faults_zero = 0;    // never-written block: zero-filled, no I/O
  uint64_t faults_remote = 0;  // fetched with a READ
  uint64_t faults_wp = 0;      // first write to a clean resident block (now dirty)
  uint64_t faults_victim = 0;  // block still local in the victim cache: mapped back, no I/O
  uint64_t faults_waited = 0;  // a fault that found the block busy or the budget full and waited
  // Of those that waited for a busy block: found again on a block that had
  // left (Remote or Empty) and answered by a wake, not a fetch, as the
  // install that ended the wait may have woken them already; one still
  // blocked faults again and is counted anew (run_deferred(), "Stale
  // entries").
  uint64_t faults_stale = 0;
  // Faults of a lone faulting thread served by a handler on another CPU
  // than that thread's: a wake-up across CPUs each way (fault_path.h
  // "Parked handlers"). Counted only where the thread's CPU is read, i.e.
  // with parked handlers on.
  uint64_t faults_cross_cpu = 0;
  // Zero-fill fault-around: never-written blocks mapped (zero) by the same
  // ioctl as a sequential zero fault just before them, i.e. first touches
  // that took no fault of their own (not part of faults_zero).
  uint64_t zero_around = 0;
  // Dirty blocks found all-zero with no remote copy at demotion: dropped
  // as never-written (Empty) without a WRITE (mostly fault-around blocks
  // mapped writable and never written).
  uint64_t zero_cleaned = 0;
  // Read faults on never-written blocks served by the shared zero page
  // (config.zero_page; part of faults_zero), and how many of those blocks
  // were written later (a WP fault gave them a page; part of faults_wp).
  uint64_t zero_mapped = 0;
  uint64_t zero_mapped_written = 0;
  LatencyHistogram fetch_latency;  // demand READ post -> installed
  // Eviction.
  uint64_t demotions = 0;         // resident -> victim cache
  uint64_t evictions_clean = 0;   // dropped without I/O
  uint64_t evictions_dirty = 0;   // written back, then dropped
  uint64_t writeback_errors = 0;  // WRITEs that failed and were kept for a retry
  // UFFDIO_MOVE (config uffd_move): blocks moved instead of copied, and
  // moves refused by the kernel (pinned / shared page) that took the copy path.
  uint64_t moves_out = 0;  // region -> victim slot (demotion)
  uint64_t moves_in = 0;   // victim slot -> region (victim hit)
  uint64_t move_fallbacks = 0;
  // Transport traffic.
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  // Prefetch.
  uint64_t prefetch_issued = 0;
  uint64_t prefetch_used = 0;    // a prefetched block faulted on before eviction
  uint64_t prefetch_mapped = 0;  // prefetched on a confirmed stream and mapped at once
  uint64_t prefetch_unused = 0;  // a prefetched block dropped unused
  // A block a read stream mapped ahead write-protected took a WP fault: the
  // stream's next windows are mapped writable (Prefetcher::on_written_ahead).
  uint64_t prefetch_written_ahead = 0;
  // Access tracking (pager/evictor.h): blocks seen in use by a victim hit
  // (given config.hot_laps), demand fetches that were refaults within
  // reach (given one lap), and passes of the active list's tail made by a
  // block without a demotion (one hot lap spent).
  uint64_t hot_marked = 0;
  uint64_t refaults_hot = 0;
  uint64_t hot_passes = 0;
  // Blocks demoted from behind a sequential stream instead of the list's
  // tail (pager/evictor.h "Eviction behind streams").
  uint64_t evicted_behind = 0;
  // Co-location (pager/evictor.h "Co-location"): how many times a lone
  // faulting thread was confined to its CPU with the evictor, for how long
  // in all, and the evictor's mean write-protect call while apart (ns; 0:
  // not measured), which decides it under FARMEM_COLOCATE=auto.
  uint64_t colocations = 0;
  uint64_t colocated_ns = 0;
  uint64_t flush_apart_ns = 0;
  // Memory.
  uint64_t resident_bytes = 0;  // mapped blocks + occupied victim slots (+ fetches in flight)
  uint64_t resident_peak_bytes = 0;
  uint64_t budget_bytes = 0;
  uint64_t remote_bytes = 0;  // remote space assigned to blocks
  uint64_t pinned_bytes = 0;  // blocks held resident by pin() (part of resident_bytes)

  std::string to_string() const;  // one line per group, for logs and benches
};

// The live counters. Cache-line aligned so that the hot ones do not share a
// line with the resident counter the evictor polls.
struct alignas(64) PagerCounters {
  std::atomic<uint64_t> faults_zero{0}, faults_remote{0}, faults_wp{0}, faults_victim{0},
      faults_waited{0}, faults_stale{0}, faults_cross_cpu{0}, zero_around{0}, zero_cleaned{0},
      zero_mapped{0}, zero_mapped_written{0};
  std::atomic<uint64_t> latency[LatencyHistogram::kBuckets]{};
  std::atomic<uint64_t> demotions{0}, evictions_clean{0}, evictions_dirty{0}, writeback_errors{0};
  std::atomic<uint64_t> moves_out{0}, moves_in{0}, move_fallbacks{0};
  std::atomic<uint64_t> reads{0}, writes{0}, bytes_read{0}, bytes_written{0};
  std::atomic<uint64_t> prefetch_issued{0}, prefetch_used{0}, prefetch_unused{0},
      prefetch_mapped{0}, prefetch_written_ahead{0};
  std::atomic<uint64_t> hot_marked{0}, refaults_hot{0}, hot_passes{0}, evicted_behind{0};
  std::atomic<uint64_t> colocations{0}, colocated_ns{0}, flush_apart_ns{0};

  static void bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
    c.fetch_add(n, std::memory_order_relaxed);
  }
  void record_latency_ns(uint64_t ns);
  void snapshot(PagerStats* out) const;
};

// The fetch latency histogram's bucket for ns (see LatencyHistogram).
inline int latency_bucket(uint64_t ns) {
  const uint64_t us = ns / 1000;
  const int b = us == 0 ? 0 : 64 - __builtin_clzll(us);
  return b < LatencyHistogram::kBuckets ? b : LatencyHistogram::kBuckets - 1;
}

// One handler thread's counters for its demand READs (the cold remote fault
// path), on lines no other thread writes, bumped by that thread alone with
// a relaxed load and store (no locked instruction); stats() adds them to
// the shared counters, so that every total stays exact. Measured in the
// "Fault-path cost" comment of pager/fault_path.h.
struct alignas(64) HandlerCounters {
  std::atomic<uint64_t> faults_remote{0}, reads{0}, bytes_read{0};
  std::atomic<uint64_t> latency[LatencyHistogram::kBuckets]{};

  // Only the owning thread calls these.
  static void bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void record_latency_ns(uint64_t ns) { bump(latency[latency_bucket(ns)]); }
  // Adds these counts to *out (any thread).
  void add_to(PagerStats* out) const;
};

}  // namespace farmem
