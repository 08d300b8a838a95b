#include "pager/remote_map.h"

// RCU flavour: urcu-bp ("bulletproof"). The replica sets are read by the
// fault handlers and the evictor, but also by application threads that call
// the hints (fm_evict, fm_prefetch, fm_pin run Pager::evict/prefetch on the
// caller's thread) and, under LD_PRELOAD, by threads farmem never sees
// start. urcu-memb (and mb, signal) require rcu_register_thread() on every
// reader thread before its first read-side section, which cannot be
// guaranteed for application threads; qsbr would need every reader to
// announce quiescent states. bp registers a thread lazily on its first
// read_lock, in memory it maps itself. Its read side costs a compiler
// barrier when the kernel has membarrier (Linux >= 4.14) and a full fence
// otherwise: noise next to a fault (~4 us).
#include <sys/mman.h>
#include <urcu/urcu-bp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/donor_client.h"
#include "runtime/log.h"
#include "runtime/loopback_transport.h"

namespace farmem {

Result<SlabSource::Slab> SlabSource::lease_one(uint64_t bytes, std::span<const ServerId> avoid,
                                               std::span<const ServerId>) {
  auto r = lease(bytes);
  if (!r.ok()) return r.status();
  Result<Slab> out = make_error(Errc::kResourceExhausted,
                                "a slab source with one donor cannot place a second replica; "
                                "FARMEM_REPLICAS needs at least as many donors in FARMEM_SERVERS");
  bool taken = false;
  for (const Slab& s : *r) {
    bool avoided = std::find(avoid.begin(), avoid.end(), s.server) != avoid.end();
    if (!taken && !avoided) {
      out = s;
      taken = true;
      continue;
    }
    (void)release(s.server, s.desc.slab);
  }
  return out;
}

LoopbackSlabSource::LoopbackSlabSource(ServerId server, LoopbackDonor* donor)
    : server_(server), donor_(donor), name_("loopback donor " + std::to_string(server)) {}

Result<std::vector<SlabSource::Slab>> LoopbackSlabSource::lease(uint64_t bytes) {
  auto r = donor_->lease(bytes);
  if (!r.ok()) return r.status().with_context(name_);
  std::vector<Slab> out;
  for (const SlabDesc& d : *r) out.push_back({server_, d});
  return out;
}

Status LoopbackSlabSource::release(ServerId, SlabId slab) {
  return donor_->release(slab);
}

uint64_t LoopbackSlabSource::lease_granularity() const {
  return donor_->slab_size();
}

DonorSessionSlabSource::DonorSessionSlabSource(ServerId server, DonorSession* session)
    : server_(server), session_(session), name_(session->endpoint().to_string()) {}

Result<std::vector<SlabSource::Slab>> DonorSessionSlabSource::lease(uint64_t bytes) {
  auto r = session_->lease(bytes);
  if (!r.ok()) return r.status().with_context("donor " + name_);
  std::vector<Slab> out;
  for (const SlabDesc& d : *r) out.push_back({server_, d});
  return out;
}

Status DonorSessionSlabSource::release(ServerId, SlabId slab) {
  return session_->release(slab);
}

uint64_t DonorSessionSlabSource::lease_granularity() const {
  return session_->welcome().slab_size;
}

// ---- RemoteMap -----------------------------------------------------------------

template <class T>
RemoteMap::LazyArray<T>::LazyArray() {
  void* p = mmap(nullptr, size_t{kMaxSlabs} * sizeof(T), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    // Too small to fail but at an address-space limit; nothing can run then.
    fprintf(stderr, "farmem: pager: mmap of %zu bytes for the remote map failed: %s\n",
            size_t{kMaxSlabs} * sizeof(T), strerror(errno));
    abort();
  }
  base_ = static_cast<char*>(p);
}

template <class T>
RemoteMap::LazyArray<T>::~LazyArray() {
  munmap(base_, size_t{kMaxSlabs} * sizeof(T));
}

RemoteMap::RemoteMap(SlabSource* source, TransportControl* transport, uint32_t unit_size)
    : source_(source),
      transport_(transport),
      unit_size_(unit_size),
      replicas_(std::clamp<uint32_t>(source->replicas(), 1, kMaxReplicas)),
      failed_(new std::atomic<uint8_t>[kMaxServers]),
      load_(new DonorLoad[kMaxServers]) {
  for (uint32_t i = 0; i < kMaxServers; ++i) failed_[i].store(0, std::memory_order_relaxed);
}

RemoteMap::~RemoteMap() {
  auto drop = [&](const Replica& r) {
    Status st = transport_->remove_slab(r.server, r.slab);
    if (!st.ok()) FARMEM_LOG(kWarn, "pager: remove_slab: %s", st.to_string().c_str());
    if (failed(r.server)) return;  // gone with its donor
    st = source_->release(r.server, r.slab);
    if (!st.ok())
      FARMEM_LOG(kDebug, "pager: releasing slab %u: %s", r.slab, st.to_string().c_str());
  };
  uint32_t n = n_extents_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    const ReplicaSet* s = extents_[i].set.load(std::memory_order_acquire);
    if (!s) continue;
    for (uint32_t k = 0; k < s->n; ++k) drop(s->r[k]);
    delete s;
  }
  // No reader is left (the pager and the replicator are gone).
  for (const ReplicaSet* s : retired_sets_) delete s;
  for (const Replica& r : retired_) drop(r);
}

Status RemoteMap::grow_locked() {
  const uint32_t width = std::clamp<uint32_t>(source_->stripe_width(), 1, 64);
  uint64_t want = source_->lease_granularity();
  if (want < unit_size_) want = unit_size_;
  ReplicaSet sets[64];
  ServerId primaries[64];
  uint32_t made = 0;
  uint64_t min_size = UINT64_MAX;
  Status err = ok_status();
  auto undo = [&](const ReplicaSet& s) {
    for (uint32_t k = 0; k < s.n; ++k) {
      (void)transport_->remove_slab(s.r[k].server, s.r[k].slab);
      (void)source_->release(s.r[k].server, s.r[k].slab);
    }
  };
  for (uint32_t j = 0; j < width; ++j) {
    ReplicaSet s;
    ServerId chosen[kMaxReplicas];
    bool ok = true;
    for (uint32_t k = 0; k < replicas_; ++k) {
      auto slab = source_->lease_one(want, {chosen, k}, {primaries, made});
      if (!slab.ok() && k > 0) {
        // Fewer live donors than replicas (after failures): the extent
        // starts degraded rather than the write-back failing; the
        // replicator adds the missing copies when a donor (re)joins.
        if (!warned_short_) {
          FARMEM_LOG(kWarn,
                     "pager: only %u of %u replicas could be placed for new remote space (%s); "
                     "it is re-replicated when donors are available",
                     k, replicas_, slab.status().to_string().c_str());
          warned_short_ = true;
        }
        break;
      }
      if (!slab.ok()) {
        err = slab.status();
        ok = false;
        break;
      }
      Status st = transport_->add_slab(slab->server, slab->desc);
      if (!st.ok()) {
        (void)source_->release(slab->server, slab->desc.slab);
        err = st.with_context("pager: adding a leased slab to the transport");
        ok = false;
        break;
      }
      chosen[k] = slab->server;
      s.r[s.n++] = Replica{slab->server, slab->desc.slab, true};
      min_size = std::min<uint64_t>(min_size, slab->desc.size);
    }
    if (!ok) {
      undo(s);
      break;
    }
    primaries[made] = s.r[0].server;
    sets[made++] = s;
  }
  if (made == 0) {
    if (replicas_ > 1) {
      return err.with_context("pager: leasing remote space for write-back (FARMEM_REPLICAS=" +
                              std::to_string(replicas_) +
                              " needs that many live donors with free capacity)");
    }
    return err.with_context("pager: leasing remote space for write-back");
  }
  const uint64_t upe = min_size / unit_size_;
  const uint32_t ne = n_extents_.load(std::memory_order_relaxed);
  const uint32_t ng = n_groups_.load(std::memory_order_relaxed);
  if (upe == 0 || ne + made > kMaxSlabs || ng == kMaxSlabs ||
      uint64_t{total_units_} + upe * made >= UINT32_MAX - 1) {
    for (uint32_t j = 0; j < made; ++j) undo(sets[j]);
    return make_error(Errc::kResourceExhausted,
                      "pager: the slab source gave no usable remote space (slabs of %" PRIu64
                      " bytes for %u-byte blocks, %u extents of at most %u in use)",
                      min_size, unit_size_, ne, kMaxSlabs);
  }
  for (uint32_t j = 0; j < made; ++j) {
    Extent& e = extents_.emplace(ne + j);
    e.bytes = upe * unit_size_;
    e.set.store(new ReplicaSet(sets[j]), std::memory_order_release);
  }
  n_extents_.store(ne + made, std::memory_order_release);
  groups_.emplace(ng) =
      Group{total_units_, static_cast<uint32_t>(upe * made), ne, made, static_cast<uint32_t>(upe)};
  n_groups_.store(ng + 1, std::memory_order_release);
  total_units_ += static_cast<uint32_t>(upe * made);
  return ok_status();
}

Result<uint32_t> RemoteMap::alloc_unit() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!free_.empty()) {
    uint32_t u = free_.back();
    free_.pop_back();
    assigned_.fetch_add(1, std::memory_order_relaxed);
    return u;
  }
  if (next_unit_ == total_units_) FARMEM_RETURN_IF_ERROR(grow_locked());
  assigned_.fetch_add(1, std::memory_order_relaxed);
  return next_unit_++;
}

void RemoteMap::free_unit(uint32_t unit) {
  std::lock_guard<std::mutex> lk(mu_);
  free_.push_back(unit);
  assigned_.fetch_sub(1, std::memory_order_relaxed);
}

void RemoteMap::locate(uint32_t unit, uint32_t* extent, uint64_t* offset) const noexcept {
  uint32_t n = n_groups_.load(std::memory_order_acquire);
  uint32_t lo = 0, hi = n;
  while (hi - lo > 1) {
    uint32_t mid = (lo + hi) / 2;
    if (groups_[mid].first_unit <= unit)
      lo = mid;
    else
      hi = mid;
  }
  const Group& g = groups_[lo];
  FARMEM_BUG_ON(n == 0 || unit < g.first_unit || unit >= g.first_unit + g.units);
  const uint32_t i = unit - g.first_unit;
  *extent = g.first_extent + i % g.width;
  *offset = uint64_t{i / g.width} * unit_size_;
}

RemoteAddr RemoteMap::resolve(uint32_t unit) const noexcept {
  uint32_t e;
  uint64_t off;
  locate(unit, &e, &off);
  urcu_bp_read_lock();
  const ReplicaSet* s = extents_[e].set.load(std::memory_order_acquire);
  RemoteAddr a{s->r[0].server, s->r[0].slab, off};
  urcu_bp_read_unlock();
  return a;
}

bool RemoteMap::resolve_read(uint32_t unit, RemoteAddr* out) const noexcept {
  uint32_t e;
  uint64_t off;
  locate(unit, &e, &off);
  bool found = false;
  int32_t best = 0;
  urcu_bp_read_lock();
  const ReplicaSet* s = extents_[e].set.load(std::memory_order_acquire);
  // The live readable replica whose donor has the fewest READs outstanding.
  // Candidates are visited from a start chosen by a multiplicative hash of
  // the unit (so that the choice does not follow the stripe pattern) and only
  // a strictly smaller load displaces the first found: equal loads (an idle
  // map) spread by unit.
  const uint32_t start = s->n > 1 ? ((unit * 2654435761u) >> 16) % s->n : 0;
  for (uint32_t i = 0; i < s->n; ++i) {
    const Replica& r = s->r[(start + i) % s->n];
    if (!r.readable || failed(r.server)) continue;
    const int32_t l = reads_outstanding(r.server);
    if (!found || l < best) {
      *out = RemoteAddr{r.server, r.slab, off};
      best = l;
      found = true;
    }
  }
  urcu_bp_read_unlock();
  if (found && out->server < kMaxServers)
    load_[out->server].reads.fetch_add(1, std::memory_order_relaxed);
  return found;
}

size_t RemoteMap::begin_write(uint32_t unit, RemoteAddr out[kMaxReplicas]) noexcept {
  uint32_t e;
  uint64_t off;
  locate(unit, &e, &off);
  // Raised before the set is read: a copier that saw in_flight == 0 after
  // adding a replica is ordered before this, so this write sees the replica.
  extents_[e].in_flight.fetch_add(1, std::memory_order_seq_cst);
  size_t n = 0;
  urcu_bp_read_lock();
  const ReplicaSet* s = extents_[e].set.load(std::memory_order_seq_cst);
  for (uint32_t k = 0; k < s->n; ++k) {
    if (!failed(s->r[k].server)) out[n++] = RemoteAddr{s->r[k].server, s->r[k].slab, off};
  }
  urcu_bp_read_unlock();
  return n;
}

void RemoteMap::end_write(uint32_t unit) noexcept {
  uint32_t e;
  uint64_t off;
  locate(unit, &e, &off);
  // Generation first: a copier then sees in_flight != 0 or a new generation.
  extents_[e].generation.fetch_add(1, std::memory_order_seq_cst);
  extents_[e].in_flight.fetch_sub(1, std::memory_order_seq_cst);
}

void RemoteMap::mark_failed(ServerId s) noexcept {
  if (s >= kMaxServers) return;
  if (failed_[s].exchange(1, std::memory_order_acq_rel) == 0) {
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    source_->on_failed(s);
  }
}

void RemoteMap::describe_replicas(uint32_t unit, char* buf, size_t len) const noexcept {
  if (len == 0) return;
  buf[0] = 0;
  uint32_t e;
  uint64_t off;
  locate(unit, &e, &off);
  size_t used = 0;
  urcu_bp_read_lock();
  const ReplicaSet* s = extents_[e].set.load(std::memory_order_acquire);
  for (uint32_t k = 0; k < s->n && used < len; ++k) {
    int w = snprintf(
        buf + used, len - used, "%s%s slab %u offset %" PRIu64 "%s", k ? ", " : "",
        source_->server_name(s->r[k].server), s->r[k].slab, off,
        failed(s->r[k].server) ? " (failed)" : (s->r[k].readable ? "" : " (being rebuilt)"));
    if (w < 0) break;
    used += static_cast<size_t>(w);
  }
  urcu_bp_read_unlock();
}

bool RemoteMap::degraded(uint32_t e) const noexcept {
  if (extents_[e].lost.load(std::memory_order_relaxed)) return false;
  urcu_bp_read_lock();
  const ReplicaSet* s = extents_[e].set.load(std::memory_order_acquire);
  uint32_t good = 0;
  bool any_failed = false;
  for (uint32_t k = 0; k < s->n; ++k) {
    if (failed(s->r[k].server))
      any_failed = true;
    else if (s->r[k].readable)
      ++good;
  }
  urcu_bp_read_unlock();
  return any_failed || good < replicas_;
}

void RemoteMap::publish(uint32_t e, const ReplicaSet& s) {
  const ReplicaSet* fresh = new ReplicaSet(s);
  const ReplicaSet* old = extents_[e].set.exchange(fresh, std::memory_order_seq_cst);
  // Readers that may still look at the old set finish their read-side
  // sections (a few instructions each) before it goes: in reclaim(), one
  // grace period for a whole repair pass. A grace period per publish (two
  // per extent) cost milliseconds each under load and dominated the restore
  // time. Nothing else waits for the grace period: a write-back's view of
  // the set is ordered by in_flight / the seq_cst exchange (begin_write).
  retired_sets_.push_back(old);
}

void RemoteMap::reclaim() {
  std::vector<const ReplicaSet*> sets;
  {
    std::lock_guard<std::mutex> lk(mu_);
    sets.swap(retired_sets_);
  }
  if (sets.empty()) return;
  urcu_bp_synchronize_rcu();
  for (const ReplicaSet* s : sets) delete s;
}

Status RemoteMap::begin_repair(uint32_t e, RepairPlan* plan) {
  std::lock_guard<std::mutex> lk(mu_);
  Extent& x = extents_[e];
  const ReplicaSet* old = x.set.load(std::memory_order_acquire);  // only mu_ holders change it
  ReplicaSet s;
  bool changed = false;
  *plan = RepairPlan{};
  plan->extent = e;
  plan->bytes = x.bytes;
  bool have_from = false;
  for (uint32_t k = 0; k < old->n; ++k) {
    const Replica& r = old->r[k];
    if (failed(r.server)) {
      changed = true;
      continue;
    }
    s.r[s.n++] = r;
    if (r.readable && !have_from) {
      plan->from = RemoteAddr{r.server, r.slab, 0};
      have_from = true;
    } else if (!r.readable) {
      plan->to[plan->n_to++] = RemoteAddr{r.server, r.slab, 0};
    }
  }
  if (!have_from) {
    // Nothing to copy from: the set stays as it is (its failed replicas
    // are skipped by readers and writers alike).
    if (!x.lost.exchange(true)) {
      lost_.fetch_add(1, std::memory_order_relaxed);
      FARMEM_LOG(kError,
                 "pager: extent %u (%" PRIu64
                 " bytes) has no readable replica left: every donor that held it failed; a "
                 "fault on a page in it stops the process (invariant 6)",
                 e, x.bytes);
    }
    return make_error(Errc::kNotFound, "extent %u: no readable replica left", e);
  }
  for (uint32_t k = 0; k < old->n; ++k) {
    if (failed(old->r[k].server)) retired_.push_back(old->r[k]);
  }
  Status err = ok_status();
  while (s.n < replicas_) {
    ServerId avoid[kMaxReplicas];
    for (uint32_t k = 0; k < s.n; ++k) avoid[k] = s.r[k].server;
    auto slab = source_->lease_one(x.bytes, {avoid, s.n}, {});
    if (!slab.ok()) {
      err = slab.status().with_context("re-replication of extent " + std::to_string(e));
      break;
    }
    if (slab->desc.size < x.bytes) {
      (void)source_->release(slab->server, slab->desc.slab);
      err = make_error(Errc::kResourceExhausted,
                       "re-replication of extent %u: donor %s leases slabs of %" PRIu64
                       " bytes, the extent has %" PRIu64,
                       e, source_->server_name(slab->server), slab->desc.size, x.bytes);
      break;
    }
    Status st = transport_->add_slab(slab->server, slab->desc);
    if (!st.ok()) {
      (void)source_->release(slab->server, slab->desc.slab);
      err = st.with_context("re-replication: adding a slab to the transport");
      break;
    }
    s.r[s.n++] = Replica{slab->server, slab->desc.slab, false};
    plan->to[plan->n_to++] = RemoteAddr{slab->server, slab->desc.slab, 0};
    changed = true;
  }
  if (changed) publish(e, s);
  if (!err.ok()) return err;
  return ok_status();
}

void RemoteMap::finish_repair(const RepairPlan& plan, uint64_t ns) {
  std::lock_guard<std::mutex> lk(mu_);
  const ReplicaSet* old = extents_[plan.extent].set.load(std::memory_order_acquire);
  ReplicaSet s = *old;
  for (uint32_t k = 0; k < s.n; ++k) {
    for (uint32_t t = 0; t < plan.n_to; ++t) {
      if (s.r[k].server == plan.to[t].server && s.r[k].slab == plan.to[t].slab) {
        s.r[k].readable = true;
      }
    }
  }
  publish(plan.extent, s);
  restored_.fetch_add(1, std::memory_order_relaxed);
  bytes_restored_.fetch_add(plan.bytes, std::memory_order_relaxed);
  restore_ns_.fetch_add(ns, std::memory_order_relaxed);
}

ReplicationStats RemoteMap::stats() const {
  ReplicationStats st;
  st.replicas = replicas_;
  for (uint32_t i = 0; i < kMaxServers; ++i) st.donors_failed += failed(static_cast<ServerId>(i));
  uint32_t n = extent_count();
  for (uint32_t e = 0; e < n; ++e) st.extents_degraded += degraded(e);
  st.extents_restored = restored_.load(std::memory_order_relaxed);
  st.bytes_restored = bytes_restored_.load(std::memory_order_relaxed);
  st.chunks_redone = redone_.load(std::memory_order_relaxed);
  st.extents_lost = lost_.load(std::memory_order_relaxed);
  st.restore_ns = restore_ns_.load(std::memory_order_relaxed);
  st.read_failovers = failovers_.load(std::memory_order_relaxed);
  return st;
}

}  // namespace farmem
