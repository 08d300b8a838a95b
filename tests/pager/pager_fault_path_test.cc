// The fault path's fault counts: a first write to a never-written block is
// one fault (mapped writable + dirty), a write hitting the victim cache is
// one fault, and sequential first touches, ascending or descending, are
// served by zero-fill fault-around (one ioctl maps a run next to the
// fault, on the stream's side), within the budget and without transport
// traffic for blocks that were never written.
//
//   ctest -R PagerFaultPath
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "pager/park.h"
#include "tests/pager/pager_harness.h"

namespace farmem::testing {
namespace {

PagerConfig fault_path_config(size_t budget_pages, size_t region_pages) {
  PagerConfig c = small_config(budget_pages, region_pages);
  c.prefetch = false;  // every READ a donor sees is a demand fault
  // The stream logic alone: no zero-fill chunks (pager_zero_chunk_test).
  c.zero_chunk = 0;
  return c;
}

// Item 1: one fault per first write; a read keeps the write-protected zero
// page, so that its first write is a WP fault. Fault-around off: exact counts.
TEST(PagerFaultPath, FirstWriteToNeverWrittenBlockIsOneFault) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  PagerConfig c = fault_path_config(256, 4096);
  c.zero_fault_around = 0;
  P& p = rig.start(c);
  auto* mem = static_cast<volatile uint8_t*>(p.base());
  mem[10 * kPage + 5] = 1;  // write first touch
  mem[10 * kPage + 6] = 2;
  PagerStats s = p.stats();
  EXPECT_EQ(s.faults_zero, 1u) << s.to_string();
  EXPECT_EQ(s.faults_wp, 0u) << s.to_string();
  // The handler leaves Fetching just after the copy that woke this thread.
  EXPECT_TRUE(wait_until(
      [&] { return p.state_of(const_cast<uint8_t*>(mem + 10 * kPage)) == PageState::kPresent; },
      30000));
  EXPECT_EQ(mem[20 * kPage], 0u);  // read first touch: zero page, write-protected
  s = p.stats();
  EXPECT_EQ(s.faults_zero, 2u) << s.to_string();
  EXPECT_EQ(s.faults_wp, 0u) << s.to_string();
  mem[20 * kPage] = 3;  // its first write: a WP fault
  s = p.stats();
  EXPECT_EQ(s.faults_zero, 2u) << s.to_string();
  EXPECT_EQ(s.faults_wp, 1u) << s.to_string();
  EXPECT_EQ(s.zero_around, 0u) << s.to_string();
  // Both written blocks are dirty: evicted, they are written back once each
  // and read back byte-exact.
  ASSERT_TRUE(p.evict(const_cast<uint8_t*>(mem), 32 * kPage).ok());
  EXPECT_EQ(rig.donor.writes(), 2u);
  EXPECT_EQ(mem[10 * kPage + 5], 1u);
  EXPECT_EQ(mem[10 * kPage + 6], 2u);
  EXPECT_EQ(mem[20 * kPage], 3u);
  EXPECT_EQ(rig.donor.reads(), 2u);
}

// Writes fill_page(pg, 0) into pages [first, first + n) in order.
void write_seq(uint8_t* mem, size_t first, size_t n) {
  for (size_t pg = first; pg < first + n; ++pg) fill_page(mem + pg * kPage, pg, 0);
}

// Writes fill_page(pg, 0) into pages [first, first + n) from the top down.
void write_desc(uint8_t* mem, size_t first, size_t n) {
  for (size_t pg = first + n; pg-- > first;) fill_page(mem + pg * kPage, pg, 0);
}

// Item 2: first-touch writes of 1024 blocks, split between the threads,
// each its own range, ascending or descending (GNU sort fills its line
// table from the top of its buffer down), take at most 1024/8 zero faults
// and no WP fault; the data reads back byte-exact after eviction. Each
// range has a gap of 256 blocks on the side its run overshoots (after it
// ascending, below it descending; a run overshoots at most 64 blocks). One
// stream per thread and 8 streams remembered: no stream is ever replaced,
// so the bounds hold whatever the scheduling; the budget is above the data
// plus every overshoot, so nothing is evicted while the threads run and the
// watermark never cuts a run.
void first_writes(int threads, bool descending) {
  const size_t kPerThread = 1024 / static_cast<size_t>(threads);
  const size_t pages = kPerThread * static_cast<size_t>(threads);
  const size_t stride = kPerThread + 256;
  const size_t skip = descending ? 256 : 0;  // the gap before a range
  LoopbackRig rig(512ull << 20);
  P& p = rig.start(fault_path_config(pages + 1024, 4 * pages + 4096));
  auto* mem = static_cast<uint8_t*>(p.base());
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    const size_t first = static_cast<size_t>(t) * stride + skip;
    ts.emplace_back([=] {
      if (descending) {
        write_desc(mem, first, kPerThread);
      } else {
        write_seq(mem, first, kPerThread);
      }
    });
  }
  for (auto& th : ts) th.join();
  const PagerStats s = p.stats();
  EXPECT_LE(s.faults_zero, pages / 8) << s.to_string();
  EXPECT_EQ(s.faults_wp, 0u) << s.to_string();
  EXPECT_GE(s.faults_zero + s.zero_around, pages) << s.to_string();
  EXPECT_LE(s.zero_around, pages + 64u * static_cast<uint64_t>(threads)) << s.to_string();
  EXPECT_EQ(s.reads + s.writes, 0u) << s.to_string();
  EXPECT_EQ(rig.donor.reads() + rig.donor.writes(), 0u);
  EXPECT_LE(s.resident_peak_bytes, s.budget_bytes) << s.to_string();
  // Out to the donor and back: exactly the written blocks are written (the
  // ones mapped in a gap and never written are all-zero: back to Empty
  // without a WRITE), and read back byte-exact.
  ASSERT_TRUE(p.evict(mem, static_cast<size_t>(threads) * stride * kPage).ok());
  EXPECT_EQ(rig.donor.writes(), pages);
  EXPECT_EQ(p.resident_bytes(), 0u);
  for (int t = 0; t < threads; ++t) {
    const size_t first = static_cast<size_t>(t) * stride + skip;
    for (size_t pg = first; pg < first + kPerThread; ++pg) {
      uint8_t expect[kPage];
      fill_page(expect, pg, 0);
      ASSERT_EQ(memcmp(mem + pg * kPage, expect, kPage), 0) << "page " << pg;
    }
    // The gap: zeros, served without I/O.
    const size_t gap = descending ? first - 256 : first + kPerThread;
    for (size_t pg = gap; pg < gap + 256; ++pg) {
      ASSERT_EQ(mem[pg * kPage + 17], 0u) << "page " << pg;
    }
  }
  EXPECT_EQ(rig.donor.reads(), pages);
}

TEST(PagerFaultPath, SequentialFirstWritesFaultAround1Thread) {
  FARMEM_SKIP_WITHOUT_UFFD();
  first_writes(1, false);
}
TEST(PagerFaultPath, SequentialFirstWritesFaultAround2Threads) {
  FARMEM_SKIP_WITHOUT_UFFD();
  first_writes(2, false);
}
TEST(PagerFaultPath, SequentialFirstWritesFaultAround8Threads) {
  FARMEM_SKIP_WITHOUT_UFFD();
  first_writes(8, false);
}

// Reads of never-written blocks: fault-around maps them write-protected and
// clean (a later write is a WP fault), and nothing ever reaches the donor.
TEST(PagerFaultPath, SequentialFirstReadsFaultAroundWithoutTraffic) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  P& p = rig.start(fault_path_config(2048, 8192));
  auto* mem = static_cast<volatile uint8_t*>(p.base());
  uint64_t sum = 0;
  for (size_t pg = 0; pg < 1024; ++pg) sum += mem[pg * kPage + 100];
  EXPECT_EQ(sum, 0u);
  PagerStats s = p.stats();
  EXPECT_LE(s.faults_zero, 1024u / 8) << s.to_string();
  EXPECT_GE(s.faults_zero + s.zero_around, 1024u) << s.to_string();
  EXPECT_EQ(s.faults_wp, 0u) << s.to_string();
  // Mapped clean: a write to one is a WP fault.
  mem[500 * kPage] = 9;
  s = p.stats();
  EXPECT_EQ(s.faults_wp, 1u) << s.to_string();
  ASSERT_TRUE(p.evict(const_cast<uint8_t*>(mem), 1200 * kPage).ok());
  for (size_t pg = 0; pg < 1024; ++pg) sum += mem[pg * kPage + 100];
  EXPECT_EQ(sum, 0u);
  EXPECT_EQ(mem[500 * kPage], 9u);
  s = p.stats();
  EXPECT_EQ(rig.donor.writes(), 1u) << s.to_string();
  EXPECT_EQ(rig.donor.reads(), 1u) << s.to_string();
  EXPECT_EQ(s.reads, 1u) << s.to_string();
}

TEST(PagerFaultPath, DescendingFirstWritesFaultAround1Thread) {
  FARMEM_SKIP_WITHOUT_UFFD();
  first_writes(1, true);
}
TEST(PagerFaultPath, DescendingFirstWritesFaultAround2Threads) {
  FARMEM_SKIP_WITHOUT_UFFD();
  first_writes(2, true);
}
TEST(PagerFaultPath, DescendingFirstWritesFaultAround8Threads) {
  FARMEM_SKIP_WITHOUT_UFFD();
  first_writes(8, true);
}

// Descending reads of never-written blocks: mapped write-protected and
// clean, as ascending ones (a later write is a WP fault), no traffic.
TEST(PagerFaultPath, DescendingFirstReadsFaultAroundWithoutTraffic) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  P& p = rig.start(fault_path_config(2048, 8192));
  auto* mem = static_cast<volatile uint8_t*>(p.base());
  uint64_t sum = 0;
  for (size_t pg = 1024 + 256; pg-- > 256;) sum += mem[pg * kPage + 100];
  EXPECT_EQ(sum, 0u);
  PagerStats s = p.stats();
  EXPECT_LE(s.faults_zero, 1024u / 8) << s.to_string();
  EXPECT_GE(s.faults_zero + s.zero_around, 1024u) << s.to_string();
  EXPECT_EQ(s.faults_wp, 0u) << s.to_string();
  EXPECT_EQ(s.reads + s.writes, 0u) << s.to_string();
  // Mapped clean: a write to one is a WP fault.
  mem[700 * kPage] = 9;
  s = p.stats();
  EXPECT_EQ(s.faults_wp, 1u) << s.to_string();
  ASSERT_TRUE(p.evict(const_cast<uint8_t*>(mem), 1400 * kPage).ok());
  for (size_t pg = 256; pg < 1024 + 256; ++pg) sum += mem[pg * kPage + 100];
  EXPECT_EQ(sum, 0u);
  EXPECT_EQ(mem[700 * kPage], 9u);
  s = p.stats();
  EXPECT_EQ(rig.donor.writes(), 1u) << s.to_string();
  EXPECT_EQ(rig.donor.reads(), 1u) << s.to_string();
  EXPECT_EQ(s.reads, 1u) << s.to_string();
}

// Fault-around off (config.zero_fault_around = 0, FARMEM_ZERO_AROUND=0):
// every block of a descending (or ascending) first-touch walk is one fault.
TEST(PagerFaultPath, DescendingWithoutFaultAroundIsOneFaultPerBlock) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  PagerConfig c = fault_path_config(4096, 8192);  // nothing evicted
  c.zero_fault_around = 0;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  write_desc(mem, 256, 1024);
  write_seq(mem, 2048, 1024);
  const PagerStats s = p.stats();
  EXPECT_EQ(s.faults_zero, 2048u) << s.to_string();
  EXPECT_EQ(s.zero_around, 0u) << s.to_string();
  EXPECT_EQ(s.faults_wp, 0u) << s.to_string();
  EXPECT_EQ(first_bad_page(mem, 256 + 1024, 0, 256), 256u + 1024u);
  EXPECT_EQ(first_bad_page(mem, 2048 + 1024, 0, 2048), 2048u + 1024u);
}

// A descending run stops at a block that is not Empty: written blocks in
// the way (one resident, one evicted to the donor) keep their bytes, and
// the stream carries on below them.
TEST(PagerFaultPath, DescendingRunStopsAtWrittenBlocks) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  P& p = rig.start(fault_path_config(2048, 8192));
  auto* mem = static_cast<uint8_t*>(p.base());
  // Blocks 300 and 200: written alone (each starts a stream: no run), then
  // 200 goes to the donor.
  fill_page(mem + 300 * kPage, 300, 0);
  fill_page(mem + 200 * kPage, 200, 0);
  ASSERT_TRUE(p.evict(mem + 200 * kPage, kPage).ok());
  ASSERT_EQ(p.state_of(mem + 200 * kPage), PageState::kRemote);
  // A descending walk over [0, 1024) that skips them (and whatever
  // fault-around mapped next to them: it reads as zeros, so it is written
  // like any other block).
  for (size_t pg = 1024; pg-- > 0;) {
    if (pg == 300 || pg == 200) continue;
    fill_page(mem + pg * kPage, pg, 0);
  }
  EXPECT_EQ(first_bad_page(mem, 1024, 0), 1024u);
  const PagerStats s = p.stats();
  EXPECT_LE(s.faults_zero, 1024u / 8) << s.to_string();
  EXPECT_EQ(s.faults_wp, 0u) << s.to_string();
  EXPECT_EQ(s.faults_remote, 1u) << s.to_string();  // block 200, by first_bad_page
  ASSERT_TRUE(p.evict(mem, 1100 * kPage).ok());
  EXPECT_EQ(first_bad_page(mem, 1024, 0), 1024u);
}

// Fault-around never takes more than the budget: a sequential write of
// four times the budget (eviction all along) from 1, 2 and 8 threads keeps
// the peak within the budget, and every byte comes back.
TEST(PagerFaultPath, FaultAroundStaysWithinBudget) {
  FARMEM_SKIP_WITHOUT_UFFD();
  for (int threads : {1, 2, 8}) {
    constexpr size_t kBudget = 256;
    const size_t per = 4 * kBudget / static_cast<size_t>(threads);
    LoopbackRig rig;
    P& p = rig.start(fault_path_config(kBudget, 8192));
    auto* mem = static_cast<uint8_t*>(p.base());
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([=] { write_seq(mem, static_cast<size_t>(t) * per, per); });
    }
    for (auto& th : ts) th.join();
    const size_t pages = per * static_cast<size_t>(threads);
    const size_t bad = first_bad_page(mem, pages, 0);
    EXPECT_EQ(bad, pages) << threads << " threads";
    const PagerStats s = p.stats();
    EXPECT_LE(s.resident_peak_bytes, s.budget_bytes + P::kSlackBytes) << s.to_string();
    EXPECT_EQ(s.faults_wp, 0u) << s.to_string();
    EXPECT_GT(s.zero_around, 0u) << s.to_string();
  }
}

// A write stream at a full budget still maps runs: the budget is filled,
// then 4 budgets more are written first-touch in one ascending stream, so
// that every run needs the budget's last blocks (resident sits above the
// high watermark all along). Faults stay about one per run (53-67 here;
// the headroom rule alone took 290-308, runs of ~3 blocks), the peak
// within the budget, and every byte comes back.
TEST(PagerFaultPath, AWriteStreamAtAFullBudgetMapsRuns) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 256, kStream = 4 * kBudget;
  LoopbackRig rig;
  P& p = rig.start(fault_path_config(kBudget, 8192));
  auto* mem = static_cast<uint8_t*>(p.base());
  write_seq(mem, 0, kBudget);
  const PagerStats before = p.stats();
  write_seq(mem, 2 * kBudget, kStream);
  const PagerStats s = p.stats();
  const uint64_t zero_faults = s.faults_zero - before.faults_zero;
  EXPECT_LE(zero_faults, kStream / 8) << s.to_string();
  EXPECT_GE(zero_faults + s.zero_around - before.zero_around, kStream) << s.to_string();
  EXPECT_GT(s.evictions_dirty, kStream / 2) << s.to_string();
  EXPECT_LE(s.resident_peak_bytes, s.budget_bytes) << s.to_string();
  EXPECT_EQ(first_bad_page(mem, kBudget, 0), kBudget);
  EXPECT_EQ(first_bad_page(mem, 2 * kBudget + kStream, 0, 2 * kBudget), 2 * kBudget + kStream);
}

// Each handler thread counts its own demand READs (HandlerCounters) and
// stats() sums them with the shared counters: with two handlers and two
// threads faulting at once, every count of a remote fault is exact
// (faults_remote, reads, bytes_read, the fetch latency histogram), and the
// data byte-exact.
TEST(PagerFaultPath, RemoteFaultCountsAreExactAcrossHandlers) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kPages = 512;
  LoopbackRig rig;
  PagerConfig c = fault_path_config(1024, 4096);  // room for all: nothing evicted meanwhile
  ASSERT_EQ(c.handler_threads, 2u);
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  for (size_t pg = 0; pg < kPages; ++pg) fill_page(mem + pg * kPage, pg, 0);
  ASSERT_TRUE(p.evict(mem, kPages * kPage).ok());
  for (size_t pg = 0; pg < kPages; ++pg)
    ASSERT_EQ(p.state_of(mem + pg * kPage), PageState::kRemote);
  const PagerStats before = p.stats();
  const uint64_t donor_reads0 = rig.donor.reads();
  std::vector<std::thread> ts;
  for (size_t t = 0; t < 2; ++t) {
    ts.emplace_back([mem, t] {
      auto* v = reinterpret_cast<volatile uint8_t*>(mem);
      for (size_t pg = t; pg < kPages; pg += 2) (void)v[pg * kPage + 17];
    });
  }
  for (auto& th : ts) th.join();
  // The histogram is recorded just after the copy that woke the thread.
  EXPECT_TRUE(wait_until(
      [&] { return p.stats().fetch_latency.total() - before.fetch_latency.total() == kPages; },
      30000));
  const PagerStats s = p.stats();
  EXPECT_EQ(s.faults_remote - before.faults_remote, kPages) << s.to_string();
  EXPECT_EQ(s.reads - before.reads, kPages) << s.to_string();
  EXPECT_EQ(s.bytes_read - before.bytes_read, kPages * kPage) << s.to_string();
  EXPECT_EQ(s.fetch_latency.total() - before.fetch_latency.total(), kPages) << s.to_string();
  EXPECT_EQ(s.faults_victim - before.faults_victim, 0u) << s.to_string();
  EXPECT_EQ(s.faults_zero - before.faults_zero, 0u) << s.to_string();
  EXPECT_EQ(rig.donor.reads() - donor_reads0, kPages);
  EXPECT_EQ(first_bad_page(mem, kPages, 0), kPages);
}

// Item 3: a write that hits the victim cache maps the block writable and
// dirty: one fault, no WP fault after it.
TEST(PagerFaultPath, VictimHitOnWriteIsOneFault) {
  FARMEM_SKIP_WITHOUT_UFFD();
  constexpr size_t kBudget = 128, kPages = 512;
  LoopbackRig rig;
  PagerConfig c = fault_path_config(kBudget, 4096);
  c.victim_fraction = 0.5;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  write_seq(mem, 0, kPages);
  // Read the first pages back (remote faults, clean) so that the victim
  // cache also holds clean blocks, then let the evictor settle at its low
  // watermark.
  auto* v = static_cast<volatile uint8_t*>(p.base());
  for (size_t pg = 0; pg < kPages; pg += 2) (void)v[pg * kPage];
  const uint64_t low = static_cast<uint64_t>(c.low_watermark * kBudget) * kPage;
  ASSERT_TRUE(wait_until([&] { return p.resident_bytes() <= low; }, 30000));
  std::vector<size_t> victims;
  for (size_t pg = 0; pg < kPages; ++pg)
    if (p.state_of(mem + pg * kPage) == PageState::kVictim) victims.push_back(pg);
  ASSERT_FALSE(victims.empty());
  const PagerStats before = p.stats();
  for (size_t pg : victims) mem[pg * kPage + 9] = static_cast<uint8_t>(pg ^ 0x5a);
  const PagerStats s = p.stats();
  // One fault per write, never a WP fault after it. Each promotion by copy
  // leaves its slot's page charged (evictor.h "Free slots' pages"), so the
  // evictor runs meanwhile and may drop a few victims not yet written:
  // their write is one remote fault instead.
  const uint64_t dv = s.faults_victim - before.faults_victim;
  EXPECT_EQ(dv + s.faults_remote - before.faults_remote, victims.size()) << s.to_string();
  EXPECT_GE(dv, victims.size() * 3 / 4) << s.to_string();
  EXPECT_EQ(s.faults_wp - before.faults_wp, 0u) << s.to_string();
  for (size_t pg : victims) ASSERT_EQ(mem[pg * kPage + 9], static_cast<uint8_t>(pg ^ 0x5a));
  // Dirty: written back when evicted, and byte-exact after.
  const uint64_t w0 = rig.donor.writes();
  ASSERT_TRUE(p.evict(mem, kPages * kPage).ok());
  EXPECT_GE(rig.donor.writes() - w0, victims.size());
  for (size_t pg : victims) {
    uint8_t expect[kPage];
    fill_page(expect, pg, 0);
    expect[9] = static_cast<uint8_t>(pg ^ 0x5a);
    ASSERT_EQ(memcmp(mem + pg * kPage, expect, kPage), 0) << "page " << pg;
  }
}

// Written blocks come back writable (fault_path.h): a block seen written
// in its last stay (a write fault or a WP fault) is mapped writable and
// dirty by a read fault, so that its next write takes no WP fault. Such a
// guessed stay sees no write, so what decides the next one is whether the
// content the block leaves with differs from what its fetch brought
// (PageTable::fetched_hash()): a block written in every stay stays
// writable (before the hash it alternated, a WP fault every second
// fetch), one only read since comes back write-protected and then leaves
// without a write-back, and one rewritten with the same bytes counts as
// unwritten (a hint: its next write is a WP fault, and seen again).
TEST(PagerFaultPath, WrittenBlockComesBackWritable) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  PagerConfig c = fault_path_config(256, 4096);
  c.zero_fault_around = 0;
  P& p = rig.start(c);
  auto* mem = static_cast<volatile uint8_t*>(p.base());
  auto* raw = const_cast<uint8_t*>(mem);
  uint8_t* a = raw + 10 * kPage;  // written in every stay
  uint8_t* r = raw + 11 * kPage;  // written once, then only read
  auto evict_both = [&] {
    ASSERT_TRUE(p.evict(a, 2 * kPage).ok());
    ASSERT_EQ(p.state_of(a), PageState::kRemote);
    ASSERT_EQ(p.state_of(r), PageState::kRemote);
  };
  // Touches a (read, then write) and r (read); returns the WP faults taken.
  uint8_t next = 2;
  auto stay = [&] {
    const PagerStats s0 = p.stats();
    EXPECT_EQ(a[0], next - 1);
    EXPECT_EQ(r[0], 0x77);
    a[0] = next++;
    const PagerStats s1 = p.stats();
    EXPECT_EQ(s1.faults_remote - s0.faults_remote, 2u) << s1.to_string();
    return s1.faults_wp - s0.faults_wp;
  };
  mem[10 * kPage] = 1;  // stay 0: both written (write faults, seen; not all-zero)
  mem[11 * kPage] = 0x77;
  evict_both();
  EXPECT_EQ(rig.donor.writes(), 2u);
  // Stay 1: both guessed writable: a's write takes no WP fault; both are
  // written back (r's write-back is the price of the guess), a changed.
  EXPECT_EQ(stay(), 0u);
  evict_both();
  EXPECT_EQ(rig.donor.writes(), 4u);
  // Stays 2 and 3: a changed in its guessed stay: writable again, no WP
  // fault; r did not: write-protected, and it leaves clean without a write.
  EXPECT_EQ(stay(), 0u);
  evict_both();
  EXPECT_EQ(rig.donor.writes(), 5u);
  EXPECT_EQ(stay(), 0u);
  evict_both();
  EXPECT_EQ(rig.donor.writes(), 6u);
  // Stay 4: a is rewritten with the bytes it came with: written back (the
  // write-back never depends on the hash), but counted as unwritten ...
  {
    const PagerStats s0 = p.stats();
    EXPECT_EQ(a[0], next - 1);
    a[0] = static_cast<uint8_t>(next - 1);
    EXPECT_EQ(p.stats().faults_wp - s0.faults_wp, 0u);
  }
  ASSERT_TRUE(p.evict(a, kPage).ok());
  EXPECT_EQ(rig.donor.writes(), 7u);
  // ... so stay 5 maps it write-protected, and its real write is seen.
  EXPECT_EQ(stay(), 1u);
  evict_both();
  EXPECT_EQ(rig.donor.writes(), 8u);
  EXPECT_EQ(stay(), 0u);  // seen written: writable again
  evict_both();
  EXPECT_EQ(a[0], next - 1);  // byte-exact after every round trip
  EXPECT_EQ(r[0], 0x77);
}

TEST(PagerFaultPath, WrittenWritableOffKeepsWriteProtection) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  PagerConfig c = fault_path_config(256, 4096);
  c.zero_fault_around = 0;
  c.written_writable = false;
  P& p = rig.start(c);
  auto* mem = static_cast<volatile uint8_t*>(p.base());
  auto* raw = const_cast<uint8_t*>(mem);
  mem[10 * kPage] = 5;
  ASSERT_TRUE(p.evict(raw + 10 * kPage, kPage).ok());
  const PagerStats s0 = p.stats();
  EXPECT_EQ(mem[10 * kPage], 5u);
  mem[10 * kPage] = 6;
  const PagerStats s1 = p.stats();
  EXPECT_EQ(s1.faults_remote - s0.faults_remote, 1u) << s1.to_string();
  EXPECT_EQ(s1.faults_wp - s0.faults_wp, 1u) << s1.to_string();
  ASSERT_TRUE(p.evict(raw + 10 * kPage, kPage).ok());
  EXPECT_EQ(mem[10 * kPage], 6u);
}

// Handlers per CPU (fault_path.h): by default one fault handler per CPU
// the process may use, each pinned to its own CPU (the kernel's view, read
// back from /proc), and faults are served byte-exact. Unpinned on request.
// Of each thread named `thread` (fm-fault: the handlers): its CPUs
// (Cpus_allowed_list) and its voluntary context switches so far, sorted by
// CPUs.
std::vector<std::pair<std::string, long>> threads_named(const std::string& thread) {
  std::vector<std::pair<std::string, long>> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(dir + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name != thread) continue;
    std::ifstream status(dir + "/status");
    std::string line, cpus;
    long sw = -1;
    while (std::getline(status, line)) {
      std::string v = line.substr(line.find(':') + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      if (line.rfind("Cpus_allowed_list:", 0) == 0) cpus = v;
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) sw = std::stol(v);
    }
    out.emplace_back(cpus, sw);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::string, long>> fault_threads() {
  return threads_named("fm-fault");
}

std::vector<std::string> fault_thread_cpus() {
  std::vector<std::string> out;
  for (const auto& t : fault_threads()) out.push_back(t.first);
  return out;
}

TEST(PagerFaultPath, HandlersArePinnedOnePerCpu) {
  FARMEM_SKIP_WITHOUT_UFFD();
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  {
    LoopbackRig rig;
    PagerConfig c = fault_path_config(64, 1024);
    c.handler_threads = 0;  // the default: one per CPU
    P& p = rig.start(c);
    ASSERT_EQ(p.handler_count(), std::min<size_t>(cpus.size(), 64));
    std::vector<std::string> want;
    for (size_t i = 0; i < p.handler_count(); ++i) {
      EXPECT_EQ(p.handler_cpu(i), cpus[i]);
      want.push_back(std::to_string(cpus[i]));
    }
    std::sort(want.begin(), want.end());
    // Each thread names itself as it starts.
    EXPECT_TRUE(wait_until([&] { return fault_thread_cpus() == want; }))
        << fault_thread_cpus().size();
    // Served byte-exact through eviction, from this thread wherever it runs.
    auto* mem = static_cast<volatile uint8_t*>(p.base());
    for (size_t i = 0; i < 256; ++i) mem[i * kPage] = static_cast<uint8_t>(i * 7 + 1);
    for (size_t i = 0; i < 256; ++i) ASSERT_EQ(mem[i * kPage], static_cast<uint8_t>(i * 7 + 1));
    EXPECT_GT(p.stats().faults_remote, 0u);
  }
  {
    LoopbackRig rig;
    PagerConfig c = fault_path_config(64, 1024);
    c.handler_threads = 2;
    c.pin_handlers = false;
    P& p = rig.start(c);
    ASSERT_EQ(p.handler_count(), 2u);
    EXPECT_EQ(p.handler_cpu(0), -1);
    EXPECT_EQ(p.handler_cpu(1), -1);
    ASSERT_TRUE(wait_until([&] { return fault_thread_cpus().size() == 2; }));
    std::vector<std::string> got = fault_thread_cpus();
    if (cpus.size() > 1) {
      EXPECT_NE(got[0], std::to_string(cpus[0]));  // not one CPU
    }
  }
  if (cpus.size() > 1) {
    // Fewer handlers than CPUs: not pinned (a CPU without a handler of its
    // own would send every fault elsewhere).
    LoopbackRig rig;
    PagerConfig c = fault_path_config(64, 1024);
    c.handler_threads = 1;
    P& p = rig.start(c);
    EXPECT_EQ(p.handler_cpu(0), -1);
  }
}

// Parked handlers (fault_path.h): the voluntary context switches of the
// fm-fault thread pinned to `cpu`.
long switches_of(const std::vector<std::pair<std::string, long>>& v, int cpu) {
  for (const auto& [c, sw] : v)
    if (c == std::to_string(cpu)) return sw;
  return -1;
}

// Writes then reads back `pages` pages of `mem` (with a budget far below
// them: every read after the first pass is a remote fault).
void write_and_check(uint8_t* mem, size_t pages, uint64_t version) {
  for (size_t i = 0; i < pages; ++i) fill_page(mem + i * kPage, i, version);
  ASSERT_EQ(first_bad_page(mem, pages, version), pages);
}

// Confines the calling thread to `cpu`.
void run_only_on(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
}

// Gives the calling thread back the CPUs it had when this was made, at the
// end of the scope (also when an assertion returns early).
struct KeepsAffinity {
  cpu_set_t saved;
  KeepsAffinity() { EXPECT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0); }
  ~KeepsAffinity() { EXPECT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0); }
};

// The calling thread in the registry for its lifetime, as preload/shim.cc
// puts every thread the program starts.
struct InThreadRegistry {
  InThreadRegistry() { register_thread_cpu(); }
  ~InThreadRegistry() { unregister_thread_cpu(); }
};

// With faults from the main thread alone, the handler that is not on its
// CPU parks: it is no longer woken by each fault (the old behaviour: every
// handler blocked in read() was, and the one on the other CPU served most
// faults). A fault from another thread brings it back; faults from that
// one thread alone park the handler not on its CPU. Byte-exact always.
TEST(PagerFaultPath, HandlersOffTheMainThreadsCpuPark) {
  FARMEM_SKIP_WITHOUT_UFFD();
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  const KeepsAffinity keep;
  {
    LoopbackRig rig;
    PagerConfig c = fault_path_config(64, 4096);
    c.handler_threads = 2;  // pinned to cpus[0] and cpus[1]
    P& p = rig.start(c);
    ASSERT_EQ(p.handler_cpu(0), cpus[0]);
    ASSERT_EQ(p.handler_cpu(1), cpus[1]);
    run_only_on(cpus[0]);  // the main thread stays there
    auto* mem = static_cast<uint8_t*>(p.base());
    write_and_check(mem, 1024, 1);  // the first main-thread faults: the other handler parks
    const auto before = fault_threads();
    const uint64_t f0 = p.stats().faults_remote;
    for (uint64_t round = 2; round < 5; ++round) write_and_check(mem, 1024, round);
    const auto after = fault_threads();
    const uint64_t faults = p.stats().faults_remote - f0;
    ASSERT_GE(faults, 2000u) << p.stats().to_string();
    const long home = switches_of(after, cpus[0]) - switches_of(before, cpus[0]);
    const long away = switches_of(after, cpus[1]) - switches_of(before, cpus[1]);
    // The home handler serves every fault (back to back ones without a
    // sleep in between, so it switches at least once per few faults: 1.2k
    // to 2.9k times over 6144 here); the parked one wakes every kParkNs at
    // most.
    EXPECT_GE(home, static_cast<long>(faults) / 8) << "the handler on the main thread's CPU";
    EXPECT_LT(away, static_cast<long>(faults) / 20)
        << "the parked handler, over " << faults << " faults (home: " << home << ")";

    // Another thread, on the other CPU, faults: the parked handler is up again.
    const auto b2 = fault_threads();
    std::thread t([&] {
      run_only_on(cpus[1]);
      for (uint64_t round = 7; round < 10; ++round) write_and_check(mem, 1024, round);
    });
    t.join();
    const long away2 = switches_of(fault_threads(), cpus[1]) - switches_of(b2, cpus[1]);
    EXPECT_GE(away2, 1000) << "the handler on the other thread's CPU";
    write_and_check(mem, 1024, 11);

    // Faults from one thread that is not the main one (a program whose
    // worker does the work, registered as preload/shim.cc registers every
    // thread it starts): the handler on the main thread's CPU parks in turn.
    std::thread w([&] {
      run_only_on(cpus[1]);
      const InThreadRegistry in;
      EXPECT_EQ(registered_thread_cpu(static_cast<int>(gettid())), cpus[1]);
      write_and_check(mem, 1024, 12);
      // Past kParkAfterOtherNs since the main thread's last fault.
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      write_and_check(mem, 1024, 13);
      const auto b3 = fault_threads();
      const uint64_t f3 = p.stats().faults_remote;
      for (uint64_t round = 14; round < 17; ++round) write_and_check(mem, 1024, round);
      const auto a3 = fault_threads();
      const uint64_t faults3 = p.stats().faults_remote - f3;
      const long home3 = switches_of(a3, cpus[1]) - switches_of(b3, cpus[1]);
      const long away3 = switches_of(a3, cpus[0]) - switches_of(b3, cpus[0]);
      EXPECT_GE(home3, static_cast<long>(faults3) / 8) << "the handler on the worker's CPU";
      EXPECT_LT(away3, static_cast<long>(faults3) / 20)
          << "the handler on the main thread's CPU, over " << faults3 << " faults of the worker";
    });
    w.join();
    write_and_check(mem, 1024, 17);
  }
}

// faults_cross_cpu (stats.h): faults of the lone faulting thread served by
// a handler on another CPU. With the main thread kept on one CPU the
// handler there serves them (the other is parked); moved to the other CPU,
// its first fault is read by the handler it left (the one there is parked
// until then), and the rest by the handler on its new CPU. BM_ColdFault
// reports the count with the p50 (a main thread free to move: 5% of its
// faults since the parked handlers are woken after the fault is answered,
// 28-36% before). Byte-exact.
TEST(PagerFaultPath, FaultsServedFromAnotherCpuAreCounted) {
  FARMEM_SKIP_WITHOUT_UFFD();
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  const KeepsAffinity keep;
  LoopbackRig rig;
  PagerConfig c = fault_path_config(64, 4096);
  c.handler_threads = 2;  // pinned to cpus[0] and cpus[1]
  c.colocate = ColocateMode::kOff;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  // Two rounds of write_and_check() from `cpu`: the remote faults, and how
  // many of them were served across CPUs.
  uint64_t version = 2;
  auto rounds_on = [&](int cpu, uint64_t* faults, uint64_t* cross) {
    run_only_on(cpu);
    const PagerStats s0 = p.stats();
    for (int r = 0; r < 2; ++r) write_and_check(mem, 1024, version++);
    const PagerStats s = p.stats();
    *faults = s.faults_remote - s0.faults_remote;
    *cross = s.faults_cross_cpu - s0.faults_cross_cpu;
    EXPECT_GE(*faults, 1500u) << s.to_string();
  };
  run_only_on(cpus[0]);
  write_and_check(mem, 1024, 1);  // the handler on cpus[1] parks
  uint64_t faults = 0, cross = 0;
  rounds_on(cpus[0], &faults, &cross);
  EXPECT_LT(cross, faults / 20) << p.stats().to_string();
  rounds_on(cpus[1], &faults, &cross);
  EXPECT_GE(cross, 1u) << p.stats().to_string();
  EXPECT_LT(cross, faults / 20) << p.stats().to_string();
}

// A busy registry is no news (pager/park.h kRegistryBusy): while another
// thread keeps taking the registry's lock (here a thread asking for the
// worker over and over, as the evictor's co-location does once a window,
// and as a preempted holder does for milliseconds), the registered
// worker's faults still park the handler that is not on its CPU. It
// failed in CI before: a busy lookup read as "an unknown thread faulted"
// kept both handlers up for kParkAfterOtherNs. Byte-exact always.
TEST(PagerFaultPath, ABusyThreadRegistryKeepsTheOtherHandlerParked) {
  FARMEM_SKIP_WITHOUT_UFFD();
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  LoopbackRig rig;
  PagerConfig c = fault_path_config(64, 4096);
  c.handler_threads = 2;  // pinned to cpus[0] and cpus[1]
  c.colocate = ColocateMode::kOff;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  std::atomic<int> worker_tid{0};
  std::atomic<bool> done{false};
  std::atomic<uint64_t> lookups{0}, busy{0}, unknown{0};
  std::thread asker([&] {
    run_only_on(cpus[0]);
    while (!done.load()) {
      const int tid = worker_tid.load();
      if (tid == 0) {
        std::this_thread::yield();
        continue;
      }
      EXPECT_TRUE(thread_registered(tid, nullptr));
      const int cpu = registered_thread_cpu(tid);
      lookups.fetch_add(1);
      if (cpu == kRegistryBusy) busy.fetch_add(1);
      if (cpu == -1) unknown.fetch_add(1);
    }
  });
  std::thread w([&] {
    run_only_on(cpus[1]);
    const InThreadRegistry in;
    worker_tid.store(static_cast<int>(gettid()));
    write_and_check(mem, 1024, 1);
    // Past kParkAfterOtherNs since the first fault, the main thread's.
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    write_and_check(mem, 1024, 2);
    const auto b = fault_threads();
    const uint64_t f0 = p.stats().faults_remote;
    for (uint64_t round = 3; round < 6; ++round) write_and_check(mem, 1024, round);
    const auto a = fault_threads();
    const uint64_t faults = p.stats().faults_remote - f0;
    const long away = switches_of(a, cpus[0]) - switches_of(b, cpus[0]);
    EXPECT_GE(faults, 2000u) << p.stats().to_string();
    EXPECT_LT(away, static_cast<long>(faults) / 20)
        << "the handler on the other CPU, over " << faults << " faults with " << busy.load()
        << " of " << lookups.load() << " lookups busy";
    done.store(true);
    asker.join();  // before the worker leaves the registry
  });
  w.join();
  done.store(true);
  if (asker.joinable()) asker.join();  // the worker stopped early
  EXPECT_GT(lookups.load(), 0u);
  EXPECT_EQ(unknown.load(), 0u) << "a registered thread's CPU read as unknown";
}

// Co-location (evictor.h): with FARMEM_COLOCATE=on, the main thread
// paging alone is confined to the CPU it runs on, and the evictor moves
// there; once it stops paging (three quiet windows) it gets its own mask
// back, and at once when another thread faults. With off, never. Every
// round reads back byte-exact.
cpu_set_t own_mask() {
  cpu_set_t s;
  CPU_ZERO(&s);
  EXPECT_EQ(sched_getaffinity(0, sizeof s, &s), 0);
  return s;
}

// Pages (1024 pages through a 64-page budget a round) until the pager
// says it co-located `want` times in all, for at most 20 s.
bool page_until_colocated(P& p, uint8_t* mem, uint64_t* round, uint64_t want) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (p.stats().colocations < want && std::chrono::steady_clock::now() < end)
    write_and_check(mem, 1024, (*round)++);
  return p.stats().colocations >= want;
}

// Polls for at most 3 s until the main thread's mask is `want` again.
bool mask_back(const cpu_set_t& want) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (;;) {
    cpu_set_t now = own_mask();
    if (CPU_EQUAL(&now, &want)) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST(PagerFaultPath, ALoneFaultingThreadSharesItsCpuWithTheEvictor) {
  FARMEM_SKIP_WITHOUT_UFFD();
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  const cpu_set_t before = own_mask();
  LoopbackRig rig;
  PagerConfig c = fault_path_config(64, 4096);
  c.colocate = ColocateMode::kOn;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  uint64_t round = 1;
  ASSERT_TRUE(page_until_colocated(p, mem, &round, 1)) << p.stats().to_string();
  // Pinned where it runs, and the evictor with it.
  const cpu_set_t pinned = own_mask();
  ASSERT_EQ(CPU_COUNT(&pinned), 1);
  int cpu = -1;
  for (int i : cpus)
    if (CPU_ISSET(i, &pinned)) cpu = i;
  ASSERT_GE(cpu, 0);
  const auto evictor = threads_named("fm-evict");
  ASSERT_EQ(evictor.size(), 1u);
  EXPECT_EQ(evictor[0].first, std::to_string(cpu));
  write_and_check(mem, 1024, round++);
  // Paging stopped: its own mask back, the evictor's too.
  EXPECT_TRUE(mask_back(before));
  EXPECT_NE(threads_named("fm-evict")[0].first, std::to_string(cpu));
  EXPECT_GT(p.stats().colocated_ns, 0u);

  // Pinned again; another thread faults: apart at once.
  ASSERT_TRUE(page_until_colocated(p, mem, &round, 2)) << p.stats().to_string();
  // It pages on while it looks (so not a quiet window's doing).
  const int main_tid = static_cast<int>(getpid());
  bool apart = false;
  std::thread t([&] {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    for (uint64_t i = 100; !apart && std::chrono::steady_clock::now() < end; ++i) {
      write_and_check(mem, 1024, i);
      cpu_set_t m;
      CPU_ZERO(&m);
      ASSERT_EQ(sched_getaffinity(main_tid, sizeof m, &m), 0);
      apart = CPU_EQUAL(&m, &before);
    }
  });
  t.join();
  EXPECT_TRUE(apart) << "the main thread's mask, while another thread paged";
  write_and_check(mem, 1024, 200);
}

// Under auto, another program wanting the pinned CPU (here: two threads
// spinning on it) makes the thread wait for its CPU most of a window, so it
// gets its mask back while it still pages, and no new pin follows soon.
// Skipped where auto finds flushes cheap (it never co-locates there).
TEST(PagerFaultPath, ABusyCpuEndsTheColocation) {
  FARMEM_SKIP_WITHOUT_UFFD();
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  const cpu_set_t before = own_mask();
  LoopbackRig rig;
  PagerConfig c = fault_path_config(64, 4096);
  c.colocate = ColocateMode::kAuto;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  uint64_t round = 1;
  if (!page_until_colocated(p, mem, &round, 1)) {
    const uint64_t ns = p.stats().flush_apart_ns;
    ASSERT_GT(ns, 0u) << "auto never measured the evictor's flushes";
    ASSERT_LE(ns, 4000u) << "flushes measured slow, yet no co-location";
    GTEST_SKIP() << "flushes are cheap here (" << ns << " ns): auto does not co-locate";
  }
  const cpu_set_t pinned = own_mask();
  if (CPU_COUNT(&pinned) != 1) GTEST_SKIP() << "the pin ended already (a loaded machine)";
  std::atomic<bool> stop{false};
  std::vector<std::thread> hogs;
  for (int i = 0; i < 2; ++i) {
    hogs.emplace_back([&] {
      ASSERT_EQ(sched_setaffinity(0, sizeof pinned, &pinned), 0);
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  bool apart = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!apart && std::chrono::steady_clock::now() < end) {
    write_and_check(mem, 256, round++);
    cpu_set_t now = own_mask();
    apart = CPU_EQUAL(&now, &before);
  }
  stop = true;
  for (auto& t : hogs) t.join();
  EXPECT_TRUE(apart) << "still pinned next to two spinning threads";
  // And not pinned again soon (a backoff), though it pages on for longer
  // than the windows a new pin takes (ALoneFaultingThread...: ~0.1-0.3 s).
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(800);
  while (std::chrono::steady_clock::now() < until) {
    write_and_check(mem, 1024, round++);
    cpu_set_t now = own_mask();
    ASSERT_TRUE(CPU_EQUAL(&now, &before)) << "pinned again within the backoff";
  }
  EXPECT_EQ(p.stats().colocations, 1u);
}

TEST(PagerFaultPath, ColocateOffNeverPins) {
  FARMEM_SKIP_WITHOUT_UFFD();
  if (allowed_cpus().size() < 2) GTEST_SKIP() << "needs two CPUs";
  const cpu_set_t before = own_mask();
  LoopbackRig rig;
  PagerConfig c = fault_path_config(64, 4096);
  c.colocate = ColocateMode::kOff;
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (uint64_t round = 1; round < 4 || std::chrono::steady_clock::now() < end; ++round) {
    write_and_check(mem, 1024, round);
    cpu_set_t now = own_mask();
    ASSERT_TRUE(CPU_EQUAL(&now, &before)) << "round " << round;
  }
  EXPECT_EQ(p.stats().colocations, 0u);
}

}  // namespace
}  // namespace farmem::testing
