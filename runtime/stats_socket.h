// StatsSocket: a far-memory process's live statistics on a Unix socket that
// only its own user can reach; `farmemctl stats PID` reads it.
//
//   auto sock = farmem::StatsSocket::start([&](farmem::StatsSnapshot& s) {
//     farmem::PagerStats p = pager.stats();          // whatever the process has
//     s.counter("faults_remote", p.faults_remote, "faults served by a READ from a donor");
//     s.gauge("resident_bytes", p.resident_bytes, "far memory resident here now");
//     s.counter("donor_read_bytes", n, "bytes read from one donor", "donor=10.0.0.5:7400");
//   });
//   if (!sock.ok()) FARMEM_LOG(kWarn, "no stats socket: %s", sock.status().to_string().c_str());
//   // ... (*sock)->path() is e.g. /run/user/1000/farmem/4242.sock; the destructor removes it.
//
//   auto snap = farmem::fetch_stats("/run/user/1000/farmem/4242.sock");   // the client side
//
// Where the socket lives (stats_socket_path()):
//   $XDG_RUNTIME_DIR/farmem/<pid>.sock   when XDG_RUNTIME_DIR is set
//   /tmp/farmem-<uid>/<pid>.sock         otherwise
// The directory is created 0700 and must be owned by the process's user
// with no group/other access (a directory someone else planted is refused);
// the socket is chmod 0600. Every connection is checked with SO_PEERCRED: a
// peer whose uid differs from the process's effective uid gets one `error`
// line saying so and the connection is closed. Root gets no exception.
//
// Protocol: the client connects and reads to EOF; the server writes one
// snapshot in the text format below and closes. Nothing is sent by the
// client. Fields are separated by one space; a line ends with '\n'.
//
//   farmem-stats 1                               format version
//   process <pid> <uid> <time_ms> <uptime_ms> <comm>
//                                                time_ms: Unix epoch ms of the
//                                                snapshot; uptime_ms: since
//                                                the socket started
//   counter <name> <labels> <value> <help...>    monotonic u64
//   gauge <name> <labels> <value> <help...>      u64 that goes up and down
//   histogram <name> <labels> <le>:<n>,...,inf:<n> <help...>
//                                                per-bucket (not cumulative)
//                                                counts; le = the bucket's
//                                                exclusive upper bound
//   end                                          absent = truncated
//
// or, for a refused peer, the single line `error <message>`.
// <name> is [a-zA-Z_][a-zA-Z0-9_]*; <labels> is `-` or k=v pairs joined by
// ',' (no space, comma or '=' inside a value); help is the rest of the line.
// The builder below replaces characters that would break a line.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/net.h"
#include "runtime/status.h"

namespace farmem {

struct StatsSample {
  enum class Kind : uint8_t { kCounter, kGauge };
  Kind kind = Kind::kCounter;
  std::string name;
  std::string labels;  // "" or "k=v,k=v"
  uint64_t value = 0;
  std::string help;
};

struct StatsBucket {
  static constexpr uint64_t kInf = UINT64_MAX;
  uint64_t le = kInf;  // exclusive upper bound
  uint64_t count = 0;  // samples in this bucket only
};

struct StatsHistogram {
  std::string name;
  std::string labels;
  std::vector<StatsBucket> buckets;  // ascending le
  std::string help;
  uint64_t total() const;
  // Upper bound of the bucket holding the q-quantile (0 < q <= 1); 0 when
  // empty, StatsBucket::kInf when it falls in the open last bucket.
  uint64_t quantile_bound(double q) const;
};

struct StatsSnapshot {
  // Filled by the server, not by the provider.
  int64_t pid = 0;
  int64_t uid = 0;
  int64_t time_ms = 0;
  int64_t uptime_ms = 0;
  std::string comm;

  std::vector<StatsSample> samples;
  std::vector<StatsHistogram> histograms;

  void counter(std::string_view name, uint64_t value, std::string_view help,
               std::string_view labels = {});
  void gauge(std::string_view name, uint64_t value, std::string_view help,
             std::string_view labels = {});
  void histogram(std::string_view name, std::vector<StatsBucket> buckets, std::string_view help,
                 std::string_view labels = {});

  const StatsSample* find(std::string_view name, std::string_view labels = {}) const;
  const StatsHistogram* find_histogram(std::string_view name, std::string_view labels = {}) const;
  // The sample's value, or `def` when absent.
  uint64_t value(std::string_view name, std::string_view labels = {}, uint64_t def = 0) const;
};

// The text format above.
std::string format_stats_text(const StatsSnapshot& s);
// Strict: unknown line kinds, bad numbers, a missing `end` are kProtocol;
// an `error` line is kPermissionDenied with its message.
Result<StatsSnapshot> parse_stats_text(std::string_view text);

// Fills the snapshot; runs on the server thread, once per reader, so it
// must be thread-safe with respect to the process and must not throw.
using StatsProvider = std::function<void(StatsSnapshot&)>;

struct StatsSocketOptions {
  std::string path;  // empty: stats_socket_path(getpid())
  // Runs first on the server thread, before anything there allocates (the
  // preload library marks the thread as local-only with it, invariant 3).
  std::function<void()> thread_init;
  int send_timeout_ms = 2000;  // a reader that does not take the snapshot is dropped
};

class StatsSocket {
 public:
  // Creates the directory (0700) if needed, replaces a stale socket of the
  // same pid, binds, chmods 0600 and starts the server thread.
  static Result<std::unique_ptr<StatsSocket>> start(StatsProvider provider,
                                                    StatsSocketOptions opts = {});
  ~StatsSocket();  // stop()
  StatsSocket(const StatsSocket&) = delete;
  StatsSocket& operator=(const StatsSocket&) = delete;

  void stop();  // idempotent: joins the thread, removes the socket file
  const std::string& path() const { return path_; }
  uint64_t served() const { return served_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  StatsSocket() = default;
  void loop();
  void serve(int fd);

  StatsProvider provider_;
  StatsSocketOptions opts_;
  std::string path_;
  Fd listen_;
  Fd wake_;  // eventfd: stop() wakes the poll
  std::thread thread_;
  int64_t started_ms_ = 0;
  dev_t dev_ = 0;  // identity of the socket file we bound
  ino_t ino_ = 0;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> served_{0}, refused_{0};
};

// The directory of this process's stats sockets for `uid` (see above),
// from this process's environment.
std::string stats_socket_dir(uid_t uid);
std::string stats_socket_path(pid_t pid);  // stats_socket_dir(geteuid()) + "/<pid>.sock"
// Where `farmemctl stats PID` looks, in order: its own $XDG_RUNTIME_DIR,
// /run/user/<uid of PID>, /tmp/farmem-<uid of PID>. Empty when PID does not
// exist.
std::vector<std::string> stats_socket_candidates(pid_t pid);

// Connects, reads one snapshot and parses it. kNotFound: no socket there;
// kPermissionDenied: the directory or the server refused this user;
// kUnavailable: a stale socket (process gone); kProtocol: not a farmem
// stats socket or truncated.
Result<StatsSnapshot> fetch_stats(const std::string& path, int timeout_ms = 3000);

}  // namespace farmem
