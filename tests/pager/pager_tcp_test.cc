// The pager against a real donor over tcp: DonorServer on 127.0.0.1 with a
// token, a DonorSession, TcpTransport. Integrity with eviction cycles and
// the budget check, as on loopback.
#include <gtest/gtest.h>

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

TEST(PagerTcpTest, IntegrityAgainstRealDonor) {
  std::string why = Uffd::unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why;
  DonorOptions o;
  o.listen = {"127.0.0.1", 0};
  o.capacity = 64ull << 20;
  o.slab_size = 1ull << 20;
  o.token = "pager-tcp-test-token";
  auto srv = DonorServer::start(o);
  ASSERT_TRUE(srv.ok()) << srv.status().to_string();
  DonorClientOptions co;
  co.server = {"127.0.0.1", (*srv)->port()};
  co.token = o.token;
  auto session = DonorSession::connect(co);
  ASSERT_TRUE(session.ok()) << session.status().to_string();
  {
    TcpTransport transport;
    ASSERT_TRUE(transport.add_server(0, session->get()).ok());
    DonorSessionSlabSource src(0, session->get());
    const size_t budget_pages = 512, region_pages = 10 * budget_pages;
    PagerConfig c;
    c.local_budget = budget_pages * kPage;
    c.region_size = region_pages * kPage;
    c.handler_threads = 2;
    auto pr = TP::create(c, &transport, &src);
    ASSERT_TRUE(pr.ok()) << pr.status().to_string();
    TP& p = **pr;
    auto* mem = static_cast<uint8_t*>(p.base());
    std::vector<uint8_t> ref(region_pages * kPage, 0);
    const int threads = 2, ops = 6000;
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
    EXPECT_EQ(mismatches.load(), 0u);
    EXPECT_EQ(memcmp(mem, ref.data(), ref.size()), 0);
    PagerStats s = p.stats();
    EXPECT_LE(s.resident_peak_bytes, budget_pages * kPage + TP::kSlackBytes);
    EXPECT_GT(s.evictions_dirty, 2 * budget_pages) << s.to_string();
    EXPECT_GT(s.faults_remote, 2 * budget_pages) << s.to_string();
    // The donor saw the traffic.
    auto st = (*session)->stats();
    ASSERT_TRUE(st.ok());
  }
  (*srv)->stop();
}

}  // namespace
}  // namespace farmem
