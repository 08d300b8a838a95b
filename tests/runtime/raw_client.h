// A minimal blocking farmem client on raw sockets, for donor tests. It
// speaks runtime/wire.h directly, so tests can also send what a real client
// never would (bad headers, wrong MACs, garbage) and see exactly what the
// donor answers.
//
//   farmem::test::RawClient c;
//   ASSERT_TRUE(c.connect(port).ok());
//   auto w = c.handshake_control("token");        // HELLO, CHALLENGE, AUTH, WELCOME
//   auto slabs = c.lease(1 << 20);
//   farmem::test::RawClient d;
//   ASSERT_TRUE(d.connect(port).ok());
//   ASSERT_TRUE(d.attach(w->session_id, w->secret).ok());
//   ASSERT_TRUE(d.write((*slabs)[0].slab, 0, bytes).ok());
//
// Every call returns the donor's ERROR frame as a Status with its code and
// message, so a test can assert the exact refusal.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/auth.h"
#include "runtime/net.h"
#include "runtime/status.h"
#include "runtime/wire.h"

namespace farmem::test {

struct RawFrame {
  wire::Header header;
  std::vector<uint8_t> payload;
};

class RawClient {
 public:
  static constexpr int kTimeoutMs = 5000;

  // Connects to 127.0.0.1:port. rcvbuf > 0 shrinks the receive buffer
  // before connecting (so a peer's sends fill it quickly).
  Status connect(uint16_t port, int rcvbuf = 0) {
    fd_.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd_.valid()) return make_error(Errc::kIo, "socket: %s", strerror(errno));
    if (rcvbuf > 0) setsockopt(fd_.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return make_error(Errc::kUnavailable, "connect to port %u: %s", port, strerror(errno));
    int one = 1;
    setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return ok_status();
  }
  int fd() const { return fd_.get(); }
  void close() { fd_.reset(); }

  Status send_raw(std::span<const uint8_t> bytes) {
    Errc e = send_all(fd_.get(), bytes.data(), bytes.size());
    return e == Errc::kOk ? ok_status() : make_error(e, "send failed: %s", errc_name(e));
  }

  // Reads one frame within timeout_ms. The header is checked only for
  // plausibility (a test may want to see anything the donor sends).
  Result<RawFrame> recv_frame(int timeout_ms = kTimeoutMs) {
    uint8_t h[wire::kHeaderSize];
    FARMEM_RETURN_IF_ERROR(recv_exact(h, sizeof h, timeout_ms));
    RawFrame f;
    const char* why = nullptr;
    if (wire::decode_header(h, &f.header, &why) != Errc::kOk)
      return make_error(Errc::kProtocol, "donor sent a bad header: %s", why);
    f.payload.resize(f.header.payload_len);
    FARMEM_RETURN_IF_ERROR(recv_exact(f.payload.data(), f.payload.size(), timeout_ms));
    return f;
  }

  // Waits for the donor to close the connection, discarding what comes
  // first. True when it did within timeout_ms.
  bool wait_closed(int timeout_ms = kTimeoutMs) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    uint8_t sink[65536];
    while (true) {
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      if (left <= 0) return false;
      pollfd p{fd_.get(), POLLIN, 0};
      int r = poll(&p, 1, left);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      ssize_t n = recv(fd_.get(), sink, sizeof sink, 0);
      if (n == 0) return true;
      if (n < 0 && errno != EINTR && errno != EAGAIN) return true;  // reset
    }
  }

  // Reads frames until an ERROR frame (returned as a Status) or a non-error
  // reply (an error Status of kInternal saying so) or close.
  Status expect_error(int timeout_ms = kTimeoutMs) {
    auto f = recv_frame(timeout_ms);
    if (!f.ok())
      return make_error(Errc::kInternal, "no ERROR frame: %s", f.status().to_string().c_str());
    if (f->header.type != wire::MsgType::kError)
      return make_error(Errc::kInternal, "expected ERROR, got %s",
                        wire::msg_type_name(f->header.type));
    return to_status(*f);
  }

  static Status to_status(const RawFrame& f) {
    wire::ErrorMsg m;
    Status st = wire::decode_error(f.payload, &m);
    if (!st.ok()) return st;
    return Status(m.code, m.message);
  }

  // ---- Handshake ------------------------------------------------------------

  Result<wire::Challenge> hello(wire::Role role, uint64_t client_id = 42) {
    std::vector<uint8_t> b;
    wire::Hello h;
    h.role = role;
    h.client_id = client_id;
    wire::encode_hello(b, 1, h);
    FARMEM_RETURN_IF_ERROR(send_raw(b));
    auto f = expect(wire::MsgType::kChallenge, 1);
    if (!f.ok()) return f.status();
    wire::Challenge c;
    FARMEM_RETURN_IF_ERROR(wire::decode_challenge(f->payload, &c));
    return c;
  }

  // HELLO(control) + AUTH. An empty token sends an all-zero MAC.
  Result<wire::Welcome> handshake_control(std::string_view token, uint64_t client_id = 42) {
    auto c = hello(wire::Role::kControl, client_id);
    if (!c.ok()) return c.status();
    wire::Auth a;
    if (!token.empty())
      a.mac = auth_mac({reinterpret_cast<const uint8_t*>(token.data()), token.size()}, c->nonce,
                       client_id);
    std::vector<uint8_t> b;
    wire::encode_auth(b, 2, a);
    FARMEM_RETURN_IF_ERROR(send_raw(b));
    auto f = expect(wire::MsgType::kWelcome, 2);
    if (!f.ok()) return f.status();
    wire::Welcome w;
    FARMEM_RETURN_IF_ERROR(wire::decode_welcome(f->payload, &w));
    return w;
  }

  // HELLO(data) + ATTACH with the session secret.
  Status attach(uint64_t session_id, std::span<const uint8_t> secret) {
    auto c = hello(wire::Role::kData);
    if (!c.ok()) return c.status();
    wire::Attach a;
    a.session_id = session_id;
    a.mac = attach_mac(secret, c->nonce);
    std::vector<uint8_t> b;
    wire::encode_attach(b, 2, a);
    FARMEM_RETURN_IF_ERROR(send_raw(b));
    auto f = expect(wire::MsgType::kAttached, 2);
    return f.ok() ? ok_status() : f.status();
  }

  // ---- Control requests -------------------------------------------------------

  Result<std::vector<wire::SlabDesc>> lease(uint64_t bytes) {
    std::vector<uint8_t> b;
    uint64_t tag = next_tag_++;
    wire::encode_lease(b, tag, {bytes});
    FARMEM_RETURN_IF_ERROR(send_raw(b));
    auto f = expect(wire::MsgType::kLeased, tag);
    if (!f.ok()) return f.status();
    wire::Leased l;
    FARMEM_RETURN_IF_ERROR(wire::decode_leased(f->payload, &l));
    return l.slabs;
  }

  Status release(uint32_t slab) {
    std::vector<uint8_t> b;
    uint64_t tag = next_tag_++;
    wire::encode_release(b, tag, {slab});
    FARMEM_RETURN_IF_ERROR(send_raw(b));
    auto f = expect(wire::MsgType::kReleased, tag);
    return f.ok() ? ok_status() : f.status();
  }

  Status heartbeat() {
    std::vector<uint8_t> b;
    uint64_t tag = next_tag_++;
    wire::encode_empty(b, wire::MsgType::kHeartbeat, tag);
    FARMEM_RETURN_IF_ERROR(send_raw(b));
    auto f = expect(wire::MsgType::kHeartbeatAck, tag);
    return f.ok() ? ok_status() : f.status();
  }

  Result<wire::StatsReply> stats() {
    std::vector<uint8_t> b;
    uint64_t tag = next_tag_++;
    wire::encode_empty(b, wire::MsgType::kStats, tag);
    FARMEM_RETURN_IF_ERROR(send_raw(b));
    auto f = expect(wire::MsgType::kStatsReply, tag);
    if (!f.ok()) return f.status();
    wire::StatsReply s;
    FARMEM_RETURN_IF_ERROR(wire::decode_stats_reply(f->payload, &s));
    return s;
  }

  // ---- Data requests ----------------------------------------------------------

  Status write(uint32_t slab, uint64_t offset, std::span<const uint8_t> data) {
    std::vector<uint8_t> b;
    uint64_t tag = next_tag_++;
    wire::encode_io_req(b, wire::MsgType::kWrite, tag,
                        {slab, static_cast<uint32_t>(data.size()), offset}, data.data());
    FARMEM_RETURN_IF_ERROR(send_raw(b));
    auto f = expect(wire::MsgType::kWritten, tag);
    return f.ok() ? ok_status() : f.status();
  }

  Result<std::vector<uint8_t>> read(uint32_t slab, uint64_t offset, uint32_t length) {
    std::vector<uint8_t> b;
    uint64_t tag = next_tag_++;
    wire::encode_io_req(b, wire::MsgType::kRead, tag, {slab, length, offset}, nullptr);
    FARMEM_RETURN_IF_ERROR(send_raw(b));
    auto f = expect(wire::MsgType::kReadData, tag);
    if (!f.ok()) return f.status();
    if (f->payload.size() != length)
      return make_error(Errc::kProtocol, "READ_DATA of %zu bytes for a READ of %u",
                        f->payload.size(), length);
    return std::move(f->payload);
  }

  uint64_t next_tag() { return next_tag_++; }

 private:
  Status recv_exact(void* buf, size_t len, int timeout_ms) {
    auto* p = static_cast<uint8_t*>(buf);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (len > 0) {
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      if (left <= 0) return make_error(Errc::kTimeout, "no reply within %d ms", timeout_ms);
      pollfd pf{fd_.get(), POLLIN, 0};
      int r = poll(&pf, 1, left);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      ssize_t n = recv(fd_.get(), p, len, 0);
      if (n == 0) return make_error(Errc::kUnavailable, "donor closed the connection");
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return make_error(Errc::kUnavailable, "recv: %s", strerror(errno));
      }
      p += n;
      len -= static_cast<size_t>(n);
    }
    return ok_status();
  }

  // The reply to `tag`: the expected type, or the donor's ERROR as a Status.
  Result<RawFrame> expect(wire::MsgType type, uint64_t tag) {
    auto f = recv_frame();
    if (!f.ok()) return f.status();
    if (f->header.type == wire::MsgType::kError) return to_status(*f);
    if (f->header.type != type || f->header.tag != tag)
      return make_error(Errc::kProtocol, "expected %s tag %llu, got %s tag %llu",
                        wire::msg_type_name(type), static_cast<unsigned long long>(tag),
                        wire::msg_type_name(f->header.type),
                        static_cast<unsigned long long>(f->header.tag));
    return f;
  }

  Fd fd_;
  uint64_t next_tag_ = 100;
};

}  // namespace farmem::test
