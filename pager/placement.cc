#include "pager/placement.h"

#include <algorithm>
#include <cinttypes>

#include "runtime/log.h"

namespace farmem {

PlacementSource::PlacementSource(uint32_t replicas, uint64_t seed)
    : replicas_(std::clamp<uint32_t>(replicas, 1, RemoteMap::kMaxReplicas)), rng_(seed) {}

PlacementSource::~PlacementSource() = default;

Status PlacementSource::add_donor(Donor d, ServerId* id) {
  std::lock_guard<std::mutex> lk(mu_);
  uint32_t n = count_.load(std::memory_order_relaxed);
  if (n == kMaxDonors) {
    return make_error(Errc::kResourceExhausted,
                      "placement: at most %u donors (including donors that rejoined after a "
                      "failure); list fewer in FARMEM_SERVERS",
                      kMaxDonors);
  }
  if (!d.source) return make_error(Errc::kInvalidArgument, "placement: a donor without a source");
  if (d.name.empty()) d.name = d.source->server_name(static_cast<ServerId>(n));
  auto e = std::make_unique<Entry>();
  e->d = std::move(d);
  entries_[n] = std::move(e);
  count_.store(n + 1, std::memory_order_release);
  *id = static_cast<ServerId>(n);
  return ok_status();
}

void PlacementSource::set_reconnect(Reconnect r, std::chrono::milliseconds interval) {
  std::lock_guard<std::mutex> lk(mu_);
  reconnect_ = std::move(r);
  reconnect_interval_ = interval;
}

bool PlacementSource::failed(ServerId s) const noexcept {
  return s >= donors() || entries_[s]->failed.load(std::memory_order_acquire);
}

uint32_t PlacementSource::live_donors() const {
  uint32_t n = donors(), live = 0;
  for (uint32_t i = 0; i < n; ++i) live += !entries_[i]->failed.load(std::memory_order_acquire);
  return live;
}

uint64_t PlacementSource::instance_id(ServerId s) const {
  return s < donors() ? entries_[s]->d.instance_id : 0;
}

uint64_t PlacementSource::leased_bytes(ServerId s) const {
  return s < donors() ? entries_[s]->leased.load(std::memory_order_relaxed) : 0;
}

uint32_t PlacementSource::stripe_width() const {
  uint32_t live = live_donors();
  return live ? live : 1;
}

const char* PlacementSource::server_name(ServerId server) const noexcept {
  if (server >= donors()) return "unknown donor";
  return entries_[server]->d.name.c_str();
}

uint64_t PlacementSource::lease_granularity() const {
  // The first live donor's slab: RemoteMap leases one slab per extent.
  uint32_t n = donors();
  for (uint32_t i = 0; i < n; ++i) {
    if (!entries_[i]->failed.load(std::memory_order_acquire))
      return entries_[i]->d.source->lease_granularity();
  }
  return n ? entries_[0]->d.source->lease_granularity() : 4096;
}

Result<std::vector<SlabSource::Slab>> PlacementSource::lease(uint64_t bytes) {
  auto s = lease_one(bytes, {}, {});
  if (!s.ok()) return s.status();
  return std::vector<Slab>{*s};
}

Result<SlabSource::Slab> PlacementSource::lease_one(uint64_t bytes, std::span<const ServerId> avoid,
                                                    std::span<const ServerId> prefer_not) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint32_t n = donors();
  std::string why;
  // Candidates: live, not avoided, with room. Tried best-first by power of
  // two choices; a donor whose lease fails is dropped from the list and the
  // choice is made again among the rest.
  std::vector<ServerId> cand;
  for (int pass = 0; pass < 2; ++pass) {
    cand.clear();
    for (uint32_t i = 0; i < n; ++i) {
      const Entry& e = *entries_[i];
      const ServerId id = static_cast<ServerId>(i);
      if (e.failed.load(std::memory_order_acquire)) continue;
      if (std::find(avoid.begin(), avoid.end(), id) != avoid.end()) continue;
      if (pass == 0 && std::find(prefer_not.begin(), prefer_not.end(), id) != prefer_not.end())
        continue;
      if (e.d.capacity && e.leased.load(std::memory_order_relaxed) + bytes > e.d.capacity) {
        why += (why.empty() ? "" : "; ") + e.d.name + ": full";
        continue;
      }
      cand.push_back(id);
    }
    if (!cand.empty() || prefer_not.empty()) break;
  }
  auto room = [&](ServerId id) {
    const Entry& e = *entries_[id];
    uint64_t l = e.leased.load(std::memory_order_relaxed);
    return e.d.capacity > l ? e.d.capacity - l : 0;
  };
  while (!cand.empty()) {
    size_t pick = 0;
    if (cand.size() > 1) {
      size_t a = rng_() % cand.size();
      size_t b = rng_() % (cand.size() - 1);
      if (b >= a) ++b;
      pick = room(cand[a]) >= room(cand[b]) ? a : b;
    }
    const ServerId id = cand[pick];
    Entry& e = *entries_[id];
    auto r = e.d.source->lease(bytes);
    if (r.ok() && !r->empty()) {
      Slab out = r->front();
      out.server = id;
      for (size_t k = 1; k < r->size(); ++k) (void)e.d.source->release(id, (*r)[k].desc.slab);
      e.leased.fetch_add(out.desc.size, std::memory_order_relaxed);
      return out;
    }
    why += (why.empty() ? "" : "; ") + e.d.name + ": " +
           (r.ok() ? std::string("no slab") : r.status().to_string());
    cand.erase(cand.begin() + static_cast<std::ptrdiff_t>(pick));
  }
  uint32_t live = 0;
  for (uint32_t i = 0; i < n; ++i) live += !entries_[i]->failed.load(std::memory_order_acquire);
  return make_error(Errc::kResourceExhausted,
                    "placement: no live donor outside the %zu already holding this extent can "
                    "lease %" PRIu64 " bytes (%u of %u donors live%s%s)",
                    avoid.size(), bytes, live, n, why.empty() ? "" : ": ", why.c_str());
}

Status PlacementSource::release(ServerId server, SlabId slab) {
  if (server >= donors()) {
    return make_error(Errc::kInvalidArgument, "placement: release on unknown donor %u", server);
  }
  Entry& e = *entries_[server];
  uint64_t g = e.d.source->lease_granularity();
  uint64_t l = e.leased.load(std::memory_order_relaxed);
  e.leased.store(l > g ? l - g : 0, std::memory_order_relaxed);
  if (e.failed.load(std::memory_order_acquire)) return ok_status();  // gone with the donor
  return e.d.source->release(server, slab);
}

void PlacementSource::on_failed(ServerId s) noexcept {
  if (s < donors()) entries_[s]->failed.store(true, std::memory_order_release);
}

void PlacementSource::probe(std::vector<ServerId>* failed) {
  const uint32_t n = donors();
  for (uint32_t i = 0; i < n; ++i) {
    Entry& e = *entries_[i];
    if (e.failed.load(std::memory_order_acquire) || !e.d.probe) continue;
    Status st = e.d.probe();
    if (!st.ok()) {
      FARMEM_LOG(kWarn,
                 "donor %s failed its health check (%s): marked failed, its replicas "
                 "are rebuilt on the other donors",
                 e.d.name.c_str(), st.to_string().c_str());
      e.failed.store(true, std::memory_order_release);
      failed->push_back(static_cast<ServerId>(i));
    }
  }
  Reconnect rc;
  std::chrono::milliseconds interval;
  {
    std::lock_guard<std::mutex> lk(mu_);
    rc = reconnect_;
    interval = reconnect_interval_;
  }
  if (!rc) return;
  const auto now = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < n; ++i) {
    Entry& e = *entries_[i];
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!e.failed.load(std::memory_order_acquire) || e.replaced || e.d.address.empty() ||
          now < e.next_try)
        continue;
      e.next_try = now + interval;
    }
    const ServerId id = static_cast<ServerId>(donors());
    if (id >= kMaxDonors) return;
    auto d = rc(e.d, id);
    if (!d.ok()) {
      FARMEM_LOG(kDebug, "donor %s still unreachable: %s", e.d.address.c_str(),
                 d.status().to_string().c_str());
      continue;
    }
    const bool restarted = d->instance_id != e.d.instance_id;
    const uint64_t new_instance = d->instance_id;
    if (d->address.empty()) d->address = e.d.address;
    ServerId got = 0;
    Status st = add_donor(std::move(*d), &got);
    if (!st.ok()) {
      FARMEM_LOG(kWarn, "donor %s: %s", e.d.address.c_str(), st.to_string().c_str());
      continue;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      e.replaced = true;
    }
    rejoins_.fetch_add(1, std::memory_order_relaxed);
    if (restarted) restarts_.fetch_add(1, std::memory_order_relaxed);
    FARMEM_LOG(
        kInfo,
        "donor %s is reachable again, %s (instance %016" PRIx64 " -> %016" PRIx64
        "): it joins as a new donor (#%u) for new replicas; its old slabs are never read",
        e.d.address.c_str(),
        restarted ? "restarted empty" : "same instance but our session and its leases are gone",
        e.d.instance_id, new_instance, got);
  }
}

}  // namespace farmem
