// The pager against a real donor over tcp: DonorServer (the code farmemd
// runs) on 127.0.0.1:0 with a token, a DonorSession, TcpTransport.
// Integrity with many eviction cycles from 1, 2 and 8 threads, resident
// bytes sampled against the budget during the run (invariant 5), and
// never-written pages served without any transport op (invariant 2), as on
// loopback (pager_test.cc).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "pager/pager.h"
#include "pager/remote_map.h"
#include "pager/uffd.h"
#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/tcp_transport.h"

namespace farmem {
namespace {

constexpr size_t kPage = 4096;
using TP = Pager<TcpTransport>;

// Pages of [p, p+len) mapped right now (mincore): the kernel's view of the
// pager's resident counter.
size_t mapped_pages(void* p, size_t len) {
  std::vector<unsigned char> v(len / kPage);
  if (mincore(p, len, v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

// A donor on 127.0.0.1:0, a session and a transport; torn down in reverse.
class TcpDonorRig {
 public:
  void start() {
    DonorOptions o;
    o.listen = {"127.0.0.1", 0};
    o.capacity = 64ull << 20;
    o.slab_size = 1ull << 20;
    o.token = "pager-tcp-test-token";
    o.try_hugepages = false;
    auto srv = DonorServer::start(o);
    ASSERT_TRUE(srv.ok()) << srv.status().to_string();
    server_ = std::move(*srv);
    DonorClientOptions co;
    co.server = {"127.0.0.1", server_->port()};
    co.token = o.token;
    auto session = DonorSession::connect(co);
    ASSERT_TRUE(session.ok()) << session.status().to_string();
    session_ = std::move(*session);
    transport_ = std::make_unique<TcpTransport>();
    ASSERT_TRUE(transport_->add_server(0, session_.get()).ok());
    src_ = std::make_unique<DonorSessionSlabSource>(0, session_.get());
  }
  ~TcpDonorRig() {
    src_.reset();
    transport_.reset();
    session_.reset();
    if (server_) server_->stop();
  }
  TcpTransport* transport() { return transport_.get(); }
  SlabSource* source() { return src_.get(); }
  DonorSession& session() { return *session_; }

 private:
  std::unique_ptr<DonorServer> server_;
  std::unique_ptr<DonorSession> session_;
  std::unique_ptr<TcpTransport> transport_;
  std::unique_ptr<DonorSessionSlabSource> src_;
};

#define SKIP_WITHOUT_UFFD()                                                    \
  do {                                                                         \
    std::string why = Uffd::unavailable_reason();                              \
    if (!why.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why; \
  } while (0)

class PagerTcpIntegrityTest : public ::testing::TestWithParam<int> {};

// Region ten times the budget; random reads and writes from N threads, each
// owning the pages p % N == t, checked against a reference copy; the
// resident bytes are sampled (counter and mincore) and never exceed the
// budget plus the documented slack.
TEST_P(PagerTcpIntegrityTest, RandomReadWriteMatchesReference) {
  SKIP_WITHOUT_UFFD();
  const int threads = GetParam();
  TcpDonorRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.start());
  const size_t budget_pages = 512, region_pages = 10 * budget_pages;
  PagerConfig c;
  c.local_budget = budget_pages * kPage;
  c.region_size = region_pages * kPage;
  c.handler_threads = 2;
  auto pr = TP::create(c, rig.transport(), rig.source());
  ASSERT_TRUE(pr.ok()) << pr.status().to_string();
  TP& p = **pr;
  auto* mem = static_cast<uint8_t*>(p.base());
  std::vector<uint8_t> ref(region_pages * kPage, 0);

  std::atomic<bool> done{false};
  std::atomic<uint64_t> max_counter{0}, max_mapped{0}, samples{0};
  std::thread sampler([&] {
    while (!done.load()) {
      const uint64_t r = p.resident_bytes();
      const uint64_t m = mapped_pages(mem, region_pages * kPage) * kPage;
      if (r > max_counter) max_counter = r;
      if (m > max_mapped) max_mapped = m;
      ++samples;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  const int ops = 8000;
  std::vector<std::thread> ts;
  std::atomic<uint64_t> mismatches{0};
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(99 + t);
      const size_t mine = region_pages / threads;
      for (int i = 0; i < ops / threads; ++i) {
        size_t pg = (rng() % mine) * threads + t;
        size_t off = pg * kPage + (rng() % (kPage / 8)) * 8;
        if (rng() % 2) {
          if (memcmp(mem + pg * kPage, ref.data() + pg * kPage, kPage) != 0) ++mismatches;
        } else {
          uint64_t v;
          memcpy(&v, mem + off, 8);
          v = v * 31 + rng();
          memcpy(mem + off, &v, 8);
          memcpy(ref.data() + off, &v, 8);
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  done = true;
  sampler.join();
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_EQ(memcmp(mem, ref.data(), ref.size()), 0) << "final image differs";
  const PagerStats s = p.stats();
  const uint64_t budget = budget_pages * kPage;
  EXPECT_LE(max_counter.load(), budget + TP::kSlackBytes);
  EXPECT_LE(max_mapped.load(), budget + TP::kSlackBytes);
  EXPECT_LE(s.resident_peak_bytes, budget + TP::kSlackBytes);
  EXPECT_GT(samples.load(), 10u);
  // Many eviction cycles: several budgets' worth of write-backs and fetches.
  EXPECT_GT(s.evictions_dirty, 2 * budget_pages) << s.to_string();
  EXPECT_GT(s.faults_remote, 2 * budget_pages) << s.to_string();
  EXPECT_EQ(s.writeback_errors, 0u) << s.to_string();
  // The donor served that traffic: at least every demand READ and every
  // completed write-back the pager counted (prefetches and a round in
  // flight may add more on the donor's side).
  auto st = rig.session().stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_GE(st->reads, s.faults_remote) << s.to_string();
  EXPECT_GE(st->writes, s.evictions_dirty) << s.to_string();
}

INSTANTIATE_TEST_SUITE_P(Threads, PagerTcpIntegrityTest, ::testing::Values(1, 2, 8),
                         [](const auto& pinfo) { return std::to_string(pinfo.param) + "threads"; });

// Invariant 2 on tcp: a region ten times the budget, read twice over
// without ever being written: zeros, many evictions, and not one op
// reaches the donor.
TEST(PagerTcpTest, NeverWrittenPagesCauseNoTransportOps) {
  SKIP_WITHOUT_UFFD();
  TcpDonorRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.start());
  const size_t budget = 256, region = 2560;
  PagerConfig c;
  c.local_budget = budget * kPage;
  c.region_size = region * kPage;
  c.handler_threads = 2;
  auto pr = TP::create(c, rig.transport(), rig.source());
  ASSERT_TRUE(pr.ok()) << pr.status().to_string();
  TP& p = **pr;
  auto* mem = static_cast<volatile uint8_t*>(p.base());
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t pg = 0; pg < region; ++pg) {
      uint64_t sum = 0;
      for (size_t i = 0; i < kPage; i += 512) sum += mem[pg * kPage + i];
      ASSERT_EQ(sum, 0u) << "page " << pg;
    }
  }
  const PagerStats s = p.stats();
  EXPECT_GE(s.faults_zero, region + region - budget) << s.to_string();
  EXPECT_GT(s.evictions_clean, region) << s.to_string();
  EXPECT_EQ(s.reads, 0u) << s.to_string();
  EXPECT_EQ(s.writes, 0u) << s.to_string();
  EXPECT_EQ(s.remote_bytes, 0u) << s.to_string();
  auto st = rig.session().stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->reads, 0u);
  EXPECT_EQ(st->writes, 0u);
  EXPECT_EQ(st->bytes_read + st->bytes_written, 0u);
}

}  // namespace
}  // namespace farmem
