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
// The copy is pipelined: up to `pipeline` chunks are in flight on the
// thread's queue, each with its own buffer, so that the READ of one chunk
// overlaps the WRITEs of the previous ones (on tcp a chunk's READ and WRITE
// are each a round trip to a different donor; one at a time left both
// links idle half of the time).
// Copy against concurrent write-backs (the per-extent seqlock-like pair in
// remote_map.h), per chunk: before posting its READ, wait until no write-
// back of the extent is in flight and note the generation; READ the chunk
// from the source, WRITE it to every new replica; when those WRITEs are done
// and a write-back started or finished meanwhile (in_flight != 0 or the
// generation moved), copy the chunk again. A write-back that starts after
// the check already includes the new replica (it was published before the
// copy began); if our WRITE could have landed after the write-back's own,
// that write-back was still in flight, or had bumped the generation, when
// our WRITEs completed, so the chunk is redone. Chunks in flight together
// do not change this: each is checked against its own noted generation, and
// the generation is per extent, so a write-back anywhere in the extent
// redoes every chunk it overlapped in time (conservative, as before).
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
  uint32_t pipeline = 4;            // chunks in flight at once (1..kMaxPipeline)
};

template <TransportBackend B>
class Replicator {
 public:
  using Queue = typename B::Queue;
  static constexpr uint32_t kMaxPipeline = 16;

  static Result<std::unique_ptr<Replicator>> start(B* transport, RemoteMap* map,
                                                   ReplicatorOptions o = {}) {
    if (o.chunk_bytes == 0 || o.chunk_bytes > wire::kMaxIoLength) o.chunk_bytes = 1u << 20;
    if (o.pipeline == 0) o.pipeline = 1;
    if (o.pipeline > kMaxPipeline) o.pipeline = kMaxPipeline;
    std::unique_ptr<Replicator> r(new Replicator(transport, map, o));
    const size_t len = size_t{o.chunk_bytes} * o.pipeline;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return make_error(Errc::kResourceExhausted, "re-replication: mmap of a %zu-byte buffer: %s",
                        len, strerror(errno));
    }
    r->buf_ = static_cast<char*>(p);
    FARMEM_RETURN_IF_ERROR(transport->register_buffer(r->buf_, len));
    r->registered_ = true;
    auto q = transport->open_queue();
    if (!q.ok()) return q.status().with_context("re-replication: opening a transport queue");
    if ((*q)->depth() < size_t{o.pipeline} * RemoteMap::kMaxReplicas) {
      return make_error(Errc::kInvalidArgument,
                        "re-replication: a transport queue of depth %zu cannot hold %u "
                        "chunks "
                        "in flight (%u ops each); lower ReplicatorOptions::pipeline",
                        (*q)->depth(), o.pipeline, RemoteMap::kMaxReplicas);
    }
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
    if (buf_) munmap(buf_, size_t{opts_.chunk_bytes} * opts_.pipeline);
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
          FARMEM_LOG(kInfo,
                     "re-replication: a donor failed; restoring %u replicas "
                     "per extent",
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
    map_->reclaim();  // one grace period for the pass
    if (n_done) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      FARMEM_LOG(kInfo, "re-replication: %llu extents (%.1f MiB) restored in %.1f ms%s",
                 static_cast<unsigned long long>(n_done), static_cast<double>(bytes) / 1048576.0,
                 ms, left ? "; some are still short of replicas" : "");
    }
    return left;
  }

  // Marks the donor of a failed op failed when the error says it is gone.
  void note_error(Errc st, ServerId server) {
    if (st == Errc::kUnavailable || st == Errc::kNotFound) map_->mark_failed(server);
  }

  // One chunk of the pipeline. cookie = chunk index * kOpsPerChunk + op (0:
  // the READ, 1 + k: the WRITE to new replica k).
  static constexpr uint64_t kOpsPerChunk = RemoteMap::kMaxReplicas + 1;
  struct Chunk {
    enum State : uint8_t { kIdle, kReading, kWriting } state = kIdle;
    uint64_t off = 0;
    uint32_t len = 0;
    uint32_t gen = 0;
    uint32_t writes_left = 0;
  };

  Status copy_extent(const RemoteMap::RepairPlan& p) {
    const uint32_t e = p.extent;
    if (p.n_to == 0) return ok_status();
    const uint32_t depth = opts_.pipeline;
    Chunk ch[kMaxPipeline];
    std::vector<uint64_t> redo;  // offsets of chunks to copy again (control path: may allocate)
    uint64_t next = 0;           // next offset never copied
    uint32_t active = 0;
    Status err = ok_status();  // the first error; then drain and return it
    IoCompletion comps[kMaxPipeline * kOpsPerChunk];
    auto chunk_buf = [&](uint32_t i) { return buf_ + uint64_t{i} * opts_.chunk_bytes; };
    for (;;) {
      // Start chunks in the idle slots.
      for (uint32_t i = 0; i < depth && err.ok(); ++i) {
        if (ch[i].state != Chunk::kIdle) continue;
        if (redo.empty() && next >= p.bytes) break;
        // Wait for write-backs of the extent in flight (each is bounded by
        // its I/O); the chunks already in flight keep going meanwhile.
        while (map_->writes_in_flight(e) != 0) {
          if (stopping()) {
            err = make_error(Errc::kCancelled, "stopping");
            break;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        if (!err.ok()) break;
        Chunk& c = ch[i];
        if (!redo.empty()) {
          c.off = redo.back();
          redo.pop_back();
        } else {
          c.off = next;
          next += p.bytes - next < opts_.chunk_bytes ? p.bytes - next : opts_.chunk_bytes;
        }
        c.len = static_cast<uint32_t>(p.bytes - c.off < opts_.chunk_bytes ? p.bytes - c.off
                                                                          : opts_.chunk_bytes);
        c.gen = map_->generation(e);
        IoOp rd{IoKind::kRead, c.len, RemoteAddr{p.from.server, p.from.slab, c.off}, chunk_buf(i),
                i * kOpsPerChunk};
        Errc pe = q_->post({&rd, 1});
        if (pe != Errc::kOk) {
          note_error(pe, p.from.server);
          err =
              make_error(pe, "READ of %u bytes at offset %llu from donor %s", c.len,
                         static_cast<unsigned long long>(c.off), map_->server_name(p.from.server));
          break;
        }
        c.state = Chunk::kReading;
        ++active;
      }
      if (active == 0) break;  // all copied, or an error and nothing left in flight
      // Poll first: a backend that completes in the caller (loopback) is
      // done at once; wait() sleeps in slices of milliseconds.
      const size_t room = sizeof comps / sizeof comps[0];
      size_t got = q_->poll({comps, room});
      if (got == 0) got = q_->wait({comps, room}, 100);
      for (size_t j = 0; j < got; ++j) {
        const uint32_t i = static_cast<uint32_t>(comps[j].cookie / kOpsPerChunk);
        const uint32_t op = static_cast<uint32_t>(comps[j].cookie % kOpsPerChunk);
        Chunk& c = ch[i];
        const ServerId server = op == 0 ? p.from.server : p.to[op - 1].server;
        if (comps[j].status != Errc::kOk) {
          note_error(comps[j].status, server);
          if (err.ok()) {
            err = op == 0
                      ? make_error(comps[j].status, "READ of %u bytes at offset %llu from donor %s",
                                   c.len, static_cast<unsigned long long>(c.off),
                                   map_->server_name(server))
                      : make_error(comps[j].status,
                                   "WRITE of %u bytes at offset %llu to a "
                                   "new replica on %s",
                                   c.len, static_cast<unsigned long long>(c.off),
                                   map_->server_name(server));
          }
        }
        if (op == 0) {
          // READ done: WRITE the chunk to every new replica (unless failing).
          if (!err.ok()) {
            c.state = Chunk::kIdle;
            --active;
            continue;
          }
          IoOp wr[RemoteMap::kMaxReplicas];
          for (uint32_t k = 0; k < p.n_to; ++k) {
            wr[k] = IoOp{IoKind::kWrite, c.len, RemoteAddr{p.to[k].server, p.to[k].slab, c.off},
                         chunk_buf(i), i * kOpsPerChunk + 1 + k};
          }
          Errc pe = q_->post({wr, p.n_to});
          if (pe != Errc::kOk) {
            for (uint32_t k = 0; k < p.n_to; ++k) note_error(pe, p.to[k].server);
            err = make_error(pe, "WRITE of %u bytes at offset %llu to a new replica", c.len,
                             static_cast<unsigned long long>(c.off));
            c.state = Chunk::kIdle;
            --active;
            continue;
          }
          c.state = Chunk::kWriting;
          c.writes_left = p.n_to;
          continue;
        }
        if (--c.writes_left != 0) continue;
        c.state = Chunk::kIdle;
        --active;
        if (err.ok() && (map_->writes_in_flight(e) != 0 || map_->generation(e) != c.gen)) {
          map_->count_redo();  // a write-back raced with this chunk: copy it again
          redo.push_back(c.off);
        }
      }
    }
    return err;
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
