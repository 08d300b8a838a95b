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
    // FARMEM_MIN_FAR = 0 (every size far), by measurement. With jemalloc's
    // thread caches on the far arena (FarHeapOptions::thread_cache, the
    // preload library's heap) a small far malloc/free pair costs about
    // what glibc's does: bench/alloc_bench.cc BM_*Small (64 x malloc +
    // 1-byte write, 64 x free; 1 thread; 2 cores at load 5.3-6.9, median of
    // 3; items/s glibc / far without thread cache / far with it): 16 B
    // 107.8M / 23.4M / 72.9M, 64 B 106.9M / 21.3M / 71.9M, 256 B
    // 58.5M / 19.9M / 44.6M, 1K 66.3M / 13.6M / 20.5M (the 1K bin caches
    // 32 objects, fewer than the batch of 64). The far heap without caches
    // (the old 130-370 ns per object, an arena lock each) was why 16K used
    // to be the default. bench/preload_overhead.sh with every size far,
    // load 7-8: python3 CPU time ratio 0.966, mt_workload 1.000. Small
    // objects then share far pages: a page stays resident while one of its
    // objects is hot, and the pager's replacement, not a size threshold,
    // decides what leaves. A threshold keeps whatever is below it local and
    // unbounded: perl's 2M-key hash or python's dicts never left local
    // memory with 16K.
    {"FARMEM_MIN_FAR", "0",
     "preload: allocations smaller than this stay in local memory (glibc); 0 = every size is "
     "far (small objects share far pages that stay resident while hot)"},
    // FARMEM_MMAP_MIN = 64K: python's object arenas (256 KiB / 1 MiB
    // anonymous mmap64()s) go far; glibc's own large-malloc mmaps are
    // internal calls and never come here (preload/shim.cc, "Anonymous mmap").
    // python3 big_dict.py 400000 at FARMEM_LOCAL_MEM=64M: peak RSS 148 ->
    // ~100 MiB with it (the prototype's figures; the test's are in the log).
    {"FARMEM_MMAP_MIN", "64K",
     "preload: private anonymous read-write mmap()s (not MAP_FIXED, MAP_STACK, MAP_SHARED, "
     "file or PROT_EXEC mappings) of at least this size are placed in far memory, with "
     "munmap, mremap, madvise(DONTNEED/FREE) and fork() working on them; mprotect to anything "
     "but read-write fails there with EACCES; 0 = off (every mmap goes to the kernel)"},
    {"FARMEM_STATS", "0", "preload: 1 prints a summary of far-memory use on stderr at exit"},
    {"FARMEM_TRIM_TEXT", "2",
     "preload: once far memory has started, the code and read-only data of every loaded object "
     "(program, libraries, this library) stay resident only while in use: they compete with "
     "the heap for memory (2); 1 = this library's only; 0 = leave them all mapped"},
    {"FARMEM_TRIM_PERIOD_MS", "1000",
     "preload, FARMEM_TRIM_TEXT=2: how often (ms) the code and read-only data are dropped again "
     "after start-up, so that what stays resident is what was used since"},
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
    {"FARMEM_FINE_CLASSES", "1",
     "1: far objects of 513 B to 14 KiB get size classes 1/32 of a power of two apart (at most "
     "~3% slack, where jemalloc's classes waste up to 25%); 0: jemalloc's classes only"},
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
  if (const char* v = getenv("FARMEM_MMAP_MIN")) {
    auto r = parse_size(v, "FARMEM_MMAP_MIN");
    if (!r.ok()) return r.status();
    o.mmap_min = *r;
  }
  if (const char* v = getenv("FARMEM_STATS")) {
    auto r = parse_uint(v, "FARMEM_STATS", 0, 1);
    if (!r.ok()) return r.status();
    o.stats = *r == 1;
  }
  if (const char* v = getenv("FARMEM_TRIM_TEXT")) {
    auto r = parse_uint(v, "FARMEM_TRIM_TEXT", 0, 2);
    if (!r.ok()) return r.status();
    o.trim_text = static_cast<int>(*r);
  }
  if (const char* v = getenv("FARMEM_TRIM_PERIOD_MS")) {
    auto r = parse_uint(v, "FARMEM_TRIM_PERIOD_MS", 1, 3600000);
    if (!r.ok()) return r.status();
    o.trim_period_ms = static_cast<uint32_t>(*r);
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
  if (const char* v = getenv("FARMEM_FINE_CLASSES")) {
    auto r = parse_uint(v, "FARMEM_FINE_CLASSES", 0, 1);
    if (!r.ok()) return r.status();
    o.fine_classes = *r == 1;
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
