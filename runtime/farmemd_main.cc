// farmemd: the farmem donor daemon. Lends a bounded amount of this machine's
// memory to authenticated farmem clients.
//
//   farmemd --listen 10.0.0.5:7400 --capacity 64G --token-file /etc/farmem/token
//   farmemd --config /etc/farmem/farmemd.conf --log-level debug
//
// Flags and the config file share one table (kFlags below): the file holds
// `key = value` lines with the long flag names and `#` comments; flags given
// on the command line override the file. A bad value is one line on stderr
// naming the flag and what it expects, and exit status 2.
#include <signal.h>
#include <sys/resource.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/auth.h"
#include "runtime/donor_server.h"
#include "runtime/log.h"
#include "runtime/parse.h"

namespace farmem {
namespace {

constexpr int kExitUsage = 2;

struct FlagDef {
  const char* name;
  const char* arg;  // nullptr: a switch without a value
  const char* def;
  const char* doc;
};

// The one table of options: name, value syntax, default, documentation.
constexpr FlagDef kFlags[] = {
    {"listen", "HOST:PORT", "127.0.0.1:7400",
     "address to serve on; port 0 picks a free port (printed at start)"},
    {"capacity", "SIZE", "1G", "memory lent at most, reserved at start (e.g. 512M, 64G)"},
    {"slab-size", "SIZE", "64M", "lease granularity; --capacity must be a multiple of it"},
    {"token-file", "FILE", "none",
     "shared secret that clients must prove they hold (chmod 600 the file)"},
    {"insecure", nullptr, "off",
     "run without a token: ANY client that reaches the port gets in (tests only)"},
    {"transport", "auto|tcp|verbs", "auto",
     "data path; auto: verbs too when an RDMA device owns the listen address"},
    {"follow-cpu", "on|off", "on",
     "serve each data connection from this host on the CPU that sends its requests"},
    {"local-clients", "on|off", "on",
     "a client on this host reads and writes its slabs itself, one-sided (tcp-only donors)"},
    {"max-clients", "N", "256", "client sessions served at once"},
    {"quota-per-client", "SIZE", "0", "most one client may lease; 0 = up to --capacity"},
    {"heartbeat-interval", "DURATION", "1s", "heartbeat period asked of clients"},
    {"heartbeat-grace", "DURATION", "5s",
     "a client silent this long loses its leases (e.g. 500ms, 5s)"},
    {"metrics-listen", "[HOST:]PORT", "off",
     "serve Prometheus metrics at http://HOST:PORT/metrics (HOST defaults to 127.0.0.1; no "
     "token is asked: keep it on loopback or a management network)"},
    {"log-level", "error|warn|info|debug", "info", "messages on stderr at or above this level"},
    {"config", "FILE", "none", "read `key = value` lines (long flag names, # comments) first"},
    {"help", nullptr, "", "print this help and exit"},
};

const FlagDef* find_flag(std::string_view name) {
  for (const auto& f : kFlags)
    if (name == f.name) return &f;
  return nullptr;
}

void print_help() {
  printf(
      "usage: farmemd [flags]\n"
      "Lends up to --capacity bytes of this machine's memory, in slabs, to farmem clients\n"
      "that hold the shared token. SIGTERM or SIGINT stops it cleanly.\n\n"
      "flags (also --flag=value):\n");
  for (const auto& f : kFlags) {
    std::string lhs = std::string("--") + f.name + (f.arg ? std::string(" ") + f.arg : "");
    printf("  %-36s %s", lhs.c_str(), f.doc);
    if (f.def[0] != '\0') printf(" (default: %s)", f.def);
    printf("\n");
  }
  printf(
      "\nSIZE: 4096, 64K, 512M, 2G, 1T (binary multiples). DURATION: 1500, 1500ms, 2s, 1m.\n"
      "example: farmemd --listen 10.0.0.5:7400 --capacity 64G --token-file /etc/farmem/token\n");
}

[[noreturn]] void usage_error(const std::string& msg) {
  fprintf(stderr, "farmemd: %s\n", msg.c_str());
  exit(kExitUsage);
}

struct Settings {
  DonorOptions opts;
  std::string token_file;
  LogLevel log_level = LogLevel::kInfo;
};

Result<bool> parse_bool(std::string_view v, const std::string& what) {
  if (v == "true" || v == "yes" || v == "on" || v == "1") return true;
  if (v == "false" || v == "no" || v == "off" || v == "0") return false;
  return make_error(Errc::kInvalidArgument, "%s=\"%.*s\" is not valid: expected true or false",
                    what.c_str(), static_cast<int>(v.size()), v.data());
}

// "HOST:PORT" where, unlike parse_endpoint, port 0 is allowed.
Result<Endpoint> parse_listen(std::string_view v, const std::string& what) {
  size_t colon = v.rfind(':');
  if (colon != std::string_view::npos && v.substr(colon + 1) == "0") {
    auto ep = parse_endpoint(std::string(v.substr(0, colon)) + ":1", what);
    if (!ep.ok()) return ep.status();
    ep->port = 0;
    return ep;
  }
  return parse_endpoint(v, what, 7400);
}

// Applies one option; `what` names it in errors ("--capacity" or
// "farmemd.conf:3: capacity").
Status apply(Settings* s, const FlagDef& f, std::string_view v, const std::string& what) {
  std::string_view name = f.name;
  DonorOptions& o = s->opts;
  if (name == "listen") {
    auto r = parse_listen(v, what);
    if (!r.ok()) return r.status();
    o.listen = *r;
  } else if (name == "capacity" || name == "slab-size" || name == "quota-per-client") {
    auto r = parse_size(v, what);
    if (!r.ok()) return r.status();
    if (*r == 0 && name != "quota-per-client")
      return make_error(Errc::kInvalidArgument, "%s=0 is not valid: expected a size above 0",
                        what.c_str());
    if (name == "slab-size" && *r % 4096 != 0)
      return make_error(Errc::kInvalidArgument,
                        "%s=%.*s is not valid: expected a multiple of 4 KiB (e.g. 1M, 64M)",
                        what.c_str(), static_cast<int>(v.size()), v.data());
    (name == "capacity" ? o.capacity : name == "slab-size" ? o.slab_size : o.quota_per_client) = *r;
  } else if (name == "metrics-listen") {
    if (v == "off" || v == "none") {
      o.metrics_listen.reset();
      return ok_status();
    }
    // "9400" and ":9400" mean loopback.
    std::string full(v);
    if (full.find(':') == std::string::npos) full = "127.0.0.1:" + full;
    if (full.front() == ':') full = "127.0.0.1" + full;
    auto r = parse_listen(full, what);
    if (!r.ok()) return r.status();
    o.metrics_listen = *r;
  } else if (name == "token-file") {
    if (v.empty())
      return make_error(Errc::kInvalidArgument, "%s is empty: expected a file name", what.c_str());
    s->token_file = std::string(v);
  } else if (name == "follow-cpu") {
    auto r = parse_bool(v, what);
    if (!r.ok()) return r.status();
    o.follow_local_senders = *r;
  } else if (name == "local-clients") {
    auto r = parse_bool(v, what);
    if (!r.ok()) return r.status();
    o.local_clients = *r;
  } else if (name == "insecure") {
    auto r = parse_bool(v, what);
    if (!r.ok()) return r.status();
    o.insecure = *r;
  } else if (name == "transport") {
    if (v == "auto")
      o.transport = DonorTransportMode::kAuto;
    else if (v == "tcp")
      o.transport = DonorTransportMode::kTcp;
    else if (v == "verbs")
      o.transport = DonorTransportMode::kVerbs;
    else
      return make_error(Errc::kInvalidArgument,
                        "%s=\"%.*s\" is not valid: expected auto, tcp or verbs", what.c_str(),
                        static_cast<int>(v.size()), v.data());
  } else if (name == "max-clients") {
    auto r = parse_uint(v, what, 1, 1u << 20);
    if (!r.ok()) return r.status();
    o.max_clients = static_cast<uint32_t>(*r);
  } else if (name == "heartbeat-interval" || name == "heartbeat-grace") {
    auto r = parse_duration_ms(v, what);
    if (!r.ok()) return r.status();
    if (*r == 0 || *r > UINT32_MAX)
      return make_error(Errc::kInvalidArgument,
                        "%s=\"%.*s\" is not valid: expected a duration from 1ms to 49 days",
                        what.c_str(), static_cast<int>(v.size()), v.data());
    (name == "heartbeat-grace" ? o.grace_ms : o.heartbeat_ms) = static_cast<uint32_t>(*r);
  } else if (name == "log-level") {
    if (!parse_log_level(v, &s->log_level))
      return make_error(Errc::kInvalidArgument,
                        "%s=\"%.*s\" is not valid: expected error, warn, info or debug",
                        what.c_str(), static_cast<int>(v.size()), v.data());
  }
  return ok_status();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// Reads `key = value` lines; each entry keeps its "file:line: key" label.
void read_config(const std::string& path,
                 std::vector<std::tuple<const FlagDef*, std::string, std::string>>* out) {
  std::ifstream in(path);
  if (!in)
    usage_error("--config " + path + ": cannot open: " + strerror(errno) +
                "; give a readable file or drop --config");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::string_view l = line;
    // A '#' starting the line or following a blank opens a comment.
    for (size_t i = 0; i < l.size(); ++i)
      if (l[i] == '#' && (i == 0 || l[i - 1] == ' ' || l[i - 1] == '\t')) {
        l = l.substr(0, i);
        break;
      }
    l = trim(l);
    if (l.empty()) continue;
    std::string where = path + ":" + std::to_string(n);
    size_t eq = l.find('=');
    if (eq == std::string_view::npos)
      usage_error(where + ": expected `key = value` (long flag names, e.g. capacity = 64G)");
    std::string_view key = trim(l.substr(0, eq));
    std::string_view val = trim(l.substr(eq + 1));
    if (key.starts_with("--")) key.remove_prefix(2);
    const FlagDef* f = find_flag(key);
    if (f == nullptr || key == "help" || key == "config")
      usage_error(where + ": unknown key '" + std::string(key) + "'; see farmemd --help");
    out->emplace_back(f, std::string(val), where + ": " + std::string(key));
  }
}

int run(int argc, char** argv) {
  std::vector<std::tuple<const FlagDef*, std::string, std::string>> cli;
  std::string config;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      print_help();
      return 0;
    }
    if (!a.starts_with("--"))
      usage_error("unexpected argument '" + std::string(a) +
                  "': flags start with --; see farmemd --help");
    a.remove_prefix(2);
    std::string_view name = a.substr(0, a.find('='));
    const FlagDef* f = find_flag(name);
    if (f == nullptr) usage_error("unknown flag --" + std::string(name) + "; see farmemd --help");
    std::string value;
    if (a.find('=') != std::string_view::npos) {
      value = std::string(a.substr(a.find('=') + 1));
    } else if (f->arg == nullptr) {
      value = "true";
    } else {
      if (i + 1 >= argc)
        usage_error("--" + std::string(name) + " needs a value (" + f->arg + "); see --help");
      value = argv[++i];
    }
    if (name == "config")
      config = value;
    else
      cli.emplace_back(f, value, "--" + std::string(name));
  }

  std::vector<std::tuple<const FlagDef*, std::string, std::string>> all;
  if (!config.empty()) read_config(config, &all);
  all.insert(all.end(), cli.begin(), cli.end());  // flags override the file
  Settings s;
  for (const auto& [f, v, what] : all) {
    Status st = apply(&s, *f, v, what);
    if (!st.ok()) usage_error(st.message());
  }
  set_log_level(s.log_level);
  DonorOptions& o = s.opts;

  if (o.capacity % o.slab_size != 0)
    usage_error("--capacity (" + std::to_string(o.capacity) +
                " bytes) must be a whole number of --slab-size (" + std::to_string(o.slab_size) +
                " bytes): round one of them");
  if (o.grace_ms <= o.heartbeat_ms)
    usage_error("--heartbeat-grace (" + std::to_string(o.grace_ms) +
                " ms) must be longer than --heartbeat-interval (" + std::to_string(o.heartbeat_ms) +
                " ms)");
  if (!s.token_file.empty()) {
    auto t = read_token_file(s.token_file);
    if (!t.ok()) usage_error("--token-file: " + t.status().message());
    o.token = std::move(*t);
  } else if (!o.insecure) {
    usage_error(
        "refusing to start without a token: pass --token-file FILE (a shared secret the "
        "clients also hold, e.g. `head -c 32 /dev/urandom | base64 > FILE`), or --insecure to "
        "let any client in");
  }

  // Signals are taken synchronously by sigwait() below; every thread the
  // server starts inherits the blocked mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Every connection is a descriptor, and so is each slab a client on this
  // host reads through its file (SlabPool: at most a quarter of the limit):
  // a server takes the hard limit, not the shell's soft 1024.
  if (rlimit nofile{};
      getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &nofile);
  }

  auto srv = DonorServer::start(o);
  if (!srv.ok()) {
    fprintf(stderr, "farmemd: cannot start: %s\n", srv.status().to_string().c_str());
    return srv.status().code() == Errc::kInvalidArgument ? kExitUsage : 1;
  }
  DonorServer& d = **srv;
  Endpoint bound = o.listen;
  bound.port = d.port();
  printf("farmemd listening on %s, capacity %s, slab size %s, transport tcp%s, instance %016" PRIx64
         "\n",
         bound.to_string().c_str(), format_size(o.capacity).c_str(),
         format_size(o.slab_size).c_str(), d.huge_pages() ? ", huge pages" : "", d.instance_id());
  if (o.metrics_listen) {
    Endpoint m = *o.metrics_listen;
    m.port = d.metrics_port();
    printf("farmemd metrics at http://%s/metrics\n", m.to_string().c_str());
  }
  fflush(stdout);

  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  wire::StatsReply st = d.stats();
  d.stop();
  printf("farmemd stopped by %s: %" PRIu64 " reads (%s), %" PRIu64 " writes (%s), %" PRIu64
         " errors, %" PRIu64 " sessions expired, %" PRIu64 " clients connected at exit\n",
         sig == SIGINT ? "SIGINT" : "SIGTERM", st.reads, format_size(st.bytes_read).c_str(),
         st.writes, format_size(st.bytes_written).c_str(), st.errors, st.sessions_expired,
         st.clients);
  if (const uint64_t n = d.local_slabs_lent(); n > 0)
    printf("farmemd: %" PRIu64
           " slabs were lent to clients on this host, which read and wrote them one-sided "
           "(their traffic is not in the counts above; --local-clients=off puts it on tcp)\n",
           n);
  fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace farmem

int main(int argc, char** argv) {
  return farmem::run(argc, argv);
}
