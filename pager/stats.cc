#include "pager/stats.h"

#include <cstdio>

namespace farmem {

uint64_t LatencyHistogram::total() const {
  uint64_t t = 0;
  for (uint64_t c : counts) t += c;
  return t;
}

uint64_t LatencyHistogram::percentile_us(double q) const {
  uint64_t t = total();
  if (t == 0) return 0;
  auto want = static_cast<uint64_t>(q * static_cast<double>(t));
  if (want >= t) want = t - 1;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts[static_cast<size_t>(i)];
    if (seen > want) return uint64_t{1} << i;
  }
  return uint64_t{1} << (kBuckets - 1);
}

void PagerCounters::record_latency_ns(uint64_t ns) {
  bump(latency[latency_bucket(ns)]);
}

void HandlerCounters::add_to(PagerStats* s) const {
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s->faults_remote += ld(faults_remote);
  s->reads += ld(reads);
  s->bytes_read += ld(bytes_read);
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    s->fetch_latency.counts[static_cast<size_t>(i)] += ld(latency[i]);
  }
}

void PagerCounters::snapshot(PagerStats* s) const {
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s->faults_zero = ld(faults_zero);
  s->faults_remote = ld(faults_remote);
  s->faults_wp = ld(faults_wp);
  s->faults_victim = ld(faults_victim);
  s->faults_waited = ld(faults_waited);
  s->faults_stale = ld(faults_stale);
  s->faults_cross_cpu = ld(faults_cross_cpu);
  s->zero_around = ld(zero_around);
  s->zero_cleaned = ld(zero_cleaned);
  s->zero_mapped = ld(zero_mapped);
  s->zero_mapped_written = ld(zero_mapped_written);
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    s->fetch_latency.counts[static_cast<size_t>(i)] = ld(latency[i]);
  }
  s->demotions = ld(demotions);
  s->evictions_clean = ld(evictions_clean);
  s->evictions_dirty = ld(evictions_dirty);
  s->writeback_errors = ld(writeback_errors);
  s->moves_out = ld(moves_out);
  s->moves_in = ld(moves_in);
  s->move_fallbacks = ld(move_fallbacks);
  s->reads = ld(reads);
  s->writes = ld(writes);
  s->bytes_read = ld(bytes_read);
  s->bytes_written = ld(bytes_written);
  s->prefetch_issued = ld(prefetch_issued);
  s->prefetch_used = ld(prefetch_used);
  s->prefetch_unused = ld(prefetch_unused);
  s->prefetch_mapped = ld(prefetch_mapped);
  s->prefetch_written_ahead = ld(prefetch_written_ahead);
  s->hot_marked = ld(hot_marked);
  s->refaults_hot = ld(refaults_hot);
  s->hot_passes = ld(hot_passes);
  s->evicted_behind = ld(evicted_behind);
  s->colocations = ld(colocations);
  s->colocated_ns = ld(colocated_ns);
  s->flush_apart_ns = ld(flush_apart_ns);
}

std::string PagerStats::to_string() const {
  char buf[1024];
  snprintf(
      buf, sizeof buf,
      "faults: zero %llu (+%llu around, %llu zero page, %llu of them written) remote %llu wp "
      "%llu victim %llu waited %llu (stale %llu) cross-CPU %llu; fetch p50 %llu us p99 %llu us\n"
      "evict: demoted %llu clean %llu dirty %llu zero-cleaned %llu wb-errors %llu; moved out "
      "%llu in %llu fallbacks %llu\n"
      "io: reads %llu (%llu B) writes %llu (%llu B)\n"
      "prefetch: issued %llu used %llu mapped %llu unused %llu written-ahead %llu\n"
      "access: hot marked %llu refaults %llu passes %llu behind streams %llu\n"
      "memory: resident %llu B (peak %llu) of budget %llu B; remote %llu B",
      static_cast<unsigned long long>(faults_zero), static_cast<unsigned long long>(zero_around),
      static_cast<unsigned long long>(zero_mapped),
      static_cast<unsigned long long>(zero_mapped_written),
      static_cast<unsigned long long>(faults_remote), static_cast<unsigned long long>(faults_wp),
      static_cast<unsigned long long>(faults_victim),
      static_cast<unsigned long long>(faults_waited), static_cast<unsigned long long>(faults_stale),
      static_cast<unsigned long long>(faults_cross_cpu),
      static_cast<unsigned long long>(fetch_latency.percentile_us(0.5)),
      static_cast<unsigned long long>(fetch_latency.percentile_us(0.99)),
      static_cast<unsigned long long>(demotions), static_cast<unsigned long long>(evictions_clean),
      static_cast<unsigned long long>(evictions_dirty),
      static_cast<unsigned long long>(zero_cleaned),
      static_cast<unsigned long long>(writeback_errors), static_cast<unsigned long long>(moves_out),
      static_cast<unsigned long long>(moves_in), static_cast<unsigned long long>(move_fallbacks),
      static_cast<unsigned long long>(reads), static_cast<unsigned long long>(bytes_read),
      static_cast<unsigned long long>(writes), static_cast<unsigned long long>(bytes_written),
      static_cast<unsigned long long>(prefetch_issued),
      static_cast<unsigned long long>(prefetch_used),
      static_cast<unsigned long long>(prefetch_mapped),
      static_cast<unsigned long long>(prefetch_unused),
      static_cast<unsigned long long>(prefetch_written_ahead),
      static_cast<unsigned long long>(hot_marked), static_cast<unsigned long long>(refaults_hot),
      static_cast<unsigned long long>(hot_passes), static_cast<unsigned long long>(evicted_behind),
      static_cast<unsigned long long>(resident_bytes),
      static_cast<unsigned long long>(resident_peak_bytes),
      static_cast<unsigned long long>(budget_bytes), static_cast<unsigned long long>(remote_bytes));
  return buf;
}

}  // namespace farmem
