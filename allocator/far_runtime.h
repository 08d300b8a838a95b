// FarRuntime: the far-memory stack of one process, assembled in order and
// torn down in reverse.
//
//   farmem::FarOptions o;                       // or options_from_env()
//   o.transport = farmem::FarTransport::kLoopback;
//   o.pager.local_budget = 64 << 20;
//   auto rt = farmem::FarRuntime::start(o);     // Result<unique_ptr<FarRuntime>>
//   void* p = (*rt)->heap().alloc(1 << 20);
//
// Start-up table (tear-down is the same table bottom-up; the members are
// declared in this order, so destruction follows it). Step 0 resolves
// FARMEM_TRANSPORT=auto to tcp or verbs (far_runtime.cc has the rules):
//
//   step            tcp / verbs                  loopback
//   ------------    ---------------------------  ---------------------------
//   1 donors        DonorSession per server      LoopbackDonor (in-process;
//                                                FARMEM_REPLICAS of them)
//   2 transport     Tcp- / VerbsTransport        LoopbackTransport
//                   + add_server
//   3 slab source   DonorSessionSlabSource       LoopbackSlabSource
//                   (one donor, FARMEM_REPLICAS=1), else PlacementSource over
//                   every donor (pager/placement.h; heartbeats, reconnects)
//   4 pager         Pager<TcpTransport> /        Pager<LoopbackTransport>
//                   Pager<VerbsTransport>
//   5 far heap      PagerBacking + FarHeap (jemalloc arena + extent hooks)
//   6 stats socket  StatsSocket (farmemctl stats PID), unless
//                   FARMEM_STATS_SOCKET=0; a failure is a warning only
//
// The stats socket is stopped first at tear-down (its thread reads the
// pager's counters); its thread is local-only (invariant 3).
//
// The pager type is chosen here, at start-up; inside it everything is
// static dispatch. Everything start() allocates is local memory (it runs
// in a LocalScope), including the pager's threads (invariant 3).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "allocator/far_backing.h"
#include "allocator/far_heap.h"
#include "allocator/options.h"
#include "runtime/stats_socket.h"
#include "runtime/status.h"

namespace farmem {

class FarRuntime {
 public:
  // kUnavailable when no donor can be reached (the message names each one
  // and why) or verbs was asked for where it cannot run (names the reason
  // and FARMEM_TRANSPORT=tcp), kUnauthenticated for a bad token,
  // kInvalidArgument for bad options, or the pager's error (e.g.
  // userfaultfd not permitted).
  static Result<std::unique_ptr<FarRuntime>> start(const FarOptions& o);
  virtual ~FarRuntime() = default;

  virtual FarHeap& heap() = 0;
  virtual FarBacking& backing() = 0;
  const FarOptions& options() const { return opts_; }
  // "tcp: 127.0.0.1:7400 (1.0 GiB); region 1.0 GiB at 0x7f..., budget 64.0 MiB"
  const std::string& describe() const { return describe_; }
  // Step 6 of the table, undone; idempotent. The preload library calls it
  // from its destructor so that the socket file goes with the process.
  void stop_stats_socket();
  // The socket's path, or "" when none runs.
  std::string stats_socket_path() const { return stats_socket_ ? stats_socket_->path() : ""; }
  // The live statistics under the names farmemctl knows (what the stats
  // socket serves).
  void fill_stats(StatsSnapshot& s);

 protected:
  explicit FarRuntime(const FarOptions& o) : opts_(o) {}
  void start_stats_socket();
  // Replication counters (FARMEM_REPLICAS > 1), added by fill_stats().
  virtual void fill_placement_stats(StatsSnapshot&) {}

  FarOptions opts_;
  std::string describe_;
  std::vector<std::string> donors_;  // HOST:PORT per ServerId, "loopback" for loopback
  std::unique_ptr<StatsSocket> stats_socket_;
};

}  // namespace farmem
