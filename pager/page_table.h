// Per-block metadata of a pager region: the block state machine, its
// checked transitions and the intrusive replacement lists.
//
//   PageTable pt;
//   FARMEM_RETURN_IF_ERROR(pt.init(n_blocks));
//   uint32_t w = pt.load(b);
//   if (PageTable::state_of(w) == PageState::kRemote &&
//       pt.try_transition(b, w, PageTable::with_state(w, PageState::kFetching))) { ... }
//
// A block is the fetch unit (4 KiB .. 2 MiB). Metadata is 24 bytes per block,
// i.e. 24 bytes per 4 KiB page at the default block size and less for bigger
// blocks, in four arrays, so that a block pays only for what it uses: 12
// bytes here (the word and the list links, for every block ever resident),
// a 4-byte remote unit in a second array (remote(): written when the block
// is first written back, so a heap that fits its budget never touches it),
// a 4-byte hash in a third (fetched_hash()) and a 4-byte access word in a
// fourth (hot_laps(), left_at(): pager/evictor.h "Access tracking"). The
// arrays are anonymous memory reserved up front; a page of them that is
// only read maps the kernel's zero page and costs nothing.
//
//   byte 0        4          8          12
//        +--------+----------+----------+
//        | word   | prev     | next     |
//        +--------+----------+----------+
//   word (atomic u32):  bits 0-3 state | 4 dirty | 5 prefetched | 6 pinned |
//                       7 written (Remote) / guessed (resident) | 8 zero-mapped (Present) |
//                       bits 9-31: the local slot index
//                       (kVictim, kPromoting, kWriting, kFetching into a slot), or the pin count
//                       when bit 6 is set (a pinned block is always Present, or Protecting /
//                       Discarding owned from Present, so it has no slot)
//   prev/next: links of the list the block is on (active or victim), guarded
//           by the pager's list lock
//   remote(b): remote unit + 1 (block-sized units, see RemoteMap); 0 when the
//           block has never been written back (so an all-zero table is valid)
//
// State machine. Stable states are at rest; a transient state is owned by
// exactly one thread (the one whose CAS entered it), and only the owner
// leaves it. Every change of the page's mapping, its protection or its list
// membership happens while its owner holds it in a transient state; a fault
// that finds a transient state owned by another thread waits (the faulting
// thread stays blocked in the kernel, the event is retried).
//
//   from \ to   | Empty Remote Present Victim | Fetching Protecting Demoting Promoting Writing
//   Discarding
//   ------------+-----------------------------+----------------------------------------------------------
//   Empty       |                             |    Z                                              D
//   Remote      |                             |    F,P                                            D
//   Present     |                             |              W          E                         D
//   Victim      |   c     c                   |                                   H        E      D
//   Fetching    |         x      ok    ok(P)  |
//   Protecting  |                ok           |
//   Demoting    |         s      ok    ok     |
//   Promoting   |                ok           |
//   Writing     |         ok           ok(x)  |
//   Discarding  |   ok                        |
//
//   Z  zero fill on a fault (handler)        F  demand fetch (handler)
//   P  prefetch into a slot (handler)        W  write fault: make writable + dirty
//   E  evictor: demote a resident block into a victim slot / write a dirty
//      victim back                          H  fault on a victim: hit, map it
//   c  evictor drops a clean victim (Remote when a remote copy exists, else
//      Empty: a never-written block reads as zeros again)
//   s  evictor drops a clean block that a confirmed prefetch stream mapped
//      ahead (kPrefetched on Present) and that has a remote copy, without
//      passing it through the victim cache (scan resistance, prefetch_path.h)
//   x  failed I/O: a failed prefetch returns to Remote; a failed WRITE keeps
//      the data in its slot (Victim, still dirty)
//   D  discard (allocator purge): the block reads as zeros again; a pinned
//      block is unpinned by it
//
// Pinning (Pager::pin / unpin) uses the Present -> Protecting -> Present
// edge: the pinner owns the block while it takes it off the active list
// (pin count 0 -> 1) or puts it back (1 -> 0), and otherwise just changes
// the count. A pinned block is never on a list, so the evictor never sees
// it; evict() skips it; a write fault on it (W) keeps the pin bits.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "runtime/log.h"
#include "runtime/status.h"

namespace farmem {

enum class PageState : uint8_t {
  kEmpty = 0,
  kRemote = 1,
  kPresent = 2,
  kVictim = 3,
  kFetching = 4,
  kProtecting = 5,
  kDemoting = 6,
  kPromoting = 7,
  kWriting = 8,
  kDiscarding = 9,
};
inline constexpr int kNumPageStates = 10;

const char* page_state_name(PageState s) noexcept;
inline constexpr bool is_transient(PageState s) {
  return static_cast<uint8_t>(s) >= static_cast<uint8_t>(PageState::kFetching);
}
// The table above as data; FARMEM_BUG_ON when a transition is not in it.
bool page_transition_allowed(PageState from, PageState to) noexcept;

inline constexpr uint32_t kNoRemote = UINT32_MAX;  // "no unit" as returned by allocators
inline constexpr uint32_t kNil = UINT32_MAX;
inline constexpr uint32_t kNoSlot = (1u << 23) - 1;
inline constexpr uint32_t kMaxSlots = kNoSlot;  // slot indices 0 .. kMaxSlots-1

struct BlockMeta {
  std::atomic<uint32_t> word{0};
  uint32_t prev = kNil;
  uint32_t next = kNil;
};
static_assert(sizeof(BlockMeta) == 12, "metadata budget: 12 bytes per resident block");

class PageTable {
 public:
  static constexpr uint32_t kStateMask = 0xF;
  static constexpr uint32_t kDirty = 1u << 4;
  // Victim: read ahead into its slot, not faulted on yet. Present: mapped
  // ahead by a confirmed prefetch stream, not faulted on since.
  static constexpr uint32_t kPrefetched = 1u << 5;
  static constexpr uint32_t kPinned = 1u << 6;  // bits 8-31 hold the pin count
  // Bit 7, by state (pager/fault_path.h "Written blocks come back
  // writable"). Remote: kWritten, the block was seen written in its last
  // stay (a write fault or a WP fault made it dirty), so a read fault maps
  // it writable and dirty. Resident (Present, Demoting, Victim, Promoting,
  // Writing): kGuessed, it was mapped so on that guess and no write of it
  // has been seen since (none can be: it is writable), so its dirt proves
  // nothing and it leaves without kWritten.
  static constexpr uint32_t kWritten = 1u << 7;
  static constexpr uint32_t kGuessed = 1u << 7;
  // What a resident block's word carries from state to state.
  static constexpr uint32_t kKeep = kDirty | kGuessed;
  // Present only: the block is mapped to the kernel's shared zero page,
  // write-protected (a read fault on a never-written block, config.zero_page,
  // pager/zero_fill.h "Reads of never-written memory"). It holds no memory:
  // it is not counted in the budget and is on no list; its first write (a
  // WP fault) reserves room, puts it on the active list and clears the bit.
  static constexpr uint32_t kZeroMapped = 1u << 8;
  static constexpr uint32_t kMaxPinCount = kNoSlot;
  static constexpr int kSlotShift = 9;

  PageTable() = default;
  PageTable(const PageTable&) = delete;
  PageTable& operator=(const PageTable&) = delete;
  ~PageTable();

  // Reserves metadata for n blocks (lazily backed: untouched blocks cost no
  // memory). n < 2^32 - 1.
  Status init(uint64_t n_blocks);
  uint64_t size() const { return n_; }
  // The table's resident memory (the Rss of its mapping in
  // /proc/self/smaps, which leaves out zero pages); 0 when it cannot be
  // read. For tests and reports: it reads the whole smaps file.
  size_t resident_bytes() const;

  BlockMeta& meta(uint32_t b) { return blocks_[b]; }
  // The block's remote unit + 1 (0: none), owned like the word's slot: by
  // the thread that holds the block in a transient state.
  uint32_t& remote(uint32_t b) { return remotes_[b]; }
  // block_hash() of a block's content as a guessed fetch brought it
  // (kGuessed, pager/fault_path.h "Written blocks come back writable"):
  // set by the handler that maps it, read by the evictor after it left
  // (the word's release / acquire orders the two). A hint only.
  uint32_t& fetched_hash(uint32_t b) { return hashes_[b]; }
  uint32_t load(uint32_t b) const { return blocks_[b].word.load(std::memory_order_acquire); }

  // The access word of a block (pager/evictor.h "Access tracking"), a
  // hint read and written relaxed by whichever thread handles the block:
  //   bits 0-3  hot laps: passes of the active list's tail the block may
  //             still make without being sampled (demoted) again
  //   bits 4-31 remote: when it last left local memory, on the pager's
  //             leave clock (mod 2^28; 0: never); resident with laps: when
  //             they were given (set_hot_laps_at())
  static constexpr uint32_t kLapBits = 4;
  static constexpr uint32_t kMaxHotLaps = (1u << kLapBits) - 1;
  static constexpr uint32_t kLeaveMask = (1u << (32 - kLapBits)) - 1;
  uint32_t hot_laps(uint32_t b) const {
    return access_word(b).load(std::memory_order_relaxed) & kMaxHotLaps;
  }
  void set_hot_laps(uint32_t b, uint32_t laps) {
    auto a = access_word(b);
    a.store((a.load(std::memory_order_relaxed) & ~kMaxHotLaps) |
                (laps > kMaxHotLaps ? kMaxHotLaps : laps),
            std::memory_order_relaxed);
  }
  uint32_t left_at(uint32_t b) const {
    return access_word(b).load(std::memory_order_relaxed) >> kLapBits;
  }
  // Gives b `laps` laps at `clock` (the leave clock, mod 2^28).
  void set_hot_laps_at(uint32_t b, uint32_t laps, uint32_t clock) {
    access_word(b).store(
        ((clock & kLeaveMask) << kLapBits) | (laps > kMaxHotLaps ? kMaxHotLaps : laps),
        std::memory_order_relaxed);
  }
  // Stamps the block as leaving at `clock` (mod 2^28) and clears its hot laps.
  void set_left_at(uint32_t b, uint32_t clock) {
    access_word(b).store((clock & kLeaveMask) << kLapBits, std::memory_order_relaxed);
  }

  static PageState state_of(uint32_t w) { return static_cast<PageState>(w & kStateMask); }
  static uint32_t slot_of(uint32_t w) { return w >> kSlotShift; }
  static uint32_t with_state(uint32_t w, PageState s) {
    return (w & ~kStateMask) | static_cast<uint32_t>(s);
  }
  static uint32_t with_slot(uint32_t w, uint32_t slot) {
    return (w & ((1u << kSlotShift) - 1)) | (slot << kSlotShift);
  }
  static uint32_t make(PageState s, uint32_t flags, uint32_t slot) {
    return static_cast<uint32_t>(s) | flags | (slot << kSlotShift);
  }

  // CAS expected -> desired, checking the state change against the table.
  // Returns false (expected updated) when the word changed under us.
  bool try_transition(uint32_t b, uint32_t& expected, uint32_t desired) {
    FARMEM_BUG_ON(!page_transition_allowed(state_of(expected), state_of(desired)) &&
                  state_of(expected) != state_of(desired));
    return blocks_[b].word.compare_exchange_strong(expected, desired, std::memory_order_acq_rel,
                                                   std::memory_order_acquire);
  }
  // Leaves a transient state the caller owns.
  void finish(uint32_t b, uint32_t desired) {
    uint32_t cur = blocks_[b].word.load(std::memory_order_relaxed);
    PageState from = state_of(cur);
    if (!is_transient(from) || !page_transition_allowed(from, state_of(desired))) {
      fatal("BUG: page table: block %u cannot go from %s to %s", b, page_state_name(from),
            page_state_name(state_of(desired)));
    }
    blocks_[b].word.store(desired, std::memory_order_release);
  }

 private:
  BlockMeta* blocks_ = nullptr;
  uint32_t* remotes_ = nullptr;  // n_ of them, after the blocks, in the same mapping
  uint32_t* hashes_ = nullptr;   // n_ of them, after the remote units
  uint32_t* access_ = nullptr;   // n_ of them, after the hashes
  std::atomic_ref<uint32_t> access_word(uint32_t b) const {
    return std::atomic_ref<uint32_t>(access_[b]);
  }
  uint64_t n_ = 0;
  size_t bytes_ = 0;
};

// A 32-bit hash of len bytes (a multiple of 8), for hints that tolerate a
// collision: whether a block changed while it was mapped writable on a
// guess. Four independent multiply-xor lanes, ~0.3 us per 4 KiB here.
inline uint32_t block_hash(const void* p, size_t len) {
  const auto* c = static_cast<const unsigned char*>(p);
  uint64_t h[4] = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                   0x27D4EB2F165667C5ull};
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t v;
      std::memcpy(&v, c + i + 8 * l, 8);
      h[l] = (h[l] ^ v) * 0x9FB21C651E98DF25ull;
      h[l] ^= h[l] >> 29;
    }
  }
  for (; i + 8 <= len; i += 8) {
    uint64_t v;
    std::memcpy(&v, c + i, 8);
    h[0] = (h[0] ^ v) * 0x9FB21C651E98DF25ull;
    h[0] ^= h[0] >> 29;
  }
  uint64_t x = h[0] ^ (h[1] * 3) ^ (h[2] * 5) ^ (h[3] * 7);
  x ^= x >> 32;
  return static_cast<uint32_t>(x);
}

// Doubly linked list threaded through BlockMeta::prev/next; the caller holds
// the lock that guards it. push_front = most recent; back = oldest.
class BlockList {
 public:
  explicit BlockList(PageTable* pt) : pt_(pt) {}
  void push_front(uint32_t b);
  void remove(uint32_t b);
  uint32_t back() const { return tail_; }
  uint32_t prev_of(uint32_t b) const { return pt_->meta(b).prev; }
  uint64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  PageTable* pt_;
  uint32_t head_ = kNil;
  uint32_t tail_ = kNil;
  uint64_t size_ = 0;
};

}  // namespace farmem
