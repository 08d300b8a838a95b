#include "runtime/donor_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <list>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/auth.h"
#include "runtime/log.h"
#include "runtime/net.h"
#include "runtime/slab_pool.h"
#ifdef FARMEM_HAVE_VERBS
#include "runtime/verbs_donor.h"
#include "runtime/verbs_transport.h"
#endif

namespace farmem {

const char* donor_transport_name(DonorTransportMode m) noexcept {
  switch (m) {
    case DonorTransportMode::kAuto:
      return "auto";
    case DonorTransportMode::kTcp:
      return "tcp";
    case DonorTransportMode::kVerbs:
      return "verbs";
  }
  return "?";
}

namespace {

using wire::MsgType;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// recv of exactly `len` bytes before `deadline` (now_ms() clock), whatever
// the peer's pace: SO_RCVTIMEO alone would let a peer that trickles one byte
// at a time stretch the handshake forever.
Errc recv_until(int fd, void* buf, size_t len, int64_t deadline) noexcept {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return Errc::kTimeout;
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, INT32_MAX)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errc::kIo;
    if (r == 0) return Errc::kTimeout;
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n == 0) return Errc::kUnavailable;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errc::kUnavailable;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Errc::kOk;
}

// Bytes already received and not yet read. Replies are batched while the
// next request's header is already here; otherwise they go out at once, so a
// client that waits for a reply before sending more never stalls.
size_t pending_input(int fd) noexcept {
  int n = 0;
  if (ioctl(fd, FIONREAD, &n) != 0 || n < 0) return 0;
  return static_cast<size_t>(n);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[64] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return Endpoint{host, port}.to_string();
}

constexpr size_t kFlushBytes = 64 << 10;    // batched replies sent once this much is queued
constexpr size_t kScratchBytes = 64 << 10;  // sink for refused WRITE data
// Data connections: one recv takes up to kDataRxBytes of requests; the
// replies to all whole requests in it leave in one sendmsg, cut earlier once
// kBatchReadBytes of READ data or kBatchSegs iovec entries are queued (so a
// client that stops reading is not sent far more than it asked for at once).
constexpr size_t kDataRxBytes = 256 << 10;
constexpr size_t kBatchReadBytes = 512 << 10;
constexpr size_t kBatchSegs = 256;
constexpr size_t kLingerBytes = 256 << 10;  // drained after an error before close
constexpr int kLingerMs = 200;

struct Session {
  uint64_t id = 0;
  uint64_t client_id = 0;
  std::array<uint8_t, wire::kSecretSize> secret{};
  std::string peer;
  std::atomic<int64_t> last_frame_ms{0};
  int64_t opened_ms = 0;
  // Data-path traffic of this session's connections (CLIENTS, metrics).
  std::atomic<uint64_t> bytes_read{0}, bytes_written{0}, reads{0}, writes{0};
};

struct Conn {
  Fd fd;  // closed by its own thread under mu_, so shutdown() never hits a reused number
  std::thread thread;
  std::string peer;
  bool finished = false;  // guarded by mu_
  uint64_t session = 0;   // set once by the handshake, under mu_
  bool control = false;
};

// The receive buffer and the reply batch of one data connection, owned by its
// thread. Each turn of data_loop:
//
//   step | what                                        | syscalls
//   -----+---------------------------------------------+-------------------
//   1    | parse every whole request in rx[rpos, rlen) | none
//        | READ: pin, queue header + slab pointer      |
//        | WRITE: pin, copy buffered data, recv rest   | recv only for data
//        |        straight into the slab               | not yet buffered
//   2    | no whole request left: send the batch,      | one sendmsg
//        | then unpin every slab it pointed into       |
//   3    | recv more requests (blocking, idle timeout) | one recv
//
// Reply bytes other than READ data (READ_DATA headers, WRITTEN, ERROR) are
// appended to Worker::out; `segs` interleaves ranges of `out` with slab
// memory in reply order. A range of `out` is kept as an offset, not a
// pointer, so that `out` may grow while the batch is built.
struct DataBatch {
  struct Seg {
    const uint8_t* mem;  // slab bytes; nullptr: bytes [off, off + len) of Worker::out
    size_t off;
    size_t len;
  };
  std::vector<uint8_t> rx;
  size_t rpos = 0;  // first unparsed byte
  size_t rlen = 0;  // end of received bytes
  std::vector<Seg> segs;
  std::vector<iovec> iov;
  std::vector<uint32_t> pinned;  // one entry per pin() taken for `segs`
  size_t out_mark = 0;           // Worker::out bytes before it are in `segs` already
  size_t read_bytes = 0;         // READ data queued
  uint64_t reads = 0;            // READs queued (counted already; undone if the send fails)
};

}  // namespace

class DonorServer::Impl {
 public:
  explicit Impl(const DonorOptions& o) : opts_(o) {}
  ~Impl() { stop(); }

  Status init();
  void stop();
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    stopped_cv_.wait(lk, [&] { return stopped_; });
  }
  wire::StatsReply stats() const;
  std::string prometheus_text() const;

  uint16_t port_ = 0;
  uint64_t instance_id_ = 0;
  std::atomic<uint64_t> local_slabs_lent_{0};  // offer_local()
#ifdef FARMEM_HAVE_VERBS
  // Declared before pool_: the pool holds it as its registrar.
  std::unique_ptr<VerbsDonor> verbs_;
#endif
  std::unique_ptr<SlabPool> pool_;

 private:
  // One connection's I/O state, owned by its thread.
  struct Worker {
    Impl* srv;
    Conn* conn;
    int fd;
    std::vector<uint8_t> out;  // queued replies
    std::vector<uint8_t> scratch;
    std::array<uint8_t, wire::kNonceSize> nonce{};
    wire::Hello hello;
    std::shared_ptr<Session> sess;  // data connections: the session attached to

    Errc flush() noexcept {
      if (out.empty()) return Errc::kOk;
      Errc e = send_all(fd, out.data(), out.size());
      out.clear();
      return e;
    }
    // Queues an ERROR frame; the caller flushes (and closes when the stream
    // cannot be trusted). Formats into a stack buffer: no allocation on the
    // data path beyond `out`'s reserved capacity.
    void error(uint64_t tag, Errc code, const char* fmt, ...) noexcept
        __attribute__((format(printf, 4, 5)));
    void error(uint64_t tag, const Status& st) noexcept {
      error(tag, st.code(), "%s", st.message().c_str());
    }
  };

  void accept_loop();
  void reaper_loop();
  void serve(Conn* c);
  // Returns with the connection to be closed.
  void run(Worker& w);
  bool handshake(Worker& w, std::shared_ptr<Session>* session);
  void control_loop(Worker& w, const std::shared_ptr<Session>& s);
  // "Local clients": gives each slab of `l` a view the client reads and
  // writes itself (addr, rkey = this process's pid); a slab whose view the
  // kernel refuses stays tcp-only (addr and rkey 0).
  void offer_local(const Session& s, wire::Leased* l);
  void data_loop(Worker& w);
  // One request whose header and 16-byte prefix `req` are consumed from
  // b.rx; false: the connection must close.
  bool do_read(Worker& w, DataBatch& b, const wire::Header& h, const uint8_t* req);
  bool do_write(Worker& w, DataBatch& b, const wire::Header& h, const uint8_t* req);
  // Sends the batch and unpins its slabs; kOk with the batch empty.
  Errc flush_batch(Worker& w, DataBatch& b);
  void end_session(uint64_t id, bool expired);
  void refuse(int fd, Errc code, const char* msg);
  void linger_close(int fd);
  void join_finished();
  void metrics_loop();
  void serve_metrics(int fd);

  const DonorOptions opts_;
  uint32_t max_connections_ = 0;
  Fd listen_;
  std::thread accept_thread_;
  std::thread reaper_thread_;

  std::mutex stop_mu_;  // serialises stop()
  mutable std::mutex mu_;
  std::condition_variable reaper_cv_;
  std::condition_variable stopped_cv_;
  bool stopping_ = false;                                            // guarded by mu_
  bool stopped_ = false;                                             // guarded by mu_
  std::list<std::unique_ptr<Conn>> conns_;                           // guarded by mu_
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions_;  // guarded by mu_
  std::unordered_map<uint64_t, std::vector<Conn*>> session_conns_;   // guarded by mu_

  std::atomic<uint64_t> open_conns_{0};
  std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0}, reads_{0}, writes_{0};
  std::atomic<uint64_t> errors_{0}, sessions_expired_{0};

 public:
  uint16_t metrics_port_ = 0;
  std::vector<wire::ClientInfo> clients(uint64_t after, size_t max) const;

 private:
  int64_t started_ms_ = 0;
  int64_t started_unix_s_ = 0;
  Fd metrics_listen_;
  std::thread metrics_thread_;
  std::mutex metrics_mu_;      // closing metrics_conn_ vs. stop() shutting it down
  int metrics_conn_ = -1;      // guarded by metrics_mu_: the request being answered
  bool metrics_stop_ = false;  // guarded by metrics_mu_
};

void DonorServer::Impl::Worker::error(uint64_t tag, Errc code, const char* fmt, ...) noexcept {
  char msg[wire::kMaxErrorMessage + 1];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t len = n < 0 ? 0 : std::min<size_t>(static_cast<size_t>(n), wire::kMaxErrorMessage);
  wire::encode_error(out, tag, code, std::string_view(msg, len));
  srv->errors_.fetch_add(1, std::memory_order_relaxed);
  FARMEM_LOG(kDebug, "to %s: ERROR %s: %s", conn->peer.c_str(), errc_name(code), msg);
}

Status DonorServer::Impl::init() {
  const DonorOptions& o = opts_;
#ifndef FARMEM_HAVE_VERBS
  if (o.transport == DonorTransportMode::kVerbs)
    return make_error(Errc::kUnavailable,
                      "--transport verbs, but verbs cannot serve %s: rdma-core was not found at "
                      "build time; use --transport tcp (or auto)",
                      o.listen.host.c_str());
  if (o.transport == DonorTransportMode::kAuto)
    FARMEM_LOG(kInfo, "transport auto: serving the tcp data path (no verbs in this build)");
#else
  // verbs: an rdma_cm listener on the same address and port number (see
  // runtime/verbs_transport.h); the tcp data path is served either way.
  if (o.transport != DonorTransportMode::kTcp) {
    std::string why;
    if (verbs::reachable(o.listen.host, &why)) {
      VerbsDonor::Hooks h;
      h.session_secret = [this](uint64_t id, VerbsDonor::Secret* secret) {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = sessions_.find(id);
        if (it == sessions_.end()) return false;
        *secret = it->second->secret;
        return true;
      };
      h.max_qps_per_session = o.max_connections_per_session;
      auto v = VerbsDonor::create(std::move(h));
      if (!v.ok()) return v.status().with_context("verbs transport");
      verbs_ = std::move(*v);
      FARMEM_LOG(kInfo, "transport %s: serving verbs (%s) and tcp",
                 donor_transport_name(o.transport), why.c_str());
    } else if (o.transport == DonorTransportMode::kVerbs) {
      return make_error(Errc::kUnavailable,
                        "--transport verbs, but verbs cannot serve %s: %s; use --transport tcp "
                        "or auto, or listen on an RDMA interface's address",
                        o.listen.host.c_str(), why.c_str());
    } else {
      FARMEM_LOG(kInfo, "transport auto: serving the tcp data path only (%s)", why.c_str());
    }
  }
#endif
  if (o.token.empty() && !o.insecure)
    return make_error(Errc::kInvalidArgument,
                      "no token: give a shared secret (--token-file FILE) so that only its "
                      "holders can use this donor, or allow any client explicitly (--insecure)");
  if (o.max_clients == 0)
    return make_error(Errc::kInvalidArgument, "max_clients is 0: allow at least 1 client");
  if (o.heartbeat_ms == 0)
    return make_error(Errc::kInvalidArgument, "heartbeat interval is 0: use at least 1 ms");
  if (o.grace_ms <= o.heartbeat_ms)
    return make_error(Errc::kInvalidArgument,
                      "heartbeat grace (%u ms) must be longer than the heartbeat interval (%u "
                      "ms), or every client would expire between two heartbeats",
                      o.grace_ms, o.heartbeat_ms);
  if (o.handshake_timeout_ms == 0)
    return make_error(Errc::kInvalidArgument, "handshake timeout is 0: use at least 1 ms");
  if (o.send_timeout_ms == 0)
    return make_error(Errc::kInvalidArgument, "send timeout is 0: use at least 1 ms");
  if (o.max_connections_per_session == 0)
    return make_error(Errc::kInvalidArgument, "max_connections_per_session is 0: allow at least 1");
  max_connections_ =
      o.max_connections
          ? o.max_connections
          : static_cast<uint32_t>(std::min<uint64_t>(uint64_t{o.max_clients} * 4 + 16, 1u << 20));

  SlabPoolOptions po;
  po.capacity = o.capacity;
  po.slab_size = o.slab_size;
  po.quota_per_owner = o.quota_per_client;
  po.try_hugepages = o.try_hugepages;
  // VERBS: the verbs issue passes its SlabRegistrar here (one registration
  // of the whole pool, per-client rkeys in describe()).
  po.registrar = nullptr;
#ifdef FARMEM_HAVE_VERBS
  po.registrar = verbs_.get();
#endif
  po.shared = o.local_clients && po.registrar == nullptr;
  auto pool = SlabPool::create(po);
  if (!pool.ok()) return pool.status();
  pool_ = std::move(*pool);

  auto fd = tcp_listen(o.listen);
  if (!fd.ok()) return fd.status();
  listen_ = std::move(*fd);
  port_ = local_port(listen_.get());
  instance_id_ = random_u64();
#ifdef FARMEM_HAVE_VERBS
  if (verbs_) FARMEM_RETURN_IF_ERROR(verbs_->listen(Endpoint{o.listen.host, port_}, instance_id_));
#endif
  if (o.insecure)
    FARMEM_LOG(kWarn,
               "running with --insecure: ANY client that can reach %s may lease, read and "
               "write donor memory; use --token-file outside of tests",
               Endpoint{o.listen.host, port_}.to_string().c_str());

  started_ms_ = now_ms();
  started_unix_s_ = static_cast<int64_t>(time(nullptr));
  if (o.metrics_listen) {
    Endpoint ep = *o.metrics_listen;
    if (ep.host.empty()) ep.host = "127.0.0.1";
    auto mfd = tcp_listen(ep, 16);
    if (!mfd.ok())
      return mfd.status().with_context("metrics endpoint (--metrics-listen " + ep.to_string() +
                                       ")");
    metrics_listen_ = std::move(*mfd);
    metrics_port_ = local_port(metrics_listen_.get());
  }

  try {
    accept_thread_ = std::thread(&Impl::accept_loop, this);
    reaper_thread_ = std::thread(&Impl::reaper_loop, this);
    if (metrics_listen_.valid()) metrics_thread_ = std::thread(&Impl::metrics_loop, this);
  } catch (const std::system_error& e) {
    return make_error(Errc::kResourceExhausted, "cannot start the donor threads: %s", e.what());
  }
  return ok_status();
}

void DonorServer::Impl::refuse(int fd, Errc code, const char* msg) {
  std::vector<uint8_t> b;
  wire::encode_error(b, 0, code, msg);
  errors_.fetch_add(1, std::memory_order_relaxed);
  // Never block the accept thread on a stranger.
  (void)!send(fd, b.data(), b.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  close(fd);
}

void DonorServer::Impl::accept_loop() {
  int64_t last_warn = 0;
  while (true) {
    int fd = accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_) return;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (now_ms() - last_warn > 10000) {
        FARMEM_LOG(kWarn, "accept on port %u failed: %s; retrying", port_, strerror(errno));
        last_warn = now_ms();
      }
      // Out of descriptors or memory: back off instead of spinning.
      pollfd p{listen_.get(), 0, 0};
      poll(&p, 1, 50);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    if (open_conns_.load() >= max_connections_) {
      char msg[160];
      snprintf(msg, sizeof msg,
               "farmemd already has %u connections open, its limit: retry later or raise "
               "--max-clients",
               max_connections_);
      refuse(fd, Errc::kResourceExhausted, msg);
      continue;
    }
    auto c = std::make_unique<Conn>();
    c->fd.reset(fd);
    c->peer = peer_name(fd);
    Conn* raw = c.get();
    try {
      // Under mu_: the reaper cannot see this connection finished (and join
      // it) before `thread` is assigned.
      raw->thread = std::thread(&Impl::serve, this, raw);
    } catch (const std::system_error&) {
      refuse(c->fd.release(), Errc::kResourceExhausted,
             "farmemd cannot start a thread for this connection: retry later");
      continue;
    }
    open_conns_.fetch_add(1);
    conns_.push_back(std::move(c));
  }
}

void DonorServer::Impl::reaper_loop() {
  const auto tick = std::chrono::milliseconds(std::clamp<uint32_t>(opts_.grace_ms / 4, 10, 250));
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    reaper_cv_.wait_for(lk, tick);
    if (stopping_) break;
    int64_t now = now_ms();
    std::vector<uint64_t> expired;
    for (auto& [id, s] : sessions_)
      if (now - s->last_frame_ms.load() > static_cast<int64_t>(opts_.grace_ms))
        expired.push_back(id);
    lk.unlock();
    for (uint64_t id : expired) end_session(id, true);
    join_finished();
    lk.lock();
  }
}

void DonorServer::Impl::join_finished() {
  std::vector<std::unique_ptr<Conn>> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->finished) {
        done.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done) c->thread.join();
}

void DonorServer::Impl::end_session(uint64_t id, bool expired) {
  std::shared_ptr<Session> s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    s = std::move(it->second);
    sessions_.erase(it);
    // Its control and data connections stop now; their threads see EOF.
    if (auto cit = session_conns_.find(id); cit != session_conns_.end()) {
      for (Conn* c : cit->second)
        if (!c->finished) shutdown(c->fd.get(), SHUT_RDWR);
      session_conns_.erase(cit);
    }
  }
#ifdef FARMEM_HAVE_VERBS
  // QPs first, so that the session's ops stop before its MRs go.
  if (verbs_) verbs_->session_ended(id);
#endif
  size_t n = pool_->release_all(id);
  // Counted once the leases are back, so whoever sees the count sees them free.
  if (expired) sessions_expired_.fetch_add(1);
  if (expired)
    FARMEM_LOG(kInfo,
               "session %016" PRIx64 " of client %016" PRIx64
               " at %s sent nothing for %u ms (heartbeat grace): released its %zu slab(s)",
               id, s->client_id, s->peer.c_str(), opts_.grace_ms, n);
  else
    FARMEM_LOG(kDebug, "session %016" PRIx64 " ended: released %zu slab(s)", id, n);
}

void DonorServer::Impl::linger_close(int fd) {
  // Half-close, then drain what the peer already sent: closing a socket
  // with unread input resets it, and the reset can destroy the ERROR frame
  // the peer has not read yet.
  shutdown(fd, SHUT_WR);
  int64_t deadline = now_ms() + kLingerMs;
  size_t drained = 0;
  uint8_t sink[4096];
  while (drained < kLingerBytes) {
    int64_t left = deadline - now_ms();
    if (left <= 0) break;
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
}

void DonorServer::Impl::serve(Conn* c) {
  Worker w{this, c, c->fd.get(), {}, {}, {}, {}, {}};
  w.out.reserve(kFlushBytes + 2 * wire::kHeaderSize + wire::kMaxErrorMessage + 64);
  run(w);
  uint64_t session = c->session;
  if (c->control && session != 0) end_session(session, false);
  std::lock_guard<std::mutex> lk(mu_);
  if (!c->control && session != 0) {
    if (auto it = session_conns_.find(session); it != session_conns_.end())
      std::erase(it->second, c);
  }
  c->finished = true;
  c->fd.reset();
  open_conns_.fetch_sub(1);
  reaper_cv_.notify_all();
}

void DonorServer::Impl::run(Worker& w) {
  (void)set_socket_timeouts(w.fd, 0, static_cast<int>(opts_.send_timeout_ms));
  std::shared_ptr<Session> session;
  if (!handshake(w, &session)) {
    if (w.flush() == Errc::kOk) linger_close(w.fd);
    return;
  }
  if (session)
    control_loop(w, session);
  else
    data_loop(w);
}

bool DonorServer::Impl::handshake(Worker& w, std::shared_ptr<Session>* session) {
  const int64_t deadline = now_ms() + opts_.handshake_timeout_ms;
  uint8_t hdr[wire::kHeaderSize];
  uint8_t payload[64];
  wire::Header h;
  const char* why = nullptr;

  // Reads one whole frame of the handshake into hdr/payload.
  auto read_frame = [&](const char* expecting) -> bool {
    Errc e = recv_until(w.fd, hdr, sizeof hdr, deadline);
    if (e == Errc::kTimeout) {
      w.error(0, Errc::kTimeout,
              "no %s within the %u ms handshake timeout: a connection must start with the "
              "farmem handshake",
              expecting, opts_.handshake_timeout_ms);
      return false;
    }
    if (e != Errc::kOk) return false;
    if (wire::decode_header(hdr, &h, &why) != Errc::kOk) {
      w.error(0, Errc::kProtocol, "bad frame header while expecting %s: %s; closing", expecting,
              why);
      return false;
    }
    if (h.payload_len > sizeof payload) {
      // Only types that never occur in a handshake can be this long.
      w.error(h.tag, Errc::kProtocol,
              "expected %s, got %s: a connection must start with the farmem handshake", expecting,
              wire::msg_type_name(h.type));
      return false;
    }
    e = recv_until(w.fd, payload, h.payload_len, deadline);
    if (e == Errc::kTimeout)
      w.error(h.tag, Errc::kTimeout, "%s not completed within the %u ms handshake timeout",
              expecting, opts_.handshake_timeout_ms);
    return e == Errc::kOk;
  };

  if (!read_frame("HELLO")) return false;
  if (h.type != MsgType::kHello) {
    w.error(h.tag, Errc::kProtocol,
            "expected HELLO as the first frame, got %s: a connection must start with the "
            "farmem handshake",
            wire::msg_type_name(h.type));
    return false;
  }
  Status st = wire::decode_hello({payload, h.payload_len}, &w.hello);
  if (!st.ok()) {
    w.error(h.tag, st);
    return false;
  }
  const uint64_t hello_tag = h.tag;
  random_bytes(w.nonce);
  wire::Challenge ch;
  ch.instance_id = instance_id_;
  ch.nonce = w.nonce;
#if defined(FARMEM_HAVE_VERBS)
  if (verbs_) ch.flags |= wire::kChallengeVerbs;
#endif
  wire::encode_challenge(w.out, hello_tag, ch);
  if (w.flush() != Errc::kOk) return false;

  const bool control = w.hello.role == wire::Role::kControl;
  const char* expecting = control ? "AUTH" : "ATTACH";
  if (!read_frame(expecting)) return false;
  if (h.type != (control ? MsgType::kAuth : MsgType::kAttach)) {
    w.error(h.tag, Errc::kProtocol, "expected %s after CHALLENGE, got %s", expecting,
            wire::msg_type_name(h.type));
    return false;
  }

  if (control) {
    wire::Auth a;
    st = wire::decode_auth({payload, h.payload_len}, &a);
    if (!st.ok()) {
      w.error(h.tag, st);
      return false;
    }
    if (!opts_.token.empty()) {
      Mac want =
          auth_mac({reinterpret_cast<const uint8_t*>(opts_.token.data()), opts_.token.size()},
                   w.nonce, w.hello.client_id);
      if (!mac_equal(want, a.mac)) {
        w.error(h.tag, Errc::kUnauthenticated,
                "authentication failed: the client's token does not match this donor's "
                "--token-file; give the client the same token");
        FARMEM_LOG(kWarn, "client %016" PRIx64 " at %s failed authentication", w.hello.client_id,
                   w.conn->peer.c_str());
        return false;
      }
    }
    auto s = std::make_shared<Session>();
    s->client_id = w.hello.client_id;
    s->peer = w.conn->peer;
    random_bytes(s->secret);
    s->last_frame_ms.store(now_ms());
    s->opened_ms = now_ms();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (sessions_.size() >= opts_.max_clients) {
        w.error(h.tag, Errc::kResourceExhausted,
                "farmemd already serves %u clients (--max-clients): retry later or use another "
                "donor",
                opts_.max_clients);
        return false;
      }
      do s->id = random_u64();
      while (s->id == 0 || sessions_.count(s->id) != 0);
      sessions_[s->id] = s;
      session_conns_[s->id].push_back(w.conn);
      w.conn->session = s->id;
      w.conn->control = true;
    }
    FARMEM_LOG(kDebug, "session %016" PRIx64 " opened for client %016" PRIx64 " at %s", s->id,
               s->client_id, s->peer.c_str());
    wire::Welcome wl;
    wl.session_id = s->id;
    wl.secret = s->secret;
    wl.capacity = pool_->capacity();
    wl.slab_size = pool_->slab_size();
    wl.quota = pool_->quota();
    wl.heartbeat_ms = opts_.heartbeat_ms;
    wl.grace_ms = opts_.grace_ms;
    wl.instance_id = instance_id_;
    wire::encode_welcome(w.out, h.tag, wl);
    *session = std::move(s);
    return w.flush() == Errc::kOk;
  }

  wire::Attach at;
  st = wire::decode_attach({payload, h.payload_len}, &at);
  if (!st.ok()) {
    w.error(h.tag, st);
    return false;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sessions_.find(at.session_id);
    if (it == sessions_.end()) {
      w.error(h.tag, Errc::kNotFound,
              "ATTACH to session %016" PRIx64
              ", which does not exist (it ended or expired): open a new control session",
              at.session_id);
      return false;
    }
    Mac want = attach_mac(it->second->secret, w.nonce);
    if (!mac_equal(want, at.mac)) {
      w.error(h.tag, Errc::kUnauthenticated,
              "ATTACH to session %016" PRIx64
              " refused: the proof does not match the session secret from WELCOME",
              at.session_id);
      return false;
    }
    auto& list = session_conns_[at.session_id];
    // The control connection is in the list too.
    if (list.size() > opts_.max_connections_per_session) {
      w.error(h.tag, Errc::kResourceExhausted,
              "session %016" PRIx64 " already has %u data connections, the limit: reuse them",
              at.session_id, opts_.max_connections_per_session);
      return false;
    }
    list.push_back(w.conn);
    w.conn->session = at.session_id;
    w.sess = it->second;
  }
  wire::encode_empty(w.out, MsgType::kAttached, h.tag);
  return w.flush() == Errc::kOk;
}

namespace {
bool peer_is_loopback(int fd);
}  // namespace

// Local clients. A client on this host (control connection from loopback)
// does not need this daemon on its data path: it can read and write the
// slabs it holds one-sided, with process_vm_readv / process_vm_writev on
// this process, the way a verbs client reads a slab with RDMA READ and
// never wakes the donor's CPU. Measured on the development VM (xz -7 -T1
// of 10 MiB of text at FARMEM_LOCAL_MEM=75M, the programs set's 70% cell;
// docs/eval/l-s23): 67-75 s over tcp, 46-52 s one-sided, output identical.
// A tcp round trip there costs 12.6 us on one CPU and 51 us across two.
//  * Only the slab: each lease gets its own second mapping of the slab
//    (SlabPool::alias(); the pool is shared memory when local clients are
//    on), sent as SlabDesc.addr with this process's pid as SlabDesc.rkey.
//    The mapping goes away when the slab leaves the client (RELEASE, or
//    the session ends or expires), before the slab is zeroed or lent to
//    anyone else, and its addresses are never mapped again: a client that
//    was stopped and comes back late gets EFAULT, never the next client's
//    memory. A shared pool gets transparent huge pages only where
//    /sys/kernel/mm/transparent_hugepage/shmem_enabled allows them, and a
//    huge-page pool (MAP_HUGETLB) cannot be aliased: its clients stay on
//    tcp.
//  * The slab's file: a slab as lent (no I/O yet) moves into a memfd of its
//    own, which this process's mapping of the slab and the view both map
//    (SlabPool::file_view()); the proof page then ends with the file's
//    descriptor number (wire::kLocalFileRecord). The client takes the file
//    with pidfd_getfd() and reads and writes it with pread / pwrite: the
//    page cache of one file instead of this process's page tables, 1.3 us
//    against 2.9 us for 4 KiB. When the slab leaves the client the file is
//    truncated to nothing (it is sealed against growth) before the slab
//    gets fresh pages and is lent again: a late client reads 0 bytes or
//    gets EPERM, never the next client's memory.
//  * Proof: a page of this process right after the view starts with the
//    session secret from WELCOME. The client reads it through the pid and
//    address; only if it matches (same user, ptrace allowed, same pid
//    namespace, the right process) does it use the path. Otherwise the
//    slab stays on tcp. The slab itself starts zeroed either way.
//  * The OS already lets such a client read and write this process
//    (process_vm_* needs ptrace access); the alias only keeps an honest
//    client inside its lease. --local-clients=off keeps every client on tcp.
//  * Pages written one-sided are faulted into this process and charged
//    to its memory cgroup, not to the client's.
// Not with an RDMA device in use: SlabDesc.addr and rkey are then the
// verbs registration's.
void DonorServer::Impl::offer_local(const Session& s, wire::Leased* l) {
  const auto pid = static_cast<uint32_t>(getpid());
  for (auto& d : l->slabs) {
    auto a = pool_->alias(s.id, d.slab, s.secret);
    if (!a.ok()) {
      static std::atomic<bool> told{false};
      if (!told.exchange(true))
        FARMEM_LOG(kInfo, "slab %u stays tcp-only for session %016" PRIx64 " on this host: %s",
                   d.slab, s.id, a.status().to_string().c_str());
      continue;
    }
    d.addr = *a;
    d.rkey = pid;
    local_slabs_lent_.fetch_add(1, std::memory_order_relaxed);
  }
}

void DonorServer::Impl::control_loop(Worker& w, const std::shared_ptr<Session>& s) {
  uint8_t hdr[wire::kHeaderSize];
  uint8_t payload[16];
  wire::Header h;
  const char* why = nullptr;
  bool ok = true;
  // No receive timeout: the reaper shuts this connection down when it has
  // been silent for grace_ms.
  while (ok) {
    if (recv_all(w.fd, hdr, sizeof hdr) != Errc::kOk) return;
    if (wire::decode_header(hdr, &h, &why) != Errc::kOk) {
      w.error(0, Errc::kProtocol, "bad frame header on the control connection: %s; closing", why);
      break;
    }
    switch (h.type) {
      case MsgType::kLease:
      case MsgType::kRelease:
      case MsgType::kHeartbeat:
      case MsgType::kStats:
      case MsgType::kClients:
        break;
      default:
        w.error(h.tag, Errc::kProtocol,
                "%s is not allowed on a control connection (only LEASE, RELEASE, HEARTBEAT, "
                "STATS and CLIENTS are); closing",
                wire::msg_type_name(h.type));
        ok = false;
        continue;
    }
    // These requests carry at most 8 bytes (checked by decode_header).
    if (recv_all(w.fd, payload, h.payload_len) != Errc::kOk) return;
    s->last_frame_ms.store(now_ms());
    std::span<const uint8_t> p(payload, h.payload_len);
    switch (h.type) {
      case MsgType::kLease: {
        wire::LeaseReq req;
        Status st = wire::decode_lease(p, &req);
        if (!st.ok()) {
          w.error(h.tag, st);
          break;
        }
        auto r = pool_->lease(s->id, req.bytes);
        if (!r.ok()) {
          w.error(h.tag, r.status());
          break;
        }
        wire::Leased l;
        l.slabs = std::move(*r);
        if (opts_.local_clients && pool_->shared() && peer_is_loopback(w.fd)) offer_local(*s, &l);
        wire::encode_leased(w.out, h.tag, l);
        break;
      }
      case MsgType::kRelease: {
        wire::ReleaseReq req;
        Status st = wire::decode_release(p, &req);
        if (st.ok()) st = pool_->release(s->id, req.slab);
        if (!st.ok())
          w.error(h.tag, st);
        else
          wire::encode_empty(w.out, MsgType::kReleased, h.tag);
        break;
      }
      case MsgType::kHeartbeat:
        wire::encode_empty(w.out, MsgType::kHeartbeatAck, h.tag);
        break;
      case MsgType::kStats:
        wire::encode_stats_reply(w.out, h.tag, stats());
        break;
      case MsgType::kClients: {
        // Only authenticated control sessions get here: the data role never
        // reaches control_loop, and AUTH checked the token.
        wire::ClientsReq req;
        Status st = wire::decode_clients(p, &req);
        if (!st.ok()) {
          w.error(h.tag, st);
          break;
        }
        wire::ClientsReply r;
        r.clients = clients(req.after_session, wire::kMaxClientsPerReply + 1);
        r.more = r.clients.size() > wire::kMaxClientsPerReply;
        if (r.more) r.clients.resize(wire::kMaxClientsPerReply);
        r.total = static_cast<uint32_t>(stats().clients);
        wire::encode_clients_reply(w.out, h.tag, r);
        break;
      }
      default:
        break;
    }
    if ((pending_input(w.fd) < wire::kHeaderSize || w.out.size() >= kFlushBytes) &&
        w.flush() != Errc::kOk)
      return;
  }
  if (w.flush() == Errc::kOk) linger_close(w.fd);
}

// A data connection from this host (loopback): its thread follows the CPU
// its requests come from (SO_INCOMING_CPU: on loopback the sender's own
// CPU, where the packet was processed). A client's fault handler (pinned,
// one per CPU) sends a READ and waits for it; served on the same CPU, the
// request and the reply are context switches there, instead of waking
// another CPU and being woken back from it, which on this 2-vCPU guest
// costs tens of microseconds each way. Measured (follow off -> on):
// bench/pager_bench.cc BM_ColdFault tcp (in-process donor), cold remote
// fault p50 68.7 -> 57 us (27.1 us with every thread on one CPU, the
// floor); xz -7 -T1 of 4 MiB of text under the preload library at
// FARMEM_LOCAL_MEM=38M against farmemd on 127.0.0.1, two runs each,
// interleaved: 39.5 / 40.0 -> 31.8 / 35.6 s, fetch p99 512 -> 256 us.
// Remote peers are left where they are: their packets arrive on the
// NIC's CPUs, which is no sender's.
namespace {
bool peer_is_loopback(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

// Moves the calling thread to the CPU the last segments on fd were
// processed on, once that CPU has been the same for kFollowAfter receives
// in a row (a sender that stays on one CPU: a pinned fault handler; one
// that moves about is not chased). f.pinned is that CPU, or -2 once a
// move failed (a CPU outside the process's set: stay where the scheduler
// puts us) or following is off.
struct FollowCpu {
  int pinned = -1, last = -1, same = 0;
};
constexpr int kFollowAfter = 4;
void follow_sender_cpu(int fd, FollowCpu& f) {
  int cpu = -1;
  socklen_t len = sizeof cpu;
  if (f.pinned == -2 || getsockopt(fd, SOL_SOCKET, SO_INCOMING_CPU, &cpu, &len) != 0 || cpu < 0)
    return;
  f.same = cpu == f.last ? f.same + 1 : 1;
  f.last = cpu;
  if (cpu == f.pinned || f.same < kFollowAfter) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  f.pinned = sched_setaffinity(0, sizeof set, &set) == 0 ? cpu : -2;
}
}  // namespace

void DonorServer::Impl::data_loop(Worker& w) {
  if (opts_.idle_data_timeout_ms)
    (void)set_socket_timeouts(w.fd, static_cast<int>(opts_.idle_data_timeout_ms),
                              static_cast<int>(opts_.send_timeout_ms));
  w.scratch.resize(kScratchBytes);
  DataBatch b;
  b.rx.resize(kDataRxBytes);
  // A request adds at most two segments and the batch is cut at kBatchSegs:
  // with the trailing range of `out` these never grow on the data path.
  b.segs.reserve(kBatchSegs + 4);
  b.iov.resize(kBatchSegs + 4);
  b.pinned.reserve(kBatchSegs + 4);
  const char* why = nullptr;
  constexpr size_t kReqHead = wire::kHeaderSize + wire::kIoReqSize;
  FollowCpu follow;
  if (!opts_.follow_local_senders || !peer_is_loopback(w.fd)) follow.pinned = -2;
  while (true) {
    // 1. Serve every whole request already received, without a syscall.
    const size_t avail = b.rlen - b.rpos;
    if (avail >= wire::kHeaderSize) {
      const uint8_t* f = b.rx.data() + b.rpos;
      wire::Header h;
      if (wire::decode_header(f, &h, &why) != Errc::kOk) {
        w.error(0, Errc::kProtocol, "bad frame header on the data connection: %s; closing", why);
        break;
      }
      if (h.type != MsgType::kRead && h.type != MsgType::kWrite) {
        w.error(h.tag, Errc::kProtocol,
                "%s is not allowed on a data connection (only READ and WRITE are); closing",
                wire::msg_type_name(h.type));
        break;
      }
      // Refused before waiting for a prefix the frame may never carry.
      if (h.type == MsgType::kWrite && h.payload_len < wire::kIoReqSize) {
        w.error(h.tag, Errc::kProtocol,
                "WRITE payload of %u bytes is shorter than its %zu-byte prefix; closing",
                h.payload_len, wire::kIoReqSize);
        break;
      }
      if (avail >= kReqHead) {
        b.rpos += kReqHead;
        const uint8_t* req = f + wire::kHeaderSize;
        const bool keep = h.type == MsgType::kRead ? do_read(w, b, h, req) : do_write(w, b, h, req);
        if (!keep) break;
        if ((b.segs.size() >= kBatchSegs || b.read_bytes >= kBatchReadBytes ||
             w.out.size() >= kFlushBytes) &&
            flush_batch(w, b) != Errc::kOk)
          return;
        continue;
      }
    }
    // 2. No whole request left: answer the ones served so far before waiting,
    // so a client that waits for its replies before sending more never stalls.
    if (flush_batch(w, b) != Errc::kOk) return;
    // 3. Move the partial request (under kReqHead bytes) to the front and
    // receive as much as has arrived behind it.
    const size_t part = b.rlen - b.rpos;
    if (part > 0 && b.rpos > 0) std::memmove(b.rx.data(), b.rx.data() + b.rpos, part);
    b.rpos = 0;
    b.rlen = part;
    const ssize_t n = ::recv(w.fd, b.rx.data() + part, b.rx.size() - part, 0);
    if (n > 0) {
      b.rlen += static_cast<size_t>(n);
      follow_sender_cpu(w.fd, follow);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      FARMEM_LOG(kDebug, "data connection from %s idle for %u ms: closing", w.conn->peer.c_str(),
                 opts_.idle_data_timeout_ms);
    }
    return;  // idle, closed by the peer, or broken
  }
  if (flush_batch(w, b) == Errc::kOk) linger_close(w.fd);
}

namespace {

// Refusal text for a pin() error; fits an ERROR frame.
void explain_pin(char* buf, size_t n, Errc e, const char* op, const wire::IoReq& r,
                 uint64_t slab_size) {
  switch (e) {
    case Errc::kNotFound:
      snprintf(buf, n, "%s of slab %u refused: this session holds no lease on it (LEASE first)", op,
               r.slab);
      break;
    case Errc::kPermissionDenied:
      snprintf(buf, n, "%s of slab %u refused: that slab is leased to another client", op, r.slab);
      break;
    case Errc::kOutOfRange:
      snprintf(buf, n,
               "%s of %u bytes at offset %" PRIu64 " is outside slab %u (%" PRIu64 " bytes)", op,
               r.length, r.offset, r.slab, slab_size);
      break;
    default:
      snprintf(buf, n, "%s refused: %s", op, errc_name(e));
      break;
  }
}

}  // namespace

bool DonorServer::Impl::do_read(Worker& w, DataBatch& b, const wire::Header& h,
                                const uint8_t* req) {
  wire::IoReq r;
  Status st = wire::decode_io_req({req, wire::kIoReqSize}, &r);
  if (!st.ok()) {
    w.error(h.tag, st);  // the stream is intact: refuse this request only
    return true;
  }
  uint8_t* mem = nullptr;
  Errc e = pool_->pin(w.conn->session, r.slab, r.offset, r.length, &mem);
  if (e != Errc::kOk) {
    char msg[256];
    explain_pin(msg, sizeof msg, e, "READ", r, pool_->slab_size());
    w.error(h.tag, e, "%s", msg);
    return true;
  }
  // Zero copy: the READ_DATA header joins the queued reply bytes, the data is
  // sent straight from the slab, which stays pinned until flush_batch() has
  // sent it.
  b.pinned.push_back(r.slab);
  const size_t at = w.out.size();
  w.out.resize(at + wire::kHeaderSize);
  wire::encode_frame_header(w.out.data() + at, MsgType::kReadData, h.tag, r.length);
  b.segs.push_back({nullptr, b.out_mark, w.out.size() - b.out_mark});
  b.out_mark = w.out.size();
  b.segs.push_back({mem, 0, r.length});
  b.read_bytes += r.length;
  ++b.reads;
  return true;
}

bool DonorServer::Impl::do_write(Worker& w, DataBatch& b, const wire::Header& h,
                                 const uint8_t* req) {
  // data_loop checked payload_len >= kIoReqSize.
  const uint32_t data_len = h.payload_len - static_cast<uint32_t>(wire::kIoReqSize);
  const uint32_t claimed = wire::get_u32(req + 4);
  if (claimed != data_len) {
    w.error(h.tag, Errc::kProtocol,
            "WRITE says %u bytes but its frame carries %u bytes of data; closing", claimed,
            data_len);
    return false;
  }
  wire::IoReq r;
  Status st = wire::decode_io_req({req, wire::kIoReqSize}, &r);  // only length 0 can fail here
  if (!st.ok()) {
    w.error(h.tag, st);
    return true;
  }
  // The data already received, and what is still on its way.
  const uint8_t* in = b.rx.data() + b.rpos;
  const size_t buffered = std::min<size_t>(b.rlen - b.rpos, data_len);
  const size_t rest = data_len - buffered;
  b.rpos += buffered;
  // Check the prefix against the caller's leases BEFORE taking any data:
  // data not yet buffered then lands straight in slab memory.
  uint8_t* mem = nullptr;
  Errc e = pool_->pin(w.conn->session, r.slab, r.offset, r.length, &mem);
  if (e != Errc::kOk) {
    // Swallow the refused data so the stream stays in step; the replies
    // queued so far go out first, the client may be waiting for them.
    if (rest > 0 && flush_batch(w, b) != Errc::kOk) return false;
    size_t left = rest;
    while (left > 0) {
      const size_t chunk = std::min(left, w.scratch.size());
      if (recv_all(w.fd, w.scratch.data(), chunk) != Errc::kOk) return false;
      left -= chunk;
    }
    char msg[256];
    explain_pin(msg, sizeof msg, e, "WRITE", r, pool_->slab_size());
    w.error(h.tag, e, "%s", msg);
    return true;
  }
  std::memcpy(mem, in, buffered);
  if (rest > 0) {
    e = flush_batch(w, b);
    if (e == Errc::kOk) e = recv_all(w.fd, mem + buffered, rest);
  }
  pool_->unpin(r.slab);
  if (e != Errc::kOk) return false;
  writes_.fetch_add(1, std::memory_order_relaxed);
  bytes_written_.fetch_add(r.length, std::memory_order_relaxed);
  w.sess->writes.fetch_add(1, std::memory_order_relaxed);
  w.sess->bytes_written.fetch_add(r.length, std::memory_order_relaxed);
  wire::encode_empty(w.out, MsgType::kWritten, h.tag);
  return true;
}

Errc DonorServer::Impl::flush_batch(Worker& w, DataBatch& b) {
  if (w.out.size() > b.out_mark) b.segs.push_back({nullptr, b.out_mark, w.out.size() - b.out_mark});
  if (b.segs.empty()) return Errc::kOk;
  if (b.iov.size() < b.segs.size()) b.iov.resize(b.segs.size());
  for (size_t i = 0; i < b.segs.size(); ++i) {
    const DataBatch::Seg& s = b.segs[i];
    b.iov[i] = {const_cast<uint8_t*>(s.mem != nullptr ? s.mem : w.out.data() + s.off), s.len};
  }
  // Counted before the send: a client that has its data and then asks for
  // STATS must see these READs.
  reads_.fetch_add(b.reads, std::memory_order_relaxed);
  bytes_read_.fetch_add(b.read_bytes, std::memory_order_relaxed);
  w.sess->reads.fetch_add(b.reads, std::memory_order_relaxed);
  w.sess->bytes_read.fetch_add(b.read_bytes, std::memory_order_relaxed);
  Errc e = sendv_all(w.fd, b.iov.data(), static_cast<int>(b.segs.size()));
  for (uint32_t slab : b.pinned) pool_->unpin(slab);
  if (e != Errc::kOk) {
    reads_.fetch_sub(b.reads, std::memory_order_relaxed);
    bytes_read_.fetch_sub(b.read_bytes, std::memory_order_relaxed);
    w.sess->reads.fetch_sub(b.reads, std::memory_order_relaxed);
    w.sess->bytes_read.fetch_sub(b.read_bytes, std::memory_order_relaxed);
  }
  b.segs.clear();
  b.pinned.clear();
  w.out.clear();
  b.out_mark = 0;
  b.read_bytes = 0;
  b.reads = 0;
  return e;
}

wire::StatsReply DonorServer::Impl::stats() const {
  wire::StatsReply s;
  s.capacity = pool_->capacity();
  s.leased = pool_->leased_bytes();
  s.slab_size = pool_->slab_size();
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.clients = sessions_.size();
  }
  s.connections = open_conns_.load();
  s.bytes_read = bytes_read_.load();
  s.bytes_written = bytes_written_.load();
  s.reads = reads_.load();
  s.writes = writes_.load();
  s.errors = errors_.load();
  s.sessions_expired = sessions_expired_.load();
  s.instance_id = instance_id_;
  return s;
}

std::vector<wire::ClientInfo> DonorServer::Impl::clients(uint64_t after, size_t max) const {
  struct Row {
    std::shared_ptr<Session> s;
    uint32_t data_conns;
  };
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [id, sp] : sessions_) {
      if (id <= after) continue;
      auto it = session_conns_.find(id);
      // The list holds the control connection too.
      uint32_t n = it == session_conns_.end() ? 0 : static_cast<uint32_t>(it->second.size());
      rows.push_back({sp, n > 0 ? n - 1 : 0});
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.s->id < b.s->id; });
  if (rows.size() > max) rows.resize(max);
  // The pool has its own lock; it is never taken under mu_.
  const int64_t now = now_ms();
  std::vector<wire::ClientInfo> out;
  out.reserve(rows.size());
  for (const Row& r : rows) {
    const Session& s = *r.s;
    wire::ClientInfo c;
    c.session_id = s.id;
    c.client_id = s.client_id;
    c.leased = pool_->leased_bytes(s.id);
    c.bytes_read = s.bytes_read.load(std::memory_order_relaxed);
    c.bytes_written = s.bytes_written.load(std::memory_order_relaxed);
    c.reads = s.reads.load(std::memory_order_relaxed);
    c.writes = s.writes.load(std::memory_order_relaxed);
    c.age_ms = static_cast<uint64_t>(std::max<int64_t>(0, now - s.opened_ms));
    c.data_conns = r.data_conns;
    c.idle_ms = static_cast<uint32_t>(
        std::clamp<int64_t>(now - s.last_frame_ms.load(), 0, int64_t{UINT32_MAX}));
    c.peer = s.peer;
    out.push_back(std::move(c));
  }
  return out;
}

namespace {

// Prometheus text format 0.0.4: one family = # HELP, # TYPE, its samples.
// Label values escape backslash, double quote and newline.
void prom_family(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void prom_label_value(std::string& out, std::string_view v) {
  out += '"';
  for (char ch : v) {
    if (ch == '\\')
      out += "\\\\";
    else if (ch == '"')
      out += "\\\"";
    else if (ch == '\n')
      out += "\\n";
    else
      out += ch;
  }
  out += '"';
}

void prom_sample(std::string& out, const char* name, uint64_t v) {
  out += name;
  out += ' ';
  out += std::to_string(v);
  out += '\n';
}

std::string hex64(uint64_t v) {
  char b[17];
  snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

}  // namespace

std::string DonorServer::Impl::prometheus_text() const {
  const wire::StatsReply st = stats();
  const std::vector<wire::ClientInfo> cl = clients(0, SIZE_MAX);
  std::string o;
  o.reserve(4096 + cl.size() * 600);
  struct G {
    const char* name;
    const char* type;
    const char* help;
    uint64_t v;
  };
  const G totals[] = {
      {"farmem_donor_capacity_bytes", "gauge", "Memory this donor lends at most.", st.capacity},
      {"farmem_donor_leased_bytes", "gauge", "Donor memory currently leased to clients.",
       st.leased},
      {"farmem_donor_free_bytes", "gauge",
       "Donor memory not leased now (capacity - leased; released slabs count once zeroed).",
       st.capacity - std::min(st.capacity, st.leased)},
      {"farmem_donor_slab_size_bytes", "gauge", "Lease granularity.", st.slab_size},
      {"farmem_donor_clients", "gauge", "Client sessions alive now.", st.clients},
      {"farmem_donor_connections", "gauge", "TCP connections open now (control and data).",
       st.connections},
      {"farmem_donor_read_bytes_total", "counter", "Bytes served to clients by READ.",
       st.bytes_read},
      {"farmem_donor_written_bytes_total", "counter", "Bytes received from clients by WRITE.",
       st.bytes_written},
      {"farmem_donor_reads_total", "counter", "READ requests served.", st.reads},
      {"farmem_donor_writes_total", "counter", "WRITE requests served.", st.writes},
      {"farmem_donor_errors_total", "counter", "ERROR frames sent (refused requests).", st.errors},
      {"farmem_donor_sessions_expired_total", "counter",
       "Sessions whose leases were released after missed heartbeats.", st.sessions_expired},
      {"farmem_donor_start_time_seconds", "gauge", "Start time of the donor, seconds since 1970.",
       static_cast<uint64_t>(started_unix_s_)},
  };
  for (const G& g : totals) {
    prom_family(o, g.name, g.type, g.help);
    prom_sample(o, g.name, g.v);
  }
  prom_family(o, "farmem_donor_info", "gauge",
              "Constant 1, labelled with this donor's instance id and data transport.");
  o += "farmem_donor_info{instance=\"" + hex64(instance_id_) + "\",transport=\"tcp\"} 1\n";

  struct PerClient {
    const char* name;
    const char* type;
    const char* help;
    uint64_t wire::ClientInfo::*field;
  };
  const PerClient per[] = {
      {"farmem_donor_client_leased_bytes", "gauge", "Donor memory leased to one client session.",
       &wire::ClientInfo::leased},
      {"farmem_donor_client_read_bytes_total", "counter",
       "Bytes served by READ to one client session.", &wire::ClientInfo::bytes_read},
      {"farmem_donor_client_written_bytes_total", "counter",
       "Bytes received by WRITE from one client session.", &wire::ClientInfo::bytes_written},
  };
  for (const PerClient& f : per) {
    prom_family(o, f.name, f.type, f.help);
    for (const wire::ClientInfo& c : cl) {
      o += f.name;
      o += "{session=\"" + hex64(c.session_id) + "\",client=\"" + hex64(c.client_id) + "\",peer=";
      prom_label_value(o, c.peer);
      o += "} ";
      o += std::to_string(c.*f.field);
      o += '\n';
    }
  }
  return o;
}

void DonorServer::Impl::metrics_loop() {
  while (true) {
    int fd = accept4(metrics_listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      {
        std::lock_guard<std::mutex> lk(metrics_mu_);
        if (metrics_stop_) return;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      pollfd p{metrics_listen_.get(), 0, 0};
      poll(&p, 1, 50);  // out of descriptors: back off instead of spinning
      continue;
    }
    {
      std::lock_guard<std::mutex> lk(metrics_mu_);
      if (metrics_stop_) {
        close(fd);
        return;
      }
      metrics_conn_ = fd;
    }
    serve_metrics(fd);
    std::lock_guard<std::mutex> lk(metrics_mu_);
    metrics_conn_ = -1;
    close(fd);
  }
}

void DonorServer::Impl::serve_metrics(int fd) {
  // One request per connection; a scraper that does not send its request
  // within 2 s is dropped so that it cannot hold the endpoint.
  constexpr int64_t kRequestMs = 2000;
  (void)set_socket_timeouts(fd, 0, static_cast<int>(kRequestMs));
  const int64_t deadline = now_ms() + kRequestMs;
  char req[4096];
  size_t got = 0;
  while (got < sizeof req) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return;
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
    ssize_t n = recv(fd, req + got, sizeof req - got, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    got += static_cast<size_t>(n);
    if (std::string_view(req, got).find("\r\n\r\n") != std::string_view::npos ||
        std::string_view(req, got).find("\n\n") != std::string_view::npos)
      break;
  }
  std::string_view line(req, got);
  line = line.substr(0, line.find_first_of("\r\n"));
  // "METHOD SP TARGET SP HTTP/x.y"
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  std::string_view method = line.substr(0, sp1);
  std::string_view target =
      sp1 == std::string_view::npos ? std::string_view() : line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (size_t q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
  int code = 200;
  std::string body;
  const char* ctype = "text/plain; version=0.0.4; charset=utf-8";
  if (sp2 == std::string_view::npos || !line.substr(sp2 + 1).starts_with("HTTP/")) {
    code = 400;
    body = "farmemd: malformed HTTP request line; ask with GET /metrics HTTP/1.0\n";
  } else if (method != "GET" && method != "HEAD") {
    code = 405;
    body = "farmemd: only GET and HEAD are served; ask with GET /metrics\n";
  } else if (target != "/metrics") {
    code = 404;
    body = "farmemd: nothing here; the Prometheus metrics are at /metrics\n";
  } else {
    body = prometheus_text();
  }
  if (code != 200) ctype = "text/plain; charset=utf-8";
  const char* reason = code == 200   ? "OK"
                       : code == 400 ? "Bad Request"
                       : code == 404 ? "Not Found"
                                     : "Method Not Allowed";
  std::string resp = "HTTP/1.0 " + std::to_string(code) + " " + reason +
                     "\r\nContent-Type: " + ctype +
                     "\r\nContent-Length: " + std::to_string(body.size()) +
                     (code == 405 ? "\r\nAllow: GET, HEAD" : "") + "\r\nConnection: close\r\n\r\n";
  if (method != "HEAD") resp += body;
  if (send_all(fd, resp.data(), resp.size()) == Errc::kOk) linger_close(fd);
}

void DonorServer::Impl::stop() {
  std::lock_guard<std::mutex> stop_lk(stop_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_) return;
    stopping_ = true;
    reaper_cv_.notify_all();
  }
  // shutdown() wakes a thread blocked in accept() on Linux.
  if (listen_.valid()) shutdown(listen_.get(), SHUT_RDWR);
  if (metrics_listen_.valid()) shutdown(metrics_listen_.get(), SHUT_RDWR);
  {
    std::lock_guard<std::mutex> mlk(metrics_mu_);
    metrics_stop_ = true;
    if (metrics_conn_ >= 0) shutdown(metrics_conn_, SHUT_RDWR);
  }
  if (metrics_thread_.joinable()) metrics_thread_.join();
  metrics_listen_.reset();
  if (accept_thread_.joinable()) accept_thread_.join();
  if (reaper_thread_.joinable()) reaper_thread_.join();
#ifdef FARMEM_HAVE_VERBS
  // Every QP disconnects now: the clients' ops on them complete at once.
  if (verbs_) verbs_->stop();
#endif
  std::list<std::unique_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& c : conns_)
      if (!c->finished) shutdown(c->fd.get(), SHUT_RDWR);
    conns.swap(conns_);
  }
  // Connection threads end their sessions (releasing the leases) on the way out.
  for (auto& c : conns) c->thread.join();
  listen_.reset();
  std::vector<uint64_t> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [id, s] : sessions_) left.push_back(id);
  }
  for (uint64_t id : left) end_session(id, false);
  std::lock_guard<std::mutex> lk(mu_);
  stopped_ = true;
  stopped_cv_.notify_all();
}

// ---- DonorServer ------------------------------------------------------------

DonorServer::DonorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DonorServer::~DonorServer() {
  if (impl_) impl_->stop();
}

Result<std::unique_ptr<DonorServer>> DonorServer::start(const DonorOptions& opts) {
  auto impl = std::make_unique<Impl>(opts);
  Status st = impl->init();
  if (!st.ok()) return st;
  return std::unique_ptr<DonorServer>(new DonorServer(std::move(impl)));
}

void DonorServer::stop() {
  impl_->stop();
}
void DonorServer::wait() {
  impl_->wait();
}
uint16_t DonorServer::port() const {
  return impl_->port_;
}
wire::StatsReply DonorServer::stats() const {
  return impl_->stats();
}
uint64_t DonorServer::instance_id() const {
  return impl_->instance_id_;
}
uint64_t DonorServer::local_slabs_lent() const {
  return impl_->local_slabs_lent_.load(std::memory_order_relaxed);
}
bool DonorServer::huge_pages() const {
  return impl_->pool_->huge_pages();
}
uint16_t DonorServer::metrics_port() const {
  return impl_->metrics_port_;
}
std::vector<wire::ClientInfo> DonorServer::clients() const {
  return impl_->clients(0, SIZE_MAX);
}
std::string DonorServer::prometheus_text() const {
  return impl_->prometheus_text();
}

}  // namespace farmem
