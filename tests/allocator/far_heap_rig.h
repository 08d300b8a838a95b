// A FarHeap on a real pager over one loopback donor, for the FarHeap tests:
// Rig r(budget, decay_ms[, purge_at]). purge_at 0 (FarHeapOptions'
// default) keeps jemalloc's decay as the only purge trigger.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "allocator/far_heap.h"
#include "pager/pager.h"
#include "pager/uffd.h"
#include "runtime/loopback_transport.h"

namespace farmem::testing {

#define SKIP_WITHOUT_UFFD()                                                      \
  do {                                                                           \
    std::string why_ = ::farmem::Uffd::unavailable_reason();                     \
    if (!why_.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why_; \
  } while (0)

struct FarHeapRig {
  using P = Pager<LoopbackTransport>;
  FarHeapRig(uint64_t budget, int64_t decay_ms, double purge_at = 0)
      : donor(512ull << 20, 16ull << 20), src(0, &donor) {
    Status st = transport.add_server(0, &donor);
    if (!st.ok()) fatal("%s", st.to_string().c_str());
    PagerConfig c;
    c.region_size = 256ull << 20;
    c.local_budget = budget;
    c.handler_threads = 2;
    auto p = P::create(c, &transport, &src);
    if (!p.ok()) fatal("%s", p.status().to_string().c_str());
    pager = std::move(*p);
    backing = std::make_unique<PagerBacking<P>>(pager.get(), "loopback");
    FarHeapOptions o;
    o.dirty_decay_ms = decay_ms;
    o.purge_at = purge_at;
    auto h = FarHeap::create(backing.get(), o);
    if (!h.ok()) fatal("%s", h.status().to_string().c_str());
    heap = std::move(*h);
  }
  ~FarHeapRig() {
    heap.reset();
    backing.reset();
    pager.reset();
  }
  uint64_t zero_faults() const { return pager->stats().faults_zero; }
  uint64_t dropped() const { return heap->space().stats().dropped_bytes; }

  LoopbackDonor donor;
  LoopbackTransport transport;
  LoopbackSlabSource src;
  std::unique_ptr<P> pager;
  std::unique_ptr<FarBacking> backing;
  std::unique_ptr<FarHeap> heap;
};

}  // namespace farmem::testing
