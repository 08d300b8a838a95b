// Pager<B>'s zero fill: blocks never written (Empty) are served as zeros
// without I/O (invariant 2). Besides the faulting block itself (in
// handle_fault(), fault_path.h): fault-around along first-touch streams,
// aligned chunks, allocation-time population on the allocating thread, and
// on the way out the check that drops a never-written dirty block back to
// Empty (clean_if_zero(), called by the evictor's demotion). Part of
// Pager<B> (pager/pager_core.h); include pager/pager.h.
//
// Zero-fill fault-around (config.zero_fault_around, FARMEM_ZERO_AROUND):
// first touches usually walk forward (memset, a growing buffer, a sort's
// input) or backward (GNU sort's line table and merge buffer fill its
// buffer from the top down). 8 streams are remembered, shared by the
// handlers, each by its edge: the last block it mapped (the top of an
// ascending run, the bottom of a descending one). A zero fault on the block
// right above an ascending stream's edge also maps the never-written blocks
// after it, one right below a descending stream's edge the blocks below it
// (the faulting block is then the highest of the run), and a fault next to
// a new stream's single block (either side) decides its direction; all in
// the same UFFDIO_COPY as the faulting block: 2 the first time, doubling up
// to the limit (32; at most 256 KiB per ioctl), back to the faulting block
// alone at a fault that continues no stream. Only a contiguous run of Empty
// blocks, each taken Empty -> Fetching like a zero fault, and only within
// the headroom below the high watermark (a guess never takes a demand
// fault's room), except a write stream's (below). A read fault maps the run
// write-protected and clean; a write fault maps it writable and dirty
// (config.zero_around_writable), so that a sequential writer takes one
// fault per run instead of one per block. A block mapped so and never
// written costs no I/O: demotion finds a dirty block with no remote copy
// all-zero (clean_if_zero(), a scan of the just-copied slot that stops at
// the first non-zero word) and drops it back to Empty. Counted in
// zero_around (blocks mapped ahead) and zero_cleaned.
// Strided first touches (b, b+k, b+2k: a column walk) are not followed: a
// run with holes left unmapped is one ioctl per block (only the hand-off
// saved), and mapping the holes too (a fault up to k blocks past an edge
// continuing its stream, one ioctl) was simulated on sort's first-touch
// trace: 1069 -> 824 faults for k <= 2, 693 for k <= 5 (~1-2 ms of handler
// time in a 1.3 s run); more streams (16, 32) change nothing. Not worth
// the fault path's extra cases yet.
// Measured (bench/preload_overhead.sh, loopback, 2 cores at load average
// 7-13, so wall ratios moved by +-0.3 between identical runs and decide
// nothing): ascending streams alone took zero faults sort 15770 -> 9138,
// python 21837 -> 4162; descending streams too: sort 9152-9196 -> 1108-1193
// (peak resident 61.7 MiB both: the runs map nothing sort does not touch),
// mt 917-979 -> 656-790, python unchanged (~4160); sort's CPU ratio with /
// without the library 1.38 / 1.53 -> 1.08 / 0.97 (--reps 5 --workload
// sort, before and after interleaved, load average 8-9). Mapping ahead of
// a write write-protected instead (FARMEM_ZERO_AROUND_WRITABLE=0) adds a
// WP fault per block then written (sort, ascending only: 9156 zero + 6614
// WP, no gain over 15770; writable: 9111 zero + 0 WP), so writable is kept.
// The all-zero check costs 0.14-0.32 us per all-zero 4 KiB block
// (cache-hot, same machine), only for dirty blocks never written back.
//
// Write streams at a full budget. A program paging hard sits at its
// budget, above the high watermark, so the headroom rule cut runs short
// there: GNU sort -S 1G of 3M lines at its 70% budget (191328256 B) filled
// its buffer and line table with ~22.5k zero faults of ~3 blocks each (the
// faulting block and ~2 mapped ahead), a handler round trip per 12 KiB.
// A write fault that continues a stream is no guess: the thread is writing
// its way through those blocks, and each would fault and take the same
// room a moment later. So such a run may take the budget's last blocks
// too (resident_ never passes the budget; it kicks the evictor as
// reserve() would, and a demand fault that then finds no room waits for
// the evictor as always). Read streams and chunks stay below the high
// watermark. Measured (same binary with and without, interleaved, four
// pairs, one-sided to farmemd on 127.0.0.1): sort's zero faults
// 22.1-23.1k -> 5.0-5.1k, zero_around 44-45k -> 62k blocks, wall 3.73 /
// 3.07, 3.27 / 3.08, 3.42 / 3.14, 2.87 / 2.82 s (a slow hour of this VM).
// PagerFaultPath.AWriteStreamAtAFullBudgetMapsRuns.
//
// Zero-fill chunks (config.zero_chunk, FARMEM_ZERO_CHUNK, default 32
// blocks; zero_chunk_fill()): sort's first touches are scattered over its
// 100 MB buffer (most continue no stream), so a zero fault that continues
// no stream also maps the blocks of the ALIGNED chunk around it, with the
// fault-around rules: only Empty blocks, each taken Empty -> Fetching, only
// within the headroom below the high watermark (nearest to the fault first
// when it does not cover all), never waking the evictor, one UFFDIO_COPY
// per contiguous run (the faulting block's run last: its copy wakes the
// thread), write-protected and clean for a read fault, writable and dirty
// for a write fault (zero_around_writable), counted in zero_around;
// clean_if_zero() drops the never-written ones without I/O. Only blocks no
// zero fill ever mapped (filled_: one bit per block, set by every zero
// fill: faults, fault-around runs, chunks, populate_zero()): memory a
// program freed (discarded back to Empty) inside a chunk is not mapped
// again for a neighbour's first touch, so freed-and-reused heaps do not
// grow. So a chunk is filled once (again only where the headroom cut a
// fill short).
// Measured (bench/preload_overhead.sh --reps 7, same binary with
// FARMEM_ZERO_CHUNK=32 / 0 / 64 interleaved, load average 2.6-5.5): sort's
// zero faults 1143-1156 -> 496 (32) -> 259 (64); peak RSS unchanged (sort
// 71.6 MiB with and without, 72.0 at 64; python3 135.7 / 135.6 MiB; plain
// runs 63.4 / 122.4); wall and CPU ratios with / without the library moved
// by +-0.1 between identical runs (sort CPU ratio 0.95-1.02 chunk 32,
// 0.97-1.08 off) and decide nothing. At load average 1.6, two pairs
// (--reps 7, sort): chunk 32 wall ratio median 1.004 / 1.053, minimum
// 0.990 / 0.978, CPU 0.93 / 1.00; off 1.101 / 1.072, 1.059 / 1.064, CPU
// 1.06 / 1.00. The eval's kv (bench/eval/run.sh,
// fm-loopback, off / 32, quiet machine): 25% local 2.95e4 / 2.98e4 ops/s,
// remote faults 446410 / 446060, zero faults 28254 / 28253; 75% remote
// faults 142548 / 142194: its random first touches find no headroom or
// filled chunks, so chunks change nothing there.
//
// Allocation-time population (populate_zero(); the far heap calls it for
// the first FarHeapOptions::populate_max bytes of a fresh allocation,
// FARMEM_POPULATE_MAX): fault-around still takes a fault per run, and each
// is a round trip through a handler (25-45 us on the 2-core VM, where the
// kernel's own first touch takes ~13 us): python3's structures.py took 4159
// zero faults for 1044 far mallocs, most in 96 KiB and 64 KiB objects that
// streams of 1, 2, 4 ... blocks map in 4-6 faults each. So the allocating
// thread maps the Empty blocks of the new allocation itself, as a write
// fault's zero fill would (Empty -> Fetching CAS per block, budget reserved
// first, one UFFDIO_COPY per run of up to 1 + zero_around_max_ blocks,
// writable and dirty, active list, Present): no hand-off, no fault. Only
// within the headroom below the high watermark, as fault-around; skipped
// while a fork is prepared (fork_frozen_: the snapshot is being taken; a
// fill that began before waits in prepare_fork()'s wait for transient
// blocks, one that races fork() itself gets EAGAIN from the kernel until a
// handler read the fork event, and either way the child sees zeros there,
// which is what the block held) and in a fork()ed child (uffd_ is the
// parent's there). A block a thread faults on meanwhile waits for the copy,
// which wakes it. Measured (structures.py, loopback): 4159 zero faults
// -> 2416 (populate_max 64K), 224 (128K), 203 (256K), 157 (1M), 0 (8M);
// peak resident 86 MiB for all. sort's 100 MB buffer: 256 KiB filled
// (1142 faults unchanged; its first touches are scattered and only a fill
// of the whole buffer removes them: 100 MiB resident instead of 62).
//
// Reads of never-written memory (config.zero_page, FARMEM_ZERO_PAGE,
// default on; install_zero_page()): a plain program's first read of fresh
// anonymous memory maps the kernel's shared zero page, which holds no
// memory (a 64 MiB read-only walk of a fresh malloc grew plain RSS by 128
// KiB), while a UFFDIO_COPY of zeros gives each block a private page. So
// a read fault on an Empty block maps the zero page instead
// (Uffd::zero_protected(): UFFDIO_ZEROPAGE without wake, UFFDIO_WRITEPROTECT,
// wake) and the block becomes Present | kZeroMapped: no budget taken, on no
// list (the evictor never sees it), fault-around runs as for any zero fault
// (zero_around_claim() without room: a zero page costs nothing). Its first
// write is a WP fault (the kernel checks uffd-wp before the zero page's
// copy-on-write): reserve() (or defer), active list, un-protect, which
// wakes the writer, whose write then gets its page from the kernel; the
// block is an ordinary dirty Present block from then on (counted in
// zero_mapped_written). discard() drops it without giving budget back;
// evict() makes it Empty (MADV_DONTNEED, no I/O); pin() first writes it
// (an atomic add of 0) so that a pinned block has a page of its own; fork
// needs nothing (the child's copy maps the same zero page). Off under
// WP_ASYNC (a write there would be resolved with no event).
// The one window: a thread that is NOT waiting on the block and writes it
// between UFFDIO_ZEROPAGE and the write-protect (about a microsecond) gets
// a private copy from the kernel with no event. Nothing is lost: the
// write-protect then protects that copy, the next write to it is an
// ordinary WP fault of a kZeroMapped block (reserve, list, dirty) and from
// then on the block is evicted and written back like any other; discard
// drops it, as it should. Until that next write the page is local but not
// counted (one page per such race; the pager's tests check byte-exactness
// under exactly this race, pager_zero_page_test.cc).
// Cost: the write-protect of a present pte flushes the TLB of the other
// CPUs the process runs on: 0.5 us for the UFFDIO_ZEROPAGE and 9.2 us for
// the UFFDIO_WRITEPROTECT per 4 KiB block on the 2-vCPU VM (a bare probe,
// 16384 single-block faults), once per fault-around run, not per block.
#pragma once

#include "pager/pager_core.h"

namespace farmem {

template <TransportBackend B>
uint32_t Pager<B>::zero_around_claim(uint32_t b, uint32_t* first, bool* continued, bool take_room,
                                     bool write) {
  *first = b;
  *continued = false;
  // A fault right after a stream's edge continues it: b == edge + 1 an
  // ascending one, b == edge - 1 a descending one (its edge is the lowest
  // block of its last run), either for a new stream.
  size_t hit = kZeroStreams;
  uint64_t window = 0;
  bool down = false;
  for (size_t i = 0; i < kZeroStreams; ++i) {
    const uint64_t v = zero_streams_[i].load(std::memory_order_relaxed);
    const uint64_t key = v & 0xffffffffu;
    if (key == 0) continue;
    const uint64_t edge = key - 1, dir = v >> 48;
    if (dir != kZeroDown && edge + 1 == b) {
      hit = i;
    } else if (dir != kZeroUp && edge == uint64_t{b} + 1) {
      hit = i;
      down = true;
    } else {
      continue;
    }
    window = (v >> 32) & 0xffffu;
    break;
  }
  if (hit == kZeroStreams) {
    // Not a continuation: b alone, and a new stream whose edge is b, going
    // either way (window 1, so that its first continuation maps 2).
    const size_t i = zero_stream_next_.fetch_add(1, std::memory_order_relaxed) % kZeroStreams;
    zero_streams_[i].store(zero_stream(b, 1, kZeroEither), std::memory_order_relaxed);
    return 0;
  }
  *continued = true;
  window = std::min<uint64_t>(std::max<uint64_t>(window * 2, 2), zero_around_max_);
  uint64_t n = std::min<uint64_t>(window, down ? uint64_t{b} : n_blocks_ - 1 - b);
  // Budget: the headroom below the high watermark, so that a guess never
  // takes the room a demand fault needs; a write stream's run is no guess
  // (see "Write streams at a full budget" above): up to the budget.
  const int64_t limit = write ? budget_blocks_ : high_blocks_;
  int64_t cur = resident_.load(std::memory_order_relaxed);
  for (; take_room;) {
    const int64_t room = limit - cur;
    if (room <= 0 || n == 0) {
      n = 0;
      break;
    }
    const int64_t k = std::min<int64_t>(static_cast<int64_t>(n), room);
    if (resident_.compare_exchange_weak(cur, cur + k, std::memory_order_relaxed)) {
      n = static_cast<uint64_t>(k);
      int64_t pk = peak_.load(std::memory_order_relaxed);
      while (cur + k > pk && !peak_.compare_exchange_weak(pk, cur + k)) {
      }
      note_resident(cur + k);
      break;
    }
  }
  // Only a contiguous run of never-written blocks next to b, on the
  // stream's side: one ioctl maps it with b.
  uint32_t got = 0;
  while (got < n) {
    const uint32_t c = down ? b - 1 - got : b + 1 + got;
    uint32_t w = pt_.load(c);
    if (PageTable::state_of(w) != PageState::kEmpty ||
        !pt_.try_transition(c, w, PageTable::make(PageState::kFetching, 0, 0))) {
      break;
    }
    ++got;
  }
  if (got < n && take_room) unreserve(static_cast<int64_t>(n - got));
  if (down) *first = b - got;
  // A run cut short (budget, a block not Empty) keeps its window: the next
  // fault past the new edge tries again.
  zero_streams_[hit].store(
      down ? zero_stream(b - got, window, kZeroDown) : zero_stream(b + got, window, kZeroUp),
      std::memory_order_relaxed);
  return got;
}

template <TransportBackend B>
void Pager<B>::install_zero_run(uint32_t first, uint32_t n, uint32_t b, bool write) {
  const bool ahead_writable = write && cfg_.zero_around_writable;
  int err = 0;
  Errc e;
  if (write && !ahead_writable) {
    // The others (write-protected; nobody waits on them) before b, whose
    // copy wakes the faulting thread: it finds them mapped. They are
    // contiguous: above b ascending, below it descending.
    const uint32_t others = b == first ? first + 1 : first;
    e = uffd_.copy(block_addr(others), zero_.ptr, uint64_t{n - 1} * block_, true, &err);
    if (e == Errc::kOk) e = uffd_.copy(block_addr(b), zero_.ptr, block_, false, &err);
  } else {
    // One copy of the whole run, b included (the highest block of a
    // descending run): it wakes the faulting thread.
    e = uffd_.copy(block_addr(first), zero_.ptr, uint64_t{n} * block_, !ahead_writable, &err);
  }
  if (e != Errc::kOk) {
    fatal(
        "pager: UFFDIO_COPY of %u zero blocks at %p (faulting block %u) failed: %s; the page "
        "table and the mapping disagree",
        n, static_cast<void*>(block_addr(first)), b, strerror(err));
  }
  // Active list in the order the stream will use the blocks: b first (the
  // oldest), then away from it.
  const bool up = b == first;
  {
    std::lock_guard<std::mutex> lk(list_mu_);
    for (uint32_t i = 0; i < n; ++i) active_.push_front(up ? b + i : b - i);
  }
  pt_.finish(b, PageTable::make(PageState::kPresent, write ? PageTable::kDirty : 0, 0));
  for (uint32_t i = 1; i < n; ++i) {
    pt_.finish(up ? b + i : b - i,
               PageTable::make(PageState::kPresent, ahead_writable ? PageTable::kDirty : 0, 0));
  }
}

template <TransportBackend B>
void Pager<B>::install_zero_page(uint32_t first, uint32_t n) {
  int err = 0;
  if (uffd_.zero_protected(block_addr(first), uint64_t{n} * block_, &err) != Errc::kOk) {
    fatal(
        "pager: mapping the zero page over %u block(s) at %p (block %u) failed: %s; the page "
        "table and the mapping disagree",
        n, static_cast<void*>(block_addr(first)), first, strerror(err));
  }
  for (uint32_t i = 0; i < n; ++i) {
    pt_.finish(first + i, PageTable::make(PageState::kPresent, PageTable::kZeroMapped, 0));
  }
}

template <TransportBackend B>
void Pager<B>::mark_filled(uint32_t first, uint32_t n) {
  uint64_t* words = filled_words();
  for (uint64_t i = first, end = uint64_t{first} + n; i < end;) {
    const uint64_t bit = i % 64, k = std::min<uint64_t>(64 - bit, end - i);
    const uint64_t mask = (k == 64 ? ~uint64_t{0} : ((uint64_t{1} << k) - 1)) << bit;
    std::atomic_ref<uint64_t> w(words[i / 64]);
    // Set bits stay set: a load spares the shared cache line a write.
    if ((w.load(std::memory_order_relaxed) & mask) != mask) {
      w.fetch_or(mask, std::memory_order_relaxed);
    }
    i += k;
  }
}

template <TransportBackend B>
uint32_t Pager<B>::zero_chunk_fill(uint32_t b, bool write) {
  const uint32_t c0 = b & ~(zero_chunk_ - 1);
  const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(zero_chunk_, n_blocks_ - c0));
  const uint64_t all = len == 64 ? ~uint64_t{0} : (uint64_t{1} << len) - 1;
  const uint64_t self = uint64_t{1} << (b - c0);
  std::atomic_ref<uint64_t> fw(filled_words()[c0 / 64]);
  const uint64_t filled = (fw.load(std::memory_order_relaxed) >> (c0 % 64)) & all;
  // Never-filled blocks only: memory the program freed or discarded (Empty
  // again) is not mapped back for a neighbour's first touch.
  uint64_t want = all & ~filled & ~self;
  if (want == 0) return 0;
  // Budget: only the headroom below the high watermark (zero_around_claim()).
  int64_t n = std::popcount(want);
  int64_t cur = resident_.load(std::memory_order_relaxed);
  for (;;) {
    const int64_t room = high_blocks_ - cur;
    if (room <= 0) return 0;
    const int64_t k = std::min(n, room);
    if (resident_.compare_exchange_weak(cur, cur + k, std::memory_order_relaxed)) {
      n = k;
      int64_t pk = peak_.load(std::memory_order_relaxed);
      while (cur + k > pk && !peak_.compare_exchange_weak(pk, cur + k)) {
      }
      break;
    }
  }
  // Take them, nearest to b first (the likeliest next touches) when the
  // headroom does not cover all.
  uint64_t got = 0;
  int64_t taken = 0;
  for (uint32_t d = 1; d < len && taken < n; ++d) {
    for (const int64_t i : {int64_t{b - c0} + d, int64_t{b - c0} - d}) {
      if (i < 0 || i >= len || !(want >> i & 1) || taken == n) continue;
      const uint32_t c = c0 + static_cast<uint32_t>(i);
      uint32_t w = pt_.load(c);
      if (PageTable::state_of(w) == PageState::kEmpty &&
          pt_.try_transition(c, w, PageTable::make(PageState::kFetching, 0, 0))) {
        got |= uint64_t{1} << i;
        ++taken;
      }
    }
  }
  if (taken < n) unreserve(n - taken);
  if (got == 0) return 0;
  const uint64_t mine = got | self;
  counters_.bump(counters_.zero_around, static_cast<uint64_t>(taken));  // before the wake
  const bool ahead_writable = write && cfg_.zero_around_writable;
  auto copy = [&](uint32_t first, uint32_t cnt, bool wp) {
    int err = 0;
    if (uffd_.copy(block_addr(first), zero_.ptr, uint64_t{cnt} * block_, wp, &err) != Errc::kOk) {
      fatal(
          "pager: UFFDIO_COPY of %u zero blocks at %p (chunk fill, faulting block %u) failed: "
          "%s; the page table and the mapping disagree",
          cnt, static_cast<void*>(block_addr(first)), b, strerror(err));
    }
  };
  // The runs of mine; b's last.
  uint32_t b_first = b, b_end = b + 1;
  for (uint32_t i = 0; i < len;) {
    if (!(mine >> i & 1)) {
      ++i;
      continue;
    }
    uint32_t j = i;
    while (j < len && (mine >> j & 1)) ++j;
    mark_filled(c0 + i, j - i);
    if (c0 + i <= b && b < c0 + j) {
      b_first = c0 + i;
      b_end = c0 + j;
    } else {
      copy(c0 + i, j - i, !ahead_writable);
    }
    i = j;
  }
  if (write && !ahead_writable) {
    // b writable, the others of its run write-protected, b last.
    if (b_first < b) copy(b_first, b - b_first, true);
    if (b + 1 < b_end) copy(b + 1, b_end - b - 1, true);
    copy(b, 1, false);
  } else {
    copy(b_first, b_end - b_first, !ahead_writable);
  }
  {
    std::lock_guard<std::mutex> lk(list_mu_);
    active_.push_front(b);  // b the oldest: touched first
    for (uint32_t i = 0; i < len; ++i) {
      if (got >> i & 1) active_.push_front(c0 + i);
    }
  }
  pt_.finish(b, PageTable::make(PageState::kPresent, write ? PageTable::kDirty : 0, 0));
  for (uint32_t i = 0; i < len; ++i) {
    if (got >> i & 1) {
      pt_.finish(c0 + i,
                 PageTable::make(PageState::kPresent, ahead_writable ? PageTable::kDirty : 0, 0));
    }
  }
  return static_cast<uint32_t>(taken);
}

template <TransportBackend B>
size_t Pager<B>::populate_zero(void* addr, size_t len) noexcept {
  const uintptr_t base = reinterpret_cast<uintptr_t>(region_.ptr);
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  // In a fork()ed child uffd_ is the parent's descriptor: an ioctl on it
  // would map pages into the parent. While a fork is prepared the snapshot
  // is being taken (and during fork() the kernel refuses copies): the
  // faults take over, parked as usual.
  if (len == 0 || a < base || a - base >= cfg_.region_size || fork_child_ ||
      fork_frozen_.load(std::memory_order_acquire)) {
    return 0;
  }
  const uint64_t end = std::min<uint64_t>(a - base + len, cfg_.region_size);
  uint32_t b = static_cast<uint32_t>((a - base) / block_);
  const uint32_t last = static_cast<uint32_t>((end + block_ - 1) / block_);  // exclusive
  const uint32_t max_run = 1 + zero_around_max_;  // zero_ holds that many blocks
  size_t mapped = 0;
  while (b < last) {
    if (PageTable::state_of(pt_.load(b)) != PageState::kEmpty) {
      ++b;  // mapped, remote, owned by another thread: not ours to fill
      continue;
    }
    // Budget first, as zero_around_claim(): only the headroom below high.
    const int64_t want = std::min<int64_t>(last - b, max_run);
    int64_t cur = resident_.load(std::memory_order_relaxed);
    int64_t k = 0;
    for (;;) {
      const int64_t room = high_blocks_ - cur;
      if (room <= 0) return mapped;
      k = std::min(want, room);
      if (resident_.compare_exchange_weak(cur, cur + k, std::memory_order_relaxed)) break;
    }
    int64_t pk = peak_.load(std::memory_order_relaxed);
    while (cur + k > pk && !peak_.compare_exchange_weak(pk, cur + k)) {
    }
    // A contiguous run of Empty blocks from b, each taken Empty -> Fetching
    // as a zero fault takes it: a fault on one of them now waits for us.
    uint32_t got = 0;
    while (got < k) {
      uint32_t w = pt_.load(b + got);
      if (PageTable::state_of(w) != PageState::kEmpty ||
          !pt_.try_transition(b + got, w, PageTable::make(PageState::kFetching, 0, 0))) {
        break;
      }
      ++got;
    }
    if (got < k) unreserve(k - got);
    if (got == 0) {
      ++b;  // another thread took b first
      continue;
    }
    if (zero_chunk_ > 0) mark_filled(b, got);
    // One copy, writable (the program is about to write what it allocated);
    // it wakes any thread that faulted on the run meanwhile. EAGAIN (a
    // fork() copying the address space right now) is retried by copy()
    // until a handler has read the fork's event.
    int err = 0;
    if (uffd_.copy(block_addr(b), zero_.ptr, uint64_t{got} * block_, false, &err) != Errc::kOk) {
      fatal(
          "pager: UFFDIO_COPY of %u zero blocks at %p (allocation-time fill) failed: %s; the "
          "page table and the mapping disagree",
          got, static_cast<void*>(block_addr(b)), strerror(err));
    }
    {
      std::lock_guard<std::mutex> lk(list_mu_);
      for (uint32_t i = 0; i < got; ++i) active_.push_front(b + i);
    }
    for (uint32_t i = 0; i < got; ++i) {
      pt_.finish(b + i, PageTable::make(PageState::kPresent, PageTable::kDirty, 0));
    }
    mapped += got;
    b += got;
  }
  return mapped;
}

template <TransportBackend B>
uint32_t Pager<B>::clean_if_zero(uint32_t b, uint32_t slot, uint32_t w) {
  if (!(w & PageTable::kDirty) || pt_.remote(b) != 0) return w;
  // Cache-hot (just copied); a block with data fails on its first words.
  const auto* p = reinterpret_cast<const uint64_t*>(slot_addr(slot));
  for (size_t i = 0; i < block_ / 8; i += 8) {
    if ((p[i] | p[i + 1] | p[i + 2] | p[i + 3] | p[i + 4] | p[i + 5] | p[i + 6] | p[i + 7]) != 0)
      return w;
  }
  counters_.bump(counters_.zero_cleaned);
  return w & ~PageTable::kDirty;
}

}  // namespace farmem
