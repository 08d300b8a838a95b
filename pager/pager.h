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
// around fork() give the child a snapshot of the region; how, and what it
// costs, is in pager/fork_snapshot.h. prepare_fork() parks new faults (the
// handlers keep reading the uffd, so that they read the kernel's
// UFFD_EVENT_FORK), stops the evictor after its round and takes the hint
// lock, waits until no block is in flight, writes the dirty victims back
// (on the hint queue, to a new unit where a live snapshot freezes the old
// one), and records the remote unit of every block not mapped; all of that
// holds until fork_parent(). Cost: two passes over the page table plus the
// dirty victims' WRITEs (not yet measured).
#pragma once

#include "pager/evictor.h"
#include "pager/fault_path.h"
#include "pager/pager_core.h"
#include "pager/pager_init.h"
#include "pager/prefetch_path.h"
#include "pager/victim_move.h"
#include "pager/zero_fill.h"

namespace farmem {

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
