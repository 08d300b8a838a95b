// The per-process stats socket: text format, paths and permissions, and the
// refusal of other users (a forked child switches uid with setresuid).
#include "runtime/stats_socket.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace farmem {
namespace {

constexpr uid_t kOtherUid = 65534;  // nobody

// A private temporary directory used as $XDG_RUNTIME_DIR for one test.
class TempRuntimeDir {
 public:
  TempRuntimeDir() {
    char tmpl[] = "/tmp/farmem-ops-XXXXXX";
    path_ = mkdtemp(tmpl);
    setenv("XDG_RUNTIME_DIR", path_.c_str(), 1);
  }
  ~TempRuntimeDir() {
    std::string cmd = "rm -rf '" + path_ + "'";
    (void)!system(cmd.c_str());
    unsetenv("XDG_RUNTIME_DIR");
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

StatsProvider fake_provider(std::atomic<int>* calls) {
  return [calls](StatsSnapshot& s) {
    int n = ++*calls;
    s.counter("faults_remote", 1000 + static_cast<uint64_t>(n), "faults served by a READ");
    s.counter("faults_zero", 7, "zero-filled first touches");
    s.gauge("resident_bytes", 4u << 20, "far memory resident here");
    s.counter("donor_read_bytes", 123456, "bytes read from one donor", "donor=127.0.0.1:7400");
    s.histogram("fetch_latency_us", {{1, 0}, {2, 3}, {4, 5}, {StatsBucket::kInf, 2}},
                "demand fetch latency");
  };
}

// What the child saw, sent back through a pipe: "<errc>|<message>".
std::string fetch_as_other_uid(const std::string& path) {
  int p[2];
  if (pipe(p) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    std::string out;
    if (setresgid(kOtherUid, kOtherUid, kOtherUid) != 0 ||
        setresuid(kOtherUid, kOtherUid, kOtherUid) != 0) {
      out = "setresuid failed";
    } else {
      auto r = fetch_stats(path, 2000);
      out = r.ok() ? std::string("ok|read ") + std::to_string(r->samples.size()) + " samples"
                   : std::string(errc_name(r.status().code())) + "|" + r.status().message();
    }
    (void)!write(p[1], out.data(), out.size());
    _exit(0);
  }
  close(p[1]);
  std::string got;
  char buf[1024];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return got;
}

TEST(StatsText, RoundTrip) {
  StatsSnapshot s;
  s.pid = 42;
  s.uid = 1000;
  s.time_ms = 1700000000123;
  s.uptime_ms = 5000;
  s.comm = "my app";  // blanks would split the line: replaced
  s.counter("faults_remote", 12345678901234ull, "faults served\nby a READ");
  s.gauge("resident_bytes", 0, "");
  s.counter("bad name!", 1, "x", "donor=10.0.0.5:7400,replica=1");
  s.histogram("fetch_latency_us", {{1, 1}, {8, 2}, {StatsBucket::kInf, 3}}, "latency");
  std::string text = format_stats_text(s);
  EXPECT_EQ(text,
            "farmem-stats 1\n"
            "process 42 1000 1700000000123 5000 my_app\n"
            "counter faults_remote - 12345678901234 faults served by a READ\n"
            "gauge resident_bytes - 0 \n"
            "counter bad_name_ donor=10.0.0.5:7400,replica=1 1 x\n"
            "histogram fetch_latency_us - 1:1,8:2,inf:3 latency\n"
            "end\n");
  auto r = parse_stats_text(text);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->pid, 42);
  EXPECT_EQ(r->uid, 1000);
  EXPECT_EQ(r->time_ms, 1700000000123);
  EXPECT_EQ(r->uptime_ms, 5000);
  EXPECT_EQ(r->comm, "my_app");
  ASSERT_EQ(r->samples.size(), 3u);
  EXPECT_EQ(r->value("faults_remote"), 12345678901234ull);
  EXPECT_EQ(r->samples[0].help, "faults served by a READ");
  EXPECT_EQ(r->samples[1].kind, StatsSample::Kind::kGauge);
  EXPECT_EQ(r->value("bad_name_", "donor=10.0.0.5:7400,replica=1"), 1u);
  EXPECT_EQ(r->find("bad_name_"), nullptr) << "labels are part of the identity";
  const StatsHistogram* h = r->find_histogram("fetch_latency_us");
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(h->buckets.size(), 3u);
  EXPECT_EQ(h->buckets[1].le, 8u);
  EXPECT_EQ(h->buckets[2].le, StatsBucket::kInf);
  EXPECT_EQ(h->total(), 6u);
}

TEST(StatsText, QuantileBound) {
  StatsHistogram h;
  EXPECT_EQ(h.quantile_bound(0.5), 0u);
  h.buckets = {{1, 0}, {2, 50}, {4, 40}, {8, 9}, {StatsBucket::kInf, 1}};
  EXPECT_EQ(h.quantile_bound(0.5), 2u);   // rank 50: last of the first bucket
  EXPECT_EQ(h.quantile_bound(0.51), 4u);  // rank 51
  EXPECT_EQ(h.quantile_bound(0.9), 4u);   // rank 90
  EXPECT_EQ(h.quantile_bound(0.99), 8u);  // rank 99
  EXPECT_EQ(h.quantile_bound(1.0), StatsBucket::kInf);
}

TEST(StatsText, StrictParser) {
  const std::string head = "farmem-stats 1\nprocess 1 0 5 6 x\n";
  auto code = [](const std::string& t) { return parse_stats_text(t).status().code(); };
  EXPECT_EQ(code(head + "end\n"), Errc::kOk);
  EXPECT_EQ(code(head), Errc::kProtocol) << "no end: truncated";
  EXPECT_EQ(code(head + "end"), Errc::kProtocol) << "unterminated line";
  EXPECT_EQ(code(head + "end\ncounter a - 1 x\n"), Errc::kProtocol) << "after end";
  EXPECT_EQ(code(head + "counter a - -1 x\nend\n"), Errc::kProtocol);
  EXPECT_EQ(code(head + "counter a - 1x x\nend\n"), Errc::kProtocol);
  EXPECT_EQ(code(head + "counter 9a - 1 x\nend\n"), Errc::kProtocol);
  EXPECT_EQ(code(head + "counter a\nend\n"), Errc::kProtocol);
  EXPECT_EQ(code(head + "meter a - 1 x\nend\n"), Errc::kProtocol);
  EXPECT_EQ(code(head + "histogram h - 4:1,2:1 x\nend\n"), Errc::kProtocol) << "not ascending";
  EXPECT_EQ(code(head + "histogram h - 4 x\nend\n"), Errc::kProtocol);
  EXPECT_EQ(code("farmem-stats 2\nprocess 1 0 5 6 x\nend\n"), Errc::kProtocol);
  EXPECT_EQ(code("HTTP/1.0 200 OK\n"), Errc::kProtocol);
  EXPECT_EQ(code("farmem-stats 1\nend\n"), Errc::kProtocol) << "no process line";
  EXPECT_EQ(code(""), Errc::kProtocol);
  auto r = parse_stats_text("error uid 5 may not read them\n");
  EXPECT_EQ(r.status().code(), Errc::kPermissionDenied);
  EXPECT_EQ(r.status().message(), "uid 5 may not read them");
}

TEST(StatsSocket, ServesTheProviderSnapshotOnTheDocumentedPath) {
  TempRuntimeDir rt;
  std::atomic<int> calls{0};
  auto s = StatsSocket::start(fake_provider(&calls));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const std::string want = rt.path() + "/farmem/" + std::to_string(getpid()) + ".sock";
  EXPECT_EQ((*s)->path(), want);
  EXPECT_EQ(stats_socket_path(getpid()), want);
  struct stat st {};
  ASSERT_EQ(stat((rt.path() + "/farmem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(lstat(want.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto cands = stats_socket_candidates(getpid());
  ASSERT_FALSE(cands.empty());
  EXPECT_EQ(cands[0], want);

  for (int i = 1; i <= 3; ++i) {
    auto r = fetch_stats(want);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->pid, getpid());
    EXPECT_EQ(r->uid, static_cast<int64_t>(geteuid()));
    EXPECT_GE(r->uptime_ms, 0);
    EXPECT_EQ(r->value("faults_remote"), 1000u + static_cast<uint64_t>(i));
    EXPECT_EQ(r->value("faults_zero"), 7u);
    EXPECT_EQ(r->value("resident_bytes"), 4u << 20);
    EXPECT_EQ(r->value("donor_read_bytes", "donor=127.0.0.1:7400"), 123456u);
    const StatsHistogram* h = r->find_histogram("fetch_latency_us");
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->total(), 10u);
  }
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ((*s)->served(), 3u);
  EXPECT_EQ((*s)->refused(), 0u);
  (*s)->stop();
  EXPECT_NE(lstat(want.c_str(), &st), 0) << "stop() removes the socket";
  EXPECT_EQ(fetch_stats(want).status().code(), Errc::kNotFound);
}

TEST(StatsSocket, FallsBackToTmpWithoutXdgRuntimeDir) {
  unsetenv("XDG_RUNTIME_DIR");
  std::atomic<int> calls{0};
  auto s = StatsSocket::start(fake_provider(&calls));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const std::string dir = "/tmp/farmem-" + std::to_string(geteuid());
  EXPECT_EQ((*s)->path(), dir + "/" + std::to_string(getpid()) + ".sock");
  struct stat st {};
  ASSERT_EQ(lstat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto r = fetch_stats((*s)->path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->value("faults_zero"), 7u);
}

TEST(StatsSocket, RefusesADirectoryItDoesNotOwnOrThatIsOpen) {
  TempRuntimeDir rt;
  std::atomic<int> calls{0};
  const std::string dir = rt.path() + "/farmem";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  chmod(dir.c_str(), 0755);
  auto s = StatsSocket::start(fake_provider(&calls));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Errc::kPermissionDenied);
  EXPECT_NE(s.status().message().find("chmod 700"), std::string::npos) << s.status().message();

  chmod(dir.c_str(), 0700);
  ASSERT_EQ(chown(dir.c_str(), kOtherUid, kOtherUid), 0);
  s = StatsSocket::start(fake_provider(&calls));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Errc::kPermissionDenied);
  EXPECT_NE(s.status().message().find("belongs to uid 65534"), std::string::npos)
      << s.status().message();

  rmdir(dir.c_str());
  ASSERT_EQ(symlink("/tmp", dir.c_str()), 0);
  s = StatsSocket::start(fake_provider(&calls));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not a directory"), std::string::npos)
      << s.status().message();
}

TEST(StatsSocket, ReplacesAStaleSocketOfTheSamePid) {
  TempRuntimeDir rt;
  const std::string dir = rt.path() + "/farmem";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string path = dir + "/" + std::to_string(getpid()) + ".sock";
  {  // A socket file left behind by a dead process with our pid.
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    strcpy(a.sun_path, path.c_str());
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    close(fd);
  }
  EXPECT_EQ(fetch_stats(path).status().code(), Errc::kUnavailable) << "stale: nobody serves it";
  std::atomic<int> calls{0};
  auto s = StatsSocket::start(fake_provider(&calls));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto r = fetch_stats(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(calls.load(), 1);
}

TEST(StatsSocket, RefusesADifferentUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  TempRuntimeDir rt;
  std::atomic<int> calls{0};

  // 1. The default layout: the private directory keeps the other user out
  //    before the socket is even reached.
  auto s = StatsSocket::start(fake_provider(&calls));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::string got = fetch_as_other_uid((*s)->path());
  EXPECT_EQ(got.substr(0, got.find('|')), "permission_denied") << got;
  EXPECT_NE(got.find("run farmemctl as that user"), std::string::npos) << got;
  (*s)->stop();

  // 2. Even when the file system lets the other user reach the socket (a
  //    caller-chosen path in an open directory, chmod 666), SO_PEERCRED
  //    refuses it with a clear message and closes.
  chmod(rt.path().c_str(), 0755);
  StatsSocketOptions o;
  o.path = rt.path() + "/open.sock";
  auto open_sock = StatsSocket::start(fake_provider(&calls), o);
  ASSERT_TRUE(open_sock.ok()) << open_sock.status().to_string();
  ASSERT_EQ(chmod(o.path.c_str(), 0666), 0);
  got = fetch_as_other_uid(o.path);
  EXPECT_EQ(got.substr(0, got.find('|')), "permission_denied") << got;
  const std::string want = "the farmem stats of pid " + std::to_string(getpid()) +
                           " belong to uid 0; uid 65534 may not read them: run farmemctl as uid 0";
  EXPECT_NE(got.find(want), std::string::npos) << got;
  EXPECT_EQ(calls.load(), 0) << "a refused peer must not see a snapshot";
  EXPECT_EQ((*open_sock)->refused(), 1u);
  EXPECT_EQ((*open_sock)->served(), 0u);
  // The owner is still served.
  auto r = fetch_stats(o.path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->value("faults_remote"), 1001u);
  EXPECT_EQ((*open_sock)->served(), 1u);
}

TEST(StatsSocket, ThreadInitRunsOnTheServerThread) {
  TempRuntimeDir rt;
  std::atomic<int> calls{0};
  std::atomic<int> inits{0};
  StatsSocketOptions o;
  o.thread_init = [&] { ++inits; };
  auto s = StatsSocket::start(fake_provider(&calls), o);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(fetch_stats((*s)->path()).ok());  // the thread is running by now
  EXPECT_EQ(inits.load(), 1);
  EXPECT_EQ(StatsSocket::start(nullptr).status().code(), Errc::kInvalidArgument);
}

}  // namespace
}  // namespace farmem
