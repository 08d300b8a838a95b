// Replication against real donors (issue 7): three farmemd processes
// (FARMEMD_PATH) on 127.0.0.1, the far runtime over tcp with
// FARMEM_REPLICAS=2, donors SIGKILLed mid-run, and a donor restarted empty
// at the same port.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "allocator/far_runtime.h"
#include "pager/uffd.h"
#include "runtime/stats_socket.h"
#include "tests/pager/integrity_workload.h"

#ifndef FARMEMD_PATH
#error "FARMEMD_PATH must name the farmemd binary"
#endif

namespace farmem {
namespace {

constexpr size_t kPage = 4096;

// One farmemd process; port 0 picks a free port, read from its first line.
class Daemon {
 public:
  explicit Daemon(uint16_t port = 0) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) abort();
    const std::string listen = "127.0.0.1:" + std::to_string(port);
    const char* argv[] = {FARMEMD_PATH,  "--listen", listen.c_str(), "--capacity", "64M",
                          "--slab-size", "1M",       "--insecure",   nullptr};
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, 2);
      execv(FARMEMD_PATH, const_cast<char* const*>(argv));
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
    // "farmemd listening on 127.0.0.1:PORT, ..."
    std::string text;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (text.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[512];
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    size_t at = text.find("127.0.0.1:");
    if (at != std::string::npos) port_ = static_cast<uint16_t>(atoi(text.c_str() + at + 10));
  }
  ~Daemon() {
    kill_now();
    if (fd_ >= 0) close(fd_);
  }
  void kill_now() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  uint16_t port() const { return port_; }
  Endpoint endpoint() const { return Endpoint{"127.0.0.1", port_}; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  uint16_t port_ = 0;
};

FarOptions options(const std::vector<Endpoint>& servers) {
  FarOptions o;
  o.transport = FarTransport::kTcp;
  o.servers = servers;
  o.replicas = 2;
  o.region_size = 64ull << 20;
  o.pager.local_budget = 2ull << 20;
  o.pager.handler_threads = 2;
  o.stats_socket = false;
  o.decay_ms = 0;
  return o;
}

uint64_t stat(FarRuntime& rt, const char* name) {
  StatsSnapshot s;
  rt.fill_stats(s);
  return s.value(name);
}

template <class F>
bool wait_for(F pred, int ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The shared integrity workload (tests/pager/integrity_workload.h) from two
// threads, one op in three a page compare; `at` runs once half-way, while
// they go on.
template <class F>
uint64_t workload(uint8_t* mem, std::vector<uint8_t>& ref, size_t pages, int ops, uint64_t seed,
                  F at) {
  const testing::IntegrityWorkload w{.threads = 2, .ops = ops, .seed = seed, .writes = 2};
  return testing::run_integrity_workload(mem, ref, pages, w, at);
}

// `pages` pages of pseudo-random bytes from `seed`: the reference image a
// test copies into far memory and checks against.
std::vector<uint8_t> random_image(size_t pages, uint64_t seed) {
  std::vector<uint8_t> ref(pages * kPage);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < ref.size(); i += 8) {
    uint64_t v = rng();
    memcpy(ref.data() + i, &v, 8);
  }
  return ref;
}

#define SKIP_WITHOUT_UFFD()                                                      \
  do {                                                                           \
    std::string why_ = ::farmem::Uffd::unavailable_reason();                     \
    if (!why_.empty()) GTEST_SKIP() << "userfaultfd unavailable here: " << why_; \
  } while (0)

TEST(ReplicationTcpTest, TwoDonorsSigkilledOneAfterTheOtherNothingLost) {
  SKIP_WITHOUT_UFFD();
  Daemon d0, d1, d2;
  ASSERT_NE(d0.port(), 0);
  ASSERT_NE(d1.port(), 0);
  ASSERT_NE(d2.port(), 0);
  auto rt = FarRuntime::start(options({d0.endpoint(), d1.endpoint(), d2.endpoint()}));
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  const size_t pages = 4096;  // 16 MiB, eight times the local budget
  auto* mem = static_cast<uint8_t*>((*rt)->heap().alloc(pages * kPage));
  ASSERT_NE(mem, nullptr);
  std::vector<uint8_t> ref = random_image(pages, 1);
  memcpy(mem, ref.data(), ref.size());

  EXPECT_EQ(workload(mem, ref, pages, 12000, 3, [&] { d1.kill_now(); }), 0u);
  ASSERT_EQ(memcmp(mem, ref.data(), ref.size()), 0) << "after the first SIGKILL";
  ASSERT_TRUE(wait_for(
      [&] {
        return stat(**rt, "donors_failed") == 1 && stat(**rt, "extents_degraded") == 0 &&
               stat(**rt, "extents_restored") > 0;
      },
      30000))
      << "re-replication did not finish: degraded " << stat(**rt, "extents_degraded");
  EXPECT_GT(stat(**rt, "bytes_restored"), 0u);

  EXPECT_EQ(workload(mem, ref, pages, 12000, 4, [&] { d0.kill_now(); }), 0u);
  ASSERT_EQ(memcmp(mem, ref.data(), ref.size()), 0) << "after the second SIGKILL";
  EXPECT_TRUE(wait_for([&] { return stat(**rt, "donors_failed") == 2; }, 10000));
  EXPECT_EQ(stat(**rt, "extents_lost"), 0u);
  EXPECT_GT(stat(**rt, "evictions_dirty"), 2 * 512u);
  (*rt)->heap().free(mem);
}

// A donor SIGKILLed and restarted empty at the same port: the runtime
// reconnects, sees a new instance id, and takes it as a new donor (it may
// receive new replicas) but never reads the old slabs there. Had it been
// mistaken for the old one, reads of the old (slab, offset) pairs would hit
// the restarted donor's fresh slabs (the same small ids, leased again for
// the re-replicated copies) and the data would differ.
TEST(ReplicationTcpTest, DonorRestartedEmptyAtSamePortIsANewDonor) {
  SKIP_WITHOUT_UFFD();
  Daemon d0, d1;
  auto d2 = std::make_unique<Daemon>();
  ASSERT_NE(d2->port(), 0);
  const uint16_t port2 = d2->port();
  auto rt = FarRuntime::start(options({d0.endpoint(), d1.endpoint(), d2->endpoint()}));
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  const size_t pages = 2048;
  auto* mem = static_cast<uint8_t*>((*rt)->heap().alloc(pages * kPage));
  ASSERT_NE(mem, nullptr);
  std::vector<uint8_t> ref = random_image(pages, 2);
  memcpy(mem, ref.data(), ref.size());
  ASSERT_TRUE(wait_for([&] { return stat(**rt, "evictions_dirty") > 1024; }, 10000));

  d2->kill_now();
  d2 = std::make_unique<Daemon>(port2);  // empty, same address
  ASSERT_EQ(d2->port(), port2) << "farmemd could not listen on its old port again";
  ASSERT_TRUE(wait_for([&] { return stat(**rt, "donor_restarts") == 1; }, 20000))
      << "rejoins " << stat(**rt, "donor_rejoins") << ", failed " << stat(**rt, "donors_failed");
  EXPECT_EQ(stat(**rt, "donor_rejoins"), 1u);
  // The health check counts the restart in the same probe that found the
  // donor dead, and the caller marks it failed in the remote map (the
  // donors_failed count) only after that probe returns: wait for it.
  EXPECT_TRUE(wait_for([&] { return stat(**rt, "donors_failed") == 1; }, 10000))
      << "failed " << stat(**rt, "donors_failed");
  EXPECT_EQ(stat(**rt, "donors_live"), 3u);
  ASSERT_TRUE(wait_for([&] { return stat(**rt, "extents_degraded") == 0; }, 30000));
  // Everything still reads back, through every donor (new replicas may be
  // on the restarted one).
  EXPECT_EQ(workload(mem, ref, pages, 6000, 5, [] {}), 0u);
  EXPECT_EQ(memcmp(mem, ref.data(), ref.size()), 0);
  // Now the two original donors go: the copies on the restarted donor (and
  // what remains) must serve everything the others held... d1 alone is
  // killed so that every extent keeps one copy.
  d1.kill_now();
  EXPECT_EQ(memcmp(mem, ref.data(), ref.size()), 0);
  EXPECT_EQ(stat(**rt, "extents_lost"), 0u);
  (*rt)->heap().free(mem);
}

// More replicas than donors is a start-up error that says what to change.
TEST(ReplicationOptions, MoreReplicasThanServersIsAStartupError) {
  setenv("FARMEM_SERVERS", "127.0.0.1:7401,127.0.0.1:7402", 1);
  setenv("FARMEM_REPLICAS", "3", 1);
  auto o = options_from_env();
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(o.status().message().find("FARMEM_REPLICAS=3 needs at least 3 donors"),
            std::string::npos)
      << o.status().to_string();
  setenv("FARMEM_REPLICAS", "4", 1);
  EXPECT_FALSE(options_from_env().ok());
  setenv("FARMEM_REPLICAS", "2", 1);
  auto ok = options_from_env();
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->replicas, 2u);
  unsetenv("FARMEM_SERVERS");
  unsetenv("FARMEM_REPLICAS");
  // The struct path (fm_init with a config) is checked at start too.
  FarOptions f = options({Endpoint{"127.0.0.1", 7401}});
  auto rt = FarRuntime::start(f);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.status().message().find("FARMEM_REPLICAS=2 needs 2 donors"), std::string::npos)
      << rt.status().to_string();
}

}  // namespace
}  // namespace farmem
