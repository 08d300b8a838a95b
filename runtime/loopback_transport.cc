#include "runtime/loopback_transport.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <limits>
#include <thread>

#include "runtime/log.h"
#include "runtime/wire.h"

namespace farmem {

namespace {

// wait() never sleeps longer than this in one go while ops are outstanding,
// so that a kill() of the donor is noticed promptly even under a long
// injected latency.
constexpr auto kMaxSleepSlice = std::chrono::milliseconds(2);
// Re-ask the hook about deferred ops this often inside wait().
constexpr auto kDeferredSlice = std::chrono::microseconds(500);

}  // namespace

// ---------------------------------------------------------------------------
// LoopbackDonor

LoopbackDonor::LoopbackDonor(uint64_t capacity, uint64_t slab_size)
    : capacity_(capacity),
      slab_size_(slab_size),
      nslots_(slab_size == 0 ? 0 : static_cast<uint32_t>(capacity / slab_size)),
      faults_(std::make_shared<const LoopbackFaults>()) {
  if (slab_size == 0 || capacity == 0 || capacity % slab_size != 0 ||
      capacity / slab_size > std::numeric_limits<uint32_t>::max() - 1) {
    fatal("LoopbackDonor: capacity %" PRIu64 " must be a non-zero multiple of slab_size %" PRIu64
          " (and at most 2^32-2 slabs); fix the test's donor parameters",
          capacity, slab_size);
  }
  void* p = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    fatal("LoopbackDonor: mmap of %" PRIu64 " bytes failed (%s); use a smaller capacity", capacity_,
          strerror(errno));
  }
  base_ = static_cast<uint8_t*>(p);
  slot_id_ = std::make_unique<std::atomic<SlabId>[]>(nslots_);
  for (uint32_t i = 0; i < nslots_; ++i) slot_id_[i].store(0, std::memory_order_relaxed);
  generation_.assign(nslots_, 0);
  free_slots_.reserve(nslots_);
  // A stack popped from the back: slot 0 is leased first.
  for (uint32_t i = nslots_; i > 0; --i) free_slots_.push_back(i - 1);
}

LoopbackDonor::~LoopbackDonor() {
  if (base_ != nullptr) munmap(base_, capacity_);
}

Result<std::vector<SlabDesc>> LoopbackDonor::lease(uint64_t bytes) {
  if (bytes == 0) {
    return make_error(Errc::kInvalidArgument,
                      "lease of 0 bytes: ask for at least one byte (one slab of %" PRIu64 ")",
                      slab_size_);
  }
  if (dead()) {
    return make_error(Errc::kUnavailable, "loopback donor is dead (kill() was called)");
  }
  const uint64_t n = bytes / slab_size_ + (bytes % slab_size_ != 0 ? 1 : 0);
  std::vector<SlabDesc> out;
  std::lock_guard<std::mutex> lk(mu_);
  if (n > free_slots_.size()) {
    return make_error(Errc::kResourceExhausted,
                      "lease of %" PRIu64 " bytes needs %" PRIu64 " slabs of %" PRIu64
                      " bytes but only %zu of %u are free (capacity %" PRIu64
                      "); lease less or build the donor with more capacity",
                      bytes, n, slab_size_, free_slots_.size(), nslots_, capacity_);
  }
  out.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    // id = slot + 1 + nslots * generation: unique per lease, and the slot
    // is recovered without a lookup as (id - 1) % nslots.
    uint64_t id = uint64_t{slot} + 1 + uint64_t{nslots_} * generation_[slot]++;
    if (id > std::numeric_limits<SlabId>::max()) {
      generation_[slot] = 1;
      id = uint64_t{slot} + 1;
    }
    slot_id_[slot].store(static_cast<SlabId>(id), std::memory_order_release);
    out.push_back(SlabDesc{static_cast<uint32_t>(id), 0, slab_size_, 0});
  }
  leased_bytes_ += n * slab_size_;
  return out;
}

Status LoopbackDonor::release(SlabId slab) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint32_t slot = slab == 0 ? 0 : (slab - 1) % nslots_;
  if (slab == 0 || slot_id_[slot].load(std::memory_order_relaxed) != slab) {
    return make_error(Errc::kNotFound,
                      "release of slab %u: it is not leased from this donor (never leased or "
                      "already released)",
                      slab);
  }
  slot_id_[slot].store(0, std::memory_order_release);
  uint8_t* mem = base_ + uint64_t{slot} * slab_size_;
  // Zero before the slot can be leased again. MADV_DONTNEED on a private
  // anonymous mapping drops the pages (later reads see zeros) and gives the
  // memory back; it needs page-aligned ranges.
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (slab_size_ % page != 0 || madvise(mem, slab_size_, MADV_DONTNEED) != 0) {
    memset(mem, 0, slab_size_);
  }
  free_slots_.push_back(slot);
  leased_bytes_ -= slab_size_;
  return ok_status();
}

uint64_t LoopbackDonor::leased_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return leased_bytes_;
}

void LoopbackDonor::set_faults(LoopbackFaults f) {
  latency_us_.store(f.latency_us, std::memory_order_relaxed);
  jitter_us_.store(f.jitter_us, std::memory_order_relaxed);
  reorder_.store(f.reorder, std::memory_order_relaxed);
  const bool has_hook = static_cast<bool>(f.hook);
  {
    std::lock_guard<std::mutex> lk(faults_mu_);
    faults_ = std::make_shared<const LoopbackFaults>(std::move(f));
  }
  has_hook_.store(has_hook, std::memory_order_release);
}

void LoopbackDonor::kill() {
  dead_.store(true, std::memory_order_release);
  FARMEM_LOG(kDebug, "loopback donor %p killed", static_cast<void*>(this));
}

std::span<uint8_t> LoopbackDonor::slab_memory(SlabId slab) {
  uint8_t* mem = nullptr;
  if (resolve(slab, 0, 1, &mem) != Errc::kOk) return {};
  return {mem, slab_size_};
}

void LoopbackDonor::reset_counters() {
  reads_.store(0, std::memory_order_relaxed);
  writes_.store(0, std::memory_order_relaxed);
  bytes_read_.store(0, std::memory_order_relaxed);
  bytes_written_.store(0, std::memory_order_relaxed);
}

Errc LoopbackDonor::resolve(SlabId slab, uint64_t offset, uint32_t length, uint8_t** out) const {
  if (slab == 0) return Errc::kNotFound;
  const uint32_t slot = (slab - 1) % nslots_;
  if (slot_id_[slot].load(std::memory_order_acquire) != slab) return Errc::kNotFound;
  if (offset > slab_size_ || length > slab_size_ - offset) return Errc::kOutOfRange;
  *out = base_ + uint64_t{slot} * slab_size_ + offset;
  return Errc::kOk;
}

std::shared_ptr<const LoopbackFaults> LoopbackDonor::faults() const {
  std::lock_guard<std::mutex> lk(faults_mu_);
  return faults_;
}

void LoopbackDonor::count(IoKind kind, uint32_t length) {
  if (kind == IoKind::kRead) {
    reads_.fetch_add(1, std::memory_order_relaxed);
    bytes_read_.fetch_add(length, std::memory_order_relaxed);
  } else {
    writes_.fetch_add(1, std::memory_order_relaxed);
    bytes_written_.fetch_add(length, std::memory_order_relaxed);
  }
}

// ---------------------------------------------------------------------------
// LoopbackTransport

LoopbackTransport::LoopbackTransport(Options o) : opts_(o) {}

LoopbackTransport::~LoopbackTransport() = default;

Status LoopbackTransport::add_server(ServerId id, LoopbackDonor* donor) {
  if (donor == nullptr) {
    return make_error(Errc::kInvalidArgument, "add_server(%u): donor is null; pass a live donor",
                      id);
  }
  std::unique_lock<std::shared_mutex> lk(mu_);
  gen_.fetch_add(1, std::memory_order_release);
  if (!servers_.emplace(id, donor).second) {
    return make_error(Errc::kInvalidArgument,
                      "add_server(%u): server id already added; use a different id", id);
  }
  return ok_status();
}

Result<std::unique_ptr<LoopbackTransport::Queue>> LoopbackTransport::open_queue() {
  if (opts_.depth == 0 || opts_.depth > std::numeric_limits<uint32_t>::max()) {
    return make_error(Errc::kInvalidArgument,
                      "loopback queue depth %zu is invalid; use 1 .. 2^32-1 (default 256)",
                      opts_.depth);
  }
  const uint64_t k = next_queue_.fetch_add(1, std::memory_order_relaxed);
  return std::unique_ptr<Queue>(new Queue(this, opts_.depth, opts_.seed + k));
}

Status LoopbackTransport::register_buffer(void* addr, size_t length) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  gen_.fetch_add(1, std::memory_order_release);
  return buffers_.insert(addr, length);
}

Status LoopbackTransport::unregister_buffer(void* addr) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  gen_.fetch_add(1, std::memory_order_release);
  return buffers_.erase(addr);
}

Status LoopbackTransport::add_slab(ServerId server, const SlabDesc& slab) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  gen_.fetch_add(1, std::memory_order_release);
  auto s = servers_.find(server);
  if (s == servers_.end()) {
    return make_error(Errc::kInvalidArgument,
                      "add_slab(server %u, slab %u): unknown server; call add_server first", server,
                      slab.slab);
  }
  if (slab.size == 0) {
    return make_error(Errc::kInvalidArgument,
                      "add_slab(server %u, slab %u): size is 0; pass the SlabDesc from lease()",
                      server, slab.slab);
  }
  if (!slabs_.emplace(slab_key(server, slab.slab), SlabEntry{s->second, slab.size}).second) {
    return make_error(Errc::kInvalidArgument,
                      "add_slab(server %u, slab %u): slab already added; remove_slab first", server,
                      slab.slab);
  }
  return ok_status();
}

Status LoopbackTransport::remove_slab(ServerId server, SlabId slab) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  gen_.fetch_add(1, std::memory_order_release);
  if (slabs_.erase(slab_key(server, slab)) == 0) {
    return make_error(Errc::kNotFound, "remove_slab(server %u, slab %u): slab was not added",
                      server, slab);
  }
  return ok_status();
}

// ---------------------------------------------------------------------------
// LoopbackTransport::Queue

LoopbackTransport::Queue::Queue(LoopbackTransport* t, size_t depth, uint64_t seed)
    : t_(t), depth_(depth), rng_(seed) {
  pending_.reserve(depth_);
  ready_.reserve(depth_);
  done_.assign(depth_, 0);
}

LoopbackTransport::Queue::~Queue() = default;

const LoopbackTransport::Queue::SlabHit* LoopbackTransport::Queue::validate(
    const IoOp& op, std::shared_lock<std::shared_mutex>& lk, Errc* status) {
  // Validation, in the order of runtime/transport.h.
  if (op.length == 0 || op.length > wire::kMaxIoLength) {
    *status = Errc::kInvalidArgument;
    return nullptr;
  }
  const auto local = reinterpret_cast<uintptr_t>(op.local);
  if (local - buf_begin_ >= buf_len_ || op.length > buf_len_ - (local - buf_begin_)) {
    if (!lk.owns_lock()) lk.lock();
    const auto* e = t_->buffers_.find(op.local, op.length);
    if (e == nullptr) {
      *status = Errc::kInvalidArgument;
      return nullptr;
    }
    buf_begin_ = e->begin;
    buf_len_ = e->length;
  }
  const uint64_t key = slab_key(op.remote.server, op.remote.slab);
  SlabHit& hit = slabs_[op.remote.slab % kSlabCache];
  if (hit.key != key) {
    if (!lk.owns_lock()) lk.lock();
    auto slab = t_->slabs_.find(key);
    if (slab == t_->slabs_.end()) {
      // Unknown server or a slab not added: both are the caller's mistake.
      *status = Errc::kInvalidArgument;
      return nullptr;
    }
    hit = SlabHit{key, slab->second.donor, slab->second.size};
  }
  if (op.remote.offset > hit.size || op.length > hit.size - op.remote.offset) {
    *status = Errc::kOutOfRange;
    return nullptr;
  }
  return &hit;
}

Errc LoopbackTransport::Queue::post(std::span<const IoOp> ops) {
  if (ops.size() > depth_ - pending_.size()) return Errc::kResourceExhausted;
  if (ops.empty()) return Errc::kOk;
  // Clock::time_point::min() = ready at once; the clock is read only for an
  // op with an injected delay (see the header: no clock on the fast path).
  Clock::time_point now = Clock::time_point::min();
  // The cache is good while no table changed since it was filled; the
  // tables are locked (shared) only on a miss.
  const uint64_t gen = t_->gen_.load(std::memory_order_acquire);
  if (gen != cache_gen_) {
    cache_gen_ = gen;
    buf_begin_ = 0;
    buf_len_ = 0;
    for (SlabHit& e : slabs_) e = SlabHit{};
  }
  std::shared_lock<std::shared_mutex> lk(t_->mu_, std::defer_lock);
  for (const IoOp& op : ops) {
    Pending& p = pending_.emplace_back();
    p.op = op;
    p.ready = Clock::time_point::min();
    p.status = Errc::kOk;
    p.donor = nullptr;
    const SlabHit* slab = validate(op, lk, &p.status);
    if (slab == nullptr) continue;
    LoopbackDonor* d = slab->donor;
    p.donor = d;
    const uint32_t latency = d->latency_us_.load(std::memory_order_relaxed);
    const uint32_t jitter = d->jitter_us_.load(std::memory_order_relaxed);
    uint64_t delay_us = latency;
    if (jitter != 0) delay_us += rng_() % jitter;
    if (delay_us != 0) {
      if (now == Clock::time_point::min()) now = Clock::now();
      p.ready = now + std::chrono::microseconds(delay_us);
      ++timed_;
    }
    p.reorder = d->reorder_.load(std::memory_order_relaxed);
    p.deferred = false;
  }
  return Errc::kOk;
}

bool LoopbackTransport::Queue::execute(Pending& p, IoCompletion* out) {
  out->cookie = p.op.cookie;
  if (p.donor == nullptr) {
    out->status = p.status;
    return true;
  }
  LoopbackDonor* d = p.donor;
  if (d->dead()) {
    out->status = Errc::kUnavailable;
    return true;
  }
  uint8_t* remote = nullptr;
  Errc e = d->resolve(p.op.remote.slab, p.op.remote.offset, p.op.length, &remote);
  if (e != Errc::kOk) {
    out->status = e;
    return true;
  }
  if (d->has_hook_.load(std::memory_order_acquire)) {
    // Holds the faults alive across the call even if set_faults() swaps them.
    const std::shared_ptr<const LoopbackFaults> f = d->faults();
    if (f->hook) {
      const LoopbackVerdict v = f->hook(p.op);
      if (v.action == LoopbackVerdict::kDefer) {
        p.deferred = true;
        return false;
      }
      if (v.action == LoopbackVerdict::kFail) {
        out->status = v.error == Errc::kOk ? Errc::kUnavailable : v.error;
        return true;
      }
    }
    // The donor may have died while the hook ran (tests kill from hooks).
    if (d->dead()) {
      out->status = Errc::kUnavailable;
      return true;
    }
  }
  if (p.op.kind == IoKind::kRead) {
    memcpy(p.op.local, remote, p.op.length);
  } else {
    memcpy(remote, p.op.local, p.op.length);
  }
  d->count(p.op.kind, p.op.length);
  out->status = Errc::kOk;
  return true;
}

size_t LoopbackTransport::Queue::poll(std::span<IoCompletion> out) {
  if (pending_.empty() || out.empty()) return 0;
  if (pending_.size() == 1 && timed_ == 0) {
    // One untimed op (a demand fetch): ready whatever the time, nothing to
    // order or compact.
    if (!execute(pending_[0], &out[0])) return 0;
    pending_.clear();
    return 1;
  }
  // Untimed ops (ready == min()) are ready whatever the time: no clock read
  // unless some pending op carries an injected delay.
  const Clock::time_point now = timed_ != 0 ? Clock::now() : Clock::time_point::min();
  ready_.clear();
  bool shuffle = false;
  for (uint32_t i = 0; i < pending_.size(); ++i) {
    const Pending& p = pending_[i];
    if (p.ready <= now || (p.donor != nullptr && p.donor->dead())) {
      ready_.push_back(i);
      shuffle |= p.reorder;
    }
  }
  if (ready_.empty()) return 0;
  if (shuffle) std::shuffle(ready_.begin(), ready_.end(), rng_);
  size_t n = 0;
  for (uint32_t i : ready_) {
    if (n == out.size()) break;
    if (execute(pending_[i], &out[n])) {
      done_[i] = 1;
      ++n;
    }
  }
  if (n == 0) return 0;
  // Drop the completed entries, keeping post order for the rest.
  size_t k = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (done_[i] != 0) {
      done_[i] = 0;
      if (pending_[i].ready != Clock::time_point::min()) --timed_;
      continue;
    }
    if (k != i) pending_[k] = pending_[i];
    ++k;
  }
  pending_.resize(k);
  return n;
}

size_t LoopbackTransport::Queue::wait(std::span<IoCompletion> out, int timeout_ms) {
  // The common case (an untimed op just posted) completes in the first
  // poll(), before any clock read.
  size_t first = poll(out);
  if (first != 0 || pending_.empty() || out.empty()) return first;
  const Clock::time_point deadline = timeout_ms < 0
                                         ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const size_t n = poll(out);
    if (n != 0 || pending_.empty() || out.empty()) return n;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return 0;
    Clock::time_point until = now + kMaxSleepSlice;
    for (const Pending& p : pending_) {
      const Clock::time_point t = p.deferred ? now + kDeferredSlice : p.ready;
      until = std::min(until, t);
    }
    until = std::min(until, deadline);
    if (until > now) std::this_thread::sleep_until(until);
  }
}

}  // namespace farmem
