// What the allocator needs from a pager region, behind one small virtual
// interface (control path only: the fault path never goes through it).
//
//   farmem::PagerBacking<farmem::LoopbackTransport> backing(pager.get());
//   farmem::ExtentSpace space(&backing);
//   space.drop(addr, len);          // -> Pager::discard for whole blocks
//
// Hints (fm_prefetch / fm_evict / fm_pin / fm_unpin) go through hint() to
// Pager::prefetch / evict / pin / unpin. The range is widened OUTWARD to
// whole blocks: every block that holds a byte of [addr, addr+len) is
// covered. None of the hints changes contents, so covering a neighbour's
// bytes in a shared first or last block only moves or keeps them resident;
// narrowing inward would make a hint on an object smaller than a block do
// nothing, and a pin would not cover all of its bytes. pin and unpin widen
// the same way, and pins are counted per block, so two objects sharing a
// block are pinned and unpinned independently.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "pager/stats.h"
#include "runtime/log.h"
#include "runtime/status.h"

namespace farmem {

enum class FarHint { kPrefetch, kEvict, kPin, kUnpin };

class FarBacking {
 public:
  virtual ~FarBacking() = default;
  virtual void* base() const = 0;
  virtual size_t size() const = 0;
  // Granularity of drop: discard() takes whole blocks.
  virtual uint32_t block_size() const = 0;
  // [addr, addr+len), block-aligned: reads as zeros afterwards, and its
  // local budget and remote space are released (invariant 2).
  virtual Status discard(void* addr, size_t len) = 0;
  // [addr, addr+len) must lie inside [base(), base()+size()) (the caller
  // checks); widened outward to whole blocks (see above).
  virtual Status hint(FarHint, void* addr, size_t len) {
    (void)addr;
    (void)len;
    return make_error(Errc::kInternal, "this far-memory backing does not take hints");
  }
  virtual PagerStats stats() const = 0;
  virtual const char* transport_name() const = 0;

  bool contains(const void* p) const {
    return reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base()) < size();
  }
};

// Adapter over Pager<B> (pager/pager.h); the pager outlives it.
template <class PagerT>
class PagerBacking final : public FarBacking {
 public:
  PagerBacking(PagerT* pager, const char* transport) : p_(pager), transport_(transport) {}
  void* base() const override { return p_->base(); }
  size_t size() const override { return p_->size(); }
  uint32_t block_size() const override { return p_->block_size(); }
  Status discard(void* addr, size_t len) override { return p_->discard(addr, len); }
  Status hint(FarHint h, void* addr, size_t len) override {
    const uintptr_t base = reinterpret_cast<uintptr_t>(p_->base());
    const uintptr_t bs = p_->block_size();
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    const uintptr_t lo = base + (a - base) / bs * bs;
    const uintptr_t hi = base + (a + len - base + bs - 1) / bs * bs;
    void* start = reinterpret_cast<void*>(lo);
    const size_t n = hi - lo;
    switch (h) {
      case FarHint::kPrefetch:
        return p_->prefetch(start, n);
      case FarHint::kEvict:
        return p_->evict(start, n);
      case FarHint::kPin:
        return p_->pin(start, n);
      case FarHint::kUnpin:
        return p_->unpin(start, n);
    }
    return make_error(Errc::kInvalidArgument, "unknown far-memory hint %d", static_cast<int>(h));
  }
  PagerStats stats() const override { return p_->stats(); }
  const char* transport_name() const override { return transport_; }

 private:
  PagerT* const p_;
  const char* const transport_;
};

}  // namespace farmem
