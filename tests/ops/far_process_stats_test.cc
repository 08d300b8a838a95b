// farmemctl against a real far-memory process: a child that runs fm_init
// (which starts the stats socket as its last start-up step) against a donor
// in this test, writes 4x its budget, and reports its own counters;
// `farmemctl stats PID --json` must agree with them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "pager/uffd.h"
#include "runtime/donor_server.h"
#include "tests/ops/mini_json.h"

namespace farmem {
namespace {

constexpr char kToken[] = "far-process-stats-token";
constexpr uint64_t kSlab = 1 << 20;

struct Child {
  pid_t pid = -1;
  int in = -1;          // its stdin
  FILE* out = nullptr;  // its stdout
};

Child spawn(const char* path, const std::vector<std::string>& env) {
  int to[2], from[2];
  Child c;
  if (pipe(to) != 0 || pipe(from) != 0) return c;
  c.pid = fork();
  if (c.pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    execl(path, path, static_cast<char*>(nullptr));
    _exit(98);
  }
  close(to[0]);
  close(from[1]);
  c.in = to[1];
  c.out = fdopen(from[0], "r");
  return c;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

TEST(FarProcessStats, FarmemctlReadsTheRuntimesOwnSocket) {
  std::string why = Uffd::unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << "userfaultfd unavailable: " << why;
  char tmpl[] = "/tmp/far-process-stats-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string token_file = dir + "/token";
  {
    std::ofstream t(token_file);
    t << kToken << "\n";
  }
  chmod(token_file.c_str(), 0600);
  DonorOptions o;
  o.listen = {"127.0.0.1", 0};
  o.capacity = 64 * kSlab;
  o.slab_size = kSlab;
  o.token = kToken;
  o.try_hugepages = false;
  auto srv = DonorServer::start(o);
  ASSERT_TRUE(srv.ok()) << srv.status().to_string();
  const std::string addr = "127.0.0.1:" + std::to_string((*srv)->port());

  Child c = spawn(FAR_PROCESS_CHILD_PATH, {"XDG_RUNTIME_DIR=" + dir, "FARMEM_SERVERS=" + addr,
                                           "FARMEM_TOKEN_FILE=" + token_file, "FARMEM_LOCAL_MEM=4M",
                                           "FARMEM_PAGER_THREADS=1", "FARMEM_PREFETCH=0"});
  ASSERT_GT(c.pid, 0);
  char line[1024] = {};
  ASSERT_NE(fgets(line, sizeof line, c.out), nullptr) << "the child exited early";
  unsigned long long remote = 0, dirty = 0, resident = 0, budget = 0;
  char sock[512] = {};
  ASSERT_EQ(sscanf(line,
                   "ready faults_remote=%llu evictions_dirty=%llu resident=%llu budget=%llu "
                   "sock=%511s",
                   &remote, &dirty, &resident, &budget, sock),
            5)
      << line;
  EXPECT_EQ(std::string(sock), dir + "/farmem/" + std::to_string(c.pid) + ".sock");
  EXPECT_GT(remote, 0u);
  EXPECT_GT(dirty, 0u);

  // XDG_RUNTIME_DIR tells farmemctl where the child's socket is.
  std::string json = run("XDG_RUNTIME_DIR=" + dir + " " + FARMEMCTL_PATH + " stats " +
                         std::to_string(c.pid) + " --json");
  auto j = minijson::parse(json);
  ASSERT_TRUE(j.has_value()) << json;
  // The child is idle while farmemctl reads: fault counts are exact.
  EXPECT_EQ((*j)["counters"]["faults_remote"].u64(), remote);
  EXPECT_GE((*j)["counters"]["evictions_dirty"].u64(), dirty);
  EXPECT_EQ((*j)["gauges"]["budget_bytes"].u64(), 4u << 20);
  EXPECT_EQ((*j)["gauges"]["budget_bytes"].u64(), budget);
  EXPECT_LE((*j)["gauges"]["resident_bytes"].u64(), budget);
  EXPECT_GT((*j)["gauges"]["resident_bytes"].u64(), 0u);
  EXPECT_EQ((*j)["counters"]["donor_read_bytes{donor=" + addr + "}"].u64(),
            (*j)["counters"]["bytes_read"].u64())
      << json;
  EXPECT_GT((*j)["counters"]["bytes_read"].u64(), 0u);

  close(c.in);  // the child frees, shuts down (socket first) and exits
  int st = 0;
  ASSERT_EQ(waitpid(c.pid, &st, 0), c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  fclose(c.out);
  struct stat sb {};
  EXPECT_NE(lstat(sock, &sb), 0) << "the socket file outlived fm_shutdown";
  srv->reset();
  (void)!system(("rm -rf '" + dir + "'").c_str());
}

}  // namespace
}  // namespace farmem
