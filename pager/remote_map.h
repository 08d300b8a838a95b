// Remote space of a pager region: block-sized "units" carved out of slabs
// leased lazily from a SlabSource, and the indirection unit -> replicas
// (server, slab, offset) that the fault path reads without a lock.
//
//   farmem::LoopbackSlabSource src(/*server=*/0, &donor);
//   farmem::RemoteMap map(&src, &transport, /*unit_size=*/4096);
//   auto unit = map.alloc_unit();          // leases a slab on first use
//   farmem::RemoteAddr a;
//   if (map.resolve_read(*unit, &a)) ...   // one live, readable replica
//   farmem::RemoteAddr to[farmem::RemoteMap::kMaxReplicas];
//   size_t n = map.begin_write(*unit, to); // every live replica; then end_write()
//   map.free_unit(*unit);
//
// Layout. Space comes in stripe groups: when the map runs out of units it
// leases `width` extents at once (width = the source's live donors, 1 for a
// single donor), each extent one slab on each of `replicas` distinct donors
// (the SlabSource chooses: pager/placement.h places by free capacity), with
// the primaries of one group's extents on different donors where possible.
// Units of a group are striped over its extents: unit i of the group is at
// offset (i / width) * unit_size of extent (i % width), so consecutive units
// (and the blocks the evictor writes back together) go to different donors.
// One donor, one replica: one extent per group, units in slab order, which
// is exactly the single-donor layout of before.
//
//   group g: first_unit, units, first_extent, width, units_per_extent
//            (append-only array, published by a count: read without a lock)
//   extent e: replica set (RCU) + writes_in_flight + generation
//   replica set: n x {server, slab, readable}
//
// Replicas and failures. Every dirty block is written to every replica of
// its extent on a donor that is not failed (begin_write), readable or not;
// reads go to one readable replica on a live donor (resolve_read): the one
// whose donor has the fewest READs outstanding from this map (ties: a hash
// of the unit, so that an idle map still spreads reads evenly). The count is
// one relaxed atomic per donor on its own cache line, raised by resolve_read
// and lowered by read_done() when the READ completed or was never posted: no
// lock, no allocation, and a slow donor collects fewer reads. mark_failed() (a
// transport error on the fault path, or a missed heartbeat seen by the
// re-replication thread) makes every later read and write skip that donor.
// Re-replication (pager/replicator.h) repairs an extent in two steps:
// begin_repair() drops the failed replicas and adds fresh slabs on other live
// donors as write-only replicas (write-backs go there, reads do not), the
// replicator copies the extent from a surviving replica, and finish_repair()
// makes them readable. The copy races with write-backs of the same extent;
// writes_in_flight (raised by begin_write before the caller posts, lowered by
// end_write when every op of that block completed) and generation (bumped by
// end_write) form a seqlock-like pair: the copier waits for in_flight == 0,
// notes the generation, copies a chunk, and redoes it when either moved.
//
// The replica sets are read on every fault and change only on a failure:
// they are RCU-protected (liburcu, the "bp" flavour; see remote_map.cc for
// why). Readers copy what they need out of the set inside a read-side
// section and never hold it across calls: no lock and no allocation on the
// fault path. Writers (repair, under mu_) publish a new set; the old ones are
// freed after one synchronize_rcu() per repair pass (reclaim()).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/status.h"
#include "runtime/transport.h"

namespace farmem {

class LoopbackDonor;
class DonorSession;

// Control-path source of remote memory.
class SlabSource {
 public:
  struct Slab {
    ServerId server = 0;
    SlabDesc desc;
  };
  virtual ~SlabSource() = default;
  // At least `bytes` of slabs, or an error naming why not.
  virtual Result<std::vector<Slab>> lease(uint64_t bytes) = 0;
  virtual Status release(ServerId server, SlabId slab) = 0;
  // Printable donor name for errors ("loopback donor 0", "10.0.0.2:7400").
  // Never allocates: the fatal path calls it.
  virtual const char* server_name(ServerId server) const noexcept = 0;
  // Preferred lease size (one donor slab).
  virtual uint64_t lease_granularity() const = 0;

  // ---- Several donors (pager/placement.h); the defaults describe one donor.
  // Copies of every extent (FARMEM_REPLICAS).
  virtual uint32_t replicas() const { return 1; }
  // Extents per stripe group: how many donors to spread new space over.
  virtual uint32_t stripe_width() const { return 1; }
  // One slab of at least `bytes` on a live donor that is not in `avoid`;
  // donors in `prefer_not` only when no other fits (striping). The default
  // leases through lease() and refuses when its one donor is in `avoid`.
  virtual Result<Slab> lease_one(uint64_t bytes, std::span<const ServerId> avoid,
                                 std::span<const ServerId> prefer_not);
  // A transport error or a missed heartbeat says this donor is gone: lease
  // nothing more from it. Fault path: no lock, no allocation.
  virtual void on_failed(ServerId) noexcept {}
  // Control path (the re-replication thread, every few hundred ms): checks
  // the donors' health (heartbeats), reconnects lost ones as new
  // identities, and appends the donors found failed to *failed.
  virtual void probe(std::vector<ServerId>* failed) { (void)failed; }
};

class LoopbackSlabSource final : public SlabSource {
 public:
  LoopbackSlabSource(ServerId server, LoopbackDonor* donor);
  Result<std::vector<Slab>> lease(uint64_t bytes) override;
  Status release(ServerId server, SlabId slab) override;
  const char* server_name(ServerId) const noexcept override { return name_.c_str(); }
  uint64_t lease_granularity() const override;

 private:
  ServerId server_;
  LoopbackDonor* donor_;
  std::string name_;
};

class DonorSessionSlabSource final : public SlabSource {
 public:
  DonorSessionSlabSource(ServerId server, DonorSession* session);
  Result<std::vector<Slab>> lease(uint64_t bytes) override;
  Status release(ServerId server, SlabId slab) override;
  const char* server_name(ServerId) const noexcept override { return name_.c_str(); }
  uint64_t lease_granularity() const override;

 private:
  ServerId server_;
  DonorSession* session_;
  std::string name_;
};

// Progress of re-replication, for stats.
struct ReplicationStats {
  uint32_t replicas = 1;
  uint64_t donors_failed = 0;     // donors marked failed so far
  uint64_t extents_degraded = 0;  // extents below the factor right now
  uint64_t extents_restored = 0;  // repairs completed
  uint64_t bytes_restored = 0;    // bytes copied by completed repairs
  uint64_t chunks_redone = 0;     // copy chunks redone after a racing write-back
  uint64_t extents_lost = 0;      // extents with no readable replica left
  uint64_t restore_ns = 0;        // wall time spent in repairs
  uint64_t read_failovers = 0;    // READs retried on another replica
};

class RemoteMap {
 public:
  static constexpr uint32_t kMaxSlabs = 1u << 16;  // extents
  static constexpr uint32_t kMaxReplicas = 3;
  static constexpr uint32_t kMaxServers = 256;

  struct Replica {
    ServerId server = 0;
    SlabId slab = 0;
    bool readable = false;
  };
  struct ReplicaSet {
    uint32_t n = 0;
    Replica r[kMaxReplicas];
  };
  // What the replicator copies: extent bytes from one readable replica to
  // the write-only ones (offset 0 of each slab).
  struct RepairPlan {
    uint32_t extent = 0;
    uint64_t bytes = 0;
    RemoteAddr from;
    uint32_t n_to = 0;
    RemoteAddr to[kMaxReplicas];
  };

  // transport: add_slab() is called for each leased slab. Both outlive the
  // map. The replication factor is source->replicas().
  RemoteMap(SlabSource* source, TransportControl* transport, uint32_t unit_size);
  ~RemoteMap();  // removes and releases every slab
  RemoteMap(const RemoteMap&) = delete;
  RemoteMap& operator=(const RemoteMap&) = delete;

  // Control path (evictor): a free unit, leasing a stripe group when none is
  // left.
  Result<uint32_t> alloc_unit();
  void free_unit(uint32_t unit);

  // ---- Data path: lock-free, no allocation. unit must have been allocated.
  // The first replica of the unit (whatever its state); for messages.
  RemoteAddr resolve(uint32_t unit) const noexcept;
  // A readable replica on a live donor, the least loaded one (fewest READs
  // outstanding; ties by a hash of the unit); false when none is left (the
  // data is lost: invariant 6). On true, counts one READ outstanding on
  // out->server: call read_done(out->server) once that READ completed, or at
  // once when it was not posted.
  bool resolve_read(uint32_t unit, RemoteAddr* out) const noexcept;
  void read_done(ServerId s) const noexcept {
    if (s < kMaxServers) load_[s].reads.fetch_sub(1, std::memory_order_relaxed);
  }
  // READs resolved to donor s and not yet done (tests, stats).
  int32_t reads_outstanding(ServerId s) const noexcept {
    return s < kMaxServers ? load_[s].reads.load(std::memory_order_relaxed) : 0;
  }
  // Every replica on a live donor (readable or being rebuilt), into out;
  // returns how many (0: none left). Counts one write in flight on the
  // extent: call end_write(unit) once every op posted for it completed
  // (or at once when none was posted).
  size_t begin_write(uint32_t unit, RemoteAddr out[kMaxReplicas]) noexcept;
  void end_write(uint32_t unit) noexcept;
  // Marks a donor failed (idempotent); tells the source.
  void mark_failed(ServerId s) noexcept;
  bool failed(ServerId s) const noexcept {
    return s < kMaxServers && failed_[s].load(std::memory_order_acquire) != 0;
  }
  // Bumped on every new failure: the replicator's cue.
  uint64_t failure_epoch() const noexcept { return epoch_.load(std::memory_order_acquire); }
  void count_failover() noexcept { failovers_.fetch_add(1, std::memory_order_relaxed); }
  // "A, B (failed)" for every replica of the unit, into buf; no allocation.
  void describe_replicas(uint32_t unit, char* buf, size_t len) const noexcept;

  const char* server_name(ServerId s) const noexcept { return source_->server_name(s); }
  uint64_t assigned_bytes() const {
    return assigned_.load(std::memory_order_relaxed) * uint64_t{unit_size_};
  }
  uint32_t replicas() const { return replicas_; }
  uint32_t extent_count() const { return n_extents_.load(std::memory_order_acquire); }
  SlabSource* source() const { return source_; }

  // ---- Re-replication (control path, one thread: pager/replicator.h).
  // True when extent e has fewer readable replicas on live donors than the
  // factor, or a replica on a failed donor.
  bool degraded(uint32_t e) const noexcept;
  // Drops e's replicas on failed donors and adds write-only replicas on
  // other live donors until the factor is met; plan says what to copy.
  // kResourceExhausted when no other donor can take one (try again later;
  // *plan is still valid when some were added), kNotFound when no readable
  // replica is left (counted in extents_lost once).
  Status begin_repair(uint32_t e, RepairPlan* plan);
  // Makes the replicas of `plan` readable (the copy is complete).
  void finish_repair(const RepairPlan& plan, uint64_t ns);
  // Frees the replica sets replaced by begin_repair/finish_repair after one
  // RCU grace period (call once per repair pass; the destructor frees the
  // rest).
  void reclaim();
  // The seqlock pair of extent e.
  uint32_t writes_in_flight(uint32_t e) const noexcept {
    return extents_[e].in_flight.load(std::memory_order_seq_cst);
  }
  uint32_t generation(uint32_t e) const noexcept {
    return extents_[e].generation.load(std::memory_order_seq_cst);
  }
  void count_redo() noexcept { redone_.fetch_add(1, std::memory_order_relaxed); }
  ReplicationStats stats() const;

 private:
  struct Group {
    uint32_t first_unit = 0;
    uint32_t units = 0;
    uint32_t first_extent = 0;
    uint32_t width = 1;
    uint32_t units_per_extent = 0;
  };
  struct Extent {
    std::atomic<const ReplicaSet*> set{nullptr};  // RCU
    std::atomic<uint32_t> in_flight{0};
    std::atomic<uint32_t> generation{0};
    uint64_t bytes = 0;
    std::atomic<bool> lost{false};
  };

  // kMaxSlabs entries in an anonymous mapping, each constructed by
  // emplace() before it is published (n_groups_ / n_extents_), so that only
  // the pages of entries in use are ever resident. new T[kMaxSlabs] wrote
  // all 3.3 MiB of groups and extents at start: a fully resident part of
  // farmem's own local memory (docs/eval/programs-s12), which a budget
  // counted as the user's working set cannot cover.
  template <class T>
  class LazyArray {
   public:
    static_assert(std::is_trivially_destructible_v<T>, "entries are never destroyed one by one");
    LazyArray();
    ~LazyArray();
    LazyArray(const LazyArray&) = delete;
    LazyArray& operator=(const LazyArray&) = delete;
    T& emplace(uint32_t i) { return *new (base_ + i * sizeof(T)) T{}; }
    T& operator[](uint32_t i) const { return *std::launder(reinterpret_cast<T*>(base_) + i); }

   private:
    char* base_;
  };

  // Group and extent of a unit, and its byte offset in the extent.
  void locate(uint32_t unit, uint32_t* extent, uint64_t* offset) const noexcept;
  // Leases one stripe group; mu_ held.
  Status grow_locked();
  // Publishes a new set for e and frees the old one after a grace period.
  void publish(uint32_t e, const ReplicaSet& s);

  SlabSource* const source_;
  TransportControl* const transport_;
  const uint32_t unit_size_;
  const uint32_t replicas_;
  LazyArray<Group> groups_;
  std::atomic<uint32_t> n_groups_{0};
  LazyArray<Extent> extents_;
  std::atomic<uint32_t> n_extents_{0};
  std::atomic<uint64_t> assigned_{0};
  std::unique_ptr<std::atomic<uint8_t>[]> failed_;
  std::atomic<uint64_t> epoch_{0};
  // Outstanding READs per donor, one cache line each: handlers on different
  // cores bump different donors' counts without false sharing. Signed: a
  // relaxed decrement may be seen before its increment by another reader.
  struct alignas(64) DonorLoad {
    mutable std::atomic<int32_t> reads{0};
  };
  std::unique_ptr<DonorLoad[]> load_;

  std::atomic<uint64_t> restored_{0}, bytes_restored_{0}, redone_{0}, lost_{0}, restore_ns_{0},
      failovers_{0};

  std::mutex mu_;
  uint32_t total_units_ = 0;    // guarded by mu_
  uint32_t next_unit_ = 0;      // guarded by mu_
  std::vector<uint32_t> free_;  // guarded by mu_
  bool warned_short_ = false;   // guarded by mu_
  // Slabs of failed replicas: kept in the transport (a reader may still
  // post to one it resolved before the change; that op fails with
  // kUnavailable as it should) until the map goes.
  std::vector<Replica> retired_;  // guarded by mu_
  // Replica sets replaced by publish(), freed by reclaim().
  std::vector<const ReplicaSet*> retired_sets_;  // guarded by mu_
};

}  // namespace farmem
