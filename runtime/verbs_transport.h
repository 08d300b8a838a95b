// The verbs Transport backend: one-sided RDMA READ and WRITE between
// registered local buffers and a donor's (farmemd's) memory over RC queue
// pairs connected with rdma_cm. The donor's CPU does no work per op.
//
//   auto s = farmem::DonorSession::connect(opts);          // control (donor_client.h)
//   auto t = farmem::VerbsTransport::create();             // opens the RDMA device
//   if (!t.ok()) ...;                                      // no device: use tcp
//   (void)(*t)->add_server(0, s->get());                   // session outlives t
//   auto slabs = (*s)->lease(64 << 20);                    // SlabDesc carries addr + rkey
//   for (auto& d : *slabs) (void)(*t)->add_slab(0, d);
//   (void)(*t)->register_buffer(buf, buf_len);             // an MR per buffer
//   auto q = (*t)->open_queue().value();                   // one per thread
//   farmem::IoOp op{farmem::IoKind::kRead, 4096, {0, (*slabs)[0].slab, 0}, buf, 7};
//   q->post({&op, 1});
//   farmem::IoCompletion c[8];
//   size_t n = q->wait(c, 1000);                           // c[0] = {7, kOk}
//
// It follows every rule in runtime/transport.h. How:
//
//  * A queue owns one RC queue pair per server, connected with rdma_cm on
//    the first op for that server (that one post blocks for the handshake,
//    a few ms), and one completion queue shared by its QPs. Queues share
//    nothing mutable: several threads each with a queue never take a lock.
//  * Connecting: the donor's rdma_cm listener is on the control endpoint's
//    address and the SAME port number, in the RDMA_PS_TCP port space (on
//    RoCE and InfiniBand this space is separate from kernel TCP ports). The
//    connect request carries the session id from WELCOME and a proof of the
//    session secret; the donor accepts only QPs of live, authenticated
//    sessions and creates them in that session's protection domain:
//
//      client -> donor, rdma_connect private data (56 bytes, the IB CM limit)
//        0          4          6          8               16          24
//        +----------+----------+----------+---------------+-----------+
//        | magic u32| ver u16  | pad u16  | session u64   | nonce u64 |
//        +----------+----------+----------+---------------+-----------+
//        | 24 mac[32] = attach_mac(secret, "farmem-verbs-v1\0" |     |
//        |              session u64 | nonce u64)                     |
//        +--------------------------------------------------------- 56
//      donor -> client, rdma_accept private data (16 bytes; the client
//      accepts a longer buffer: rdma_cm may pad it)
//        0 magic u32 | 4 ver u16 | 6 pad u16 | 8 instance_id u64
//      donor -> client, rdma_reject private data (8 bytes)
//        0 magic u32 | 4 ver u16 | 6 code u16 (farmem::Errc)
//
//    The nonce is random per connect; the donor refuses one it has seen
//    for the session (a replayed request).
//  * post() checks each op locally (registered buffer, length, server, slab,
//    range); a refused op completes with its error on the next poll() and
//    touches no wire. Accepted ops become work requests built in
//    preallocated per-slot storage, chained per server and posted with one
//    ibv_post_send per server; only every kSignalEvery-th WR and the last
//    WR of each chain are signalled (RC completes a send queue in order, so
//    a completion retires every WR before it). WRITEs up to the QP's
//    inline limit go inline.
//  * poll() reaps the CQ without blocking (and, while ops wait, looks at
//    the rdma_cm channels every kCmCheckNs). wait() busy-polls for up to
//    kSpinUs and then sleeps on the CQ's completion channel (and the
//    connections' rdma_cm channels) until a completion or the deadline.
//  * A failed completion is logged with its status, QP number and the
//    remote address, and maps to: remote access error -> kPermissionDenied
//    (a key or range the donor's hardware refused), flush / retry / rnr
//    errors -> kUnavailable, anything else -> kIo. The QP is then in the
//    error state: every later op outstanding on it completes kUnavailable,
//    the QP is torn down and the next op for that server reconnects once.
//    When the donor disconnects or a reconnect fails, the server stays dead
//    for this queue: later ops complete kUnavailable.
//  * QP attributes come from the device: max_send_wr = depth (checked
//    against max_qp_wr), initiator depth = min(max_qp_init_rd_atom, 255),
//    inline size as granted.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "runtime/donor_client.h"
#include "runtime/registration_table.h"
#include "runtime/status.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

namespace farmem {

namespace verbs {

// The connection handshake of the drawing above.
inline constexpr uint32_t kConnMagic = 0x42564D46;  // "FMVB" in memory order
inline constexpr uint16_t kConnVersion = 1;
inline constexpr size_t kConnectDataSize = 56;
inline constexpr size_t kAcceptDataSize = 16;
inline constexpr size_t kRejectDataSize = 8;

struct ConnectData {
  uint64_t session_id = 0;
  uint64_t nonce = 0;
  std::array<uint8_t, wire::kMacSize> mac{};
};
void encode_connect(const ConnectData& d, uint8_t out[kConnectDataSize]) noexcept;
// kProtocol / kVersionMismatch naming the field.
Status decode_connect(const void* p, size_t len, ConnectData* d);
// The proof of the session secret for (session, nonce).
std::array<uint8_t, wire::kMacSize> connect_mac(std::span<const uint8_t> secret,
                                                uint64_t session_id, uint64_t nonce);
void encode_accept(uint64_t instance_id, uint8_t out[kAcceptDataSize]) noexcept;
void encode_reject(Errc code, uint8_t out[kRejectDataSize]) noexcept;
// The code in a reject's private data, or kUnavailable when it carries none
// of ours (no listener, a different program).
Errc decode_reject(const void* p, size_t len) noexcept;

// True when an RDMA device is present and `host` resolves (rdma_cm) to an
// address one of them can reach; `why` says why not. Used by --transport
// auto on both sides.
bool reachable(const std::string& host, std::string* why);

// rdma_cm events with a deadline: waits for the next event on `ch`, which
// must be `want`. The event must be acked (rdma_ack_cm_event) by the caller.
Result<rdma_cm_event*> wait_cm_event(rdma_event_channel* ch, rdma_cm_event_type want,
                                     int timeout_ms);

}  // namespace verbs

struct VerbsTransportOptions {
  size_t depth = 128;  // ops outstanding per queue (and send queue size per QP)
  std::string device;  // empty: the device rdma_cm resolves for each server
  int connect_timeout_ms = 5000;
  uint8_t ack_timeout = 14;  // 4.096 us * 2^14 = 67 ms per retry: a dead donor shows fast
  uint8_t retry_count = 7;
  uint32_t max_inline = 256;  // asked for; the QP may grant less
};

class VerbsTransport final : public TransportControl {  // satisfies TransportBackend
 public:
  class Queue;
  using Options = VerbsTransportOptions;

  // Opens the RDMA devices through rdma_cm. kUnavailable (with what to do)
  // when the host has none; kInvalidArgument for a bad option.
  static Result<std::unique_ptr<VerbsTransport>> create(Options o = {});
  ~VerbsTransport() override;
  VerbsTransport(const VerbsTransport&) = delete;
  VerbsTransport& operator=(const VerbsTransport&) = delete;

  // Resolves the session's endpoint with rdma_cm: kUnavailable when no
  // RDMA device reaches it; kInvalidArgument for null or a duplicate id.
  Status add_server(ServerId id, DonorSession* session);  // session outlives the transport
  Result<std::unique_ptr<Queue>> open_queue();

  const char* name() const override { return "verbs"; }
  Status register_buffer(void* addr, size_t length) override;
  Status unregister_buffer(void* addr) override;
  // The slab's rkey and addr come from LEASED; size must be > 0.
  Status add_slab(ServerId server, const SlabDesc& slab) override;
  Status remove_slab(ServerId server, SlabId slab) override;

  const Options& options() const { return opts_; }
  const char* device_name() const;

 private:
  friend class Queue;
  struct Slab {
    SlabId id = 0;
    uint64_t size = 0;
    uint64_t addr = 0;
    uint32_t rkey = 0;
  };
  struct Server {
    ServerId id = 0;
    DonorSession* session = nullptr;
    std::vector<Slab> slabs;  // sorted by id
  };
  struct Tables {
    RegistrationTable<ibv_mr*> buffers;  // the local key of each
    std::vector<Server> servers;         // sorted by id
    const Server* find_server(ServerId id) const;
  };

  explicit VerbsTransport(Options o);
  Status init();
  const Tables* tables() const { return current_.load(std::memory_order_acquire); }
  void publish(std::unique_ptr<Tables> next);  // with mu_ held

  const Options opts_;
  ibv_context** devices_ = nullptr;  // rdma_get_devices; the QPs' contexts
  ibv_context* ctx_ = nullptr;       // the one device in use
  ibv_pd* pd_ = nullptr;
  ibv_device_attr attr_{};
  std::mutex mu_;
  std::vector<std::unique_ptr<const Tables>> all_;  // guarded by mu_; every version, kept
  std::atomic<const Tables*> current_{nullptr};
};

// One thread's queue. Not thread-safe: one owner at a time.
class VerbsTransport::Queue {
 public:
  ~Queue();
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  Errc post(std::span<const IoOp> ops);
  size_t poll(std::span<IoCompletion> out);
  size_t wait(std::span<IoCompletion> out, int timeout_ms);
  size_t outstanding() const { return outstanding_; }
  size_t depth() const { return depth_; }

 private:
  friend class VerbsTransport;
  static constexpr int kPollBatch = 32;      // CQEs per ibv_poll_cq
  static constexpr int kSpinUs = 50;         // busy-poll before sleeping
  static constexpr uint32_t kAckEvery = 64;  // CQ events acked in batches
  // WRs of one post chain per signalled WR (and the chain's last one).
  static constexpr uint32_t kSignalEvery = 16;
  // How often a poll() that finds nothing looks at the rdma_cm channels
  // for a donor that went away. Each look is a system call: at 1 ms about
  // one Soft-RoCE READ in twelve (80 us each) paid for one, enough to sit
  // in a p99. A lost donor also surfaces as error CQEs (flush, retry
  // exceeded), and wait() watches the channels whenever it sleeps.
  static constexpr uint64_t kCmCheckNs = 20'000'000;
  // A send queue never holds more WRs than the queue has slots, and at
  // most every WR is signalled, so the CQ (cq_entries()) never overflows.
  static_assert(kPollBatch > 0 && kAckEvery > 0 && kSignalEvery > 0);

  struct Conn;
  struct Slot {
    IoOp op;
    uint32_t seq = 0;   // bumped at reuse: stale CQEs are recognised
    uint32_t next = 0;  // FIFO link within a connection (kNone at the tail)
    Conn* conn = nullptr;
    ibv_send_wr wr{};
    ibv_sge sge{};
  };
  static constexpr uint32_t kNone = ~uint32_t{0};

  Queue(VerbsTransport* t, size_t depth);
  Status init();
  Conn* conn_for(const Server& s);
  Status connect(Conn& c, const Server& s);
  void complete(uint64_t cookie, Errc status);
  void free_slot(uint32_t i);
  // Completes the FIFO of `c` up to and including slot `upto` with kOk.
  void retire_through(Conn& c, uint32_t upto);
  // The QP failed (or is being dropped): completes every op still on it
  // (rules in verbs_transport.cc), tears the QP down, and leaves the
  // connection kNew (reconnect on the next op) or kDead (`permanent`).
  void break_conn(Conn& c, uint32_t failed_slot, Errc failed_status, bool permanent,
                  const char* why);
  void reap_cq();
  void check_cm_events();
  size_t drain(std::span<IoCompletion> out);

  VerbsTransport* const t_;
  const size_t depth_;
  size_t outstanding_ = 0;
  size_t in_flight_ = 0;  // on some QP, not yet completed
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  uint32_t unacked_events_ = 0;
  bool armed_ = false;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;  // a stack
  std::vector<IoCompletion> done_;    // ring of completed, unreaped ops
  size_t done_head_ = 0;
  size_t done_count_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;
  uint64_t last_cm_check_ns_ = 0;
};

static_assert(TransportBackend<VerbsTransport>);

}  // namespace farmem
