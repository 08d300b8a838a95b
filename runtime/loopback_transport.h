// The in-process loopback Transport: a "donor" that is a memory arena in
// this process, and a backend that moves bytes to and from it with memcpy.
// Every pager and allocator test runs on it without a NIC, and it injects
// the faults a real network produces: latency, jitter, reordering, failed
// ops, ops held back until the test lets them go, and a donor that dies.
//
//   farmem::LoopbackDonor donor(/*capacity=*/64 << 20, /*slab_size=*/1 << 20);
//   farmem::LoopbackTransport t;
//   if (auto st = t.add_server(0, &donor); !st.ok()) ...
//   auto slabs = donor.lease(4 << 20);                 // 4 slabs
//   for (auto& s : *slabs) (void)t.add_slab(0, s);
//   (void)t.register_buffer(buf, buf_len);
//   auto q = t.open_queue().value();                   // one per thread
//   farmem::IoOp op{farmem::IoKind::kRead, 4096, {0, (*slabs)[0].slab, 0}, buf, 7};
//   q->post({&op, 1});
//   farmem::IoCompletion c[4];
//   size_t n = q->wait(c, 1000);                       // c[0] = {7, kOk}
//
// Fault injection (tests):
//
//   donor.set_faults({.latency_us = 500, .jitter_us = 100, .reorder = true});
//   std::atomic<bool> hold{true};
//   donor.set_faults({.hook = [&](const farmem::IoOp& op) {
//     if (op.kind == farmem::IoKind::kWrite && hold) return farmem::LoopbackVerdict{
//         farmem::LoopbackVerdict::kDefer};
//     return farmem::LoopbackVerdict{};
//   }});
//   ... hold = false;   // the held WRITE executes on the owner's next poll()
//   donor.kill();       // every pending and later op completes kUnavailable
//
// Where things happen. post() validates each op against the transport's
// tables (registered buffers, servers, slabs; see runtime/transport.h) and
// appends it to the queue's own pending list; a refused op gets its error
// status there and becomes ready at once. The memcpy happens inside the
// owning thread's poll()/wait(), once the op is ready (post time + latency +
// jitter). There is no transport thread and no wake-up: completion is
// inline in the owner's next poll(), so a pager benchmark on loopback
// measures the pager (and one memcpy). An op posted with no latency or
// jitter is ready at once and never reads the clock (post, poll and wait
// skip clock_gettime while no pending op is timed). Just before executing, the donor is asked: dead
// => kUnavailable (immediately, latency or not); slab not leased => kNotFound; then the hook
// decides kExecute / kFail(error) / kDefer (stay pending, ask again on the next poll). Per op there
// is no heap allocation and no lock held during the memcpy. post() validates against a per-queue
// cache of the transport's tables (the last registered buffer hit, 16 slabs direct-mapped by id),
// stamped with the transport's table generation: any register / unregister / add / remove bumps
// it and empties every queue's cache at its next post(); only a miss takes the tables in shared
// mode (once per call). A post that hit the cache while a removal was under way is the same as a
// post that took the lock just before it. A single pending untimed op (a demand fetch) completes
// in poll() without the ready-list pass.
//
// Lifetimes: a donor outlives every transport it was added to; a transport
// outlives its queues.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/registration_table.h"
#include "runtime/status.h"
#include "runtime/transport.h"

namespace farmem {

// What the fault-injection hook decides for one op, called when the op would
// execute.
struct LoopbackVerdict {
  enum Action : uint8_t { kExecute, kFail, kDefer } action = kExecute;
  Errc error = Errc::kUnavailable;  // for kFail
};

// May be called from any thread that polls a queue, concurrently; it must be
// thread-safe itself. It must not call back into the queue being polled.
using LoopbackHook = std::function<LoopbackVerdict(const IoOp& op)>;

struct LoopbackFaults {
  uint32_t latency_us = 0;  // each op completes no earlier than post time + latency
  uint32_t jitter_us = 0;   // + uniform [0, jitter)
  bool reorder = false;     // complete ready ops in random order
  LoopbackHook hook{};      // empty = always execute
};

// An in-process donor: memory, leases, counters, faults. Thread-safe.
//
// Memory is one anonymous MAP_NORESERVE mapping of `capacity` bytes, so a
// slab costs physical memory only where it was written; a released slab is
// zeroed (MADV_DONTNEED) before it can be leased again. Slab ids are unique
// over the donor's life (a reused slot gets a new id), so a stale id is
// refused (kNotFound) rather than aliasing someone else's slab.
class LoopbackDonor {
 public:
  // capacity must be a non-zero multiple of slab_size; anything else is a
  // bug in the calling test and aborts with a message.
  LoopbackDonor(uint64_t capacity, uint64_t slab_size);
  ~LoopbackDonor();
  LoopbackDonor(const LoopbackDonor&) = delete;
  LoopbackDonor& operator=(const LoopbackDonor&) = delete;

  // Leases ceil(bytes / slab_size) slabs (all or none). kInvalidArgument for
  // bytes == 0, kResourceExhausted when they do not fit in what is left,
  // kUnavailable after kill(). SlabDesc.addr and .rkey are 0, as on tcp.
  Result<std::vector<SlabDesc>> lease(uint64_t bytes);
  // kNotFound when the slab is not currently leased. Zeroes the slab.
  Status release(SlabId slab);

  uint64_t capacity() const { return capacity_; }
  uint64_t leased_bytes() const;
  uint64_t slab_size() const { return slab_size_; }

  // Applies to ops posted (latency, jitter, reorder) or executed (hook)
  // from now on.
  void set_faults(LoopbackFaults f);

  // Donor lost: every later or pending op on it completes kUnavailable.
  // Leases and memory stay readable through slab_memory() for inspection.
  void kill();
  bool dead() const { return dead_.load(std::memory_order_acquire); }

  // The bytes of a leased slab, for tests to inspect or modify directly;
  // empty when the slab is not leased.
  std::span<uint8_t> slab_memory(SlabId slab);

  // Counters (atomic): ops executed successfully and the bytes they moved.
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }
  uint64_t writes() const { return writes_.load(std::memory_order_relaxed); }
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }
  uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  void reset_counters();

 private:
  friend class LoopbackTransport;

  // Data path, called by queues. Resolves [offset, offset + length) of a
  // leased slab to memory, or returns the error the op completes with.
  Errc resolve(SlabId slab, uint64_t offset, uint32_t length, uint8_t** out) const;
  std::shared_ptr<const LoopbackFaults> faults() const;
  void count(IoKind kind, uint32_t length);

  const uint64_t capacity_;
  const uint64_t slab_size_;
  const uint32_t nslots_;
  uint8_t* base_ = nullptr;
  // Per slot: the id of the slab leased in it, 0 when free. Read lock-free
  // by the data path, written under mu_.
  std::unique_ptr<std::atomic<SlabId>[]> slot_id_;

  mutable std::mutex mu_;
  std::vector<uint32_t> free_slots_;  // guarded by mu_; a stack
  std::vector<uint32_t> generation_;  // guarded by mu_; per slot
  uint64_t leased_bytes_ = 0;         // guarded by mu_

  std::atomic<bool> dead_{false};
  // Copies of the faults read on every post, without the lock.
  std::atomic<uint32_t> latency_us_{0};
  std::atomic<uint32_t> jitter_us_{0};
  std::atomic<bool> reorder_{false};
  std::atomic<bool> has_hook_{false};
  mutable std::mutex faults_mu_;
  std::shared_ptr<const LoopbackFaults> faults_;  // guarded by faults_mu_; never null

  // READ and WRITE counters on separate cache lines: the pager's fault
  // handlers bump the first pair and its evictor the second, on other
  // cores; sharing one line cost each demand READ a cache-line transfer.
  alignas(64) std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> bytes_read_{0};
  alignas(64) std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> bytes_written_{0};
};

// LoopbackTransport::Options. Declared outside the class so that it can be a
// default argument of the constructor (g++ refuses `= {}` for a nested
// struct with member initialisers inside its enclosing class).
struct LoopbackTransportOptions {
  size_t depth = 256;  // per queue
  // Seeds each queue's generator (jitter, reorder): queue k of a transport
  // uses seed + k, so a test's run is reproducible.
  uint64_t seed = 1;
};

class LoopbackTransport final : public TransportControl {  // satisfies TransportBackend
 public:
  class Queue;
  using Options = LoopbackTransportOptions;

  explicit LoopbackTransport(Options o = {});
  ~LoopbackTransport() override;

  // kInvalidArgument for a null donor or an id already added.
  Status add_server(ServerId id, LoopbackDonor* donor);  // donor outlives the transport
  Result<std::unique_ptr<Queue>> open_queue();

  const char* name() const override { return "loopback"; }
  // Refuses (kInvalidArgument) null, zero length, and any overlap with a
  // registered buffer; unregister_buffer(addr) takes the start address
  // given to register_buffer (kNotFound otherwise).
  Status register_buffer(void* addr, size_t length) override;
  Status unregister_buffer(void* addr) override;
  bool registration_pins() const override { return false; }  // plain copies
  // kInvalidArgument for an unknown server, size 0 or a slab already added;
  // remove_slab: kNotFound when it was not added.
  Status add_slab(ServerId server, const SlabDesc& slab) override;
  Status remove_slab(ServerId server, SlabId slab) override;

 private:
  friend class Queue;
  struct SlabEntry {
    LoopbackDonor* donor = nullptr;
    uint64_t size = 0;
  };
  static uint64_t slab_key(ServerId s, SlabId slab) { return (uint64_t{s} << 32) | slab; }

  const Options opts_;
  std::atomic<uint64_t> next_queue_{0};
  // Bumped under mu_ (exclusive) by every change of the tables below, so
  // that the queues' lookup caches (Queue::post()) notice it.
  std::atomic<uint64_t> gen_{1};
  mutable std::shared_mutex mu_;
  RegistrationTable<> buffers_;                           // guarded by mu_
  std::unordered_map<ServerId, LoopbackDonor*> servers_;  // guarded by mu_
  std::unordered_map<uint64_t, SlabEntry> slabs_;         // guarded by mu_
};

// One thread's queue. Not thread-safe: one owner at a time.
class LoopbackTransport::Queue {
 public:
  ~Queue();
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  // All or none: kResourceExhausted when outstanding() + ops.size() >
  // depth(). Never blocks. Refused ops are accepted and complete with their
  // error (see runtime/transport.h).
  Errc post(std::span<const IoOp> ops);
  size_t poll(std::span<IoCompletion> out);
  // Sleeps until the earliest op is ready (in slices of at most a few
  // milliseconds, so that kill() and released kDefer ops are noticed),
  // bounded by timeout_ms (-1: forever).
  size_t wait(std::span<IoCompletion> out, int timeout_ms);
  size_t outstanding() const { return pending_.size(); }
  size_t depth() const { return depth_; }

 private:
  friend class LoopbackTransport;
  using Clock = std::chrono::steady_clock;
  struct Pending {
    IoOp op;
    LoopbackDonor* donor = nullptr;  // null when refused at post
    Clock::time_point ready;
    Errc status = Errc::kOk;  // refused at post: the error to complete with
    bool reorder = false;
    bool deferred = false;  // the hook said kDefer last time
  };

  // One slab of the transport's table, as post() last found it.
  struct SlabHit {
    uint64_t key = ~uint64_t{0};  // slab_key(); ~0: empty
    LoopbackDonor* donor = nullptr;
    uint64_t size = 0;
  };
  static constexpr size_t kSlabCache = 16;  // direct-mapped by slab id

  Queue(LoopbackTransport* t, size_t depth, uint64_t seed);
  // Runs one ready op; returns false when the hook deferred it.
  bool execute(Pending& p, IoCompletion* out);
  // post()'s validation of one op against the (cached) tables: the op's
  // slab entry, or null with *status set. lk is taken on the first miss.
  const SlabHit* validate(const IoOp& op, std::shared_lock<std::shared_mutex>& lk, Errc* status);

  LoopbackTransport* const t_;
  const size_t depth_;
  std::vector<Pending> pending_;  // post order; capacity depth_, never reallocates
  std::vector<uint32_t> ready_;   // scratch for poll(); capacity depth_
  std::vector<uint8_t> done_;     // scratch for poll(); size depth_
  size_t timed_ = 0;              // pending ops with a ready time in the future
  std::mt19937_64 rng_;
  // post()'s lookup cache, valid while cache_gen_ == t_->gen_.
  uint64_t cache_gen_ = 0;
  uintptr_t buf_begin_ = 0;  // the registered buffer last found: [begin, begin + len)
  size_t buf_len_ = 0;
  SlabHit slabs_[kSlabCache];
};

static_assert(TransportBackend<LoopbackTransport>);

}  // namespace farmem
