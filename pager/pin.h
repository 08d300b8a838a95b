// Pager<B>'s pinning (fm_pin / fm_unpin): pin() makes a range resident and
// keeps it out of the evictor's reach until unpinned; the pin limit keeps
// room for the evictor to work. Also check_block_range(), the range check
// the hints share. Part of Pager<B> (pager/pager_core.h); include
// pager/pager.h.
#pragma once

#include "pager/pager_core.h"

namespace farmem {

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
    pt_.finish(b, PageTable::make(PageState::kPresent, w & PageTable::kKeep, 0));
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
      if (s == PageState::kPresent && (w & PageTable::kZeroMapped)) {
        // The shared zero page: give it a page of its own first (a write
        // that changes nothing takes the WP fault), as a pinned block is
        // counted and its page must not change under a DMA.
        __atomic_fetch_add(static_cast<char*>(static_cast<void*>(block_addr(b))), 0,
                           __ATOMIC_RELAXED);
        continue;
      }
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

}  // namespace farmem
