// The userfaultfd pager: a virtual region backed by far memory.
//
//   farmem::LoopbackDonor donor(1ull << 30, 16 << 20);
//   farmem::LoopbackTransport t;
//   (void)t.add_server(0, &donor);
//   farmem::LoopbackSlabSource src(0, &donor);
//   farmem::PagerConfig c;
//   c.region_size = 1ull << 30;  c.local_budget = 64 << 20;
//   auto p = farmem::Pager<farmem::LoopbackTransport>::create(c, &t, &src);
//   char* mem = static_cast<char*>((*p)->base());
//   mem[12345] = 7;                       // faults, served by a handler thread
//
// Pager<B> is one class template, instantiated once per transport backend
// (no virtual call per page). It is declared with all its state in
// pager_core.h and defined stage by stage, one header each, in the order of
// the data path; each file opens with what it holds and the design and
// measurements of its stage:
//
//   pager_core.h     the class template: public API, state, threads
//   pager_init.h     create(), init(), ~Pager(), stats()
//   fault_path.h     handler threads, handle_fault(), demand READ,
//                    completion, install, READ failover, the doorbell
//   zero_fill.h      never-written blocks: fault-around, chunks,
//                    populate_zero(), clean_if_zero()
//   prefetch_path.h  prefetch READs, pending retries, run installs, the
//                    prefetch() hint, scan resistance
//   evictor.h        residency and replacement: evictor thread, adaptive
//                    victim cache, batched demotion, write-back, victim
//                    slots, discard(), the evict() hint
//   victim_move.h    UFFDIO_MOVE and WP_ASYNC victim traffic
//   pin.h            pin(), unpin()
//   fork_path.h      prepare_fork(), fork_parent()
//
// The non-template parts, each its own pair: page_table.{h,cc} (the block
// state word and its state machine, BlockList), prefetch.{h,cc} (Prefetcher:
// stream and trend detection), remote_map.{h,cc} and placement.{h,cc} (the
// remote address space, donors, replicas), replicator.h (re-replication),
// fork_snapshot.h (ForkSupport<B>: snapshots, serving children), stats.{h,cc}
// (PagerStats, counters), uffd.{h,cc} (the descriptor and its features),
// config.{h,cc}, replacement_sim.{h,cc} (the replacement model).
//
// Includes go one way: pager.h -> the stage headers -> pager_core.h -> the
// non-template pager/ headers and runtime/. No stage header includes
// another; they call each other only through members declared in
// pager_core.h, so include pager.h, never a stage header alone.
//
// Design notes that other files cite as pager.h "...", and where they are:
//   "How a fault is served", "Fault-path cost", "Idle handlers block in
//     read()", "Several donors and replicas"             fault_path.h
//   "Zero-fill fault-around", "Zero-fill chunks", "Allocation-time
//     population"                                         zero_fill.h
//   "Prefetch", "Prefetch installs", "Prefetch windows", "Scan
//     resistance"                                         prefetch_path.h
//   "Residency and replacement", "Eviction batching", "Adaptive victim
//     cache"                                              evictor.h
//   "UFFDIO_MOVE", "WP_ASYNC"                             victim_move.h
//   "Threads"                                             pager_core.h
//   fork()                                                fork_path.h
#pragma once

#include "pager/evictor.h"
#include "pager/fault_path.h"
#include "pager/fork_path.h"
#include "pager/pager_core.h"
#include "pager/pager_init.h"
#include "pager/pin.h"
#include "pager/prefetch_path.h"
#include "pager/victim_move.h"
#include "pager/zero_fill.h"
