// Pager<B>: the class template, its public API and all of its state.
//
// The member definitions are in one header per stage (the map is in
// pager/pager.h, which includes them all); this file only declares. It
// includes the other pager/ headers the state is made of (page_table.h,
// prefetch.h, remote_map.h, replicator.h, fork_snapshot.h, stats.h, uffd.h,
// config.h, replacement_sim.h) and none of the stage headers, so the
// includes go one way:
// pager.h -> stage headers -> pager_core.h -> the rest of pager/ and
// runtime/. Include pager/pager.h, not this file.
//
// Threads: config.handler_threads handlers and one evictor; none of them
// touches the region except the evictor's copy of a block it owns and that
// is mapped (invariant 3); nothing on the fault path allocates (tested by
// tests/pager/pager_alloc_test.cc).
#pragma once

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pager/config.h"
#include "pager/fork_snapshot.h"
#include "pager/page_table.h"
#include "pager/park.h"
#include "pager/prefetch.h"
#include "pager/remote_map.h"
#include "pager/replacement_sim.h"
#include "pager/replicator.h"
#include "pager/stats.h"
#include "pager/uffd.h"
#include "runtime/log.h"
#include "runtime/transport.h"

namespace farmem {

namespace pager_detail {
// Anonymous private memory, optionally aligned; owned.
struct Mapping {
  void* raw = nullptr;
  size_t raw_len = 0;
  char* ptr = nullptr;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (raw) munmap(raw, raw_len);
  }
  Status map(size_t len, size_t align, bool noreserve, const char* what);
};
// Copies a block out of the region. The application's last writes to it
// are ordered before this read by the kernel (write protection or
// MADV_DONTNEED of the owner, with their TLB shoot-downs), which
// ThreadSanitizer cannot see; under TSan the copy is left uninstrumented.
#if defined(__SANITIZE_THREAD__)
__attribute__((no_sanitize("thread"))) inline void copy_from_region(void* dst, const void* src,
                                                                    size_t len) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t i = 0; i < len; i += 64) __builtin_memcpy(d + i, s + i, 64);
}
#else
inline void copy_from_region(void* dst, const void* src, size_t len) {
  memcpy(dst, src, len);
}
#endif
inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
}  // namespace pager_detail

template <TransportBackend B>
class Pager {
 public:
  using Queue = typename B::Queue;

  // transport and slabs outlive the pager.
  static Result<std::unique_ptr<Pager>> create(const PagerConfig& config, B* transport,
                                               SlabSource* slabs);
  ~Pager();
  Pager(const Pager&) = delete;
  Pager& operator=(const Pager&) = delete;

  void* base() const { return region_.ptr; }
  size_t size() const { return cfg_.region_size; }
  uint32_t block_size() const { return block_; }
  const PagerConfig& config() const { return cfg_; }
  const UffdFeatures& features() const { return uffd_.features(); }

  uint64_t resident_bytes() const {
    return static_cast<uint64_t>(resident_.load(std::memory_order_relaxed)) * block_;
  }
  uint64_t budget_bytes() const { return budget_blocks_ * block_; }
  // Documented slack above the budget: none, by construction (reservations
  // are taken before a block is mapped).
  static constexpr uint64_t kSlackBytes = 0;
  PagerStats stats() const;
  // True when victim-cache traffic uses UFFDIO_MOVE (config.uffd_move and
  // the kernel allow it).
  bool uses_move() const { return use_move_; }
  // True when dirty tracking uses UFFD_FEATURE_WP_ASYNC + PAGEMAP_SCAN
  // (config.wp_async and the kernel allow it; see "WP_ASYNC" in victim_move.h).
  bool uses_wp_async() const { return use_wp_async_; }
  // True when idle handlers wait in a blocking read() of the uffd
  // (config.blocking_read and the kernel allow it; see "Idle handlers block
  // in read()" in fault_path.h).
  bool uses_blocking_read() const { return blocking_read_; }
  // The CPU fault handler i is pinned to, -1 when it is not (tests).
  int handler_cpu(size_t i) const { return i < handlers_.size() ? handlers_[i]->cpu : -1; }
  size_t handler_count() const { return handlers_.size(); }

  // Drops [addr, addr+len) (block-aligned): the range reads as zeros again,
  // its remote space and budget are freed. Control path (allocator purge);
  // waits for I/O in flight on those blocks.
  Status discard(void* addr, size_t len);

  // Allocation-time zero fill (see "Allocation-time population" in
  // zero_fill.h):
  // maps the never-written (Empty) blocks among those holding a byte of
  // [addr, addr+len) as zeros now, on the calling (application) thread,
  // writable and dirty as a write fault's zero fill maps them, so that the
  // program's first touches of them take no fault. Other blocks are left
  // alone. Only within the headroom below the high watermark (it never
  // wakes the evictor nor takes a demand fault's room), never while a fork
  // is being prepared, never in a fork()ed child. Returns the blocks mapped.
  // Never allocates; takes only the list lock.
  size_t populate_zero(void* addr, size_t len) noexcept;

  // fm_evict: writes the dirty blocks of [addr, addr+len) back and drops
  // every block of it from local memory now (block-aligned range).
  // Control path: runs on the calling thread, one I/O at a time on a queue
  // reserved for hints, and waits for I/O in flight on those blocks.
  Status evict(void* addr, size_t len);
  // fm_prefetch: fetches the remote blocks of [addr, addr+len) now and maps
  // them (clean, write-protected), in batches on the hint queue. Stops early
  // (still OK) when the budget stays full: it is a hint.
  Status prefetch(void* addr, size_t len);
  // fm_pin: makes every block of [addr, addr+len) (block-aligned) resident,
  // fetching it if needed, and keeps it so (never demoted or evicted) until
  // as many unpin() calls as pin() calls covered it. Pinned blocks count
  // against the budget; at most pin_limit_bytes() may be pinned, so that the
  // evictor always has room to work: a pin that would pass it is refused
  // with kResourceExhausted (nothing of the range is left pinned). Control
  // path, calling thread; it faults the blocks in like the application.
  Status pin(void* addr, size_t len);
  // kInvalidArgument (and nothing changed) when a block of the range is not
  // pinned. discard() of a pinned block unpins it.
  Status unpin(void* addr, size_t len);

  // fork() snapshots (invariant 8; pager/fork_snapshot.h). Call
  // prepare_fork() right before fork() on the forking thread, then
  // fork_parent() in the parent (whether fork() succeeded or failed) or
  // fork_child() in the child. Between the two, faults wait and the
  // evictor and hints stop. An error leaves nothing held; the child then
  // reads zeros where far memory was not resident (the old behaviour).
  // Without UFFD_FEATURE_EVENT_FORK (features(), needs CAP_SYS_PTRACE)
  // prepare_fork() warns once and does nothing else.
  // fork_parent() needs no "did fork() succeed": the kernel tells. A fork
  // that copies the address space blocks the forking thread until a
  // handler has read its UFFD_EVENT_FORK, so once the handlers' dispatch
  // sections running at that moment have ended, "the snapshot was adopted"
  // is "a child address space exists or existed"; a snapshot still pending
  // means no fork happened (failed early, e.g. RLIMIT_NPROC) and is dropped.
  // A fork that fails after the copy (a pids cgroup limit, a bad
  // CLONE_INTO_CGROUP) still delivers the event (userfaultfd(2), BUGS): its
  // descriptor fails with ESRCH at the first probe and the snapshot goes.
  // errno is not read: other atfork handlers and libc may change it.
  Status prepare_fork();
  void fork_parent();
  // True when forks get snapshots here (the uffd has UFFD_FEATURE_EVENT_FORK).
  bool fork_snapshots() const { return uffd_.fork_events(); }
  // In the child: the pager is inert (no thread of it exists there); the
  // allocator and the hints check in_fork_child() and leave it alone.
  void fork_child() { fork_child_ = true; }
  bool in_fork_child() const { return fork_child_; }
  // Fills every live child with the snapshot blocks it has not faulted in
  // yet and lets it go (its far memory becomes ordinary memory). Parent
  // exit: the preload library's destructor and ~Pager call it.
  void finish_fork_children() { fork_.shutdown(/*fill=*/true); }
  // Child address spaces served now, remote units frozen by snapshots and
  // child faults served (tests).
  size_t fork_children() const { return fork_.children(); }
  // UFFD_EVENT_FORKs read on this pager's descriptor (tests).
  uint64_t fork_events() const { return fork_.events(); }
  size_t fork_frozen_units() const { return fork_.frozen_units(); }
  uint64_t fork_faults_served() const { return fork_.faults_served(); }
  // The pin limit: the low watermark minus a reserve of max(budget / 4, 16
  // blocks) for demand faults, the victim cache and prefetch.
  uint64_t pin_limit_bytes() const { return static_cast<uint64_t>(pin_limit_blocks_) * block_; }
  // The victim cache's current target (see "Adaptive victim cache" in evictor.h): between
  // victim_min_bytes() (victim_floor_bytes() while nothing is read ahead) and
  // config.victim_fraction of the budget.
  uint64_t victim_target_bytes() const {
    return victim_cur_.load(std::memory_order_relaxed) * block_;
  }
  uint64_t victim_min_bytes() const { return victim_min_ * block_; }
  uint64_t victim_floor_bytes() const { return victim_floor_ * block_; }
  // True while the evictor keeps more headroom than its minimum of two
  // write-back batches (faults waited lately; see evictor_main()). Tests.
  bool eviction_pressure() const {
    const int64_t min_h =
        std::min<int64_t>(budget_blocks_ - low_blocks_, 2 * int64_t{cfg_.writeback_batch});
    return headroom_.load(std::memory_order_relaxed) > min_h;
  }
  uint64_t pinned_bytes() const {
    return static_cast<uint64_t>(pinned_.load(std::memory_order_relaxed)) * block_;
  }

  // Placement and replication (several donors, FARMEM_REPLICAS): the remote
  // map and its re-replication progress.
  const RemoteMap& remote_map() const { return *remote_; }
  ReplicationStats replication_stats() const { return remote_->stats(); }

  // Eviction's TLB-flushing calls (tests, benches): UFFDIO_WRITEPROTECT
  // calls that write-protected dirty blocks for demotion, and MADV_DONTNEED
  // calls that dropped demoted blocks; each covers a run of adjacent blocks.
  uint64_t evict_wp_calls() const { return evict_wp_calls_.load(std::memory_order_relaxed); }
  uint64_t evict_dontneed_calls() const {
    return evict_dontneed_calls_.load(std::memory_order_relaxed);
  }
  // Blocks demote_batch() took to close a gap of 1 or 2 between two blocks
  // it demotes (so that the run is flushed as one).
  uint64_t evict_gap_fills() const { return counters_gap_fill_.load(std::memory_order_relaxed); }
  // UFFDIO_COPYs that mapped two or more prefetched blocks at once
  // (flush_run(); tests, benches).
  uint64_t prefetch_run_copies() const { return prefetch_runs_.load(std::memory_order_relaxed); }
  // Blocks mapped ahead by a confirmed stream that the evictor dropped
  // clean without the victim cache (demote_batch(); tests, benches).
  uint64_t evict_ahead_drops() const { return ahead_drops_.load(std::memory_order_relaxed); }
  // The victim cache's slot area, for tests that check the kernel's view
  // of the pager's memory (region and slots together).
  void* victim_slots() const { return slots_.ptr; }
  size_t victim_slots_bytes() const { return uint64_t{n_slots_} * block_; }
  // The per-slot states (slot_meta_): resident only where slots were used.
  void* slot_states() const { return slot_meta_.ptr; }
  size_t slot_states_bytes() const { return 4 * uint64_t{n_slots_}; }
  // Pages of free victim slots dropped to make room (release_slot_pages()).
  uint64_t slot_pages_released() const { return slot_releases_.load(std::memory_order_relaxed); }

  // State of the block holding addr (tests, debugging).
  PageState state_of(const void* addr) const {
    return PageTable::state_of(pt_.load(block_index(addr)));
  }
  // The hot laps of addr's block (evictor.h "Access tracking"; tests).
  uint32_t hot_laps_of(const void* addr) const { return pt_.hot_laps(block_index(addr)); }
  // Blocks holding hot laps now (the count hot_cap_ limits; tests).
  int64_t hot_blocks() const { return hot_blocks_.load(std::memory_order_relaxed); }

 private:
  // Most prefetched blocks mapped by one copy (flush_run()).
  static constexpr uint32_t kRunMax = 32;
  // Most blocks one demote_batch() takes from the active list, and most gap
  // blocks it adds (fill_gaps()); more than 64 only for a scan's blocks
  // dropped without the victim cache ("Scan resistance" in prefetch_path.h).
  static constexpr size_t kDemotePick = 256, kDemoteFill = 16;
  // Free slots' pages evict_round() leaves for its demotions: at most
  // kSpareSlotPages and a sixteenth of the budget.
  static constexpr int64_t kSpareSlotPages = 96;
  size_t spare_slots() const {
    return static_cast<size_t>(std::clamp<int64_t>(budget_blocks_ / 16, 1, kSpareSlotPages));
  }
  struct Inflight {
    uint32_t block = 0;
    uint32_t buf = 0;  // staging index (demand) or slot (prefetch)
    bool prefetch = false;
    bool write = false;
    bool map = false;  // prefetch on a confirmed stream: map at once, no fault later
    uint64_t t0 = 0;
    ServerId server = 0;   // the replica read (failover marks it failed)
    bool guessed = false;  // demand: mapped writable on kWritten, not for a write fault
  };
  struct Deferred {
    uint64_t addr;
    uint64_t flags;
    // Parked only because another thread owned the block (Outcome::kWait):
    // that owner's install may already have woken the faulting thread, so
    // the entry may be stale (run_deferred()).
    bool owner;
  };
  // A prefetch candidate that could not be posted at once (prefetch_after()).
  struct PendingPrefetch {
    uint32_t block;
    uint32_t stream;  // Prefetcher::Plan::stream: wanted while still_ahead()
    uint64_t t;       // when its fault asked for it
    uint32_t rank;    // distance from that fault, in candidates
    bool map;         // map at once when it lands
    bool write;       // ... writable and dirty (the stream writes)
  };
  struct Handler {
    std::unique_ptr<Queue> q;
    pager_detail::Mapping staging;
    std::vector<uint32_t> free_staging;
    std::vector<Inflight> inflight;
    std::vector<uint32_t> free_inflight;
    std::vector<Deferred> deferred;
    std::vector<IoOp> ops;
    // Prefetches cut short by the budget, the slots or the queue, retried
    // by handler_main() (retry_prefetches()); ordered by rank, so that the
    // streams share the room as it comes, nearest blocks first.
    std::vector<PendingPrefetch> pending;
    uint64_t pending_t = 0;  // when the newest entry was added
    size_t demand_outstanding = 0;
    std::thread thread;
    // Odd while the thread dispatches faults; prepare_fork() waits for an
    // odd value to change (the dispatch saw fork_frozen_ or finished).
    std::atomic<uint32_t> fork_seq{0};
    // Set when the thread returns (~Pager rings the doorbell until all are).
    std::atomic<bool> exited{false};
    bool poller = false;  // counted in pollers_ (set_poller())
    int cpu = -1;         // the CPU it is pinned to (config.pin_handlers), -1 = none
    // Prefetched blocks of a confirmed stream that landed and wait to be
    // mapped together (add_to_run() / flush_run()): blocks [run_first,
    // run_first + run_n), their slots in run_slot, all mapped writable or
    // all write-protected (run_write). run_buf: the copy's contiguous source.
    uint32_t run_first = 0, run_n = 0;
    bool run_write = false;
    uint32_t run_laps = 0;     // their hot laps (refaults of a looping stream)
    bool run_guessed = false;  // writable on kWritten (a guess), not for a written stream
    uint32_t run_slot[kRunMax] = {};
    pager_detail::Mapping run_buf;
    // This thread's demand READ counters (no locked instruction, no line
    // shared with other writers); stats() sums them with counters_.
    HandlerCounters ctr;
  };
  // kDefer: the fault needs room (budget, staging, queue) and is retried;
  // kWait: another thread owns the block (a transient state) and the fault
  // is retried when it settles.
  enum class Outcome { kDone, kDefer, kWait };

  Pager(const PagerConfig& c, B* t, SlabSource* s)
      : cfg_(c), block_(c.block_size), transport_(t), source_(s), active_(&pt_), victim_(&pt_) {}
  Status init();

  uint32_t block_index(const void* addr) const {
    return static_cast<uint32_t>(
        (reinterpret_cast<uintptr_t>(addr) - reinterpret_cast<uintptr_t>(region_.ptr)) / block_);
  }
  char* block_addr(uint32_t b) const { return region_.ptr + uint64_t{b} * block_; }
  char* slot_addr(uint32_t s) const { return slots_.ptr + uint64_t{s} * block_; }

  // Budget.
  bool reserve();
  void unreserve(int64_t n = 1) { resident_.fetch_sub(n, std::memory_order_relaxed); }
  void kick_evictor();
  // After resident_ rose to `now`: wakes the evictor when it sleeps and
  // `now` is past the trigger it sleeps on (evictor_main()). Waking it
  // below that trigger only put it back to sleep: a futex wake and a
  // cross-CPU wake-up per fault for nothing (xz -7 at 38M: 4.7% of all
  // CPU samples were that pthread_cond_signal in the fault handlers).
  void note_resident(int64_t now) {
    if (now <= evict_trigger_.load(std::memory_order_relaxed)) return;
    // Orders the resident_ update before the load of evictor_idle_, as the
    // evictor's store of evictor_idle_ is before its load of resident_: one
    // of the two sees the other (no lost wake-up).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (evictor_idle_.load(std::memory_order_relaxed)) kick_evictor();
  }

  // Slots.
  // *empty (when asked): the slot holds no page (its last block moved out
  // of it), so a block can move into it. Unknown counts as not empty: a
  // move into a mapped slot would only fail with EEXIST.
  uint32_t alloc_slot(bool* empty = nullptr);
  void free_slot(uint32_t s, bool empty = false);
  // The block in slot `s` was written back: its charge stays with the
  // slot's page (kSlotCharged) for the next demotion, up to spare_slots();
  // otherwise free_slot() and unreserve().
  void free_left_slot(uint32_t s);

  // Fault path.
  void handler_main(Handler& h);
  Outcome handle_fault(Handler& h, uint64_t addr, uint64_t flags);
  void defer(Handler& h, uint64_t addr, uint64_t flags, bool owner);
  void run_deferred(Handler& h);
  void reap(Handler& h, int timeout_ms);
  void complete(Handler& h, const IoCompletion& c);
  void prefetch_after(Handler& h, uint32_t b, bool hit, bool write);
  // Posts READs for the still-remote blocks of req[0..n) into victim slots,
  // in order, until the prefetch budget, the slots or the queue run out
  // (then kicks the evictor when it is room that ran out); returns how many
  // of req were dealt with (posted or no longer remote).
  size_t post_prefetches(Handler& h, const PendingPrefetch* req, size_t n);
  // Prefetch installs by run ("Prefetch installs" in prefetch_path.h): add_to_run() takes
  // a landed prefetch of a confirmed stream (owned, Fetching, in slot) and
  // maps what was gathered first when b does not extend the run; flush_run()
  // maps the run with one UFFDIO_COPY. The handler loop flushes after each
  // batch of completions, so a block waits at most that long.
  void add_to_run(Handler& h, uint32_t b, uint32_t slot, bool write, bool guessed, uint32_t laps);
  void flush_run(Handler& h);
  void add_pending(Handler& h, const PendingPrefetch& e);
  void retry_prefetches(Handler& h);
  // Maps n blocks from b on (owned, Fetching) from src with one UFFDIO_COPY
  // and makes them Present (dirty if write, or if flags_keep has kDirty).
  // ahead: mapped ahead by a confirmed prefetch stream (kPrefetched on
  // Present: demote_batch() drops it clean without the victim cache).
  // laps: their hot laps (evictor.h "Access tracking"; 0: not seen in use).
  void install_mapped(uint32_t b, const void* src, bool write, uint32_t flags_keep, uint32_t n = 1,
                      bool ahead = false, uint32_t laps = 0);
  // Access tracking (evictor.h): stamps b as leaving local memory now;
  // the hot laps a demand fetch of b gives it (a refault within reach: 1).
  void note_left(uint32_t b) {
    if (pt_.hot_laps(b) > 0) hot_blocks_.fetch_sub(1, std::memory_order_relaxed);
    pt_.set_left_at(b, leave_clock_.fetch_add(1, std::memory_order_relaxed));
  }
  // Sets b's hot laps, keeping hot_blocks_ (blocks holding laps) in step;
  // laps given (from none) are stamped with the leave clock (their grace
  // period, evictor.h "Access tracking"). The caller owns b, or holds
  // list_mu_ with b Present (nobody else changes it then).
  void set_laps(uint32_t b, uint32_t laps) {
    const uint32_t old = pt_.hot_laps(b);
    if (laps > 0 && old == 0) {
      pt_.set_hot_laps_at(b, laps, leave_clock_.load(std::memory_order_relaxed));
    } else {
      pt_.set_hot_laps(b, laps);
    }
    if ((old > 0) != (laps > 0))
      hot_blocks_.fetch_add(laps > 0 ? 1 : -1, std::memory_order_relaxed);
  }
  uint32_t refault_laps(uint32_t b);
  // Zero-fill fault-around (see "Zero-fill fault-around" in zero_fill.h).
  // After the zero fault on b (owned, Fetching): how many blocks next to b
  // to map with it (the stream's window; after b for an ascending stream,
  // below b for a descending one), and takes them (Empty -> Fetching,
  // budget reserved); returns how many it took (0 .. window) and sets
  // *first to the lowest block of the run: b ascending, b - taken descending.
  // *continued: b continued a stream (false: a new stream starts at b).
  // take_room: take budget for them (false: they will map the zero page):
  // the headroom below the high watermark, or for a write fault that
  // continues a stream (write) the budget's last blocks too.
  uint32_t zero_around_claim(uint32_t b, uint32_t* first, bool* continued, bool take_room = true,
                             bool write = false);
  // Maps [first, first + n) (all owned, Fetching; n >= 2) as zeros; b, the
  // faulting block, is first or first + n - 1; b writable and dirty for a
  // write fault, the others as config.zero_around_writable says.
  void install_zero_run(uint32_t first, uint32_t n, uint32_t b, bool write);
  // Maps [first, first + n) (owned, Fetching, no budget taken) to the
  // shared zero page, write-protected, and leaves them Present |
  // kZeroMapped, on no list (config.zero_page; zero_fill.h "Reads of
  // never-written memory").
  void install_zero_page(uint32_t first, uint32_t n);
  // Zero-fill chunks (see "Zero-fill chunks" in zero_fill.h). After a zero fault on
  // b (owned, Fetching, budget reserved) that continues no stream: takes
  // the Empty blocks of b's aligned chunk that no zero fill ever mapped
  // (Empty -> Fetching, budget from the headroom below high) and maps them
  // with b, one UFFDIO_COPY per contiguous run (b's run last: it wakes the
  // faulting thread); b as a write fault says, the others as
  // install_zero_run(). Returns how many blocks besides b it mapped; 0:
  // nothing was taken and b is still the caller's to map.
  uint32_t zero_chunk_fill(uint32_t b, bool write);
  // Records [first, first + n) as mapped by a zero fill (filled_), so that
  // a chunk fill never maps them again once freed or discarded. Called by
  // the owner of the blocks, before their copy.
  void mark_filled(uint32_t first, uint32_t n);
  // Demotion, after the block's bytes were copied to its slot (the block
  // is owned and write-protected or unmapped, so they are final): a dirty
  // block that has no remote copy and holds only zeros is the same as a
  // never-written one, so w comes back without kDirty and the block goes
  // back to Empty without I/O or remote space (a block mapped writable
  // ahead of a write fault and never written). Otherwise w unchanged.
  uint32_t clean_if_zero(uint32_t b, uint32_t slot, uint32_t w);
  bool promote_by_move(uint32_t b, uint32_t slot, bool write, uint32_t w);
  bool move_out(uint32_t b, uint32_t slot);
  Status setup_move();
  Status setup_wp_async();
  // WP_ASYNC demotion of n Demoting blocks into slots (see its comment):
  // sets kDirty in words[i] when block i was written, kept[i] when it could
  // not leave the region (it stays mapped, still Demoting).
  void demote_async(const uint32_t* blocks, const uint32_t* slots, uint32_t* words,
                    const bool* empty, size_t n, bool* kept);
  [[noreturn]] void lost_page(uint32_t b, Errc e);
  // A READ of f's block failed with `why`: marks its donor failed and posts
  // the READ again on the next live replica; false when none is left.
  bool retry_read(Handler& h, const Inflight& f, Errc why);

  // Pinning.
  Status check_block_range(const char* fn, void* addr, size_t len, uint32_t* first,
                           uint32_t* last) const;
  bool take_pin();
  void unpin_block(uint32_t b);     // b is pinned; drops one pin
  void discard_remote(uint32_t b);  // b owned in Discarding: forget its remote unit

  // Evictor.
  void evictor_main();
  size_t evict_round(int64_t floor);
  uint32_t written_flag(uint32_t b, uint32_t w, uint32_t slot);
  bool guess_unwritten();
  void note_write_protected();
  void adapt_victims();
  // Returns how many blocks left the active list; *dropped (when asked):
  // how many of them went straight back to Remote (mapped ahead, clean).
  size_t demote_batch(size_t max, size_t* dropped = nullptr);
  // demote_batch(), list_mu_ held: takes the resident, unpinned blocks of
  // every gap of 1 or 2 between two of blocks[0..n) (Present -> Demoting,
  // off the active list) and appends them (words alongside), up to cap
  // blocks in all; returns the new count.
  size_t fill_gaps(uint32_t* blocks, uint32_t* words, size_t n, size_t cap);
  // Under list_mu_: b, whose word was w, taken off the active list for a
  // demotion (Present -> Demoting) when it is a Present, unpinned, not
  // zero-page block, i.e. on that list; false otherwise or if it changed.
  bool take_listed(uint32_t b, uint32_t w);
  size_t drop_victims(size_t max);
  // Drops the pages of up to max free slots (oldest frees first) and
  // returns the room that freed in resident_.
  size_t release_slot_pages(size_t max, size_t spare = 0);
  size_t writeback_done(const IoCompletion& c);

  PagerConfig cfg_;
  const uint32_t block_;
  B* const transport_;
  SlabSource* const source_;
  Uffd uffd_;
  pager_detail::Mapping region_;
  pager_detail::Mapping slots_;
  pager_detail::Mapping zero_;
  PageTable pt_;
  uint64_t n_blocks_ = 0;
  int64_t budget_blocks_ = 0, high_blocks_ = 0, low_blocks_ = 0;
  // Access tracking (evictor.h): blocks that left local memory so far
  // (starts at 1: a left_at() of 0 means never), and how recently a block
  // must have left for its demand fetch to count as a refault.
  std::atomic<uint32_t> leave_clock_{1};
  uint32_t refault_reach_ = 0;
  // Blocks holding hot laps now, and the most a refault may bring that to
  // (refault_laps(): a loop a little larger than the budget refaults on
  // every block; laps for all would be FIFO again).
  std::atomic<int64_t> hot_blocks_{0};
  int64_t hot_cap_ = 0;
  // How far behind a stream's latest fault the evictor takes blocks from
  // (evictor.h "Eviction behind streams").
  uint32_t behind_gap_ = 0;
  uint64_t victim_target_ = 0;  // the largest victim cache (config.victim_fraction)
  // Adaptive victim cache: the smallest target while read-ahead waits in
  // it (victim_min_: a write-back batch and a prefetch window) and while
  // none does (victim_floor_: a write-back batch), the current one (written
  // by the evictor only, read by tests), and the evictor's counter snapshots
  // at the start of the current epoch (adapt_victims()) and of its last
  // round (evict_round(): prefetches issued).
  uint64_t victim_min_ = 0;
  uint64_t victim_floor_ = 0;
  // The victim cache's floor with `issued` blocks read ahead: room for them
  // above victim_floor_, up to victim_min_.
  uint64_t read_ahead_floor(uint64_t issued) const {
    return std::min(victim_min_, victim_floor_ + issued);
  }
  std::atomic<uint64_t> victim_cur_{0};
  uint64_t ctl_victim0_ = 0, ctl_used0_ = 0, ctl_remote0_ = 0, ctl_waited0_ = 0;
  uint64_t ctl_issued0_ = 0, round_issued0_ = 0;
  // The evictor's headroom below the budget (blocks; evictor_main()):
  // written by the evictor, read by tests. It halves after each
  // kPressureNs without a fault that waited.
  std::atomic<int64_t> headroom_{0};
  // Failed reserve()s: a fault (or prefetch) found the budget full.
  std::atomic<uint64_t> budget_full_{0};
  // Prefetches that found no room below prefetch_limit_ (post_prefetches());
  // the evictor's headroom grows on them as on budget_full_.
  std::atomic<uint64_t> prefetch_starved_{0};
  // The evictor's last demote_batch() dropped most of its blocks clean
  // (a scan): the next one may take up to kDemotePick (evict_round()).
  bool scan_evict_ = false;
  static constexpr uint64_t kPressureNs = 100ull * 1000 * 1000;
  int64_t prefetch_limit_ = 0;
  // Prefetch candidates kept per handler for a retry, and for how long.
  static constexpr size_t kMaxPending = 128;
  static constexpr uint64_t kPendingNs = 5ull * 1000 * 1000;
  // Zero-fill fault-around: the largest run next to the faulting block
  // (config, capped so that one run is at most 256 KiB), and the recent
  // first-touch streams, each one word (zero_stream()):
  //   bits  0..31  edge + 1 (0: a free entry); the edge is the stream's last
  //                block mapped: the highest of its run ascending, the lowest
  //                descending, the faulting block of a new stream
  //   bits 32..47  window (the last run's length, 1 .. zero_around_max_)
  //   bits 48..49  direction: kZeroEither (new: edge + 1 continues it up,
  //                edge - 1 down), kZeroUp (edge + 1), kZeroDown (edge - 1)
  // Shared by the handlers, read and replaced with relaxed atomics, no
  // read-modify-write: a lost or stale update only costs a shorter run or a
  // wrong guess (budget), never correctness, as the page table decides who
  // maps a block (Empty -> Fetching CAS per block).
  uint32_t zero_around_max_ = 0;
  bool zero_page_ = false;  // config.zero_page, and not WP_ASYNC
  static constexpr size_t kZeroStreams = 8;
  static constexpr uint32_t kZeroAroundMaxBytes = 256u << 10;
  static constexpr uint64_t kZeroEither = 0, kZeroUp = 1, kZeroDown = 2;
  static constexpr uint64_t zero_stream(uint64_t edge, uint64_t window, uint64_t dir) {
    return (dir << 48) | (window << 32) | (edge + 1);
  }
  std::atomic<uint64_t> zero_streams_[kZeroStreams] = {};
  std::atomic<uint32_t> zero_stream_next_{0};
  // Zero-fill chunks: the chunk in blocks (config.zero_chunk capped at
  // 256 KiB; 0 = off), and one bit per block set once a zero fill mapped it
  // (lazily backed: 1 bit per 4 KiB, pages of it only where blocks were
  // filled; advisory, the page table still decides who maps a block). A
  // chunk is at most 64 blocks and aligned, so its bits are in one word.
  uint32_t zero_chunk_ = 0;
  pager_detail::Mapping filled_;
  uint64_t* filled_words() const { return reinterpret_cast<uint64_t*>(filled_.ptr); }
  uint32_t n_slots_ = 0;
  uint32_t staging_blocks_ = 0;
  bool use_move_ = false;
  bool use_wp_async_ = false;
  PagemapScan pagemap_;         // when use_wp_async_
  pager_detail::Mapping snap_;  // 64 blocks: demote_async()'s snapshots, guarded by snap_mu_
  std::mutex snap_mu_;          // the evictor and evict() both demote
  std::unique_ptr<RemoteMap> remote_;
  std::unique_ptr<Prefetcher> prefetcher_;
  std::vector<void*> registered_;

  std::atomic<int64_t> resident_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> pinned_{0};  // blocks with a pin count > 0
  int64_t pin_limit_blocks_ = 0;
  mutable PagerCounters counters_;

  std::atomic<uint64_t> evict_wp_calls_{0}, evict_dontneed_calls_{0};  // evict_*_calls()
  std::atomic<uint64_t> counters_gap_fill_{0};                         // evict_gap_fills()
  std::atomic<uint64_t> prefetch_runs_{0};                             // prefetch_run_copies()
  std::atomic<uint64_t> ahead_drops_{0};                               // evict_ahead_drops()

  std::mutex list_mu_;
  BlockList active_;  // guarded by list_mu_
  BlockList victim_;  // guarded by list_mu_

  std::mutex slot_mu_;
  // Free slots: those freed since (LIFO), then [fresh_slots_, n_slots_),
  // never used. The per-slot arrays (slot_empty_, wb_*) live in slot_meta_,
  // zero pages until a slot is used: a budget's worth of slots costs no
  // memory until the victim cache grows into it (4 GiB: 262k slots, 8 B
  // each, were 2 MiB resident from the start).
  std::vector<uint32_t> free_slots_;  // guarded by slot_mu_
  uint32_t fresh_slots_ = 0;          // guarded by slot_mu_
  pager_detail::Mapping slot_meta_;
  uint8_t* slot_empty_ = nullptr;  // guarded by slot_mu_; kSlot* below, see alloc_slot()
  // A free slot's page (evictor.h "Free slots' pages"): unknown (a pinning
  // transport: never dropped, not charged), none, or a page charged in
  // resident_ until release_slot_pages() drops it or a new owner takes it.
  static constexpr uint8_t kSlotUnknown = 0, kSlotEmpty = 1, kSlotCharged = 2;
  bool drop_slot_pages_ = false;            // set by init(): the transport does not pin
  int64_t slot_pages_ = 0;                  // free kSlotCharged slots; guarded by slot_mu_
  std::atomic<uint64_t> slot_releases_{0};  // slot_pages_released()

  std::vector<std::unique_ptr<Handler>> handlers_;
  std::thread evictor_;
  std::unique_ptr<Queue> evict_q_;
  std::mutex hint_mu_;
  std::unique_ptr<Queue> hint_q_;  // guarded by hint_mu_
  std::vector<uint32_t> h_wb_;     // evictor only: blocks being written back
  std::vector<IoOp> wb_ops_;       // evictor only
  // Evictor only: WRITEs of the current drop_victims() round that failed
  // with a retryable error, and the current back-off before the next round
  // (0, then kWbBackoffMinUs doubling up to kWbBackoffMaxUs; see
  // drop_victims()).
  uint32_t wb_failures_ = 0;
  uint32_t wb_backoff_us_ = 0;
  static constexpr uint32_t kWbBackoffMinUs = 100;
  static constexpr uint32_t kWbBackoffMaxUs = 10000;
  // Evictor only, per victim slot of a block being written back: WRITEs
  // (one per replica) not yet completed, completed OK, and whether one
  // failed with a retryable error. The block leaves its slot when the
  // last completes and every live replica stored it (invariant 1).
  uint8_t *wb_left_ = nullptr, *wb_ok_ = nullptr, *wb_retry_ = nullptr;  // in slot_meta_
  std::unique_ptr<Replicator<B>> replicator_;  // when remote_->replicas() > 1
  std::mutex evict_mu_;
  std::condition_variable evict_cv_;
  // The resident count past which the sleeping evictor starts a round,
  // and whether it sleeps (note_resident()).
  std::atomic<int64_t> evict_trigger_{0};
  std::atomic<bool> evictor_idle_{false};
  std::atomic<bool> stop_{false};
  int stop_fd_ = -1;

  // Parked handlers (fault_path.h "Parked handlers"). main_cpu_: the main
  // thread's rseq cpu_id (null: parking off); main_tid_: its thread id, as
  // a fault's ptid names it; handler_cpus_: bit c set when a handler is
  // pinned to CPU c; fault_cpu_: the CPU of the faulting thread's latest
  // fault (-1: none yet); other_fault_ns_: when the faults last came from
  // more than one thread, or from one whose CPU is unknown (0: never);
  // faulter_tid_: the thread of the latest fault; park_: parked handlers
  // sleep on it.
  static constexpr long kParkNs = 50'000'000;                 // a parked handler looks again
  static constexpr uint64_t kParkAfterOtherNs = 100'000'000;  // no parking this soon after
  const volatile uint32_t* main_cpu_ = nullptr;
  int main_tid_ = 0;
  uintptr_t main_tp_ = 0;  // the main thread's thread pointer (co-location)
  uint64_t handler_cpus_ = 0;
  std::atomic<int> fault_cpu_{-1};
  std::atomic<uint64_t> other_fault_ns_{0};
  std::atomic<int> faulter_tid_{0};
  // Write-protected mappings and the WP faults that followed, sampled
  // (guess_unwritten(), fault_path.h).
  static constexpr uint32_t kGuessEpoch = 128, kGuessSample = 8;
  std::atomic<uint32_t> ro_mapped_{0}, ro_written_{0}, guess_tick_{0};
  std::atomic<bool> guess_unwritten_{false};
  ParkWord park_;

  // Co-location state (evictor.h "Co-location"); the evictor's alone,
  // but wp_ns_ / wp_calls_, which any demote_batch() caller adds to.
  static constexpr uint64_t kColocateWindowNs = 100'000'000;
  static constexpr uint64_t kColocateMinDemotions = 200;  // a window's, to count as paging
  static constexpr uint64_t kFlushSamples = 512;          // write-protect calls per verdict
  static constexpr uint64_t kSlowFlushNs = 4'000;         // a mean above: flushes are expensive
  static constexpr uint64_t kColocateBackoffNs = 1'000'000'000;
  static constexpr uint64_t kColocateBusyBackoffNs = 10'000'000'000;
  std::atomic<uint64_t> wp_ns_{0}, wp_calls_{0};
  struct Colocation {
    uint64_t next_ns = 0, last_ns = 0, backoff_until = 0;
    uint64_t demotions0 = 0, wp_ns0 = 0, wp_calls0 = 0, run0 = 0, wait0 = 0;
    bool have_sched = false;  // run0 / wait0 hold a reading
    int slow = -1;            // remote flushes: -1 not measured yet, 0 cheap, 1 expensive
    int tid = 0, quiet = 0;
    bool pinned = false, have_mask = false;
    cpu_set_t evictor_mask;  // the evictor's own, restored when apart
  } coloc_;

  // Idle handlers block in read() (see the comment above handler_main() in
  // fault_path.h).
  // blocking_read_: the uffd is blocking and preadv2(RWF_NOWAIT) works.
  // The doorbell: one page registered with the uffd outside the region; a
  // fault on it (doorbell_main(), asked by ring_doorbell()) is the only way
  // to wake a handler blocked in read(). ring_active_: a ring is on;
  // handlers then neither start a blocking read nor poll the uffd.
  static constexpr size_t kDoorbellBytes = 4096;
  bool blocking_read_ = false;
  pager_detail::Mapping doorbell_;
  uint64_t doorbell_addr_ = 0;
  std::atomic<bool> ring_active_{false};
  std::mutex ring_mu_;  // one ring at a time
  std::mutex bell_mu_;  // bell_req_, bell_done_, bell_exit_
  std::condition_variable bell_cv_;
  uint64_t bell_req_ = 0, bell_done_ = 0;
  bool bell_exit_ = false;
  std::thread bell_thread_;
  // Handlers that wait in ppoll() (busy, or a fork or a ring is on): the
  // uffd is non-blocking while there is one, since poll() of a blocking
  // uffd only says POLLERR. mode_mu_ orders the count with the fcntl().
  std::mutex mode_mu_;
  int pollers_ = 0;                   // guarded by mode_mu_
  std::atomic<int> pollers_hint_{0};  // its last value, read unlocked
  void set_poller(Handler& h, bool on);
  // Co-location (evictor.h "Co-location"), run by the evictor thread:
  // colocate_tick() decides every kColocateWindowNs, colocate_apart()
  // lifts the pin (if still ours) and gives the evictor its mask back,
  // colocate_end() does that when the evictor stops. wp_ns_ / wp_calls_:
  // the evictor's write-protect calls, timed (demote_batch()).
  void colocate_tick();
  void colocate_end();
  void colocate_apart();
  // Parked handlers: note_faulter() follows where the main thread faults
  // and says when that changed (the caller then wakes the parked handlers,
  // once the faults it read are answered); should_park() says
  // whether an idle `h` is not needed; park() sleeps (at most kParkNs)
  // when it holds and says whether it did.
  bool note_faulter(const Handler& h, const uffd_msg& m);
  bool should_park(const Handler& h) const;
  bool park(const Handler& h);
  void doorbell_main();
  // Keeps the doorbell ringing (a fault on it that every handler reading it
  // wakes unresolved, so that it faults again) until done() holds, then
  // maps the page to let the toucher go and drops it again.
  template <class Done>
  void ring_doorbell(Done done);

  // fork() snapshots (prepare_fork()).
  // A write-back of b is about to reuse its unit: when a snapshot reads
  // that unit, b moves to a new one first (the old one is freed with the
  // snapshot). Error: no remote space.
  Status fork_rehome(uint32_t b);
  Status fork_writeback_victims();
  // Waits until every handler dispatch section running now has ended.
  // ring: a section may be blocked in read() (prepare_fork(); see
  // handler_main()), so ring the doorbell until they ended.
  void wait_dispatch_sections(bool ring);
  std::atomic<bool> fork_frozen_{false};  // handlers park faults
  std::mutex fork_mu_;                    // one fork at a time: prepare .. parent
  std::mutex fork_gate_;                  // held by the evictor per round; by a fork
  // The thread whose prepare_fork() holds the locks until its fork_parent().
  std::atomic<pthread_t> fork_owner_{0};
  bool fork_child_ = false;
  bool fork_warned_ = false;
  ForkSupport<B> fork_;
};

inline Status pager_detail::Mapping::map(size_t len, size_t align, bool noreserve,
                                         const char* what) {
  raw_len = len + (align > 4096 ? align : 0);
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0);
  void* p = mmap(nullptr, raw_len, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    raw = nullptr;
    return make_error(Errc::kResourceExhausted,
                      "mmap of %zu bytes for the %s failed: %s; lower the region size or "
                      "check ulimit -v / vm.overcommit_memory",
                      raw_len, what, strerror(errno));
  }
  raw = p;
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (align > 4096) a = (a + align - 1) & ~(uintptr_t{align} - 1);
  ptr = reinterpret_cast<char*>(a);
  return ok_status();
}

}  // namespace farmem
