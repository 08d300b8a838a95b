// farmemctl (the binary) against a live farmemd (in-process DonorServer)
// and a live far-memory process (this test process, serving its stats
// socket): the figures it prints are the ones the test produced.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/donor_server.h"
#include "runtime/stats_socket.h"
#include "tests/ops/mini_json.h"
#include "tests/runtime/raw_client.h"

#ifdef FARMEM_OPS_WITH_ALLOCATOR
#include "farmem/farmem.h"
#include "pager/uffd.h"
#endif

namespace farmem {
namespace {

constexpr char kToken[] = "farmemctl-test-token";
constexpr uint64_t kSlab = 1 << 20;

struct ToolRun {
  int rc = -1;
  std::string out, err;
};

// Runs farmemctl with `args`; as_uid >= 0 switches to that uid first.
// The farmemctl binary as another uid can run it: the build tree may sit in
// a directory only root can enter (a CI clone under mktemp -d is 0700), so
// the unprivileged runs use a copy in a fresh world-readable directory.
const char* farmemctl_for_other_users() {
  static std::string path = [] {
    char dir[] = "/tmp/farmemctl-bin-XXXXXX";
    if (!mkdtemp(dir) || chmod(dir, 0755) != 0) return std::string(FARMEMCTL_PATH);
    std::string to = std::string(dir) + "/farmemctl";
    std::ifstream src(FARMEMCTL_PATH, std::ios::binary);
    std::ofstream dst(to, std::ios::binary);
    dst << src.rdbuf();
    dst.close();
    if (!dst || chmod(to.c_str(), 0755) != 0) return std::string(FARMEMCTL_PATH);
    static std::string copy_dir;
    copy_dir = dir;
    std::atexit([] {
      unlink((copy_dir + "/farmemctl").c_str());
      rmdir(copy_dir.c_str());
    });
    return to;
  }();
  return path.c_str();
}

ToolRun farmemctl(const std::vector<std::string>& args, int as_uid = -1) {
  const char* bin = as_uid >= 0 ? farmemctl_for_other_users() : FARMEMCTL_PATH;
  char errpath[] = "/tmp/farmemctl-err-XXXXXX";
  int errfd = mkstemp(errpath);
  int p[2];
  if (errfd < 0 || pipe(p) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(errfd, 2);
    close(p[0]);
    close(p[1]);
    if (as_uid >= 0 &&
        (setresgid(as_uid, as_uid, as_uid) != 0 || setresuid(as_uid, as_uid, as_uid) != 0))
      _exit(99);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(bin));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin, argv.data());
    _exit(98);
  }
  close(p[1]);
  ToolRun r;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) r.out.append(buf, static_cast<size_t>(n));
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(errpath);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  close(errfd);
  unlink(errpath);
  return r;
}

std::string hex(uint64_t v) {
  char b[17];
  snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

class Farmemctl : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/farmemctl-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    setenv("XDG_RUNTIME_DIR", dir_.c_str(), 1);
    unsetenv("FARMEM_TOKEN_FILE");
    token_file_ = dir_ + "/token";
    {
      std::ofstream t(token_file_);
      t << kToken << "\n";
    }
    chmod(token_file_.c_str(), 0600);
    DonorOptions o;
    o.listen = {"127.0.0.1", 0};
    o.capacity = 64 * kSlab;
    o.slab_size = kSlab;
    o.token = kToken;
    o.try_hugepages = false;
    o.local_clients = false;  // the per-client traffic counters are the wire's
    auto s = DonorServer::start(o);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    srv_ = std::move(*s);
    addr_ = "127.0.0.1:" + std::to_string(srv_->port());
  }
  void TearDown() override {
    srv_.reset();
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!system(cmd.c_str());
    unsetenv("XDG_RUNTIME_DIR");
  }

  std::string dir_, token_file_, addr_;
  std::unique_ptr<DonorServer> srv_;
};

TEST_F(Farmemctl, StatusShowsLeasesAndTrafficPerClient) {
  test::RawClient a, b, a_data;
  ASSERT_TRUE(a.connect(srv_->port()).ok());
  ASSERT_TRUE(b.connect(srv_->port()).ok());
  auto wa = a.handshake_control(kToken, 0xA1);
  auto wb = b.handshake_control(kToken, 0xB2);
  ASSERT_TRUE(wa.ok() && wb.ok());
  auto la = a.lease(3 * kSlab);
  ASSERT_TRUE(la.ok());
  ASSERT_TRUE(b.lease(5 * kSlab).ok());
  ASSERT_TRUE(a_data.connect(srv_->port()).ok());
  ASSERT_TRUE(a_data.attach(wa->session_id, wa->secret).ok());
  std::vector<uint8_t> bytes(12345, 0x33);
  ASSERT_TRUE(a_data.write((*la)[2].slab, 100, bytes).ok());
  ASSERT_TRUE(a_data.read((*la)[2].slab, 100, 4000).ok());
  ASSERT_TRUE(a_data.read((*la)[0].slab, 0, 96).ok());

  ToolRun r = farmemctl({"status", addr_, "--token-file", token_file_, "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = minijson::parse(r.out);
  ASSERT_TRUE(j.has_value()) << r.out;
  EXPECT_EQ((*j)["donor"].str(), addr_);
  EXPECT_EQ((*j)["instance_id"].str(), hex(srv_->instance_id()));
  EXPECT_EQ((*j)["capacity_bytes"].u64(), 64 * kSlab);
  EXPECT_EQ((*j)["leased_bytes"].u64(), 8 * kSlab);
  EXPECT_EQ((*j)["free_bytes"].u64(), 56 * kSlab);
  EXPECT_EQ((*j)["clients"].u64(), 2u) << "farmemctl's own session is not counted";
  EXPECT_EQ((*j)["connections"].u64(), 3u);
  EXPECT_EQ((*j)["written_bytes"].u64(), 12345u);
  EXPECT_EQ((*j)["read_bytes"].u64(), 4096u);
  EXPECT_EQ((*j)["reads"].u64(), 2u);
  EXPECT_EQ((*j)["writes"].u64(), 1u);
  const auto& list = (*j)["client_list"].array;
  ASSERT_EQ(list.size(), 2u);
  bool saw_a = false, saw_b = false;
  for (const auto& c : list) {
    if (c["session_id"].str() == hex(wa->session_id)) {
      saw_a = true;
      EXPECT_EQ(c["client_id"].str(), hex(0xA1));
      EXPECT_EQ(c["leased_bytes"].u64(), 3 * kSlab);
      EXPECT_EQ(c["written_bytes"].u64(), 12345u);
      EXPECT_EQ(c["read_bytes"].u64(), 4096u);
      EXPECT_EQ(c["data_connections"].u64(), 1u);
    } else if (c["session_id"].str() == hex(wb->session_id)) {
      saw_b = true;
      EXPECT_EQ(c["client_id"].str(), hex(0xB2));
      EXPECT_EQ(c["leased_bytes"].u64(), 5 * kSlab);
      EXPECT_EQ(c["written_bytes"].u64() + c["read_bytes"].u64(), 0u);
    }
    EXPECT_TRUE(c["peer"].str().starts_with("127.0.0.1:")) << c["peer"].str();
  }
  EXPECT_TRUE(saw_a && saw_b) << r.out;

  // The human form shows the same figures.
  r = farmemctl({"status", addr_, "--token-file", token_file_});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("capacity 64.0 MiB, leased 8.0 MiB (12.5%), free 56.0 MiB"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(hex(wa->session_id)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(hex(wb->session_id)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("clients   2 (3 connections)"), std::string::npos) << r.out;

  // The token may come from the environment, as for the runtime.
  setenv("FARMEM_TOKEN_FILE", token_file_.c_str(), 1);
  r = farmemctl({"status", addr_, "--json"});
  unsetenv("FARMEM_TOKEN_FILE");
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST_F(Farmemctl, WatchPrintsOneJsonObjectPerRefresh) {
  ToolRun r = farmemctl(
      {"status", addr_, "--token-file", token_file_, "--json", "--watch", "0.05", "--count", "3"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    auto j = minijson::parse(line);
    ASSERT_TRUE(j.has_value()) << line;
    EXPECT_EQ((*j)["capacity_bytes"].u64(), 64 * kSlab);
    // Rates need a previous refresh.
    EXPECT_EQ(j->has("read_bytes_per_s"), n > 0) << line;
    ++n;
  }
  EXPECT_EQ(n, 3);
}

TEST_F(Farmemctl, StatusErrorsSayWhatIsWrong) {
  ToolRun r = farmemctl({"status", addr_});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("requires a token and none was given"), std::string::npos) << r.err;
  std::string wrong = dir_ + "/wrong";
  {
    std::ofstream t(wrong);
    t << "nope\n";
  }
  chmod(wrong.c_str(), 0600);
  r = farmemctl({"status", addr_, "--token-file", wrong});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("refused the token"), std::string::npos) << r.err;
  r = farmemctl({"status", addr_, "--token-file", dir_ + "/missing"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--token-file"), std::string::npos) << r.err;

  // A port nobody listens on: bind one, learn it, close it.
  uint16_t dead;
  {
    auto l = tcp_listen({"127.0.0.1", 0});
    ASSERT_TRUE(l.ok());
    dead = local_port(l->get());
  }
  r = farmemctl({"status", "127.0.0.1:" + std::to_string(dead), "--timeout", "2000"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("cannot read donor 127.0.0.1:" + std::to_string(dead)), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("Connection refused"), std::string::npos) << r.err;

  EXPECT_EQ(farmemctl({}).rc, 2);
  EXPECT_EQ(farmemctl({"frobnicate", addr_}).rc, 2);
  EXPECT_EQ(farmemctl({"status"}).rc, 2);
  EXPECT_EQ(farmemctl({"status", addr_, "--watch", "-1"}).rc, 2);
  r = farmemctl({"--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("status HOST:PORT"), std::string::npos);
  EXPECT_NE(r.out.find("stats PID|SOCKET"), std::string::npos);
}

// A stand-in far-memory process: this test process, with counters the test
// sets.
struct FakeProcess {
  std::atomic<uint64_t> faults_remote{0}, faults_zero{0}, evictions_dirty{0};
  std::unique_ptr<StatsSocket> sock;
  Status start() {
    auto started = StatsSocket::start([this](StatsSnapshot& s) {
      s.gauge("resident_bytes", 3u << 20, "far memory resident here");
      s.gauge("budget_bytes", 8u << 20, "local budget");
      s.gauge("remote_bytes", 40u << 20, "remote space in use");
      s.counter("faults_remote", faults_remote.load(), "faults served by a READ");
      s.counter("faults_zero", faults_zero.load(), "zero-filled first touches");
      s.counter("evictions_clean", 11, "dropped without I/O");
      s.counter("evictions_dirty", evictions_dirty.load(), "written back, then dropped");
      s.counter("prefetch_issued", 100, "prefetch READs");
      s.counter("prefetch_used", 75, "prefetched and then used");
      s.counter("prefetch_unused", 25, "prefetched and dropped unused");
      s.counter("donor_read_bytes", 4096 * faults_remote.load(), "bytes from this donor",
                "donor=127.0.0.1:7400");
      s.histogram("fetch_latency_us", {{4, 50}, {8, 40}, {16, 9}, {StatsBucket::kInf, 1}},
                  "demand fetch latency");
    });
    if (!started.ok()) return started.status();
    sock = std::move(*started);
    return ok_status();
  }
};

TEST_F(Farmemctl, StatsOfALiveProcessMatchWhatItCounted) {
  FakeProcess p;
  ASSERT_TRUE(p.start().ok());
  p.faults_remote = 1234;
  p.faults_zero = 77;
  p.evictions_dirty = 5;
  const std::string pid = std::to_string(getpid());
  ToolRun r = farmemctl({"stats", pid, "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = minijson::parse(r.out);
  ASSERT_TRUE(j.has_value()) << r.out;
  EXPECT_EQ((*j)["pid"].u64(), static_cast<uint64_t>(getpid()));
  EXPECT_EQ((*j)["uid"].u64(), static_cast<uint64_t>(geteuid()));
  EXPECT_EQ((*j)["socket"].str(), p.sock->path());
  EXPECT_EQ((*j)["counters"]["faults_remote"].u64(), 1234u);
  EXPECT_EQ((*j)["counters"]["faults_zero"].u64(), 77u);
  EXPECT_EQ((*j)["counters"]["evictions_dirty"].u64(), 5u);
  EXPECT_EQ((*j)["counters"]["donor_read_bytes{donor=127.0.0.1:7400}"].u64(), 4096u * 1234);
  EXPECT_EQ((*j)["gauges"]["resident_bytes"].u64(), 3u << 20);
  EXPECT_GT((*j)["rates_per_s"]["faults_remote"].num(), 0.0);
  const auto& h = (*j)["histograms"]["fetch_latency_us"];
  EXPECT_EQ(h["count"].u64(), 100u);
  EXPECT_EQ(h["p50"].u64(), 4u);
  EXPECT_EQ(h["p90"].u64(), 8u);
  EXPECT_EQ(h["p99"].u64(), 16u);
  EXPECT_EQ((*j)["prefetch_accuracy"].num(), 0.75);

  // The counters move; a socket path works as well as a pid.
  p.faults_remote = 2000;
  r = farmemctl({"stats", p.sock->path(), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  j = minijson::parse(r.out);
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ((*j)["counters"]["faults_remote"].u64(), 2000u);

  r = farmemctl({"stats", pid});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("resident 3.0 MiB of budget 8.0 MiB"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\n +remote +2000 +[0-9.]+\n"))) << r.out;
  EXPECT_NE(r.out.find("fetch_latency_us: p50 <4, p90 <8, p99 <16 (100 samples)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("evictions clean 11, dirty 5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("accuracy 75.0%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("donor     127.0.0.1:7400: donor_read_bytes 7.8 MiB"), std::string::npos)
      << r.out;
  EXPECT_EQ(p.sock->served(), 3u);
}

TEST_F(Farmemctl, StatsErrorsSayWhatIsWrong) {
  ToolRun r = farmemctl({"stats", "999999999"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("no process 999999999"), std::string::npos) << r.err;
  // A live process without farmem: our parent.
  r = farmemctl({"stats", std::to_string(getppid())});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("has no farmem stats socket"), std::string::npos) << r.err;
  r = farmemctl({"stats", "not-a-pid"});
  EXPECT_EQ(r.rc, 2);
  r = farmemctl({"stats", dir_ + "/nothing.sock"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("no stats socket at"), std::string::npos) << r.err;
}

TEST_F(Farmemctl, StatsRefusedToAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run farmemctl as another uid";
  FakeProcess p;
  ASSERT_TRUE(p.start().ok());
  // Through the private directory: refused by the file system.
  ToolRun r = farmemctl({"stats", p.sock->path()}, 65534);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("private to the process's user"), std::string::npos) << r.err;
  // With the directory opened up by mistake: refused by SO_PEERCRED.
  chmod(dir_.c_str(), 0755);
  chmod((dir_ + "/farmem").c_str(), 0755);
  chmod(p.sock->path().c_str(), 0666);
  r = farmemctl({"stats", p.sock->path()}, 65534);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("uid 65534 may not read them"), std::string::npos) << r.err;
  EXPECT_EQ(p.sock->refused(), 1u);
  EXPECT_EQ(p.sock->served(), 0u);
}

#ifdef FARMEM_OPS_WITH_ALLOCATOR
// How a far-memory process exposes its statistics: fm_stats() (the C API)
// mapped onto the names farmemctl knows. The preload library / fm_init are
// expected to do the same (see the report of issue 8).
void add_fm_stats(StatsSnapshot& s, const fm_stats_t& f, const std::string& donors) {
  s.gauge("resident_bytes", f.resident_bytes, "far memory resident in this process now");
  s.gauge("resident_peak_bytes", f.resident_peak_bytes, "highest resident_bytes");
  s.gauge("budget_bytes", f.budget_bytes, "local budget for far memory");
  s.gauge("remote_bytes", f.remote_bytes, "remote space holding written-back pages");
  s.gauge("far_allocated_bytes", f.far_allocated, "bytes in live far allocations");
  s.counter("faults_zero", f.faults_zero, "first touch of a never-written page (no I/O)");
  s.counter("faults_remote", f.faults_remote, "page fetched from a donor");
  s.counter("faults_victim", f.faults_victim, "page found in the local victim cache");
  s.counter("faults_wp", f.faults_wp, "first write to a clean resident page");
  s.counter("evictions_clean", f.evictions_clean, "pages dropped without I/O");
  s.counter("evictions_dirty", f.evictions_dirty, "pages written back, then dropped");
  s.gauge("fetch_p50_us", f.fetch_p50_us, "demand fetch latency, median (bucket bound)");
  s.gauge("fetch_p99_us", f.fetch_p99_us, "demand fetch latency, p99 (bucket bound)");
  s.counter("read_bytes", f.bytes_read, "bytes read from donors", "donor=" + donors);
  s.counter("written_bytes", f.bytes_written, "bytes written to donors", "donor=" + donors);
}

TEST_F(Farmemctl, RealFarMemoryProcessAgainstRealDonor) {
  std::string why = Uffd::unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "userfaultfd unavailable: " << why;
  fm_config c;
  fm_config_init(&c);
  c.servers = addr_.c_str();
  c.token_file = token_file_.c_str();
  c.local_mem = 4 << 20;
  c.region_size = 32 * kSlab;
  c.pager_threads = 1;
  c.prefetch = 0;
  ASSERT_EQ(fm_init(&c), 0) << fm_last_error();
  auto sock = StatsSocket::start([&](StatsSnapshot& s) {
    fm_stats_t f;
    fm_stats_init(&f);
    if (fm_stats(&f) == 0) add_fm_stats(s, f, addr_);
  });
  ASSERT_TRUE(sock.ok()) << sock.status().to_string();

  constexpr size_t kN = 16 << 20;  // 4x the local budget: evictions and remote faults
  auto* p = static_cast<uint8_t*>(fm_malloc(kN));
  ASSERT_NE(p, nullptr) << fm_last_error();
  for (size_t i = 0; i < kN; i += 512) p[i] = static_cast<uint8_t>(i >> 9);
  uint64_t sum = 0;
  for (size_t i = 0; i < kN; i += 4096) sum += p[i];
  EXPECT_GT(sum, 0u);

  // The pager bumps a fault counter just after it wakes the faulting
  // thread: wait (bounded) until the counters have settled.
  fm_stats_t before, again;
  fm_stats_init(&before);
  fm_stats_init(&again);
  ASSERT_EQ(fm_stats(&before), 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(fm_stats(&again), 0);
    if (again.faults_remote == before.faults_remote && again.faults_zero == before.faults_zero)
      break;
    before = again;
  }
  ToolRun r = farmemctl({"stats", std::to_string(getpid()), "--json"});
  fm_stats_t after;
  fm_stats_init(&after);
  ASSERT_EQ(fm_stats(&after), 0);
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = minijson::parse(r.out);
  ASSERT_TRUE(j.has_value()) << r.out;
  // Nothing touched far memory while farmemctl ran: the fault counts are
  // exactly what fm_stats says.
  EXPECT_EQ(before.faults_remote, after.faults_remote);
  EXPECT_GT(after.faults_remote, 0u);
  EXPECT_EQ((*j)["counters"]["faults_remote"].u64(), after.faults_remote);
  EXPECT_EQ((*j)["counters"]["faults_zero"].u64(), after.faults_zero);
  EXPECT_GT(after.evictions_dirty, 0u);
  EXPECT_GE((*j)["counters"]["evictions_dirty"].u64(), before.evictions_dirty);
  EXPECT_LE((*j)["counters"]["evictions_dirty"].u64(), after.evictions_dirty);
  EXPECT_EQ((*j)["gauges"]["budget_bytes"].u64(), 4u << 20);

  // The donor sees this process as one client with its leases and traffic.
  // The faults have settled, but the evictor may still be finishing its
  // round down to its floor (kicked by the last faults; it can be
  // descheduled for a long while under load): the donor counts a WRITE when
  // it arrives, the pager once its completion is reaped, and a write-back
  // may lease another slab. So compare a view taken while the pager's
  // traffic did not move across the whole status call (bounded: the evictor
  // goes quiet once no fault comes).
  minijson::Value d;
  fm_stats_t now;
  fm_stats_init(&now);
  uint64_t leased = 0;
  auto deadline2 = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    fm_stats_t pre;
    fm_stats_init(&pre);
    ASSERT_EQ(fm_stats(&pre), 0);
    ToolRun st = farmemctl({"status", addr_, "--token-file", token_file_, "--json"});
    ASSERT_EQ(st.rc, 0) << st.err;
    leased = srv_->stats().leased;
    ASSERT_EQ(fm_stats(&now), 0);
    auto parsed = minijson::parse(st.out);
    ASSERT_TRUE(parsed.has_value()) << st.out;
    d = std::move(*parsed);
    ASSERT_EQ(d["client_list"].array.size(), 1u) << st.out;
    const auto& cl = d["client_list"][0];
    const bool quiet = pre.bytes_written == now.bytes_written && pre.bytes_read == now.bytes_read;
    if ((quiet && cl["written_bytes"].u64() == now.bytes_written &&
         cl["leased_bytes"].u64() == leased) ||
        std::chrono::steady_clock::now() > deadline2)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto& me = d["client_list"][0];
  EXPECT_EQ(me["leased_bytes"].u64(), leased);
  EXPECT_GT(me["leased_bytes"].u64(), 0u);
  EXPECT_EQ(me["read_bytes"].u64(), now.bytes_read);
  EXPECT_EQ(me["written_bytes"].u64(), now.bytes_written);

  (*sock)->stop();
  fm_free(p);
  EXPECT_EQ(fm_shutdown(), 0);
}
#endif

}  // namespace
}  // namespace farmem
