// Runs the built farmemd binary (FARMEMD_PATH) as an operator would: --help,
// bad flags and config files (exit 2 and one clear line), refusal to run
// without a token, and a clean stop on SIGTERM / SIGINT after serving a
// client.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/runtime/raw_client.h"

#ifndef FARMEMD_PATH
#error "FARMEMD_PATH must name the farmemd binary"
#endif

namespace farmem {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kTimeoutMs = 10000;

// A running farmemd with its stdout and stderr on pipes.
class Daemon {
 public:
  explicit Daemon(const std::vector<std::string>& args) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) abort();
    // Built before fork(): the child only calls async-signal-safe functions.
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(FARMEMD_PATH));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      dup2(err[1], 2);
      execv(FARMEMD_PATH, argv.data());
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~Daemon() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_);
    close(err_);
  }

  // Reads both pipes until stdout holds `needle` (true) or EOF/timeout.
  bool wait_stdout(const std::string& needle, int timeout_ms = kTimeoutMs) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (out.find(needle) == std::string::npos) {
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      if (left <= 0 || !pump(left)) return out.find(needle) != std::string::npos;
    }
    return true;
  }

  // Reads to EOF and reaps; returns the exit status (-1: timeout/killed).
  int wait_exit(int timeout_ms = kTimeoutMs) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      if (left <= 0) return -1;
      if (!pump(left)) break;
    }
    int st = 0;
    if (waitpid(pid_, &st, 0) != pid_) return -1;
    reaped_ = true;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  void signal(int sig) { kill(pid_, sig); }

  std::string out, err;

 private:
  // One poll round over both pipes; false once both reached EOF.
  bool pump(int timeout_ms) {
    pollfd p[2] = {{out_open_ ? out_ : -1, POLLIN, 0}, {err_open_ ? err_ : -1, POLLIN, 0}};
    if (!out_open_ && !err_open_) return false;
    int r = poll(p, 2, timeout_ms);
    if (r < 0) return errno == EINTR;
    if (r == 0) return true;
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = read(p[i].fd, buf, sizeof buf);
      if (n <= 0)
        (i == 0 ? out_open_ : err_open_) = false;
      else
        (i == 0 ? out : err).append(buf, static_cast<size_t>(n));
    }
    return out_open_ || err_open_;
  }

  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  bool out_open_ = true, err_open_ = true, reaped_ = false;
};

std::string temp_file(const std::string& content) {
  char path[] = "/tmp/farmemd_cli_test_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) abort();
  if (write(fd, content.data(), content.size()) != static_cast<ssize_t>(content.size())) abort();
  fchmod(fd, 0600);
  close(fd);
  return path;
}

// "farmemd listening on 127.0.0.1:40207, capacity ..." -> 40207
uint16_t listening_port(const std::string& out) {
  size_t at = out.find("listening on 127.0.0.1:");
  if (at == std::string::npos) return 0;
  return static_cast<uint16_t>(atoi(out.c_str() + at + strlen("listening on 127.0.0.1:")));
}

TEST(FarmemdCli, HelpDocumentsEveryFlagWithItsDefault) {
  Daemon d({"--help"});
  ASSERT_EQ(d.wait_exit(), 0) << d.err;
  for (const char* flag :
       {"--listen HOST:PORT", "--capacity SIZE", "--slab-size SIZE", "--token-file FILE",
        "--insecure", "--transport auto|tcp|verbs", "--max-clients N", "--quota-per-client SIZE",
        "--heartbeat-grace DURATION", "--log-level", "--config FILE"})
    EXPECT_THAT(d.out, HasSubstr(flag));
  for (const char* def : {"(default: 127.0.0.1:7400)", "(default: 1G)", "(default: 64M)",
                          "(default: auto)", "(default: 256)", "(default: 5s)"})
    EXPECT_THAT(d.out, HasSubstr(def));
  EXPECT_EQ(d.err, "");
}

TEST(FarmemdCli, BadValuesExitWith2AndOneClearLine) {
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  const Case cases[] = {
      {{"--insecure", "--capacity", "12Q"}, "--capacity=\"12Q\" is not valid"},
      {{"--insecure", "--capacity=0"}, "--capacity=0 is not valid"},
      {{"--insecure", "--slab-size", "1000"}, "--slab-size=1000 is not valid"},
      {{"--insecure", "--capacity", "3M", "--slab-size", "2M"},
       "--capacity (3145728 bytes) must be a whole number of --slab-size"},
      {{"--insecure", "--max-clients", "0"}, "--max-clients=\"0\" is not valid"},
      {{"--insecure", "--quota-per-client", "-1"}, "--quota-per-client"},
      {{"--insecure", "--transport", "udp"}, "expected auto, tcp or verbs"},
      {{"--insecure", "--log-level", "loud"}, "expected error, warn, info or debug"},
      {{"--insecure", "--heartbeat-grace", "soon"}, "--heartbeat-grace=\"soon\" is not valid"},
      {{"--insecure", "--heartbeat-grace", "500ms"},
       "--heartbeat-grace (500 ms) must be longer than --heartbeat-interval (1000 ms)"},
      {{"--insecure", "--listen", "127.0.0.1:99999"}, "--listen"},
      {{"--insecure", "--insecure=maybe"}, "expected true or false"},
      {{"--insecure", "--frobnicate"}, "unknown flag --frobnicate"},
      {{"--insecure", "--capacity"}, "--capacity needs a value"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--token-file", "/nonexistent/farmem-token"}, "--token-file: cannot open token file"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.says);
    Daemon d(c.args);
    EXPECT_EQ(d.wait_exit(), 2) << d.out << d.err;
    EXPECT_THAT(d.err, StartsWith("farmemd: "));
    EXPECT_THAT(d.err, HasSubstr(c.says));
    EXPECT_EQ(std::count(d.err.begin(), d.err.end(), '\n'), 1) << d.err;
    EXPECT_EQ(d.out, "");
  }
}

TEST(FarmemdCli, RefusesToStartWithoutATokenAndSaysHowToFixIt) {
  Daemon d({"--listen", "127.0.0.1:0", "--capacity", "4M", "--slab-size", "1M"});
  EXPECT_EQ(d.wait_exit(), 2);
  EXPECT_THAT(d.err, HasSubstr("refusing to start without a token"));
  EXPECT_THAT(d.err, HasSubstr("--token-file FILE"));
  EXPECT_THAT(d.err, HasSubstr("--insecure"));
}

// The host has no RDMA device: verbs forced is a clear error at start-up.
TEST(FarmemdCli, VerbsTransportWithoutRdmaDeviceIsAClearError) {
  Daemon d({"--insecure", "--listen", "127.0.0.1:0", "--transport", "verbs"});
  EXPECT_EQ(d.wait_exit(), 1);
  EXPECT_THAT(d.err, HasSubstr("--transport verbs, but verbs cannot serve 127.0.0.1"));
  EXPECT_THAT(d.err, HasSubstr("--transport tcp"));
}

TEST(FarmemdCli, ServesAClientAndStopsCleanlyOnSigterm) {
  const std::string token = "cli-test-token";
  std::string tf = temp_file(token + "\n");
  Daemon d({"--listen", "127.0.0.1:0", "--capacity", "8M", "--slab-size", "1M", "--token-file", tf,
            "--transport", "auto"});
  ASSERT_TRUE(d.wait_stdout("instance ")) << d.out << d.err;
  EXPECT_THAT(d.out, HasSubstr("capacity 8.0 MiB, slab size 1.0 MiB, transport tcp"));
  uint16_t port = listening_port(d.out);
  ASSERT_NE(port, 0) << d.out;
  {
    test::RawClient ctl, data;
    ASSERT_TRUE(ctl.connect(port).ok());
    auto w = ctl.handshake_control(token);  // the trailing newline is not part of it
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(w->capacity, 8u << 20);
    ASSERT_TRUE(data.connect(port).ok());
    ASSERT_TRUE(data.attach(w->session_id, w->secret).ok());
    auto l = ctl.lease(1 << 20);
    ASSERT_TRUE(l.ok());
    std::vector<uint8_t> bytes(3000, 0x3C);
    ASSERT_TRUE(data.write((*l)[0].slab, 100, bytes).ok());
    auto back = data.read((*l)[0].slab, 100, 3000);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, bytes);
    // Connections stay open across the signal: the stop closes them.
    d.signal(SIGTERM);
    EXPECT_EQ(d.wait_exit(), 0) << d.err;
    EXPECT_TRUE(ctl.wait_closed());
  }
  EXPECT_THAT(d.out, HasSubstr("farmemd stopped by SIGTERM: 1 reads (2.9 KiB), 1 writes"));
  EXPECT_THAT(d.err, HasSubstr("transport auto: serving the tcp data path"));
  unlink(tf.c_str());
}

TEST(FarmemdCli, StopsCleanlyOnSigint) {
  Daemon d({"--insecure", "--listen=127.0.0.1:0", "--capacity=2M", "--slab-size=1M"});
  ASSERT_TRUE(d.wait_stdout("instance ")) << d.err;
  EXPECT_THAT(d.err, HasSubstr("running with --insecure"));
  d.signal(SIGINT);
  EXPECT_EQ(d.wait_exit(), 0) << d.err;
  EXPECT_THAT(d.out, HasSubstr("stopped by SIGINT"));
}

TEST(FarmemdCli, ConfigFileIsReadAndFlagsOverrideIt) {
  std::string conf = temp_file(
      "# donor for the cli test\n"
      "listen = 127.0.0.1:0\n"
      "capacity = 8M   # overridden below\n"
      "slab-size = 1M\n"
      "\n"
      "insecure = true\n"
      "heartbeat-grace = 3s\n");
  Daemon d({"--config", conf, "--capacity", "4M"});
  ASSERT_TRUE(d.wait_stdout("instance ")) << d.err;
  EXPECT_THAT(d.out, HasSubstr("capacity 4.0 MiB, slab size 1.0 MiB"));
  uint16_t port = listening_port(d.out);
  test::RawClient c;
  ASSERT_TRUE(c.connect(port).ok());
  auto w = c.handshake_control("");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->grace_ms, 3000u);
  d.signal(SIGTERM);
  EXPECT_EQ(d.wait_exit(), 0);
  unlink(conf.c_str());
}

TEST(FarmemdCli, BadConfigFileNamesTheLine) {
  std::string bad_value = temp_file("insecure = true\ncapacity = lots\n");
  Daemon a({"--config", bad_value});
  EXPECT_EQ(a.wait_exit(), 2);
  EXPECT_THAT(a.err, HasSubstr(bad_value + ":2: capacity=\"lots\" is not valid"));
  std::string bad_key = temp_file("capacity = 4M\ncolour = blue\n");
  Daemon b({"--config", bad_key});
  EXPECT_EQ(b.wait_exit(), 2);
  EXPECT_THAT(b.err, HasSubstr(bad_key + ":2: unknown key 'colour'"));
  std::string no_eq = temp_file("capacity 4M\n");
  Daemon c({"--config", no_eq});
  EXPECT_EQ(c.wait_exit(), 2);
  EXPECT_THAT(c.err, HasSubstr(":1: expected `key = value`"));
  Daemon e({"--config", "/nonexistent/farmemd.conf"});
  EXPECT_EQ(e.wait_exit(), 2);
  EXPECT_THAT(e.err, HasSubstr("cannot open"));
  for (const auto& f : {bad_value, bad_key, no_eq}) unlink(f.c_str());
}

}  // namespace
}  // namespace farmem
