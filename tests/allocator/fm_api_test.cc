// The C API (include/farmem/farmem.h) on an in-process loopback donor:
// lifecycle, allocation, and misuse that must give clear errors.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "farmem/farmem.h"
#include "pager/uffd.h"

namespace {

#define SKIP_WITHOUT_UFFD()                                                      \
  do {                                                                           \
    std::string why_ = farmem::Uffd::unavailable_reason();                       \
    if (!why_.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why_; \
  } while (0)

bool contains(const char* haystack, const char* needle) {
  return strstr(haystack, needle) != nullptr;
}

class FmApi : public ::testing::Test {
 protected:
  void start(uint64_t local_mem = 8 << 20) {
    fm_config c;
    fm_config_init(&c);
    c.transport = "loopback";
    c.loopback_capacity = 256ull << 20;
    c.local_mem = local_mem;
    c.pager_threads = 2;
    ASSERT_EQ(fm_init(&c), 0) << fm_last_error();
  }
  void TearDown() override {
    if (fm_is_running()) {
      EXPECT_EQ(fm_shutdown(), 0);
    }
  }
};

TEST_F(FmApi, NotRunningIsENXIO) {
  ASSERT_FALSE(fm_is_running());
  errno = 0;
  EXPECT_EQ(fm_malloc(100), nullptr);
  EXPECT_EQ(errno, ENXIO);
  EXPECT_TRUE(contains(fm_last_error(), "fm_init")) << fm_last_error();
  fm_stats_t s;
  fm_stats_init(&s);
  EXPECT_EQ(fm_stats(&s), -1);
  EXPECT_EQ(errno, ENXIO);
  EXPECT_EQ(fm_shutdown(), -1);
  EXPECT_EQ(errno, ENXIO);
}

TEST_F(FmApi, BadConfigIsEINVAL) {
  fm_config c;
  fm_config_init(&c);
  c.transport = "carrier-pigeon";
  EXPECT_EQ(fm_init(&c), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(contains(fm_last_error(), "carrier-pigeon")) << fm_last_error();
  fm_config_init(&c);
  c.struct_size = 8;
  EXPECT_EQ(fm_init(&c), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(contains(fm_last_error(), "fm_config_init")) << fm_last_error();
  fm_config_init(&c);
  c.servers = "127.0.0.1:notaport";
  EXPECT_EQ(fm_init(&c), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(FmApi, UnreachableDonorIsECONNREFUSED) {
  fm_config c;
  fm_config_init(&c);
  c.servers = "127.0.0.1:1";  // nothing listens on port 1
  c.connect_timeout_ms = 1000;
  EXPECT_EQ(fm_init(&c), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  EXPECT_TRUE(contains(fm_last_error(), "127.0.0.1:1")) << fm_last_error();
  EXPECT_FALSE(fm_is_running());
}

// fm_stats_t is extensible: fm_stats() fills as much as both sides know,
// says how much in struct_size, and refuses a struct nobody initialised.
TEST_F(FmApi, StatsStructSizeIsHonoured) {
  fm_stats_t zeroed;
  memset(&zeroed, 0, sizeof zeroed);
  errno = 0;
  EXPECT_EQ(fm_stats(&zeroed), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(contains(fm_last_error(), "struct_size is 0")) << fm_last_error();
  EXPECT_TRUE(contains(fm_last_error(), "fm_stats_init")) << fm_last_error();
  EXPECT_EQ(fm_stats(nullptr), -1);
  EXPECT_EQ(errno, EINVAL);

  SKIP_WITHOUT_UFFD();
  start();
  void* p = fm_malloc(1 << 20);
  ASSERT_NE(p, nullptr);
  fm_stats_t full;
  fm_stats_init(&full);
  ASSERT_EQ(fm_stats(&full), 0) << fm_last_error();
  EXPECT_EQ(full.struct_size, sizeof full);

  // A caller built against the first header: only its fields are written.
  fm_stats_t old;
  memset(&old, 0xab, sizeof old);
  old.struct_size = FM_STATS_SIZE_V1;
  ASSERT_EQ(fm_stats(&old), 0) << fm_last_error();
  EXPECT_EQ(old.struct_size, FM_STATS_SIZE_V1);
  EXPECT_EQ(old.budget_bytes, full.budget_bytes);
  EXPECT_EQ(old.region_size, full.region_size);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&old);
  for (size_t i = FM_STATS_SIZE_V1; i < sizeof old; ++i) {
    ASSERT_EQ(bytes[i], 0xab) << "byte " << i << " past the caller's struct was written";
  }
  // One byte short of the first version is refused.
  old.struct_size = FM_STATS_SIZE_V1 - 1;
  EXPECT_EQ(fm_stats(&old), -1);
  EXPECT_EQ(errno, EINVAL);

  // A caller built against a newer header with more fields: the library
  // fills what it knows, leaves the rest, and says how much it filled.
  struct Newer {
    fm_stats_t s;
    uint64_t more[3];
  } newer;
  memset(&newer, 0xcd, sizeof newer);
  newer.s.struct_size = sizeof newer;
  ASSERT_EQ(fm_stats(&newer.s), 0) << fm_last_error();
  EXPECT_EQ(newer.s.struct_size, sizeof(fm_stats_t));
  EXPECT_EQ(newer.s.populated_bytes, full.populated_bytes);
  for (uint64_t m : newer.more) EXPECT_EQ(m, 0xcdcdcdcdcdcdcdcdull);
  fm_free(p);
}

TEST_F(FmApi, AllocateUseFree) {
  SKIP_WITHOUT_UFFD();
  start();
  fm_config c;
  fm_config_init(&c);
  c.transport = "loopback";
  EXPECT_EQ(fm_init(&c), -1);
  EXPECT_EQ(errno, EALREADY);

  // 32 MiB through an 8 MiB budget, byte-exact.
  constexpr size_t kN = 32 << 20;
  auto* p = static_cast<uint8_t*>(fm_malloc(kN));
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(fm_is_far(p));
  for (size_t i = 0; i < kN; ++i) p[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(p[i], static_cast<uint8_t>(i * 2654435761u >> 24)) << "byte " << i;
  }
  EXPECT_GE(fm_usable_size(p), kN);
  fm_stats_t s;
  fm_stats_init(&s);
  ASSERT_EQ(fm_stats(&s), 0);
  EXPECT_GT(s.evictions_dirty, 0u);
  EXPECT_GT(s.faults_remote, 0u);
  EXPECT_LE(s.resident_peak_bytes, s.budget_bytes);
  EXPECT_EQ(s.budget_bytes, 8u << 20);
  EXPECT_GE(s.far_allocated, kN);
  EXPECT_EQ(s.struct_size, sizeof s);
  // The fields after FM_STATS_SIZE_V1: the first 256 KiB of the allocation
  // were mapped when it was made (FARMEM_POPULATE_MAX), the sequential
  // first touches of the rest mapped neighbours with them, and the
  // sequential read back of evicted pages read ahead.
  EXPECT_EQ(s.populated_bytes, 256u << 10);
  EXPECT_GT(s.zero_around, 0u);
  EXPECT_GT(s.prefetch_issued, 0u);
  EXPECT_LE(s.prefetch_used + s.prefetch_unused, s.prefetch_issued);
  EXPECT_EQ(s.pinned_bytes, 0u);

  auto* z = static_cast<uint64_t*>(fm_calloc(1 << 20, sizeof(uint64_t)));
  ASSERT_NE(z, nullptr);
  for (size_t i = 0; i < (1u << 20); ++i) ASSERT_EQ(z[i], 0u);
  z = static_cast<uint64_t*>(fm_realloc(z, 16 << 20));
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z[12345], 0u);
  void* a = fm_aligned_alloc(1 << 16, 1000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % (1 << 16), 0u);
  fm_free(a);
  fm_free(z);
  fm_free(p);
  fm_free(nullptr);
  EXPECT_EQ(fm_realloc(fm_malloc(10), 0), nullptr) << "size 0 frees";
  ASSERT_EQ(fm_stats(&s), 0);
  EXPECT_EQ(s.far_allocated, 0u);
}

TEST_F(FmApi, MisuseGivesClearErrors) {
  SKIP_WITHOUT_UFFD();
  start();
  int local = 0;
  // fm_free of memory that is not far: reported, left alone.
  void* m = malloc(64);
  errno = 0;
  ::testing::internal::CaptureStderr();
  fm_free(m);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(errno, EINVAL);
  EXPECT_TRUE(contains(err.c_str(), "not far memory")) << err;
  EXPECT_TRUE(contains(err.c_str(), "free()")) << err;
  free(m);  // still valid: fm_free did not touch it

  // Sizes that overflow.
  errno = 0;
  EXPECT_EQ(fm_calloc(SIZE_MAX / 2, 3), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_TRUE(contains(fm_last_error(), "overflows")) << fm_last_error();
  errno = 0;
  EXPECT_EQ(fm_malloc(SIZE_MAX), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(fm_malloc(1ull << 40), nullptr) << "larger than the region";
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(fm_aligned_alloc(3, 100), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(fm_aligned_alloc(0, 100), nullptr);
  EXPECT_EQ(errno, EINVAL);

  // Pointers that are not far memory.
  errno = 0;
  EXPECT_EQ(fm_realloc(&local, 100), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(local, 0);
  errno = 0;
  EXPECT_EQ(fm_usable_size(&local), 0u);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_FALSE(fm_is_far(&local));

  // Hints: the range must be far memory; advice is accepted, pin is not yet.
  void* p = fm_malloc(1 << 20);
  ASSERT_NE(p, nullptr);
  errno = 0;
  EXPECT_EQ(fm_prefetch(&local, 4), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(fm_evict(p, SIZE_MAX), -1) << "range past the region";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(fm_prefetch(p, 1 << 20), 0);
  EXPECT_EQ(fm_evict(p, 1 << 20), 0);
  EXPECT_EQ(fm_pin(p, 4096), 0) << fm_last_error();
  EXPECT_EQ(fm_unpin(p, 4096), 0) << fm_last_error();
  EXPECT_EQ(fm_unpin(p, 4096), -1) << "not pinned any more";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(fm_prefetch(p, 0), 0);
  fm_free(p);
}

TEST_F(FmApi, ShutdownAndRestart) {
  SKIP_WITHOUT_UFFD();
  start();
  void* p = fm_malloc(1 << 20);
  ASSERT_NE(p, nullptr);
  memset(p, 3, 1 << 20);
  fm_free(p);
  ASSERT_EQ(fm_shutdown(), 0);
  EXPECT_FALSE(fm_is_running());
  start(16 << 20);
  void* q = fm_malloc(1 << 20);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(static_cast<uint8_t*>(q)[100], 0) << "a new heap reads as zeros";
  fm_free(q);
}

}  // namespace
