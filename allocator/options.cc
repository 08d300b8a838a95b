#include "allocator/options.h"

#include <cstdlib>
#include <cstring>

namespace farmem {
namespace {

constexpr EnvVar kEnv[] = {
    {"FARMEM_SERVERS", "(none)",
     "donors as HOST:PORT[,HOST:PORT...]; required unless FARMEM_TRANSPORT=loopback"},
    {"FARMEM_TRANSPORT", "auto",
     "auto (verbs when an RDMA device reaches every donor, else tcp; logs which), tcp, verbs "
     "(farmemd donors over RDMA; a start-up error when unavailable) or loopback (an in-process "
     "donor: tests, measuring the pager)"},
    {"FARMEM_REPLICAS", "1",
     "copies of every written-back page, each on a different donor (1, 2 or 3; at most the "
     "number of FARMEM_SERVERS); with 2 or 3 a donor can die without loss: reads fail over and "
     "the lost copies are rebuilt on the other donors in the background"},
    {"FARMEM_TOKEN_FILE", "(none)",
     "file holding the donors' shared token; unset = no token (insecure donors only)"},
    {"FARMEM_LOCAL_MEM", "256M",
     "local budget for far pages resident in this process: bytes (2G) or % of RAM (25%)"},
    {"FARMEM_MIN_FAR", "16K",
     "preload: allocations smaller than this stay in local memory (glibc); 0 = all far"},
    {"FARMEM_STATS", "0", "preload: 1 prints a summary of far-memory use on stderr at exit"},
    {"FARMEM_STATS_SOCKET", "1",
     "1 serves live statistics on a private Unix socket ($XDG_RUNTIME_DIR/farmem/PID.sock or "
     "/tmp/farmem-UID/PID.sock) for `farmemctl stats PID`; 0 = none"},
    {"FARMEM_ON_NO_DONOR", "fail",
     "preload: when no donor can be reached at start-up, fail (exit 1) or local (warn and "
     "run all-local)"},
    {"FARMEM_LOOPBACK_CAPACITY", "1G", "loopback: size of the in-process donor"},
    {"FARMEM_DECAY_MS", "1000",
     "freed far pages are dropped (no write-back, budget freed) after this long; 0 = at once"},
    {"FARMEM_CONNECT_TIMEOUT_MS", "3000", "how long to try each donor at start-up"},
    {"FARMEM_BLOCK_SIZE", "4K", "pager fetch granularity, a power of two from 4K to 2M"},
    {"FARMEM_PAGER_THREADS", "cores/2 (1..8)", "pager fault-handler threads"},
    {"FARMEM_PREFETCH", "1", "pager stream prefetch: 0 or 1"},
    {"FARMEM_LOG_LEVEL", "info", "error, warn, info or debug"},
};

}  // namespace

bool parse_far_transport(const char* text, FarTransport* out) {
  static constexpr struct {
    const char* name;
    FarTransport t;
  } kNames[] = {{"auto", FarTransport::kAuto},
                {"tcp", FarTransport::kTcp},
                {"verbs", FarTransport::kVerbs},
                {"loopback", FarTransport::kLoopback}};
  for (const auto& n : kNames) {
    if (strcmp(text, n.name) == 0) {
      *out = n.t;
      return true;
    }
  }
  return false;
}

std::span<const EnvVar> env_table() {
  return kEnv;
}

std::string env_table_markdown() {
  std::string s = "| variable | default | meaning |\n| --- | --- | --- |\n";
  for (const EnvVar& v : kEnv) {
    s += "| `";
    s += v.name;
    s += "` | ";
    s += v.def;
    s += " | ";
    s += v.doc;
    s += " |\n";
  }
  return s;
}

Result<FarOptions> options_from_env() {
  FarOptions o;
  if (const char* v = getenv("FARMEM_TRANSPORT")) {
    if (!parse_far_transport(v, &o.transport)) {
      return make_error(Errc::kInvalidArgument,
                        "FARMEM_TRANSPORT=%s: unknown transport; use auto, tcp, verbs or loopback",
                        v);
    }
  }
  if (const char* v = getenv("FARMEM_SERVERS"); v && *v) {
    auto r = parse_endpoint_list(v, "FARMEM_SERVERS", 7400);
    if (!r.ok()) return r.status();
    o.servers = std::move(*r);
  }
  if (const char* v = getenv("FARMEM_REPLICAS")) {
    auto r = parse_uint(v, "FARMEM_REPLICAS", 1, 3);
    if (!r.ok()) return r.status();
    o.replicas = static_cast<uint32_t>(*r);
    if (!o.servers.empty() && o.replicas > o.servers.size()) {
      return make_error(Errc::kInvalidArgument,
                        "FARMEM_REPLICAS=%u needs at least %u donors, but FARMEM_SERVERS names "
                        "%zu; list more donors or lower FARMEM_REPLICAS",
                        o.replicas, o.replicas, o.servers.size());
    }
  }
  if (const char* v = getenv("FARMEM_TOKEN_FILE"); v && *v) o.token_file = v;
  if (const char* v = getenv("FARMEM_MIN_FAR")) {
    auto r = parse_size(v, "FARMEM_MIN_FAR");
    if (!r.ok()) return r.status();
    o.min_far = *r;
  }
  if (const char* v = getenv("FARMEM_STATS")) {
    auto r = parse_uint(v, "FARMEM_STATS", 0, 1);
    if (!r.ok()) return r.status();
    o.stats = *r == 1;
  }
  if (const char* v = getenv("FARMEM_STATS_SOCKET")) {
    auto r = parse_uint(v, "FARMEM_STATS_SOCKET", 0, 1);
    if (!r.ok()) return r.status();
    o.stats_socket = *r == 1;
  }
  if (const char* v = getenv("FARMEM_ON_NO_DONOR")) {
    if (strcmp(v, "fail") == 0) {
      o.on_no_donor = NoDonorPolicy::kFail;
    } else if (strcmp(v, "local") == 0) {
      o.on_no_donor = NoDonorPolicy::kLocal;
    } else {
      return make_error(Errc::kInvalidArgument, "FARMEM_ON_NO_DONOR=%s: use fail or local", v);
    }
  }
  if (const char* v = getenv("FARMEM_LOOPBACK_CAPACITY")) {
    auto r = parse_size(v, "FARMEM_LOOPBACK_CAPACITY");
    if (!r.ok()) return r.status();
    if (*r < (16ull << 20)) {
      return make_error(Errc::kInvalidArgument,
                        "FARMEM_LOOPBACK_CAPACITY=%s: at least 16M, a multiple of 16M", v);
    }
    o.loopback_capacity = *r & ~((16ull << 20) - 1);
  }
  if (const char* v = getenv("FARMEM_DECAY_MS")) {
    auto r = parse_uint(v, "FARMEM_DECAY_MS", 0, 3600000);
    if (!r.ok()) return r.status();
    o.decay_ms = static_cast<int64_t>(*r);
  }
  if (const char* v = getenv("FARMEM_CONNECT_TIMEOUT_MS")) {
    auto r = parse_uint(v, "FARMEM_CONNECT_TIMEOUT_MS", 1, 600000);
    if (!r.ok()) return r.status();
    o.connect_timeout_ms = static_cast<int>(*r);
  }
  auto pc = PagerConfig::from_env(o.pager);
  if (!pc.ok()) return pc.status();
  o.pager = *pc;
  return o;
}

}  // namespace farmem
