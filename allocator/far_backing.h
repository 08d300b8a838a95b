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
  // Far memory resident locally now, and the local budget it lives in: what
  // FarHeap's budget-pressure purging compares (far_heap.h). Read on every
  // far allocation and free, so cheap (a relaxed load). 0 budget: unknown,
  // FarHeap then purges by decay alone.
  virtual uint64_t resident_bytes() const { return 0; }
  virtual uint64_t budget_bytes() const { return 0; }
  // Maps the never-written blocks of [addr, addr+len) as zeros now, so that
  // their first touches take no fault (Pager::populate_zero; FarHeap calls
  // it on fresh allocations, far_heap.h). Returns the blocks mapped; 0 when
  // the backing cannot (the budget has no headroom, a fork is prepared, a
  // fork()ed child).
  virtual size_t populate_zero(void* addr, size_t len) noexcept {
    (void)addr;
    (void)len;
    return 0;
  }

  // fork() (invariant 8; pager/fork_snapshot.h): prepare_fork() right before
  // fork() on the forking thread, then fork_parent() (also when fork()
  // failed: the pager finds out) or fork_child().
  // In the child the backing is inert: in_fork_child() is true, discard and
  // hints fail (ExtentSpace then keeps the pages: jemalloc must not drop far
  // pages there, the parent would refill them from the snapshot).
  virtual Status prepare_fork() { return ok_status(); }
  virtual void fork_parent() {}
  virtual void fork_child() {}
  virtual bool in_fork_child() const { return false; }
  // Parent exit: live children get every snapshot block before it goes.
  virtual void finish_fork_children() {}

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
  Status discard(void* addr, size_t len) override {
    if (p_->in_fork_child()) return child_error("discard");
    return p_->discard(addr, len);
  }
  Status hint(FarHint h, void* addr, size_t len) override {
    // The child has no transport and no pager thread (fork_snapshot.h).
    if (p_->in_fork_child()) return child_error("a far-memory hint");
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
  uint64_t resident_bytes() const override { return p_->resident_bytes(); }
  uint64_t budget_bytes() const override { return p_->budget_bytes(); }
  size_t populate_zero(void* addr, size_t len) noexcept override {
    return p_->populate_zero(addr, len);  // it checks for a fork()ed child
  }
  Status prepare_fork() override { return p_->prepare_fork(); }
  void fork_parent() override { p_->fork_parent(); }
  void fork_child() override { p_->fork_child(); }
  bool in_fork_child() const override { return p_->in_fork_child(); }
  void finish_fork_children() override { p_->finish_fork_children(); }

 private:
  static Status child_error(const char* what) {
    return make_error(Errc::kUnavailable,
                      "%s in a fork()ed child: far memory there is the parent's snapshot, served "
                      "by the parent, and stays as it is",
                      what);
  }

  PagerT* const p_;
  const char* const transport_;
};

}  // namespace farmem
