// Pager<B>'s evictor and victim cache: the evictor thread (evictor_main(),
// evict_round()), the adaptive victim-cache target (adapt_victims()),
// demotion of active blocks into victim slots in batches (demote_batch(),
// fill_gaps()), the drop of victims with the write-back of dirty ones
// (drop_victims(), writeback_done(); invariant 1 over every replica), the
// victim slots, and the control-path drops discard() and the fm_evict hint
// (evict()). The UFFDIO_MOVE and WP_ASYNC variants of the victim traffic
// are in victim_move.h; a scan's blocks dropped without the victim cache
// ("Scan resistance") in prefetch_path.h; how READ and WRITE-back use
// replicas ("Several donors and replicas") in fault_path.h. Part of
// Pager<B> (pager/pager_core.h); include pager/pager.h.
//
// Residency and replacement. Resident blocks are on the active list (FIFO
// order of mapping). The evictor thread wakes when resident > high watermark
// and works down to the low one under fault pressure (faults waiting for
// budget); without it, it keeps only two write-back batches of headroom
// (starts one batch below the budget, stops two below), so that a working
// set that nearly fits is not pushed out and faulted back; the headroom
// adapts between the two (evictor_main()). It demotes
// the oldest active blocks into victim slots (write-protect if dirty, copy,
// MADV_DONTNEED; as many as keep the victim cache at its adaptive target,
// see adapt_victims()), and drops the oldest victims: clean ones without I/O, dirty ones after a
// batched WRITE from the slot completed (invariant 1). A WRITE failing with a retryable error keeps
// its block dirty in the victim cache and the evictor backs off before its next round (100 us
// doubling to 10 ms, reset by a clean round), so that a struggling donor is not hammered. A fault
// on a victim maps it back without I/O and puts it at the head of the active list: that re-fault is
// the access information user space otherwise lacks (second chance through a
// local victim cache; see replacement_sim.h for the measured hit ratios).
// Access tracking. A mapped block's accesses are invisible to user space,
// so FIFO order alone sends a block in constant use through the victim
// cache at every lap of the active list: a victim fault each time (xz -7,
// 38 MiB budget: 229k victim faults beside 431k remote ones). A victim hit
// is the proof of use the kernel gets from an accessed bit, and it is
// kept: the block gets config.hot_laps laps (PageTable::hot_laps()), and
// demote_batch() passes a block with laps left over at the tail without
// demoting it (one lap spent, back to the head; counted in hot_passes).
// So a hot block is sampled, i.e. unmapped to see whether it comes back,
// once every hot_laps + 1 laps instead of every lap; one left untouched
// is sampled at its next pass with no laps left and leaves as before. A
// demand fetch of a block that left less than a budget's worth of
// departures ago (PageTable::left_at() on the leave clock, the refault
// distance Linux's workingset code measures) is an eviction the policy
// got wrong: that block gets one lap (config.refault_hot; refaults_hot),
// whether a demand fault or a stream's map-ahead brought it back. Laps
// carry a grace period: within a budget's worth of departures of being
// given them, passing the tail costs none (PageTable::set_hot_laps_at()).
// A loop a little larger than the budget refaults on every block, at a
// distance under the budget: FIFO evicts each one just before the loop
// comes back to it, and laps for all would be FIFO again. So refaults
// give laps only while fewer than three quarters of the budget hold some
// (hot_cap_): those stay through the next pass, the rest cycle. Measured
// (tests/pager/pager_access_test.cc, a read loop of 1.25 budgets, 6
// passes): READs 0.77-0.82 of FIFO's; bench/eval scan (STREAM, 96 MiB at
// a 96 MiB budget, loopback, 4 passes): 377 -> 211 MiB read. Read-ahead
// that is no refault (kPrefetched, no laps) leaves first as before.
// Measured, before the grace period and the map-ahead refaults: xz -7 -T1 of 4
// MiB of text at FARMEM_LOCAL_MEM=38M over tcp, laps 0 -> 2: remote
// faults 431k -> 392k, victim faults 229k -> 205k, 23.8 -> 21.4 s; GNU
// sort -S 300M of 1.5M lines at 80M: 2.03 -> 1.77 s (victim faults 17.0k
// -> 11.1k); tests/pager/pager_access_test.cc: a hot quarter of the
// budget between cold bursts takes a third of the faults.
// How many laps: every step up to 15 (the access word's four bits) took
// faults off the compressors, toward exact LRU (bench/eval/lru_reference.py:
// 1.18M page reads for xz at 74 MiB). xz -7 -T1 of 10 MiB of text at 75M,
// one-sided to farmemd, laps 1 / 2 / 3 / 5 / 7 / 11 / 15: remote faults
// 1.50 / 1.44 / 1.41 / 1.36 / 1.33 / 1.29 / 1.25M, victim faults 439 /
// 411 / 396 / 380 / 368 / 352 / 346k (2 -> 15 in one pair: 53.5 -> 47.6
// s); zstd -19 --long=27 at 72M, 2 -> 15: remote 1.84 -> 1.64M, victim
// 515 -> 447k (two pairs: 61.7 -> 56.3 s, 56.0 -> 54.4 s); eval pagerank
// at 50%: remote 529k -> 512-518k; GNU sort at 70% and eval kv, sort and
// scan within their noise. A set that cooled costs the next one little:
// the tail walk spends laps only up to 4 * pick + 64 passes a batch and
// then demotes, and a pass in the grace period is free only in the first
// half of those (PagerAccess.ACooledHotSetGivesWayToTheNextOne: faults
// after a change of hot set 1.06-1.09x those before it, against
// 0.99-1.10x with 2 laps, and fewer than with 2).
// "resident" counts mapped blocks, occupied slots and fetches in flight;
// it never exceeds the budget (slack 0 blocks). Fixed overheads outside the
// budget: staging (handlers x staging_blocks x block) and the free slots.
//
// Eviction behind streams (config.evict_behind, FARMEM_EVICT_BEHIND).
// A loop a little larger than the budget is the worst case of FIFO order
// (and of LRU): the oldest block is the one the loop comes back to first,
// so every pass reads nearly all of it again, and refault laps (above)
// keep only part of it. The best choice for a loop is the block it has
// just left (it comes back to it last). So with prefetch on, demote_batch()
// first takes blocks from behind the confirmed sequential streams
// (Prefetcher::behind(): the most recently used streams first, from
// behind_gap_ = 64 blocks (at most a prefetch window) behind a stream's
// latest fault, which the program is at or past since what the stream
// mapped ahead takes no fault, to four batches further), and only then the
// tail of the active list. A block qualifies
// when it is Present and on the active list (not pinned, not a zero-page
// block) and either the stream mapped it ahead (kPrefetched: no fault of
// its own since, so no sign of use beyond the stream's) or it holds no
// laps; one with laps from a victim hit or a demand refault stays. Taken
// blocks go through the victim cache like any other, so a block that is
// used again soon after all comes back with a victim fault and its laps
// (a victim hit clears kPrefetched). Counted in evicted_behind.
// Measured: tests/pager/pager_access_test.cc's loop of 1.25 budgets, 6
// read passes: 11.4-11.9k READs against 20.3-23.7k without (one batch
// behind instead of four: 13.4-15.1k; a gap of two windows + 32 too:
// 14.0-15.0k; the candidates shared out between the streams instead of
// the most recent first: 14.4-15.0k); bench/eval scan (64 MiB, 2 passes) at
// a 62.4 MiB budget: 124-125 -> 40-52 MiB read, 0.19 -> 0.074-0.083 s; GNU
// sort -S 1G of 3M lines at 179M (tcp): remote faults 17.4-23.2k ->
// 11.0-14.8k, 2.33-3.00 -> 1.87-1.89 s; xz -7 at 93M and 101M and eval kv
// at 100% unchanged (few or no streams).
//
// Eviction batching. What a demotion costs here is its TLB flushes: on
// these machines (a paravirtualised guest, Linux 6.18) the kernel flushes
// a range of up to 33 pages page by page, ~20-30 us each, and anything
// larger with one full flush of ~60-100 us (madvise(MADV_DONTNEED) of 1 /
// 8 / 32 / 33 / 34 / 64 adjacent pages: 30 / 178 / 720 / 580 / 109 / 152
// us per call, single-threaded). The drops of a batch, scattered or not,
// go in one process_madvise() call of the process on itself (pager/zap.h,
// ZapBatch): since Linux 6.16 that is one flush for all of them (64
// random pages with another thread of the process running: 0.6 us per
// page against ~10 us with a madvise() each; an earlier measurement here
// saw no gain, on a kernel that did not batch yet).
// Write protection has no such call, so demote_batch() write-protects the dirty blocks one
// UFFDIO_WRITEPROTECT per run of adjacent blocks (as MADV_DONTNEED was
// already), evict_round() demotes at least min(64, budget / 16) blocks at
// a time, and demote_batch() closes gaps of one or two resident blocks
// between blocks it demotes (fill_gaps(): a prefetch marker mapped after
// its window, a block brought back from the victim cache), so that a
// scan's demotions are runs of 64-80 blocks past the ceiling: on
// BM_SeqScan (prefetch on, loopback) 450 MADV_DONTNEED calls for 29k
// demotions instead of 1.2k (runs of 24 without the gap fills).
// Measured with the prefetch installs (prefetch_path.h; bench/pager_bench.cc, old
// and new pager.h interleaved, two rounds, 2 cores at load average 5-7):
//   BM_SeqScan loopback prefetch 1   0.094 0.141 -> 0.479 0.455 GB/s
//   BM_SeqScan tcp      prefetch 1   0.052 0.140 -> 0.209 0.139 GB/s
//   BM_SeqScan loopback prefetch 0   0.078 0.058 -> 0.091 0.119 GB/s
//   BM_RandomRMW loopback 25%        5.26k 4.23k -> 3.08k 6.40k ops/s (noise:
//     the same 1.1 write-protect + 1.3 MADV_DONTNEED calls per dirty eviction)
// Random dirty blocks still pay two flushes each (write-protect, drop):
// no call changes scattered pages under one flush here, and UFFDIO_MOVE
// (one flush) is config.uffd_move's choice. Counted in evict_wp_calls(),
// evict_dontneed_calls() and evict_gap_fills().
//
// Co-location (config.colocate, FARMEM_COLOCATE; colocate_tick(), and
// pager/colocate.h for the pin itself). Each dirty block the evictor
// demotes costs a UFFDIO_WRITEPROTECT, and its TLB flush must reach every
// other CPU that runs a thread of this process. On this machine (a PVM
// guest) that interrupt is the expensive thing: the call took a mean of
// 10.1 us when the program ran on the other CPU, 1.1 us when the flush
// stayed on one CPU (docs/eval/l-s23), and `perf -a` put 17-18% of both
// CPUs' time in the evictor's sending of it (xz -7 at 70%, one-sided to
// farmemd). Following the program with the evictor alone does not work:
// with the evictor busy on its CPU, the kernel wakes the program from its
// next fault on the idle one (2.7-6.7k migrations in 10 s, against 0.3k;
// no faster). Confining all of them to one CPU (taskset) does. So when
//   - one thread makes every fault (fault_path.h "Parked handlers": the
//     main thread, or one in the registry, so alive while pinned),
//   - the evictor demoted at least kColocateMinDemotions blocks in the
//     last kColocateWindowNs (the program pages hard), and
//   - FARMEM_COLOCATE=on, or auto and the evictor's write-protect calls
//     measured a mean over kSlowFlushNs while apart (the last
//     kFlushSamples calls; 5.2-10.1 us here, against ~1 us on one CPU; a
//     heuristic: a shoot-down on bare metal is a few microseconds too,
//     and FARMEM_COLOCATE=on / off overrides it),
// that thread is pinned to the CPU it runs on and the evictor moves there
// (the handler on that CPU serves its faults, the others park). When one
// of these stops holding, the thread gets its mask back: at once for a
// second faulting thread or a suspend (a posix_spawn of the preload
// library), after three quiet windows otherwise. A mask the program set
// itself meanwhile wins: the pin is dropped unrestored and none is taken
// for kColocateBackoffNs. Under auto, a thread that in a window waited
// for its CPU more than 3/4 of the time it ran there (another program
// wants that CPU; our own threads cost it about 0.4) gets its mask back,
// and none is taken for kColocateBusyBackoffNs; on forces co-location
// whenever one thread pages hard. What the pinned thread starts does not inherit
// the pin (pager/colocate.h). Measured (docs/eval/l-s24; one-sided to
// farmemd on 127.0.0.1, auto against off, interleaved): xz -7 -T1 of 10
// MiB of text at FARMEM_LOCAL_MEM=75M 41.8, 41.7, 41.7 s against 47.7,
// 48.4, 46.9 s, system time 27-28 s against 52-53 s; zstd -19 --long=27
// -T1 at 72M 52.7, 53.6 s against 57.1, 63.0 s. GNU sort (two faulting
// threads) is not co-located. Over tcp to a farmemd on the same host it
// gains nothing (xz 64.2 s against 62.3): farmemd's thread then follows
// onto the one CPU too.
#pragma once

#include "pager/colocate.h"
#include "pager/pager_core.h"
#include "pager/park.h"
#include "pager/zap.h"

namespace farmem {

template <TransportBackend B>
void Pager<B>::kick_evictor() {
  // Taking the mutex orders this notify after the evictor's predicate
  // check or before it: no lost wake-up (the lock is uncontended but for
  // the evictor going to sleep).
  { std::lock_guard<std::mutex> lk(evict_mu_); }
  evict_cv_.notify_one();
}

// kWritten for a block whose dirty copy in slot has just been written
// back: it was seen written (a write fault, a WP fault), or it was mapped
// writable on a guess (kGuessed) and its content is no longer what that
// fetch brought (fetched_hash()). Without the hash a guessed block always
// left unwritten, so a block written in every stay alternated between a
// guessed stay and a write-protected one, with a WP fault every second
// fetch (xz -7: ~210k of 430k remote faults). A collision only costs that
// WP fault once; the write-back itself never depends on the hash.
template <TransportBackend B>
uint32_t Pager<B>::written_flag(uint32_t b, uint32_t w, uint32_t slot) {
  if ((w & PageTable::kGuessed) == 0) return PageTable::kWritten;
  return block_hash(slot_addr(slot), block_) != pt_.fetched_hash(b) ? PageTable::kWritten : 0;
}

// Free slots' pages. A victim slot keeps its page when its block leaves
// (a drop, a promotion by copy): the next owner's copy or READ then lands
// in memory that is already there. Such a page is the process's memory all
// the same, and uncounted it let the peak RSS run past the budget by up to
// the victim cache's largest occupancy (GNU sort at a 70% budget: +10-13%
// over the budget). So, with a transport that does not pin its buffers
// (tcp, loopback), a free slot that may hold a page is charged in resident_
// (kSlotCharged); a new owner takes the charge over with the page (its
// block is counted already), and when room is needed the evictor drops
// such pages first (release_slot_pages() from evict_round()): they hold no
// data, so they are the cheapest room there is. The free list is LIFO, so
// charged slots are reused first and released from the bottom. A pinning
// transport (verbs: the MR holds the pages) keeps today's behaviour: its
// registration made the whole slot area resident anyway.
template <TransportBackend B>
uint32_t Pager<B>::alloc_slot(bool* empty) {
  std::lock_guard<std::mutex> lk(slot_mu_);
  uint32_t s;
  if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else if (fresh_slots_ < n_slots_) {
    s = fresh_slots_++;
    slot_empty_[s] = drop_slot_pages_ ? kSlotEmpty : kSlotUnknown;
  } else {
    return kNoSlot;
  }
  if (empty) *empty = slot_empty_[s] == kSlotEmpty;
  if (slot_empty_[s] == kSlotCharged) {
    --slot_pages_;
    unreserve();  // the new owner's block is counted already
  }
  slot_empty_[s] = kSlotUnknown;  // whatever the new owner does may map a page there
  return s;
}

template <TransportBackend B>
void Pager<B>::free_slot(uint32_t s, bool empty) {
  if (!empty && drop_slot_pages_) {
    // Charged like any resident block, but not through reserve(): a full
    // budget here is no fault waiting (budget_full_, the evictor's pressure
    // signal); the page goes at once instead, so resident_ stays within it.
    int64_t cur = resident_.load(std::memory_order_relaxed);
    while (cur < budget_blocks_ &&
           !resident_.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed)) {
    }
    if (cur < budget_blocks_) {
      int64_t pk = peak_.load(std::memory_order_relaxed);
      while (cur + 1 > pk && !peak_.compare_exchange_weak(pk, cur + 1)) {
      }
      note_resident(cur + 1);
    } else {
      if (madvise(slot_addr(s), block_, MADV_DONTNEED) != 0) {
        fatal("pager: MADV_DONTNEED of free victim slot %u at %p failed: %s", s,
              static_cast<void*>(slot_addr(s)), strerror(errno));
      }
      slot_releases_.fetch_add(1, std::memory_order_relaxed);
      empty = true;
    }
  }
  std::lock_guard<std::mutex> lk(slot_mu_);
  free_slots_.push_back(s);  // capacity n_slots_: never reallocates
  if (empty) {
    slot_empty_[s] = kSlotEmpty;
  } else if (drop_slot_pages_) {
    slot_empty_[s] = kSlotCharged;
    ++slot_pages_;
  } else {
    slot_empty_[s] = kSlotUnknown;
  }
}

// A block written back from the victim cache hands its charge to its
// slot's page while fewer than spare_slots() free slots hold one
// (free_slot() charged the page only below the budget, and at a full
// budget dropped it with one MADV_DONTNEED): the next demotion reuses the
// page, which is room without a page fault ("evict_round()"). Past that,
// or with a pinning transport, the room is freed now, as a fault may be
// waiting for it while the evictor waits for other WRITEs.
template <TransportBackend B>
void Pager<B>::free_left_slot(uint32_t s) {
  if (drop_slot_pages_) {
    std::lock_guard<std::mutex> lk(slot_mu_);
    if (slot_pages_ < static_cast<int64_t>(spare_slots())) {
      free_slots_.push_back(s);  // capacity n_slots_: never reallocates
      slot_empty_[s] = kSlotCharged;
      ++slot_pages_;
      return;
    }
  }
  free_slot(s);
  unreserve();
}

template <TransportBackend B>
size_t Pager<B>::release_slot_pages(size_t max, size_t spare) {
  if (!drop_slot_pages_ || max == 0) return 0;
  uint32_t picked[kDemotePick];
  size_t n = 0;
  if (max > kDemotePick) max = kDemotePick;
  {
    std::lock_guard<std::mutex> lk(slot_mu_);
    if (slot_pages_ <= static_cast<int64_t>(spare)) return 0;
    max = std::min<size_t>(max, static_cast<size_t>(slot_pages_) - spare);
    // The oldest frees first (the bottom of the LIFO), taken out of the
    // list while their pages go.
    size_t keep = 0;
    for (size_t i = 0; i < free_slots_.size(); ++i) {
      const uint32_t s = free_slots_[i];
      if (n < max && slot_empty_[s] == kSlotCharged) {
        picked[n++] = s;
      } else {
        free_slots_[keep++] = s;
      }
    }
    free_slots_.resize(keep);
  }
  if (n == 0) return 0;
  std::sort(picked, picked + n);
  ZapBatch zap;  // n <= kDemotePick: add() never flushes early
  for (size_t i = 0; i < n; ++i) (void)zap.add(slot_addr(picked[i]), block_);
  if (int err = zap.flush(); err != 0) {
    fatal("pager: MADV_DONTNEED of %zu free victim slot(s) from %p failed: %s", n,
          static_cast<void*>(slot_addr(picked[0])), strerror(err));
  }
  {
    std::lock_guard<std::mutex> lk(slot_mu_);
    // Back at the bottom: the charged slots above them are reused first.
    free_slots_.insert(free_slots_.begin(), picked, picked + n);
    for (size_t i = 0; i < n; ++i) slot_empty_[picked[i]] = kSlotEmpty;
    slot_pages_ -= static_cast<int64_t>(n);
  }
  unreserve(static_cast<int64_t>(n));
  slot_releases_.fetch_add(n, std::memory_order_relaxed);
  return n;
}

template <TransportBackend B>
void Pager<B>::evictor_main() {
  pthread_setname_np(pthread_self(), "fm-evict");
  // Background eviction keeps headroom so that faults rarely wait, and the
  // headroom has a price when the working set nearly fits: every block
  // pushed out is faulted back in, which pushes resident over the trigger
  // again (eval kv with the heap one block over the budget: 17k remote
  // faults with the 97% / 92% watermarks). One round frees a write-back
  // batch in well under the time the faults that fill it take, so the
  // headroom starts at two batches (evict from one batch below the budget
  // down to two below) and adapts to fault pressure: it doubles each time
  // a fault found the budget full since the last look (budget_full_
  // moved; not faults_waited, which also counts faults on busy blocks), up to the
  // configured watermarks (start at high, stop at low), and halves after
  // each kPressureNs without a wait. Small budgets, where two batches are
  // more than the watermarks' gap, keep the watermarks.
  const int64_t batch = static_cast<int64_t>(cfg_.writeback_batch);
  const int64_t max_h = budget_blocks_ - low_blocks_;
  const int64_t min_h = std::min<int64_t>(max_h, 2 * batch);
  int64_t headroom = min_h;
  uint64_t last_change = pager_detail::now_ns();
  auto adapt_headroom = [&] {
    const uint64_t waited = budget_full_.load(std::memory_order_relaxed) +
                            prefetch_starved_.load(std::memory_order_relaxed);
    const uint64_t now = pager_detail::now_ns();
    if (waited != ctl_waited0_) {
      ctl_waited0_ = waited;
      headroom = std::min<int64_t>(max_h, 2 * headroom);
      last_change = now;
    } else if (headroom > min_h && now - last_change > kPressureNs) {
      headroom = std::max<int64_t>(min_h, headroom / 2);
      last_change = now;
    }
    headroom_.store(headroom, std::memory_order_relaxed);
  };
  auto trigger = [&] {
    return headroom >= max_h ? high_blocks_
                             : std::max<int64_t>(high_blocks_, budget_blocks_ - headroom / 2);
  };
  while (!stop_.load(std::memory_order_acquire)) {
    colocate_tick();
    {
      std::unique_lock<std::mutex> lk(evict_mu_);
      evict_cv_.wait_for(lk, std::chrono::milliseconds(50), [&] {
        adapt_headroom();
        const int64_t t = trigger();
        evict_trigger_.store(t, std::memory_order_relaxed);
        evictor_idle_.store(true, std::memory_order_seq_cst);  // see note_resident()
        const bool go =
            stop_.load(std::memory_order_acquire) || resident_.load(std::memory_order_seq_cst) > t;
        if (go) evictor_idle_.store(false, std::memory_order_relaxed);
        return go;
      });
      evictor_idle_.store(false, std::memory_order_relaxed);
    }
    for (;;) {
      if (stop_.load(std::memory_order_acquire)) break;
      colocate_tick();
      adapt_headroom();
      const int64_t floor = budget_blocks_ - headroom;
      if (resident_.load(std::memory_order_relaxed) <= floor) break;
      std::unique_lock<std::mutex> gate(fork_gate_);  // a fork stops eviction
      const size_t progress = evict_round(floor);
      gate.unlock();
      if (progress == 0) {
        // Everything at the tails is busy (I/O in flight elsewhere).
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }
  colocate_end();
}

template <TransportBackend B>
void Pager<B>::colocate_tick() {
  if (cfg_.colocate == ColocateMode::kOff || main_cpu_ == nullptr) return;
  const uint64_t now = pager_detail::now_ns();
  if (now < coloc_.next_ns) return;
  coloc_.next_ns = now + kColocateWindowNs;
  Colocation& c = coloc_;
  if (!c.have_mask) {
    CPU_ZERO(&c.evictor_mask);
    if (sched_getaffinity(0, sizeof c.evictor_mask, &c.evictor_mask) != 0) {
      cfg_.colocate = ColocateMode::kOff;
      return;
    }
    c.have_mask = true;
    c.last_ns = now;
  }
  const uint64_t demotions = counters_.demotions.load(std::memory_order_relaxed);
  const bool paging = demotions - c.demotions0 >= kColocateMinDemotions;
  c.demotions0 = demotions;
  const uint64_t wp_n = wp_calls_.load(std::memory_order_relaxed);
  const uint64_t wp_ns = wp_ns_.load(std::memory_order_relaxed);
  if (!c.pinned && wp_n - c.wp_calls0 >= kFlushSamples) {
    const uint64_t mean = (wp_ns - c.wp_ns0) / (wp_n - c.wp_calls0);
    c.slow = mean > kSlowFlushNs ? 1 : 0;
    counters_.flush_apart_ns.store(mean, std::memory_order_relaxed);
    c.wp_calls0 = wp_n;
    c.wp_ns0 = wp_ns;
  }
  // One thread makes every fault, and where it runs is known.
  const int tid = faulter_tid_.load(std::memory_order_relaxed);
  const int cpu = fault_cpu_.load(std::memory_order_seq_cst);
  // (Signed: a handler may have stored a time later than `now`.)
  const int64_t since_other =
      static_cast<int64_t>(now - other_fault_ns_.load(std::memory_order_relaxed));
  const bool alone = cpu >= 0 && cpu < 64 && ((handler_cpus_ >> cpu) & 1) != 0 &&
                     since_other > static_cast<int64_t>(kParkAfterOtherNs);
  if (c.pinned) {
    const uint64_t elapsed = now - c.last_ns;
    counters_.bump(counters_.colocated_ns, elapsed);
    c.last_ns = now;
    if (colocate_pinned_tid() != c.tid) {  // a suspend or the thread's end lifted it
      colocate_apart();
      return;
    }
    if (!colocate_still_pinned(this)) {  // the program set the thread's mask itself
      c.backoff_until = now + kColocateBackoffNs;
      colocate_apart();
      return;
    }
    if (!alone || tid != c.tid) {
      colocate_apart();
      return;
    }
    // Its CPU is wanted elsewhere: in the window the thread waited for it
    // more than 3/4 of the time it ran, and over a tenth of the window.
    // Our own threads cost it about 0.4 (xz at 70%: 6.3 s waiting, 16.4
    // s running); one program spinning on that CPU, about 1.
    uint64_t run = 0, wait = 0;
    if (cfg_.colocate == ColocateMode::kAuto && thread_sched_ns(c.tid, &run, &wait)) {
      const uint64_t dr = run - c.run0, dw = wait - c.wait0;
      const bool had = c.have_sched;
      c.run0 = run;
      c.wait0 = wait;
      c.have_sched = true;
      if (had && dw > elapsed / 10 && 4 * dw > 3 * dr) {
        c.backoff_until = now + kColocateBusyBackoffNs;
        colocate_apart();
        return;
      }
    }
    c.quiet = paging ? 0 : c.quiet + 1;
    if (c.quiet >= 3) {
      colocate_apart();
    }
    return;
  }
  c.last_ns = now;
  const bool slow = cfg_.colocate == ColocateMode::kOn || c.slow == 1;
  if (!alone || !paging || !slow || now < c.backoff_until || colocate_suspended()) return;
  // Still where it last faulted, and alive: the main thread, or one in
  // the registry, asked again under the pin's lock (pager/colocate.h).
  const bool main = tid == main_tid_;
  uintptr_t tp = main_tp_;
  if (!main && !thread_registered(tid, &tp)) return;
  const int at = main ? read_cpu(main_cpu_) : registered_thread_cpu(tid);
  if (at != cpu) return;
  auto registered = [](int t) { return thread_registered(t, nullptr); };
  if (!colocate_pin(this, tid, cpu, tp, main ? nullptr : +registered)) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof one, &one) != 0) {
    colocate_unpin(this);
    return;
  }
  c.pinned = true;
  c.tid = tid;
  c.quiet = 0;
  c.have_sched = thread_sched_ns(tid, &c.run0, &c.wait0);
  counters_.bump(counters_.colocations);
}

template <TransportBackend B>
void Pager<B>::colocate_apart() {
  Colocation& c = coloc_;
  if (!c.pinned) return;
  colocate_unpin(this);  // nothing when the pin is gone already
  c.pinned = false;
  c.tid = 0;
  (void)sched_setaffinity(0, sizeof c.evictor_mask, &c.evictor_mask);
  // Flush timings from now on are the ones apart.
  c.wp_calls0 = wp_calls_.load(std::memory_order_relaxed);
  c.wp_ns0 = wp_ns_.load(std::memory_order_relaxed);
}

template <TransportBackend B>
void Pager<B>::colocate_end() {
  if (!coloc_.pinned) return;
  counters_.bump(counters_.colocated_ns, pager_detail::now_ns() - coloc_.last_ns);
  colocate_apart();
}

// Adaptive victim cache. The victim cache buys replacement quality (second
// chance: a re-fault on a demoted block is the accessed bit user space
// lacks) and pays for it with a local fault per re-fault, plus a demotion.
// When the working set nearly fits, or access is uniform, it buys nothing
// and costs a fault on every access to the unmapped share of the budget
// (eval kv at a 100% budget: 105k victim + 103k WP faults for 17k remote
// ones with a fixed 25% share). So the share moves with what it costs
// against what it is there to save: per epoch of kVictimEpochFaults
// victim + remote faults (prefetch hits not counted: they are prefetch's),
// replacement_sim.h adapt_victim_target() shrinks it by a quarter when
// victim faults exceed a quarter of the remote ones, and grows it by a
// quarter otherwise, between its floor and config.victim_fraction of
// the budget. The floor is a write-back batch and a prefetch window
// (victim_min_), since blocks read ahead wait there; it is a write-back
// batch (victim_floor_) in an epoch with no read-ahead and more victim
// faults than remote ones: a working set that nearly fits, where the
// window's worth of unmapped blocks was most of the faults. Measured (eval
// kv --mib 64 --ops 3000000 over tcp) at FARMEM_LOCAL_MEM=64M, its table's
// size: victim faults 25-26k -> 11.3-11.8k, wall 1.32-1.38 -> 1.01-1.05 s,
// the main thread asleep in faults 0.41-0.47 -> 0.31-0.36 s. Without the
// "more victim faults" condition, GNU sort at eval's 100% (one budget
// below the heap) took 2.9-3.2k remote faults instead of 1.9-2.4k (and
// 0.9k victim faults instead of 1.7-2.2k); kv at 62.3 MiB gained nothing
// either way (2.51-2.57 s). Blocks read ahead since the evictor's last
// round raise the target at once by as many (up to victim_min_;
// evict_round()). A smaller target pushes no victim out: the cache drains
// by re-faults and drops. The same controller runs in the model
// (simulate_victim_adaptive, one floor; hit ratios in
// tests/pager/pager_budget_test.cc).
template <TransportBackend B>
void Pager<B>::adapt_victims() {
  const uint64_t v = counters_.faults_victim.load(std::memory_order_relaxed);
  const uint64_t u = counters_.prefetch_used.load(std::memory_order_relaxed);
  uint64_t r = counters_.faults_remote.load(std::memory_order_relaxed);
  for (const auto& h : handlers_) r += h->ctr.faults_remote.load(std::memory_order_relaxed);
  const uint64_t dv_all = v - ctl_victim0_, du = u - ctl_used0_;
  const uint64_t dv = dv_all > du ? dv_all - du : 0;
  const uint64_t dr = r - ctl_remote0_;
  if (dv + dr < kVictimEpochFaults) return;  // too little evidence yet
  const uint64_t issued = counters_.prefetch_issued.load(std::memory_order_relaxed);
  const uint64_t lo = dv > dr ? read_ahead_floor(issued - ctl_issued0_) : victim_min_;
  ctl_victim0_ = v;
  ctl_used0_ = u;
  ctl_remote0_ = r;
  ctl_issued0_ = issued;
  victim_cur_.store(adapt_victim_target(victim_cur_.load(std::memory_order_relaxed), dv, dr, lo,
                                        victim_target_, cfg_.writeback_batch),
                    std::memory_order_relaxed);
}

template <TransportBackend B>
size_t Pager<B>::evict_round(int64_t floor) {
  int64_t excess = resident_.load(std::memory_order_relaxed) - floor;
  if (excess <= 0) return 0;
  // Free slots' pages first: room that costs no data ("Free slots' pages").
  // But spare_slots() of them stay while this round demotes: a demotion
  // into a free slot that has its page is room too (its block was counted
  // already) and saves the page fault of the copy into an empty slot.
  // Blocks written back hand their charge to their slot's page
  // (free_left_slot(), up to the spare), so in a steady thrash the
  // demotions reuse the write-backs' pages. Before, with every such page
  // released first (or dropped at a full budget), xz -7 -T1 at a 75M
  // budget, one-sided: 3% of all CPU samples were do_anonymous_page under
  // the evictor's copy, and 1.6M of 2.1M demotions took an empty slot.
  size_t released = release_slot_pages(static_cast<size_t>(excess), spare_slots());
  excess -= static_cast<int64_t>(released);
  if (excess <= 0) return released;
  size_t want = static_cast<size_t>(excess) < cfg_.writeback_batch ? static_cast<size_t>(excess)
                                                                   : cfg_.writeback_batch;
  adapt_victims();
  uint64_t target = victim_cur_.load(std::memory_order_relaxed);
  // Blocks read ahead since the last round wait in the victim cache: room
  // for them at once (the epoch may be long), up to victim_min_.
  const uint64_t issued = counters_.prefetch_issued.load(std::memory_order_relaxed);
  const uint64_t want_room = read_ahead_floor(issued - round_issued0_);
  round_issued0_ = issued;
  if (target < want_room) {
    target = want_room;
    victim_cur_.store(target, std::memory_order_relaxed);
  }
  // Keep the victim cache at its target plus what this round drops, so that
  // every block spends a while there before it leaves.
  size_t progress = 0, dropped = 0;
  for (;;) {
    uint64_t nv;
    {
      std::lock_guard<std::mutex> lk(list_mu_);
      nv = victim_.size();
    }
    // Blocks dropped straight from the active list (mapped ahead, clean)
    // freed their room already: only the rest of `want` goes through the
    // victim cache.
    if (dropped >= want || nv + dropped >= target + want) break;
    // At least min(64, budget / 16) blocks at a time: a scan's demotions
    // are then runs past the kernel's full-flush ceiling (33 pages: 34+
    // adjacent blocks cost the flush of one), while a small budget keeps
    // most of itself mapped.
    // A scan whose blocks leave without the victim cache (the last batch
    // was mostly dropped clean) goes up to 256 at a time: MADV_DONTNEED
    // costs 2.4 us per page in runs of 64 and 1.2 in runs of 256 here.
    const size_t run = static_cast<size_t>(
        std::clamp<int64_t>(budget_blocks_ / 16, 1, scan_evict_ ? int64_t{kDemotePick} : 64));
    size_t dr = 0;
    size_t d =
        demote_batch(std::max<size_t>(static_cast<size_t>(target + want - nv - dropped), run), &dr);
    if (d == 0) break;
    scan_evict_ = 2 * dr > d;
    progress += d;
    dropped += dr;
  }
  const size_t out = drop_victims(want > dropped ? want - dropped : 0);
  // Nothing else made room: the spare pages go too.
  if (progress + released + out == 0) released = release_slot_pages(static_cast<size_t>(excess));
  return released + progress + out;
}

template <TransportBackend B>
size_t Pager<B>::demote_batch(size_t max, size_t* dropped) {
  if (dropped) *dropped = 0;
  // Up to kMaxPick blocks from the tail of the active list, plus up to
  // kMaxFill "gap" blocks: resident blocks of one or two that separate two
  // picked ones (a prefetch marker mapped later than its window, a block
  // re-faulted from the victim cache), taken too so that a scan's
  // demotions stay runs longer than the kernel's full-flush ceiling (33
  // pages; see "Eviction batching" above). Not with WP_ASYNC
  // (demote_async() takes at most 64 blocks).
  constexpr size_t kMaxPick = kDemotePick, kMaxFill = kDemoteFill, kMaxBatch = kMaxPick + kMaxFill;
  uint32_t blocks[kMaxBatch], slots[kMaxBatch], words[kMaxBatch];
  if (max > kMaxPick) max = kMaxPick;
  if (use_wp_async_ && max > 64) max = 64;  // demote_async()'s most
  const size_t fill_max = use_wp_async_ ? 0 : kMaxFill;
  size_t ns = 0;
  bool empty[kMaxBatch];
  while (ns < max + fill_max && (slots[ns] = alloc_slot(&empty[ns])) != kNoSlot) ++ns;
  size_t n = 0, passes = 0;
  // Candidates behind the confirmed streams ("Eviction behind streams").
  // Four batches' worth of them, nearest first: right after a loop starts
  // over, the blocks just behind the stream that ended are gone already and
  // the new stream has not moved far yet, and the ones further behind are
  // what the new pass needs last.
  uint32_t behind[4 * kMaxPick];
  size_t nb = 0;
  if (cfg_.evict_behind && prefetcher_ != nullptr && ns > 0) {
    const size_t span = 4 * std::min(ns, max);
    nb = prefetcher_->behind(behind_gap_, static_cast<uint32_t>(span), behind, span);
  }
  {
    std::lock_guard<std::mutex> lk(list_mu_);
    const size_t pick = ns < max ? ns : max;
    // A block a stream mapped ahead (kPrefetched: not since touched by a
    // fault of its own) and left behind: taken whatever its laps.
    for (size_t i = 0; i < nb && n < pick; ++i) {
      const uint32_t b = behind[i];
      const uint32_t w = pt_.load(b);
      if (!(w & PageTable::kPrefetched) && pt_.hot_laps(b) > 0) continue;
      if (!take_listed(b, w)) continue;
      blocks[n] = b;
      words[n] = w;
      ++n;
    }
    if (n > 0) counters_.bump(counters_.evicted_behind, n);
    uint32_t c = active_.back();
    // A block with hot laps left passes the tail once more without a
    // demotion ("Access tracking"): one lap spent, back to the head. At
    // most 4 * pick such passes a batch, so a tail of hot blocks costs
    // the list lock a bounded walk (each pass spends a lap: it ends).
    const size_t max_passes = cfg_.hot_laps > 0 ? 4 * pick + 64 : 0;
    const uint32_t now = leave_clock_.load(std::memory_order_relaxed);
    for (size_t scanned = 0; c != kNil && n < pick && scanned < pick + 64 + passes; ++scanned) {
      uint32_t prev = active_.prev_of(c);
      uint32_t w = pt_.load(c);
      if (passes < max_passes && PageTable::state_of(w) == PageState::kPresent) {
        if (const uint32_t laps = pt_.hot_laps(c); laps > 0) {
          // Within a budget's worth of departures of being given laps, a
          // pass is free (the grace period; the first half of the passes
          // allowed only, so that a tail of such blocks still ends).
          const bool grace = 2 * passes < max_passes &&
                             ((now - pt_.left_at(c)) & PageTable::kLeaveMask) < refault_reach_;
          if (!grace) set_laps(c, laps - 1);
          active_.remove(c);
          active_.push_front(c);
          ++passes;
          c = prev;
          continue;
        }
      }
      if (PageTable::state_of(w) == PageState::kPresent &&
          pt_.try_transition(c, w, PageTable::with_state(w, PageState::kDemoting))) {
        active_.remove(c);
        blocks[n] = c;
        words[n] = w;
        ++n;
      }
      c = prev;
    }
    if (n >= 2 && n < ns) n = fill_gaps(blocks, words, n, ns);
    for (size_t i = 0; i < n; ++i) set_laps(blocks[i], 0);  // gap fills may hold laps
  }
  if (passes > 0) counters_.bump(counters_.hot_passes, passes);
  for (size_t i = n; i < ns; ++i) free_slot(slots[i], empty[i]);
  if (n == 0) return 0;
  if (use_wp_async_) {
    bool kept[kMaxBatch];
    demote_async(blocks, slots, words, empty, n, kept);
    size_t moved_n = 0;
    {
      std::lock_guard<std::mutex> lk(list_mu_);
      for (size_t i = 0; i < n; ++i) {
        if (kept[i]) {
          active_.push_front(blocks[i]);  // pinned page: try others first
        } else {
          victim_.push_front(blocks[i]);
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (kept[i]) {
        free_slot(slots[i], /*empty=*/true);
        pt_.finish(blocks[i], PageTable::with_state(words[i], PageState::kPresent));
        continue;
      }
      pt_.finish(blocks[i],
                 PageTable::make(PageState::kVictim, words[i] & PageTable::kKeep, slots[i]));
      ++moved_n;
    }
    counters_.bump(counters_.demotions, moved_n);
    return moved_n;
  }
  // Blocks a confirmed stream mapped ahead (kPrefetched), still clean and
  // with a remote copy, leave without the victim cache: no copy, no slot,
  // straight back to Remote after the MADV_DONTNEED below ("Scan
  // resistance" in prefetch_path.h). A write since would have made them dirty (they
  // were mapped write-protected), and one racing this demotion faults and
  // waits for it (Demoting) as for any other block.
  bool drop[kMaxBatch] = {};
  size_t n_drop = 0;
  for (size_t i = 0; i < n; ++i) {
    drop[i] = (words[i] & (PageTable::kPrefetched | PageTable::kDirty)) == PageTable::kPrefetched &&
              pt_.remote(blocks[i]) != 0;
    n_drop += drop[i] ? 1 : 0;
  }
  // The dirty blocks by address (their batch indexes), taken one run of
  // adjacent blocks at a time. Writes from now on fault and wait for this
  // demotion (invariant 4). Clean blocks are write-protected already; a run
  // of dirty ones is write-protected by one UFFDIO_WRITEPROTECT: each call
  // is a TLB flush, and on this machine (a paravirtualised guest) a flush
  // costs ~20-30 us per page up to 33 pages and the same as one page beyond
  // that (the kernel's full-flush ceiling), so a run of 64 costs what one
  // block did (see "Eviction batching" above).
  // With UFFDIO_MOVE a run of one block (no dirty neighbour in the batch)
  // moves to its empty slot instead, and is done: one ioctl and one flush,
  // atomic, where the copy path pays a write-protect of its own, the copy
  // and a share of the batched drop. A longer run shares one write-protect
  // and one drop, which costs less than a flush per block (GNU sort at 70%,
  // moving every dirty block: ~7% slower than the copy path, five pairs);
  // a clean block's copy needs no flush of its own either. A moved block's
  // bytes are in its slot as a copied one's are: one never written since a
  // zero fill mapped it goes back to Empty the same way (clean_if_zero()),
  // with no WRITE. The rest (or all, without UFFDIO_MOVE) are copied below.
  bool moved[kMaxBatch] = {};
  uint32_t dirty[kMaxBatch];
  size_t nd = 0;
  for (size_t i = 0; i < n; ++i) {
    if (words[i] & PageTable::kDirty) dirty[nd++] = static_cast<uint32_t>(i);
  }
  std::sort(dirty, dirty + nd, [&](uint32_t x, uint32_t y) { return blocks[x] < blocks[y]; });
  for (size_t i = 0; i < nd;) {
    size_t j = i + 1;
    while (j < nd && blocks[dirty[j]] == blocks[dirty[j - 1]] + 1) ++j;
    const uint32_t k = dirty[i], b = blocks[k];
    if (j == i + 1 && use_move_ && empty[k] && move_out(b, slots[k])) {
      moved[k] = true;
      words[k] = clean_if_zero(b, slots[k], words[k]);
      i = j;
      continue;
    }
    int err = 0;
    const uint64_t t0 = pager_detail::now_ns();
    const Errc wpe = uffd_.write_protect(block_addr(b), (j - i) * uint64_t{block_}, true, &err);
    wp_ns_.fetch_add(pager_detail::now_ns() - t0, std::memory_order_relaxed);
    wp_calls_.fetch_add(1, std::memory_order_relaxed);
    if (wpe != Errc::kOk) {
      fatal("pager: write-protecting %zu blocks at %p for eviction failed: %s", j - i,
            static_cast<void*>(block_addr(b)), strerror(err));
    }
    evict_wp_calls_.fetch_add(1, std::memory_order_relaxed);
    i = j;
  }
  // The blocks are mapped and owned by this thread: reading them cannot fault.
  size_t nc = 0;
  uint32_t sorted[kMaxBatch];
  for (size_t i = 0; i < n; ++i) {
    if (moved[i]) continue;
    sorted[nc++] = blocks[i];
    if (drop[i]) continue;
    pager_detail::copy_from_region(slot_addr(slots[i]), block_addr(blocks[i]), block_);
    words[i] = clean_if_zero(blocks[i], slots[i], words[i]);
  }
  // The runs of adjacent blocks dropped under one TLB flush (pager/zap.h;
  // one MADV_DONTNEED per run where the kernel cannot batch).
  std::sort(sorted, sorted + nc);
  ZapBatch zap;  // nc <= kMaxBatch: add() never flushes early
  for (size_t i = 0; i < nc; ++i) (void)zap.add(block_addr(sorted[i]), block_);
  if (int err = zap.flush(); err != 0) {
    fatal("pager: MADV_DONTNEED of %zu demoted blocks from %p failed: %s", nc,
          static_cast<void*>(block_addr(sorted[0])), strerror(err));
  }
  evict_dontneed_calls_.fetch_add(zap.batched_calls() + zap.single_calls(),
                                  std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lk(list_mu_);
    for (size_t i = 0; i < n; ++i) {
      if (!drop[i]) victim_.push_front(blocks[i]);  // oldest nearest the tail
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (drop[i]) {
      free_slot(slots[i], empty[i]);
      note_left(blocks[i]);
      pt_.finish(blocks[i], PageTable::make(PageState::kRemote, 0, 0));
      continue;
    }
    pt_.finish(blocks[i],
               PageTable::make(PageState::kVictim, words[i] & PageTable::kKeep, slots[i]));
  }
  if (n_drop > 0) {
    unreserve(static_cast<int64_t>(n_drop));
    counters_.bump(counters_.evictions_clean, n_drop);
    ahead_drops_.fetch_add(n_drop, std::memory_order_relaxed);
  }
  counters_.bump(counters_.demotions, n - n_drop);
  if (dropped) *dropped = n_drop;
  return n;
}

template <TransportBackend B>
size_t Pager<B>::fill_gaps(uint32_t* blocks, uint32_t* words, size_t n, size_t cap) {
  // The picked blocks keep their order (oldest first: the victim list's
  // order); gap blocks are appended.
  uint32_t sorted[kDemotePick + kDemoteFill];
  FARMEM_BUG_ON(cap > kDemotePick + kDemoteFill || n > cap);
  std::copy(blocks, blocks + n, sorted);
  std::sort(sorted, sorted + n);
  size_t out = n;
  for (size_t i = 0; i + 1 < n && out < cap; ++i) {
    const uint32_t lo = sorted[i], hi = sorted[i + 1];
    if (hi - lo < 2 || hi - lo > 3) continue;
    for (uint32_t g = lo + 1; g < hi && out < cap; ++g) {
      const uint32_t w = pt_.load(g);
      if (!take_listed(g, w)) continue;
      blocks[out] = g;
      words[out] = w;
      ++out;
    }
  }
  if (out > n) counters_gap_fill_.fetch_add(out - n, std::memory_order_relaxed);
  return out;
}

template <TransportBackend B>
bool Pager<B>::take_listed(uint32_t b, uint32_t w) {
  // Present and unpinned: on the active list (blocks are pushed before
  // they turn Present and taken off it before they are pinned); a zero-page
  // block is on no list.
  if (PageTable::state_of(w) != PageState::kPresent ||
      (w & (PageTable::kPinned | PageTable::kZeroMapped))) {
    return false;
  }
  uint32_t expect = w;
  if (!pt_.try_transition(b, expect, PageTable::with_state(w, PageState::kDemoting))) return false;
  active_.remove(b);
  return true;
}

// Blocks read ahead into the victim cache and not faulted on yet (a
// stream's marker, an unconfirmed stream's window) are what the program is
// about to touch, while a demoted block is what it touched last: they go
// last. Within the blocks scanned from the tail, the clean read-ahead ones
// are passed over and dropped (oldest first, counted unused) only if the
// round still needs room after the rest. Without this a scan descheduled
// for a moment (a loaded machine) had its next markers pushed out by the
// demotions the window it had mapped caused, and read them twice
// (PagerTest.SequentialScanHitsPrefetchedPages, beside two busy loops: 1 of
// 30 runs; none in 30 after). Read-ahead blocks nobody wants still leave:
// once the tail's scanned window holds nothing else, they are dropped.
template <TransportBackend B>
size_t Pager<B>::drop_victims(size_t max) {
  uint32_t clean_slots[256], ahead[256];
  size_t n_clean = 0, n_unused = 0, n_ahead = 0;
  h_wb_.clear();
  {
    std::lock_guard<std::mutex> lk(list_mu_);
    uint32_t c = victim_.back();
    for (size_t scanned = 0; c != kNil && scanned < 2 * max + 16 && n_clean + h_wb_.size() < max;
         ++scanned) {
      uint32_t prev = victim_.prev_of(c);
      uint32_t w = pt_.load(c);
      if (PageTable::state_of(w) == PageState::kVictim) {
        if (!(w & PageTable::kDirty)) {
          if ((w & PageTable::kPrefetched) && pt_.remote(c) != 0) {
            if (n_ahead < 256) ahead[n_ahead++] = c;
            c = prev;
            continue;
          }
          PageState to = pt_.remote(c) != 0 ? PageState::kRemote : PageState::kEmpty;
          if (pt_.try_transition(c, w, PageTable::make(to, 0, 0))) {
            note_left(c);  // after the CAS: a stamp racing a fetch is only a hint
            victim_.remove(c);
            clean_slots[n_clean++] = PageTable::slot_of(w);
          }
        } else if (pt_.try_transition(c, w, PageTable::with_state(w, PageState::kWriting))) {
          victim_.remove(c);
          h_wb_.push_back(c);
        }
      }
      c = prev;
    }
    for (size_t i = 0; i < n_ahead && n_clean + h_wb_.size() < max; ++i) {
      uint32_t w = pt_.load(ahead[i]);
      if (PageTable::state_of(w) != PageState::kVictim || (w & PageTable::kDirty)) continue;
      if (pt_.try_transition(ahead[i], w, PageTable::make(PageState::kRemote, 0, 0))) {
        victim_.remove(ahead[i]);
        clean_slots[n_clean++] = PageTable::slot_of(w);
        ++n_unused;
      }
    }
  }
  for (size_t i = 0; i < n_clean; ++i) free_slot(clean_slots[i]);
  if (n_clean) {
    unreserve(static_cast<int64_t>(n_clean));
    counters_.bump(counters_.evictions_clean, n_clean);
  }
  if (n_unused) {
    counters_.bump(counters_.prefetch_unused, n_unused);
    for (size_t i = 0; i < n_unused; ++i) prefetcher_->on_unused();
  }
  if (h_wb_.empty()) return n_clean;

  // Dirty victims: one batch of WRITEs from their slots, one per replica
  // on a live donor (cookie: block | server << 32).
  std::vector<IoOp>& ops = wb_ops_;
  ops.clear();
  for (uint32_t b : h_wb_) {
    if (pt_.remote(b) == 0) {
      auto u = remote_->alloc_unit();
      if (!u.ok()) {
        fatal("pager: no remote space to write back dirty block %u at %p: %s", b,
              static_cast<void*>(block_addr(b)), u.status().to_string().c_str());
      }
      pt_.remote(b) = *u + 1;
    } else if (Status fs = fork_rehome(b); !fs.ok()) {
      fatal("pager: no remote space to write back dirty block %u at %p: %s", b,
            static_cast<void*>(block_addr(b)), fs.to_string().c_str());
    }
    uint32_t w = pt_.load(b);
    const uint32_t slot = PageTable::slot_of(w);
    RemoteAddr to[RemoteMap::kMaxReplicas];
    const size_t nt = remote_->begin_write(pt_.remote(b) - 1, to);
    if (nt == 0) {
      char where[512];
      remote_->describe_replicas(pt_.remote(b) - 1, where, sizeof where);
      fatal(
          "pager: cannot write back dirty block at %p: donor %s is unavailable and no "
          "replica holds it (replicas: %s)",
          static_cast<void*>(block_addr(b)),
          remote_->server_name(remote_->resolve(pt_.remote(b) - 1).server), where);
    }
    wb_left_[slot] = static_cast<uint8_t>(nt);
    wb_ok_[slot] = 0;
    wb_retry_[slot] = 0;
    for (size_t i = 0; i < nt; ++i) {
      ops.push_back(IoOp{IoKind::kWrite, block_, to[i], slot_addr(slot),
                         uint64_t{b} | uint64_t{to[i].server} << 32});
    }
  }
  size_t done_ok = 0;
  size_t posted = 0;
  while (posted < ops.size()) {
    size_t room = evict_q_->depth() - evict_q_->outstanding();
    size_t n = ops.size() - posted < room ? ops.size() - posted : room;
    if (n > 0) {
      Errc pe = evict_q_->post({ops.data() + posted, n});
      if (pe == Errc::kOk) {
        posted += n;
      } else if (pe == Errc::kUnavailable) {
        // A donor's connection is gone: one op at a time, and an op the
        // queue refuses as unavailable completes as such (its replica is
        // marked failed; the others still take the block).
        Errc p1 = evict_q_->post({ops.data() + posted, 1});
        if (p1 == Errc::kOk || p1 == Errc::kUnavailable) {
          if (p1 != Errc::kOk) {
            done_ok += writeback_done(IoCompletion{ops[posted].cookie, Errc::kUnavailable});
          }
          ++posted;
        }
      }
    }
    IoCompletion comps[64];
    size_t got = evict_q_->wait(comps, 10);
    for (size_t i = 0; i < got; ++i) done_ok += writeback_done(comps[i]);
  }
  while (evict_q_->outstanding() > 0) {
    IoCompletion comps[64];
    size_t got = evict_q_->wait(comps, 10);
    for (size_t i = 0; i < got; ++i) done_ok += writeback_done(comps[i]);
  }
  counters_.bump(counters_.writes, ops.size());
  // Bounded exponential back-off: a donor failing WRITEs (other than
  // kUnavailable, which is fatal or fails over) is not hammered with the
  // same blocks in a tight loop. Sleeping here delays faults waiting for
  // budget by at most kWbBackoffMaxUs per round; one clean round resets it.
  if (wb_failures_ != 0) {
    wb_failures_ = 0;
    wb_backoff_us_ =
        wb_backoff_us_ == 0 ? kWbBackoffMinUs : std::min(2 * wb_backoff_us_, kWbBackoffMaxUs);
    std::this_thread::sleep_for(std::chrono::microseconds(wb_backoff_us_));
  } else if (done_ok != 0) {
    wb_backoff_us_ = 0;
  }
  return n_clean + done_ok;
}

template <TransportBackend B>
size_t Pager<B>::writeback_done(const IoCompletion& c) {
  const uint32_t b = static_cast<uint32_t>(c.cookie);
  const ServerId server = static_cast<ServerId>(c.cookie >> 32);
  const uint32_t w = pt_.load(b);
  const uint32_t slot = PageTable::slot_of(w);
  // One replica's WRITE. A donor found gone no longer holds a replica (the
  // replicator rebuilds it elsewhere); any other failure is retried.
  if (c.status == Errc::kOk) {
    ++wb_ok_[slot];
  } else if (c.status == Errc::kUnavailable || c.status == Errc::kNotFound) {
    remote_->mark_failed(server);
  } else {
    wb_retry_[slot] = static_cast<uint8_t>(c.status);
  }
  if (--wb_left_[slot] > 0) return 0;  // more replicas to hear from
  remote_->end_write(pt_.remote(b) - 1);
  if (wb_retry_[slot] == 0 && wb_ok_[slot] > 0) {
    // Every live replica stored the WRITE: only now may the local copy go
    // (invariant 1).
    // Seen written: it comes back writable.
    note_left(b);
    pt_.finish(b, PageTable::make(PageState::kRemote, written_flag(b, w, slot), 0));
    free_left_slot(slot);
    counters_.bump(counters_.evictions_dirty);
    counters_.bump(counters_.bytes_written, block_);
    return 1;
  }
  if (wb_retry_[slot] == 0) {
    char where[512];
    remote_->describe_replicas(pt_.remote(b) - 1, where, sizeof where);
    fatal(
        "pager: cannot write back dirty block at %p: donor %s is unavailable and no replica "
        "holds it (replicas: %s)",
        static_cast<void*>(block_addr(b)), remote_->server_name(server), where);
  }
  // Any other failure: keep the data in its slot, still dirty, and retry
  // it (on every replica) in a later round, after a back-off.
  counters_.bump(counters_.writeback_errors);
  ++wb_failures_;
  FARMEM_LOG(kWarn, "pager: write-back of block %u at %p failed (%s); kept locally for a retry", b,
             static_cast<void*>(block_addr(b)), errc_name(static_cast<Errc>(wb_retry_[slot])));
  {
    std::lock_guard<std::mutex> lk(list_mu_);
    victim_.push_front(b);
  }
  pt_.finish(b, PageTable::with_state(w, PageState::kVictim));
  return 0;
}

template <TransportBackend B>
void Pager<B>::discard_remote(uint32_t b) {
  uint32_t& unit1 = pt_.remote(b);  // the unit + 1
  if (unit1 == 0) return;
  // A fork snapshot may still read the unit: then it frees it.
  if (!fork_.keep_unit(b, unit1 - 1, /*discarded=*/true)) remote_->free_unit(unit1 - 1);
  unit1 = 0;
}

template <TransportBackend B>
Status Pager<B>::discard(void* addr, size_t len) {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t base = reinterpret_cast<uintptr_t>(region_.ptr);
  if (a < base || a + len > base + cfg_.region_size || len > cfg_.region_size ||
      (a - base) % block_ != 0 || len % block_ != 0) {
    return make_error(Errc::kInvalidArgument,
                      "discard(%p, %zu): the range must be inside the region [%p, +%llu) and "
                      "aligned to the %u-byte block size",
                      addr, len, static_cast<void*>(region_.ptr),
                      static_cast<unsigned long long>(cfg_.region_size), block_);
  }
  const uint32_t first = static_cast<uint32_t>((a - base) / block_);
  const uint32_t last = first + static_cast<uint32_t>(len / block_);
  // Mapped blocks are dropped in runs: one MADV_DONTNEED per run of adjacent
  // blocks instead of one per block. Each madvise of a process with pager
  // threads flushes the other CPUs' TLBs; per block, that was most of the
  // cost of a program freeing large buffers under the preload library
  // (jemalloc purges freed extents through here). The run's blocks stay in
  // Discarding (faults on them wait) until the one madvise is done.
  constexpr uint32_t kMaxRun = 1024;
  uint32_t run_first = 0, run_len = 0;
  auto drop_run = [&] {
    if (run_len == 0) return;
    if (madvise(block_addr(run_first), uint64_t{run_len} * block_, MADV_DONTNEED) != 0) {
      fatal("pager: discard: MADV_DONTNEED of %u blocks at %p failed: %s", run_len,
            static_cast<void*>(block_addr(run_first)), strerror(errno));
    }
    for (uint32_t b = run_first; b < run_first + run_len; ++b) {
      if (!(pt_.load(b) & PageTable::kZeroMapped)) unreserve();  // a zero page held no room
      discard_remote(b);
      pt_.finish(b, PageTable::make(PageState::kEmpty, 0, 0));
    }
    run_len = 0;
  };
  for (uint32_t b = first; b < last; ++b) {
    for (;;) {
      uint32_t w = pt_.load(b);
      PageState s = PageTable::state_of(w);
      if (s == PageState::kEmpty) break;
      if (is_transient(s)) {
        // I/O or a fault in flight on the block: wait for it (bounded by
        // that I/O). Drop the run first so that no fault waits on us
        // while we wait.
        drop_run();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kDiscarding))) continue;
      if (s == PageState::kPresent) {
        set_laps(b, 0);  // keeps hot_blocks_ (blocks holding laps) exact
        if (w & PageTable::kPinned) {
          pinned_.fetch_sub(1, std::memory_order_relaxed);  // discard unpins
        } else if (!(w & PageTable::kZeroMapped)) {         // a zero-mapped block is on no list
          std::lock_guard<std::mutex> lk(list_mu_);
          active_.remove(b);
        }
        if (run_len != 0 && (run_first + run_len != b || run_len == kMaxRun)) drop_run();
        if (run_len == 0) run_first = b;
        ++run_len;
        break;
      }
      if (s == PageState::kVictim) {
        {
          std::lock_guard<std::mutex> lk(list_mu_);
          victim_.remove(b);
        }
        free_slot(PageTable::slot_of(w));
        unreserve();
      }
      discard_remote(b);
      pt_.finish(b, PageTable::make(PageState::kEmpty, 0, 0));
      break;
    }
  }
  drop_run();
  return ok_status();
}

template <TransportBackend B>
Status Pager<B>::evict(void* addr, size_t len) {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t base = reinterpret_cast<uintptr_t>(region_.ptr);
  if (a < base || a + len > base + cfg_.region_size || len > cfg_.region_size ||
      (a - base) % block_ != 0 || len % block_ != 0) {
    return make_error(Errc::kInvalidArgument,
                      "evict(%p, %zu): the range must be inside the region [%p, +%llu) and "
                      "aligned to the %u-byte block size",
                      addr, len, static_cast<void*>(region_.ptr),
                      static_cast<unsigned long long>(cfg_.region_size), block_);
  }
  std::lock_guard<std::mutex> hl(hint_mu_);
  const uint32_t first = static_cast<uint32_t>((a - base) / block_);
  const uint32_t last = first + static_cast<uint32_t>(len / block_);
  for (uint32_t b = first; b < last; ++b) {
    for (;;) {
      uint32_t w = pt_.load(b);
      PageState s = PageTable::state_of(w);
      if (s == PageState::kEmpty || s == PageState::kRemote) break;
      if (is_transient(s)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      if (s == PageState::kPresent && (w & PageTable::kPinned)) break;  // stays until unpin
      if (s == PageState::kPresent && (w & PageTable::kZeroMapped)) {
        // Holds no memory: it leaves as never written (Empty), no I/O.
        if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kDiscarding))) continue;
        if (madvise(block_addr(b), block_, MADV_DONTNEED) != 0) {
          fatal("pager: MADV_DONTNEED at %p failed: %s", static_cast<void*>(block_addr(b)),
                strerror(errno));
        }
        pt_.finish(b, PageTable::make(PageState::kEmpty, 0, 0));
        break;
      }
      if (s == PageState::kPresent) {
        // Demote into a slot first, exactly as the evictor does.
        uint32_t slot = alloc_slot();
        if (slot == kNoSlot) {
          kick_evictor();  // slots come back as the evictor drops victims
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          continue;
        }
        if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kDemoting))) {
          free_slot(slot);
          continue;
        }
        {
          std::lock_guard<std::mutex> lk(list_mu_);
          active_.remove(b);
        }
        if (use_wp_async_) {
          // As the evictor does (demote_async): never copy + DONTNEED here.
          uint32_t ws = w;
          bool kept = false;
          const bool empty = false;  // unknown: demote_async empties it
          demote_async(&b, &slot, &ws, &empty, 1, &kept);
          if (kept) {
            {
              std::lock_guard<std::mutex> lk(list_mu_);
              active_.push_front(b);
            }
            free_slot(slot, true);
            pt_.finish(b, PageTable::with_state(ws, PageState::kPresent));
            break;  // pinned for DMA: a hint, skip it
          }
          {
            std::lock_guard<std::mutex> lk(list_mu_);
            victim_.push_front(b);
          }
          pt_.finish(b, PageTable::make(PageState::kVictim, ws & PageTable::kKeep, slot));
          counters_.bump(counters_.demotions);
          continue;  // now a victim: dropped below
        }
        int err = 0;
        if ((w & PageTable::kDirty) &&
            uffd_.write_protect(block_addr(b), block_, true, &err) != Errc::kOk) {
          fatal("pager: write-protecting block %u at %p for evict() failed: %s", b,
                static_cast<void*>(block_addr(b)), strerror(err));
        }
        pager_detail::copy_from_region(slot_addr(slot), block_addr(b), block_);
        w = clean_if_zero(b, slot, w);
        if (madvise(block_addr(b), block_, MADV_DONTNEED) != 0) {
          fatal("pager: MADV_DONTNEED at %p failed: %s", static_cast<void*>(block_addr(b)),
                strerror(errno));
        }
        {
          std::lock_guard<std::mutex> lk(list_mu_);
          victim_.push_front(b);
        }
        pt_.finish(b, PageTable::make(PageState::kVictim, w & PageTable::kKeep, slot));
        counters_.bump(counters_.demotions);
        continue;  // now a victim: dropped below
      }
      // Victim.
      const uint32_t slot = PageTable::slot_of(w);
      if (!(w & PageTable::kDirty)) {
        PageState to = pt_.remote(b) != 0 ? PageState::kRemote : PageState::kEmpty;
        if (!pt_.try_transition(b, w, PageTable::make(to, 0, 0))) continue;
        {
          std::lock_guard<std::mutex> lk(list_mu_);
          victim_.remove(b);
        }
        free_slot(slot);
        unreserve();
        counters_.bump(counters_.evictions_clean);
        break;
      }
      if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kWriting))) continue;
      {
        std::lock_guard<std::mutex> lk(list_mu_);
        victim_.remove(b);
      }
      if (pt_.remote(b) == 0) {
        auto u = remote_->alloc_unit();
        if (!u.ok()) {
          {
            std::lock_guard<std::mutex> lk(list_mu_);
            victim_.push_front(b);
          }
          pt_.finish(b, PageTable::with_state(w, PageState::kVictim));
          return u.status().with_context("evict");
        }
        pt_.remote(b) = *u + 1;
      } else if (Status fs = fork_rehome(b); !fs.ok()) {
        {
          std::lock_guard<std::mutex> lk(list_mu_);
          victim_.push_front(b);
        }
        pt_.finish(b, PageTable::with_state(w, PageState::kVictim));
        return fs.with_context("evict");
      }
      // One WRITE per replica on a live donor, one at a time (a hint).
      RemoteAddr to[RemoteMap::kMaxReplicas];
      const size_t nt = remote_->begin_write(pt_.remote(b) - 1, to);
      IoOp op{IoKind::kWrite, block_, nt ? to[0] : remote_->resolve(pt_.remote(b) - 1),
              slot_addr(slot), b};
      IoCompletion c{b, nt ? Errc::kOk : Errc::kUnavailable};
      size_t stored = 0;
      for (size_t i = 0; i < nt; ++i) {
        IoOp o{IoKind::kWrite, block_, to[i], slot_addr(slot), b};
        Errc e = hint_q_->post({&o, 1});
        IoCompletion ci{b, e};
        if (e == Errc::kOk) {
          while (hint_q_->wait({&ci, 1}, 100) == 0) {
          }
        }
        counters_.bump(counters_.writes);
        if (ci.status == Errc::kOk) {
          ++stored;
        } else if (ci.status == Errc::kUnavailable || ci.status == Errc::kNotFound) {
          remote_->mark_failed(to[i].server);  // its replica is rebuilt elsewhere
          if (c.status == Errc::kOk) op = o;
        } else {
          c.status = ci.status;
          op = o;
        }
      }
      remote_->end_write(pt_.remote(b) - 1);
      if (c.status == Errc::kOk && stored == 0) c.status = Errc::kUnavailable;
      if (c.status != Errc::kOk) {
        {
          std::lock_guard<std::mutex> lk(list_mu_);
          victim_.push_front(b);
        }
        pt_.finish(b, PageTable::with_state(w, PageState::kVictim));
        counters_.bump(counters_.writeback_errors);
        return make_error(c.status,
                          "evict: WRITE of the dirty block at %p to donor %s failed; the data "
                          "stays local and is retried by the evictor",
                          static_cast<void*>(block_addr(b)),
                          remote_->server_name(op.remote.server));
      }
      pt_.finish(b, PageTable::make(PageState::kRemote, written_flag(b, w, slot), 0));
      free_slot(slot);
      unreserve();
      counters_.bump(counters_.evictions_dirty);
      counters_.bump(counters_.bytes_written, block_);
      break;
    }
  }
  // The range left local memory: so do the pages of the slots it freed.
  while (release_slot_pages(kDemotePick) > 0) {
  }
  return ok_status();
}

}  // namespace farmem
