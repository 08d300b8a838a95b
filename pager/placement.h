// Placement of far memory over several donors: the SlabSource the pager's
// RemoteMap leases from when FARMEM_SERVERS names more than one donor or
// FARMEM_REPLICAS > 1.
//
//   farmem::PlacementSource place(/*replicas=*/2);
//   for (int i = 0; i < 3; ++i) {
//     farmem::PlacementSource::Donor d;
//     d.source = std::make_unique<farmem::LoopbackSlabSource>(i, &donors[i]);
//     d.capacity = donors[i].capacity();
//     d.probe = [&, i] { return donors[i].dead() ? farmem::make_error(...) : farmem::ok_status();
//     }; ServerId id; (void)place.add_donor(std::move(d), &id);     // id == i: ServerId is the
//     donor's index
//   }
//   auto pager = Pager<LoopbackTransport>::create(cfg, &transport, &place);
//
// Choices:
//  * Which donor a slab comes from: power of two choices on free capacity
//    (capacity minus what this process leased there): two live candidates
//    picked at random, the one with more room wins. Cheap, needs no global
//    view, and keeps donors within a slab or two of each other.
//  * Replicas of one extent are always on distinct donors (RemoteMap passes
//    the donors already holding a copy in `avoid`); a stripe group's
//    primaries avoid each other when possible (`prefer_not`).
//  * stripe_width(): the live donors, so that consecutive units land on
//    different donors.
//
// Donor identity. A donor index (ServerId) is never reused. A donor found
// failed (transport error, failed heartbeat) stays failed for good: its
// slabs are never read again. When a reconnect hook is set, probe() tries
// the lost donor's address again every reconnect_interval; whatever answers
// joins as a NEW donor (a new ServerId, new sessions, no old slabs) and may
// take new replicas. The hook reports the instance id the donor sent in its
// WELCOME: a different one means the donor restarted (empty), counted in
// restarts(); the same one means only our session was lost, and with it the
// session's leases (the donor drops them), so it is a new identity too.
//
// Thread safety: lease/release/probe run on control-path threads (evictor,
// replicator) under mu_; server_name() and on_failed() are lock-free (the
// donor table is append-only, published by a count).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "pager/remote_map.h"

namespace farmem {

class PlacementSource final : public SlabSource {
 public:
  static constexpr uint32_t kMaxDonors = 64;

  struct Donor {
    std::unique_ptr<SlabSource> source;  // one donor's slabs (Loopback-/DonorSessionSlabSource)
    uint64_t capacity = 0;               // bytes it lends
    uint64_t instance_id = 0;            // from WELCOME; 0 when unknown (loopback)
    std::string name;                    // empty: source->server_name()
    // Health check on the control path (a HEARTBEAT round trip); empty:
    // always healthy. Non-OK marks the donor failed.
    std::function<Status()> probe;
    // Set by the reconnect hook's caller: the address to try again.
    std::string address;
  };
  // Connects to `lost.address` again as donor `id`: a new session, added to
  // the transport under `id`. Returns the new donor (its instance_id set).
  using Reconnect = std::function<Result<Donor>(const Donor& lost, ServerId id)>;

  explicit PlacementSource(uint32_t replicas, uint64_t seed = 0x5eed);
  ~PlacementSource() override;

  // kResourceExhausted past kMaxDonors. *id is the donor's ServerId (its index).
  Status add_donor(Donor d, ServerId* id);
  void set_reconnect(Reconnect r, std::chrono::milliseconds interval = std::chrono::seconds(1));

  // SlabSource.
  Result<std::vector<Slab>> lease(uint64_t bytes) override;
  Status release(ServerId server, SlabId slab) override;
  const char* server_name(ServerId server) const noexcept override;
  uint64_t lease_granularity() const override;
  uint32_t replicas() const override { return replicas_; }
  uint32_t stripe_width() const override;
  Result<Slab> lease_one(uint64_t bytes, std::span<const ServerId> avoid,
                         std::span<const ServerId> prefer_not) override;
  void on_failed(ServerId s) noexcept override;
  void probe(std::vector<ServerId>* failed) override;

  uint32_t donors() const { return count_.load(std::memory_order_acquire); }
  uint32_t live_donors() const;
  bool failed(ServerId s) const noexcept;
  uint64_t instance_id(ServerId s) const;
  uint64_t leased_bytes(ServerId s) const;
  // Donors that came back with a different instance id (restarted empty).
  uint64_t restarts() const { return restarts_.load(std::memory_order_relaxed); }
  // Donors that came back at all (any instance id), as new identities.
  uint64_t rejoins() const { return rejoins_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    Donor d;
    std::atomic<bool> failed{false};
    std::atomic<uint64_t> leased{0};
    bool replaced = false;  // guarded by mu_: a reconnect already took its place
    std::chrono::steady_clock::time_point next_try{};  // guarded by mu_
  };

  const uint32_t replicas_;
  std::unique_ptr<Entry> entries_[kMaxDonors];
  std::atomic<uint32_t> count_{0};
  std::atomic<uint64_t> restarts_{0}, rejoins_{0};

  std::mutex mu_;
  std::mt19937_64 rng_;  // guarded by mu_
  Reconnect reconnect_;  // guarded by mu_
  std::chrono::milliseconds reconnect_interval_{1000};
};

}  // namespace farmem
