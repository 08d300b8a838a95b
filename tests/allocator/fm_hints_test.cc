// fm_prefetch / fm_evict / fm_pin / fm_unpin through the C API on a
// loopback donor: the hints reach the pager (counters move exactly) and
// the bytes stay exact.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "farmem/farmem.h"
#include "farmem/farmem.hpp"
#include "pager/uffd.h"

namespace {

constexpr size_t kPage = 4096;

class FmHints : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = farmem::Uffd::unavailable_reason();
    if (!why.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why;
    fm_config c;
    fm_config_init(&c);
    c.transport = "loopback";
    c.loopback_capacity = 256ull << 20;
    c.local_mem = 8 << 20;
    c.pager_threads = 1;
    c.prefetch = 0;  // every remote access below is one demand READ
    ASSERT_EQ(fm_init(&c), 0) << fm_last_error();
  }
  void TearDown() override {
    if (fm_is_running()) {
      EXPECT_EQ(fm_shutdown(), 0);
    }
  }
  // The pager bumps a fault counter just after it wakes the faulting
  // thread: wait (bounded) until two snapshots 20 ms apart agree.
  static fm_stats_t stats() {
    fm_stats_t s, again;
    fm_stats_init(&s);
    fm_stats_init(&again);
    EXPECT_EQ(fm_stats(&s), 0);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_EQ(fm_stats(&again), 0);
      if (again.faults_remote == s.faults_remote && again.faults_zero == s.faults_zero &&
          again.faults_victim == s.faults_victim)
        break;
      s = again;
    }
    return again;
  }
  static void fill(uint8_t* p, size_t n, uint8_t seed) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 31 + seed + (i >> 12));
  }
  static bool check(const uint8_t* p, size_t n, uint8_t seed) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] != static_cast<uint8_t>(i * 31 + seed + (i >> 12))) return false;
    }
    return true;
  }
};

TEST_F(FmHints, EvictDropsResidentAndReaccessReadsBack) {
  constexpr size_t kN = 1 << 20;  // 256 pages, well inside the 8 MiB budget
  auto* p = static_cast<uint8_t*>(fm_aligned_alloc(kPage, kN));
  ASSERT_NE(p, nullptr) << fm_last_error();
  fill(p, kN, 7);
  fm_stats_t before = stats();
  ASSERT_EQ(fm_evict(p, kN), 0) << fm_last_error();
  fm_stats_t evicted = stats();
  EXPECT_EQ(before.resident_bytes - evicted.resident_bytes, kN);
  EXPECT_EQ(evicted.evictions_dirty - before.evictions_dirty, kN / kPage);
  EXPECT_EQ(evicted.bytes_written - before.bytes_written, kN);
  ASSERT_TRUE(check(p, kN, 7));
  fm_stats_t after = stats();
  EXPECT_EQ(after.faults_remote - evicted.faults_remote, kN / kPage);
  EXPECT_EQ(after.bytes_read - evicted.bytes_read, kN);
  EXPECT_EQ(after.resident_bytes - evicted.resident_bytes, kN);
  fm_free(p);
}

TEST_F(FmHints, UnalignedEvictCoversWholeBlocks) {
  constexpr size_t kN = 64 * kPage;
  auto* p = static_cast<uint8_t*>(fm_aligned_alloc(kPage, kN));
  ASSERT_NE(p, nullptr);
  fill(p, kN, 3);
  fm_stats_t before = stats();
  // Bytes 100 .. 2 pages + 100: touches pages 0, 1 and 2.
  ASSERT_EQ(fm_evict(p + 100, 2 * kPage), 0) << fm_last_error();
  fm_stats_t after = stats();
  EXPECT_EQ(after.evictions_dirty - before.evictions_dirty, 3u);
  EXPECT_TRUE(check(p, kN, 3));
  fm_free(p);
}

TEST_F(FmHints, PrefetchAfterEvictAvoidsRemoteFaults) {
  constexpr size_t kN = 1 << 20;
  auto* p = static_cast<uint8_t*>(fm_aligned_alloc(kPage, kN));
  ASSERT_NE(p, nullptr);
  fill(p, kN, 11);
  ASSERT_EQ(fm_evict(p, kN), 0) << fm_last_error();
  fm_stats_t evicted = stats();
  ASSERT_EQ(fm_prefetch(p, kN), 0) << fm_last_error();
  fm_stats_t pre = stats();
  EXPECT_EQ(pre.bytes_read - evicted.bytes_read, kN);
  EXPECT_EQ(pre.resident_bytes - evicted.resident_bytes, kN);
  ASSERT_TRUE(check(p, kN, 11));
  fm_stats_t after = stats();
  EXPECT_EQ(after.faults_remote, evicted.faults_remote);  // not one demand READ
  EXPECT_EQ(after.bytes_read, pre.bytes_read);
  fm_free(p);
}

TEST_F(FmHints, RangeOutsideFarMemoryIsEINVAL) {
  static char local[64];
  errno = 0;
  EXPECT_EQ(fm_evict(local, sizeof local), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_NE(strstr(fm_last_error(), "not inside far memory"), nullptr) << fm_last_error();
  EXPECT_EQ(fm_prefetch(local, sizeof local), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(fm_pin(local, sizeof local), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(FmHints, PinKeepsBytesResidentAcrossEvictAndPressure) {
  constexpr size_t kPin = 1 << 20;
  auto* p = static_cast<uint8_t*>(fm_aligned_alloc(kPage, kPin));
  ASSERT_NE(p, nullptr);
  fill(p, kPin, 5);
  ASSERT_EQ(fm_evict(p, kPin), 0);
  ASSERT_EQ(fm_pin(p, kPin), 0) << fm_last_error();  // fetches them back
  fm_stats_t pinned = stats();
  ASSERT_EQ(fm_evict(p, kPin), 0);  // a pinned block stays
  // Pressure: 4x the budget through other memory.
  constexpr size_t kBig = 32 << 20;
  auto* q = static_cast<uint8_t*>(fm_malloc(kBig));
  ASSERT_NE(q, nullptr);
  for (size_t i = 0; i < kBig; i += kPage) q[i] = 1;
  fm_stats_t mid = stats();
  EXPECT_GT(mid.evictions_dirty, pinned.evictions_dirty);
  EXPECT_TRUE(check(p, kPin, 5));
  fm_stats_t after = stats();
  EXPECT_EQ(after.faults_remote, mid.faults_remote);
  EXPECT_EQ(after.faults_victim, mid.faults_victim);
  ASSERT_EQ(fm_unpin(p, kPin), 0) << fm_last_error();
  errno = 0;
  EXPECT_EQ(fm_unpin(p, kPin), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_NE(strstr(fm_last_error(), "not pinned"), nullptr) << fm_last_error();
  // The C++ wrappers: RAII pin and a refused pin that throws.
  {
    farmem::pin_guard g(p, kPage);
    EXPECT_THROW(farmem::pin(q, kBig), std::system_error);
  }
  errno = 0;
  EXPECT_EQ(fm_pin(q, kBig), -1);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_NE(strstr(fm_last_error(), "leave the evictor no room"), nullptr) << fm_last_error();
  EXPECT_EQ(fm_unpin(p, kPage), -1);  // the guard unpinned it
  fm_free(q);
  fm_free(p);
}

}  // namespace
