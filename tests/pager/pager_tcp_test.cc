// The pager against a real donor over tcp: DonorServer (the code farmemd
// runs) on 127.0.0.1:0 with a token, a DonorSession, TcpTransport.
// Integrity with many eviction cycles from 1, 2 and 8 threads, resident
// bytes sampled against the budget during the run (invariant 5), and
// never-written pages served without any transport op (invariant 2), as on
// loopback (pager_test.cc).
#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/tcp_transport.h"
#include "tests/pager/pager_harness.h"
#include "tests/runtime/local_donor.h"

namespace farmem::testing {
namespace {

using TP = Pager<TcpTransport>;

// A donor on 127.0.0.1:0, a session and a transport; torn down in reverse.
class TcpDonorRig {
 public:
  // local: the donor lets this process read and write its slabs one-sided
  // (tcp_transport.cc "Local donors"); otherwise every op is on the wire.
  void start(bool local = false) {
    auto d = LocalDonor::start(
        local_donor_options("pager-tcp-test-token", 64ull << 20, 1ull << 20, local));
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    donor_ = std::move(*d);
    transport_ = std::make_unique<TcpTransport>();
    ASSERT_TRUE(transport_->add_server(0, donor_->session()).ok());
    src_ = std::make_unique<DonorSessionSlabSource>(0, donor_->session());
  }
  ~TcpDonorRig() {
    src_.reset();
    transport_.reset();
    donor_.reset();
  }
  TcpTransport* transport() { return transport_.get(); }
  SlabSource* source() { return src_.get(); }
  DonorSession& session() { return *donor_->session(); }

 private:
  std::unique_ptr<LocalDonor> donor_;
  std::unique_ptr<TcpTransport> transport_;
  std::unique_ptr<DonorSessionSlabSource> src_;
};

// threads, and whether the donor (on this host) serves one-sided.
struct IntegrityCase {
  int threads;
  bool local;
  friend void PrintTo(const IntegrityCase& c, std::ostream* os) {
    *os << c.threads << " threads" << (c.local ? ", one-sided" : ", on the wire");
  }
};

class PagerTcpIntegrityTest : public ::testing::TestWithParam<IntegrityCase> {};

// Region ten times the budget; random reads and writes from N threads, each
// owning the pages p % N == t, checked against a reference copy; the
// resident bytes are sampled (counter and mincore) and never exceed the
// budget plus the documented slack. On the wire, the donor served every
// READ and WRITE; one-sided ("Local donors" in tcp_transport.cc), every
// slab went through its view and the donor's data connections carried
// nothing.
TEST_P(PagerTcpIntegrityTest, RandomReadWriteMatchesReference) {
  FARMEM_SKIP_WITHOUT_UFFD();
  const auto [threads, local] = GetParam();
  if (local && !one_sided_allowed()) GTEST_SKIP() << "process_vm_readv is not allowed here";
  TcpDonorRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.start(local));
  const size_t budget_pages = 512, region_pages = 10 * budget_pages;
  auto pr = TP::create(zero_page_config(budget_pages, region_pages), rig.transport(), rig.source());
  ASSERT_TRUE(pr.ok()) << pr.status().to_string();
  TP& p = **pr;
  auto* mem = static_cast<uint8_t*>(p.base());
  std::vector<uint8_t> ref(region_pages * kPage, 0);

  ResidentSampler sampler([&] { return p.resident_bytes(); }, mem, region_pages * kPage);
  const uint64_t mismatches =
      run_integrity_workload(mem, ref, region_pages, {.threads = threads, .ops = 8000, .seed = 99});
  sampler.stop();
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(memcmp(mem, ref.data(), ref.size()), 0) << "final image differs";
  const PagerStats s = p.stats();
  const uint64_t budget = budget_pages * kPage;
  EXPECT_LE(sampler.max_counter(), budget + TP::kSlackBytes);
  EXPECT_LE(sampler.max_mapped(), budget + TP::kSlackBytes);
  EXPECT_LE(s.resident_peak_bytes, budget + TP::kSlackBytes);
  EXPECT_GT(sampler.samples(), 10u);
  // Many eviction cycles: several budgets' worth of write-backs and fetches.
  EXPECT_GT(s.evictions_dirty, 2 * budget_pages) << s.to_string();
  EXPECT_GT(s.faults_remote, 2 * budget_pages) << s.to_string();
  EXPECT_EQ(s.writeback_errors, 0u) << s.to_string();
  auto st = rig.session().stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  if (local) {
    EXPECT_GT(rig.transport()->local_slabs(), 0u);
    EXPECT_EQ(st->reads, 0u) << "a READ went over the wire";
    EXPECT_EQ(st->writes, 0u) << "a WRITE went over the wire";
  } else {
    // The donor served that traffic: at least every demand READ and every
    // completed write-back the pager counted (prefetches and a round in
    // flight may add more on the donor's side).
    EXPECT_EQ(rig.transport()->local_slabs(), 0u);
    EXPECT_GE(st->reads, s.faults_remote) << s.to_string();
    EXPECT_GE(st->writes, s.evictions_dirty) << s.to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, PagerTcpIntegrityTest,
                         ::testing::Values(IntegrityCase{1, false}, IntegrityCase{2, false},
                                           IntegrityCase{8, false}, IntegrityCase{1, true},
                                           IntegrityCase{8, true}),
                         [](const auto& pinfo) {
                           return std::to_string(pinfo.param.threads) + "threads" +
                                  (pinfo.param.local ? "OneSided" : "");
                         });

// Invariant 2 on tcp: a region ten times the budget, read twice over
// without ever being written: zeros, many evictions, and not one op
// reaches the donor.
TEST(PagerTcpTest, NeverWrittenPagesCauseNoTransportOps) {
  FARMEM_SKIP_WITHOUT_UFFD();
  TcpDonorRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.start());
  const size_t budget = 256, region = 2560;
  auto pr = TP::create(small_config(budget, region), rig.transport(), rig.source());
  ASSERT_TRUE(pr.ok()) << pr.status().to_string();
  TP& p = **pr;
  ASSERT_EQ(first_nonzero_page_read_twice(p.base(), region), region);
  expect_zero_faults_without_traffic(p.stats(), budget, region);
  auto st = rig.session().stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->reads, 0u);
  EXPECT_EQ(st->writes, 0u);
  EXPECT_EQ(st->bytes_read + st->bytes_written, 0u);
}

}  // namespace
}  // namespace farmem::testing
