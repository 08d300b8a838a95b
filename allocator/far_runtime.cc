#include "allocator/far_runtime.h"

#include <unistd.h>

#include <cinttypes>
#include <type_traits>

#include "allocator/local_scope.h"
#include "pager/pager.h"
#include "pager/placement.h"
#include "pager/remote_map.h"
#include "runtime/auth.h"
#include "runtime/donor_client.h"
#include "runtime/log.h"
#include "runtime/loopback_transport.h"
#include "runtime/tcp_transport.h"
#if defined(FARMEM_HAVE_VERBS)
#include "runtime/verbs_lib.h"
#include "runtime/verbs_transport.h"
#endif

namespace farmem {
namespace {

// More replicas than donors cannot be placed: a clear start-up error.
Status check_replicas(uint32_t replicas, size_t donors, const char* what) {
  if (replicas < 1 || replicas > RemoteMap::kMaxReplicas) {
    return make_error(Errc::kInvalidArgument, "FARMEM_REPLICAS=%u: use 1, 2 or 3", replicas);
  }
  if (replicas > donors) {
    return make_error(Errc::kInvalidArgument,
                      "FARMEM_REPLICAS=%u needs %u donors, but %s %zu; add donors to "
                      "FARMEM_SERVERS or lower FARMEM_REPLICAS",
                      replicas, replicas, what, donors);
  }
  return ok_status();
}

uint64_t round_region(uint64_t bytes, uint32_t block) {
  uint64_t r = bytes / block * block;
  return r;
}

// Replication counters of a pager (FARMEM_REPLICAS > 1 only: nothing to
// say otherwise).
template <class P>
void fill_replication(const P* pager, StatsSnapshot& s) {
  if (!pager) return;
  const ReplicationStats r = pager->replication_stats();
  if (r.replicas <= 1) return;
  s.gauge("replicas", r.replicas, "copies of every written-back page (FARMEM_REPLICAS)");
  s.counter("donors_failed", r.donors_failed, "donors found dead (transport error or heartbeat)");
  s.gauge("extents_degraded", r.extents_degraded, "extents short of replicas right now");
  s.counter("extents_restored", r.extents_restored, "extents re-replicated after a failure");
  s.counter("bytes_restored", r.bytes_restored, "bytes copied by re-replication");
  s.counter("restore_ms", r.restore_ns / 1000000, "time spent re-replicating");
  s.counter("read_failovers", r.read_failovers, "READs retried on another replica");
  s.counter("extents_lost", r.extents_lost, "extents with no replica left (invariant 6)");
}

// FARMEM_DECAY_MS=0 means "at once, always": no budget gating then.
FarHeapOptions heap_options(const FarOptions& o) {
  FarHeapOptions ho;
  ho.dirty_decay_ms = o.decay_ms;
  ho.purge_at = o.decay_ms == 0 ? 0.0 : o.purge_at_percent / 100.0;
  ho.populate_max = o.populate_max;
  ho.thread_cache = o.thread_cache;
  ho.fine_classes = o.fine_classes;
  return ho;
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
//                      tcp; one info line says which and why.
//                      No device in /sys/class/infiniband:
//                      tcp without loading rdma-core at all
//                      (runtime/verbs_lib.h)
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
  // Cheap checks first: sysfs, then loading rdma-core (dlopen), so that a
  // host without RDMA never maps the libraries.
  if (!verbs_lib::device_present(&why) || !verbs_lib::load(&why)) {
    const std::string ep = o.servers.front().to_string();
    if (forced) {
      return make_error(Errc::kUnavailable,
                        "FARMEM_TRANSPORT=verbs, but no RDMA device reaches donor %s (%s); set "
                        "FARMEM_TRANSPORT=tcp (or auto) to use tcp",
                        ep.c_str(), why.c_str());
    }
    FARMEM_LOG(kInfo, "transport auto: tcp, since verbs cannot reach donor %s (%s)", ep.c_str(),
               why.c_str());
    return FarTransport::kTcp;
  }
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
    FARMEM_RETURN_IF_ERROR(
        check_replicas(opts_.replicas, opts_.servers.size(), "FARMEM_SERVERS names"));
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
    FARMEM_RETURN_IF_ERROR(
        check_replicas(opts_.replicas, sessions_.size(), "the donors reachable are"));
    token_ = token;
    // 2. transport
    auto t = SessionBackend<B>::make();
    if (!t.ok()) return t.status();
    transport_ = std::move(*t);
    for (size_t i = 0; i < sessions_.size(); ++i) {
      FARMEM_RETURN_IF_ERROR(transport_->add_server(static_cast<ServerId>(i), sessions_[i].get()));
    }
    // 3. slab source: one donor, one copy: that donor's source, exactly as
    // before placement existed. Otherwise placement over every donor
    // (pager/placement.h), with heartbeats as the health check and lost
    // donors reconnected as new identities.
    if (sessions_.size() == 1 && opts_.replicas == 1) {
      source_ = std::make_unique<DonorSessionSlabSource>(0, sessions_[0].get());
    } else {
      auto place = std::make_unique<PlacementSource>(opts_.replicas, random_u64());
      for (size_t i = 0; i < sessions_.size(); ++i) {
        ServerId id = 0;
        FARMEM_RETURN_IF_ERROR(
            place->add_donor(donor_of(sessions_[i].get(), static_cast<ServerId>(i)), &id));
      }
      place->set_reconnect(
          [this](const PlacementSource::Donor& lost, ServerId id) { return reconnect(lost, id); });
      // Every page is stored `replicas` times: the region gets that share
      // of the donors' capacity.
      capacity = capacity / opts_.replicas;
      place_ = place.get();
      source_ = std::move(place);
    }
    // 4. pager
    PagerConfig cfg;
    FARMEM_RETURN_IF_ERROR(start_pager_and_heap_common(opts_, capacity, &cfg));
    auto p = Pager<B>::create(cfg, transport_.get(), source_.get());
    if (!p.ok()) return p.status().with_context("starting the pager");
    pager_ = std::move(*p);
    // 5. far heap
    backing_ = std::make_unique<PagerBacking<Pager<B>>>(pager_.get(), SessionBackend<B>::kName);
    FarHeapOptions ho = heap_options(opts_);
    auto h = FarHeap::create(backing_.get(), ho);
    if (!h.ok()) return h.status();
    heap_ = std::move(*h);
    describe_ = std::string(SessionBackend<B>::kName) + ": ";
    for (size_t i = 0; i < sessions_.size(); ++i) {
      describe_ += (i ? ", " : "") + sessions_[i]->endpoint().to_string();
      donors_.push_back(sessions_[i]->endpoint().to_string());
    }
    if (opts_.replicas > 1) describe_ += "; " + std::to_string(opts_.replicas) + " replicas";
    describe_ += "; region " + format_size(cfg.region_size) + ", local budget " +
                 format_size(cfg.local_budget);
    return ok_status();
  }

 protected:
  void fill_placement_stats(StatsSnapshot& s) override {
    fill_replication(pager_.get(), s);
    if (place_) {
      s.gauge("donors_live", place_->live_donors(), "donors in use and not failed");
      s.counter("donor_rejoins", place_->rejoins(),
                "lost donors reachable again, joined as new identities");
      s.counter("donor_restarts", place_->restarts(),
                "of those, donors that came back with a new instance id (restarted empty)");
    }
  }

 private:
  PlacementSource::Donor donor_of(DonorSession* session, ServerId id) {
    PlacementSource::Donor d;
    d.source = std::make_unique<DonorSessionSlabSource>(id, session);
    d.capacity = session->welcome().capacity;
    d.instance_id = session->welcome().instance_id;
    d.address = session->endpoint().to_string();
    // A HEARTBEAT round trip: fails as soon as the control connection is
    // lost (a dead donor resets it) or the donor stops answering
    // (io_timeout_ms).
    d.probe = [session] { return session->heartbeat(); };
    return d;
  }

  // Runs on the re-replication thread (local memory: it was started inside
  // start()'s LocalScope). A new session, added to the transport as `id`.
  Result<PlacementSource::Donor> reconnect(const PlacementSource::Donor& lost, ServerId id) {
    auto eps = parse_endpoint_list(lost.address, "donor address", 7400);
    if (!eps.ok() || eps->size() != 1) return make_error(Errc::kInvalidArgument, "bad address");
    DonorClientOptions co;
    co.server = eps->front();
    co.token = token_;
    co.connect_timeout_ms = 500;
    auto s = DonorSession::connect(co);
    if (!s.ok()) return s.status();
    if (kIsVerbs<B> && !(*s)->serves_verbs()) {
      return make_error(Errc::kNotFound, "donor %s no longer serves verbs", lost.address.c_str());
    }
    FARMEM_RETURN_IF_ERROR(transport_->add_server(id, s->get()));
    DonorSession* raw = s->get();
    {
      std::lock_guard<std::mutex> lk(sessions_mu_);
      sessions_.push_back(std::move(*s));
    }
    return donor_of(raw, id);
  }

  std::string token_;
  PlacementSource* place_ = nullptr;  // source_, when placement is used
  std::mutex sessions_mu_;            // reconnect() appends while the pager runs
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
    donors_mem_.clear();
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
    FARMEM_RETURN_IF_ERROR(check_replicas(opts_.replicas, RemoteMap::kMaxReplicas, "at most"));
    transport_ = std::make_unique<LoopbackTransport>();
    // FARMEM_REPLICAS=N: N in-process donors of that capacity each.
    for (uint32_t i = 0; i < opts_.replicas; ++i) {
      donors_mem_.push_back(std::make_unique<LoopbackDonor>(cap, kSlab));
      FARMEM_RETURN_IF_ERROR(
          transport_->add_server(static_cast<ServerId>(i), donors_mem_.back().get()));
    }
    if (opts_.replicas == 1) {
      source_ = std::make_unique<LoopbackSlabSource>(0, donors_mem_[0].get());
    } else {
      auto place = std::make_unique<PlacementSource>(opts_.replicas, random_u64());
      for (uint32_t i = 0; i < opts_.replicas; ++i) {
        PlacementSource::Donor d;
        LoopbackDonor* ld = donors_mem_[i].get();
        d.source = std::make_unique<LoopbackSlabSource>(static_cast<ServerId>(i), ld);
        d.capacity = ld->capacity();
        d.probe = [ld] {
          return ld->dead() ? make_error(Errc::kUnavailable, "loopback donor killed") : ok_status();
        };
        ServerId id = 0;
        FARMEM_RETURN_IF_ERROR(place->add_donor(std::move(d), &id));
      }
      source_ = std::move(place);
    }
    PagerConfig cfg;
    FARMEM_RETURN_IF_ERROR(start_pager_and_heap_common(opts_, cap, &cfg));
    auto p = Pager<LoopbackTransport>::create(cfg, transport_.get(), source_.get());
    if (!p.ok()) return p.status().with_context("starting the pager");
    pager_ = std::move(*p);
    backing_ = std::make_unique<PagerBacking<Pager<LoopbackTransport>>>(pager_.get(), "loopback");
    FarHeapOptions ho = heap_options(opts_);
    auto h = FarHeap::create(backing_.get(), ho);
    if (!h.ok()) return h.status();
    heap_ = std::move(*h);
    for (uint32_t i = 0; i < opts_.replicas; ++i) donors_.push_back("loopback");
    describe_ = (opts_.replicas > 1 ? std::to_string(opts_.replicas) + " loopback donors of "
                                    : std::string("loopback donor of ")) +
                format_size(cap) + "; region " + format_size(cfg.region_size) + ", local budget " +
                format_size(cfg.local_budget);
    return ok_status();
  }

 protected:
  void fill_placement_stats(StatsSnapshot& s) override { fill_replication(pager_.get(), s); }

 private:
  std::vector<std::unique_ptr<LoopbackDonor>> donors_mem_;
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
  s.counter("faults_stale", p.faults_stale,
            "waits that ended with the page gone again: woken, not fetched (a thread still blocked "
            "faults anew)");
  s.counter("zero_around", p.zero_around,
            "never-written pages mapped ahead of a sequential zero fault (no fault of their own)");
  s.counter("zero_cleaned", p.zero_cleaned,
            "dirty pages found all-zero at eviction, dropped without a write");
  s.counter("zero_mapped", p.zero_mapped,
            "reads of never-written pages served by the shared zero page (no memory)");
  s.counter("zero_mapped_written", p.zero_mapped_written,
            "zero-page-mapped pages written later (given a page by a WP fault)");
  s.counter("evictions_clean", p.evictions_clean, "pages dropped without I/O");
  s.counter("evictions_dirty", p.evictions_dirty, "pages written back, then dropped");
  s.counter("prefetch_issued", p.prefetch_issued, "pages prefetched");
  s.counter("prefetch_used", p.prefetch_used, "prefetched pages used before eviction");
  s.counter("prefetch_unused", p.prefetch_unused, "prefetched pages dropped unused");
  s.counter("hot_marked", p.hot_marked,
            "pages seen in use by a victim-cache hit (kept mapped FARMEM_HOT_LAPS more laps)");
  s.counter("refaults_hot", p.refaults_hot,
            "pages fetched back less than a budget's worth of evictions after they left");
  s.counter("hot_passes", p.hot_passes, "passes of the resident list's tail without a demotion");
  s.counter(
      "evicted_behind", p.evicted_behind,
      "pages evicted from behind a sequential stream instead of the oldest (FARMEM_EVICT_BEHIND)");
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
  fill_placement_stats(s);
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
