#include "runtime/verbs_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>

#include "runtime/auth.h"
#include "runtime/log.h"

namespace farmem {

namespace verbs {
namespace {

using Clock = std::chrono::steady_clock;

Status errno_status(const char* what, int err) {
  return make_error(Errc::kIo, "%s failed: %s (errno %d)", what, std::strerror(err), err);
}

Status set_nonblocking(int fd, const char* what) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return errno_status(what, errno);
  return ok_status();
}

// Fills `out` with the first IPv4/IPv6 address of host:port.
Status resolve_host(const std::string& host, uint16_t port, sockaddr_storage* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    return make_error(Errc::kInvalidArgument, "cannot resolve '%s': %s", host.c_str(),
                      gai_strerror(rc));
  std::memcpy(out, res->ai_addr, std::min<size_t>(res->ai_addrlen, sizeof(*out)));
  freeaddrinfo(res);
  return ok_status();
}

struct ChannelAndId {
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  ~ChannelAndId() {
    if (id != nullptr) rdma_destroy_id(id);
    if (ch != nullptr) rdma_destroy_event_channel(ch);
  }
};

// rdma_cm address resolution: which device reaches host:port.
Status resolve_route(ChannelAndId& c, const std::string& host, uint16_t port, int timeout_ms,
                     bool route) {
  sockaddr_storage dst{};
  FARMEM_RETURN_IF_ERROR(resolve_host(host, port, &dst));
  c.ch = rdma_create_event_channel();
  if (c.ch == nullptr)
    return errno_status("rdma_create_event_channel (is the rdma_ucm module loaded?)", errno);
  FARMEM_RETURN_IF_ERROR(set_nonblocking(c.ch->fd, "fcntl(O_NONBLOCK) on the rdma_cm channel"));
  if (rdma_create_id(c.ch, &c.id, nullptr, RDMA_PS_TCP) != 0)
    return errno_status("rdma_create_id", errno);
  if (rdma_resolve_addr(c.id, nullptr, reinterpret_cast<sockaddr*>(&dst), timeout_ms) != 0)
    return errno_status("rdma_resolve_addr", errno);
  auto ev = wait_cm_event(c.ch, RDMA_CM_EVENT_ADDR_RESOLVED, timeout_ms + 1000);
  if (!ev.ok()) return ev.status();
  rdma_ack_cm_event(*ev);
  if (c.id->verbs == nullptr)
    return make_error(Errc::kUnavailable, "%s resolves to no RDMA device", host.c_str());
  if (!route) return ok_status();
  if (rdma_resolve_route(c.id, timeout_ms) != 0) return errno_status("rdma_resolve_route", errno);
  ev = wait_cm_event(c.ch, RDMA_CM_EVENT_ROUTE_RESOLVED, timeout_ms + 1000);
  if (!ev.ok()) return ev.status();
  rdma_ack_cm_event(*ev);
  return ok_status();
}

}  // namespace

void encode_connect(const ConnectData& d, uint8_t out[kConnectDataSize]) noexcept {
  std::memset(out, 0, kConnectDataSize);
  wire::put_u32(out, kConnMagic);
  wire::put_u16(out + 4, kConnVersion);
  wire::put_u64(out + 8, d.session_id);
  wire::put_u64(out + 16, d.nonce);
  std::memcpy(out + 24, d.mac.data(), wire::kMacSize);
}

Status decode_connect(const void* p, size_t len, ConnectData* d) {
  if (p == nullptr || len < kConnectDataSize)
    return make_error(Errc::kProtocol,
                      "verbs connect request carries %zu bytes of private data, need %zu", len,
                      kConnectDataSize);
  const auto* b = static_cast<const uint8_t*>(p);
  if (wire::get_u32(b) != kConnMagic)
    return make_error(Errc::kProtocol, "verbs connect request: bad magic 0x%08x", wire::get_u32(b));
  if (wire::get_u16(b + 4) != kConnVersion)
    return make_error(Errc::kVersionMismatch,
                      "verbs connect request: version %u, this donor speaks %u",
                      wire::get_u16(b + 4), kConnVersion);
  d->session_id = wire::get_u64(b + 8);
  d->nonce = wire::get_u64(b + 16);
  std::memcpy(d->mac.data(), b + 24, wire::kMacSize);
  return ok_status();
}

std::array<uint8_t, wire::kMacSize> connect_mac(std::span<const uint8_t> secret,
                                                uint64_t session_id, uint64_t nonce) {
  // Domain-separated from the tcp ATTACH: there the 32 bytes are the donor's
  // random nonce, here they start with a fixed label nobody's nonce equals.
  std::array<uint8_t, wire::kNonceSize> msg{};
  static constexpr char kLabel[16] = "farmem-verbs-v1";  // 15 chars + NUL
  std::memcpy(msg.data(), kLabel, 16);
  wire::put_u64(msg.data() + 16, session_id);
  wire::put_u64(msg.data() + 24, nonce);
  return attach_mac(secret, msg);
}

void encode_accept(uint64_t instance_id, uint8_t out[kAcceptDataSize]) noexcept {
  std::memset(out, 0, kAcceptDataSize);
  wire::put_u32(out, kConnMagic);
  wire::put_u16(out + 4, kConnVersion);
  wire::put_u64(out + 8, instance_id);
}

void encode_reject(Errc code, uint8_t out[kRejectDataSize]) noexcept {
  std::memset(out, 0, kRejectDataSize);
  wire::put_u32(out, kConnMagic);
  wire::put_u16(out + 4, kConnVersion);
  wire::put_u16(out + 6, static_cast<uint16_t>(code));
}

Errc decode_reject(const void* p, size_t len) noexcept {
  if (p == nullptr || len < kRejectDataSize) return Errc::kUnavailable;
  const auto* b = static_cast<const uint8_t*>(p);
  if (wire::get_u32(b) != kConnMagic) return Errc::kUnavailable;
  const uint16_t code = wire::get_u16(b + 6);
  if (code == 0 || code > static_cast<uint16_t>(Errc::kCancelled)) return Errc::kUnavailable;
  return static_cast<Errc>(code);
}

Result<rdma_cm_event*> wait_cm_event(rdma_event_channel* ch, rdma_cm_event_type want,
                                     int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) {
      if (ev->event == want) return ev;
      Status st =
          make_error(ev->event == RDMA_CM_EVENT_REJECTED ? Errc::kUnavailable : Errc::kProtocol,
                     "expected rdma_cm event %s, got %s (status %d)", rdma_event_str(want),
                     rdma_event_str(ev->event), ev->status);
      rdma_ack_cm_event(ev);
      return st;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("rdma_get_cm_event", errno);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0)
      return make_error(Errc::kTimeout, "no rdma_cm event %s within %d ms", rdma_event_str(want),
                        timeout_ms);
    pollfd pfd{ch->fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left)) < 0 && errno != EINTR)
      return errno_status("poll on the rdma_cm channel", errno);
  }
}

bool reachable(const std::string& host, std::string* why) {
  int n = 0;
  ibv_context** devs = rdma_get_devices(&n);
  if (devs != nullptr) rdma_free_devices(devs);
  if (n == 0) {
    if (why) *why = "no RDMA device on this host";
    return false;
  }
  ChannelAndId c;
  Status st = resolve_route(c, host, 0, 2000, /*route=*/false);
  if (!st.ok()) {
    if (why) *why = st.to_string();
    return false;
  }
  if (why)
    *why =
        std::string("RDMA device ") + ibv_get_device_name(c.id->verbs->device) + " reaches " + host;
  return true;
}

}  // namespace verbs

// ---- VerbsTransport ---------------------------------------------------------

namespace {

constexpr size_t kDefaultDepth = VerbsTransportOptions{}.depth;
// The CQ holds, per queue, the CQEs of every op in flight plus the flushed
// ones of a QP being torn down: twice the depth, plus slack.
constexpr size_t cq_entries(size_t depth) {
  return 2 * depth + 16;
}
static_assert(cq_entries(kDefaultDepth) <= 32767, "default CQ must fit rxe's max_cqe");
static_assert(kDefaultDepth <= 1u << 16, "default send queue must fit common max_qp_wr");

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

Errc map_wc_status(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS:
      return Errc::kOk;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
      return Errc::kPermissionDenied;
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_REM_ABORT_ERR:
    case IBV_WC_FATAL_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
      return Errc::kUnavailable;
    default:
      return Errc::kIo;
  }
}

}  // namespace

const VerbsTransport::Server* VerbsTransport::Tables::find_server(ServerId id) const {
  auto it = std::lower_bound(servers.begin(), servers.end(), id,
                             [](const Server& s, ServerId v) { return s.id < v; });
  return it != servers.end() && it->id == id ? &*it : nullptr;
}

VerbsTransport::VerbsTransport(Options o) : opts_(std::move(o)) {}

Result<std::unique_ptr<VerbsTransport>> VerbsTransport::create(Options o) {
  std::unique_ptr<VerbsTransport> t(new VerbsTransport(std::move(o)));
  FARMEM_RETURN_IF_ERROR(t->init());
  return t;
}

Status VerbsTransport::init() {
  if (opts_.depth == 0)
    return make_error(Errc::kInvalidArgument, "verbs transport depth 0: allow at least 1 op");
  int n = 0;
  devices_ = rdma_get_devices(&n);
  if (devices_ == nullptr || n == 0)
    return make_error(Errc::kUnavailable,
                      "no RDMA device on this host (rdma_get_devices found none): use the tcp "
                      "transport (--transport tcp / FARMEM_TRANSPORT=tcp), or load a driver "
                      "(Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE)");
  for (int i = 0; i < n; ++i) {
    if (opts_.device.empty() || opts_.device == ibv_get_device_name(devices_[i]->device)) {
      ctx_ = devices_[i];
      break;
    }
  }
  if (ctx_ == nullptr)
    return make_error(Errc::kNotFound, "no RDMA device named '%s' (ibv_devices lists them)",
                      opts_.device.c_str());
  if (int rc = ibv_query_device(ctx_, &attr_); rc != 0)
    return verbs::errno_status("ibv_query_device", rc);
  if (opts_.depth > static_cast<size_t>(attr_.max_qp_wr) ||
      cq_entries(opts_.depth) > static_cast<size_t>(attr_.max_cqe))
    return make_error(Errc::kInvalidArgument,
                      "verbs depth %zu is beyond device %s's limits (max_qp_wr %d, max_cqe %d): "
                      "use a smaller depth",
                      opts_.depth, device_name(), attr_.max_qp_wr, attr_.max_cqe);
  pd_ = ibv_alloc_pd(ctx_);
  if (pd_ == nullptr) return verbs::errno_status("ibv_alloc_pd", errno);
  publish(std::make_unique<Tables>());
  return ok_status();
}

VerbsTransport::~VerbsTransport() {
  // Queues are gone (they must not outlive the transport): MRs, PD, devices.
  if (const Tables* cur = tables()) {
    for (const auto& b : cur->buffers.entries()) ibv_dereg_mr(b.extra);
  }
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (devices_ != nullptr) rdma_free_devices(devices_);
}

const char* VerbsTransport::device_name() const {
  return ctx_ != nullptr ? ibv_get_device_name(ctx_->device) : "?";
}

void VerbsTransport::publish(std::unique_ptr<Tables> next) {
  current_.store(next.get(), std::memory_order_release);
  all_.push_back(std::move(next));
}

Status VerbsTransport::add_server(ServerId id, DonorSession* session) {
  if (session == nullptr)
    return make_error(Errc::kInvalidArgument, "add_server(%u): the session is null", id);
  {
    std::lock_guard lk(mu_);
    if (tables()->find_server(id) != nullptr)
      return make_error(Errc::kInvalidArgument, "add_server(%u): that server id is already added",
                        id);
  }
  const Endpoint& ep = session->endpoint();
  verbs::ChannelAndId probe;
  Status st = verbs::resolve_route(probe, ep.host, ep.port, opts_.connect_timeout_ms, false);
  if (!st.ok())
    return make_error(Errc::kUnavailable,
                      "add_server(%u): no RDMA device reaches donor %s (%s): use the tcp transport",
                      id, ep.to_string().c_str(), st.to_string().c_str());
  if (probe.id->verbs->device != ctx_->device)
    return make_error(Errc::kUnavailable,
                      "add_server(%u): donor %s is reached through RDMA device %s, but this "
                      "transport uses %s: create it with Options::device = \"%s\"",
                      id, ep.to_string().c_str(), ibv_get_device_name(probe.id->verbs->device),
                      device_name(), ibv_get_device_name(probe.id->verbs->device));
  std::lock_guard lk(mu_);
  if (tables()->find_server(id) != nullptr)
    return make_error(Errc::kInvalidArgument, "add_server(%u): that server id is already added",
                      id);
  auto next = std::make_unique<Tables>(*tables());
  auto it = std::lower_bound(next->servers.begin(), next->servers.end(), id,
                             [](const Server& s, ServerId v) { return s.id < v; });
  next->servers.insert(it, Server{id, session, {}});
  publish(std::move(next));
  return ok_status();
}

Status VerbsTransport::register_buffer(void* addr, size_t length) {
  std::lock_guard lk(mu_);
  // Checked before ibv_reg_mr: a refused range pins nothing.
  FARMEM_RETURN_IF_ERROR(tables()->buffers.check_insert(addr, length));
  // Local access only: the donor never reaches into the client.
  ibv_mr* mr = ibv_reg_mr(pd_, addr, length, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) {
    const int e = errno;
    return make_error(e == ENOMEM || e == EAGAIN ? Errc::kResourceExhausted : Errc::kIo,
                      "ibv_reg_mr(%p, %zu) on %s failed: %s (errno %d); registered memory is "
                      "pinned: raise RLIMIT_MEMLOCK (ulimit -l) or register less",
                      addr, length, device_name(), std::strerror(e), e);
  }
  auto next = std::make_unique<Tables>(*tables());
  Status st = next->buffers.insert(addr, length, mr);
  if (!st.ok()) {  // cannot happen: checked above under the same lock
    ibv_dereg_mr(mr);
    return st;
  }
  publish(std::move(next));
  return ok_status();
}

Status VerbsTransport::unregister_buffer(void* addr) {
  std::lock_guard lk(mu_);
  auto next = std::make_unique<Tables>(*tables());
  ibv_mr* mr = nullptr;
  FARMEM_RETURN_IF_ERROR(next->buffers.erase(addr, &mr));
  publish(std::move(next));
  if (int rc = ibv_dereg_mr(mr); rc != 0)
    FARMEM_LOG(kWarn, "ibv_dereg_mr of buffer %p failed: %s", addr, std::strerror(rc));
  return ok_status();
}

Status VerbsTransport::add_slab(ServerId server, const SlabDesc& slab) {
  if (slab.size == 0)
    return make_error(Errc::kInvalidArgument, "add_slab(%u, slab %u): size 0", server, slab.slab);
  if (slab.addr == 0 || slab.rkey == 0)
    return make_error(Errc::kInvalidArgument,
                      "add_slab(%u, slab %u): no remote address/rkey: the donor did not lease it "
                      "over verbs (is farmemd running with --transport verbs or auto on an RDMA "
                      "network?)",
                      server, slab.slab);
  std::lock_guard lk(mu_);
  auto next = std::make_unique<Tables>(*tables());
  auto it = std::find_if(next->servers.begin(), next->servers.end(),
                         [&](const Server& s) { return s.id == server; });
  if (it == next->servers.end())
    return make_error(Errc::kInvalidArgument, "add_slab: server %u was never added", server);
  auto pos = std::lower_bound(it->slabs.begin(), it->slabs.end(), slab.slab,
                              [](const Slab& s, SlabId v) { return s.id < v; });
  if (pos != it->slabs.end() && pos->id == slab.slab)
    return make_error(Errc::kInvalidArgument, "add_slab: slab %u of server %u is already added",
                      slab.slab, server);
  it->slabs.insert(pos, Slab{slab.slab, slab.size, slab.addr, slab.rkey});
  publish(std::move(next));
  return ok_status();
}

Status VerbsTransport::remove_slab(ServerId server, SlabId slab) {
  std::lock_guard lk(mu_);
  auto next = std::make_unique<Tables>(*tables());
  auto it = std::find_if(next->servers.begin(), next->servers.end(),
                         [&](const Server& s) { return s.id == server; });
  if (it == next->servers.end())
    return make_error(Errc::kNotFound, "remove_slab: server %u was never added", server);
  auto pos = std::lower_bound(it->slabs.begin(), it->slabs.end(), slab,
                              [](const Slab& s, SlabId v) { return s.id < v; });
  if (pos == it->slabs.end() || pos->id != slab)
    return make_error(Errc::kNotFound, "remove_slab: slab %u of server %u was not added", slab,
                      server);
  it->slabs.erase(pos);
  publish(std::move(next));
  return ok_status();
}

Result<std::unique_ptr<VerbsTransport::Queue>> VerbsTransport::open_queue() {
  std::unique_ptr<Queue> q(new Queue(this, opts_.depth));
  FARMEM_RETURN_IF_ERROR(q->init());
  return q;
}

// ---- Queue ------------------------------------------------------------------

// A queue's connection to one server.
//
//   state   | event                                  | next    | effect
//   --------+----------------------------------------+---------+-----------------------------
//   kNew    | first op for the server: connect ok    | kUp     | ops posted
//   kNew    | connect fails                          | kDead   | op completes kUnavailable
//   kUp     | error CQE (access, local), post fails  | kNew    | QP destroyed; FIFO completed
//   kUp     | flush / retry CQE, donor DISCONNECTED  | kDead   | QP destroyed; FIFO completed
//   kDead   | any op                                 | kDead   | op completes kUnavailable
struct VerbsTransport::Queue::Conn {
  enum class State : uint8_t { kNew, kUp, kDead };
  ServerId server = 0;
  State state = State::kNew;
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  uint32_t qpn = 0;
  uint32_t max_inline = 0;
  uint32_t head = kNone;  // oldest posted slot
  uint32_t tail = kNone;
  // Chain being built by the current post().
  ibv_send_wr* chain_head = nullptr;
  ibv_send_wr* chain_tail = nullptr;
  uint32_t chain_first = kNone;
  uint32_t chain_last = kNone;
  uint32_t chain_len = 0;
  Conn* chain_next = nullptr;

  void destroy() {
    if (id != nullptr) {
      if (id->qp != nullptr) rdma_destroy_qp(id);
      rdma_destroy_id(id);
      id = nullptr;
    }
    if (ch != nullptr) {
      rdma_destroy_event_channel(ch);
      ch = nullptr;
    }
  }
};

VerbsTransport::Queue::Queue(VerbsTransport* t, size_t depth) : t_(t), depth_(depth) {}

Status VerbsTransport::Queue::init() {
  slots_.resize(depth_);
  free_slots_.reserve(depth_);
  for (size_t i = depth_; i > 0; --i) free_slots_.push_back(static_cast<uint32_t>(i - 1));
  done_.resize(depth_);
  channel_ = ibv_create_comp_channel(t_->ctx_);
  if (channel_ == nullptr) return verbs::errno_status("ibv_create_comp_channel", errno);
  FARMEM_RETURN_IF_ERROR(
      verbs::set_nonblocking(channel_->fd, "fcntl(O_NONBLOCK) on the CQ channel"));
  cq_ = ibv_create_cq(t_->ctx_, static_cast<int>(cq_entries(depth_)), nullptr, channel_, 0);
  if (cq_ == nullptr) return verbs::errno_status("ibv_create_cq", errno);
  return ok_status();
}

VerbsTransport::Queue::~Queue() {
  // Reverse order of creation: QPs and ids, then the CQ, then its channel.
  for (auto& c : conns_) c->destroy();
  if (cq_ != nullptr) {
    if (unacked_events_ > 0) ibv_ack_cq_events(cq_, unacked_events_);
    ibv_destroy_cq(cq_);
  }
  if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
}

Status VerbsTransport::Queue::connect(Conn& c, const Server& s) {
  DonorSession* session = s.session;
  const Endpoint& ep = session->endpoint();
  verbs::ChannelAndId cm;
  const int tmo = t_->opts_.connect_timeout_ms;
  {
    sockaddr_storage dst{};
    FARMEM_RETURN_IF_ERROR(verbs::resolve_host(ep.host, ep.port, &dst));
    cm.ch = rdma_create_event_channel();
    if (cm.ch == nullptr) return verbs::errno_status("rdma_create_event_channel", errno);
    FARMEM_RETURN_IF_ERROR(verbs::set_nonblocking(cm.ch->fd, "fcntl(O_NONBLOCK) on rdma_cm"));
    if (rdma_create_id(cm.ch, &cm.id, nullptr, RDMA_PS_TCP) != 0)
      return verbs::errno_status("rdma_create_id", errno);
    uint8_t timeout = t_->opts_.ack_timeout;
    if (rdma_set_option(cm.id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout,
                        sizeof timeout) != 0)
      FARMEM_LOG(kDebug, "rdma_set_option(ACK_TIMEOUT) failed: %s", std::strerror(errno));
    if (rdma_resolve_addr(cm.id, nullptr, reinterpret_cast<sockaddr*>(&dst), tmo) != 0)
      return verbs::errno_status("rdma_resolve_addr", errno);
    auto ev = verbs::wait_cm_event(cm.ch, RDMA_CM_EVENT_ADDR_RESOLVED, tmo);
    if (!ev.ok()) return ev.status();
    rdma_ack_cm_event(*ev);
    if (cm.id->verbs != t_->ctx_)
      return make_error(Errc::kUnavailable, "donor %s is not reached through RDMA device %s",
                        ep.to_string().c_str(), t_->device_name());
    if (rdma_resolve_route(cm.id, tmo) != 0)
      return verbs::errno_status("rdma_resolve_route", errno);
    ev = verbs::wait_cm_event(cm.ch, RDMA_CM_EVENT_ROUTE_RESOLVED, tmo);
    if (!ev.ok()) return ev.status();
    rdma_ack_cm_event(*ev);
  }
  ibv_qp_init_attr qa{};
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;  // selective signalling
  qa.cap.max_send_wr = static_cast<uint32_t>(depth_);
  qa.cap.max_recv_wr = 1;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = t_->opts_.max_inline;
  if (rdma_create_qp(cm.id, t_->pd_, &qa) != 0) {
    // Some devices grant no inline data at all: retry without.
    qa.cap.max_inline_data = 0;
    if (rdma_create_qp(cm.id, t_->pd_, &qa) != 0)
      return verbs::errno_status("rdma_create_qp", errno);
  }
  const wire::Welcome& w = session->welcome();
  verbs::ConnectData cd;
  cd.session_id = w.session_id;
  cd.nonce = random_u64();
  cd.mac = verbs::connect_mac(w.secret, cd.session_id, cd.nonce);
  uint8_t pdata[verbs::kConnectDataSize];
  verbs::encode_connect(cd, pdata);
  rdma_conn_param p{};
  p.private_data = pdata;
  p.private_data_len = sizeof pdata;
  p.initiator_depth = static_cast<uint8_t>(std::min(t_->attr_.max_qp_init_rd_atom, 255));
  p.responder_resources = 0;  // nobody READs from us
  p.retry_count = std::min<uint8_t>(t_->opts_.retry_count, 7);
  p.rnr_retry_count = 7;
  if (rdma_connect(cm.id, &p) != 0) return verbs::errno_status("rdma_connect", errno);
  // ESTABLISHED, or REJECTED with the donor's reason.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(tmo);
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(cm.ch, &ev) == 0) {
      const rdma_cm_event_type type = ev->event;
      if (type == RDMA_CM_EVENT_ESTABLISHED) {
        const rdma_conn_param& got = ev->param.conn;
        const bool ok =
            got.private_data != nullptr && got.private_data_len >= verbs::kAcceptDataSize &&
            wire::get_u32(static_cast<const uint8_t*>(got.private_data)) == verbs::kConnMagic;
        rdma_ack_cm_event(ev);
        if (!ok)
          return make_error(Errc::kProtocol,
                            "donor %s accepted the verbs connection without farmem's reply: is "
                            "something else listening on that rdma_cm port?",
                            ep.to_string().c_str());
        break;
      }
      Errc code = Errc::kUnavailable;
      if (type == RDMA_CM_EVENT_REJECTED)
        code = verbs::decode_reject(ev->param.conn.private_data, ev->param.conn.private_data_len);
      const int status = ev->status;
      rdma_ack_cm_event(ev);
      return make_error(code, "verbs connect to donor %s failed: %s (status %d, %s)%s",
                        ep.to_string().c_str(), rdma_event_str(type), status, errc_name(code),
                        code == Errc::kUnauthenticated
                            ? ": the donor does not know this session or its proof"
                            : "");
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return verbs::errno_status("rdma_get_cm_event", errno);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0)
      return make_error(Errc::kTimeout, "verbs connect to donor %s: no answer within %d ms",
                        ep.to_string().c_str(), tmo);
    pollfd pfd{cm.ch->fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(left));
  }
  c.ch = std::exchange(cm.ch, nullptr);
  c.id = std::exchange(cm.id, nullptr);
  c.qpn = c.id->qp->qp_num;
  c.max_inline = qa.cap.max_inline_data;
  c.state = Conn::State::kUp;
  FARMEM_LOG(kDebug, "verbs: QP %u connected to donor %s (session %016" PRIx64 ", inline %u)",
             c.qpn, ep.to_string().c_str(), w.session_id, c.max_inline);
  return ok_status();
}

VerbsTransport::Queue::Conn* VerbsTransport::Queue::conn_for(const Server& s) {
  Conn* c = nullptr;
  for (auto& x : conns_)
    if (x->server == s.id) c = x.get();
  if (c == nullptr) {
    conns_.push_back(std::make_unique<Conn>());
    c = conns_.back().get();
    c->server = s.id;
  }
  if (c->state == Conn::State::kNew) {
    Status st = connect(*c, s);
    if (!st.ok()) {
      FARMEM_LOG(kWarn, "verbs: server %u is unavailable to this queue from now on: %s", s.id,
                 st.to_string().c_str());
      c->state = Conn::State::kDead;
    }
  }
  return c;
}

void VerbsTransport::Queue::complete(uint64_t cookie, Errc status) {
  FARMEM_BUG_ON(done_count_ >= done_.size());
  done_[(done_head_ + done_count_) % done_.size()] = IoCompletion{cookie, status};
  ++done_count_;
}

void VerbsTransport::Queue::free_slot(uint32_t i) {
  Slot& s = slots_[i];
  ++s.seq;
  s.conn = nullptr;
  free_slots_.push_back(i);
}

void VerbsTransport::Queue::retire_through(Conn& c, uint32_t upto) {
  for (;;) {
    const uint32_t i = c.head;
    FARMEM_BUG_ON(i == kNone);
    c.head = slots_[i].next;
    if (c.head == kNone) c.tail = kNone;
    complete(slots_[i].op.cookie, Errc::kOk);
    free_slot(i);
    --in_flight_;
    if (i == upto) return;
  }
}

// Ops before `failed_slot` on the QP: kOk when the failure is the op's own
// (RC executes in order, so everything before it was acknowledged), and
// kUnavailable when the QP was flushed (they may not have run). The failed
// op gets `failed_status`; everything after it kUnavailable.
void VerbsTransport::Queue::break_conn(Conn& c, uint32_t failed_slot, Errc failed_status,
                                       bool permanent, const char* why) {
  bool before = failed_slot != kNone;
  const Errc before_status = failed_status == Errc::kUnavailable ? Errc::kUnavailable : Errc::kOk;
  while (c.head != kNone) {
    const uint32_t i = c.head;
    c.head = slots_[i].next;
    Errc st = Errc::kUnavailable;
    if (i == failed_slot) {
      st = failed_status;
      before = false;
    } else if (before) {
      st = before_status;
    }
    complete(slots_[i].op.cookie, st);
    free_slot(i);
    --in_flight_;
  }
  c.tail = kNone;
  FARMEM_LOG(kWarn, "verbs: QP %u to server %u %s: %s", c.qpn, c.server,
             permanent ? "closed, server unavailable to this queue" : "reset, will reconnect", why);
  if (c.id != nullptr) rdma_disconnect(c.id);
  c.destroy();
  c.state = permanent ? Conn::State::kDead : Conn::State::kNew;
}

Errc VerbsTransport::Queue::post(std::span<const IoOp> ops) {
  if (outstanding_ + ops.size() > depth_) return Errc::kResourceExhausted;
  const Tables* tab = t_->tables();
  Conn* touched = nullptr;
  for (const IoOp& op : ops) {
    ++outstanding_;
    if (op.length == 0 || op.length > wire::kMaxIoLength) {
      complete(op.cookie, Errc::kInvalidArgument);
      continue;
    }
    const auto* buf = tab->buffers.find(op.local, op.length);
    if (buf == nullptr) {
      complete(op.cookie, Errc::kInvalidArgument);
      continue;
    }
    const Server* srv = tab->find_server(op.remote.server);
    if (srv == nullptr) {
      complete(op.cookie, Errc::kInvalidArgument);
      continue;
    }
    auto sit = std::lower_bound(srv->slabs.begin(), srv->slabs.end(), op.remote.slab,
                                [](const Slab& s, SlabId v) { return s.id < v; });
    if (sit == srv->slabs.end() || sit->id != op.remote.slab) {
      complete(op.cookie, Errc::kInvalidArgument);
      continue;
    }
    if (op.remote.offset > sit->size || op.length > sit->size - op.remote.offset) {
      complete(op.cookie, Errc::kOutOfRange);
      continue;
    }
    Conn* c = conn_for(*srv);
    if (c->state != Conn::State::kUp) {
      complete(op.cookie, Errc::kUnavailable);
      continue;
    }
    const uint32_t i = free_slots_.back();
    free_slots_.pop_back();
    Slot& s = slots_[i];
    s.op = op;
    s.conn = c;
    s.next = kNone;
    s.sge = ibv_sge{reinterpret_cast<uint64_t>(op.local), op.length, buf->extra->lkey};
    s.wr = ibv_send_wr{};
    s.wr.wr_id = (uint64_t{s.seq} << 32) | i;
    s.wr.sg_list = &s.sge;
    s.wr.num_sge = 1;
    s.wr.opcode = op.kind == IoKind::kRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    if (op.kind == IoKind::kWrite && op.length <= c->max_inline) s.wr.send_flags = IBV_SEND_INLINE;
    s.wr.wr.rdma.remote_addr = sit->addr + op.remote.offset;
    s.wr.wr.rdma.rkey = sit->rkey;
    if (c->chain_head == nullptr) {
      c->chain_head = &s.wr;
      c->chain_first = i;
      c->chain_len = 0;
      c->chain_next = touched;
      touched = c;
    } else {
      c->chain_tail->next = &s.wr;
      slots_[c->chain_last].next = i;
    }
    c->chain_tail = &s.wr;
    c->chain_last = i;
    // Every kSignalEvery-th WR of a long chain is signalled too: its CQE
    // retires the ops before it while the rest of the chain is in flight,
    // so the caller can refill the queue without waiting for the whole
    // chain to drain (perftest's cq_mod does the same).
    if (++c->chain_len % kSignalEvery == 0) s.wr.send_flags |= IBV_SEND_SIGNALED;
  }
  // One ibv_post_send (one doorbell) per connection; the chain's last WR
  // is always signalled.
  for (Conn* c = touched; c != nullptr;) {
    Conn* next = c->chain_next;
    c->chain_tail->send_flags |= IBV_SEND_SIGNALED;
    // Append the chain to the connection's FIFO before posting: a failed
    // post completes it through break_conn.
    if (c->tail == kNone) {
      c->head = c->chain_first;
    } else {
      slots_[c->tail].next = c->chain_first;
    }
    c->tail = c->chain_last;
    for (uint32_t i = c->chain_first;; i = slots_[i].next) {
      ++in_flight_;
      if (i == c->chain_last) break;
    }
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(c->id->qp, c->chain_head, &bad);
    c->chain_head = c->chain_tail = nullptr;
    c->chain_first = c->chain_last = kNone;
    c->chain_next = nullptr;
    if (rc != 0) {
      char why[96];
      snprintf(why, sizeof why, "ibv_post_send failed: %s", std::strerror(rc));
      // What was posted before `bad` may run; its outcome is unknown.
      break_conn(*c, kNone, Errc::kUnavailable, false, why);
    }
    c = next;
  }
  return Errc::kOk;
}

void VerbsTransport::Queue::reap_cq() {
  ibv_wc wc[kPollBatch];
  for (;;) {
    const int n = ibv_poll_cq(cq_, kPollBatch, wc);
    if (n <= 0) {
      if (n < 0) FARMEM_LOG(kError, "verbs: ibv_poll_cq failed (%d)", n);
      return;
    }
    for (int k = 0; k < n; ++k) {
      const uint32_t i = static_cast<uint32_t>(wc[k].wr_id);
      const uint32_t seq = static_cast<uint32_t>(wc[k].wr_id >> 32);
      if (i >= slots_.size() || slots_[i].seq != seq || slots_[i].conn == nullptr)
        continue;  // from a QP already torn down
      Conn& c = *slots_[i].conn;
      if (wc[k].status == IBV_WC_SUCCESS) {
        retire_through(c, i);
        continue;
      }
      const IoOp& op = slots_[i].op;
      const Errc e = map_wc_status(wc[k].status);
      const Slot& s = slots_[i];
      FARMEM_LOG(kWarn,
                 "verbs: %s of %u bytes at server %u slab %u offset %" PRIu64 " (remote 0x%" PRIx64
                 " rkey 0x%x) on QP %u failed: %s (vendor_err 0x%x)",
                 op.kind == IoKind::kRead ? "READ" : "WRITE", op.length, op.remote.server,
                 op.remote.slab, op.remote.offset, s.wr.wr.rdma.remote_addr, s.wr.wr.rdma.rkey,
                 wc[k].qp_num, ibv_wc_status_str(wc[k].status), wc[k].vendor_err);
      const bool permanent = e == Errc::kUnavailable;
      break_conn(c, i, e, permanent, ibv_wc_status_str(wc[k].status));
    }
    if (n < kPollBatch) return;
  }
}

void VerbsTransport::Queue::check_cm_events() {
  for (auto& cp : conns_) {
    Conn& c = *cp;
    if (c.state != Conn::State::kUp || c.ch == nullptr) continue;
    rdma_cm_event* ev = nullptr;
    while (c.state == Conn::State::kUp && rdma_get_cm_event(c.ch, &ev) == 0) {
      const rdma_cm_event_type type = ev->event;
      rdma_ack_cm_event(ev);
      if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL ||
          type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
        // Completions already in the CQ first: they are real.
        reap_cq();
        if (c.state != Conn::State::kUp) break;
        break_conn(c, kNone, Errc::kUnavailable, true, rdma_event_str(type));
      }
    }
  }
}

size_t VerbsTransport::Queue::drain(std::span<IoCompletion> out) {
  size_t n = 0;
  while (n < out.size() && done_count_ > 0) {
    out[n++] = done_[done_head_];
    done_head_ = (done_head_ + 1) % done_.size();
    --done_count_;
  }
  outstanding_ -= n;
  return n;
}

size_t VerbsTransport::Queue::poll(std::span<IoCompletion> out) {
  if (in_flight_ > 0) {
    reap_cq();
    // A donor that went away shows as an rdma_cm event, not a CQE; look
    // for one now and then while ops wait.
    if (done_count_ == 0 && in_flight_ > 0) {
      const uint64_t now = now_ns();
      if (now - last_cm_check_ns_ > kCmCheckNs) {
        last_cm_check_ns_ = now;
        check_cm_events();
      }
    }
  }
  return drain(out);
}

size_t VerbsTransport::Queue::wait(std::span<IoCompletion> out, int timeout_ms) {
  size_t n = poll(out);
  if (n > 0 || in_flight_ == 0 || out.empty()) return n;
  const auto start = std::chrono::steady_clock::now();
  const auto spin_until = start + std::chrono::microseconds(kSpinUs);
  while (std::chrono::steady_clock::now() < spin_until) {
    n = poll(out);
    if (n > 0 || in_flight_ == 0) return n;
  }
  for (;;) {
    if (!armed_) {
      if (ibv_req_notify_cq(cq_, 0) != 0) FARMEM_LOG(kError, "verbs: ibv_req_notify_cq failed");
      armed_ = true;
    }
    // Whatever arrived before the CQ was armed raises no event.
    reap_cq();
    check_cm_events();
    n = drain(out);
    if (n > 0 || in_flight_ == 0) return n;
    int left = -1;
    if (timeout_ms >= 0) {
      const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - start)
                             .count();
      if (spent >= timeout_ms) return 0;
      left = static_cast<int>(timeout_ms - spent);
    }
    // The CQ channel and every live connection's rdma_cm channel; a queue
    // talks to few servers, so a small fixed array does.
    constexpr size_t kMaxFds = 16;
    pollfd pfds[kMaxFds];
    size_t nfds = 0;
    pfds[nfds++] = pollfd{channel_->fd, POLLIN, 0};
    for (auto& c : conns_)
      if (c->state == Conn::State::kUp && c->ch != nullptr && nfds < kMaxFds)
        pfds[nfds++] = pollfd{c->ch->fd, POLLIN, 0};
    // Servers beyond the array are looked at every 100 ms.
    if (nfds == kMaxFds && conns_.size() + 1 > kMaxFds) left = left < 0 ? 100 : std::min(left, 100);
    const int r = ::poll(pfds, nfds, left);
    if (r < 0 && errno != EINTR) {
      FARMEM_LOG(kError, "verbs: poll failed: %s", std::strerror(errno));
      return 0;
    }
    if (r > 0 && (pfds[0].revents & POLLIN)) {
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      if (ibv_get_cq_event(channel_, &ev_cq, &ev_ctx) == 0) {
        armed_ = false;
        if (++unacked_events_ >= kAckEvery) {
          ibv_ack_cq_events(cq_, unacked_events_);
          unacked_events_ = 0;
        }
      }
    }
  }
}

}  // namespace farmem
