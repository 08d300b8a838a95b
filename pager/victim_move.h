// Pager<B>'s victim-cache traffic by UFFDIO_MOVE (config.uffd_move) and
// dirty tracking by WP_ASYNC (config.wp_async): their set-up (setup_move(),
// setup_wp_async(), called by init()), the asynchronous demotion
// (demote_async(), called by demote_batch() in evictor.h), and the moves of
// a block out of and back into the region (move_out(), promote_by_move(),
// the latter from handle_fault() in fault_path.h). UFFDIO_MOVE is on where
// the kernel has it, WP_ASYNC off (measured slower, below). Part of
// Pager<B> (pager/pager_core.h); include pager/pager.h.
//
// UFFDIO_MOVE (config.uffd_move, FARMEM_UFFD_MOVE): when on and the kernel
// has it, the victim slots are registered (WP mode only) with the pager's
// uffd and pages move instead of being copied:
//   demote of a dirty block with no dirty neighbour in its batch:
//           UFFDIO_MOVE region -> empty slot; atomic, so no write-protect
//           and no MADV_DONTNEED (one ioctl, one TLB flush, instead of up
//           to three calls); a run of adjacent dirty blocks is copied (one
//           write-protect and one drop for the whole run cost less than a
//           flush per block), and so is a clean block (write-protected
//           already, its copy needs no flush of its own); a moved block
//           holding only zeros with no remote copy leaves with no WRITE, as
//           a copied one does;
//   victim hit, write fault or dirty block: UFFDIO_MOVE slot -> region,
//           which wakes the faulting thread. A clean block hit by a read
//           keeps UFFDIO_COPY: a moved page is mapped writable, and making
//           it write-protected before any thread can write it takes the
//           copy's one ioctl anyway.
// Any move the kernel refuses (EEXIST: the slot still holds a page; EBUSY:
// the page is pinned, e.g. by an RDMA registration, or shared) takes the
// copy path for that block; slot pages are never dropped with
// MADV_DONTNEED, as a transport may have them registered.
// First measured slower and off by default (bench/pager_bench.cc, 2 cores at
// load average ~7, Linux 6.18, loopback, 4 KiB blocks, interleaved rounds;
// two runs, run 1 / run 2):
//                   victim-hit fault p50            demotions/s (median pass)
//                   move          copy              move         copy
//   read accesses   59.5 / 62.1   20.3 / 25.4 us    4.6k / 7.0k  7.6k / 10.9k
//   write accesses  75.9 / 75.0   29.0 / 25.8 us    4.4k / 4.3k  5.0k / 4.2k
// Those figures had the handler and the faulting thread on different CPUs
// half the time (docs/eval/l-s27); with the handlers placed beside the
// faulting thread the two paths measure alike here (idle, two runs):
// victim-hit p50 8.0-8.4 / 9.1-9.2 us (move, read / write) against
// 7.9-8.4 / 9.3-9.3 us (copy); demotions/s 75-77k / 54-60k against
// 75-76k / 47-67k. On real programs the move is ahead, so it is the
// default where the kernel has it: xz -7 -T1 of 10 MiB of text at
// FARMEM_LOCAL_MEM=75M against farmemd on 127.0.0.1 (one-sided), four
// pairs alternated off / on: 45.2 / 42.1, 49.6 / 45.7, 52.3 / 41.8,
// 43.8 / 40.7 s (-11%; system time 22-27 -> 21-23 s); zstd -19
// --long=27 -T1 at 72M, two pairs: 57.3 / 54.0, 59.1 / 52.0 s (-9%);
// GNU sort -S 1G of 3M lines at 120M, three pairs: 4.73 / 4.41, 4.21 /
// 4.72, 4.85 / 5.49 s (noise). In xz about half the demotions move (787k
// of 1.59M; the rest find their slot holding a page, see alloc_slot())
// and every dirty victim hit (342k) moves back: a dirty demotion that
// moves costs one ioctl and one flush where the copy path pays the
// write-protect's flush, the copy and a share of the batched drop.
// Moving every dirty block took GNU sort (runs of adjacent dirty blocks)
// to 2.29-3.03 s against 2.00-2.86 on the copy path (five pairs; the same
// code with no move at all varies +-10% a pair here), so runs stay on the
// copy path: sort then moves ~100 blocks out of ~60k, and xz (scattered)
// still 726k of 1.59M: 45.7 / 50.5, 47.6 / 48.5, 41.7 / 44.9 s against
// FARMEM_UFFD_MOVE=off, system time 22-25 s against 25-28.
// fork() (invariant 8): prepare_fork() / fork_parent() / fork_child()
//
// WP_ASYNC (config.wp_async, FARMEM_WP_ASYNC; Linux >= 6.8: it needs
// UFFD_FEATURE_WP_ASYNC, PAGEMAP_SCAN and UFFDIO_MOVE): the uffd is opened
// with UFFD_FEATURE_WP_ASYNC, so the first write to a clean block costs no
// WP fault (the kernel clears the block's uffd-wp bit and goes on); random
// read-modify-write pays one fault instead of two. Dirty = kDirty in the
// page table OR written per PAGEMAP_SCAN (PAGE_IS_WRITTEN), asked by the
// evictor before demoting, one ioctl per run of adjacent blocks. Async WP
// makes EVERY WP fault on the descriptor async, so the demotion cannot rely
// on write protection to stop a racing write: it takes the page out of the
// region with UFFDIO_MOVE (atomic) and settles "written?" with a snapshot
// and a compare; why that loses nothing, and why copy + MADV_DONTNEED
// cannot be made safe, is in demote_async(). Pages shared with a fork child
// (the move refuses them, EBUSY) are un-shared first by an atomic add of 0;
// pinned ones stay mapped. Promotions follow config.uffd_move as before.
// Limit: a free slot still holding a page is dropped with MADV_DONTNEED
// before a block moves into it, which a transport that pins its registered
// buffers (verbs) would not see: use WP_ASYNC with loopback or tcp only.
// Measured slower, so off by default (bench/pager_bench.cc, loopback,
// 4 KiB blocks, mode forced with FARMEM_TEST_WP_ASYNC, three runs each,
// interleaved on/off, 2 cores at load average 7-9, Linux 6.18):
//                          WP_ASYNC on             off
//   BM_RandomRMW 25%       3.96k 3.90k 1.74k       3.76k 3.34k 4.04k ops/s
//   BM_RandomRMW 50%       3.20k 3.26k 2.95k       4.81k 4.88k 4.99k ops/s
//   BM_RandomRMW 75%       4.88k 5.19k 5.23k       8.58k 7.16k 7.96k ops/s
//   BM_ColdFault p50       25.6  23.8  32.4        22.6  24.9  25.7 us
//   BM_SeqScan prefetch 0  0.020 0.021 0.010       0.060 0.063 0.050 GB/s
//   BM_SeqScan prefetch 1  0.025 0.022 0.015       0.087 0.054 0.073 GB/s
// The saved WP fault is real (faults_wp then counts the blocks found
// written, no handler round trip) but the evictor pays more than it saves:
// one UFFDIO_MOVE per block (own TLB shoot-down, as in the UFFDIO_MOVE
// figures above) plus, for slots a copy-promotion or prefetch left mapped,
// one MADV_DONTNEED per slot, where the copy path drops whole runs with one
// MADV_DONTNEED. Batching moves of adjacent blocks into adjacent slots and
// the slot drops per run are the next things to try.
//
// Not yet: UFFDIO_CONTINUE is detected (features()) but unused.
#pragma once

#include "pager/pager_core.h"

namespace farmem {

template <TransportBackend B>
Status Pager<B>::setup_move() {
  if (cfg_.uffd_move == UffdMoveMode::kOff) return ok_status();
  if (!uffd_.features().move) {
    if (cfg_.uffd_move == UffdMoveMode::kAuto) return ok_status();
    return make_error(Errc::kUnavailable,
                      "FARMEM_UFFD_MOVE=on but this kernel has no UFFDIO_MOVE (Linux >= 6.8 "
                      "with UFFD_FEATURE_MOVE; detected: %s); set FARMEM_UFFD_MOVE=auto or off",
                      uffd_.features().to_string().c_str());
  }
  const size_t len = uint64_t{n_slots_} * block_;
  // A huge page in the slot area would make every 4 KiB move into it fail.
  (void)madvise(slots_.ptr, len, MADV_NOHUGEPAGE);
  Status st = uffd_.register_wp_only(slots_.ptr, len);
  if (!st.ok()) {
    if (cfg_.uffd_move == UffdMoveMode::kOn) return st.with_context("FARMEM_UFFD_MOVE=on");
    FARMEM_LOG(kInfo, "pager: UFFDIO_MOVE unused (%s); the copy path serves the victim cache",
               st.to_string().c_str());
    return ok_status();
  }
  use_move_ = true;
  return ok_status();
}

template <TransportBackend B>
Status Pager<B>::setup_wp_async() {
  if (!uffd_.wp_async()) {
    if (cfg_.wp_async == WpAsyncMode::kOn) {
      return make_error(Errc::kUnavailable,
                        "FARMEM_WP_ASYNC=on but this kernel lacks UFFD_FEATURE_WP_ASYNC or "
                        "UFFDIO_MOVE (Linux >= 6.8 has both; detected: %s); set "
                        "FARMEM_WP_ASYNC=auto or off",
                        uffd_.features().to_string().c_str());
    }
    return ok_status();
  }
  // From here on the descriptor resolves WP faults itself: the pager must
  // track writes with PAGEMAP_SCAN and demote by UFFDIO_MOVE, whatever
  // config.wp_async says, or fail. Promotions keep following
  // config.uffd_move (uses_move()).
  if (!use_move_) {
    const size_t len = uint64_t{n_slots_} * block_;
    (void)madvise(slots_.ptr, len, MADV_NOHUGEPAGE);
    Status st = uffd_.register_wp_only(slots_.ptr, len);
    if (!st.ok()) return st.with_context("WP_ASYNC needs UFFDIO_MOVE; set FARMEM_WP_ASYNC=off");
  }
  FARMEM_RETURN_IF_ERROR(snap_.map(64ull * block_, 4096, true, "WP_ASYNC snapshot buffer"));
  use_wp_async_ = true;
  return ok_status();
}

template <TransportBackend B>
void Pager<B>::demote_async(const uint32_t* blocks, const uint32_t* slots, uint32_t* words,
                            const bool* empty, size_t n, bool* kept) {
  // Why not the copy path: async WP never stops a write, so "write-protect,
  // copy, MADV_DONTNEED" would lose a write landing between the copy and
  // the DONTNEED, and no check can close that window (a check before the
  // DONTNEED leaves a smaller window; after it the page is gone). So the
  // page leaves the region with UFFDIO_MOVE, atomically under the page-table
  // lock: a write before the move is in the moved page, a write after it is
  // a missing fault that waits for Demoting to end (invariant 4).
  // What the move loses is the uffd-wp bit ("written?"): the slot's page is
  // writable (checked on Linux 6.18: PAGEMAP_SCAN reports every moved page
  // written). So a block clean in the page table is
  //   1. snapshotted (copied to snap_; mapped and owned: no fault),
  //   2. asked PAGEMAP_SCAN, without re-protecting: written since it was
  //      installed write-protected? then dirty;
  //   3. moved to its slot;
  //   4. if not written at 2, compared with the snapshot: any difference
  //      means dirty.
  // Exact, not probabilistic: "not written at 2" means the bytes at 2 are
  // still the installed (= remote, or zero) bytes, and the snapshot taken
  // before 2 equals them (a write before 2 shows at 2). A write between 2
  // and 3 is in the moved page, so it differs from the snapshot unless it
  // stored the bytes already there, and then dropping the block loses
  // nothing. Dirty blocks only move. One PAGEMAP_SCAN per run of adjacent
  // blocks.
  bool clean[64] = {}, written[64] = {};
  FARMEM_BUG_ON(n > 64);
  std::lock_guard<std::mutex> lk(snap_mu_);
  for (size_t i = 0; i < n; ++i) {
    kept[i] = false;
    clean[i] = !(words[i] & PageTable::kDirty);
    if (clean[i]) {
      pager_detail::copy_from_region(snap_.ptr + i * uint64_t{block_}, block_addr(blocks[i]),
                                     block_);
    }
  }
  uint32_t order[64];
  size_t nc = 0;
  for (size_t i = 0; i < n; ++i)
    if (clean[i]) order[nc++] = static_cast<uint32_t>(i);
  std::sort(order, order + nc, [&](uint32_t a, uint32_t b) { return blocks[a] < blocks[b]; });
  for (size_t i = 0; i < nc;) {
    size_t j = i + 1;
    while (j < nc && blocks[order[j]] == blocks[order[j - 1]] + 1) ++j;
    PagemapScan::Range r[64];
    const uint64_t lo = reinterpret_cast<uintptr_t>(block_addr(blocks[order[i]]));
    long got = pagemap_.written(block_addr(blocks[order[i]]), (j - i) * uint64_t{block_}, r, 64,
                                /*reprotect=*/false);
    if (got < 0) {
      fatal("pager: PAGEMAP_SCAN of %zu blocks at %p failed: %s", j - i,
            static_cast<void*>(block_addr(blocks[order[i]])), strerror(static_cast<int>(-got)));
    }
    for (long k = 0; k < got; ++k) {
      for (uint64_t a = r[k].start; a < r[k].end;) {
        const size_t idx = i + (a - lo) / block_;
        if (idx < j) written[order[idx]] = true;
        a = lo + (a - lo) / block_ * block_ + block_;  // next block
      }
    }
    i = j;
  }
  for (size_t i = 0; i < n; ++i) {
    if (written[i]) {
      words[i] |= PageTable::kDirty;
      counters_.bump(counters_.faults_wp);  // a write the kernel resolved
    }
    // A free slot may still hold a page (a copy-promotion left it there):
    // nobody uses it, so it can go.
    if (!empty[i] && madvise(slot_addr(slots[i]), block_, MADV_DONTNEED) != 0) {
      fatal("pager: MADV_DONTNEED of free slot %u failed: %s", slots[i], strerror(errno));
    }
    // Not move_out(): its counters describe config.uffd_move's traffic.
    auto move = [&] {
      int err = 0;
      Errc e = uffd_.move(slot_addr(slots[i]), block_addr(blocks[i]), block_, false, &err);
      if (e == Errc::kInternal) {
        fatal(
            "pager: UFFDIO_MOVE of block %u to slot %u moved part of it and could not undo "
            "that (%s)",
            blocks[i], slots[i], strerror(err));
      }
      return e == Errc::kOk;
    };
    // A refused move (EBUSY: a page shared with a fork child or pinned;
    // anything else) keeps the block mapped: the caller puts it back. The
    // pager never touches the region here to un-share a page: if the page
    // is not there, that touch would fault on a block this thread owns and
    // wait for itself (seen as a hang under load).
    const bool ok = move();
    if (!ok) {
      kept[i] = true;  // pinned: it stays mapped; the caller puts it back
      counters_.bump(counters_.move_fallbacks);
      continue;
    }
    // With config.uffd_move on these are its moves too; off, they stay out
    // of its counters (the demotion counter has them).
    if (use_move_) counters_.bump(counters_.moves_out);
    if (clean[i] && !written[i] &&
        memcmp(slot_addr(slots[i]), snap_.ptr + i * uint64_t{block_}, block_) != 0) {
      words[i] |= PageTable::kDirty;
      counters_.bump(counters_.faults_wp);
    }
  }
}

template <TransportBackend B>
bool Pager<B>::promote_by_move(uint32_t b, uint32_t slot, bool write, uint32_t w) {
  // A clean block faulted by a read must come back write-protected (its
  // first write is how it becomes dirty); a moved page is writable, so
  // that case keeps the copy.
  if (!write && !(w & PageTable::kDirty)) return false;
  int err = 0;
  Errc e = uffd_.move(block_addr(b), slot_addr(slot), block_, /*wake=*/true, &err);
  if (e == Errc::kInternal) {
    fatal(
        "pager: UFFDIO_MOVE of block %u from slot %u moved part of it and could not undo "
        "that (%s); the block is split between the region and the victim cache",
        b, slot, strerror(err));
  }
  if (e != Errc::kOk) {
    counters_.bump(counters_.move_fallbacks);
    return false;
  }
  {
    std::lock_guard<std::mutex> lk(list_mu_);
    active_.push_front(b);
  }
  // Mapped writable: a dirty block (its flag kept) or a write fault.
  pt_.finish(b, PageTable::make(PageState::kPresent, PageTable::kDirty, 0));
  counters_.bump(counters_.moves_in);
  return true;
}

template <TransportBackend B>
bool Pager<B>::move_out(uint32_t b, uint32_t slot) {
  int err = 0;
  Errc e = uffd_.move(slot_addr(slot), block_addr(b), block_, /*wake=*/false, &err);
  if (e == Errc::kInternal) {
    fatal(
        "pager: UFFDIO_MOVE of block %u to slot %u moved part of it and could not undo "
        "that (%s); the block is split between the region and the victim cache",
        b, slot, strerror(err));
  }
  if (e != Errc::kOk) {
    counters_.bump(counters_.move_fallbacks);
    return false;
  }
  counters_.bump(counters_.moves_out);
  return true;
}

}  // namespace farmem
