// Re-replication: the background thread that restores the replication
// factor after a donor failed, and the failure detector that runs beside it.
//
//   auto r = farmem::Replicator<farmem::LoopbackTransport>::start(&transport, &remote_map, {});
//   ...                                   // (*r) runs until destroyed
//   farmem::ReplicationStats s = remote_map.stats();   // extents/bytes restored, time
//
// The Pager starts one when the map has more than one replica. Every
// probe_interval the thread
//   1. asks the slab source to check its donors (SlabSource::probe: a
//      HEARTBEAT round trip per donor on tcp/verbs, reconnects of lost ones
//      as new identities) and marks the failed ones in the map; transport
//      errors on the fault path mark donors failed directly
//      (RemoteMap::mark_failed);
//   2. after a new failure (or while extents stay degraded: no donor had
//      room, a donor rejoined), repairs every degraded extent: a fresh slab on
//      another live donor joins as a write-only replica
//      (RemoteMap::begin_repair), the extent is copied into it from a
//      surviving replica in chunks of chunk_bytes, and only then is it made
//      readable (finish_repair).
// Copy against concurrent write-backs (the per-extent seqlock-like pair in
// remote_map.h): before a chunk, wait until no write-back of the extent is
// in flight and note its generation; READ the chunk from the source, WRITE
// it to every new replica; when a write-back started or finished meanwhile
// (in_flight != 0 or the generation moved), copy the chunk again. A write-
// back that starts after the check already includes the new replica (it was
// published before the copy began) and lands after the copy's WRITE.
//
// This thread is control path only: it never touches the pager's region or
// its page table, uses its own transport queue and buffer, and allocates
// freely (local memory: it is started inside the runtime's LocalScope).
#pragma once

#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pager/remote_map.h"
#include "runtime/log.h"
#include "runtime/transport.h"

namespace farmem {

struct ReplicatorOptions {
  std::chrono::milliseconds probe_interval{200};
  uint32_t chunk_bytes = 1u << 20;  // at most wire::kMaxIoLength
};

template <TransportBackend B>
class Replicator {
 public:
  using Queue = typename B::Queue;

  static Result<std::unique_ptr<Replicator>> start(B* transport, RemoteMap* map,
                                                   ReplicatorOptions o = {}) {
    if (o.chunk_bytes == 0 || o.chunk_bytes > wire::kMaxIoLength) o.chunk_bytes = 1u << 20;
    std::unique_ptr<Replicator> r(new Replicator(transport, map, o));
    void* p =
        mmap(nullptr, o.chunk_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return make_error(Errc::kResourceExhausted, "re-replication: mmap of a %u-byte buffer: %s",
                        o.chunk_bytes, strerror(errno));
    }
    r->buf_ = static_cast<char*>(p);
    FARMEM_RETURN_IF_ERROR(transport->register_buffer(r->buf_, o.chunk_bytes));
    r->registered_ = true;
    auto q = transport->open_queue();
    if (!q.ok()) return q.status().with_context("re-replication: opening a transport queue");
    r->q_ = std::move(*q);
    Replicator* rp = r.get();
    r->thread_ = std::thread([rp] { rp->run(); });
    return r;
  }

  ~Replicator() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    q_.reset();
    if (registered_) (void)t_->unregister_buffer(buf_);
    if (buf_) munmap(buf_, opts_.chunk_bytes);
  }
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Wakes the thread now (tests; a fault-path failure is seen within one
  // probe_interval anyway).
  void kick() { cv_.notify_all(); }
  // Repair rounds that left nothing degraded (tests wait on it).
  uint64_t clean_rounds() const { return clean_rounds_.load(std::memory_order_acquire); }

 private:
  Replicator(B* t, RemoteMap* m, ReplicatorOptions o) : t_(t), map_(m), opts_(o) {}

  bool stopping() {
    std::lock_guard<std::mutex> lk(mu_);
    return stop_;
  }

  void run() {
    pthread_setname_np(pthread_self(), "fm-replicate");
    uint64_t seen = 0;
    bool pending = false;
    std::vector<ServerId> failed;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait_for(lk, opts_.probe_interval, [&] { return stop_; });
        if (stop_) return;
      }
      failed.clear();
      map_->source()->probe(&failed);
      for (ServerId s : failed) map_->mark_failed(s);
      const uint64_t epoch = map_->failure_epoch();
      if (epoch != seen || pending) {
        if (epoch != seen) {
          FARMEM_LOG(kInfo, "re-replication: a donor failed; restoring %u replicas per extent",
                     map_->replicas());
        }
        if (epoch != seen) short_warned_ = false;
        seen = epoch;
        pending = repair_all();
        if (!pending) clean_rounds_.fetch_add(1, std::memory_order_release);
      }
    }
  }

  // One pass over the extents; true when some stay degraded (retry later).
  bool repair_all() {
    bool left = false;
    uint64_t n_done = 0, bytes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const uint32_t n = map_->extent_count();
    for (uint32_t e = 0; e < n; ++e) {
      if (stopping()) return true;
      if (!map_->degraded(e)) continue;
      const auto s0 = std::chrono::steady_clock::now();
      RemoteMap::RepairPlan plan;
      Status st = map_->begin_repair(e, &plan);
      if (st.code() == Errc::kNotFound) continue;  // lost: nothing to copy from
      if (!st.ok()) {
        // Said once per failure, not on every retry while no donor has room.
        if (!short_warned_) {
          FARMEM_LOG(kWarn, "re-replication: %s; retried while extents are short of copies",
                     st.to_string().c_str());
          short_warned_ = true;
        }
        left = true;
        if (plan.n_to == 0) continue;
      }
      if (plan.n_to == 0) continue;
      Status cs = copy_extent(plan);
      if (!cs.ok()) {
        FARMEM_LOG(kWarn, "re-replication of extent %u: %s; retried", e, cs.to_string().c_str());
        left = true;
        continue;
      }
      const uint64_t ns =
          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now() - s0)
                                    .count());
      map_->finish_repair(plan, ns);
      ++n_done;
      bytes += plan.bytes;
    }
    if (n_done) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      FARMEM_LOG(kInfo, "re-replication: %llu extents (%.1f MiB) restored in %.1f ms%s",
                 static_cast<unsigned long long>(n_done), static_cast<double>(bytes) / 1048576.0,
                 ms, left ? "; some are still short of replicas" : "");
    }
    return left;
  }

  // Posts ops and reaps all of them; the first error, after marking donors
  // that returned kUnavailable/kNotFound failed.
  Errc run_ops(IoOp* ops, size_t n) {
    Errc pe = q_->post({ops, n});
    if (pe != Errc::kOk) {
      if (pe == Errc::kUnavailable)
        for (size_t i = 0; i < n; ++i) map_->mark_failed(ops[i].remote.server);
      return pe;
    }
    Errc first = Errc::kOk;
    size_t done = 0;
    IoCompletion c[RemoteMap::kMaxReplicas + 1];
    while (done < n) {
      // Poll first: a backend that completes in the caller (loopback) is
      // done at once; wait() sleeps in slices of milliseconds.
      size_t got = q_->poll({c, n - done});
      if (got == 0) got = q_->wait({c, n - done}, 100);
      for (size_t i = 0; i < got; ++i) {
        if (c[i].status == Errc::kOk) continue;
        if (c[i].status == Errc::kUnavailable || c[i].status == Errc::kNotFound)
          map_->mark_failed(ops[c[i].cookie].remote.server);
        if (first == Errc::kOk) first = c[i].status;
      }
      done += got;
    }
    return first;
  }

  Status copy_extent(const RemoteMap::RepairPlan& p) {
    const uint32_t e = p.extent;
    for (uint64_t off = 0; off < p.bytes;) {
      const uint32_t len = static_cast<uint32_t>(
          p.bytes - off < opts_.chunk_bytes ? p.bytes - off : opts_.chunk_bytes);
      // Wait for write-backs of the extent in flight (each is bounded by
      // its I/O).
      while (map_->writes_in_flight(e) != 0) {
        if (stopping()) return make_error(Errc::kCancelled, "stopping");
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      const uint32_t gen = map_->generation(e);
      IoOp rd{IoKind::kRead, len, RemoteAddr{p.from.server, p.from.slab, off}, buf_, 0};
      Errc st = run_ops(&rd, 1);
      if (st != Errc::kOk) {
        return make_error(st, "READ of %u bytes at offset %llu from donor %s", len,
                          static_cast<unsigned long long>(off), map_->server_name(p.from.server));
      }
      IoOp wr[RemoteMap::kMaxReplicas];
      for (uint32_t k = 0; k < p.n_to; ++k) {
        wr[k] = IoOp{IoKind::kWrite, len, RemoteAddr{p.to[k].server, p.to[k].slab, off}, buf_, k};
      }
      st = run_ops(wr, p.n_to);
      if (st != Errc::kOk) {
        return make_error(st, "WRITE of %u bytes at offset %llu to a new replica", len,
                          static_cast<unsigned long long>(off));
      }
      if (map_->writes_in_flight(e) != 0 || map_->generation(e) != gen) {
        map_->count_redo();  // a write-back raced with this chunk: copy it again
        continue;
      }
      off += len;
    }
    return ok_status();
  }

  B* const t_;
  RemoteMap* const map_;
  const ReplicatorOptions opts_;
  char* buf_ = nullptr;
  bool registered_ = false;
  std::unique_ptr<Queue> q_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;          // guarded by mu_
  bool short_warned_ = false;  // replicator thread only
  std::atomic<uint64_t> clean_rounds_{0};
};

}  // namespace farmem
