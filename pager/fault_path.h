// Pager<B>'s fault path: the handler threads (handler_main(), the uffd
// read, dispatch, deferral of faults that must wait), handle_fault() for
// every kind of block, the demand READ and its completion (complete(),
// retry_read() failover, lost_page()), the install into the region
// (install_mapped(): one UFFDIO_COPY, WP or writable), the budget
// reservation a fault takes (reserve()), and the doorbell that wakes
// handlers blocked in read(). Zero fills are in zero_fill.h, prefetch in
// prefetch_path.h, the victim cache's moves in victim_move.h. Part of
// Pager<B> (pager/pager_core.h); include pager/pager.h.
//
// How a fault is served (one hand-off: kernel -> handler thread):
//   * never-written block (Empty): UFFDIO_COPY from a zero block, no I/O;
//     installed write-protected for a read fault, writable + dirty for a
//     write fault (one fault per read-modify-write);
//   * remote block: READ into the handler's registered staging buffer on the
//     handler's own transport queue, then UFFDIO_COPY (WP or writable as
//     above); concurrent faults on the block are parked in the kernel and
//     woken by that one copy;
//   * write to a clean (write-protected) block: WP fault -> dirty, unprotect
//     (with WP_ASYNC, victim_move.h: no fault at all, the kernel lets it through);
//   * victim-cache block (evicted but still local): UFFDIO_COPY from its slot
//     (writable + dirty for a write fault, as above; a dirty block comes
//     back writable whatever the fault: it is written back anyway).
//
// Fault-path cost (cold remote fault, loopback, 4 KiB, one handler). rdtsc
// marks along the whole path, pager and bench/pager_bench.cc's BareUffdRig
// alike, in the same BM_ColdFault runs (scratch copies of this file, the
// loopback transport and the bench; medians of 6 runs x 10240 faults; 2
// cores at load average 6-9, Linux 6.18 in a Firecracker guest where a null
// syscall costs 1.1 us (PTI) and waking a sleeping thread 8-12 us):
//                                               pager      bare
//   app fault -> handler back from ppoll/poll   11.5-12.2  11.4-11.9 us
//   read() of the uffd_msg                      1.5        1.6
//   dispatch + page-table word (a cache miss)
//     + reserve() + Fetching CAS + t0 clock     0.41-0.43  -
//   resolve_read (RCU section)                  0.16
//   post()                                      0.03 (0.06 before the lookup cache)
//   back to the loop, reap, poll, execute       0.09-0.12
//   memcpy of 4 KiB of cold donor memory        0.69-0.70  -
//   completion -> install_mapped()              0.06
//   => handler wake -> UFFDIO_COPY              3.0-3.2    1.6-1.7
//   UFFDIO_COPY (wakes the app)                 bimodal: 2.5-4 us when the app
//     runs on the handler's CPU (95+% of faults under load), 8-12 us across
//     CPUs (idle machine); pager +0.2-0.3 us over bare at equal placement,
//     not from the source buffer (copying from the zero block instead of
//     the staging buffer changes nothing).
//   after the copy: list lock + push + finish 0.06-0.08, counters +
//     histogram 0.09-0.12, rest of the loop turn 0.07-0.11: 0.25-0.33 us,
//     on the critical path when the woken thread shares the handler's CPU.
// So the pager's own CPU before the copy is ~0.75 us and the transport's
// memcpy ~0.7 us; end to end (BM_ColdFault added_us) that is 1.3-2.0 us,
// run to run. Tried and measured:
//   * post() validates against a per-queue cache instead of locking the
//     transport's tables (a shared_mutex line all queues bounced) and
//     hashing: 0.06 -> 0.03 us; poll() completes a single untimed op
//     without the ready-list pass (not measurable); fork_seq's end of
//     section is a plain store (only the handler writes it). Kept.
//   * __builtin_prefetch of the 64 donor lines at post(): post() 0.03 ->
//     0.55-0.64 us, memcpy 0.65 -> 0.14-0.16 us: the stall only moves,
//     nothing independent runs in between. Not kept.
//   * Zero copy, UFFDIO_COPY straight from the loopback donor's memory
//     (no staging memcpy, no post/poll): the ioctl then took 25-34 us
//     instead of 3-9 (cause not looked into; the donor's memory is a
//     1 GiB anonymous mapping), +8-15 us per fault. Not kept.
//   * An idle handler waiting on the uffd alone with a 10 ms timeout (as
//     the bare rig does) instead of ppoll on uffd + stop eventfd: -0.1 us
//     on the wake-up in one pair of runs, but in A/B runs bare and pager
//     p50 both moved 23 -> 30 us (the periodic timer changed where the
//     scheduler put the threads). Not kept.
//   * An idle handler blocks in read() of the uffd instead of ppoll() +
//     read() (see "Idle handlers block in read()" above handler_main()):
//     one syscall less per fault. BM_ColdFault loopback, HEAD and the
//     change interleaved (scratch copies first, then this file; 10 pairs
//     of runs, load average 3.1-5.2): added_us median 1.06-2.35 (mostly
//     1.13-1.61) -> -0.13 .. -0.67 us, mean likewise; pager_p50 itself
//     fell by ~1.3-1.6 us at equal bare_p50. Kept. Negative only because
//     the bare rig then still did poll() + read(); it now blocks in read()
//     too (bench/pager_bench.cc BareUffdRig: the fair comparison). Idle
//     (load 0.1-0.9), same binary, bare rig polling / blocking alternated,
//     3 pairs: added_us median -0.19 / 0.15 / -10 (polling bare) against
//     1.89 / 1.83 / 1.68 (blocking bare). So the bare round trip gains
//     even more from one syscall less than the pager did, and the pager
//     still adds ~1.7-1.9 us: the 4 KiB memcpy (~0.7-0.9, the stand-in
//     for the NIC's DMA, transport_read_p50) and ~0.9-1.1 us of its own.
//     "< 1 us over bare" is NOT met against the blocking bare rig.
// BM_ColdFault (build/bench/farmem_bench_pager --benchmark_filter=
// 'BM_ColdFault/backend:0' --benchmark_repetitions=3
// --benchmark_report_aggregates_only=true; mean / median of 3):
//   before (16:56, load 3.9): added 1.65 / 1.72 us, bare 26.8 / 24.6,
//     pager 28.4 / 26.3, transport_read_p50 0.82;
//   after, interleaved with the tree without these changes, load 4.6-9:
//     added 1.44 / 1.35 at load 4.6; the other runs, both binaries alike,
//     moved by -28 .. +9 us as bare and pager fell into different wake-up
//     regimes (other builds running): no end-to-end figure at this load
//     resolves the ~0.05 us kept. added_us is NOT below 1 us.
// 2026-12-01 (loopback, the same bench with 64 rounds and the round-paired
// counters; binaries of the tree before / after each change run
// alternately, 12 pairs at load 0.7-5.9; medians, sd in brackets):
//   * Noise first: pager_own_us (difference of pooled ~30 us medians) has
//     sd 0.17 us run to run; pager_own_round_med_us (median over rounds of
//     each round's own difference) sd 0.09: the steadier figure.
//   * Demand READ counters per handler (HandlerCounters in stats.h:
//     faults_remote, reads, bytes_read and the fetch histogram, bumped by a
//     relaxed load + store on the handler's own lines, summed by stats()),
//     instead of 4 locked adds on lines evict() and the evictor also write;
//     histogram bucket by clz instead of a loop. pager_own_round_med_us
//     0.575 (0.086) -> 0.506 (0.133), pager_own_us 0.576 (0.17) -> 0.521
//     (0.31), added_us 1.39 -> 1.34; means unchanged (0.55 / 0.55): within
//     the noise; kept, as it takes locked instructions off the path and
//     cannot cost any. transport_read_p50 0.83 in both.
//   * Handler thread CPU time per fault (its thread clock over its rounds)
//     as a placement-free measure: 6-8 us in some runs and 15-16 us in
//     others, the bare and the pager handler alike (the wake-ups' cost in
//     this guest), difference -0.8 .. +1.9 us: noisier than wall time, not
//     kept in the bench.
//   pager_own_us is ~0.5 us with this: <= 0.5 is NOT clearly met.
// Earlier, load 8-9, same bench: tcp pager 59.2 / 61.6 us (the 127.0.0.1
// round trip to the donor), pager/bare 2.15 / 2.05.
//
// Several donors and replicas (FARMEM_REPLICAS; the map is in
// remote_map.h, placement in placement.h, re-replication in replicator.h):
//   * READ (demand fault, prefetch, hint): one readable replica on a live
//     donor, the one with the fewest READs outstanding
//     (RemoteMap::resolve_read; read_done() when it completed). A READ that completes (or is
//     refused) kUnavailable / kNotFound marks that donor failed and is
//     posted again on the next live replica (retry_read); only when none is
//     left does lost_page() stop the process (invariant 6), naming every
//     replica's donor, slab and offset. A failed prefetch marks the donor
//     and is forgotten.
//   * WRITE-back: one WRITE per replica on a live donor (begin_write), all
//     from the block's victim slot; the block stays there, dirty, in
//     Writing, until the last of them completed (wb_left_ per slot), and is
//     dropped only when every replica still live stored it (invariant 1
//     over replicas). A replica whose donor turns out dead is dropped from
//     that count (its donor is marked failed, the replicator rebuilds the
//     copy); any other error keeps the block for a retry on every replica;
//     no live replica at all is fatal. end_write() closes the extent's
//     seqlock-like write window that re-replication copies against.
//   * With one replica over one donor the data path is what it was: one
//     READ or WRITE per block, an RCU read-side section (urcu-bp: a
//     compiler barrier) per address lookup, no lock, no allocation.
#pragma once

#include "pager/pager_core.h"

namespace farmem {

template <TransportBackend B>
bool Pager<B>::reserve() {
  int64_t cur = resident_.load(std::memory_order_relaxed);
  while (cur < budget_blocks_) {
    if (resident_.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed)) {
      int64_t pk = peak_.load(std::memory_order_relaxed);
      while (cur + 1 > pk && !peak_.compare_exchange_weak(pk, cur + 1)) {
      }
      note_resident(cur + 1);
      return true;
    }
  }
  // The budget is full: the evictor's pressure signal (evictor_main()).
  budget_full_.fetch_add(1, std::memory_order_relaxed);
  kick_evictor();
  return false;
}

template <TransportBackend B>
void Pager<B>::lost_page(uint32_t b, Errc e) {
  // Invariant 6. Names the first replica's donor and then every replica
  // (donor, slab, offset, state); no allocation (this may run on a handler).
  const char* donor = "unknown donor";
  char replicas[512] = "none";
  if (pt_.remote(b) != 0) {
    donor = remote_->server_name(remote_->resolve(pt_.remote(b) - 1).server);
    remote_->describe_replicas(pt_.remote(b) - 1, replicas, sizeof replicas);
  }
  fatal(
      "far memory lost: the page at %p (block %u of %u bytes in the region at %p) could not "
      "be read from donor %s (%s) and no replica holds it (replicas: %s); its contents are "
      "gone, so the process stops rather than read zeros",
      static_cast<void*>(block_addr(b)), b, block_, static_cast<void*>(region_.ptr), donor,
      errc_name(e), replicas);
}

template <TransportBackend B>
bool Pager<B>::retry_read(Handler& h, const Inflight& f, Errc why) {
  if (why != Errc::kUnavailable && why != Errc::kNotFound) return false;
  remote_->mark_failed(f.server);
  const uint32_t unit = pt_.remote(f.block) - 1;
  RemoteAddr from;
  while (remote_->resolve_read(unit, &from)) {
    // The completion being handled freed an inflight entry and a queue slot.
    const uint32_t k = h.free_inflight.back();
    h.free_inflight.pop_back();
    Inflight g = f;
    g.server = from.server;
    h.inflight[k] = g;
    void* dst = f.prefetch ? static_cast<void*>(slot_addr(f.buf))
                           : static_cast<void*>(h.staging.ptr + uint64_t{f.buf} * block_);
    IoOp op{IoKind::kRead, block_, from, dst, k};
    Errc pe = h.q->post({&op, 1});
    if (pe == Errc::kOk) {
      remote_->count_failover();
      counters_.bump(counters_.reads);
      return true;
    }
    remote_->read_done(from.server);  // not posted
    h.free_inflight.push_back(k);
    if (pe != Errc::kUnavailable) return false;
    remote_->mark_failed(from.server);
  }
  return false;
}

// Handlers per CPU (config.pin_handlers, FARMEM_PIN_HANDLERS, default on):
// one handler per CPU the process may use, each pinned to its CPU. Every
// handler blocked in read() of the uffd is woken by a fault (the uffd's
// wait queue is not exclusive), and the one on the faulting thread's CPU
// runs there at once, as that thread sleeps: the round trip is two context
// switches on one CPU. An unpinned handler is usually woken on the other,
// idle CPU, and on this VM waking a halted vCPU (and the faulting thread
// back from there) costs tens of microseconds. Measured with a bare
// userfaultfd rig (a thread reading the region, a handler doing
// UFFDIO_COPY of a resident 4 KiB page; 20000 faults, load average ~7):
// handler on the faulting thread's CPU p50 3.0 us, on the other CPU 37.5
// us (38.8 us spinning in a non-blocking read: 20.7), unpinned 3.1 us p50
// but 37.7 us p90, two handlers pinned one per CPU 3.1 us p50, 4.0-4.3 us
// p90 wherever the faulting thread ran. The handler that loses the race
// finds nothing to read and blocks again.
//
// Parked handlers (main_cpu_, note_faulter(), should_park(), park()). The
// handler that wins that race is the one on the other CPU: it runs as soon
// as it is woken, while the one on the faulting thread's CPU waits for
// that thread to sleep. It then serves the fault from there, and the
// faulting thread is woken back across CPUs. Measured: perl walking a
// 600k-key hash at FARMEM_LOCAL_MEM=64M over tcp, the program staying on
// CPU 1: ~64% of its faults were served by the handler on CPU 0 (context
// switches of the two handlers and of farmemd's CPU-following data
// threads), fetch p50 64 us; with the program pinned to one CPU (one
// handler) 32 us. So when the faults come from one thread alone, the
// handlers not on its CPU park: an idle handler whose CPU is not the one
// of that thread's latest fault sleeps on park_ (a futex) instead of
// reading the uffd, and the handler left reading runs on the faulting
// thread's CPU. The fault's ptid (UFFD_FEATURE_THREAD_ID) names the
// thread; where it runs is one load of its rseq area's cpu_id
// (pager/park.h): the main thread's directly, any other's through the
// registry preload/shim.cc puts every thread the program starts in (a
// spinlock the handler never waits for: busy reads as unknown). A fault on
// another CPU wakes the parked handlers (the
// one there stays up, the rest park again); a fault of another thread than
// the last one's, or of a thread not in the registry, wakes them and keeps
// every handler up until kParkAfterOtherNs pass without one, so
// multi-threaded programs keep one handler per CPU. The handler on the
// faulting thread's CPU never parks, so one always reads the uffd; a
// parked handler looks again every kParkNs, and comes back at once for a
// fork or ~Pager (park_.bump()). Off when the pager starts on another
// thread than the main one (the main thread's rseq area could be freed),
// without rseq or THREAD_ID, and with one handler.
// The parked handlers are woken (park_.bump()) at the end of the turn in
// which the fault from a new CPU was read, once it is answered: woken
// before, the handler on the thread's new CPU ran there just as the thread
// woke, so the kernel put the thread on the other CPU, where the handler
// that served it was about to park; its next fault was served across CPUs
// again, and so on. BM_ColdFault (pinned, loopback, a main thread free to
// move): 28-36% of the faults served across CPUs, pager p50 28.6-29.5 us
// against a bare round trip's 10.1-13.1; woken after, 5%, p50 10.5-10.7
// against 9.6-9.8 (PagerStats::faults_cross_cpu counts them).
// Measured, the worker thread (zstd -19 --long=27 -T1 of 10 MiB of text
// at FARMEM_LOCAL_MEM=72M over tcp: every fault from its one worker):
// before the registry every fault woke both handlers, 15k cross-CPU
// wake-up IPIs a second (perf, ipi:ipi_send_cpu from handle_userfault),
// 101-107 s in four runs; with it 82-84 s in two (all threads confined to
// one CPU with taskset: 76-80 s), output identical.
//
// Written blocks come back writable (PageTable::kWritten): a block that
// was dirty when it last left local memory (written back) is mapped
// writable and dirty by a read fault too, as a dirty victim already is:
// what a program wrote once it mostly writes again (a tree, a hash table,
// a sort buffer), and write protection would cost a WP fault, a second
// handler round trip, at that write. The price is a write-back at its next
// eviction when it is only read this time. Measured: xz -7 -T1 of 3 MiB of
// text under the preload library, FARMEM_LOCAL_MEM=24M, loopback: WP
// faults 1.54M -> 11k of 3.7M -> 2.2M faults in all, output identical.
// Such a guessed stay (kGuessed) sees no write, so whether the block comes
// back writable once more is decided by its content: a hash of what the
// fetch brought (PageTable::fetched_hash(), set in complete()) against
// the copy it leaves with (written_flag(), evictor.h). Before, a guessed
// stay always counted as unwritten, so a block written in every stay took
// a WP fault every second fetch: xz -7 -T1 of 4 MiB of text at
// FARMEM_LOCAL_MEM=38M over tcp, WP faults 210k -> 49k of 431k remote
// faults, system time 42.5 -> 37.0 s, output identical.
//
// Idle handlers block in read() (config.blocking_read). A handler with
// nothing to come back for (no I/O in flight, nothing pending or deferred)
// waits in read() of the uffd itself: one syscall per fault instead of
// ppoll() + read() (1.1 us each here; measured in "Fault-path cost").
//   * Needs Linux >= 6.10: the uffd is made blocking, and a busy handler
//     (timed waits) reads with preadv2(RWF_NOWAIT), which never blocks when
//     another handler took the message. Probed once in init() (an empty
//     read must say EAGAIN); otherwise the uffd stays non-blocking and
//     every handler ppoll()s as before (uses_blocking_read(), a debug line).
//   * poll() of a blocking uffd only says POLLERR, so while any handler
//     polls (busy, a fork prepared, a ring on) the uffd is switched back to
//     non-blocking (set_poller(): a count under mode_mu_, one fcntl() at
//     0 <-> 1); an idle handler seeing a poller polls too. A read() already
//     blocked stays blocked whatever the flag becomes.
//   * Stop: a blocked read() sees no eventfd and signals are not ours to
//     use, so ~Pager rings the doorbell (ring_doorbell()): the fm-doorbell
//     thread faults on a page registered outside the region; a handler
//     reading that fault wakes it unresolved (UFFDIO_WAKE), goes back to
//     the top of its loop and returns (stop_); the fault comes again and
//     reaches the next blocked handler; when all returned the ringer maps
//     the page (the toucher goes) and drops it (the next ring faults again).
//   * Fork (invariant 8): the dispatch section opens BEFORE the blocking
//     read, as before the read after ppoll(), so an event read is handed
//     to fork_ inside a section and fork_parent()'s argument is unchanged.
//     The section opens (seq_cst increment of fork_seq), then fork_frozen_
//     is loaded (seq_cst); prepare_fork() stores fork_frozen_ (seq_cst),
//     then reads fork_seq (seq_cst). In the single total order either the
//     handler's load comes after the store (it sees the flag and polls
//     instead: no blocking read while frozen) or prepare_fork()'s read of
//     fork_seq comes after the increment (it sees the section open and,
//     wait_dispatch_sections(ring), rings until it ended). So once
//     prepare_fork()'s wait is over, no handler is or will be blocked in
//     read() until fork_parent() clears the flag, the handlers poll the
//     (non-blocking) uffd as before and read the UFFD_EVENT_FORK in a
//     section, and fork_parent() waits without ringing.
//   * A ring makes progress: while it is on, handlers that poll leave the
//     uffd out of ppoll() (100 us timeout) and none starts a blocking read,
//     so the doorbell fault reaches a handler blocked in read() (or one
//     that polled the uffd before it saw the ring, once), and the reader
//     always wakes it, so that it comes again while the ringer's condition
//     does not hold.
template <TransportBackend B>
void Pager<B>::handler_main(Handler& h) {
  pthread_setname_np(pthread_self(), "fm-fault");
  uffd_msg msgs[64];
  IoCompletion comps[64];
  pollfd fds[2] = {{uffd_.fd(), POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  uint32_t seq = h.fork_seq.load(std::memory_order_relaxed);
  for (;;) {
    if (stop_.load(std::memory_order_acquire)) {
      while (h.q->outstanding() > 0) reap(h, 10);
      h.exited.store(true, std::memory_order_release);
      return;
    }
    timespec ts{0, 0};
    timespec* tp = nullptr;
    if (h.q->outstanding() > 0) {
      ts.tv_nsec = 20 * 1000;  // prefetches in flight: come back for them soon
      tp = &ts;
    } else if (!h.pending.empty()) {
      // Prefetches waiting for room (retry_prefetches()); the evictor makes
      // it in batches, and polling faster costs the CPU it needs.
      ts.tv_nsec = 200 * 1000;
      tp = &ts;
    } else if (!h.deferred.empty()) {
      ts.tv_nsec = 200 * 1000;  // waiting for another thread's I/O or for budget
      tp = &ts;
    }
    // Dispatch section (see prepare_fork()): while a fork is being prepared
    // or runs, faults are parked and no ioctl is started, and the uffd is
    // still read so that the kernel's UFFD_EVENT_FORK is. Odd inside; only
    // this thread writes fork_seq. It opens before the uffd is read, so that
    // an event read is handed to fork_ inside it.
    ssize_t got = -1;     // bytes read from the uffd this turn
    bool unpark = false;  // note_faulter(): wake the parked handlers at the turn's end
    bool open = false;
    const bool quiet = !fork_frozen_.load(std::memory_order_relaxed) &&
                       !ring_active_.load(std::memory_order_relaxed);
    if (blocking_read_) set_poller(h, tp != nullptr || !quiet);
    // Parked handlers (see above): idle, and not on the CPU the faults come
    // from. The top of the loop looks at stop_ again.
    if (tp == nullptr && quiet && park(h)) continue;
    // Another handler polls: the uffd is non-blocking, poll it too (a
    // blocking read() would return at once). Its ppoll() returns POLLERR
    // once that one made the uffd blocking again: one turn more, then read().
    if (tp == nullptr && quiet && blocking_read_ &&
        pollers_hint_.load(std::memory_order_acquire) == 0) {
      // Idle: the section opens, then the read waits in it (one syscall per
      // fault). Not while a fork is prepared or a ring is on: the section
      // would then only end at the next fault. The seq_cst increment and
      // load pair with prepare_fork()'s store and its read of fork_seq:
      // either this load sees the fork flag, or prepare_fork() sees the
      // section open and rings the doorbell until it has ended.
      h.fork_seq.fetch_add(1, std::memory_order_seq_cst);
      ++seq;
      open = true;
      if (!fork_frozen_.load(std::memory_order_seq_cst) &&
          !ring_active_.load(std::memory_order_seq_cst)) {
        got = read(uffd_.fd(), msgs, sizeof msgs);
      } else {
        h.fork_seq.store(++seq, std::memory_order_release);
        open = false;
      }
    }
    if (!open) {
      // While a ring is on, leave the uffd to the handlers blocked in read():
      // each doorbell fault then reaches one of them (see ring_doorbell()).
      const bool ring = blocking_read_ && ring_active_.load(std::memory_order_acquire);
      if (ring && tp == nullptr) {
        ts.tv_nsec = 100 * 1000;  // back to the uffd soon after the ring
        tp = &ts;
      }
      fds[0].fd = ring ? -1 : uffd_.fd();
      const int r = ppoll(fds, 2, tp, nullptr);
      h.fork_seq.fetch_add(1, std::memory_order_seq_cst);
      ++seq;
      // Never blocks: another handler may have taken the message.
      if (r > 0 && (fds[0].revents & POLLIN)) got = uffd_.read_nowait(msgs, sizeof msgs);
    }
    const bool frozen = fork_frozen_.load(std::memory_order_seq_cst);
    if (got > 0) {
      size_t cnt = static_cast<size_t>(got) / sizeof(uffd_msg);
      for (size_t i = 0; i < cnt; ++i) {
        if (msgs[i].event == UFFD_EVENT_FORK) {
          fork_.on_fork_event(static_cast<int>(msgs[i].arg.fork.ufd));
          continue;
        }
        if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
        uint64_t addr = msgs[i].arg.pagefault.address;
        uint64_t flags = msgs[i].arg.pagefault.flags;
        if (blocking_read_ && addr - doorbell_addr_ < kDoorbellBytes) {
          // Rung (ring_doorbell()): wake it unresolved, so that it faults
          // again and reaches the next handler; this one's section ends.
          (void)uffd_.wake(doorbell_.ptr, kDoorbellBytes);
          continue;
        }
        unpark |= note_faulter(h, msgs[i]);
        const Outcome o = frozen ? Outcome::kDefer : handle_fault(h, addr, flags);
        if (o != Outcome::kDone) defer(h, addr, flags, o == Outcome::kWait);
      }
    }
    // Frozen: I/O in flight still completes (prepare_fork waits for it).
    if (!frozen && !h.deferred.empty()) run_deferred(h);
    // A demand fetch holds an application thread: wait for it here (other
    // handler threads take new faults meanwhile).
    while (h.demand_outstanding > 0) reap(h, 10);
    if (h.q->outstanding() > 0) {
      size_t n = h.q->poll(comps);
      for (size_t i = 0; i < n; ++i) complete(h, comps[i]);
    }
    flush_run(h);  // prefetched blocks gathered by complete()
    if (!frozen && !h.pending.empty()) retry_prefetches(h);
    // Faults parked on blocks this thread just installed can go now,
    // without waiting for the next poll timeout.
    if (!frozen && !h.deferred.empty()) run_deferred(h);
    // The section ends: a plain store (no locked instruction) suffices, as
    // only this thread writes fork_seq.
    h.fork_seq.store(++seq, std::memory_order_release);
    // Only now, with the faults of this turn answered (see "Parked
    // handlers": a handler woken before keeps the faulting thread's CPU
    // busy as the thread wakes, which sends it elsewhere).
    if (unpark) park_.bump();
  }
}

template <TransportBackend B>
void Pager<B>::reap(Handler& h, int timeout_ms) {
  IoCompletion comps[64];
  size_t n = h.q->wait(comps, timeout_ms);
  for (size_t i = 0; i < n; ++i) complete(h, comps[i]);
  flush_run(h);  // prefetched blocks gathered by complete()
}

template <TransportBackend B>
void Pager<B>::defer(Handler& h, uint64_t addr, uint64_t flags, bool owner) {
  counters_.bump(counters_.faults_waited);
  uint64_t page = addr & ~uint64_t{4095};
  for (Deferred& d : h.deferred) {
    if ((d.addr & ~uint64_t{4095}) == page) {
      d.flags |= flags;
      d.owner = d.owner && owner;  // one fault surely blocked: the entry is live
      return;
    }
  }
  // Each entry is a blocked application thread; 4096 of them parked on one
  // handler at once would be a bug.
  FARMEM_BUG_ON(h.deferred.size() == h.deferred.capacity());
  h.deferred.push_back({addr, flags, owner});
}

// Stale entries. A fault parked because another thread owned its block
// (kWait; a prefetch in flight, most often) may have been answered already:
// the owner's UFFDIO_COPY wakes every thread waiting on the range, but the
// entry stays here. Should the block then leave again before this handler
// comes back (a descheduled handler, a mapped read-ahead block the evictor
// drops), serving the entry as a fresh fault would READ the block for
// nobody and start a read-ahead window after it (PagerTest.
// SequentialScanHitsPrefetchedPages under load: 3 of 30 runs read a block
// twice). So such an entry, found on a block that is Remote or Empty, is
// not served: the range is woken and the entry dropped. A thread that was
// still blocked faults again at once and is served from that fresh
// message (one more round trip, only on this rare path); one that was not
// costs nothing. A Victim block is still served (a promotion, no I/O): a
// scan that catches up with its unmapped read-ahead lands there, and a
// wake-and-refault would cost it a round trip on every such fault.
template <TransportBackend B>
void Pager<B>::run_deferred(Handler& h) {
  size_t keep = 0;
  for (size_t i = 0; i < h.deferred.size(); ++i) {
    Deferred d = h.deferred[i];
    if (d.owner) {  // kWait comes only from a block of the region
      const uint32_t b = block_index(reinterpret_cast<const void*>(d.addr));
      const PageState s = PageTable::state_of(pt_.load(b));
      if (s == PageState::kRemote || s == PageState::kEmpty) {
        counters_.bump(counters_.faults_stale);
        (void)uffd_.wake(block_addr(b), block_);
        continue;
      }
    }
    const Outcome o = handle_fault(h, d.addr, d.flags);
    if (o == Outcome::kDone) continue;
    d.owner = d.owner && o == Outcome::kWait;
    h.deferred[keep++] = d;
  }
  h.deferred.resize(keep);  // shrinking: no allocation
}

template <TransportBackend B>
void Pager<B>::install_mapped(uint32_t b, const void* src, bool write, uint32_t flags_keep,
                              uint32_t n, bool ahead, uint32_t laps) {
  int err = 0;
  Errc e = uffd_.copy(block_addr(b), src, uint64_t{n} * block_, /*write_protect=*/!write, &err);
  if (e != Errc::kOk) {
    fatal(
        "pager: UFFDIO_COPY of %u block(s) at %p (block %u) failed: %s (state %s); the page "
        "table and the mapping disagree",
        n, static_cast<void*>(block_addr(b)), b, strerror(err),
        page_state_name(PageTable::state_of(pt_.load(b))));
  }
  // Set while the block is owned, before the evictor can see it Present.
  for (uint32_t i = 0; i < n; ++i) set_laps(b + i, laps);
  {
    std::lock_guard<std::mutex> lk(list_mu_);
    for (uint32_t i = 0; i < n; ++i) active_.push_front(b + i);
  }
  const uint32_t flags = (write ? PageTable::kDirty : 0) | (flags_keep & PageTable::kKeep) |
                         (ahead ? PageTable::kPrefetched : 0);
  for (uint32_t i = 0; i < n; ++i) {
    pt_.finish(b + i, PageTable::make(PageState::kPresent, flags, 0));
  }
}

template <TransportBackend B>
typename Pager<B>::Outcome Pager<B>::handle_fault(Handler& h, uint64_t addr, uint64_t flags) {
  uintptr_t base = reinterpret_cast<uintptr_t>(region_.ptr);
  if (addr < base || addr >= base + cfg_.region_size) {
    // The slots are registered in WP mode for UFFDIO_MOVE. Should a moved
    // page ever arrive there write-protected, the pager's own write to it
    // (a READ landing in a slot) must not stay blocked: unprotect.
    uintptr_t sb = reinterpret_cast<uintptr_t>(slots_.ptr);
    if (use_move_ && addr >= sb && addr < sb + uint64_t{n_slots_} * block_) {
      (void)uffd_.write_protect(reinterpret_cast<void*>(addr & ~uint64_t{4095}), 4096, false);
    }
    return Outcome::kDone;
  }
  const uint32_t b = static_cast<uint32_t>((addr - base) / block_);
  const bool wp = (flags & UFFD_PAGEFAULT_FLAG_WP) != 0;
  const bool write = wp || (flags & UFFD_PAGEFAULT_FLAG_WRITE) != 0;
  uint32_t w = pt_.load(b);
  for (;;) {
    switch (PageTable::state_of(w)) {
      case PageState::kPresent: {
        if (!wp) {
          // A missing-page event that lost the race with the install: the
          // copy already woke the thread; waking again is harmless.
          (void)uffd_.wake(block_addr(b), block_);
          return Outcome::kDone;
        }
        if (w & PageTable::kZeroMapped) {
          // The first write to a zero-page-mapped block: it needs a page
          // now, so it takes room in the budget and joins the active list;
          // the un-protect wakes the thread, whose write then gets its page
          // by the kernel's copy-on-write.
          if (!reserve()) return Outcome::kDefer;
          if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kProtecting))) {
            unreserve();
            continue;
          }
          counters_.bump(counters_.faults_wp);
          counters_.bump(counters_.zero_mapped_written);
          {
            std::lock_guard<std::mutex> lk(list_mu_);
            active_.push_front(b);
          }
          int err = 0;
          if (uffd_.write_protect(block_addr(b), block_, false, &err) != Errc::kOk) {
            fatal("pager: un-write-protecting zero-mapped block %u at %p failed: %s", b,
                  static_cast<void*>(block_addr(b)), strerror(err));
          }
          pt_.finish(b, PageTable::make(PageState::kPresent, PageTable::kDirty, 0));
          return Outcome::kDone;
        }
        if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kProtecting))) continue;
        if ((w & PageTable::kPrefetched) == 0) ro_written_.fetch_add(1, std::memory_order_relaxed);
        // Counted before the ioctl that wakes the thread: a thread that
        // faulted finds its fault in the statistics.
        counters_.bump(counters_.faults_wp);
        // Mapped ahead write-protected by a read stream, and written: the
        // stream writes what it walks (prefetch.h on_written_ahead()).
        if ((w & PageTable::kPrefetched) && cfg_.written_writable && prefetcher_ &&
            prefetcher_->on_written_ahead(b)) {
          counters_.bump(counters_.prefetch_written_ahead);
        }
        int err = 0;
        if (uffd_.write_protect(block_addr(b), block_, false, &err) != Errc::kOk) {
          fatal("pager: un-write-protecting block %u at %p failed: %s", b,
                static_cast<void*>(block_addr(b)), strerror(err));
        }
        pt_.finish(b, PageTable::with_state(w | PageTable::kDirty, PageState::kPresent));
        return Outcome::kDone;
      }
      case PageState::kEmpty: {
        if (!write && zero_page_) {
          // A read of never-written memory: the shared zero page, no
          // memory and no budget (zero_fill.h "Reads of never-written
          // memory").
          if (!pt_.try_transition(b, w, PageTable::make(PageState::kFetching, 0, 0))) continue;
          uint32_t first = b;
          bool continued = false;
          const uint32_t extra =
              zero_around_max_ > 0 ? zero_around_claim(b, &first, &continued, false) : 0;
          counters_.bump(counters_.faults_zero);  // before the wake, as below
          counters_.bump(counters_.zero_mapped, extra + 1);
          if (extra > 0) counters_.bump(counters_.zero_around, extra);
          if (zero_chunk_ > 0) mark_filled(first, extra + 1);
          install_zero_page(first, extra + 1);
          return Outcome::kDone;
        }
        if (!reserve()) return Outcome::kDefer;
        if (!pt_.try_transition(b, w, PageTable::make(PageState::kFetching, 0, 0))) {
          unreserve();
          continue;
        }
        uint32_t first = b;
        bool continued = false;
        const uint32_t extra =
            zero_around_max_ > 0 ? zero_around_claim(b, &first, &continued, true, write) : 0;
        counters_.bump(counters_.faults_zero);  // before the wake, as above
        if (extra > 0) {
          counters_.bump(counters_.zero_around, extra);
          if (zero_chunk_ > 0) mark_filled(first, extra + 1);
          install_zero_run(first, extra + 1, b, write);
        } else if (continued || zero_chunk_ == 0 || zero_chunk_fill(b, write) == 0) {
          if (zero_chunk_ > 0) mark_filled(b, 1);
          install_mapped(b, zero_.ptr, write, 0);
        }
        return Outcome::kDone;
      }
      case PageState::kRemote: {
        if (h.free_staging.empty() || h.free_inflight.empty() ||
            h.q->outstanding() + 1 > h.q->depth()) {
          return Outcome::kDefer;
        }
        if (!reserve()) return Outcome::kDefer;
        if (!pt_.try_transition(b, w, PageTable::make(PageState::kFetching, 0, 0))) {
          unreserve();
          continue;
        }
        uint32_t st = h.free_staging.back();
        h.free_staging.pop_back();
        uint32_t k = h.free_inflight.back();
        h.free_inflight.pop_back();
        // A block written in its last stay (kWritten) comes back writable
        // and dirty even for a read fault ("Written blocks come back
        // writable" above); so does one that was not, while most such
        // blocks are written anyway (guess_unwritten()).
        const bool guess = !write && cfg_.written_writable &&
                           ((w & PageTable::kWritten) != 0 || guess_unwritten());
        h.inflight[k] = Inflight{b, st, false, write || guess, false, pager_detail::now_ns()};
        h.inflight[k].guessed = guess;
        const uint32_t unit = pt_.remote(b) - 1;
        IoOp op{IoKind::kRead, block_, {}, h.staging.ptr + uint64_t{st} * block_, k};
        // One live replica; a donor whose connection is gone is marked
        // failed and the next replica tried (invariant 6 when none is left).
        Errc pe = Errc::kUnavailable;
        while (remote_->resolve_read(unit, &op.remote)) {
          pe = h.q->post({&op, 1});
          if (pe != Errc::kUnavailable) break;
          remote_->read_done(op.remote.server);  // not posted
          remote_->mark_failed(op.remote.server);
          remote_->count_failover();
        }
        if (pe != Errc::kOk) lost_page(b, pe);
        h.inflight[k].server = op.remote.server;
        ++h.demand_outstanding;
        h.ctr.bump(h.ctr.reads);
        if (cfg_.prefetch) prefetch_after(h, b, false, write);
        return Outcome::kDone;
      }
      case PageState::kVictim: {
        // Hit in the victim cache: the slot's block goes back to the region;
        // the budget is unchanged (one slot freed, one block mapped).
        if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kPromoting))) continue;
        {
          std::lock_guard<std::mutex> lk(list_mu_);
          victim_.remove(b);
        }
        const uint32_t slot = PageTable::slot_of(w);
        const bool was_prefetched = (w & PageTable::kPrefetched) != 0;
        counters_.bump(counters_.faults_victim);  // before the wake, as above
        if (was_prefetched) counters_.bump(counters_.prefetch_used);
        // Seen in use (evictor.h "Access tracking"): a demoted block
        // touched again; read-ahead that is only now reached is not.
        const uint32_t laps = was_prefetched ? 0 : cfg_.hot_laps;
        if (laps > 0) counters_.bump(counters_.hot_marked);
        set_laps(b, laps);  // before a move makes it Present
        bool moved = use_move_ && promote_by_move(b, slot, write, w);
        // A dirty block comes back writable even for a read fault: it is
        // written back when it leaves whatever happens, so write protection
        // would only cost a WP fault at its next write (eval kv, whose
        // inserts read a slot before writing it: WP faults 139k -> 114k at
        // 75%, 255k -> 213k at 50%).
        // A write seen now ends a guess (kGuessed): the block was written.
        if (!moved) {
          if (!write && (w & PageTable::kDirty) == 0) note_write_protected();
          install_mapped(b, slot_addr(slot), write || (w & PageTable::kDirty) != 0,
                         write ? w & ~PageTable::kGuessed : w, 1, false, laps);
        }
        free_slot(slot, moved);
        if (cfg_.prefetch) prefetch_after(h, b, was_prefetched, write);
        return Outcome::kDone;
      }
      default:
        // Fetching, Protecting, Demoting, Promoting, Writing, Discarding:
        // another thread owns the block; this fault waits for it
        // (invariant 4) and is retried (run_deferred(): "Stale entries").
        return Outcome::kWait;
    }
  }
}

template <TransportBackend B>
void Pager<B>::complete(Handler& h, const IoCompletion& c) {
  const uint32_t k = static_cast<uint32_t>(c.cookie);
  Inflight f = h.inflight[k];
  h.free_inflight.push_back(k);
  remote_->read_done(f.server);  // every inflight entry is a READ
  if (!f.prefetch) {
    // Failover: another replica serves the fault; the thread waits longer.
    if (c.status != Errc::kOk && retry_read(h, f, c.status)) return;
    --h.demand_outstanding;
    if (c.status != Errc::kOk) lost_page(f.block, c.status);  // invariant 6
    h.ctr.bump(h.ctr.faults_remote);                          // before the wake, as above
    h.ctr.bump(h.ctr.bytes_read, block_);
    const char* data = h.staging.ptr + uint64_t{f.buf} * block_;
    if (f.guessed) pt_.fetched_hash(f.block) = block_hash(data, block_);
    install_mapped(f.block, data, f.write, f.guessed ? PageTable::kGuessed : 0, 1, false,
                   refault_laps(f.block));
    h.free_staging.push_back(f.buf);
    h.ctr.record_latency_ns(pager_detail::now_ns() - f.t0);
    return;
  }
  if (c.status != Errc::kOk) {
    // A failed prefetch is forgotten (its donor marked failed when it is
    // gone); a demand fault on the block reads another replica, or reports
    // the loss if none is left.
    if (c.status == Errc::kUnavailable || c.status == Errc::kNotFound)
      remote_->mark_failed(f.server);
    free_slot(f.buf);
    unreserve();
    pt_.finish(f.block, PageTable::make(PageState::kRemote, 0, 0));
    return;
  }
  counters_.bump(counters_.bytes_read, block_);
  if (f.map) {
    // The stream was confirmed (a hit on an earlier prefetch, or a fault
    // just past blocks mapped ahead on the same trend): map the
    // block now so that the scan does not fault on it at all: write-protected
    // and clean, or writable and dirty when the stream writes (f.write; a
    // written stream would take a WP fault on every block otherwise).
    // Whether it is then used cannot be observed. Adjacent blocks that
    // land together are mapped by one copy (flush_run()).
    counters_.bump(counters_.prefetch_mapped);
    if (f.guessed) pt_.fetched_hash(f.block) = block_hash(slot_addr(f.buf), block_);
    const uint32_t laps = refault_laps(f.block);  // a looping stream refaults too
    if (h.run_buf.ptr != nullptr) {
      add_to_run(h, f.block, f.buf, f.write, f.guessed, laps);
      return;
    }
    install_mapped(f.block, slot_addr(f.buf), f.write, f.guessed ? PageTable::kGuessed : 0, 1,
                   /*ahead=*/true, laps);
    free_slot(f.buf);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(list_mu_);
    victim_.push_front(f.block);
  }
  pt_.finish(f.block, PageTable::make(PageState::kVictim, PageTable::kPrefetched, f.buf));
}

// Blocks not written in their last stay come back write-protected, so
// that a stay without a write costs no write-back; one with a write costs
// a WP fault (a handler round trip) instead. Which is cheaper depends on
// how many are written: a WP fault costs several times a needless
// write-back of a block that leaves anyway. So the share is sampled: over
// kGuessEpoch write-protected mappings (demand fetches and victim hits),
// the WP faults that followed (ro_written_, counted in the WP path;
// blocks mapped ahead by a stream have their own rule). Above a quarter,
// such blocks come back writable on a guess too (kGuessed: a hash of what
// the fetch brought decides kWritten when it leaves), all but one in
// kGuessSample, which come back write-protected to keep the sample going;
// below it, all come back write-protected again. xz -7 -T1 at a 75M
// budget: 289k of 1.43M fetches came back write-protected, and 219k WP
// faults followed (76%).
template <TransportBackend B>
bool Pager<B>::guess_unwritten() {
  if (guess_unwritten_.load(std::memory_order_relaxed) &&
      guess_tick_.fetch_add(1, std::memory_order_relaxed) % kGuessSample != 0)
    return true;
  note_write_protected();
  return false;
}

template <TransportBackend B>
void Pager<B>::note_write_protected() {
  if (ro_mapped_.fetch_add(1, std::memory_order_relaxed) + 1 != kGuessEpoch) return;
  const uint32_t written = ro_written_.exchange(0, std::memory_order_relaxed);
  ro_mapped_.store(0, std::memory_order_relaxed);
  guess_unwritten_.store(4 * written > kGuessEpoch, std::memory_order_relaxed);
}

template <TransportBackend B>
uint32_t Pager<B>::refault_laps(uint32_t b) {
  if (cfg_.hot_laps == 0 || !cfg_.refault_hot) return 0;
  const uint32_t at = pt_.left_at(b);
  if (at == 0) return 0;
  const uint32_t dist = (leave_clock_.load(std::memory_order_relaxed) - at) & PageTable::kLeaveMask;
  if (dist > refault_reach_) return 0;
  if (hot_blocks_.load(std::memory_order_relaxed) >= hot_cap_) return 0;
  counters_.bump(counters_.refaults_hot);
  return 1;
}

template <TransportBackend B>
bool Pager<B>::note_faulter(const Handler& h, const uffd_msg& m) {
  if (main_cpu_ == nullptr) return false;
  const int tid = static_cast<int>(m.arg.pagefault.feat.ptid);
  // The CPU of the thread that faulted, when that thread also made the
  // last fault, or this is the first (-1: another thread made it, or this
  // one is not registered).
  int c = -1;
  const int last = faulter_tid_.exchange(tid, std::memory_order_relaxed);
  if (last == tid || last == 0)
    c = tid == main_tid_ ? read_cpu(main_cpu_) : registered_thread_cpu(tid);
  if (c == kRegistryBusy) return false;  // no news: the same thread, CPU unread
  if (c < 0) {
    // Faults from more than one thread, or from one whose CPU is unknown:
    // every handler stays up (a parked one comes back within kParkNs)
    // until kParkAfterOtherNs have passed without.
    const uint64_t now = pager_detail::now_ns();
    const uint64_t was = other_fault_ns_.load(std::memory_order_relaxed);
    if (now - was > kParkAfterOtherNs / 8) {
      other_fault_ns_.store(now, std::memory_order_relaxed);
      return now - was > kParkAfterOtherNs;
    }
    return false;
  }
  if (c != (h.cpu >= 0 ? h.cpu : sched_getcpu())) counters_.bump(counters_.faults_cross_cpu);
  if (c == fault_cpu_.load(std::memory_order_relaxed)) return false;
  fault_cpu_.store(c, std::memory_order_seq_cst);
  return true;  // the parked handlers come back
}

template <TransportBackend B>
bool Pager<B>::should_park(const Handler& h) const {
  if (main_cpu_ == nullptr || h.cpu < 0 || h.cpu >= 64) return false;
  const int c = fault_cpu_.load(std::memory_order_seq_cst);
  if (c < 0 || c == h.cpu || c >= 64 || ((handler_cpus_ >> c) & 1) == 0) return false;
  if (!h.pending.empty() || !h.deferred.empty() || h.q->outstanding() > 0) return false;
  return pager_detail::now_ns() - other_fault_ns_.load(std::memory_order_relaxed) >
         kParkAfterOtherNs;
}

template <TransportBackend B>
bool Pager<B>::park(const Handler& h) {
  const uint32_t seen = park_.load();
  // Checked after the load: a bump() in between changes the word, and the
  // wait returns at once.
  if (stop_.load(std::memory_order_acquire) || fork_frozen_.load(std::memory_order_seq_cst) ||
      !should_park(h))
    return false;
  park_.wait(seen, kParkNs);
  return true;
}

template <TransportBackend B>
void Pager<B>::set_poller(Handler& h, bool on) {
  if (h.poller == on) return;
  h.poller = on;
  std::lock_guard<std::mutex> lk(mode_mu_);
  if (on ? pollers_++ == 0 : --pollers_ == 0) uffd_.set_nonblocking(on);
  pollers_hint_.store(pollers_, std::memory_order_release);
}

template <TransportBackend B>
void Pager<B>::doorbell_main() {
  pthread_setname_np(pthread_self(), "fm-doorbell");
  std::unique_lock<std::mutex> lk(bell_mu_);
  for (;;) {
    bell_cv_.wait(lk, [this] { return bell_exit_ || bell_req_ != bell_done_; });
    if (bell_req_ == bell_done_) return;  // bell_exit_
    const uint64_t req = bell_req_;
    lk.unlock();
    // Faults until ring_doorbell() maps the page (handlers wake it unresolved).
    (void)*reinterpret_cast<volatile char*>(doorbell_.ptr);
    lk.lock();
    bell_done_ = req;
    bell_cv_.notify_all();
  }
}

template <TransportBackend B>
template <class Done>
void Pager<B>::ring_doorbell(Done done) {
  // Why it makes progress: while the ring is on, the only readers of the
  // uffd are handlers blocked in read() (a handler in ppoll() leaves the
  // uffd out once it saw ring_active_; one already polling it reads at most
  // one more batch) and every handler that reads the doorbell fault wakes
  // it unresolved, so the toucher faults again at once: a doorbell fault is
  // pending or being handled until the page is mapped, and each one read
  // ends a blocked read. done() is polled as prepare_fork() always did.
  std::lock_guard<std::mutex> serial(ring_mu_);
  ring_active_.store(true, std::memory_order_seq_cst);
  uint64_t req;
  {
    std::lock_guard<std::mutex> lk(bell_mu_);
    req = ++bell_req_;
  }
  bell_cv_.notify_all();
  while (!done()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  // Only this maps the page, and it drops it below: never EEXIST. A toucher
  // not there yet finds it mapped; one waiting in the kernel is woken.
  int err = 0;
  if (uffd_.copy(doorbell_.ptr, zero_.ptr, kDoorbellBytes, /*write_protect=*/false, &err) !=
      Errc::kOk) {
    fatal("pager: UFFDIO_COPY of the uffd doorbell page at %p failed: %s",
          static_cast<void*>(doorbell_.ptr), strerror(err));
  }
  {
    std::unique_lock<std::mutex> lk(bell_mu_);
    bell_cv_.wait(lk, [&] { return bell_done_ == req; });
  }
  (void)madvise(doorbell_.ptr, kDoorbellBytes, MADV_DONTNEED);  // missing again: the next ring
  ring_active_.store(false, std::memory_order_seq_cst);
}

}  // namespace farmem
