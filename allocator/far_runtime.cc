#include "allocator/far_runtime.h"

#include <unistd.h>

#include <cinttypes>
#include <type_traits>

#include "allocator/local_scope.h"
#include "pager/pager.h"
#include "pager/remote_map.h"
#include "runtime/auth.h"
#include "runtime/donor_client.h"
#include "runtime/log.h"
#include "runtime/loopback_transport.h"
#include "runtime/tcp_transport.h"
#if defined(FARMEM_HAVE_VERBS)
#include "runtime/verbs_transport.h"
#endif

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

#if defined(FARMEM_HAVE_VERBS)
template <class B>
inline constexpr bool kIsVerbs = std::is_same_v<B, VerbsTransport>;
#else
template <class B>
inline constexpr bool kIsVerbs = false;
#endif

// ---- transport selection -----------------------------------------------------

// FARMEM_TRANSPORT: auto, tcp and verbs all reach farmemd donors; they
// differ in the data path only (the control connection is tcp always).
//
//   FARMEM_TRANSPORT   built with rdma-core                  without
//   ----------------   -----------------------------------   -----------------
//   auto (default)     verbs when an RDMA device reaches     tcp
//                      every donor (verbs::reachable), else
//                      tcp; one info line says which and why
//   verbs              verbs, or a start-up error naming     start-up error
//                      the reason and FARMEM_TRANSPORT=tcp   ("built without
//                                                            rdma-core")
//   tcp                tcp                                   tcp
Result<FarTransport> choose_transport(const FarOptions& o) {
  if (o.transport == FarTransport::kTcp || o.transport == FarTransport::kLoopback) {
    return o.transport;
  }
  const bool forced = o.transport == FarTransport::kVerbs;
#if defined(FARMEM_HAVE_VERBS)
  if (o.servers.empty()) return FarTransport::kTcp;  // the tcp runtime reports "no donor"
  std::string why;
  for (const Endpoint& ep : o.servers) {
    if (verbs::reachable(ep.host, &why)) continue;
    if (forced) {
      return make_error(Errc::kUnavailable,
                        "FARMEM_TRANSPORT=verbs, but no RDMA device reaches donor %s (%s); set "
                        "FARMEM_TRANSPORT=tcp (or auto) to use tcp",
                        ep.to_string().c_str(), why.c_str());
    }
    FARMEM_LOG(kInfo, "transport auto: tcp, since verbs cannot reach donor %s (%s)",
               ep.to_string().c_str(), why.c_str());
    return FarTransport::kTcp;
  }
  if (!forced) FARMEM_LOG(kInfo, "transport auto: verbs (%s)", why.c_str());
  return FarTransport::kVerbs;
#else
  if (forced) {
    return make_error(Errc::kUnavailable,
                      "FARMEM_TRANSPORT=verbs, but this farmem was built without rdma-core "
                      "(libibverbs-dev, librdmacm-dev); set FARMEM_TRANSPORT=tcp (or auto), or "
                      "rebuild with rdma-core installed");
  }
  FARMEM_LOG(kInfo, "transport auto: tcp (this farmem was built without rdma-core)");
  return FarTransport::kTcp;
#endif
}

// The data-path backends over DonorSessions: how each is made.
template <class B>
struct SessionBackend;
template <>
struct SessionBackend<TcpTransport> {
  static constexpr const char* kName = "tcp";
  static Result<std::unique_ptr<TcpTransport>> make() { return std::make_unique<TcpTransport>(); }
};
#if defined(FARMEM_HAVE_VERBS)
template <>
struct SessionBackend<VerbsTransport> {
  static constexpr const char* kName = "verbs";
  static Result<std::unique_ptr<VerbsTransport>> make() {
    auto t = VerbsTransport::create();
    if (!t.ok()) return t.status().with_context("FARMEM_TRANSPORT=verbs (or auto)");
    return std::move(*t);
  }
};
#endif

// ---- tcp and verbs -----------------------------------------------------------

template <class B>
class SessionRuntime final : public FarRuntime {
 public:
  explicit SessionRuntime(const FarOptions& o) : FarRuntime(o) {}
  ~SessionRuntime() override {
    LocalScope local;
    stop_stats_socket();  // 6
    heap_.reset();        // 5
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
      if (kIsVerbs<B> && !(*s)->serves_verbs()) {
        return make_error(Errc::kNotFound,
                          "donor %s does not serve verbs (it runs with --transport tcp or has no "
                          "RDMA device); set FARMEM_TRANSPORT=tcp",
                          ep.to_string().c_str());
      }
      capacity += (*s)->welcome().capacity;
      sessions_.push_back(std::move(*s));
    }
    if (sessions_.empty()) {
      return make_error(Errc::kUnavailable, "no donor could be reached (%s)", failures.c_str());
    }
    if (!failures.empty()) FARMEM_LOG(kWarn, "some donors unreachable: %s", failures.c_str());
    // 2. transport
    auto t = SessionBackend<B>::make();
    if (!t.ok()) return t.status();
    transport_ = std::move(*t);
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
    auto p = Pager<B>::create(cfg, transport_.get(), source_.get());
    if (!p.ok()) return p.status().with_context("starting the pager");
    pager_ = std::move(*p);
    // 5. far heap
    backing_ = std::make_unique<PagerBacking<Pager<B>>>(pager_.get(), SessionBackend<B>::kName);
    FarHeapOptions ho;
    ho.dirty_decay_ms = opts_.decay_ms;
    auto h = FarHeap::create(backing_.get(), ho);
    if (!h.ok()) return h.status();
    heap_ = std::move(*h);
    describe_ = std::string(SessionBackend<B>::kName) + ": ";
    for (size_t i = 0; i < sessions_.size(); ++i) {
      describe_ += (i ? ", " : "") + sessions_[i]->endpoint().to_string();
      donors_.push_back(sessions_[i]->endpoint().to_string());
    }
    describe_ += "; region " + format_size(cfg.region_size) + ", local budget " +
                 format_size(cfg.local_budget);
    return ok_status();
  }

 private:
  std::vector<std::unique_ptr<DonorSession>> sessions_;
  std::unique_ptr<B> transport_;
  std::unique_ptr<SlabSource> source_;
  std::unique_ptr<Pager<B>> pager_;
  std::unique_ptr<FarBacking> backing_;
  std::unique_ptr<FarHeap> heap_;
};

// ---- loopback ----------------------------------------------------------------

class LoopbackRuntime final : public FarRuntime {
 public:
  explicit LoopbackRuntime(const FarOptions& o) : FarRuntime(o) {}
  ~LoopbackRuntime() override {
    LocalScope local;
    stop_stats_socket();
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
    donors_.push_back("loopback");
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

void FarRuntime::start_stats_socket() {
  StatsSocketOptions so;
  // The server thread allocates (the snapshot text): local memory only,
  // from its first instruction (invariant 3).
  so.thread_init = [] { ++t_local_depth; };
  auto s = StatsSocket::start([this](StatsSnapshot& snap) { fill_stats(snap); }, std::move(so));
  if (!s.ok()) {
    FARMEM_LOG(kWarn,
               "far memory runs without its stats socket, so `farmemctl stats %d` cannot read "
               "this process: %s (set FARMEM_STATS_SOCKET=0 to not try)",
               static_cast<int>(getpid()), s.status().to_string().c_str());
    return;
  }
  stats_socket_ = std::move(*s);
}

void FarRuntime::stop_stats_socket() {
  LocalScope local;
  if (stats_socket_) stats_socket_->stop();
}

void FarRuntime::fill_stats(StatsSnapshot& s) {
  LocalScope local;
  const PagerStats p = backing().stats();
  const FarHeap::Stats h = heap().stats();
  s.counter("faults_zero", p.faults_zero, "first touch of a never-written page (no I/O)");
  s.counter("faults_remote", p.faults_remote, "page fetched from a donor (demand READ)");
  s.counter("faults_wp", p.faults_wp, "first write to a clean resident page");
  s.counter("faults_victim", p.faults_victim, "page found in the local victim cache (no I/O)");
  s.counter("faults_waited", p.faults_waited, "faults that waited for I/O or for budget");
  s.counter("evictions_clean", p.evictions_clean, "pages dropped without I/O");
  s.counter("evictions_dirty", p.evictions_dirty, "pages written back, then dropped");
  s.counter("prefetch_issued", p.prefetch_issued, "pages prefetched");
  s.counter("prefetch_used", p.prefetch_used, "prefetched pages used before eviction");
  s.counter("prefetch_unused", p.prefetch_unused, "prefetched pages dropped unused");
  s.counter("bytes_read", p.bytes_read, "bytes read from donors");
  s.counter("bytes_written", p.bytes_written, "bytes written to donors");
  s.gauge("resident_bytes", p.resident_bytes, "far memory resident in this process now");
  s.gauge("resident_peak_bytes", p.resident_peak_bytes, "highest resident_bytes");
  s.gauge("budget_bytes", p.budget_bytes, "local budget for far memory");
  s.gauge("remote_bytes", p.remote_bytes, "remote space holding written-back pages");
  s.gauge("pinned_bytes", p.pinned_bytes, "far memory pinned resident (fm_pin)");
  s.gauge("far_allocated_bytes", h.allocated, "bytes in live far allocations");
  // LatencyHistogram bucket i holds [2^(i-1), 2^i) us: exclusive bound 2^i,
  // and the last bucket is open.
  std::vector<StatsBucket> b(LatencyHistogram::kBuckets);
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    b[static_cast<size_t>(i)].le =
        i + 1 < LatencyHistogram::kBuckets ? uint64_t{1} << i : StatsBucket::kInf;
    b[static_cast<size_t>(i)].count = p.fetch_latency.counts[static_cast<size_t>(i)];
  }
  s.histogram("fetch_latency_us", std::move(b), "demand fetch latency: READ post to installed");
  // Per-donor traffic: the pager counts bytes per process, not per donor,
  // so the split is exact with one donor only (the usual case); with
  // several the totals above are all there is.
  if (donors_.size() == 1) {
    const std::string label = "donor=" + donors_[0];
    s.counter("donor_read_bytes", p.bytes_read, "bytes read from this donor", label);
    s.counter("donor_written_bytes", p.bytes_written, "bytes written to this donor", label);
  }
}

namespace {
template <class R>
Result<std::unique_ptr<FarRuntime>> start_runtime(const FarOptions& o) {
  auto rt = std::make_unique<R>(o);
  FARMEM_RETURN_IF_ERROR(rt->start());
  return std::unique_ptr<FarRuntime>(std::move(rt));
}
}  // namespace

Result<std::unique_ptr<FarRuntime>> FarRuntime::start(const FarOptions& o) {
  LocalScope local;
  auto chosen = choose_transport(o);
  if (!chosen.ok()) return chosen.status();
  Result<std::unique_ptr<FarRuntime>> rt = [&] {
    switch (*chosen) {
      case FarTransport::kLoopback:
        return start_runtime<LoopbackRuntime>(o);
#if defined(FARMEM_HAVE_VERBS)
      case FarTransport::kVerbs: {
        auto v = start_runtime<SessionRuntime<VerbsTransport>>(o);
        // auto: a donor that does not serve verbs (kNotFound) means tcp.
        if (!v.ok() && v.status().code() == Errc::kNotFound && o.transport == FarTransport::kAuto) {
          FARMEM_LOG(kInfo, "transport auto: tcp, since %s", v.status().message().c_str());
          return start_runtime<SessionRuntime<TcpTransport>>(o);
        }
        return v;
      }
#endif
      default:
        return start_runtime<SessionRuntime<TcpTransport>>(o);
    }
  }();
  if (rt.ok() && o.stats_socket) (*rt)->start_stats_socket();
  return rt;
}

}  // namespace farmem
