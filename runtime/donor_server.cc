#include "runtime/donor_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/auth.h"
#include "runtime/log.h"
#include "runtime/net.h"
#include "runtime/slab_pool.h"

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
constexpr size_t kLingerBytes = 256 << 10;  // drained after an error before close
constexpr int kLingerMs = 200;

struct Session {
  uint64_t id = 0;
  uint64_t client_id = 0;
  std::array<uint8_t, wire::kSecretSize> secret{};
  std::string peer;
  std::atomic<int64_t> last_frame_ms{0};
};

struct Conn {
  Fd fd;  // closed by its own thread under mu_, so shutdown() never hits a reused number
  std::thread thread;
  std::string peer;
  bool finished = false;  // guarded by mu_
  uint64_t session = 0;   // set once by the handshake, under mu_
  bool control = false;
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

  uint16_t port_ = 0;
  uint64_t instance_id_ = 0;
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
  void data_loop(Worker& w);
  // false: the connection must close.
  bool do_read(Worker& w, const wire::Header& h);
  bool do_write(Worker& w, const wire::Header& h);
  void end_session(uint64_t id, bool expired);
  void refuse(int fd, Errc code, const char* msg);
  void linger_close(int fd);
  void join_finished();

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
  if (o.transport == DonorTransportMode::kVerbs)
    return make_error(Errc::kUnavailable,
                      "verbs transport not available in this build yet: use --transport tcp "
                      "(or auto)");
  if (o.transport == DonorTransportMode::kAuto)
    FARMEM_LOG(kInfo, "transport auto: serving the tcp data path");
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
  auto pool = SlabPool::create(po);
  if (!pool.ok()) return pool.status();
  pool_ = std::move(*pool);

  auto fd = tcp_listen(o.listen);
  if (!fd.ok()) return fd.status();
  listen_ = std::move(*fd);
  port_ = local_port(listen_.get());
  instance_id_ = random_u64();
  if (o.insecure)
    FARMEM_LOG(kWarn,
               "running with --insecure: ANY client that can reach %s may lease, read and "
               "write donor memory; use --token-file outside of tests",
               Endpoint{o.listen.host, port_}.to_string().c_str());

  try {
    accept_thread_ = std::thread(&Impl::accept_loop, this);
    reaper_thread_ = std::thread(&Impl::reaper_loop, this);
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
  Worker w{this, c, c->fd.get(), {}, {}, {}, {}};
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
  }
  wire::encode_empty(w.out, MsgType::kAttached, h.tag);
  return w.flush() == Errc::kOk;
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
        break;
      default:
        w.error(h.tag, Errc::kProtocol,
                "%s is not allowed on a control connection (only LEASE, RELEASE, HEARTBEAT and "
                "STATS are); closing",
                wire::msg_type_name(h.type));
        ok = false;
        continue;
    }
    // The four requests carry at most 8 bytes (checked by decode_header).
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
      default:
        break;
    }
    if ((pending_input(w.fd) < wire::kHeaderSize || w.out.size() >= kFlushBytes) &&
        w.flush() != Errc::kOk)
      return;
  }
  if (w.flush() == Errc::kOk) linger_close(w.fd);
}

void DonorServer::Impl::data_loop(Worker& w) {
  if (opts_.idle_data_timeout_ms)
    (void)set_socket_timeouts(w.fd, static_cast<int>(opts_.idle_data_timeout_ms),
                              static_cast<int>(opts_.send_timeout_ms));
  w.scratch.resize(kScratchBytes);
  uint8_t hdr[wire::kHeaderSize];
  wire::Header h;
  const char* why = nullptr;
  while (true) {
    Errc e = recv_all(w.fd, hdr, sizeof hdr);
    if (e == Errc::kTimeout) {
      FARMEM_LOG(kDebug, "data connection from %s idle for %u ms: closing", w.conn->peer.c_str(),
                 opts_.idle_data_timeout_ms);
      return;
    }
    if (e != Errc::kOk) return;
    bool keep;
    if (wire::decode_header(hdr, &h, &why) != Errc::kOk) {
      w.error(0, Errc::kProtocol, "bad frame header on the data connection: %s; closing", why);
      keep = false;
    } else if (h.type == MsgType::kRead) {
      keep = do_read(w, h);
    } else if (h.type == MsgType::kWrite) {
      keep = do_write(w, h);
    } else {
      w.error(h.tag, Errc::kProtocol,
              "%s is not allowed on a data connection (only READ and WRITE are); closing",
              wire::msg_type_name(h.type));
      keep = false;
    }
    if (!keep) break;
    if ((pending_input(w.fd) < wire::kHeaderSize || w.out.size() >= kFlushBytes) &&
        w.flush() != Errc::kOk)
      return;
  }
  if (w.flush() == Errc::kOk) linger_close(w.fd);
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

bool DonorServer::Impl::do_read(Worker& w, const wire::Header& h) {
  uint8_t p[wire::kIoReqSize];
  if (recv_all(w.fd, p, sizeof p) != Errc::kOk) return false;
  wire::IoReq r;
  Status st = wire::decode_io_req(p, &r);
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
  // Zero copy: queued replies, the READ_DATA header and the slab bytes in
  // one sendmsg.
  uint8_t rh[wire::kHeaderSize];
  wire::encode_frame_header(rh, MsgType::kReadData, h.tag, r.length);
  iovec iov[3];
  int n = 0;
  if (!w.out.empty()) iov[n++] = {w.out.data(), w.out.size()};
  iov[n++] = {rh, sizeof rh};
  iov[n++] = {mem, r.length};
  // Counted before the send: a client that has its data and then asks for
  // STATS must see this READ.
  reads_.fetch_add(1, std::memory_order_relaxed);
  bytes_read_.fetch_add(r.length, std::memory_order_relaxed);
  e = sendv_all(w.fd, iov, n);
  pool_->unpin(r.slab);
  w.out.clear();
  if (e != Errc::kOk) {
    reads_.fetch_sub(1, std::memory_order_relaxed);
    bytes_read_.fetch_sub(r.length, std::memory_order_relaxed);
    return false;
  }
  return true;
}

bool DonorServer::Impl::do_write(Worker& w, const wire::Header& h) {
  if (h.payload_len < wire::kIoReqSize) {
    w.error(h.tag, Errc::kProtocol,
            "WRITE payload of %u bytes is shorter than its %zu-byte prefix; closing", h.payload_len,
            wire::kIoReqSize);
    return false;
  }
  uint8_t p[wire::kIoReqSize];
  if (recv_all(w.fd, p, sizeof p) != Errc::kOk) return false;
  const uint32_t data_len = h.payload_len - static_cast<uint32_t>(wire::kIoReqSize);
  const uint32_t claimed = wire::get_u32(p + 4);
  if (claimed != data_len) {
    w.error(h.tag, Errc::kProtocol,
            "WRITE says %u bytes but its frame carries %u bytes of data; closing", claimed,
            data_len);
    return false;
  }
  wire::IoReq r;
  Status st = wire::decode_io_req(p, &r);  // only length 0 can fail here
  if (!st.ok()) {
    w.error(h.tag, st);
    return true;
  }
  // Check the prefix against the caller's leases BEFORE taking any data:
  // the data then lands straight in slab memory.
  uint8_t* mem = nullptr;
  Errc e = pool_->pin(w.conn->session, r.slab, r.offset, r.length, &mem);
  if (e != Errc::kOk) {
    // Swallow the refused data so the stream stays in step.
    uint32_t left = data_len;
    while (left > 0) {
      uint32_t chunk = static_cast<uint32_t>(std::min<size_t>(left, w.scratch.size()));
      if (recv_all(w.fd, w.scratch.data(), chunk) != Errc::kOk) return false;
      left -= chunk;
    }
    char msg[256];
    explain_pin(msg, sizeof msg, e, "WRITE", r, pool_->slab_size());
    w.error(h.tag, e, "%s", msg);
    return true;
  }
  e = recv_all(w.fd, mem, r.length);
  pool_->unpin(r.slab);
  if (e != Errc::kOk) return false;
  writes_.fetch_add(1, std::memory_order_relaxed);
  bytes_written_.fetch_add(r.length, std::memory_order_relaxed);
  wire::encode_empty(w.out, MsgType::kWritten, h.tag);
  return true;
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
  if (accept_thread_.joinable()) accept_thread_.join();
  if (reaper_thread_.joinable()) reaper_thread_.join();
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
bool DonorServer::huge_pages() const {
  return impl_->pool_->huge_pages();
}

}  // namespace farmem
