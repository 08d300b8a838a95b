// A FarHeap on a real pager over one loopback donor, for the FarHeap tests:
// Rig r(budget, decay_ms[, purge_at]), or Rig r(pager_config, heap_options).
// purge_at 0 (FarHeapOptions' default) keeps jemalloc's decay as the only
// purge trigger.
#pragma once

#include <memory>

#include "allocator/far_heap.h"
#include "tests/pager/pager_harness.h"

namespace farmem::testing {

struct FarHeapRig {
  using P = Pager<LoopbackTransport>;
  FarHeapRig(uint64_t budget, int64_t decay_ms, double purge_at = 0)
      : FarHeapRig(pager_config(budget), heap_options(decay_ms, purge_at)) {}
  // Any pager and heap configuration (e.g. small_config() and populate_max).
  FarHeapRig(const PagerConfig& c, const FarHeapOptions& o) : rig(512ull << 20, 16ull << 20) {
    pager = &rig.start(c);
    backing = std::make_unique<PagerBacking<P>>(pager, "loopback");
    auto h = FarHeap::create(backing.get(), o);
    if (!h.ok()) fatal("%s", h.status().to_string().c_str());
    heap = std::move(*h);
  }
  ~FarHeapRig() {
    heap.reset();
    backing.reset();
  }  // then rig stops the pager
  uint64_t zero_faults() const { return pager->stats().faults_zero; }
  uint64_t dropped() const { return heap->space().stats().dropped_bytes; }

  static PagerConfig pager_config(uint64_t budget) {
    PagerConfig c;
    c.region_size = 256ull << 20;
    c.local_budget = budget;
    c.handler_threads = 2;
    return c;
  }
  static FarHeapOptions heap_options(int64_t decay_ms, double purge_at) {
    FarHeapOptions o;
    o.dirty_decay_ms = decay_ms;
    o.purge_at = purge_at;
    return o;
  }

  LoopbackRig rig;
  P* pager = nullptr;
  std::unique_ptr<FarBacking> backing;
  std::unique_ptr<FarHeap> heap;
};

}  // namespace farmem::testing
