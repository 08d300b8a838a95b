#include "pager/remote_map.h"

#include "runtime/donor_client.h"
#include "runtime/log.h"
#include "runtime/loopback_transport.h"

namespace farmem {

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

RemoteMap::RemoteMap(SlabSource* source, TransportControl* transport, uint32_t unit_size)
    : source_(source),
      transport_(transport),
      unit_size_(unit_size),
      extents_(new Extent[kMaxSlabs]) {}

RemoteMap::~RemoteMap() {
  uint32_t n = count_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    const Extent& e = extents_[i];
    Status st = transport_->remove_slab(e.server, e.slab);
    if (!st.ok()) FARMEM_LOG(kWarn, "pager: remove_slab: %s", st.to_string().c_str());
    st = source_->release(e.server, e.slab);
    if (!st.ok())
      FARMEM_LOG(kDebug, "pager: releasing slab %u: %s", e.slab, st.to_string().c_str());
  }
}

Result<uint32_t> RemoteMap::alloc_unit() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!free_.empty()) {
    uint32_t u = free_.back();
    free_.pop_back();
    assigned_.fetch_add(1, std::memory_order_relaxed);
    return u;
  }
  if (next_unit_ == total_units_) {
    uint64_t want = source_->lease_granularity();
    if (want < unit_size_) want = unit_size_;
    auto slabs = source_->lease(want);
    if (!slabs.ok()) {
      return slabs.status().with_context("pager: leasing remote space for write-back");
    }
    for (const SlabSource::Slab& s : *slabs) {
      uint64_t units = s.desc.size / unit_size_;
      uint32_t n = count_.load(std::memory_order_relaxed);
      if (units == 0 || n == kMaxSlabs || total_units_ + units >= UINT32_MAX - 1) {
        (void)source_->release(s.server, s.desc.slab);
        continue;
      }
      Status st = transport_->add_slab(s.server, s.desc);
      if (!st.ok()) {
        (void)source_->release(s.server, s.desc.slab);
        return st.with_context("pager: adding a leased slab to the transport");
      }
      extents_[n] = Extent{total_units_, static_cast<uint32_t>(units), s.server, s.desc.slab};
      count_.store(n + 1, std::memory_order_release);
      total_units_ += static_cast<uint32_t>(units);
    }
    if (next_unit_ == total_units_) {
      return make_error(Errc::kResourceExhausted,
                        "pager: the slab source gave no usable remote space (slabs smaller "
                        "than a %u-byte block?)",
                        unit_size_);
    }
  }
  assigned_.fetch_add(1, std::memory_order_relaxed);
  return next_unit_++;
}

void RemoteMap::free_unit(uint32_t unit) {
  std::lock_guard<std::mutex> lk(mu_);
  free_.push_back(unit);
  assigned_.fetch_sub(1, std::memory_order_relaxed);
}

RemoteAddr RemoteMap::resolve(uint32_t unit) const noexcept {
  uint32_t n = count_.load(std::memory_order_acquire);
  uint32_t lo = 0, hi = n;
  while (hi - lo > 1) {
    uint32_t mid = (lo + hi) / 2;
    if (extents_[mid].first_unit <= unit)
      lo = mid;
    else
      hi = mid;
  }
  const Extent& e = extents_[lo];
  FARMEM_BUG_ON(n == 0 || unit < e.first_unit || unit >= e.first_unit + e.units);
  return RemoteAddr{e.server, e.slab, uint64_t{unit - e.first_unit} * unit_size_};
}

}  // namespace farmem
