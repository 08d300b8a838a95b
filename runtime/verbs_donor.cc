#include "runtime/verbs_donor.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "runtime/auth.h"
#include "runtime/log.h"
#include "runtime/verbs_transport.h"

namespace farmem {

namespace {

constexpr size_t kMaxNoncesPerSession = 4096;  // connects per session, ever
constexpr int kEventPollMs = 100;              // how soon stop() is noticed

Status errno_error(const char* what, int err) {
  return make_error(Errc::kIo, "%s failed: %s (errno %d)", what, std::strerror(err), err);
}

}  // namespace

VerbsDonor::VerbsDonor(Hooks hooks) : hooks_(std::move(hooks)) {}

Result<std::unique_ptr<VerbsDonor>> VerbsDonor::create(Hooks hooks) {
  if (!hooks.session_secret)
    return make_error(Errc::kInvalidArgument, "VerbsDonor needs a session_secret hook");
  std::unique_ptr<VerbsDonor> v(new VerbsDonor(std::move(hooks)));
  v->channel_ = rdma_create_event_channel();
  if (v->channel_ == nullptr)
    return errno_error("rdma_create_event_channel (is the rdma_ucm module loaded?)", errno);
  int flags = fcntl(v->channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(v->channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return errno_error("fcntl(O_NONBLOCK) on the rdma_cm channel", errno);
  if (rdma_create_id(v->channel_, &v->listen_id_, nullptr, RDMA_PS_TCP) != 0)
    return errno_error("rdma_create_id (listener)", errno);
  return v;
}

Status VerbsDonor::listen(const Endpoint& ep, uint64_t instance_id) {
  instance_id_.store(instance_id);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(ep.port);
  int rc = getaddrinfo(ep.host.empty() ? nullptr : ep.host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    return make_error(Errc::kInvalidArgument, "verbs listener: cannot resolve '%s': %s",
                      ep.host.c_str(), gai_strerror(rc));
  rc = rdma_bind_addr(listen_id_, res->ai_addr);
  const int err = errno;
  freeaddrinfo(res);
  if (rc != 0)
    return make_error(Errc::kUnavailable,
                      "verbs listener: rdma_bind_addr(%s) failed: %s; the address must belong to "
                      "an RDMA device's network interface (use --transport tcp otherwise)",
                      ep.to_string().c_str(), std::strerror(err));
  ctx_ = listen_id_->verbs;
  if (ctx_ == nullptr)
    return make_error(Errc::kUnavailable,
                      "verbs listener: %s is not the address of an RDMA device (a wildcard or "
                      "loopback address has none): listen on the RDMA interface's address, or "
                      "use --transport tcp",
                      ep.to_string().c_str());
  ibv_device_attr a{};
  if (int q = ibv_query_device(ctx_, &a); q != 0) return errno_error("ibv_query_device", q);
  max_rd_atom_ = static_cast<uint32_t>(std::max(a.max_qp_rd_atom, 0));
  cq_ = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
  if (cq_ == nullptr) return errno_error("ibv_create_cq", errno);
  if (rdma_listen(listen_id_, 64) != 0) return errno_error("rdma_listen", errno);
  try {
    thread_ = std::thread(&VerbsDonor::event_loop, this);
  } catch (const std::system_error& e) {
    return make_error(Errc::kResourceExhausted, "cannot start the rdma_cm thread: %s", e.what());
  }
  FARMEM_LOG(kInfo, "verbs: listening on %s (rdma_cm) through device %s", ep.to_string().c_str(),
             device_name());
  return ok_status();
}

const char* VerbsDonor::device_name() const {
  return ctx_ != nullptr ? ibv_get_device_name(ctx_->device) : "?";
}

VerbsDonor::~VerbsDonor() {
  stop();
}

void VerbsDonor::stop() noexcept {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
  std::lock_guard lk(mu_);
  if (stopped_) return;
  stopped_ = true;
  // Reverse order of creation: QPs and their ids, MRs, PDs, CQ, listener.
  while (!id_owner_.empty()) drop_id(id_owner_.begin()->first);
  for (auto& [owner, c] : clients_) {
    for (auto& [slab, mr] : c.mrs) ibv_dereg_mr(mr);
    if (c.pd != nullptr) ibv_dealloc_pd(c.pd);
  }
  clients_.clear();
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  cq_ = nullptr;
  if (listen_id_ != nullptr) rdma_destroy_id(listen_id_);
  listen_id_ = nullptr;
  if (channel_ != nullptr) rdma_destroy_event_channel(channel_);
  channel_ = nullptr;
}

// With mu_ held. Disconnects (the client's QP gets DISCONNECTED and its ops
// flush) and frees the id and its QP.
void VerbsDonor::drop_id(rdma_cm_id* id) {
  auto it = id_owner_.find(id);
  if (it == id_owner_.end()) return;
  const uint64_t owner = it->second;
  id_owner_.erase(it);
  rdma_disconnect(id);
  if (id->qp != nullptr) rdma_destroy_qp(id);
  rdma_destroy_id(id);
  if (auto c = clients_.find(owner); c != clients_.end()) c->second.qps.erase(id);
  maybe_free_locked(owner);
}

VerbsDonor::Client* VerbsDonor::client_locked(uint64_t owner, Status* st) {
  if (stopped_ || ctx_ == nullptr) {
    *st = make_error(Errc::kUnavailable, "the verbs side of this donor is not running");
    return nullptr;
  }
  Client& c = clients_[owner];
  if (c.pd == nullptr) {
    c.pd = ibv_alloc_pd(ctx_);
    if (c.pd == nullptr) {
      *st = errno_error("ibv_alloc_pd (one per client session)", errno);
      clients_.erase(owner);
      return nullptr;
    }
  }
  return &c;
}

void VerbsDonor::maybe_free_locked(uint64_t owner) {
  auto it = clients_.find(owner);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (!c.ended || !c.qps.empty() || !c.mrs.empty()) return;
  if (c.pd != nullptr) ibv_dealloc_pd(c.pd);
  clients_.erase(it);
}

Status VerbsDonor::register_region(uint8_t* base, uint64_t length) {
  // Registration is per session and per slab (describe()), so that one
  // session's keys cover nothing but its own slabs; here only the bounds.
  base_ = base;
  length_ = length;
  return ok_status();
}

Status VerbsDonor::describe(LeaseOwner owner, wire::SlabDesc* desc, uint8_t* addr) {
  if (addr < base_ || addr + desc->size > base_ + length_)
    return make_error(Errc::kInternal, "slab %u lies outside the donor's memory", desc->slab);
  std::lock_guard lk(mu_);
  Status st;
  Client* c = client_locked(owner, &st);
  if (c == nullptr) return st;
  if (c->mrs.count(desc->slab) != 0)
    return make_error(Errc::kInternal, "slab %u is already registered for session %016" PRIx64,
                      desc->slab, owner);
  ibv_mr* mr =
      ibv_reg_mr(c->pd, addr, desc->size,
                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
  if (mr == nullptr) {
    const int e = errno;
    maybe_free_locked(owner);
    return make_error(e == ENOMEM || e == EAGAIN ? Errc::kResourceExhausted : Errc::kIo,
                      "ibv_reg_mr of slab %u (%" PRIu64
                      " bytes) on %s failed: %s; registered "
                      "memory is pinned: raise farmemd's RLIMIT_MEMLOCK (ulimit -l unlimited)",
                      desc->slab, desc->size, device_name(), std::strerror(e));
  }
  c->mrs[desc->slab] = mr;
  desc->rkey = mr->rkey;
  desc->addr = reinterpret_cast<uint64_t>(addr);
  return ok_status();
}

void VerbsDonor::forget(LeaseOwner owner, uint32_t slab) noexcept {
  std::lock_guard lk(mu_);
  auto it = clients_.find(owner);
  if (it == clients_.end()) return;
  auto m = it->second.mrs.find(slab);
  if (m == it->second.mrs.end()) return;
  // After this returns the device no longer accepts the rkey: the slab can
  // be zeroed and lent to someone else.
  if (int rc = ibv_dereg_mr(m->second); rc != 0)
    FARMEM_LOG(kError, "verbs: ibv_dereg_mr of slab %u failed: %s", slab, std::strerror(rc));
  it->second.mrs.erase(m);
  maybe_free_locked(owner);
}

void VerbsDonor::session_ended(uint64_t session) noexcept {
  std::lock_guard lk(mu_);
  auto it = clients_.find(session);
  if (it == clients_.end()) return;
  it->second.ended = true;
  std::vector<rdma_cm_id*> ids(it->second.qps.begin(), it->second.qps.end());
  for (rdma_cm_id* id : ids) drop_id(id);  // may free the client
  maybe_free_locked(session);
}

void VerbsDonor::reject(rdma_cm_id* id, Errc code, const Status& why) {
  refused_.fetch_add(1);
  FARMEM_LOG(kWarn, "verbs: connection refused: %s", why.to_string().c_str());
  uint8_t pdata[verbs::kRejectDataSize];
  verbs::encode_reject(code, pdata);
  rdma_reject(id, pdata, sizeof pdata);
}

void VerbsDonor::on_connect_request(rdma_cm_event* ev) {
  rdma_cm_id* id = ev->id;
  verbs::ConnectData cd;
  Status st =
      verbs::decode_connect(ev->param.conn.private_data, ev->param.conn.private_data_len, &cd);
  // rdma_cm reports the request from our side: the client's initiator
  // depth (READs it keeps in flight) arrives as our responder_resources.
  const uint8_t want_rd = ev->param.conn.responder_resources;
  // The event is acked before the id may be destroyed (rdma_destroy_id
  // waits for its events' acks).
  rdma_ack_cm_event(ev);
  if (!st.ok()) {
    reject(id, st.code(), st);
    rdma_destroy_id(id);
    return;
  }
  Secret secret{};
  if (!hooks_.session_secret(cd.session_id, &secret)) {
    reject(
        id, Errc::kUnauthenticated,
        make_error(Errc::kUnauthenticated, "session %016" PRIx64 " is not alive", cd.session_id));
    rdma_destroy_id(id);
    return;
  }
  if (!mac_equal(verbs::connect_mac(secret, cd.session_id, cd.nonce), cd.mac)) {
    reject(id, Errc::kUnauthenticated,
           make_error(Errc::kUnauthenticated,
                      "session %016" PRIx64 ": the proof does not match the session secret",
                      cd.session_id));
    rdma_destroy_id(id);
    return;
  }
  std::lock_guard lk(mu_);
  Client* c = id->verbs == ctx_
                  ? client_locked(cd.session_id, &st)
                  : (st = make_error(Errc::kUnavailable, "connect request through another device"),
                     nullptr);
  Errc code = st.code();
  if (c != nullptr) {
    if (c->ended) {
      st = make_error(Errc::kUnauthenticated, "session %016" PRIx64 " has ended", cd.session_id);
    } else if (c->nonces.count(cd.nonce) != 0) {
      st = make_error(Errc::kUnauthenticated,
                      "session %016" PRIx64 ": replayed connect request (nonce seen before)",
                      cd.session_id);
    } else if (c->nonces.size() >= kMaxNoncesPerSession ||
               c->qps.size() >= hooks_.max_qps_per_session) {
      st = make_error(Errc::kResourceExhausted,
                      "session %016" PRIx64
                      " has %zu QPs (limit %u) or connected %zu times: "
                      "open fewer queues",
                      cd.session_id, c->qps.size(), hooks_.max_qps_per_session, c->nonces.size());
    }
    code = st.code();
  }
  if (!st.ok()) {
    reject(id, code, st);
    rdma_destroy_id(id);
    if (c != nullptr) maybe_free_locked(cd.session_id);
    return;
  }
  c->nonces.insert(cd.nonce);
  ibv_qp_init_attr qa{};
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = 1;
  qa.cap.max_recv_wr = 1;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, c->pd, &qa) != 0) {
    st = errno_error("rdma_create_qp", errno);
    reject(id, Errc::kResourceExhausted, st);
    rdma_destroy_id(id);
    return;
  }
  uint8_t pdata[verbs::kAcceptDataSize];
  verbs::encode_accept(instance_id_.load(), pdata);
  rdma_conn_param p{};
  p.private_data = pdata;
  p.private_data_len = sizeof pdata;
  // As many READs in flight as the client asks, up to what the device allows.
  p.responder_resources = static_cast<uint8_t>(std::min<uint32_t>({want_rd, max_rd_atom_, 255}));
  p.initiator_depth = 0;  // the donor never READs
  p.rnr_retry_count = 7;
  if (rdma_accept(id, &p) != 0) {
    FARMEM_LOG(kWarn, "verbs: rdma_accept failed: %s", std::strerror(errno));
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
    return;
  }
  c->qps.insert(id);
  id_owner_[id] = cd.session_id;
  accepted_.fetch_add(1);
  FARMEM_LOG(kDebug, "verbs: accepted QP %u for session %016" PRIx64 " (%u READs in flight)",
             id->qp->qp_num, cd.session_id, p.responder_resources);
}

void VerbsDonor::event_loop() {
  while (!stopping_.load()) {
    pollfd pfd{channel_->fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, kEventPollMs);
    if (r <= 0) continue;
    rdma_cm_event* ev = nullptr;
    while (!stopping_.load() && rdma_get_cm_event(channel_, &ev) == 0) {
      switch (ev->event) {
        case RDMA_CM_EVENT_CONNECT_REQUEST:
          on_connect_request(ev);  // acks
          break;
        case RDMA_CM_EVENT_DISCONNECTED:
        case RDMA_CM_EVENT_CONNECT_ERROR:
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_REJECTED: {
          rdma_cm_id* id = ev->id;
          rdma_ack_cm_event(ev);
          std::lock_guard lk(mu_);
          drop_id(id);
          break;
        }
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
          FARMEM_LOG(kError, "verbs: RDMA device %s removed: the verbs data path is gone",
                     device_name());
          rdma_ack_cm_event(ev);
          break;
        default:
          rdma_ack_cm_event(ev);
          break;
      }
    }
  }
}

}  // namespace farmem
