// Pager configuration: one struct, defaults that work on one machine, and
// one validation that turns a bad value into a clear start-up error.
//
//   farmem::PagerConfig c;
//   c.region_size = 8ull << 30;                        // remote capacity
//   auto env = farmem::PagerConfig::from_env(c);       // FARMEM_LOCAL_MEM, ...
//   if (!env.ok()) fatal("%s", env.status().to_string().c_str());
//   FARMEM_RETURN_IF_ERROR(env->validate());
//
// Environment (read by from_env, used by the preload library):
//   FARMEM_LOCAL_MEM       local budget: bytes ("2G") or percent of RAM ("25%")
//   FARMEM_PAGER_THREADS   fault handler threads (1..64)
//   FARMEM_BLOCK_SIZE      fetch granularity (4K .. 2M, a power of two)
//   FARMEM_PREFETCH        0 / 1
//   FARMEM_UFFD_MOVE       auto / on / off: UFFDIO_MOVE for victim-cache traffic
//   FARMEM_WP_ASYNC        auto / on / off: UFFD_FEATURE_WP_ASYNC + PAGEMAP_SCAN dirty tracking
//   FARMEM_ZERO_AROUND     0..64: zero-fill fault-around run limit in blocks (0 = off)
//   FARMEM_ZERO_AROUND_WRITABLE  0 / 1: blocks mapped ahead of a write fault writable + dirty
//   FARMEM_ZERO_CHUNK      0, 2..64 (a power of two): zero-fill chunk in blocks (0 = off)
//   FARMEM_BLOCKING_READ   0 / 1: idle handlers block in read() of the uffd (where supported)
//   FARMEM_PIN_HANDLERS    0 / 1: one fault handler per allowed CPU, each pinned to its CPU
//   FARMEM_COLOCATE        auto / on / off: a lone faulting thread and the evictor share its CPU
//   FARMEM_WRITTEN_WRITABLE  0 / 1: a block seen written in its last stay comes back writable
//   FARMEM_ZERO_PAGE       0 / 1: a read of never-written memory maps the shared zero page
//   FARMEM_HOT_LAPS        0..15: active-list laps a block seen in use stays mapped unsampled
//   FARMEM_REFAULT_HOT     0 / 1: a block fetched back soon after it left counts as seen in use
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace farmem {

// UFFDIO_MOVE between the region and the victim slots (Linux >= 6.8):
// kAuto (the default) uses it when the kernel has it, kOn makes its absence a
// start-up error, kOff keeps the copy path (UFFDIO_COPY in, memcpy + MADV_DONTNEED out). Either way
// a block that cannot move (pinned for DMA, shared after fork) takes the copy path.
enum class UffdMoveMode : uint8_t { kAuto, kOn, kOff };

// UFFD_FEATURE_WP_ASYNC + PAGEMAP_SCAN dirty tracking (Linux >= 6.7; victim_move.h "WP_ASYNC"): the
// kernel resolves the first write to a clean block itself (no WP fault, no handler) and the
// evictor asks PAGEMAP_SCAN which blocks were written. It needs UFFDIO_MOVE too (demotion must
// take a page out of the region atomically). kAuto uses it when the kernel has both, kOn makes
// their absence a start-up error, kOff keeps the WP-fault path.
enum class WpAsyncMode : uint8_t { kAuto, kOn, kOff };

// Co-location (pager/evictor.h "Co-location"): while one thread of the
// program makes every fault and pages hard, it is confined to the CPU it
// runs on and the evictor moves there, so that the evictor's TLB flushes
// stay on one CPU. kAuto does it where the evictor measured a flush that
// must reach another CPU as expensive (a virtual machine's interrupts),
// and gives the CPU back when another program wants it; kOn whenever one
// thread pages hard; kOff never.
enum class ColocateMode : uint8_t { kAuto, kOn, kOff };

struct PagerConfig {
  // Virtual bytes reserved: sized by the remote capacity, not by local memory.
  uint64_t region_size = 1ull << 30;
  // Local budget: far pages resident in this process (mapped blocks plus
  // occupied victim-cache slots) never exceed it (invariant 5).
  uint64_t local_budget = 256ull << 20;
  // Fault handler threads; 0 = default_handler_threads(pin_handlers).
  uint32_t handler_threads = 0;
  // Handler i runs pinned to the i-th CPU the process may use (round robin
  // when there are more handlers; not pinned at all when there are fewer
  // handlers than CPUs), and by default there is one per CPU: the
  // faulting thread's own CPU then always has a handler, which the kernel
  // runs there as the faulting thread sleeps, instead of waking a halted
  // CPU (pager/fault_path.h "Handlers per CPU").
  bool pin_handlers = true;
  // See ColocateMode. Needs pinned handlers (pin_handlers) on two CPUs or
  // more.
  ColocateMode colocate = ColocateMode::kAuto;
  // A block seen written in its last stay comes back writable and dirty on
  // a read fault (pager/fault_path.h "Written blocks come back writable");
  // and a read stream whose blocks mapped ahead (write-protected) are then
  // written maps its next windows writable (Prefetcher::on_written_ahead).
  bool written_writable = true;
  // A read fault on a never-written block maps the kernel's shared zero
  // page, write-protected and outside the budget, as the kernel does for a
  // plain program; its first write takes a WP fault that gives it a page
  // (pager/zero_fill.h "Reads of never-written memory"). Ignored with
  // WP_ASYNC (a write there would not fault).
  bool zero_page = true;
  // Access tracking (pager/evictor.h "Access tracking"): a block seen in
  // use (a victim-cache hit; a remote fault soon after it left, with
  // refault_hot) passes the active list's tail up to hot_laps times more
  // without being demoted, i.e. without the victim fault that would tell
  // again. 0: every block is demoted at every pass (FIFO + victim cache).
  uint32_t hot_laps = 15;
  bool refault_hot = true;
  // With prefetch: the evictor takes blocks a confirmed sequential stream
  // mapped ahead and has since passed (a window's length behind it and
  // more) before the oldest ones (pager/evictor.h "Eviction behind
  // streams"), so that a loop a little larger than the budget keeps most of
  // itself resident instead of cycling through all of it.
  bool evict_behind = true;
  // An idle handler waits in a blocking read() of the uffd (one syscall per
  // fault) when the kernel lets the busy ones read without blocking (fault_path.h
  // "Idle handlers block in read()"); false keeps ppoll() + read() (tests).
  bool blocking_read = true;
  // Fetch granularity: a power of two from 4 KiB to 2 MiB.
  uint32_t block_size = 4096;
  // Background eviction starts when resident > high * budget and stops at
  // low * budget; faults wait for it only when resident reaches the budget.
  double high_watermark = 0.97;
  double low_watermark = 0.92;
  // Share of the budget kept as the victim cache: evicted blocks stay local
  // in a slot, unmapped, and a fault on one maps it back (second chance,
  // no I/O). 0 gives plain FIFO.
  double victim_fraction = 0.25;
  // Dirty blocks written back per batch of WRITEs.
  uint32_t writeback_batch = 32;
  // Stream / trend prefetch into the victim cache.
  bool prefetch = true;
  // Blocks per fault, at most (<= 256); the pager uses
  // min(this, max(32, budget / 16 blocks)): see "Prefetch windows" in
  // prefetch_path.h.
  uint32_t prefetch_max_window = 256;
  // Per-handler staging blocks for demand fetches; 0 = auto (256 KiB worth,
  // 2 .. 64 blocks).
  uint32_t staging_blocks = 0;
  // See UffdMoveMode. On where the kernel has it: xz and zstd at a 70%
  // budget run ~10% faster than on the copy path (figures in victim_move.h,
  // "UFFDIO_MOVE"). FARMEM_UFFD_MOVE=off keeps the copy path.
  UffdMoveMode uffd_move = UffdMoveMode::kAuto;
  // See WpAsyncMode. Off by default: measured slower than the WP-fault path
  // here (bench/pager_bench.cc BM_RandomRMW / BM_SeqScan; figures in
  // victim_move.h, "WP_ASYNC"). FARMEM_WP_ASYNC=auto turns it on where present.
  WpAsyncMode wp_async = WpAsyncMode::kOff;
  // Zero-fill fault-around (zero_fill.h "Zero-fill fault-around"): when a zero
  // fault continues a first-touch stream (right after the previous run when
  // ascending, right below it when descending), up to this many further
  // never-written blocks on the stream's side are mapped by the same ioctl
  // (the run doubles from 2 up to it, and restarts at a fault that continues
  // no stream; capped at 256 KiB per ioctl and by the budget's headroom).
  // 0 turns it off.
  uint32_t zero_fault_around = 32;
  // Blocks mapped ahead of a WRITE zero fault: writable and dirty (true: a
  // sequential writer takes no fault on them; one it never writes is
  // written back as zeros when evicted), or write-protected and clean
  // (false: its first write still costs a WP fault). Read faults always map
  // them write-protected and clean.
  bool zero_around_writable = true;
  // Zero-fill chunks (zero_fill.h "Zero-fill chunks"): a zero fault that
  // continues no stream also maps the never-filled blocks of the aligned
  // chunk of this many blocks around it (Empty blocks no zero fill ever
  // mapped: freed or discarded memory is not mapped again), in the same
  // ioctl where they are contiguous, within the budget's headroom. A power
  // of two, capped at 256 KiB; 0 turns it off.
  uint32_t zero_chunk = 32;

  Status validate() const;
  // Overrides fields from FARMEM_* variables; a bad value is an error that
  // names the variable.
  static Result<PagerConfig> from_env(PagerConfig base);
};

// "auto" / "on" / "off"; kInvalidArgument names FARMEM_UFFD_MOVE otherwise.
Result<UffdMoveMode> parse_uffd_move(std::string_view text);
const char* uffd_move_name(UffdMoveMode m);
// "auto" / "on" / "off"; kInvalidArgument names FARMEM_WP_ASYNC otherwise.
Result<WpAsyncMode> parse_wp_async(std::string_view text);
const char* wp_async_name(WpAsyncMode m);
Result<ColocateMode> parse_colocate(std::string_view text);
const char* colocate_name(ColocateMode m);

// Pinned (the default): one per CPU the process may use (sched_getaffinity),
// at most 64. Unpinned: min(max(cores / 2, 1), 8): a fault costs one
// hand-off (kernel -> handler), more threads than cores only add contention.
uint32_t default_handler_threads(bool pinned = false);
// The CPUs the calling thread may run on, in ascending order (empty when
// sched_getaffinity fails).
std::vector<int> allowed_cpus();

// FARMEM_LOCAL_MEM syntax: "2G", "512M", "25%" (of physical RAM).
Result<uint64_t> parse_local_mem(std::string_view text);

}  // namespace farmem
