// Invariant 3, allocation half: the fault handler threads never call malloc
// while serving faults (zero fills, remote fetches, write-protect faults,
// victim hits, prefetches). This binary interposes malloc and counts calls
// made on threads named "fm-fault" (the pager names its handler threads).
#include <gtest/gtest.h>
#include <sys/prctl.h>

#include <atomic>
#include <cstring>

#include "tests/pager/pager_harness.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {

std::atomic<uint64_t> g_handler_allocs{0};

bool on_handler_thread() {
  char name[16] = {};
  prctl(PR_GET_NAME, name, 0, 0, 0);
  return strncmp(name, "fm-fault", 8) == 0;
}

void count() {
  if (on_handler_thread()) g_handler_allocs.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

extern "C" {
void* malloc(size_t n) {
  count();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  count();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  count();
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t al, size_t n) {
  count();
  return __libc_memalign(al, n);
}
int posix_memalign(void** out, size_t al, size_t n) {
  count();
  void* p = __libc_memalign(al, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
}

namespace farmem::testing {
namespace {

TEST(PagerAllocTest, FaultHandlersNeverAllocate) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  PagerConfig c = small_config(256, 4096);
  P& p = rig.start(c);
  auto* mem = static_cast<uint8_t*>(p.base());
  // Warm-up: the first lease of remote space happens on the evictor.
  for (size_t pg = 0; pg < 512; ++pg) mem[pg * kPage] = 1;
  g_handler_allocs = 0;
  const PagerStats before = p.stats();
  for (int round = 0; round < 3; ++round) {
    for (size_t pg = 0; pg < 2048; ++pg) {
      volatile uint8_t v = mem[pg * kPage];  // zero fills, remote fetches, victim hits
      (void)v;
      if (pg % 3 == 0) mem[pg * kPage + 8] = static_cast<uint8_t>(round);  // WP faults
    }
  }
  const PagerStats s = p.stats();
  EXPECT_GT(s.faults_zero, before.faults_zero);
  EXPECT_GT(s.faults_remote, before.faults_remote);
  EXPECT_GT(s.faults_wp, before.faults_wp);
  EXPECT_GT(s.faults_victim, before.faults_victim);
  EXPECT_GT(s.prefetch_issued, before.prefetch_issued);
  EXPECT_EQ(g_handler_allocs.load(), 0u) << s.to_string();
}

}  // namespace
}  // namespace farmem::testing
