// farmemctl: watch farmem from the command line.
//
//   farmemctl status 10.0.0.5:7400 --token-file /etc/farmem/token    # a donor
//   farmemctl status 10.0.0.5:7400 --json --watch 2                   # JSON lines every 2 s
//   farmemctl stats 4242                                              # a far-memory process
//   farmemctl stats /run/user/1000/farmem/4242.sock --json
//
// `status` opens a control session to the donor (it needs the token, like
// any client) and asks STATS and CLIENTS; `stats` reads the process's stats
// socket (runtime/stats_socket.h), which only the process's own user can
// reach. Exit status: 0 ok, 1 the donor or process could not be read (the
// message says why), 2 bad usage.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/auth.h"
#include "runtime/donor_admin.h"
#include "runtime/parse.h"
#include "runtime/stats_socket.h"

namespace farmem {
namespace {

constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;

void print_help() {
  printf(
      "usage: farmemctl <command> [options]\n"
      "\n"
      "commands:\n"
      "  status HOST:PORT   a donor (farmemd): capacity, leased and free memory, traffic, and\n"
      "                     every client with its leases and traffic\n"
      "  stats PID|SOCKET   a running far-memory process: resident and remote bytes, faults by\n"
      "                     kind and their rate, fetch latency percentiles, evictions, prefetch\n"
      "                     accuracy, per-donor traffic. PID finds the socket in\n"
      "                     $XDG_RUNTIME_DIR/farmem/, /run/user/UID/farmem/ or /tmp/farmem-UID/;\n"
      "                     only the process's own user may read it\n"
      "  help               this text\n"
      "\n"
      "options:\n"
      "  --token-file FILE  status: the donor's shared token (default: $FARMEM_TOKEN_FILE;\n"
      "                     none works only with an --insecure donor)\n"
      "  --json             one JSON object (per refresh with --watch, one per line)\n"
      "  --watch SECONDS    refresh every SECONDS (fractions allowed) until interrupted; rates\n"
      "                     are then measured over the interval instead of since start\n"
      "  --count N          with --watch: stop after N refreshes\n"
      "  --timeout MS       connect and reply timeout (default 5000)\n"
      "\n"
      "exit status: 0 ok, 1 the donor or process could not be read, 2 bad usage\n"
      "example: farmemctl status 10.0.0.5:7400 --token-file /etc/farmem/token --watch 2\n");
}

[[noreturn]] void usage_error(const std::string& msg) {
  fprintf(stderr, "farmemctl: %s\n", msg.c_str());
  exit(kExitUsage);
}

struct Args {
  std::string command;
  std::string target;
  std::string token_file;
  bool json = false;
  double watch_s = 0;  // 0: once
  uint64_t count = 0;  // 0: forever
  int timeout_ms = 5000;
};

volatile sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

// ---- JSON output -------------------------------------------------------------

std::string jstr(std::string_view s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

std::string hex64(uint64_t v) {
  char b[17];
  snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  snprintf(b, sizeof b, "%.3f", v);
  return b;
}

std::string human_rate(double bytes_per_s) {
  return format_size(static_cast<uint64_t>(std::max(0.0, bytes_per_s))) + "/s";
}

std::string duration_text(uint64_t ms) {
  char b[32];
  if (ms < 10000)
    snprintf(b, sizeof b, "%.1fs", static_cast<double>(ms) / 1000);
  else if (ms < 3600000)
    snprintf(b, sizeof b, "%" PRIu64 "m%02" PRIu64 "s", ms / 60000, ms / 1000 % 60);
  else
    snprintf(b, sizeof b, "%" PRIu64 "h%02" PRIu64 "m", ms / 3600000, ms / 60000 % 60);
  return b;
}

// ---- status ------------------------------------------------------------------

struct DonorView {
  wire::StatsReply st;
  std::vector<wire::ClientInfo> clients;
  std::chrono::steady_clock::time_point at;
};

Result<DonorView> read_donor(const DonorAdminOptions& o) {
  auto a = DonorAdmin::connect(o);
  if (!a.ok()) return a.status();
  DonorView v;
  auto st = (*a)->stats();
  if (!st.ok()) return st.status();
  auto cl = (*a)->clients();
  if (!cl.ok()) return cl.status();
  v.st = *st;
  v.clients = std::move(*cl);
  v.at = std::chrono::steady_clock::now();
  // Leave this admin session out of the figures: it is not a client.
  if (v.st.clients > 0) --v.st.clients;
  if (v.st.connections > 0) --v.st.connections;
  return v;
}

std::string status_json(const std::string& donor, const DonorView& v, const DonorView* prev) {
  const auto& s = v.st;
  std::string o = "{";
  o += "\"donor\":" + jstr(donor);
  o += ",\"instance_id\":" + jstr(hex64(s.instance_id));
  o += ",\"capacity_bytes\":" + std::to_string(s.capacity);
  o += ",\"leased_bytes\":" + std::to_string(s.leased);
  o += ",\"free_bytes\":" + std::to_string(s.capacity - std::min(s.capacity, s.leased));
  o += ",\"slab_size_bytes\":" + std::to_string(s.slab_size);
  o += ",\"clients\":" + std::to_string(s.clients);
  o += ",\"connections\":" + std::to_string(s.connections);
  o += ",\"read_bytes\":" + std::to_string(s.bytes_read);
  o += ",\"written_bytes\":" + std::to_string(s.bytes_written);
  o += ",\"reads\":" + std::to_string(s.reads);
  o += ",\"writes\":" + std::to_string(s.writes);
  o += ",\"errors\":" + std::to_string(s.errors);
  o += ",\"sessions_expired\":" + std::to_string(s.sessions_expired);
  if (prev != nullptr) {
    double dt = std::chrono::duration<double>(v.at - prev->at).count();
    if (dt > 0) {
      o += ",\"read_bytes_per_s\":" +
           jnum(static_cast<double>(s.bytes_read - prev->st.bytes_read) / dt);
      o += ",\"written_bytes_per_s\":" +
           jnum(static_cast<double>(s.bytes_written - prev->st.bytes_written) / dt);
    }
  }
  o += ",\"client_list\":[";
  for (size_t i = 0; i < v.clients.size(); ++i) {
    const auto& c = v.clients[i];
    if (i) o += ',';
    o += "{\"session_id\":" + jstr(hex64(c.session_id));
    o += ",\"client_id\":" + jstr(hex64(c.client_id));
    o += ",\"peer\":" + jstr(c.peer);
    o += ",\"leased_bytes\":" + std::to_string(c.leased);
    o += ",\"read_bytes\":" + std::to_string(c.bytes_read);
    o += ",\"written_bytes\":" + std::to_string(c.bytes_written);
    o += ",\"reads\":" + std::to_string(c.reads);
    o += ",\"writes\":" + std::to_string(c.writes);
    o += ",\"data_connections\":" + std::to_string(c.data_conns);
    o += ",\"age_ms\":" + std::to_string(c.age_ms);
    o += ",\"idle_ms\":" + std::to_string(c.idle_ms) + "}";
  }
  return o + "]}";
}

std::string status_text(const std::string& donor, const DonorView& v, const DonorView* prev) {
  const auto& s = v.st;
  std::string o;
  char b[512];
  snprintf(b, sizeof b, "donor %s (instance %s)\n", donor.c_str(), hex64(s.instance_id).c_str());
  o += b;
  double pct =
      s.capacity ? 100.0 * static_cast<double>(s.leased) / static_cast<double>(s.capacity) : 0.0;
  snprintf(b, sizeof b, "  memory    capacity %s, leased %s (%.1f%%), free %s, slab size %s\n",
           format_size(s.capacity).c_str(), format_size(s.leased).c_str(), pct,
           format_size(s.capacity - std::min(s.capacity, s.leased)).c_str(),
           format_size(s.slab_size).c_str());
  o += b;
  snprintf(b, sizeof b,
           "  clients   %" PRIu64 " (%" PRIu64 " connections), %" PRIu64
           " expired for missed heartbeats, %" PRIu64 " requests refused\n",
           s.clients, s.connections, s.sessions_expired, s.errors);
  o += b;
  snprintf(
      b, sizeof b, "  traffic   read %s in %" PRIu64 " READs, written %s in %" PRIu64 " WRITEs",
      format_size(s.bytes_read).c_str(), s.reads, format_size(s.bytes_written).c_str(), s.writes);
  o += b;
  if (prev != nullptr) {
    double dt = std::chrono::duration<double>(v.at - prev->at).count();
    if (dt > 0) {
      snprintf(
          b, sizeof b, "; now %s read, %s written",
          human_rate(static_cast<double>(s.bytes_read - prev->st.bytes_read) / dt).c_str(),
          human_rate(static_cast<double>(s.bytes_written - prev->st.bytes_written) / dt).c_str());
      o += b;
    }
  }
  o += "\n\n";
  if (v.clients.empty()) return o + "  no clients\n";
  snprintf(b, sizeof b, "  %-16s %-16s %-22s %12s %12s %12s %5s %8s %8s\n", "SESSION", "CLIENT",
           "PEER", "LEASED", "READ", "WRITTEN", "CONNS", "AGE", "IDLE");
  o += b;
  for (const auto& c : v.clients) {
    snprintf(b, sizeof b, "  %-16s %-16s %-22s %12s %12s %12s %5u %8s %8s\n",
             hex64(c.session_id).c_str(), hex64(c.client_id).c_str(), c.peer.c_str(),
             format_size(c.leased).c_str(), format_size(c.bytes_read).c_str(),
             format_size(c.bytes_written).c_str(), c.data_conns, duration_text(c.age_ms).c_str(),
             duration_text(c.idle_ms).c_str());
    o += b;
  }
  return o;
}

int run_status(const Args& a) {
  DonorAdminOptions o;
  auto ep = parse_endpoint(a.target, "donor address", 7400);
  if (!ep.ok()) usage_error(ep.status().message());
  o.server = *ep;
  o.timeout_ms = a.timeout_ms;
  std::string tf = a.token_file;
  if (tf.empty() && getenv("FARMEM_TOKEN_FILE") != nullptr) tf = getenv("FARMEM_TOKEN_FILE");
  if (!tf.empty()) {
    auto t = read_token_file(tf);
    if (!t.ok()) {
      fprintf(stderr, "farmemctl: --token-file: %s\n", t.status().message().c_str());
      return kExitFail;
    }
    o.token = std::move(*t);
  }
  const std::string donor = o.server.to_string();
  std::optional<DonorView> prev;
  for (uint64_t n = 0;; ++n) {
    auto v = read_donor(o);
    if (!v.ok()) {
      fprintf(stderr, "farmemctl: cannot read donor %s: %s\n", donor.c_str(),
              v.status().to_string().c_str());
      return kExitFail;
    }
    const DonorView* p = prev ? &*prev : nullptr;
    if (a.json) {
      printf("%s\n", status_json(donor, *v, p).c_str());
    } else {
      if (a.watch_s > 0 && isatty(STDOUT_FILENO)) printf("\033[H\033[2J");
      printf("%s", status_text(donor, *v, p).c_str());
      if (a.watch_s > 0) printf("\n");
    }
    fflush(stdout);
    prev = std::move(*v);
    if (a.watch_s <= 0 || (a.count && n + 1 >= a.count)) return 0;
    for (double slept = 0; slept < a.watch_s && !g_stop; slept += 0.05)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_stop) return 0;
  }
}

// ---- stats -------------------------------------------------------------------

Result<std::string> resolve_socket(const std::string& target) {
  if (target.find('/') != std::string::npos) return target;
  auto pid = parse_uint(target, "PID", 1, 0x7fffffff);
  if (!pid.ok())
    return make_error(Errc::kInvalidArgument,
                      "'%s' is neither a process id nor a socket path (a path contains '/')",
                      target.c_str());
  auto cands = stats_socket_candidates(static_cast<pid_t>(*pid));
  if (cands.empty())
    return make_error(Errc::kNotFound, "no process %s: check the pid (ps -e)", target.c_str());
  std::string looked;
  for (const auto& c : cands) {
    struct stat st {};
    if (lstat(c.c_str(), &st) == 0) return c;
    if (errno == EACCES)
      return make_error(Errc::kPermissionDenied,
                        "cannot look into %s: the stats directory is private to the process's "
                        "user; run farmemctl as that user",
                        c.c_str());
    looked += (looked.empty() ? "" : ", ") + c;
  }
  return make_error(Errc::kNotFound,
                    "process %s has no farmem stats socket (looked for %s): is it a farmem "
                    "process with statistics on?",
                    target.c_str(), looked.c_str());
}

// Rate per second of a counter: over the watch interval when there is a
// previous snapshot, else since the socket started.
double rate(const StatsSnapshot& s, const StatsSample& m, const StatsSnapshot* prev) {
  if (prev != nullptr) {
    const StatsSample* p = prev->find(m.name, m.labels);
    double dt = static_cast<double>(s.time_ms - prev->time_ms) / 1000;
    if (p != nullptr && dt > 0 && m.value >= p->value)
      return static_cast<double>(m.value - p->value) / dt;
  }
  if (s.uptime_ms <= 0) return 0;
  return static_cast<double>(m.value) * 1000 / static_cast<double>(s.uptime_ms);
}

std::string key_of(const StatsSample& m) {
  return m.labels.empty() ? m.name : m.name + "{" + m.labels + "}";
}

std::optional<double> prefetch_accuracy(const StatsSnapshot& s) {
  const StatsSample* used = s.find("prefetch_used");
  const StatsSample* unused = s.find("prefetch_unused");
  if (used == nullptr || unused == nullptr || used->value + unused->value == 0) return std::nullopt;
  return static_cast<double>(used->value) / static_cast<double>(used->value + unused->value);
}

std::string stats_json(const std::string& path, const StatsSnapshot& s, const StatsSnapshot* prev) {
  std::string o = "{";
  o += "\"pid\":" + std::to_string(s.pid);
  o += ",\"uid\":" + std::to_string(s.uid);
  o += ",\"comm\":" + jstr(s.comm);
  o += ",\"socket\":" + jstr(path);
  o += ",\"time_ms\":" + std::to_string(s.time_ms);
  o += ",\"uptime_ms\":" + std::to_string(s.uptime_ms);
  for (auto kind : {StatsSample::Kind::kCounter, StatsSample::Kind::kGauge}) {
    o += kind == StatsSample::Kind::kCounter ? ",\"counters\":{" : ",\"gauges\":{";
    bool first = true;
    for (const auto& m : s.samples) {
      if (m.kind != kind) continue;
      o += (first ? "" : ",") + jstr(key_of(m)) + ":" + std::to_string(m.value);
      first = false;
    }
    o += "}";
  }
  o += ",\"rates_per_s\":{";
  bool first = true;
  for (const auto& m : s.samples) {
    if (m.kind != StatsSample::Kind::kCounter) continue;
    o += (first ? "" : ",") + jstr(key_of(m)) + ":" + jnum(rate(s, m, prev));
    first = false;
  }
  o += "},\"histograms\":{";
  first = true;
  for (const auto& h : s.histograms) {
    auto q = [&](double x) {
      uint64_t b = h.quantile_bound(x);
      return h.total() == 0 || b == StatsBucket::kInf ? std::string("null") : std::to_string(b);
    };
    o += (first ? "" : ",") + jstr(h.labels.empty() ? h.name : h.name + "{" + h.labels + "}");
    o += ":{\"count\":" + std::to_string(h.total()) + ",\"p50\":" + q(0.5) + ",\"p90\":" + q(0.9) +
         ",\"p99\":" + q(0.99) + ",\"buckets\":[";
    for (size_t i = 0; i < h.buckets.size(); ++i) {
      const auto& b = h.buckets[i];
      o += (i ? ",[" : "[") +
           (b.le == StatsBucket::kInf ? std::string("null") : std::to_string(b.le)) + "," +
           std::to_string(b.count) + "]";
    }
    o += "]}";
    first = false;
  }
  o += "}";
  auto acc = prefetch_accuracy(s);
  o += ",\"prefetch_accuracy\":" + (acc ? jnum(*acc) : std::string("null"));
  return o + "}";
}

std::string stats_text(const std::string& path, const StatsSnapshot& s, const StatsSnapshot* prev) {
  std::string o;
  char b[512];
  snprintf(b, sizeof b, "process %" PRId64 " (%s), uid %" PRId64 ", stats up %s\n  socket %s\n",
           s.pid, s.comm.c_str(), s.uid, duration_text(static_cast<uint64_t>(s.uptime_ms)).c_str(),
           path.c_str());
  o += b;
  const char* rate_what = prev ? "rate/s (interval)" : "rate/s (since start)";
  auto has = [&](const char* n) { return s.find(n) != nullptr; };
  if (has("resident_bytes") || has("remote_bytes")) {
    snprintf(b, sizeof b, "  memory    resident %s of budget %s (peak %s), remote %s\n",
             format_size(s.value("resident_bytes")).c_str(),
             format_size(s.value("budget_bytes")).c_str(),
             format_size(s.value("resident_peak_bytes")).c_str(),
             format_size(s.value("remote_bytes")).c_str());
    o += b;
  }
  std::vector<bool> shown(s.samples.size(), false);
  // Faults by kind.
  bool any_fault = false;
  for (size_t i = 0; i < s.samples.size(); ++i) {
    const auto& m = s.samples[i];
    if (!m.name.starts_with("faults_") || m.kind != StatsSample::Kind::kCounter) continue;
    if (!any_fault) {
      snprintf(b, sizeof b, "  faults    %-16s %14s %20s\n", "kind", "count", rate_what);
      o += b;
      any_fault = true;
    }
    snprintf(b, sizeof b, "            %-16s %14" PRIu64 " %20.1f\n", key_of(m).c_str() + 7,
             m.value, rate(s, m, prev));
    o += b;
    shown[i] = true;
  }
  for (const auto& h : s.histograms) {
    auto q = [&](double x) {
      uint64_t v = h.quantile_bound(x);
      return v == StatsBucket::kInf ? std::string("inf") : "<" + std::to_string(v);
    };
    snprintf(b, sizeof b, "  %-9s %s: p50 %s, p90 %s, p99 %s (%" PRIu64 " samples)\n",
             h.name.ends_with("_us") ? "latency" : "histogram",
             key_of(StatsSample{{}, h.name, h.labels, 0, {}}).c_str(), q(0.5).c_str(),
             q(0.9).c_str(), q(0.99).c_str(), h.total());
    if (h.total() == 0)
      snprintf(b, sizeof b, "  %-9s %s: no samples yet\n",
               h.name.ends_with("_us") ? "latency" : "histogram", h.name.c_str());
    o += b;
  }
  if (has("evictions_clean") || has("evictions_dirty")) {
    snprintf(b, sizeof b, "  evictions clean %" PRIu64 ", dirty %" PRIu64 " (written back first)\n",
             s.value("evictions_clean"), s.value("evictions_dirty"));
    o += b;
  }
  if (has("prefetch_issued")) {
    auto acc = prefetch_accuracy(s);
    snprintf(b, sizeof b,
             "  prefetch  issued %" PRIu64 ", used %" PRIu64 ", unused %" PRIu64 ", accuracy %s\n",
             s.value("prefetch_issued"), s.value("prefetch_used"), s.value("prefetch_unused"),
             acc ? (std::to_string(static_cast<int>(std::lround(*acc * 1000)) / 10) + "." +
                    std::to_string(static_cast<int>(std::lround(*acc * 1000)) % 10) + "%")
                       .c_str()
                 : "n/a");
    o += b;
  }
  for (size_t i = 0; i < s.samples.size(); ++i) {
    const auto& m = s.samples[i];
    if (m.name.starts_with("evictions_") || m.name.starts_with("prefetch_") ||
        m.name == "resident_bytes" || m.name == "resident_peak_bytes" || m.name == "budget_bytes" ||
        m.name == "remote_bytes")
      shown[i] = true;
  }
  // Per-donor traffic: every sample labelled donor=...
  std::map<std::string, std::vector<size_t>> donors;
  for (size_t i = 0; i < s.samples.size(); ++i)
    if (s.samples[i].labels.starts_with("donor=")) {
      donors[s.samples[i].labels.substr(6)].push_back(i);
      shown[i] = true;
    }
  for (const auto& [d, idx] : donors) {
    o += "  donor     " + d + ":";
    for (size_t i : idx) {
      const auto& m = s.samples[i];
      bool bytes = m.name.ends_with("_bytes");
      o += " " + m.name + " " + (bytes ? format_size(m.value) : std::to_string(m.value));
      if (m.kind == StatsSample::Kind::kCounter && bytes)
        o += " (" + human_rate(rate(s, m, prev)) + ")";
      o += ";";
    }
    o.back() = '\n';
  }
  bool header = false;
  for (size_t i = 0; i < s.samples.size(); ++i) {
    if (shown[i]) continue;
    if (!header) {
      o += "  other\n";
      header = true;
    }
    const auto& m = s.samples[i];
    snprintf(b, sizeof b, "            %-32s %14" PRIu64 "  %s\n", key_of(m).c_str(), m.value,
             m.help.c_str());
    o += b;
  }
  return o;
}

int run_stats(const Args& a) {
  auto path = resolve_socket(a.target);
  if (!path.ok()) {
    fprintf(stderr, "farmemctl: %s\n", path.status().message().c_str());
    return path.status().code() == Errc::kInvalidArgument ? kExitUsage : kExitFail;
  }
  std::optional<StatsSnapshot> prev;
  for (uint64_t n = 0;; ++n) {
    auto s = fetch_stats(*path, a.timeout_ms);
    if (!s.ok()) {
      fprintf(stderr, "farmemctl: cannot read the stats of %s: %s\n", a.target.c_str(),
              s.status().to_string().c_str());
      return kExitFail;
    }
    const StatsSnapshot* p = prev ? &*prev : nullptr;
    if (a.json) {
      printf("%s\n", stats_json(*path, *s, p).c_str());
    } else {
      if (a.watch_s > 0 && isatty(STDOUT_FILENO)) printf("\033[H\033[2J");
      printf("%s", stats_text(*path, *s, p).c_str());
      if (a.watch_s > 0) printf("\n");
    }
    fflush(stdout);
    prev = std::move(*s);
    if (a.watch_s <= 0 || (a.count && n + 1 >= a.count)) return 0;
    for (double slept = 0; slept < a.watch_s && !g_stop; slept += 0.05)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_stop) return 0;
  }
}

int run(int argc, char** argv) {
  Args a;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string_view s = argv[i];
    auto value = [&](const char* flag) -> std::string {
      size_t eq = s.find('=');
      if (eq != std::string_view::npos) return std::string(s.substr(eq + 1));
      if (i + 1 >= argc) usage_error(std::string(flag) + " needs a value; see farmemctl --help");
      return argv[++i];
    };
    auto is = [&](const char* flag) {
      return s == flag ||
             (s.starts_with(flag) && s.size() > strlen(flag) && s[strlen(flag)] == '=');
    };
    if (s == "-h" || s == "--help" || s == "help") {
      print_help();
      return 0;
    } else if (s == "--json") {
      a.json = true;
    } else if (is("--token-file")) {
      a.token_file = value("--token-file");
    } else if (is("--watch")) {
      std::string v = value("--watch");
      char* end = nullptr;
      a.watch_s = strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(a.watch_s > 0) || a.watch_s > 86400)
        usage_error("--watch " + v + ": expected seconds above 0 (e.g. 1, 0.5)");
    } else if (is("--count")) {
      auto r = parse_uint(value("--count"), "--count", 1, UINT32_MAX);
      if (!r.ok()) usage_error(r.status().message());
      a.count = *r;
    } else if (is("--timeout")) {
      auto r = parse_uint(value("--timeout"), "--timeout", 1, 600000);
      if (!r.ok()) usage_error(r.status().message());
      a.timeout_ms = static_cast<int>(*r);
    } else if (s.starts_with("-")) {
      usage_error("unknown option " + std::string(s) + "; see farmemctl --help");
    } else {
      pos.emplace_back(s);
    }
  }
  if (pos.empty()) usage_error("no command: use status HOST:PORT or stats PID; see --help");
  a.command = pos[0];
  if (a.command != "status" && a.command != "stats")
    usage_error("unknown command '" + a.command + "': use status or stats; see --help");
  if (pos.size() != 2)
    usage_error(a.command == "status" ? "status needs exactly one donor address HOST:PORT"
                                      : "stats needs exactly one PID or socket path");
  a.target = pos[1];
  if (a.command == "stats" && !a.token_file.empty())
    usage_error("--token-file is for status: a stats socket is protected by its user instead");

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return a.command == "status" ? run_status(a) : run_stats(a);
}

}  // namespace
}  // namespace farmem

int main(int argc, char** argv) {
  return farmem::run(argc, argv);
}
