// Remote space of a pager region: block-sized "units" carved out of slabs
// leased lazily from a SlabSource, and the indirection unit -> (server,
// slab, offset) that the fault path reads without a lock.
//
//   farmem::LoopbackSlabSource src(/*server=*/0, &donor);
//   farmem::RemoteMap map(&src, &transport, /*unit_size=*/4096);
//   auto unit = map.alloc_unit();          // leases a slab on first use
//   farmem::RemoteAddr a = map.resolve(*unit);
//   map.free_unit(*unit);
//
// The SlabSource is the seam where a placement layer (several donors,
// striping, replicas) slots in later: it decides which server a lease comes
// from, and server_name() gives fatal errors a donor to name.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
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

class RemoteMap {
 public:
  static constexpr uint32_t kMaxSlabs = 1u << 16;

  // transport: add_slab() is called for each leased slab. Both outlive the map.
  RemoteMap(SlabSource* source, TransportControl* transport, uint32_t unit_size);
  ~RemoteMap();  // removes and releases every slab
  RemoteMap(const RemoteMap&) = delete;
  RemoteMap& operator=(const RemoteMap&) = delete;

  // Control path (evictor): a free unit, leasing a slab when none is left.
  Result<uint32_t> alloc_unit();
  void free_unit(uint32_t unit);

  // Data path: lock-free, no allocation. unit must have been allocated.
  RemoteAddr resolve(uint32_t unit) const noexcept;
  const char* server_name(ServerId s) const noexcept { return source_->server_name(s); }
  uint64_t assigned_bytes() const {
    return assigned_.load(std::memory_order_relaxed) * uint64_t{unit_size_};
  }

 private:
  struct Extent {
    uint32_t first_unit = 0;
    uint32_t units = 0;
    ServerId server = 0;
    SlabId slab = 0;
  };

  SlabSource* const source_;
  TransportControl* const transport_;
  const uint32_t unit_size_;
  // Append-only, published by count_ (release); readers binary-search the
  // prefix [0, count_).
  std::unique_ptr<Extent[]> extents_;
  std::atomic<uint32_t> count_{0};
  std::atomic<uint64_t> assigned_{0};

  std::mutex mu_;
  uint32_t total_units_ = 0;    // guarded by mu_
  uint32_t next_unit_ = 0;      // guarded by mu_
  std::vector<uint32_t> free_;  // guarded by mu_
};

}  // namespace farmem
