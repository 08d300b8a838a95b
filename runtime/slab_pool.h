// SlabPool: the donor's memory, reserved once and lent in fixed-size slabs.
//
//   farmem::SlabPoolOptions o;
//   o.capacity = 1ull << 30;           // a multiple of slab_size
//   o.slab_size = 64ull << 20;
//   auto pool = farmem::SlabPool::create(o);          // mmap once
//   auto descs = (*pool)->lease(/*owner=*/7, 100 << 20);   // 2 slabs
//   uint8_t* p;
//   if ((*pool)->pin(7, (*descs)[0].slab, 0, 4096, &p) == farmem::Errc::kOk) {
//     std::memcpy(p, data, 4096);      // the slab cannot be re-lent meanwhile
//     (*pool)->unpin((*descs)[0].slab);
//   }
//   (*pool)->release_all(7);           // zeroed before anyone else gets them
//
// A slab's life (every transition under the pool mutex):
//
//   state     | event                           | next      | effect
//   ----------+---------------------------------+-----------+--------------------------
//   kFree     | lease(owner)                    | kLeased   | leased_bytes += slab_size
//   kLeased   | pin(owner, in range)            | kLeased   | pins++
//   kLeased   | unpin                           | kLeased   | pins--
//   kLeased   | release / release_all           | kDraining | owner cleared at once
//   kDraining | pins == 0 (at once or at unpin)  | kFree     | zeroed outside the lock by
//             |                                 |           | whoever saw pins reach 0
//
// kDraining exists because the tcp data path receives WRITE data straight
// into slab memory and sends READ data straight out of it: a release that
// races with such an I/O must not hand the slab to another client before
// that I/O is over, and must not wait for a slow peer either. A draining slab
// counts neither as leased nor as free, so capacity is never exceeded.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/status.h"
#include "runtime/wire.h"

namespace farmem {

// Identifies the holder of a lease (a donor session). 0 means "nobody".
using LeaseOwner = uint64_t;

// Hook point for transports that must register donor memory with hardware
// (verbs: ibv_reg_mr). The pool calls register_region() exactly once, after
// the reservation and before any slab is lent, and describe() whenever it
// lends a slab so the transport can fill SlabDesc.rkey/addr (tcp leaves both
// 0). forget() runs when a slab leaves its owner, before it is zeroed, so a
// per-client registration can be revoked before anyone else may use the
// memory. None of these may call back into the pool.
class SlabRegistrar {
 public:
  virtual ~SlabRegistrar() = default;
  [[nodiscard]] virtual Status register_region(uint8_t* base, uint64_t length) = 0;
  [[nodiscard]] virtual Status describe(LeaseOwner owner, wire::SlabDesc* desc, uint8_t* addr) = 0;
  virtual void forget(LeaseOwner owner, uint32_t slab) noexcept = 0;
  // True when registered pages must keep their physical frames (pinned MRs
  // without on-demand paging): slabs are then zeroed with memset instead of
  // MADV_DONTNEED, which would swap the frames under the NIC's feet.
  virtual bool pins_pages() const noexcept { return true; }
};

struct SlabPoolOptions {
  uint64_t capacity = 1ull << 30;  // bytes; a multiple of slab_size
  uint64_t slab_size = 64ull << 20;
  uint64_t quota_per_owner = 0;        // 0: any owner may lease up to capacity
  bool try_hugepages = true;           // MAP_HUGETLB first, else THP via madvise
  SlabRegistrar* registrar = nullptr;  // outlives the pool; nullptr for tcp
  // Shared memory (MAP_SHARED | MAP_ANONYMOUS), so that a leased slab can be
  // given a private alias (alias()) for a client on this host to read and
  // write one-sided. Not with a registrar.
  bool shared = false;
};

class SlabPool {
 public:
  static Result<std::unique_ptr<SlabPool>> create(const SlabPoolOptions& opts);
  ~SlabPool();  // unmaps; callers must have stopped every I/O
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  // Lends ceil(bytes / slab_size) slabs to `owner`, all or none. Errors:
  // kInvalidArgument (0 bytes, owner 0, more than wire::kMaxSlabsPerLease
  // slabs in one request), kResourceExhausted (beyond capacity, beyond the
  // owner's quota, or not enough free slabs right now).
  Result<std::vector<wire::SlabDesc>> lease(LeaseOwner owner, uint64_t bytes);
  // Returns one slab. kNotFound: nobody holds it (or no such slab);
  // kPermissionDenied: another owner holds it.
  Status release(LeaseOwner owner, uint32_t slab);
  // Returns every slab of `owner` (session end); how many it held.
  size_t release_all(LeaseOwner owner);

  // Data path. Checks that `owner` holds `slab` and that [offset,
  // offset+length) lies inside it, then pins the slab (it cannot be zeroed
  // or re-lent until unpin()) and points *addr at offset. Never allocates.
  // kNotFound: nobody holds the slab; kPermissionDenied: another owner does;
  // kOutOfRange: the range passes the slab's end.
  Errc pin(LeaseOwner owner, uint32_t slab, uint64_t offset, uint64_t length,
           uint8_t** addr) noexcept;
  void unpin(uint32_t slab) noexcept;

  // One-sided access for a client on this host ("Local clients" in
  // donor_server.cc). Maps a second view of `slab`, which `owner` holds,
  // at an address of its own, with one private page right after it whose
  // first bytes are `proof` (the client checks them; the slab's data stays
  // as it is), and returns the view's address. The view and the page are
  // unmapped when the slab leaves its owner (release, session end), before
  // the slab is zeroed or lent again: a late access through the view fails
  // (EFAULT) instead of reaching the next owner's data: the address is
  // never used again. A slab with no I/O yet moves into a memfd of its own
  // first (file_view()), which the view and this process's mapping of the
  // slab both map; the proof page then ends with wire::kLocalFileRecord,
  // and the file is truncated to nothing before the slab is lent again.
  // A slab pinned since it was lent keeps the plain view. Only on a shared
  // pool without huge pages:
  // kInvalidArgument otherwise; kNotFound / kPermissionDenied as for pin();
  // kResourceExhausted at kMaxViews live views or when the kernel refuses.
  Result<uint64_t> alias(LeaseOwner owner, uint32_t slab, std::span<const uint8_t> proof);

  uint64_t capacity() const { return capacity_; }
  uint64_t slab_size() const { return slab_size_; }
  uint32_t slab_count() const { return static_cast<uint32_t>(slabs_.size()); }
  uint64_t quota() const { return quota_; }  // effective: capacity when unlimited
  bool huge_pages() const { return huge_pages_; }
  bool shared() const { return shared_; }
  uint64_t leased_bytes() const;
  uint64_t leased_bytes(LeaseOwner owner) const;
  uint32_t free_slabs() const;
  // The owner of a slab (0: free or draining); for tests and diagnostics.
  LeaseOwner owner_of(uint32_t slab) const;
  // Address of a slab's first byte; stable for the pool's lifetime.
  uint8_t* slab_addr(uint32_t slab) const { return base_ + uint64_t{slab} * slab_size_; }

 private:
  enum class State : uint8_t { kFree, kLeased, kDraining };
  struct Slab {
    LeaseOwner owner = 0;
    uint32_t pins = 0;
    State state = State::kFree;
    uint8_t* alias = nullptr;  // alias(): the owner's one-sided view, or null
    int file = -1;             // file_view(): the memfd the slab and its view map, or -1
    bool io = false;           // pinned since it was lent (its data may not be zero)
    bool stuck = false;        // its view could not be revoked or it not zeroed: never lent again
  };

  SlabPool() = default;
  // Takes the slab from its owner (-> kDraining); true when no I/O holds it
  // and the caller must finish() it after unlocking.
  bool drop_locked(uint32_t slab);
  // Zeroes a drained slab (without the lock: it can take milliseconds) and
  // puts it on the free list.
  void finish(uint32_t slab) noexcept;
  // alias() of a slab with no I/O yet: moves it into a memfd and maps it at
  // `view` too; `view` or MAP_FAILED (nothing changed). Called with mu_ held.
  void* file_view(Slab& s, uint32_t slab, uint8_t* view);

  uint8_t* base_ = nullptr;
  uint64_t mapped_ = 0;
  uint64_t capacity_ = 0;
  uint64_t slab_size_ = 0;
  uint64_t quota_ = 0;
  bool huge_pages_ = false;
  bool shared_ = false;
  SlabRegistrar* registrar_ = nullptr;
  // alias() views: a range of address space handed out front to back and
  // never twice, so that a late access through a revoked view can only
  // fault, whatever was lent since (kMaxViews live at once keeps the
  // process's mappings well below vm.max_map_count).
  static constexpr uint64_t kViewArena = uint64_t{1} << 44;
  static constexpr uint32_t kMaxViews = 4096;
  uint8_t* arena_ = nullptr;
  uint64_t arena_size_ = 0;
  uint64_t arena_next_ = 0;  // guarded by mu_
  uint32_t live_views_ = 0;  // guarded by mu_
  uint64_t live_files_ = 0;  // file_view() files open; guarded by mu_

  mutable std::mutex mu_;
  std::vector<Slab> slabs_;     // guarded by mu_
  std::vector<uint32_t> free_;  // guarded by mu_; a stack: last freed, first lent
  std::unordered_map<LeaseOwner, uint64_t> owner_bytes_;  // guarded by mu_
  uint64_t leased_ = 0;                                   // guarded by mu_
};

}  // namespace farmem
