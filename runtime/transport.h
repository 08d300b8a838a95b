// The Transport contract: one-sided READ and WRITE of byte ranges between
// registered local buffers and remote slabs, posted in batches and reaped
// by polling. Shaped after RDMA verbs so that every backend fits it: tcp
// (the daemon executes the op), loopback (in-process, with injectable
// delay, failure and reordering) and verbs (RC queue pairs).
//
//   farmem::LoopbackDonor donor(64 << 20, 1 << 20);
//   farmem::LoopbackTransport t;
//   if (!t.add_server(0, &donor).ok()) ...;
//   auto lease = donor.lease(1 << 20);            // control path
//   (void)t.add_slab(0, lease->front());
//   char* buf = ...; (void)t.register_buffer(buf, 8192);
//   auto q = *t.open_queue();                      // one per thread
//   farmem::IoOp op{farmem::IoKind::kWrite, 4096, {0, lease->front().slab, 0}, buf, 42};
//   (void)q->post({&op, 1});
//   farmem::IoCompletion c[8];
//   size_t n = q->wait(c, 1000);                   // c[0].cookie == 42
//
// Dispatch: the data path is static. Code that moves pages is a template on
// a backend type satisfying `TransportBackend` and calls its Queue's post()
// and poll() directly; the virtual `TransportControl` base is for set-up
// only (servers, slabs, buffers).
//
// Semantics every backend implements and the conformance suite checks
// (tests/runtime/transport_conformance_test.cc):
//  * Registration. `local` of every op lies wholly inside a buffer
//    registered with register_buffer(). An op on unregistered memory
//    completes with kInvalidArgument and moves no bytes.
//  * Validation. length in 1..wire::kMaxIoLength; the server known; the slab
//    added with add_slab(); offset + length within the slab. Otherwise the op
//    completes with kInvalidArgument (length, unknown server/slab) or
//    kOutOfRange (range) and moves no bytes. Nothing is checked only on the
//    remote side: a remote refusal also arrives as a completion status.
//  * post() takes all the ops or none: kResourceExhausted when
//    outstanding() + ops.size() > depth(), kUnavailable when the queue is
//    broken (connection lost). It does not block on the network.
//  * Each accepted op completes exactly once with its cookie. Completions of
//    outstanding ops may arrive in any order; nothing is ordered between ops
//    that are outstanding at the same time. A READ posted after a WRITE's
//    completion was reaped (on any queue) sees that WRITE.
//  * A READ that completes kOk has filled all `length` bytes; a WRITE that
//    completes kOk is stored on the server. A failed op's local bytes are
//    unspecified (READ) and its remote bytes are unspecified (WRITE).
//  * When a connection dies, every op outstanding on it completes with
//    kUnavailable; later posts to that server complete with kUnavailable.
//  * Queues are single-owner: one thread at a time uses a queue (no lock on
//    the data path). The transport object itself is thread-safe.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "runtime/status.h"
#include "runtime/wire.h"

namespace farmem {

using ServerId = uint16_t;
using SlabId = uint32_t;

struct RemoteAddr {
  ServerId server = 0;
  SlabId slab = 0;
  uint64_t offset = 0;
};

enum class IoKind : uint8_t { kRead = 0, kWrite = 1 };

struct IoOp {
  IoKind kind = IoKind::kRead;
  uint32_t length = 0;  // 1 .. wire::kMaxIoLength
  RemoteAddr remote;
  void* local = nullptr;  // inside a registered buffer
  uint64_t cookie = 0;    // returned in the completion
};

struct IoCompletion {
  uint64_t cookie = 0;
  Errc status = Errc::kOk;
};

// A leased slab as the data path needs it; see wire::SlabDesc.
using SlabDesc = wire::SlabDesc;

// One thread's queue (an RC queue pair on verbs, a connection per server on
// tcp). Not thread-safe by design.
template <class Q>
concept TransportQueue = requires(Q& q, std::span<const IoOp> ops, std::span<IoCompletion> out,
                                  int timeout_ms) {
  { q.post(ops) } -> std::same_as<Errc>;
  // Reaps up to out.size() completions without blocking; returns how many.
  { q.poll(out) } -> std::same_as<size_t>;
  // As poll(), but blocks up to timeout_ms (-1: forever) for at least one
  // completion while any op is outstanding. Returns 0 on timeout or when
  // nothing is outstanding.
  { q.wait(out, timeout_ms) } -> std::same_as<size_t>;
  { q.outstanding() } -> std::same_as<size_t>;
  { q.depth() } -> std::same_as<size_t>;
};

// Set-up operations shared by every backend; virtual, control path only.
class TransportControl {
 public:
  virtual ~TransportControl() = default;
  virtual const char* name() const = 0;
  // Registers local memory for ops (an MR on verbs). Buffers may overlap
  // neither each other nor be registered twice.
  virtual Status register_buffer(void* addr, size_t length) = 0;
  virtual Status unregister_buffer(void* addr) = 0;
  // Whether a registration pins the buffer's pages (an MR without on-demand
  // paging does): then they must not be dropped with MADV_DONTNEED while
  // registered, as the transport would keep using the old pages. Backends
  // that copy through the buffer's virtual addresses say false.
  virtual bool registration_pins() const { return true; }
  // Makes a leased slab of a server usable by ops; remove_slab forgets it.
  virtual Status add_slab(ServerId server, const SlabDesc& slab) = 0;
  virtual Status remove_slab(ServerId server, SlabId slab) = 0;
};

template <class T>
concept TransportBackend = std::derived_from<T, TransportControl> && requires(T& t) {
  typename T::Queue;
  requires TransportQueue<typename T::Queue>;
  { t.open_queue() } -> std::same_as<Result<std::unique_ptr<typename T::Queue>>>;
};

}  // namespace farmem
