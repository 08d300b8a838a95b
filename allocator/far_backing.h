// What the allocator needs from a pager region, behind one small virtual
// interface (control path only: the fault path never goes through it).
//
//   farmem::PagerBacking<farmem::LoopbackTransport> backing(pager.get());
//   farmem::ExtentSpace space(&backing);
//   space.drop(addr, len);          // -> Pager::discard for whole blocks
//
// Hints (prefetch / evict / pin) are here so that the C API and the
// allocator are written against them today; the pager does not offer them
// yet, so hint() answers ENOTSUP (see the report to the lead: Pager needs
// prefetch(addr,len), evict(addr,len) = write back + drop, pin/unpin).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "pager/stats.h"
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
  // 0, or an errno value (ENOTSUP when the pager cannot do it).
  virtual int hint(FarHint, void*, size_t) { return ENOTSUP; }
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
  PagerStats stats() const override { return p_->stats(); }
  const char* transport_name() const override { return transport_; }

 private:
  PagerT* const p_;
  const char* const transport_;
};

}  // namespace farmem
