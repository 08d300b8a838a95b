// Configuration of the far-memory runtime: one struct (the C API fills it
// from fm_config) and one table of environment variables (the preload
// library and fm_init(NULL) read it). Every variable has a default that
// works on one machine; a bad value is an error naming the variable.
//
//   auto o = farmem::options_from_env();        // Result<FarOptions>
//   if (!o.ok()) { fprintf(stderr, "%s\n", o.status().to_string().c_str()); exit(1); }
//   auto rt = farmem::FarRuntime::start(*o);
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pager/config.h"
#include "runtime/parse.h"
#include "runtime/status.h"

namespace farmem {

// kAuto: verbs when an RDMA device reaches the donors, tcp otherwise
// (FarRuntime::start decides and logs which).
enum class FarTransport { kAuto, kTcp, kVerbs, kLoopback };
enum class NoDonorPolicy { kFail, kLocal };

struct FarOptions {
  FarTransport transport = FarTransport::kAuto;
  std::vector<Endpoint> servers;  // tcp: the donors (FARMEM_SERVERS)
  // Copies of every written-back page, on distinct donors (FARMEM_REPLICAS,
  // 1..3); more than the donors is a start-up error. Loopback: that many
  // in-process donors.
  uint32_t replicas = 1;
  std::string token_file;                   // empty: no token (only --insecure donors accept)
  uint64_t loopback_capacity = 1ull << 30;  // loopback: the in-process donor's size
  uint64_t region_size = 0;                 // 0: the donors' capacity (sum) / loopback_capacity
  PagerConfig pager;                        // local budget, block size, handler threads, prefetch
  int64_t decay_ms = 1000;                  // freed far pages are dropped after this long
  // ... once resident far memory reaches this % of the local budget; below
  // it freed pages are kept for reuse (FARMEM_PURGE_AT; far_heap.h). 0, or
  // decay_ms 0: always decay_ms.
  uint32_t purge_at_percent = 75;
  // Bytes of each far allocation mapped as zeros when it is made, where
  // never written (FARMEM_POPULATE_MAX; FarHeapOptions::populate_max); 0: off.
  uint64_t populate_max = 256 << 10;
  // Finer size classes for objects of 513 B to 14 KiB (FARMEM_FINE_CLASSES;
  // allocator/fine_pool.h).
  bool fine_classes = true;
  int connect_timeout_ms = 3000;
  // Use jemalloc's thread caches on the far arena (FarHeapOptions::
  // thread_cache: correct only for the one heap of a process that is never
  // destroyed while other threads used it). The preload library sets it;
  // the C API (fm_init / fm_shutdown) leaves it off.
  bool thread_cache = false;
  // Preload library only.
  uint64_t min_far = 0;  // smaller allocations stay local (0: every size is far)
  // Private anonymous read-write mmap()s of at least this many bytes go to
  // far memory (FARMEM_MMAP_MIN; preload/shim.cc, "Anonymous mmap"); 0: none.
  uint64_t mmap_min = 64 << 10;
  bool stats = false;  // summary on stderr at exit
  // Which read-only pages (code, constants) of the process stay resident
  // only while in use once the runtime started (FARMEM_TRIM_TEXT;
  // preload/shim.cc, "Code and read-only data"): 0 none, 1 this library's,
  // 2 every loaded object's.
  int trim_text = 2;
  // How often the code is dropped again with trim_text 2 (FARMEM_TRIM_PERIOD_MS).
  uint32_t trim_period_ms = 1000;
  NoDonorPolicy on_no_donor = NoDonorPolicy::kFail;
  // A Unix socket with live statistics for `farmemctl stats PID`
  // (FARMEM_STATS_SOCKET; fm_init with a config reads the variable too).
  bool stats_socket = true;
};

struct EnvVar {
  const char* name;
  const char* def;
  const char* doc;
};
// The table, in README order.
std::span<const EnvVar> env_table();
// "auto", "tcp", "verbs" or "loopback"; false for anything else.
bool parse_far_transport(const char* text, FarTransport* out);

// Defaults overridden by the FARMEM_* variables that are set.
Result<FarOptions> options_from_env();

// Markdown table of env_table() for the README.
std::string env_table_markdown();

}  // namespace farmem
