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
    // FARMEM_MIN_FAR = 16K, by measurement (bench/alloc_bench.cc, BM_*Touch:
    // 64 x malloc + memset + free, loopback far heap, 2 loaded cores, median
    // of 5; items/s glibc vs far heap): 1K 21.4M vs 5.6M (far 3.8x slower),
    // 2K 17.8M vs 3.9M (4.6x), 4K 10.7M vs 4.5M (2.4x), 8K 7.2M vs 3.3M,
    // 12K 5.3M vs 2.7M, 16K 4.2M vs 1.9M, 24K 3.0M vs 1.4M (2.1x to 2.2x):
    // a far allocation has a fixed extra cost of about 130-370 ns (the far
    // arena bypasses jemalloc's thread cache and takes its lock, see
    // far_heap.h), which is most of the price of a small object and little
    // next to filling 16K. Throughput alone does not separate 4K from 16K;
    // fragmentation does: below 16K (jemalloc's largest small class is 14K
    // with 4K pages) objects of different lifetimes share slabs, so a far
    // 4K block with one live object among freed ones keeps its budget and
    // remote space and is faulted back in for that one object; from 16K up
    // every allocation is its own page-aligned extent, freed and purged as
    // whole pages, that the pager evicts on its own. Above 16K nothing is
    // gained (the ratio stays ~2x) while more of the heap could not be
    // evicted. Sizes 32K+ also show jemalloc's decay purging a reused
    // working set (then refaulted through the pager): FARMEM_DECAY_MS.
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
     "freed far pages are dropped (no write-back, budget freed) after this long once "
     "FARMEM_PURGE_AT is reached; 0 = at once, always"},
    // FARMEM_PURGE_AT = 75%: freed far pages are kept while the budget has
    // room, so a freed and reallocated working set is not dropped and
    // re-faulted every decay epoch (bench/alloc_bench.cc BM_FarHeapTouch,
    // 32K and up, and far_heap_purge_test). From 75% (under the pager's
    // eviction watermarks, so that freed pages go before live ones are
    // evicted or written back) everything freed is dropped at once and
    // FARMEM_DECAY_MS applies until residency falls below half of it.
    {"FARMEM_PURGE_AT", "75",
     "% of FARMEM_LOCAL_MEM resident at which freed far pages start to be dropped (all at "
     "once, then after FARMEM_DECAY_MS); below it they are kept for reuse; 0 = always decay"},
    {"FARMEM_POPULATE_MAX", "256K",
     "bytes of each far allocation (from its start; of a growing realloc, from the old end) "
     "mapped as zeros when it is made, where never written, so that first touches take no "
     "fault; only within the budget's headroom; 0 = off (every first touch faults)"},
    {"FARMEM_CONNECT_TIMEOUT_MS", "3000", "how long to try each donor at start-up"},
    {"FARMEM_BLOCK_SIZE", "4K", "pager fetch granularity, a power of two from 4K to 2M"},
    {"FARMEM_PAGER_THREADS", "cores/2 (1..8)", "pager fault-handler threads"},
    {"FARMEM_PREFETCH", "1",
     "pager prefetch (up to 32 interleaved ascending or descending streams, plus a "
     "majority-trend detector): 0 or 1"},
    {"FARMEM_UFFD_MOVE", "off",
     "pager: auto, on or off: UFFDIO_MOVE for victim-cache traffic (measured slower here)"},
    {"FARMEM_WP_ASYNC", "off",
     "pager: auto, on or off: the kernel resolves first writes itself (UFFD_FEATURE_WP_ASYNC) "
     "and the evictor finds written blocks with PAGEMAP_SCAN (Linux >= 6.7, needs UFFDIO_MOVE)"},
    {"FARMEM_LOG_LEVEL", "info", "error, warn, info or debug"},
    {"FARMEM_ZERO_CHUNK", "32",
     "pager: zero-fill chunk, 0 or a power of two from 2 to 64 blocks: a first-touch fault that "
     "continues no stream also maps the never-filled blocks of the aligned chunk around it, "
     "within the budget's headroom; 0 = off"},
    {"FARMEM_BLOCKING_READ", "1",
     "pager: 1 = an idle fault handler waits in a blocking read() of the userfaultfd (one "
     "syscall per fault; used only where the kernel honours RWF_NOWAIT on it, Linux >= 6.10), "
     "0 = ppoll() + read()"},
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
  if (const char* v = getenv("FARMEM_PURGE_AT")) {
    auto r = parse_uint(v, "FARMEM_PURGE_AT", 0, 100);
    if (!r.ok()) return r.status();
    o.purge_at_percent = static_cast<uint32_t>(*r);
  }
  if (const char* v = getenv("FARMEM_POPULATE_MAX")) {
    auto r = parse_size(v, "FARMEM_POPULATE_MAX");
    if (!r.ok()) return r.status();
    o.populate_max = *r;
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
