// The userfaultfd pager: a virtual region backed by far memory.
//
//   farmem::LoopbackDonor donor(1ull << 30, 16 << 20);
//   farmem::LoopbackTransport t;
//   (void)t.add_server(0, &donor);
//   farmem::LoopbackSlabSource src(0, &donor);
//   farmem::PagerConfig c;
//   c.region_size = 1ull << 30;  c.local_budget = 64 << 20;
//   auto p = farmem::Pager<farmem::LoopbackTransport>::create(c, &t, &src);
//   char* mem = static_cast<char*>((*p)->base());
//   mem[12345] = 7;                       // faults, served by a handler thread
//
// UFFDIO_MOVE (config.uffd_move, FARMEM_UFFD_MOVE): when on and the kernel
// has it, the victim slots are registered (WP mode only) with the pager's
// uffd and pages move instead of being copied:
//   demote: UFFDIO_MOVE region -> empty slot; atomic, so no write-protect
//           and no MADV_DONTNEED (one ioctl instead of up to three);
//   victim hit, write fault or dirty block: UFFDIO_MOVE slot -> region,
//           which wakes the faulting thread. A clean block hit by a read
//           keeps UFFDIO_COPY: a moved page is mapped writable, and making
//           it write-protected before any thread can write it takes the
//           copy's one ioctl anyway.
// Any move the kernel refuses (EEXIST: the slot still holds a page; EBUSY:
// the page is pinned, e.g. by an RDMA registration, or shared) takes the
// copy path for that block; slot pages are never dropped with
// MADV_DONTNEED, as a transport may have them registered.
// Measured slower, so off by default (bench/pager_bench.cc, 2 cores at
// load average ~7, Linux 6.18, loopback, 4 KiB blocks, interleaved rounds;
// two runs, run 1 / run 2):
//                   victim-hit fault p50            demotions/s (median pass)
//                   move          copy              move         copy
//   read accesses   59.5 / 62.1   20.3 / 25.4 us    4.6k / 7.0k  7.6k / 10.9k
//   write accesses  75.9 / 75.0   29.0 / 25.8 us    4.4k / 4.3k  5.0k / 4.2k
// Likely why: each move is its own ioctl with its own TLB shoot-down and
// page-table locking, where the copy path write-protects, copies 4 KiB
// (cheap) and drops whole runs with one MADV_DONTNEED.
// fork() (invariant 8): prepare_fork() / fork_parent() / fork_child()
// around fork() give the child a snapshot of the region; how, and what it
// costs, is in pager/fork_snapshot.h. prepare_fork() parks new faults (the
// handlers keep reading the uffd, so that they read the kernel's
// UFFD_EVENT_FORK), stops the evictor after its round and takes the hint
// lock, waits until no block is in flight, writes the dirty victims back
// (on the hint queue, to a new unit where a live snapshot freezes the old
// one), and records the remote unit of every block not mapped; all of that
// holds until fork_parent(). Cost: two passes over the page table plus the
// dirty victims' WRITEs (not yet measured).
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
// Not yet: UFFDIO_CONTINUE is detected (features()) but unused.
#pragma once

#include "pager/evictor.h"
#include "pager/fault_path.h"
#include "pager/pager_core.h"
#include "pager/pager_init.h"
#include "pager/prefetch_path.h"
#include "pager/zero_fill.h"

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

// ---- pinning ----------------------------------------------------------------

template <TransportBackend B>
Status Pager<B>::check_block_range(const char* fn, void* addr, size_t len, uint32_t* first,
                                   uint32_t* last) const {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t base = reinterpret_cast<uintptr_t>(region_.ptr);
  if (a < base || a + len > base + cfg_.region_size || len > cfg_.region_size ||
      (a - base) % block_ != 0 || len % block_ != 0) {
    return make_error(Errc::kInvalidArgument,
                      "%s(%p, %zu): the range must be inside the region [%p, +%llu) and "
                      "aligned to the %u-byte block size",
                      fn, addr, len, static_cast<void*>(region_.ptr),
                      static_cast<unsigned long long>(cfg_.region_size), block_);
  }
  *first = static_cast<uint32_t>((a - base) / block_);
  *last = *first + static_cast<uint32_t>(len / block_);
  return ok_status();
}

template <TransportBackend B>
bool Pager<B>::take_pin() {
  int64_t cur = pinned_.load(std::memory_order_relaxed);
  while (cur < pin_limit_blocks_) {
    if (pinned_.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed)) return true;
  }
  return false;
}

template <TransportBackend B>
void Pager<B>::unpin_block(uint32_t b) {
  for (;;) {
    uint32_t w = pt_.load(b);
    if (!(w & PageTable::kPinned)) return;  // discarded meanwhile: discard unpinned it
    PageState s = PageTable::state_of(w);
    if (s != PageState::kPresent) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // a WP fault or a discard
      continue;
    }
    const uint32_t count = PageTable::slot_of(w);
    if (count > 1) {
      if (pt_.try_transition(b, w, PageTable::with_slot(w, count - 1))) return;
      continue;
    }
    if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kProtecting))) continue;
    {
      // Most recent end: an unpinned block is the last the evictor takes.
      std::lock_guard<std::mutex> lk(list_mu_);
      active_.push_front(b);
    }
    pinned_.fetch_sub(1, std::memory_order_relaxed);
    pt_.finish(b, PageTable::make(PageState::kPresent, w & PageTable::kDirty, 0));
    return;
  }
}

template <TransportBackend B>
Status Pager<B>::pin(void* addr, size_t len) {
  uint32_t first = 0, last = 0;
  FARMEM_RETURN_IF_ERROR(check_block_range("pin", addr, len, &first, &last));
  if (first == last) return ok_status();
  auto refuse = [&](int64_t more) {
    return make_error(Errc::kResourceExhausted,
                      "pin(%p, %zu): %lld more pinned blocks would leave the evictor no room: "
                      "%lld of %lld blocks are pinned and at most %lld (%llu bytes: the low "
                      "watermark of the %llu-byte local budget minus a quarter of it) may be; "
                      "pin less, unpin something, or raise the local budget (FARMEM_LOCAL_MEM)",
                      addr, len, static_cast<long long>(more),
                      static_cast<long long>(pinned_.load(std::memory_order_relaxed)),
                      static_cast<long long>(budget_blocks_),
                      static_cast<long long>(pin_limit_blocks_),
                      static_cast<unsigned long long>(pin_limit_bytes()),
                      static_cast<unsigned long long>(budget_bytes()));
  };
  // Refuse what cannot fit before anything changes.
  int64_t need = 0;
  for (uint32_t b = first; b < last; ++b) need += (pt_.load(b) & PageTable::kPinned) ? 0 : 1;
  if (pinned_.load(std::memory_order_relaxed) + need > pin_limit_blocks_) return refuse(need);
  // Remote blocks come in batches of READs; whatever the hint skipped (the
  // budget was busy) is faulted in one by one below.
  (void)prefetch(addr, len);
  for (uint32_t b = first; b < last; ++b) {
    for (;;) {
      uint32_t w = pt_.load(b);
      PageState s = PageTable::state_of(w);
      if (s == PageState::kPresent) {
        if (w & PageTable::kPinned) {
          const uint32_t count = PageTable::slot_of(w);
          if (count == PageTable::kMaxPinCount) {
            for (uint32_t k = first; k < b; ++k) unpin_block(k);
            return make_error(Errc::kResourceExhausted,
                              "pin(%p, %zu): the block at %p is pinned %u times already, the "
                              "most a block can be",
                              addr, len, static_cast<void*>(block_addr(b)), count);
          }
          if (!pt_.try_transition(b, w, PageTable::with_slot(w, count + 1))) continue;
          break;
        }
        if (!take_pin()) {
          // Another thread pinned meanwhile: undo this call's pins.
          for (uint32_t k = first; k < b; ++k) unpin_block(k);
          return refuse(static_cast<int64_t>(last - b));
        }
        if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kProtecting))) {
          pinned_.fetch_sub(1, std::memory_order_relaxed);
          continue;
        }
        {
          std::lock_guard<std::mutex> lk(list_mu_);
          active_.remove(b);  // off every list: the evictor never sees it
        }
        pt_.finish(b, PageTable::with_slot(
                          PageTable::with_state(w, PageState::kPresent) | PageTable::kPinned, 1));
        break;
      }
      if (is_transient(s)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));  // I/O in flight
        continue;
      }
      // Empty, Remote or Victim: fault it in as the application would (this
      // is an application thread, never a pager thread: invariant 3). The
      // evictor may take it again before the CAS above; then it loops.
      (void)*static_cast<volatile const char*>(static_cast<const void*>(block_addr(b)));
    }
  }
  return ok_status();
}

template <TransportBackend B>
Status Pager<B>::unpin(void* addr, size_t len) {
  uint32_t first = 0, last = 0;
  FARMEM_RETURN_IF_ERROR(check_block_range("unpin", addr, len, &first, &last));
  for (uint32_t b = first; b < last; ++b) {
    if (!(pt_.load(b) & PageTable::kPinned)) {
      return make_error(Errc::kInvalidArgument,
                        "unpin(%p, %zu): the block at %p is not pinned (nothing was unpinned); "
                        "unpin exactly what pin() covered",
                        addr, len, static_cast<void*>(block_addr(b)));
    }
  }
  for (uint32_t b = first; b < last; ++b) unpin_block(b);
  return ok_status();
}

// ---- fork() snapshots ---------------------------------------------------------

template <TransportBackend B>
Status Pager<B>::fork_rehome(uint32_t b) {
  BlockMeta& m = pt_.meta(b);
  if (m.remote == 0 || !fork_.unit_frozen(m.remote - 1)) return ok_status();
  auto u = remote_->alloc_unit();
  if (!u.ok()) return u.status().with_context("moving a block off a unit a fork snapshot reads");
  const uint32_t old = m.remote - 1;
  m.remote = *u + 1;
  if (!fork_.keep_unit(b, old, /*discarded=*/false)) remote_->free_unit(old);
  return ok_status();
}

template <TransportBackend B>
Status Pager<B>::fork_writeback_victims() {
  // Everything else is quiet (prepare_fork): the victims stay where they
  // are, on the victim list, and come back clean with their data remote.
  std::vector<uint32_t> dirty;
  for (uint64_t b = 0; b < n_blocks_; ++b) {
    uint32_t w = pt_.load(static_cast<uint32_t>(b));
    if (PageTable::state_of(w) == PageState::kVictim && (w & PageTable::kDirty)) {
      dirty.push_back(static_cast<uint32_t>(b));
    }
  }
  constexpr size_t kBatch = 32;
  const size_t per_batch =
      std::max<size_t>(1, std::min<size_t>(kBatch, hint_q_->depth() / remote_->replicas()));
  std::vector<IoOp> ops;
  std::vector<IoCompletion> comps;
  uint32_t blocks[kBatch], words[kBatch];
  uint8_t stored[kBatch], failed[kBatch];
  for (size_t i = 0; i < dirty.size();) {
    size_t n = 0;
    ops.clear();
    Status err = ok_status();
    for (; i < dirty.size() && n < per_batch; ++i) {
      const uint32_t b = dirty[i];
      uint32_t w = pt_.load(b);
      if (PageTable::state_of(w) != PageState::kVictim || !(w & PageTable::kDirty)) continue;
      if (!pt_.try_transition(b, w, PageTable::with_state(w, PageState::kWriting))) continue;
      BlockMeta& m = pt_.meta(b);
      Status us = ok_status();
      if (m.remote == 0) {
        auto u = remote_->alloc_unit();
        if (u.ok()) {
          m.remote = *u + 1;
        } else {
          us = u.status();
        }
      } else {
        us = fork_rehome(b);
      }
      if (!us.ok()) {
        pt_.finish(b, PageTable::with_state(w, PageState::kVictim));
        err = us;
        break;
      }
      RemoteAddr to[RemoteMap::kMaxReplicas];
      const size_t nt = remote_->begin_write(m.remote - 1, to);
      for (size_t r = 0; r < nt; ++r) {
        ops.push_back(IoOp{IoKind::kWrite, block_, to[r], slot_addr(PageTable::slot_of(w)), n});
      }
      blocks[n] = b;
      words[n] = w;
      stored[n] = 0;
      failed[n] = nt == 0 ? 1 : 0;
      ++n;
    }
    comps.assign(ops.size(), IoCompletion{});
    size_t got = 0, posted = 0;
    while (posted < ops.size()) {
      size_t room = hint_q_->depth() - hint_q_->outstanding();
      size_t k = std::min(room, ops.size() - posted);
      Errc pe = k ? hint_q_->post({ops.data() + posted, k}) : Errc::kOk;
      if (pe != Errc::kOk) {
        for (size_t j = posted; j < ops.size(); ++j) comps[got++] = IoCompletion{ops[j].cookie, pe};
        posted = ops.size();
        break;
      }
      posted += k;
      got += hint_q_->wait({comps.data() + got, comps.size() - got}, 100);
    }
    while (got < ops.size()) got += hint_q_->wait({comps.data() + got, comps.size() - got}, 100);
    counters_.bump(counters_.writes, ops.size());
    for (size_t j = 0; j < got; ++j) {
      const size_t k = comps[j].cookie;
      if (comps[j].status == Errc::kOk) {
        ++stored[k];
      } else if (comps[j].status == Errc::kUnavailable || comps[j].status == Errc::kNotFound) {
        remote_->mark_failed(ops[j].remote.server);
      } else {
        failed[k] = 1;
      }
    }
    for (size_t k = 0; k < n; ++k) {
      const uint32_t b = blocks[k];
      if (!failed[k]) remote_->end_write(pt_.meta(b).remote - 1);
      if (failed[k] || stored[k] == 0) {
        pt_.finish(b, PageTable::with_state(words[k], PageState::kVictim));  // still dirty
        if (err.ok()) {
          err = make_error(Errc::kIo,
                           "writing the dirty block at %p back before fork() failed; the fork "
                           "is not given a snapshot",
                           static_cast<void*>(block_addr(b)));
        }
        continue;
      }
      pt_.finish(b, PageTable::make(PageState::kVictim, 0, PageTable::slot_of(words[k])));
      counters_.bump(counters_.bytes_written, block_);
    }
    if (!err.ok()) return err;
  }
  return ok_status();
}

template <TransportBackend B>
Status Pager<B>::prepare_fork() {
  if (fork_child_) return ok_status();  // the first parent's fm-fork thread serves it
  if (!uffd_.fork_events()) {
    std::lock_guard<std::mutex> lk(fork_mu_);
    if (!fork_warned_) {
      fork_warned_ = true;
      FARMEM_LOG(kWarn,
                 "pager: fork() children of this process read zeros where far memory was not "
                 "resident at the fork (%s; run with CAP_SYS_PTRACE to give them snapshots)",
                 uffd_.fork_unavailable_reason());
    }
    return ok_status();
  }
  fork_mu_.lock();
  Status st = fork_.start(typename ForkSupport<B>::Env{transport_, remote_.get(), region_.ptr,
                                                       cfg_.region_size, block_});
  if (!st.ok()) {
    fork_mu_.unlock();
    return st;
  }
  hint_mu_.lock();
  fork_gate_.lock();  // the evictor finishes its round and stops
  fork_frozen_.store(true, std::memory_order_seq_cst);
  fork_.open_window();
  // 1. Handlers: a dispatch that began before the flag ends (one that
  //    begins after it parks its faults). An idle handler may be blocked in
  //    read() inside its section: the doorbell wakes it.
  wait_dispatch_sections(/*ring=*/true);
  // 2. I/O in flight completes; nothing starts new transient work now but
  //    discard (a block being discarded reads as zeros: it was freed).
  std::vector<uint32_t> busy;
  for (uint64_t b = 0; b < n_blocks_; ++b) {
    PageState s = PageTable::state_of(pt_.load(static_cast<uint32_t>(b)));
    if (is_transient(s) && s != PageState::kDiscarding) busy.push_back(static_cast<uint32_t>(b));
  }
  for (uint32_t b : busy) {
    for (;;) {
      PageState s = PageTable::state_of(pt_.load(b));
      if (!is_transient(s) || s == PageState::kDiscarding) break;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  // 3. Dirty victims: their data goes to their units.
  st = fork_writeback_victims();
  // 4. The unit of every block not mapped.
  if (st.ok()) {
    auto lk = fork_.lock();
    fork_.begin_locked();
    for (uint64_t i = 0; i < n_blocks_; ++i) {
      const uint32_t b = static_cast<uint32_t>(i);
      const uint32_t w = pt_.load(b);
      const PageState s = PageTable::state_of(w);
      if (s != PageState::kRemote && s != PageState::kVictim) continue;  // mapped, empty, freed
      FARMEM_BUG_ON(s == PageState::kVictim && (w & PageTable::kDirty));
      const uint32_t unit = pt_.meta(b).remote;
      if (unit != 0) fork_.record_locked(b, unit - 1);  // a clean victim without one is zeros
    }
    fork_.publish_locked();
    fork_owner_.store(pthread_self(), std::memory_order_relaxed);
    return ok_status();
  }
  {
    auto lk = fork_.lock();
    fork_.abandon_locked();
  }
  fork_frozen_.store(false, std::memory_order_release);
  fork_gate_.unlock();
  hint_mu_.unlock();
  fork_mu_.unlock();
  return st.with_context("fork snapshot");
}

template <TransportBackend B>
void Pager<B>::wait_dispatch_sections(bool ring) {
  // handler_threads is at most 64 (config.validate()); no allocation here.
  uint32_t s0[64];
  const size_t nh = std::min<size_t>(handlers_.size(), 64);
  for (size_t i = 0; i < nh; ++i) s0[i] = handlers_[i]->fork_seq.load(std::memory_order_seq_cst);
  auto ended = [&] {
    for (size_t i = 0; i < nh; ++i) {
      if ((s0[i] & 1) && handlers_[i]->fork_seq.load(std::memory_order_acquire) == s0[i])
        return false;
    }
    return true;
  };
  if (ended()) return;
  if (ring && blocking_read_) {
    ring_doorbell(ended);
    return;
  }
  while (!ended()) std::this_thread::sleep_for(std::chrono::microseconds(20));
}

template <TransportBackend B>
void Pager<B>::fork_parent() {
  if (fork_child_ || !uffd_.fork_events()) return;
  // fork_mu_ is held by this thread since prepare_fork(), unless that
  // failed (then nothing is held).
  if (!pthread_equal(fork_owner_.load(std::memory_order_relaxed), pthread_self())) return;
  fork_owner_.store(0, std::memory_order_relaxed);
  // If the address space was copied, the kernel let fork() return only
  // after a handler's read() took the UFFD_EVENT_FORK (see the header), in
  // a dispatch section that began before now and hands the event to fork_
  // before it ends: once those sections ended, fork_ knows. No section is
  // blocked in read() now (the handlers do not start one while
  // fork_frozen_, and prepare_fork() waited for those begun before), so
  // they end by themselves.
  wait_dispatch_sections(/*ring=*/false);
  fork_.fork_done();
  fork_frozen_.store(false, std::memory_order_seq_cst);
  fork_gate_.unlock();
  hint_mu_.unlock();
  fork_mu_.unlock();
  kick_evictor();
}

}  // namespace farmem
