// The tcp Transport backend: READ and WRITE of byte ranges executed by the
// donor (farmemd) over plain TCP, pipelined, for networks without RDMA.
//
//   auto s = farmem::DonorSession::connect(opts);      // control (donor_client.h)
//   farmem::TcpTransport t;                             // depth 64 per queue
//   if (auto st = t.add_server(0, s->get()); !st.ok()) ...
//   auto slabs = (*s)->lease(64 << 20);
//   for (auto& d : *slabs) (void)t.add_slab(0, d);
//   (void)t.register_buffer(buf, buf_len);
//   auto q = t.open_queue().value();                    // one per thread
//   farmem::IoOp op{farmem::IoKind::kRead, 4096, {0, (*slabs)[0].slab, 0}, buf, 7};
//   q->post({&op, 1});                                  // never waits for the reply
//   farmem::IoCompletion c[8];
//   size_t n = q->wait(c, 1000);                        // c[0] = {7, kOk}
//
// It follows every rule in runtime/transport.h. How:
//
//  * A queue owns one data connection per server, opened on the first op
//    for that server through DonorSession::open_data_connection() (that one
//    post blocks for the handshake). If opening fails, or the connection
//    later dies, every op outstanding on it and every later op for that
//    server completes with kUnavailable; the reason is logged once.
//  * The donor answers the requests of one connection in order, so each
//    connection keeps its ops in a FIFO: replies are matched to the head and
//    their tags checked. Ops on different connections complete in any order.
//  * post() checks each op locally (registered buffer, length, server, slab,
//    range); a refused op completes with its error on the next poll() and
//    sends nothing. Accepted ops are encoded into preallocated per-op slots
//    (32 bytes of frame header + request) and sent with one gather write
//    whose iovecs point at those slots and, for WRITE, straight at the
//    caller's registered buffer: the data is never copied. Sends are
//    non-blocking: what the socket does not take now is sent by later
//    poll()/wait() calls, so post() never waits for the network and a queue
//    cannot deadlock against a donor busy sending it replies.
//  * poll() sends what is pending and reads what has arrived, without
//    blocking. READ_DATA payloads go straight into the op's buffer when they
//    span several reads (a recvmsg with the op's buffer as first iovec);
//    what arrived together with headers in the 64 KiB receive buffer is
//    copied out. wait() sleeps in poll(2) and reads only the sockets it
//    reports readable.
//  * No allocation and no lock per op. The tables (buffers, servers, slabs)
//    are immutable snapshots: a change builds a new one under a mutex and
//    publishes it with an atomic pointer; old snapshots stay alive until the
//    transport is destroyed, so a queue may read any of them without a lock.
//    Table changes are control-path events (a few per lease), which keeps
//    that retained memory small.
//
// Lifetimes: every DonorSession added outlives the transport; the transport
// outlives its queues. Destroying a queue closes its connections; ops still
// outstanding are abandoned (the donor finishes or drops them).
#pragma once

#include <poll.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/donor_client.h"
#include "runtime/net.h"
#include "runtime/registration_table.h"
#include "runtime/status.h"
#include "runtime/transport.h"
#include "runtime/wire.h"

namespace farmem {

// TcpTransport::Options; outside the class so that it can be a default
// argument of the constructor.
struct TcpTransportOptions {
  size_t depth = 64;  // ops outstanding per queue, over all its connections
};

class TcpTransport final : public TransportControl {  // satisfies TransportBackend
 public:
  class Queue;
  using Options = TcpTransportOptions;

  explicit TcpTransport(Options o = {});
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  // kInvalidArgument for a null session or an id already added.
  Status add_server(ServerId id, DonorSession* session);  // session outlives the transport
  // kInvalidArgument when Options::depth is 0.
  Result<std::unique_ptr<Queue>> open_queue();

  const char* name() const override { return "tcp"; }
  // kInvalidArgument for null, zero length, or overlap with a registered
  // buffer; unregister_buffer takes the start address (kNotFound otherwise).
  Status register_buffer(void* addr, size_t length) override;
  Status unregister_buffer(void* addr) override;
  bool registration_pins() const override { return false; }  // plain copies
  // kInvalidArgument for an unknown server, size 0 or a slab already added;
  // remove_slab: kNotFound when it was not added.
  Status add_slab(ServerId server, const SlabDesc& slab) override;
  Status remove_slab(ServerId server, SlabId slab) override;
  // Slabs added that are read and written one-sided ("Local donors"), and
  // of those the ones read and written through their file.
  size_t local_slabs() const;
  size_t local_files() const;

 private:
  friend class Queue;
  struct Slab {
    SlabId id = 0;
    uint64_t size = 0;
    uint64_t local_addr = 0;         // "Local donors": the donor's view of it, or 0 (tcp)
    std::shared_ptr<const Fd> file;  // "Local donors": its file in the donor, or null
  };
  // A donor process on this host whose slabs are read and written
  // one-sided ("Local donors" in tcp_transport.cc).
  struct LocalDonor {
    int pid = 0;
    Fd pidfd;  // readable once the process has exited
  };
  struct Server {
    ServerId id = 0;
    DonorSession* session = nullptr;
    std::vector<Slab> slabs;                  // sorted by id
    std::shared_ptr<const LocalDonor> local;  // set by the first local slab
  };
  // The proof of "Local donors" for `slab`; on success, *local is the
  // donor (kept, or opened for its pid) and *file the slab's file, when the
  // donor offers one and this process may take it (else null: the view is
  // read with process_vm_readv). Called with mu_ held.
  Status adopt_local(const Server& server, const SlabDesc& slab,
                     std::shared_ptr<const LocalDonor>* local, std::shared_ptr<const Fd>* file);
  // One immutable version of the tables; vectors sorted for binary search.
  struct Tables {
    RegistrationTable<> buffers;
    std::vector<Server> servers;  // sorted by id
    const Server* find_server(ServerId id) const;
  };

  const Tables* tables() const { return current_.load(std::memory_order_acquire); }
  // Publishes `next` as the current tables. Called with mu_ held.
  void publish(std::unique_ptr<Tables> next);

  const Options opts_;
  std::mutex mu_;                                   // serialises table changes
  bool local_refused_ = false;                      // guarded by mu_; logged once
  std::vector<std::unique_ptr<const Tables>> all_;  // guarded by mu_; every version, kept
  std::atomic<const Tables*> current_{nullptr};     // the newest of all_
};

// One thread's queue. Not thread-safe: one owner at a time.
class TcpTransport::Queue {
 public:
  ~Queue();
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  // All or none: kResourceExhausted when outstanding() + ops.size() >
  // depth(). Refused ops are accepted and complete with their error.
  Errc post(std::span<const IoOp> ops);
  size_t poll(std::span<IoCompletion> out);
  size_t wait(std::span<IoCompletion> out, int timeout_ms);
  // Accepted and not yet reaped by poll()/wait().
  size_t outstanding() const { return outstanding_; }
  size_t depth() const { return depth_; }
  // process_vm_readv / writev calls made for one-sided ops ("Local
  // donors"; a run of them in one post() is one call). Tests.
  uint64_t local_calls() const { return local_calls_; }

 private:
  friend class TcpTransport;
  // READ and WRITE frames start with the 16-byte header and the 16-byte
  // request; WRITE data follows from the caller's buffer.
  static constexpr size_t kFrameHead = wire::kHeaderSize + wire::kIoReqSize;
  static constexpr size_t kRxBufferSize = 64 << 10;
  static constexpr int kMaxIov = 64;

  struct Slot {
    IoOp op;
    uint64_t tag = 0;
    uint8_t head[kFrameHead];
  };
  struct Conn;

  Queue(TcpTransport* t, size_t depth);
  // The connection to `server`, opened on first use; dead if that failed.
  Conn* conn_for(const Server& server);
  void complete(uint64_t cookie, Errc status);
  // An op on a local donor's slab ("Local donors"), done now.
  Errc local_io(const Server& server, const IoOp& op, uint64_t remote, int file);
  static ssize_t move_local(int pid, int file, IoKind kind, const IoOp* const* ops,
                            const uint64_t* remote, size_t n, size_t* want);
  // Consecutive ops of one kind on one local donor's slabs, done with one
  // process_vm_readv / writev and completed in order (post() gathers them).
  struct LocalBatch {
    const Server* server = nullptr;
    IoKind kind = IoKind::kRead;
    size_t n = 0;
    const IoOp* ops[kMaxIov];
    uint64_t remote[kMaxIov];  // the op's address in the donor's view
    int file[kMaxIov];         // the slab's file, or -1
  };
  void local_batch(LocalBatch& b);
  void finish_head(Conn& c, Errc status);
  // Closes the connection and fails every op on it with kUnavailable.
  void kill(Conn& c, const char* why, int err);
  void flush(Conn& c);
  void receive(Conn& c);
  // Consumes whole or partial replies buffered in c.rx; false if it killed c.
  bool parse(Conn& c);
  void progress();
  size_t drain(std::span<IoCompletion> out);

  TcpTransport* const t_;
  const size_t depth_;
  size_t outstanding_ = 0;            // accepted, not reaped
  std::vector<ServerId> local_dead_;  // local donors whose ops failed: all fail
  uint64_t local_calls_ = 0;
  size_t in_flight_ = 0;  // on some connection, no reply yet
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;  // a stack
  std::vector<IoCompletion> done_;    // ring of completed, unreaped ops
  size_t done_head_ = 0;
  size_t done_count_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<pollfd> pfds_;     // scratch for wait(), one per connection
  std::vector<Conn*> pfd_conn_;  // the connection of each pfds_ entry
};

static_assert(TransportBackend<TcpTransport>);

}  // namespace farmem
