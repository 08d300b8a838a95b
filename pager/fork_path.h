// Pager<B>'s side of fork() snapshots (invariant 8): prepare_fork() before
// fork(), fork_parent() after it (fork_child() is inline in pager_core.h),
// and their helpers: moving a block whose unit a snapshot reads to a new
// unit (fork_rehome()), writing the dirty victims back, and waiting for the
// handlers' dispatch sections. The snapshot itself and the thread that
// serves children are ForkSupport<B> in fork_snapshot.h, which depends on
// no pager header: this file calls it, never the other way. Part of
// Pager<B> (pager/pager_core.h); include pager/pager.h.
//
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

#include "pager/pager_core.h"

namespace farmem {

template <TransportBackend B>
Status Pager<B>::fork_rehome(uint32_t b) {
  if (pt_.remote(b) == 0 || !fork_.unit_frozen(pt_.remote(b) - 1)) return ok_status();
  auto u = remote_->alloc_unit();
  if (!u.ok()) return u.status().with_context("moving a block off a unit a fork snapshot reads");
  const uint32_t old = pt_.remote(b) - 1;
  pt_.remote(b) = *u + 1;
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
      Status us = ok_status();
      if (pt_.remote(b) == 0) {
        auto u = remote_->alloc_unit();
        if (u.ok()) {
          pt_.remote(b) = *u + 1;
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
      const size_t nt = remote_->begin_write(pt_.remote(b) - 1, to);
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
      if (!failed[k]) remote_->end_write(pt_.remote(b) - 1);
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
  park_.bump();  // parked handlers come back to read the uffd meanwhile
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
      const uint32_t unit = pt_.remote(b);
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
