// WP_ASYNC dirty tracking (config.wp_async, FARMEM_WP_ASYNC; pager.h
// "demote_async"): the kernel resolves first writes to clean blocks, the
// evictor finds them with PAGEMAP_SCAN and demotes by UFFDIO_MOVE. These
// tests run where the kernel has UFFD_FEATURE_WP_ASYNC, PAGEMAP_SCAN and
// UFFDIO_MOVE, and skip elsewhere. The rest of the pager suite runs in this
// mode with FARMEM_TEST_WP_ASYNC=on (see Pager::init).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "tests/pager/pager_harness.h"

namespace farmem::testing {
namespace {

// Skips unless the pager came up in WP_ASYNC mode (kAuto: the kernel has it).
#define FARMEM_SKIP_WITHOUT_WP_ASYNC(p)                                 \
  do {                                                                  \
    if (!(p).uses_wp_async())                                           \
      GTEST_SKIP() << "no WP_ASYNC + PAGEMAP_SCAN + UFFDIO_MOVE here: " \
                   << (p).features().to_string();                       \
  } while (0)

TEST(WpAsyncConfig, ParsedFromTheEnvironment) {
  EXPECT_EQ(PagerConfig{}.wp_async, WpAsyncMode::kOff);  // until measured faster: pager.h
  for (auto [text, mode] :
       {std::pair{"auto", WpAsyncMode::kAuto}, std::pair{"on", WpAsyncMode::kOn},
        std::pair{"off", WpAsyncMode::kOff}}) {
    setenv("FARMEM_WP_ASYNC", text, 1);
    auto c = PagerConfig::from_env(PagerConfig{});
    unsetenv("FARMEM_WP_ASYNC");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->wp_async, mode) << text;
    EXPECT_STREQ(wp_async_name(mode), text);
  }
  setenv("FARMEM_WP_ASYNC", "maybe", 1);
  auto bad = PagerConfig::from_env(PagerConfig{});
  unsetenv("FARMEM_WP_ASYNC");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("FARMEM_WP_ASYNC=maybe"), std::string::npos);
}

TEST(PagemapScan, ReportsWrittenPagesAndReprotects) {
  FARMEM_SKIP_WITHOUT_UFFD();
  LoopbackRig rig;
  PagerConfig c = small_config(256, 1024);
  c.wp_async = WpAsyncMode::kAuto;
  c.prefetch = false;
  P& p = rig.start(c);
  FARMEM_SKIP_WITHOUT_WP_ASYNC(p);
  auto pm = PagemapScan::open();
  ASSERT_TRUE(pm.ok()) << pm.status().to_string();
  auto* mem = static_cast<volatile uint8_t*>(p.base());
  for (size_t pg = 0; pg < 8; ++pg) (void)mem[pg * kPage];  // read faults: installed protected
  PagemapScan::Range r[8];
  EXPECT_EQ(pm->written(p.base(), 8 * kPage, r, 8, false), 0);
  mem[3 * kPage + 5] = 1;  // resolved by the kernel: no WP fault reaches the pager
  mem[4 * kPage] = 2;
  ASSERT_EQ(pm->written(p.base(), 8 * kPage, r, 8, false), 1);
  const auto base = reinterpret_cast<uintptr_t>(p.base());
  EXPECT_EQ(r[0].start, base + 3 * kPage);
  EXPECT_EQ(r[0].end, base + 5 * kPage);
  EXPECT_EQ(p.stats().faults_wp, 0u);
  EXPECT_EQ(pm->written(p.base(), 8 * kPage, r, 8, /*reprotect=*/true), 1);
  EXPECT_EQ(pm->written(p.base(), 8 * kPage, r, 8, false), 0);  // protected again
  EXPECT_EQ(mem[3 * kPage + 5], 1);
}

TEST(WpAsyncConfig, OffLeavesTheDescriptorSynchronous) {
  FARMEM_SKIP_WITHOUT_UFFD();
  if (getenv("FARMEM_TEST_WP_ASYNC")) GTEST_SKIP() << "FARMEM_TEST_WP_ASYNC overrides the mode";
  LoopbackRig rig;
  PagerConfig c = small_config(256, 1024);
  c.wp_async = WpAsyncMode::kOff;
  P& p = rig.start(c);
  EXPECT_FALSE(p.uses_wp_async());
  auto* mem = static_cast<volatile uint8_t*>(p.base());
  (void)mem[0];
  mem[1] = 1;  // a WP fault served by a handler
  EXPECT_TRUE(wait_until([&] { return p.stats().faults_wp == 1; }));  // counted after the wake
}

// The integrity workload (random 8-byte read-modify-writes and whole-page
// compares from several threads, a region ten times the budget) in WP_ASYNC
// mode: byte-exact after many eviction cycles, and the written blocks were
// found by PAGEMAP_SCAN or the snapshot compare (faults_wp counts them).
TEST(WpAsyncIntegrity, RandomReadWriteMatchesReference) {
  FARMEM_SKIP_WITHOUT_UFFD();
  const size_t budget_pages = 512, region_pages = 10 * budget_pages;
  LoopbackRig rig;
  PagerConfig c = small_config(budget_pages, region_pages);
  c.wp_async = WpAsyncMode::kAuto;
  P& p = rig.start(c);
  FARMEM_SKIP_WITHOUT_WP_ASYNC(p);
  auto* mem = static_cast<uint8_t*>(p.base());
  std::vector<uint8_t> ref(region_pages * kPage, 0);
  IntegrityWorkload w{.threads = 2, .ops = 20000, .seed = 77};
  EXPECT_EQ(run_integrity_workload(mem, ref, region_pages, w), 0u);
  EXPECT_EQ(memcmp(mem, ref.data(), ref.size()), 0) << "final image differs";
  PagerStats s = p.stats();
  EXPECT_GT(s.evictions_dirty, 3 * budget_pages) << s.to_string();
  EXPECT_GT(s.faults_wp, 3 * budget_pages) << s.to_string();
  EXPECT_GT(s.demotions, 3 * budget_pages) << s.to_string();
  EXPECT_EQ(s.move_fallbacks, 0u) << s.to_string();
  EXPECT_LE(s.resident_peak_bytes, budget_pages * kPage + P::kSlackBytes);
}

// A block written while it is being demoted is never lost: writer threads
// hammer a few pages (each word holds an increasing counter), while evict()
// and budget pressure from a reader push those pages out over and over.
// Every value read back must be the last one written, and the final image
// must match the reference. The writers run for 3 s and then until the
// pager has counted enough dirty evictions (up to 60 s): how many fit in
// 3 s depends on the machine's load (ASan, ctest -j2 beside builds), what
// the test asserts does not.
TEST(WpAsyncIntegrity, WritesRacingDemotionAreNeverLost) {
  FARMEM_SKIP_WITHOUT_UFFD();
  const size_t budget_pages = 128, region_pages = 1024, hot = 8;
  LoopbackRig rig;
  PagerConfig c = small_config(budget_pages, region_pages);
  c.wp_async = WpAsyncMode::kAuto;
  c.prefetch = false;
  P& p = rig.start(c);
  FARMEM_SKIP_WITHOUT_WP_ASYNC(p);
  auto* mem = static_cast<uint8_t*>(p.base());
  std::vector<uint64_t> ref(hot * kPage / 8, 0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lost{0}, evicts{0};
  constexpr uint64_t kEnough = 300;  // dirty evictions (and evict() calls) the test wants
  const auto start = std::chrono::steady_clock::now();
  const auto min_end = start + std::chrono::seconds(3), max_end = start + std::chrono::seconds(60);
  auto done = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (now < min_end) return false;
    if (now >= max_end) return true;  // the assertions below say what fell short
    return evicts.load() > kEnough && p.stats().evictions_dirty > kEnough;
  };
  // Each writer owns hot pages w, w+2, ...: reads a word, checks it, stores +1.
  auto writer = [&](size_t w) {
    std::mt19937_64 rng(w + 5);
    for (int i = 0; (i & 1023) != 0 || !done(); ++i) {
      const size_t pg = (rng() % (hot / 2)) * 2 + w;
      const size_t word = pg * (kPage / 8) + rng() % (kPage / 8);
      auto* at = reinterpret_cast<volatile uint64_t*>(mem) + word;
      if (*at != ref[word]) ++lost;
      *at = ref[word] + 1;
      ref[word] += 1;
    }
  };
  std::thread evictor([&] {
    while (!stop.load()) {
      for (size_t pg = 0; pg < hot; ++pg) {
        EXPECT_TRUE(p.evict(mem + pg * kPage, kPage).ok());
        ++evicts;
      }
    }
  });
  std::thread pressure([&] {  // reads the cold pages: the evictor demotes the hot ones too
    for (size_t pg = hot; !stop.load(); pg = pg + 1 < region_pages ? pg + 1 : hot) {
      (void)*reinterpret_cast<volatile uint8_t*>(mem + pg * kPage);
    }
  });
  std::thread w0(writer, 0), w1(writer, 1);
  w0.join();
  w1.join();
  stop = true;
  evictor.join();
  pressure.join();
  EXPECT_EQ(lost.load(), 0u);
  EXPECT_EQ(memcmp(mem, ref.data(), hot * kPage), 0) << "final image differs";
  PagerStats s = p.stats();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("racing demotion: %.1f s, %llu evict() calls\n%s\n", secs,
              static_cast<unsigned long long>(evicts.load()), s.to_string().c_str());
  EXPECT_GT(evicts.load(), kEnough);
  EXPECT_GT(s.evictions_dirty, kEnough) << s.to_string();
  EXPECT_EQ(s.writeback_errors, 0u);
}

}  // namespace
}  // namespace farmem::testing
