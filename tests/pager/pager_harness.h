// Shared set-up of the pager tests: a loopback donor, transport, slab
// source and a Pager<LoopbackTransport>, plus the userfaultfd skip check.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "pager/pager.h"
#include "pager/remote_map.h"
#include "pager/uffd.h"
#include "runtime/loopback_transport.h"

namespace farmem::testing {

#define FARMEM_SKIP_WITHOUT_UFFD()                                               \
  do {                                                                           \
    std::string why_ = ::farmem::Uffd::unavailable_reason();                     \
    if (!why_.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why_; \
  } while (0)

inline constexpr size_t kPage = 4096;
using P = Pager<LoopbackTransport>;

struct LoopbackRig {
  explicit LoopbackRig(uint64_t donor_capacity = 256ull << 20, uint64_t slab = 4ull << 20)
      : donor(donor_capacity, slab), src(0, &donor) {
    Status st = transport.add_server(0, &donor);
    if (!st.ok()) fatal("test rig: %s", st.to_string().c_str());
  }
  // Creates the pager; fatal on error (tests check the result elsewhere).
  Pager<LoopbackTransport>& start(const PagerConfig& c) {
    auto p = Pager<LoopbackTransport>::create(c, &transport, &src);
    if (!p.ok()) fatal("test rig: %s", p.status().to_string().c_str());
    pager = std::move(*p);
    return *pager;
  }
  ~LoopbackRig() { pager.reset(); }

  LoopbackDonor donor;
  LoopbackTransport transport;
  LoopbackSlabSource src;
  std::unique_ptr<Pager<LoopbackTransport>> pager;
};

inline PagerConfig small_config(uint64_t budget_pages, uint64_t region_pages) {
  PagerConfig c;
  c.local_budget = budget_pages * kPage;
  c.region_size = region_pages * kPage;
  c.handler_threads = 2;
  return c;
}

// Waits up to `ms` for pred(); returns its last value.
template <class F>
bool wait_until(F pred, int ms = 5000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Pages of [p, p+len) mapped right now (mincore): an independent check of
// the pager's own resident counter.
inline size_t mapped_pages(void* p, size_t len) {
  std::vector<unsigned char> v(len / kPage);
  if (mincore(p, len, v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

// Pseudo-random page contents derived from (page, version).
inline void fill_page(uint8_t* dst, uint64_t page, uint64_t version) {
  uint64_t x = page * 0x9E3779B97F4A7C15ull ^ (version + 1) * 0xC2B2AE3D27D4EB4Full;
  for (size_t i = 0; i < kPage; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(dst + i, &x, 8);
  }
}

}  // namespace farmem::testing
