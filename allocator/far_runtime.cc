#include "allocator/far_runtime.h"

#include <cinttypes>

#include "allocator/local_scope.h"
#include "pager/pager.h"
#include "pager/remote_map.h"
#include "runtime/auth.h"
#include "runtime/donor_client.h"
#include "runtime/log.h"
#include "runtime/loopback_transport.h"
#include "runtime/tcp_transport.h"

namespace farmem {
namespace {

// Several donors behind the pager's one SlabSource: leases rotate over the
// donors (a failed or full donor is skipped); ServerId i is donor i.
class MultiSlabSource final : public SlabSource {
 public:
  explicit MultiSlabSource(std::vector<std::unique_ptr<SlabSource>> s) : s_(std::move(s)) {}
  Result<std::vector<Slab>> lease(uint64_t bytes) override {
    Status last = make_error(Errc::kResourceExhausted, "no donor configured");
    for (size_t k = 0; k < s_.size(); ++k) {
      size_t i = (next_ + k) % s_.size();
      auto r = s_[i]->lease(bytes);
      if (r.ok()) {
        next_ = (i + 1) % s_.size();
        return r;
      }
      last = r.status();
    }
    return last;
  }
  Status release(ServerId server, SlabId slab) override {
    if (server >= s_.size()) return make_error(Errc::kInvalidArgument, "unknown server %u", server);
    return s_[server]->release(server, slab);
  }
  const char* server_name(ServerId server) const noexcept override {
    return server < s_.size() ? s_[server]->server_name(server) : "unknown donor";
  }
  uint64_t lease_granularity() const override { return s_[0]->lease_granularity(); }

 private:
  std::vector<std::unique_ptr<SlabSource>> s_;
  size_t next_ = 0;  // lease() runs on the evictor only
};

uint64_t round_region(uint64_t bytes, uint32_t block) {
  uint64_t r = bytes / block * block;
  return r;
}

Status start_pager_and_heap_common(const FarOptions& o, uint64_t region, PagerConfig* cfg) {
  *cfg = o.pager;
  cfg->region_size = round_region(o.region_size ? o.region_size : region, o.pager.block_size);
  if (cfg->region_size == 0) {
    return make_error(Errc::kInvalidArgument,
                      "far region of 0 bytes: the donors lend nothing; check their --capacity");
  }
  if (cfg->local_budget > cfg->region_size) cfg->local_budget = cfg->region_size;
  return cfg->validate();
}

// ---- tcp ---------------------------------------------------------------------

class TcpRuntime final : public FarRuntime {
 public:
  explicit TcpRuntime(const FarOptions& o) : FarRuntime(o) {}
  ~TcpRuntime() override {
    LocalScope local;
    heap_.reset();  // 5
    backing_.reset();
    pager_.reset();      // 4
    source_.reset();     // 3
    transport_.reset();  // 2
    sessions_.clear();   // 1
  }
  FarHeap& heap() override { return *heap_; }
  FarBacking& backing() override { return *backing_; }

  Status start() {
    // 1. donors
    std::string token;
    if (!opts_.token_file.empty()) {
      auto t = read_token_file(opts_.token_file);
      if (!t.ok()) return t.status().with_context("FARMEM_TOKEN_FILE");
      token = std::move(*t);
    }
    if (opts_.servers.empty()) {
      return make_error(Errc::kUnavailable,
                        "no donor configured: set FARMEM_SERVERS=HOST:PORT (a farmemd), or "
                        "FARMEM_TRANSPORT=loopback for an in-process donor");
    }
    uint64_t capacity = 0;
    std::string failures;
    for (const Endpoint& ep : opts_.servers) {
      DonorClientOptions co;
      co.server = ep;
      co.token = token;
      co.connect_timeout_ms = opts_.connect_timeout_ms;
      auto s = DonorSession::connect(co);
      if (!s.ok()) {
        failures += (failures.empty() ? "" : "; ") + ep.to_string() + ": " + s.status().to_string();
        if (s.status().code() == Errc::kUnauthenticated) {
          return make_error(Errc::kUnauthenticated,
                            "donor %s refused our token (%s); check FARMEM_TOKEN_FILE matches "
                            "the donor's --token-file",
                            ep.to_string().c_str(), s.status().message().c_str());
        }
        continue;
      }
      capacity += (*s)->welcome().capacity;
      sessions_.push_back(std::move(*s));
    }
    if (sessions_.empty()) {
      return make_error(Errc::kUnavailable, "no donor could be reached (%s)", failures.c_str());
    }
    if (!failures.empty()) FARMEM_LOG(kWarn, "some donors unreachable: %s", failures.c_str());
    // 2. transport
    transport_ = std::make_unique<TcpTransport>();
    std::vector<std::unique_ptr<SlabSource>> srcs;
    for (size_t i = 0; i < sessions_.size(); ++i) {
      FARMEM_RETURN_IF_ERROR(transport_->add_server(static_cast<ServerId>(i), sessions_[i].get()));
      srcs.push_back(
          std::make_unique<DonorSessionSlabSource>(static_cast<ServerId>(i), sessions_[i].get()));
    }
    // 3. slab source
    if (srcs.size() == 1) {
      source_ = std::move(srcs[0]);
    } else {
      source_ = std::make_unique<MultiSlabSource>(std::move(srcs));
    }
    // 4. pager
    PagerConfig cfg;
    FARMEM_RETURN_IF_ERROR(start_pager_and_heap_common(opts_, capacity, &cfg));
    auto p = Pager<TcpTransport>::create(cfg, transport_.get(), source_.get());
    if (!p.ok()) return p.status().with_context("starting the pager");
    pager_ = std::move(*p);
    // 5. far heap
    backing_ = std::make_unique<PagerBacking<Pager<TcpTransport>>>(pager_.get(), "tcp");
    FarHeapOptions ho;
    ho.dirty_decay_ms = opts_.decay_ms;
    auto h = FarHeap::create(backing_.get(), ho);
    if (!h.ok()) return h.status();
    heap_ = std::move(*h);
    describe_ = "tcp: ";
    for (size_t i = 0; i < sessions_.size(); ++i) {
      describe_ += (i ? ", " : "") + sessions_[i]->endpoint().to_string();
    }
    describe_ += "; region " + format_size(cfg.region_size) + ", local budget " +
                 format_size(cfg.local_budget);
    return ok_status();
  }

 private:
  std::vector<std::unique_ptr<DonorSession>> sessions_;
  std::unique_ptr<TcpTransport> transport_;
  std::unique_ptr<SlabSource> source_;
  std::unique_ptr<Pager<TcpTransport>> pager_;
  std::unique_ptr<FarBacking> backing_;
  std::unique_ptr<FarHeap> heap_;
};

// ---- loopback ----------------------------------------------------------------

class LoopbackRuntime final : public FarRuntime {
 public:
  explicit LoopbackRuntime(const FarOptions& o) : FarRuntime(o) {}
  ~LoopbackRuntime() override {
    LocalScope local;
    heap_.reset();
    backing_.reset();
    pager_.reset();
    source_.reset();
    transport_.reset();
    donor_.reset();
  }
  FarHeap& heap() override { return *heap_; }
  FarBacking& backing() override { return *backing_; }

  Status start() {
    constexpr uint64_t kSlab = 16ull << 20;
    uint64_t cap = opts_.loopback_capacity / kSlab * kSlab;
    if (cap == 0) {
      return make_error(Errc::kInvalidArgument,
                        "loopback donor capacity %" PRIu64 " is below one 16 MiB slab",
                        opts_.loopback_capacity);
    }
    donor_ = std::make_unique<LoopbackDonor>(cap, kSlab);
    transport_ = std::make_unique<LoopbackTransport>();
    FARMEM_RETURN_IF_ERROR(transport_->add_server(0, donor_.get()));
    source_ = std::make_unique<LoopbackSlabSource>(0, donor_.get());
    PagerConfig cfg;
    FARMEM_RETURN_IF_ERROR(start_pager_and_heap_common(opts_, cap, &cfg));
    auto p = Pager<LoopbackTransport>::create(cfg, transport_.get(), source_.get());
    if (!p.ok()) return p.status().with_context("starting the pager");
    pager_ = std::move(*p);
    backing_ = std::make_unique<PagerBacking<Pager<LoopbackTransport>>>(pager_.get(), "loopback");
    FarHeapOptions ho;
    ho.dirty_decay_ms = opts_.decay_ms;
    auto h = FarHeap::create(backing_.get(), ho);
    if (!h.ok()) return h.status();
    heap_ = std::move(*h);
    describe_ = "loopback donor of " + format_size(cap) + "; region " +
                format_size(cfg.region_size) + ", local budget " + format_size(cfg.local_budget);
    return ok_status();
  }

 private:
  std::unique_ptr<LoopbackDonor> donor_;
  std::unique_ptr<LoopbackTransport> transport_;
  std::unique_ptr<SlabSource> source_;
  std::unique_ptr<Pager<LoopbackTransport>> pager_;
  std::unique_ptr<FarBacking> backing_;
  std::unique_ptr<FarHeap> heap_;
};

}  // namespace

Result<std::unique_ptr<FarRuntime>> FarRuntime::start(const FarOptions& o) {
  LocalScope local;
  if (o.transport == FarTransport::kLoopback) {
    auto rt = std::make_unique<LoopbackRuntime>(o);
    FARMEM_RETURN_IF_ERROR(rt->start());
    return std::unique_ptr<FarRuntime>(std::move(rt));
  }
  auto rt = std::make_unique<TcpRuntime>(o);
  FARMEM_RETURN_IF_ERROR(rt->start());
  return std::unique_ptr<FarRuntime>(std::move(rt));
}

}  // namespace farmem
