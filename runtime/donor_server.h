// DonorServer: the heart of farmemd. Lends a bounded pool of memory in slabs
// to authenticated clients and serves the tcp data path (READ / WRITE of
// byte ranges inside the caller's own leases).
//
//   farmem::DonorOptions o;
//   o.listen = {"127.0.0.1", 0};         // port 0: pick a free one
//   o.capacity = 256ull << 20;
//   o.slab_size = 1ull << 20;
//   o.token = "shared secret";
//   auto srv = farmem::DonorServer::start(o);
//   if (!srv.ok()) { /* srv.status().to_string() says what to fix */ }
//   uint16_t port = (*srv)->port();
//   ...
//   (*srv)->stop();                      // or let the destructor do it
//
// Threads: one accept thread, one thread per connection (blocking I/O with
// socket timeouts) and one reaper that expires silent sessions and joins
// finished connection threads. Simple and robust on small machines; the
// per-op cost on the data path is one mutex round trip to pin the slab.
//
// A connection's life (see runtime/wire.h for the frames):
//
//   state        | input                         | next         | output
//   -------------+-------------------------------+--------------+---------------------
//   kHello       | HELLO ok                      | kChallenged  | CHALLENGE(nonce)
//   kHello       | anything else / bad field     | closed       | ERROR
//   kChallenged  | AUTH with the right MAC       | kControl     | WELCOME (new session)
//   kChallenged  | ATTACH with the right MAC     | kData        | ATTACHED
//   kChallenged  | wrong MAC / unknown session   | closed       | ERROR
//   kHello/kChal.| handshake_timeout_ms passes   | closed       | ERROR kTimeout
//   kControl     | LEASE/RELEASE/HEARTBEAT/STATS | kControl     | reply or ERROR
//                | /CLIENTS                      |              |
//   kControl     | bad header / other type       | closed       | ERROR kProtocol
//   kControl     | close, or silent for grace_ms | closed       | session ends: leases
//                |                               |              | released, data closed
//   kData        | READ/WRITE in own lease       | kData        | READ_DATA / WRITTEN
//   kData        | READ/WRITE refused            | kData        | ERROR (stream kept)
//   kData        | bad header / other type       | closed       | ERROR kProtocol
//   any          | a reply not taken within      | closed       | -
//                | send_timeout_ms               |              |
//
// Metrics: with DonorOptions::metrics_listen set, one more thread serves
// GET /metrics (HTTP/1.0, one request per connection, answered in turn) in
// the Prometheus text exposition format 0.0.4:
//
//   $ curl -s 127.0.0.1:9400/metrics
//   # HELP farmem_donor_leased_bytes Donor memory currently leased to clients.
//   # TYPE farmem_donor_leased_bytes gauge
//   farmem_donor_leased_bytes 134217728
//   ...
//
// The figures are the ones STATS and CLIENTS report (prometheus_text()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/parse.h"
#include "runtime/status.h"
#include "runtime/wire.h"

namespace farmem {

enum class DonorTransportMode { kAuto, kTcp, kVerbs };

// "auto", "tcp", "verbs".
const char* donor_transport_name(DonorTransportMode m) noexcept;

struct DonorOptions {
  Endpoint listen{"127.0.0.1", 7400};  // port 0 = pick a free one (tests)
  uint64_t capacity = 1ull << 30;      // never lends more
  uint64_t slab_size = 64ull << 20;    // lease granularity; capacity is a multiple of it
  std::string token;                   // shared secret; empty only with insecure=true
  bool insecure = false;               // accept any client (logs a loud warning)
  uint32_t max_clients = 256;          // live sessions
  uint64_t quota_per_client = 0;       // 0 = no per-client limit below capacity
  uint32_t heartbeat_ms = 1000;        // told to clients in WELCOME
  // Leases dropped after this long without a frame on the control connection.
  uint32_t grace_ms = 5000;
  // A connection that does not finish the handshake is closed.
  uint32_t handshake_timeout_ms = 5000;
  uint32_t idle_data_timeout_ms = 0;  // 0 = none
  uint32_t max_connections_per_session = 64;
  DonorTransportMode transport = DonorTransportMode::kAuto;
  bool try_hugepages = true;
  // A data connection from this host (loopback) is served on the CPU its
  // requests come from (donor_server.cc "follow_sender_cpu"); farmemd
  // --follow-cpu=off turns it off.
  bool follow_local_senders = true;
  // A client on this host (its control connection comes from loopback)
  // reads and writes its slabs itself, one-sided, as a verbs client would
  // ("Local clients" in donor_server.cc). Needs a tcp-only donor (no RDMA
  // device in use); farmemd --local-clients=off turns it off.
  bool local_clients = true;
  // Extras beyond the agreed API.
  // A peer that does not take a reply within this long is disconnected, so
  // it cannot hold a thread or a slab pin forever.
  uint32_t send_timeout_ms = 10000;
  // Open TCP connections at most (0: max_clients * 4 + 16). Refused beyond.
  uint32_t max_connections = 0;
  // Prometheus endpoint (GET /metrics); nullopt = off. Port 0 picks a free
  // port (metrics_port()). Meant for loopback or a management network:
  // it needs no token, and shows the client list.
  std::optional<Endpoint> metrics_listen;
};

class DonorServer {
 public:
  // Validates the options, reserves the memory, binds, starts the threads.
  static Result<std::unique_ptr<DonorServer>> start(const DonorOptions& opts);
  ~DonorServer();  // stop() + join
  DonorServer(const DonorServer&) = delete;
  DonorServer& operator=(const DonorServer&) = delete;

  void stop();  // idempotent, async-signal-unsafe; closes everything
  void wait();  // blocks until stop()
  uint16_t port() const;
  wire::StatsReply stats() const;
  uint64_t instance_id() const;
  bool huge_pages() const;  // donor memory is on MAP_HUGETLB pages
  // Slabs lent with a one-sided view to a client on this host ("Local
  // clients" in donor_server.cc); their READs and WRITEs are not in stats().
  uint64_t local_slabs_lent() const;
  // The bound metrics port; 0 when metrics_listen is off.
  uint16_t metrics_port() const;
  // The live sessions, ascending by session id (what CLIENTS pages through).
  std::vector<wire::ClientInfo> clients() const;
  // The metrics page: every figure of stats() and clients() in the
  // Prometheus text format 0.0.4.
  std::string prometheus_text() const;

  class Impl;

 private:
  explicit DonorServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace farmem
