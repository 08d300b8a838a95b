#include "runtime/donor_client.h"

#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <span>

#include "runtime/auth.h"
#include "runtime/log.h"

namespace farmem {
namespace {

using wire::MsgType;

// Why a send or receive on a control or handshake connection failed, in
// words an operator can act on.
Status io_failure(Errc e, const std::string& donor, const char* doing, MsgType what,
                  int timeout_ms) {
  const char* name = wire::msg_type_name(what);
  switch (e) {
    case Errc::kUnavailable:
      return make_error(Errc::kUnavailable,
                        "donor %s closed the connection while %s %s (the donor stopped, refused "
                        "this client, or expired the session after missed heartbeats)",
                        donor.c_str(), doing, name);
    case Errc::kTimeout:
      return make_error(Errc::kTimeout,
                        "donor %s did not answer %s within %d ms (io_timeout_ms): is it "
                        "overloaded or stuck? the connection is closed",
                        donor.c_str(), name, timeout_ms);
    default:
      return make_error(Errc::kIo, "%s %s to donor %s failed: %s", doing, name, donor.c_str(),
                        strerror(errno));
  }
}

// Receives one frame in reply to `sent` (tag `tag`): either `expect` or an
// ERROR. On return *stream_ok says whether the connection is still in step
// (false after any I/O failure, a malformed frame or an unexpected type).
// An ERROR reply becomes a Status with the donor's code and message.
Status recv_reply(int fd, const std::string& donor, MsgType sent, uint64_t tag, MsgType expect,
                  std::vector<uint8_t>* payload, int timeout_ms, bool* stream_ok) {
  *stream_ok = false;
  uint8_t raw[wire::kHeaderSize];
  Errc e = recv_all(fd, raw, sizeof raw);
  if (e != Errc::kOk) return io_failure(e, donor, "waiting for the reply to", sent, timeout_ms);
  wire::Header h;
  const char* why = "";
  if (wire::decode_header(raw, &h, &why) != Errc::kOk)
    return make_error(Errc::kProtocol,
                      "donor %s sent a malformed frame in reply to %s: %s (is it a farmemd of "
                      "the same version?)",
                      donor.c_str(), wire::msg_type_name(sent), why);
  if (h.type != expect && h.type != MsgType::kError)
    return make_error(Errc::kProtocol, "donor %s answered %s with %s, expected %s or ERROR",
                      donor.c_str(), wire::msg_type_name(sent), wire::msg_type_name(h.type),
                      wire::msg_type_name(expect));
  // Every type accepted here is bounded by decode_header to a few KiB.
  payload->resize(h.payload_len);
  if (h.payload_len > 0) {
    e = recv_all(fd, payload->data(), h.payload_len);
    if (e != Errc::kOk) return io_failure(e, donor, "receiving the reply to", sent, timeout_ms);
  }
  if (h.type == MsgType::kError) {
    wire::ErrorMsg m;
    Status d = wire::decode_error(*payload, &m);
    if (!d.ok()) return d.with_context("donor " + donor + " sent a malformed ERROR");
    // The donor closes the connection after a protocol error; a reply
    // whose tag is not ours means the stream is out of step.
    *stream_ok = m.code != Errc::kProtocol && h.tag == tag;
    return Status(m.code, "donor " + donor + ": " + m.message);
  }
  if (h.tag != tag)
    return make_error(Errc::kProtocol,
                      "donor %s answered %s with tag %llu, expected %llu: replies out of step",
                      donor.c_str(), wire::msg_type_name(sent),
                      static_cast<unsigned long long>(h.tag), static_cast<unsigned long long>(tag));
  *stream_ok = true;
  return ok_status();
}

// Sends one whole frame and receives its reply (see recv_reply).
Status exchange(int fd, const std::string& donor, const std::vector<uint8_t>& frame, uint64_t tag,
                MsgType expect, std::vector<uint8_t>* payload, int timeout_ms, bool* stream_ok) {
  *stream_ok = false;
  MsgType sent = static_cast<MsgType>(wire::get_u16(frame.data() + 4));
  Errc e = send_all(fd, frame.data(), frame.size());
  if (e != Errc::kOk) return io_failure(e, donor, "sending", sent, timeout_ms);
  return recv_reply(fd, donor, sent, tag, expect, payload, timeout_ms, stream_ok);
}

// Reads the CHALLENGE that answers a HELLO.
Status hello(int fd, const std::string& donor, wire::Role role, uint64_t client_id, int timeout_ms,
             wire::Challenge* challenge) {
  std::vector<uint8_t> frame;
  wire::Hello h;
  h.role = role;
  h.client_id = client_id;
  wire::encode_hello(frame, 1, h);
  std::vector<uint8_t> payload;
  bool stream_ok;
  FARMEM_RETURN_IF_ERROR(
      exchange(fd, donor, frame, 1, MsgType::kChallenge, &payload, timeout_ms, &stream_ok));
  return wire::decode_challenge(payload, challenge)
      .with_context("donor " + donor + " sent a bad CHALLENGE");
}

}  // namespace

DonorSession::DonorSession(const DonorClientOptions& opts) : opts_(opts) {
  client_id_ = opts.client_id;
  while (client_id_ == 0) client_id_ = random_u64();
}

Result<std::unique_ptr<DonorSession>> DonorSession::connect(const DonorClientOptions& opts) {
  if (opts.server.port == 0)
    return make_error(Errc::kInvalidArgument,
                      "donor address %s has no port: give HOST:PORT (farmemd listens on 7400 by "
                      "default)",
                      opts.server.to_string().c_str());
  if (opts.io_timeout_ms <= 0 || opts.connect_timeout_ms <= 0)
    return make_error(Errc::kInvalidArgument,
                      "io_timeout_ms (%d) and connect_timeout_ms (%d) must be positive",
                      opts.io_timeout_ms, opts.connect_timeout_ms);
  std::unique_ptr<DonorSession> s(new DonorSession(opts));
  auto fd = tcp_connect(opts.server, opts.connect_timeout_ms);
  if (!fd.ok()) return fd.status();
  FARMEM_RETURN_IF_ERROR(set_socket_timeouts(fd->get(), opts.io_timeout_ms, opts.io_timeout_ms));
  s->raw_fd_.store(fd->get(), std::memory_order_release);
  s->fd_ = std::move(*fd);
  FARMEM_RETURN_IF_ERROR(s->handshake());
  if (opts.heartbeat_thread) s->hb_thread_ = std::thread([p = s.get()] { p->heartbeat_loop(); });
  return s;
}

Status DonorSession::handshake() {
  const std::string donor = opts_.server.to_string();
  const int fd = fd_.get();
  wire::Challenge ch;
  FARMEM_RETURN_IF_ERROR(
      hello(fd, donor, wire::Role::kControl, client_id_, opts_.io_timeout_ms, &ch));
  donor_flags_ = ch.flags;
  wire::Auth auth;  // all-zero MAC without a token: accepted by --insecure donors only
  if (!opts_.token.empty()) {
    auto key = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(opts_.token.data()),
                                        opts_.token.size());
    auth.mac = auth_mac(key, ch.nonce, client_id_);
  }
  std::vector<uint8_t> frame;
  wire::encode_auth(frame, 2, auth);
  std::vector<uint8_t> payload;
  bool stream_ok;
  Status st =
      exchange(fd, donor, frame, 2, MsgType::kWelcome, &payload, opts_.io_timeout_ms, &stream_ok);
  if (st.code() == Errc::kUnauthenticated) {
    // Quote the donor's own words without repeating its address.
    std::string said = st.message();
    const std::string prefix = "donor " + donor + ": ";
    if (said.compare(0, prefix.size(), prefix) == 0) said.erase(0, prefix.size());
    if (opts_.token.empty())
      return make_error(Errc::kUnauthenticated,
                        "donor %s requires a token and none was given: set FARMEM_TOKEN_FILE to "
                        "a copy of the donor's --token-file (the donor said: %s)",
                        donor.c_str(), said.c_str());
    return make_error(Errc::kUnauthenticated,
                      "donor %s refused the token: check FARMEM_TOKEN_FILE matches the donor's "
                      "--token-file (the donor said: %s)",
                      donor.c_str(), said.c_str());
  }
  FARMEM_RETURN_IF_ERROR(st);
  FARMEM_RETURN_IF_ERROR(wire::decode_welcome(payload, &welcome_)
                             .with_context("donor " + donor + " sent a bad WELCOME"));
  FARMEM_LOG(kDebug, "donor %s: session %llu, slab size %llu, heartbeat every %u ms", donor.c_str(),
             static_cast<unsigned long long>(welcome_.session_id),
             static_cast<unsigned long long>(welcome_.slab_size), welcome_.heartbeat_ms);
  return ok_status();
}

DonorSession::~DonorSession() {
  close();
}

void DonorSession::close() {
  {
    std::lock_guard lk(hb_mu_);
    hb_stop_ = true;
  }
  hb_cv_.notify_all();
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  // Wakes a request (or the heartbeat thread) blocked in recv on the fd;
  // the descriptor itself stays open until we hold mu_ below, so the number
  // cannot be reused under that request's feet.
  int raw = raw_fd_.load(std::memory_order_acquire);
  if (raw >= 0) ::shutdown(raw, SHUT_RDWR);
  if (hb_thread_.joinable()) hb_thread_.join();
  std::lock_guard lk(mu_);
  raw_fd_.store(-1, std::memory_order_release);
  fd_.reset();
}

Status DonorSession::fail_locked(Status why) {
  if (!broken_) {
    broken_ = true;
    broken_why_ = why.message();
    int raw = fd_.get();
    if (raw >= 0) ::shutdown(raw, SHUT_RDWR);
  }
  return why;
}

Status DonorSession::round_trip(const std::vector<uint8_t>& frame, uint64_t tag, MsgType expect,
                                std::vector<uint8_t>* payload) {
  std::lock_guard lk(mu_);
  const std::string donor = opts_.server.to_string();
  if (closed_.load(std::memory_order_acquire) || !fd_.valid())
    return make_error(Errc::kUnavailable,
                      "the control connection to donor %s was closed by this client; connect a "
                      "new session",
                      donor.c_str());
  if (broken_)
    return make_error(Errc::kUnavailable,
                      "the control connection to donor %s was lost earlier (%s); connect a new "
                      "session",
                      donor.c_str(), broken_why_.c_str());
  bool stream_ok = false;
  Status st =
      exchange(fd_.get(), donor, frame, tag, expect, payload, opts_.io_timeout_ms, &stream_ok);
  if (!stream_ok && closed_.load(std::memory_order_acquire))
    st = make_error(Errc::kUnavailable,
                    "the control connection to donor %s was closed by this client during the "
                    "request; connect a new session",
                    donor.c_str());
  if (!stream_ok) return fail_locked(std::move(st));
  return st;
}

Result<std::vector<SlabDesc>> DonorSession::lease(uint64_t bytes) {
  if (bytes == 0)
    return make_error(Errc::kInvalidArgument, "lease of 0 bytes from donor %s: ask for at least 1",
                      opts_.server.to_string().c_str());
  std::vector<uint8_t> frame, payload;
  uint64_t tag;
  {
    std::lock_guard lk(mu_);
    tag = next_tag_++;
  }
  wire::encode_lease(frame, tag, wire::LeaseReq{bytes});
  FARMEM_RETURN_IF_ERROR(round_trip(frame, tag, MsgType::kLeased, &payload));
  wire::Leased leased;
  FARMEM_RETURN_IF_ERROR(
      wire::decode_leased(payload, &leased)
          .with_context("donor " + opts_.server.to_string() + " sent a bad LEASED"));
  return std::move(leased.slabs);
}

Status DonorSession::release(SlabId slab) {
  std::vector<uint8_t> frame, payload;
  uint64_t tag;
  {
    std::lock_guard lk(mu_);
    tag = next_tag_++;
  }
  wire::encode_release(frame, tag, wire::ReleaseReq{slab});
  return round_trip(frame, tag, MsgType::kReleased, &payload);
}

Result<wire::StatsReply> DonorSession::stats() {
  std::vector<uint8_t> frame, payload;
  uint64_t tag;
  {
    std::lock_guard lk(mu_);
    tag = next_tag_++;
  }
  wire::encode_empty(frame, MsgType::kStats, tag);
  FARMEM_RETURN_IF_ERROR(round_trip(frame, tag, MsgType::kStatsReply, &payload));
  wire::StatsReply r;
  FARMEM_RETURN_IF_ERROR(
      wire::decode_stats_reply(payload, &r)
          .with_context("donor " + opts_.server.to_string() + " sent a bad STATS_REPLY"));
  return r;
}

Status DonorSession::heartbeat() {
  std::vector<uint8_t> frame, payload;
  uint64_t tag;
  {
    std::lock_guard lk(mu_);
    tag = next_tag_++;
  }
  wire::encode_empty(frame, MsgType::kHeartbeat, tag);
  return round_trip(frame, tag, MsgType::kHeartbeatAck, &payload);
}

void DonorSession::heartbeat_loop() {
  const auto period = std::chrono::milliseconds(welcome_.heartbeat_ms);
  bool warned = false;
  std::unique_lock lk(hb_mu_);
  for (;;) {
    if (hb_cv_.wait_for(lk, period, [this] { return hb_stop_; })) return;
    lk.unlock();
    Status st = heartbeat();
    if (!st.ok() && !warned && !closed()) {
      // Once is enough: every later request reports the same lost connection.
      FARMEM_LOG(kWarn, "heartbeat to donor %s failed: %s", opts_.server.to_string().c_str(),
                 st.to_string().c_str());
      warned = true;
    }
    lk.lock();
  }
}

Result<Fd> DonorSession::open_data_connection() {
  const std::string donor = opts_.server.to_string();
  if (closed())
    return make_error(Errc::kUnavailable,
                      "cannot open a data connection to donor %s: the session was closed",
                      donor.c_str());
  auto fd = tcp_connect(opts_.server, opts_.connect_timeout_ms);
  if (!fd.ok()) return fd.status();
  // Bounded handshake; the data path sets its own blocking mode afterwards.
  FARMEM_RETURN_IF_ERROR(set_socket_timeouts(fd->get(), opts_.io_timeout_ms, opts_.io_timeout_ms));
  wire::Challenge ch;
  FARMEM_RETURN_IF_ERROR(
      hello(fd->get(), donor, wire::Role::kData, client_id_, opts_.io_timeout_ms, &ch));
  wire::Attach at;
  at.session_id = welcome_.session_id;
  at.mac = attach_mac(welcome_.secret, ch.nonce);
  std::vector<uint8_t> frame, payload;
  wire::encode_attach(frame, 2, at);
  bool stream_ok;
  Status st = exchange(fd->get(), donor, frame, 2, MsgType::kAttached, &payload,
                       opts_.io_timeout_ms, &stream_ok);
  if (!st.ok()) return st.with_context("attaching a data connection");
  FARMEM_RETURN_IF_ERROR(set_socket_timeouts(fd->get(), 0, 0));
  return std::move(*fd);
}

}  // namespace farmem
