// Shared set-up of the pager tests: a loopback donor, transport, slab
// source and a Pager<LoopbackTransport>, plus the userfaultfd skip check
// (and, from integrity_workload.h, the integrity workload and mapped_pages).
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <thread>
#include <vector>

#include "pager/pager.h"
#include "pager/remote_map.h"
#include "pager/uffd.h"
#include "runtime/loopback_transport.h"
#include "tests/pager/integrity_workload.h"

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
  // These tests push blocks out, and fill the budget, by READING
  // never-written pages (touch_pages()); with the shared zero page
  // (config.zero_page, the default) such reads hold no memory and push
  // nothing out. Its own tests (pager_zero_page_test.cc) and the integrity
  // workloads turn it on (zero_page_config()).
  c.zero_page = false;
  return c;
}

// small_config() with the default shared zero page for reads of
// never-written blocks.
inline PagerConfig zero_page_config(uint64_t budget_pages, uint64_t region_pages) {
  PagerConfig c = small_config(budget_pages, region_pages);
  c.zero_page = true;
  return c;
}

// Starts a pager on `rig` (LoopbackRig or any rig with start(config))
// with prefetch off, so that every READ a donor sees is a demand fault the
// test caused.
template <class Rig>
P& start_without_prefetch(Rig& rig, size_t budget_pages, size_t region_pages) {
  PagerConfig c = small_config(budget_pages, region_pages);
  c.prefetch = false;
  return rig.start(c);
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

// Index of the first page in [from, pages) of mem whose bytes differ from
// fill_page(page, version), or `pages` when none does. Plain memory
// accesses only, so a forked child may call it.
inline size_t first_bad_page(const uint8_t* mem, size_t pages, uint64_t version, size_t from = 0) {
  uint8_t expect[kPage];
  for (size_t pg = from; pg < pages; ++pg) {
    fill_page(expect, pg, version);
    if (memcmp(mem + pg * kPage, expect, kPage) != 0) return pg;
  }
  return pages;
}

// Invariant 2's workload: reads the never-written pages of [base,
// base + pages * kPage) twice over, a byte every 512, in a region many
// times the budget (the second pass faults again on what was evicted).
// Returns the first page that read non-zero, or `pages`.
inline size_t first_nonzero_page_read_twice(void* base, size_t pages) {
  auto* mem = static_cast<volatile uint8_t*>(base);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t pg = 0; pg < pages; ++pg) {
      uint64_t sum = 0;
      for (size_t i = 0; i < kPage; i += 512) sum += mem[pg * kPage + i];
      if (sum != 0) return pg;
    }
  }
  return pages;
}

// The pager's counters after first_nonzero_page_read_twice over `region`
// pages with a budget of `budget` pages: every page faulted as a zero page
// (pass 2 again where it had left the victim cache), clean evictions
// only, and not one byte of transport traffic.
inline void expect_zero_faults_without_traffic(const PagerStats& s, size_t budget, size_t region) {
  // Zero-fill fault-around maps runs of them per fault (zero_around).
  EXPECT_GE(s.faults_zero + s.zero_around, region + region - budget) << s.to_string();
  EXPECT_GT(s.evictions_clean, region) << s.to_string();
  EXPECT_EQ(s.evictions_dirty, 0u) << s.to_string();
  EXPECT_EQ(s.faults_remote, 0u) << s.to_string();
  EXPECT_EQ(s.reads, 0u) << s.to_string();
  EXPECT_EQ(s.writes, 0u) << s.to_string();
  EXPECT_EQ(s.remote_bytes, 0u) << s.to_string();
}

// On scope exit (an ASSERT that returns early included) clears `flag` and
// joins the threads, so that a thread held back by fault injection is let
// go and never outlives what it uses.
class ReleaseAndJoin {
 public:
  ReleaseAndJoin(std::atomic<bool>& flag, std::initializer_list<std::thread*> threads)
      : flag_(flag), threads_(threads) {}
  ~ReleaseAndJoin() {
    flag_ = false;
    for (std::thread* t : threads_)
      if (t->joinable()) t->join();
  }
  ReleaseAndJoin(const ReleaseAndJoin&) = delete;
  ReleaseAndJoin& operator=(const ReleaseAndJoin&) = delete;

 private:
  std::atomic<bool>& flag_;
  std::vector<std::thread*> threads_;
};

// Fault injection: while `active` holds, every op of `kind` gets `verdict`
// (kDefer: held back; kFail: refused) and is counted in `hits`; all other
// ops run. `active` and `hits` must outlive the faults: set_faults({})
// before they go out of scope.
template <class Count>
LoopbackFaults verdict_while(IoKind kind, const std::atomic<bool>& active, std::atomic<Count>& hits,
                             LoopbackVerdict verdict) {
  LoopbackFaults f;
  f.hook = [kind, &active, &hits, verdict](const IoOp& op) {
    if (op.kind != kind || !active.load()) return LoopbackVerdict{};
    ++hits;
    return verdict;
  };
  return f;
}

}  // namespace farmem::testing
