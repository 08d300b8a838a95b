// Pager<B>'s side of prefetch: the Prefetcher (prefetch.h / prefetch.cc)
// decides what to read; here the handlers post those READs into victim
// slots (prefetch_after(), post_prefetches()), keep what a full budget cut
// short for a retry (pending), map a confirmed stream's blocks in runs
// (add_to_run(), flush_run()), and the fm_prefetch hint (prefetch()). How a
// scan interacts with the evictor (scan resistance) is measured here too.
// Part of Pager<B> (pager/pager_core.h); include pager/pager.h.
//
// Prefetch: per-region detection (prefetch.h: up to 32 concurrent
// sequential streams, each with its own window, plus a stride/majority
// trend) turns faults into READs into victim slots; once a stream is
// confirmed by a hit, prefetched blocks are mapped at once (no fault at
// all; writable and dirty when the stream writes) but for one marker block
// half a window ahead, whose victim fault asks for the next window.
// Prefetch fills the budget up to a small reserve kept for demand faults
// (prefetch_limit_); what a full budget cuts short waits in the handler's
// pending list (kicking the evictor) and is retried as room appears, while
// its stream still wants it (retry_prefetches()). Hints:
// prefetch(addr,len), evict(addr,len) (write back + drop now), discard(),
// pin(addr,len) / unpin(addr,len) (resident until unpinned; see pin()).
// Prefetch installs: blocks to be mapped at once that land one after
// another, adjacent and in stream order (up or down), are gathered per
// handler (add_to_run()) and mapped by one UFFDIO_COPY from a contiguous
// per-handler buffer (flush_run(); up to kRunMax = 32 blocks, 128 KiB at
// 4 KiB blocks, outside the budget like staging), flushed after every
// batch of completions the handler reaps, so a block waits for no later
// event. UFFDIO_COPY here: 2.5-3.9 us per 4 KiB block alone, ~0.7 us per
// block in runs of 32, plus ~0.3 us per block for the memcpy into the
// buffer. Counted in prefetch_run_copies(). The READs stay one op per
// block into victim slots: one READ per run needs contiguous slots (or a
// registered run buffer per window in flight), not done yet.
//
// Where a scan's time went (BM_SeqScan loopback prefetch 1, 16 MiB budget,
// 64 MiB scanned, ~0.4-0.6 GB/s = 7-10 us per 4 KiB block; perf and a
// per-page timer in the scanning thread): the app stalled ~1000 times per
// pass on the markers of 16-block windows (a round trip each) and on the
// tail of a run still being copied, and the two pager threads used ~10 us
// of CPU per block between them on 2 cores: the evictor ~6 (the 4 KiB copy
// into a victim slot ~2, MADV_DONTNEED ~3.3 in runs of ~70), the handler
// ~4.5 (READ memcpy, copy into the run buffer, UFFDIO_COPY, wake-ups).
// MADV_DONTNEED alone, one thread, another thread of the mm spinning on
// the other CPU, pages just written: 32 / 64 / 128 / 256 / 512 pages per
// call: 213 / 155 / 215 / 315 / 347 us, i.e. 6.7 / 2.4 / 1.7 / 1.2 / 0.7
// us per page (freeing the pages costs more than the flush).
// Prefetch windows: a confirmed stream's window grows (doubling per hit) up
// to min(config.prefetch_max_window, max(32, budget / 16 blocks)), default
// 256 at a 16 MiB budget and above (was 32): one marker fault and one
// prefetch_after() per 128+ blocks instead of per 16. Small budgets keep
// 32. Costs more slots (handlers x window, outside the budget when free)
// and a larger victim_min_ (one window).
// Scan resistance: a block a confirmed stream mapped ahead is Present with
// kPrefetched. Reads of it never fault (whether it was used cannot be
// seen); a write faults (WP) and makes it dirty. demote_batch() drops such
// a block that is still clean and has a remote copy straight back to
// Remote after the run's MADV_DONTNEED: no copy into a victim slot, no
// victim-cache stay, room freed at once (Demoting -> Remote, page_table.h
// "s"). What it gives up: a second chance for a block that was read once,
// mapped ahead, and is read again after it left (a remote fault instead of
// a victim hit); a scan is exactly that pattern and only churns the victim
// cache. Counted in evict_ahead_drops() and evictions_clean. While the
// last batch was mostly such drops, evict_round() demotes up to 256
// blocks at a time (not 64): MADV_DONTNEED calls per pass 470 -> 120.
// And a prefetch that finds no room below prefetch_limit_ counts as
// pressure for the evictor's headroom (prefetch_starved_, as a full budget
// for a demand fault), so that a scan keeps room for whole windows.
// Measured (build/bench/farmem_bench_pager --benchmark_filter=
// 'BM_SeqScan|BM_RandomRMW|BM_FaultThroughput', the tree before and after
// interleaved, 3 rounds, 2 cores at load average 2.6-3.9 from other
// builds, so single figures move by 2x; pager GB/s):
//   BM_SeqScan loopback prefetch 1   0.338 0.326 0.123 -> 0.537 0.779 0.681
//     (demotions 28.9k -> 0.6k, MADV_DONTNEED calls 448 -> 125)
//   BM_SeqScan tcp      prefetch 1   0.179 0.352 0.186 -> 0.428 0.611 0.356
//   BM_SeqScan prefetch 0 (either)   unchanged (0.05-0.17, noise)
//   BM_RandomRMW, BM_FaultThroughput: the same counts (remote / victim
//     ratios, dirty evictions, wp and MADV_DONTNEED calls within 2%),
//     ops/s within the run-to-run noise (e.g. loopback 25%: 4.95k 9.14k
//     2.33k -> 4.59k 8.84k 5.60k).
// Steps, loopback prefetch 1, one or two runs each (same load): the clean
// drops alone moved nothing measurable (0.33-0.46 either way: the
// evictor's copy was not what the scan waited for); with them, the window
// alone 32 -> 128 / 256 (prefetch_max_window set in a scratch copy of the
// bench) 0.40 -> 0.82 / 0.95, the scan's marker faults per pass 960 ->
// 250-370 / 130-410; demotions of up to 256: 0.52 0.58 -> 0.70 0.35 (the
// load decides; kept for the 4x fewer calls); a handler poll of 50 us
// instead of 200 while prefetches wait for room: no change (not kept);
// runs of up to 64 blocks per UFFDIO_COPY (kRunMax) instead of 32, 3
// pairs at load 5.7-6.3, loopback 0.28 0.78 0.52 (32) vs 0.44 0.70 0.33
// (64), tcp 0.28 0.53 0.36 vs 0.26 0.38 0.32 GB/s, copies per 2 passes
// 1.17k -> 0.70k: no gain seen (not kept).
// Not done: READs straight into the run buffer (the slot -> run buffer
// memcpy, ~0.3 us per block), one READ per remotely contiguous run.
#pragma once

#include "pager/pager_core.h"

namespace farmem {

template <TransportBackend B>
void Pager<B>::prefetch_after(Handler& h, uint32_t b, bool hit, bool write) {
  uint32_t cand[256];
  const size_t cap = cfg_.prefetch_max_window < 256 ? cfg_.prefetch_max_window : 256;
  Prefetcher::Plan plan;
  const size_t n = prefetcher_->on_fault(b, hit, write, cand, cap, &plan);
  if (plan.stream != Prefetcher::kNoStream && !h.pending.empty()) {
    // This fault's candidates replace what its stream left pending.
    size_t keep = 0;
    for (const PendingPrefetch& e : h.pending)
      if (e.stream != plan.stream) h.pending[keep++] = e;
    h.pending.resize(keep);
  }
  if (n == 0) return;
  PendingPrefetch req[256];
  const uint64_t now = pager_detail::now_ns();
  for (size_t i = 0; i < n; ++i) {
    // On a confirmed stream every block but the marker is mapped when it
    // lands (writable and dirty when the stream writes: no WP fault each).
    const bool map = plan.confirmed && cand[i] != plan.marker;
    req[i] = PendingPrefetch{.block = cand[i],
                             .stream = plan.stream,
                             .t = now,
                             .rank = static_cast<uint32_t>(i),
                             .map = map,
                             .write = map && plan.write};
  }
  const size_t done = post_prefetches(h, req, n);
  // A scan keeps the budget full: what did not fit now is retried as the
  // evictor makes room (kicked by post_prefetches()), rather than dropped
  // until the stream's next fault, which would then be a demand fault.
  if (plan.stream != Prefetcher::kNoStream)
    for (size_t i = done; i < n; ++i) add_pending(h, req[i]);
}

template <TransportBackend B>
size_t Pager<B>::post_prefetches(Handler& h, const PendingPrefetch* req, size_t n) {
  h.ops.clear();
  bool no_room = false;
  size_t i = 0;
  for (; i < n; ++i) {
    if (h.free_inflight.empty() || h.q->outstanding() + h.ops.size() + 1 > h.q->depth()) break;
    // Prefetch leaves a few blocks of the budget to demand faults, so that
    // they do not wait for the evictor because of a prefetch.
    if (resident_.load(std::memory_order_relaxed) >= prefetch_limit_) {
      no_room = true;
      // Pressure, as a full budget for a demand fault: the evictor keeps
      // more headroom while a scan keeps finding none (evictor_main()).
      prefetch_starved_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    const uint32_t c = req[i].block;
    uint32_t w = pt_.load(c);
    if (PageTable::state_of(w) != PageState::kRemote) continue;
    uint32_t slot = alloc_slot();
    if (slot == kNoSlot) {
      no_room = true;
      break;
    }
    if (!reserve()) {  // it kicked the evictor
      free_slot(slot);
      break;
    }
    if (!pt_.try_transition(c, w, PageTable::make(PageState::kFetching, 0, slot))) {
      unreserve();
      free_slot(slot);
      continue;
    }
    RemoteAddr from;
    if (!remote_->resolve_read(pt_.remote(c) - 1, &from)) {
      // No live replica: leave it to a demand fault to report (invariant 6).
      unreserve();
      free_slot(slot);
      pt_.finish(c, PageTable::make(PageState::kRemote, 0, 0));
      continue;
    }
    uint32_t k = h.free_inflight.back();
    h.free_inflight.pop_back();
    // Mapped ahead, a block written in its last stay comes back writable
    // and dirty, as a demand read fault maps it (fault_path.h "Written
    // blocks come back writable"): a stream reading blocks it wrote last
    // pass and writing them again took a WP fault per block. Measured:
    // bench/eval scan (STREAM kernels, 96 MiB at a 96 MiB budget,
    // loopback) WP faults 61.9k -> 2.1k, 1.22 -> 0.74 s; GNU sort -S 300M
    // at 80M over tcp: WP faults 11.3k -> 4.5k, 2.35 -> 2.11 s.
    const bool guess =
        req[i].map && !req[i].write && (w & PageTable::kWritten) != 0 && cfg_.written_writable;
    h.inflight[k] = Inflight{c, slot, true, req[i].write || guess, req[i].map, 0, from.server};
    h.inflight[k].guessed = guess;
    h.ops.push_back(IoOp{IoKind::kRead, block_, from, slot_addr(slot), k});
  }
  if (no_room) kick_evictor();
  if (h.ops.empty()) return i;
  Errc pe = h.q->post({h.ops.data(), h.ops.size()});
  if (pe != Errc::kOk) {
    // Not fatal: nobody waits on a prefetch. Undo it, and forget the rest.
    for (const IoOp& op : h.ops) {
      remote_->read_done(op.remote.server);
      Inflight& f = h.inflight[op.cookie];
      free_slot(f.buf);
      unreserve();
      pt_.finish(f.block, PageTable::make(PageState::kRemote, 0, 0));
      h.free_inflight.push_back(static_cast<uint32_t>(op.cookie));
    }
    return n;
  }
  counters_.bump(counters_.prefetch_issued, h.ops.size());
  counters_.bump(counters_.reads, h.ops.size());
  return i;
}

template <TransportBackend B>
void Pager<B>::add_pending(Handler& h, const PendingPrefetch& e) {
  // Sorted by rank (stable): a retry serves every stream's nearest blocks
  // first. Full: the farthest entry goes. Never reallocates (reserved).
  auto& v = h.pending;
  h.pending_t = e.t;
  if (v.size() == kMaxPending) {
    if (v.back().rank <= e.rank) return;
    v.pop_back();
  }
  auto pos = v.end();
  while (pos != v.begin() && (pos - 1)->rank > e.rank) --pos;
  v.insert(pos, e);
}

template <TransportBackend B>
void Pager<B>::retry_prefetches(Handler& h) {
  // Runs on every turn of the handler loop: nothing to do until the
  // evictor made room (one load), but for forgetting a list that grew old
  // (a handler with entries left polls every 200 us).
  const uint64_t now = pager_detail::now_ns();
  if (now - h.pending_t > kPendingNs) {
    h.pending.clear();
    return;
  }
  if (resident_.load(std::memory_order_relaxed) >= prefetch_limit_) return;
  // Drop what is no longer wanted: fetched meanwhile (by a demand fault, the
  // other handler or a newer candidate list), or too old.
  size_t keep = 0;
  for (const PendingPrefetch& e : h.pending) {
    if (now - e.t <= kPendingNs && PageTable::state_of(pt_.load(e.block)) == PageState::kRemote)
      h.pending[keep++] = e;
  }
  h.pending.resize(keep);
  if (h.pending.empty()) return;
  // ... or that its stream has passed or given up (a block it already read
  // and that was evicted again would be fetched for nothing).
  keep = 0;
  for (const PendingPrefetch& e : h.pending)
    if (prefetcher_->still_ahead(e.stream, e.block)) h.pending[keep++] = e;
  h.pending.resize(keep);
  const size_t done = post_prefetches(h, h.pending.data(), h.pending.size());
  h.pending.erase(h.pending.begin(), h.pending.begin() + static_cast<std::ptrdiff_t>(done));
}

template <TransportBackend B>
void Pager<B>::add_to_run(Handler& h, uint32_t b, uint32_t slot, bool write, bool guessed,
                          uint32_t laps) {
  if (h.run_n > 0) {
    const bool same =
        h.run_write == write && h.run_guessed == guessed && h.run_laps == laps && h.run_n < kRunMax;
    if (same && b == h.run_first + h.run_n) {
      h.run_slot[h.run_n++] = slot;
      return;
    }
    if (same && b + 1 == h.run_first) {  // a descending stream
      std::memmove(h.run_slot + 1, h.run_slot, h.run_n * sizeof h.run_slot[0]);
      h.run_slot[0] = slot;
      h.run_first = b;
      ++h.run_n;
      return;
    }
    flush_run(h);
  }
  h.run_first = b;
  h.run_n = 1;
  h.run_write = write;
  h.run_guessed = guessed;
  h.run_laps = laps;
  h.run_slot[0] = slot;
}

template <TransportBackend B>
void Pager<B>::flush_run(Handler& h) {
  const uint32_t n = h.run_n;
  if (n == 0) return;
  h.run_n = 0;
  const uint32_t first = h.run_first;
  if (n == 1) {
    install_mapped(first, slot_addr(h.run_slot[0]), h.run_write,
                   h.run_guessed ? PageTable::kGuessed : 0, 1, /*ahead=*/true, h.run_laps);
    free_slot(h.run_slot[0]);
    return;
  }
  // One copy of the run instead of one per block: ~0.7 us per 4 KiB block
  // in runs of 32 against 2.5-3.9 us each alone (UFFDIO_COPY here); the
  // memcpy into run_buf costs ~0.3 us per block.
  for (uint32_t i = 0; i < n; ++i) {
    memcpy(h.run_buf.ptr + uint64_t{i} * block_, slot_addr(h.run_slot[i]), block_);
  }
  install_mapped(first, h.run_buf.ptr, h.run_write, h.run_guessed ? PageTable::kGuessed : 0, n,
                 /*ahead=*/true, h.run_laps);
  for (uint32_t i = 0; i < n; ++i) free_slot(h.run_slot[i]);
  prefetch_runs_.fetch_add(1, std::memory_order_relaxed);
}

template <TransportBackend B>
Status Pager<B>::prefetch(void* addr, size_t len) {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t base = reinterpret_cast<uintptr_t>(region_.ptr);
  if (a < base || a + len > base + cfg_.region_size || len > cfg_.region_size) {
    return make_error(Errc::kInvalidArgument,
                      "prefetch(%p, %zu): the range must be inside the region [%p, +%llu)", addr,
                      len, static_cast<void*>(region_.ptr),
                      static_cast<unsigned long long>(cfg_.region_size));
  }
  if (len == 0) return ok_status();
  std::lock_guard<std::mutex> hl(hint_mu_);
  const uint32_t first = static_cast<uint32_t>((a - base) / block_);
  const uint32_t last = static_cast<uint32_t>((a + len - 1 - base) / block_) + 1;
  constexpr size_t kBatch = 32;
  IoOp ops[kBatch];
  uint32_t b = first;
  bool budget_full = false;
  while (b < last && !budget_full) {
    size_t n = 0;
    for (; b < last && n < kBatch && n < hint_q_->depth(); ++b) {
      uint32_t w = pt_.load(b);
      if (PageTable::state_of(w) != PageState::kRemote) continue;
      uint32_t slot = alloc_slot();
      if (slot == kNoSlot) break;
      bool got = reserve();
      for (int tries = 0; !got && tries < 100; ++tries) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));  // evictor was kicked
        got = reserve();
      }
      if (!got) {
        free_slot(slot);
        budget_full = true;
        break;
      }
      if (!pt_.try_transition(b, w, PageTable::make(PageState::kFetching, 0, slot))) {
        unreserve();
        free_slot(slot);
        continue;
      }
      RemoteAddr from;
      if (!remote_->resolve_read(pt_.remote(b) - 1, &from)) {
        // No live replica: a fault on it reports the loss (invariant 6).
        unreserve();
        free_slot(slot);
        pt_.finish(b, PageTable::make(PageState::kRemote, 0, 0));
        continue;
      }
      ops[n++] = IoOp{IoKind::kRead, block_, from, slot_addr(slot), b};
    }
    if (n == 0) {
      if (b < last && !budget_full) ++b;  // no slot this time: skip ahead rather than spin
      continue;
    }
    Errc pe = hint_q_->post({ops, n});
    size_t done = 0;
    IoCompletion comps[kBatch];
    if (pe != Errc::kOk) {
      for (size_t i = 0; i < n; ++i) comps[i] = IoCompletion{ops[i].cookie, pe};
      done = n;
    } else {
      while (done < n) done += hint_q_->wait({comps + done, n - done}, 100);
    }
    for (size_t i = 0; i < n; ++i) remote_->read_done(ops[i].remote.server);
    counters_.bump(counters_.reads, n);
    counters_.bump(counters_.prefetch_issued, n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t blk = static_cast<uint32_t>(comps[i].cookie);
      const uint32_t slot = PageTable::slot_of(pt_.load(blk));
      if (comps[i].status != Errc::kOk) {
        free_slot(slot);
        unreserve();
        pt_.finish(blk, PageTable::make(PageState::kRemote, 0, 0));
        continue;
      }
      install_mapped(blk, slot_addr(slot), false, 0);
      free_slot(slot);
      counters_.bump(counters_.bytes_read, block_);
      counters_.bump(counters_.prefetch_mapped);
    }
  }
  // The range is mapped; the slots its READs landed in hold copies of it
  // that nobody needs (evictor.h "Free slots' pages").
  while (release_slot_pages(kDemotePick) > 0) {
  }
  return ok_status();
}

}  // namespace farmem
