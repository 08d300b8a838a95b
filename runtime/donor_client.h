// DonorSession: the client side of the control connection to one farmemd.
//
//   farmem::DonorClientOptions o;
//   o.server = {"127.0.0.1", 7400};
//   o.token = *farmem::read_token_file("/etc/farmem/token");
//   auto s = farmem::DonorSession::connect(o);      // HELLO, CHALLENGE, AUTH, WELCOME
//   if (!s.ok()) { fprintf(stderr, "%s\n", s.status().to_string().c_str()); return; }
//   auto slabs = (*s)->lease(64 << 20);              // LEASE -> LEASED
//   ...
//   farmem::TcpTransport t;                          // the data path (tcp_transport.h)
//   t.add_server(0, s->get());                      // opens data connections through
//                                                    // open_data_connection()
//
// One session is one control connection and one donor-side session: its
// leases live as long as the connection does, and the donor drops them when
// the connection closes or stays silent for longer than welcome().grace_ms.
// A background thread sends HEARTBEAT every welcome().heartbeat_ms unless
// DonorClientOptions::heartbeat_thread is false.
//
// Requests are serialised on the one connection (one request in flight at a
// time, each with its own tag, each bounded by io_timeout_ms); the class is
// thread-safe. Any failure that can leave the byte stream out of step (a
// timeout, a reset, a malformed frame) closes the connection: every later
// request fails with kUnavailable and says why the connection was lost.
// An ERROR frame from the donor becomes a Status with the donor's code and
// message, prefixed with the donor's address.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/net.h"
#include "runtime/parse.h"
#include "runtime/status.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

namespace farmem {

struct DonorClientOptions {
  Endpoint server;
  std::string token;       // empty => an all-zero MAC (only --insecure donors accept it)
  uint64_t client_id = 0;  // 0 => random
  int connect_timeout_ms = 5000;
  int io_timeout_ms = 10000;     // control request round-trip limit
  bool heartbeat_thread = true;  // send HEARTBEAT every welcome.heartbeat_ms
};

class DonorSession {
 public:
  // Connects and runs the handshake. kUnauthenticated when the donor
  // refuses the token, kUnavailable/kTimeout when it cannot be reached.
  static Result<std::unique_ptr<DonorSession>> connect(const DonorClientOptions& opts);
  ~DonorSession();  // close(); the donor then releases this session's leases

  DonorSession(const DonorSession&) = delete;
  DonorSession& operator=(const DonorSession&) = delete;

  // At least `bytes`, in whole slabs (the donor rounds up).
  Result<std::vector<SlabDesc>> lease(uint64_t bytes);
  Status release(SlabId slab);
  Result<wire::StatsReply> stats();
  Status heartbeat();

  // Session id, secret, capacity, slab size, limits, instance id.
  const wire::Welcome& welcome() const { return welcome_; }
  // CHALLENGE flags of the donor (wire::kChallengeVerbs, ...).
  uint32_t donor_flags() const { return donor_flags_; }
  bool serves_verbs() const { return (donor_flags_ & wire::kChallengeVerbs) != 0; }
  const Endpoint& endpoint() const { return opts_.server; }
  uint64_t client_id() const { return client_id_; }

  // A new TCP connection attached to this session for the data path:
  // HELLO(role=data), CHALLENGE, ATTACH(hmac over the nonce), ATTACHED.
  // The returned socket is blocking, with TCP_NODELAY; the caller owns it.
  Result<Fd> open_data_connection();

  // Drops the control connection now and stops the heartbeat thread.
  // Idempotent; later requests fail with kUnavailable.
  void close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  explicit DonorSession(const DonorClientOptions& opts);
  Status handshake();
  // Sends `frame` (one request with tag `tag`) and receives its reply of
  // type `expect` into `payload`. Holds mu_.
  Status round_trip(const std::vector<uint8_t>& frame, uint64_t tag, wire::MsgType expect,
                    std::vector<uint8_t>* payload);
  // Marks the connection unusable (the stream may be out of step) and
  // remembers why. Called with mu_ held.
  Status fail_locked(Status why);
  void heartbeat_loop();

  DonorClientOptions opts_;
  uint64_t client_id_ = 0;
  wire::Welcome welcome_{};
  uint32_t donor_flags_ = 0;

  std::mutex mu_;                // one request at a time on fd_
  Fd fd_;                        // closed only by close() (under mu_)
  std::atomic<int> raw_fd_{-1};  // for shutdown() from close() without mu_
  bool broken_ = false;          // guarded by mu_
  std::string broken_why_;       // guarded by mu_
  uint64_t next_tag_ = 1;        // guarded by mu_
  std::atomic<bool> closed_{false};

  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;  // guarded by hb_mu_
  std::thread hb_thread_;
};

}  // namespace farmem
