#include "runtime/tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "runtime/log.h"

namespace farmem {

// ---- Tables (control path) -------------------------------------------------

const TcpTransport::Server* TcpTransport::Tables::find_server(ServerId id) const {
  auto it = std::lower_bound(servers.begin(), servers.end(), id,
                             [](const Server& s, ServerId v) { return s.id < v; });
  return it != servers.end() && it->id == id ? &*it : nullptr;
}

TcpTransport::TcpTransport(Options o) : opts_(o) {
  std::lock_guard lk(mu_);
  publish(std::make_unique<Tables>());
}

TcpTransport::~TcpTransport() = default;

void TcpTransport::publish(std::unique_ptr<Tables> next) {
  const Tables* p = next.get();
  all_.push_back(std::move(next));
  current_.store(p, std::memory_order_release);
}

Status TcpTransport::add_server(ServerId id, DonorSession* session) {
  if (session == nullptr)
    return make_error(Errc::kInvalidArgument,
                      "add_server(%u): session is null; pass a connected DonorSession", id);
  std::lock_guard lk(mu_);
  if (tables()->find_server(id) != nullptr)
    return make_error(Errc::kInvalidArgument,
                      "add_server(%u): server id already added; use a distinct id per donor", id);
  auto next = std::make_unique<Tables>(*tables());
  auto it = std::lower_bound(next->servers.begin(), next->servers.end(), id,
                             [](const Server& s, ServerId v) { return s.id < v; });
  next->servers.insert(it, Server{id, session, {}, nullptr});
  publish(std::move(next));
  return ok_status();
}

Status TcpTransport::register_buffer(void* addr, size_t length) {
  std::lock_guard lk(mu_);
  auto next = std::make_unique<Tables>(*tables());
  FARMEM_RETURN_IF_ERROR(next->buffers.insert(addr, length));
  publish(std::move(next));
  return ok_status();
}

Status TcpTransport::unregister_buffer(void* addr) {
  std::lock_guard lk(mu_);
  auto next = std::make_unique<Tables>(*tables());
  FARMEM_RETURN_IF_ERROR(next->buffers.erase(addr));
  publish(std::move(next));
  return ok_status();
}

Status TcpTransport::add_slab(ServerId server, const SlabDesc& slab) {
  if (slab.size == 0)
    return make_error(Errc::kInvalidArgument, "add_slab(server %u, slab %u): size is 0", server,
                      slab.slab);
  std::lock_guard lk(mu_);
  auto next = std::make_unique<Tables>(*tables());
  auto sit = std::lower_bound(next->servers.begin(), next->servers.end(), server,
                              [](const Server& s, ServerId v) { return s.id < v; });
  if (sit == next->servers.end() || sit->id != server)
    return make_error(Errc::kInvalidArgument,
                      "add_slab(server %u, slab %u): unknown server; call add_server first", server,
                      slab.slab);
  auto& slabs = sit->slabs;
  auto it = std::lower_bound(slabs.begin(), slabs.end(), slab.slab,
                             [](const Slab& s, SlabId v) { return s.id < v; });
  if (it != slabs.end() && it->id == slab.slab)
    return make_error(Errc::kInvalidArgument, "add_slab(server %u, slab %u): already added", server,
                      slab.slab);
  uint64_t local_addr = 0;
  std::shared_ptr<const Fd> file;
  if (slab.addr != 0 && slab.rkey != 0 && !sit->session->serves_verbs()) {
    std::shared_ptr<const LocalDonor> local;
    if (Status st = adopt_local(*sit, slab, &local, &file); st.ok()) {
      if (sit->local == nullptr)
        FARMEM_LOG(kInfo,
                   "donor %s is on this host: this process reads and writes its slabs itself "
                   "(one-sided, %s); farmemd --local-clients=off keeps it on tcp",
                   sit->session->endpoint().to_string().c_str(),
                   file != nullptr ? "pread / pwrite on the slabs' files" : "process_vm_readv");
      sit->local = std::move(local);
      local_addr = slab.addr;
    } else if (!local_refused_) {
      local_refused_ = true;
      FARMEM_LOG(kInfo, "donor %s is on this host but its slabs stay on tcp: %s",
                 sit->session->endpoint().to_string().c_str(), st.to_string().c_str());
    }
  }
  slabs.insert(it, Slab{slab.slab, slab.size, local_addr, std::move(file)});
  publish(std::move(next));
  return ok_status();
}

// Local donors. A farmemd on this host gives each slab it lends to a
// client on loopback a view of its own (SlabDesc.addr, with its pid as
// SlabDesc.rkey; donor_server.cc "Local clients"), and such a slab is read
// and written here with process_vm_readv / process_vm_writev: one system
// call, no request, no reply, no donor thread woken, like an RDMA READ.
// The op completes inside post(), so the completion is there at the next
// poll() or wait(), and ordering holds trivially.
//  * Proof before use (adopt_local): the bytes right after the slab's view
//    (a page of the donor's own) must hold this session's WELCOME secret,
//    read through that pid and address. That rules out a pid that names
//    another process (another pid namespace, a reused number) and a donor
//    that does not offer the path; refusals (another user, ptrace
//    restrictions: EPERM) keep the slab on tcp.
//  * Batches: consecutive ops of one kind on one donor in a post() (a
//    write-back batch, a prefetch window) are one call with up to kMaxIov
//    iovecs a side and one pidfd poll after it (and one before a WRITE);
//    a call that fails is redone op by op, which says which op failed.
//  * The slab's file: when the view is a mapping of a memfd of the donor's
//    (the proof page ends with wire::kLocalFileMagic and its descriptor
//    number), the client takes that file with pidfd_getfd() (the same
//    ptrace access process_vm_readv needs), checks that its proof page
//    holds the secret too, and reads and writes the slab with pread /
//    pwrite (a batch that is one run of consecutive offsets in one file,
//    a prefetch window: one preadv / pwritev; a batch over several slabs
//    still goes through the views, as one call).
//    That reads page-cache pages of the file instead of walking and pinning
//    the donor's page tables: 4 KiB in 1.3 us against 2.9 us for
//    process_vm_readv, pinned to one CPU on the development VM
//    (docs/eval/l-s28). A revoked file is truncated (a READ gets 0 bytes)
//    and sealed against growth (a WRITE gets EPERM): both complete
//    kUnavailable.
//  * Liveness: a pidfd of the donor, opened at the proof, is polled after
//    every op, and before every WRITE. An op that ran after the donor
//    exited (a reused pid could have answered it) completes kUnavailable,
//    as a lost connection's ops do, and so do ops that fail (EFAULT: the
//    lease was revoked, the view is gone; ESRCH: the donor is gone). Ops
//    through a file are not polled: no pid is involved, the file is the
//    lease's memory whatever becomes of the process, and a donor that
//    exited is found lost by its session (the control connection), as a
//    donor on tcp is; until then its file still holds what was written.
//    Skipping the two polls: faultlat +3.6% reads/s (docs/eval/l-s28).
Status TcpTransport::adopt_local(const Server& server, const SlabDesc& slab,
                                 std::shared_ptr<const LocalDonor>* local,
                                 std::shared_ptr<const Fd>* file) {
  const auto& secret = server.session->welcome().secret;
  const int pid = static_cast<int>(slab.rkey);
  std::shared_ptr<const LocalDonor> d = server.local;
  if (d == nullptr || d->pid != pid) {
    auto fresh = std::make_shared<LocalDonor>();
    fresh->pid = pid;
    fresh->pidfd = Fd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
    if (!fresh->pidfd.valid())
      return make_error(Errc::kUnavailable, "pidfd_open(%d): %s", pid, strerror(errno));
    d = std::move(fresh);
  }
  uint8_t got[wire::kSecretSize];
  uint8_t rec[8];
  iovec l[2] = {{got, sizeof got}, {rec, sizeof rec}};
  iovec r[2] = {
      {reinterpret_cast<void*>(slab.addr + slab.size), sizeof got},
      {reinterpret_cast<void*>(slab.addr + slab.size + wire::kLocalFileRecord), sizeof rec}};
  const ssize_t n = process_vm_readv(pid, l, 2, r, 2, 0);
  if (n != static_cast<ssize_t>(sizeof got + sizeof rec))
    return make_error(Errc::kPermissionDenied, "process_vm_readv of donor pid %d: %s", pid,
                      n < 0 ? strerror(errno) : "short read");
  if (std::memcmp(got, secret.data(), sizeof got) != 0)
    return make_error(Errc::kPermissionDenied,
                      "pid %d at the slab's address is not this session's donor (another pid "
                      "namespace?)",
                      pid);
  file->reset();
  if (wire::get_u32(rec) == wire::kLocalFileMagic) {
    // The descriptor number may have been closed and reused since the
    // donor wrote it: the file's own proof page says whether it is ours.
    Fd f(static_cast<int>(
        syscall(SYS_pidfd_getfd, d->pidfd.get(), static_cast<int>(wire::get_u32(rec + 4)), 0)));
    uint8_t in_file[wire::kSecretSize];
    if (f.valid() &&
        pread(f.get(), in_file, sizeof in_file, static_cast<off_t>(slab.size)) ==
            static_cast<ssize_t>(sizeof in_file) &&
        std::memcmp(in_file, secret.data(), sizeof in_file) == 0)
      *file = std::make_shared<const Fd>(std::move(f));
  }
  pollfd pf{d->pidfd.get(), POLLIN, 0};
  if (::poll(&pf, 1, 0) != 0) return make_error(Errc::kUnavailable, "donor pid %d exited", pid);
  *local = std::move(d);
  return ok_status();
}

size_t TcpTransport::local_slabs() const {
  size_t n = 0;
  for (const Server& s : tables()->servers)
    for (const Slab& sl : s.slabs) n += sl.local_addr != 0 ? 1 : 0;
  return n;
}

size_t TcpTransport::local_files() const {
  size_t n = 0;
  for (const Server& s : tables()->servers)
    for (const Slab& sl : s.slabs) n += sl.file != nullptr ? 1 : 0;
  return n;
}

Status TcpTransport::remove_slab(ServerId server, SlabId slab) {
  std::lock_guard lk(mu_);
  auto next = std::make_unique<Tables>(*tables());
  auto sit = std::lower_bound(next->servers.begin(), next->servers.end(), server,
                              [](const Server& s, ServerId v) { return s.id < v; });
  if (sit != next->servers.end() && sit->id == server) {
    auto& slabs = sit->slabs;
    auto it = std::lower_bound(slabs.begin(), slabs.end(), slab,
                               [](const Slab& s, SlabId v) { return s.id < v; });
    if (it != slabs.end() && it->id == slab) {
      slabs.erase(it);
      publish(std::move(next));
      return ok_status();
    }
  }
  return make_error(Errc::kNotFound, "remove_slab(server %u, slab %u): slab was not added", server,
                    slab);
}

Result<std::unique_ptr<TcpTransport::Queue>> TcpTransport::open_queue() {
  if (opts_.depth == 0 || opts_.depth > (1u << 20))
    return make_error(Errc::kInvalidArgument,
                      "tcp transport queue depth %zu is outside 1..1048576; pick e.g. 64",
                      opts_.depth);
  return std::unique_ptr<Queue>(new Queue(this, opts_.depth));
}

// ---- Queue (data path) -------------------------------------------------------

// One data connection. The ops sent on it wait for their replies in `fifo`,
// a ring of slot indices addressed by three running counters:
//
//   head ........ sent ........ tail
//   |  replies   |  not (fully)  |
//   |  awaited   |  sent yet     |
//
// send_off is how much of op `sent` is already on the wire. Replies arrive in
// request order, so each reply belongs to op `head`. The receive side is a
// three-state machine over the bytes in `rx`:
//
//   state   | input                         | next    | effect
//   --------+-------------------------------+---------+---------------------------
//   kHeader | READ_DATA, tag and len match  | kData   |
//   kHeader | WRITTEN, tag matches          | kHeader | head completes kOk
//   kHeader | ERROR, tag matches            | kError  |
//   kHeader | anything else                 | (dead)  | every op: kUnavailable
//   kData   | last payload byte             | kHeader | head completes kOk
//   kError  | last payload byte             | kHeader | head completes with the code
struct TcpTransport::Queue::Conn {
  enum class Rx : uint8_t { kHeader, kData, kError };

  ServerId server = 0;
  std::string donor;  // "host:port", for messages
  Fd fd;
  bool dead = false;

  std::vector<uint32_t> fifo;  // capacity = queue depth
  uint64_t head = 0;
  uint64_t sent = 0;
  uint64_t tail = 0;
  size_t send_off = 0;
  uint64_t next_tag = 1;

  // Not zero-filled: its pages are touched (resident) only as far as
  // replies reach, not all 64 KiB when the connection opens.
  std::unique_ptr<uint8_t[]> rx;
  size_t rpos = 0;  // first unparsed byte
  size_t rlen = 0;  // end of received bytes
  Rx rstate = Rx::kHeader;
  uint32_t payload_len = 0;  // of the frame being received
  uint32_t got = 0;          // payload bytes of it consumed so far
  uint8_t err[4 + wire::kMaxErrorMessage];

  uint32_t at(uint64_t i) const { return fifo[i % fifo.size()]; }
};

TcpTransport::Queue::Queue(TcpTransport* t, size_t depth) : t_(t), depth_(depth) {
  slots_.resize(depth);
  free_slots_.reserve(depth);
  for (size_t i = depth; i > 0; --i) free_slots_.push_back(static_cast<uint32_t>(i - 1));
  done_.resize(depth);
}

TcpTransport::Queue::~Queue() = default;

namespace {

// The local checks of runtime/transport.h; kOk and *server set when the op
// may be sent.
template <class Tables, class Server, class Slab>
Errc check_op(const Tables& t, const IoOp& op, const Server** server, const Slab** slab) {
  if (op.kind != IoKind::kRead && op.kind != IoKind::kWrite) return Errc::kInvalidArgument;
  if (op.length == 0 || op.length > wire::kMaxIoLength) return Errc::kInvalidArgument;
  if (t.buffers.find(op.local, op.length) == nullptr) return Errc::kInvalidArgument;
  const Server* s = t.find_server(op.remote.server);
  if (s == nullptr) return Errc::kInvalidArgument;
  auto sl = std::lower_bound(s->slabs.begin(), s->slabs.end(), op.remote.slab,
                             [](const auto& x, SlabId v) { return x.id < v; });
  if (sl == s->slabs.end() || sl->id != op.remote.slab) return Errc::kInvalidArgument;
  if (op.remote.offset > sl->size || op.length > sl->size - op.remote.offset)
    return Errc::kOutOfRange;
  *server = s;
  *slab = &*sl;
  return Errc::kOk;
}

}  // namespace

void TcpTransport::Queue::complete(uint64_t cookie, Errc status) {
  FARMEM_DCHECK(done_count_ < depth_);
  done_[(done_head_ + done_count_) % depth_] = IoCompletion{cookie, status};
  ++done_count_;
}

void TcpTransport::Queue::finish_head(Conn& c, Errc status) {
  const uint32_t idx = c.at(c.head);
  ++c.head;
  --in_flight_;
  complete(slots_[idx].op.cookie, status);
  free_slots_.push_back(idx);
}

void TcpTransport::Queue::kill(Conn& c, const char* why, int err) {
  const uint64_t lost = c.tail - c.head;
  FARMEM_LOG(kWarn,
             "tcp transport: data connection to donor %s (server %u) lost: %s%s%s; %llu "
             "outstanding ops and every later op for this server fail with unavailable",
             c.donor.c_str(), c.server, why, err ? ": " : "", err ? strerror(err) : "",
             static_cast<unsigned long long>(lost));
  c.dead = true;
  c.fd.reset();
  while (c.head < c.tail) finish_head(c, Errc::kUnavailable);
  c.sent = c.tail;
  c.send_off = 0;
  c.rpos = c.rlen = 0;
  c.rstate = Conn::Rx::kHeader;
}

TcpTransport::Queue::Conn* TcpTransport::Queue::conn_for(const Server& server) {
  for (auto& c : conns_)
    if (c->server == server.id) return c.get();
  // First op for this server: connect now (control path, once per queue).
  auto c = std::make_unique<Conn>();
  c->server = server.id;
  c->donor = server.session->endpoint().to_string();
  c->fifo.resize(depth_);
  c->rx.reset(new uint8_t[kRxBufferSize]);
  auto fd = server.session->open_data_connection();
  if (!fd.ok()) {
    FARMEM_LOG(kWarn, "tcp transport: server %u: %s; its ops on this queue fail with unavailable",
               server.id, fd.status().to_string().c_str());
    c->dead = true;
  } else {
    c->fd = std::move(*fd);
  }
  conns_.push_back(std::move(c));
  pfds_.resize(conns_.size());
  pfd_conn_.resize(conns_.size());
  return conns_.back().get();
}

Errc TcpTransport::Queue::post(std::span<const IoOp> ops) {
  if (ops.size() > depth_ - outstanding_) return Errc::kResourceExhausted;
  const Tables* tables = t_->tables();
  // Runs of one-sided ops of one kind on one local donor go out as one
  // system call ("Local donors"); anything else ends the run first, so
  // ops complete in the order posted.
  LocalBatch lb;
  for (const IoOp& op : ops) {
    ++outstanding_;
    const Server* server = nullptr;
    const Slab* slab = nullptr;
    Errc e = check_op(*tables, op, &server, &slab);
    if (e == Errc::kOk && slab->local_addr != 0) {
      if (lb.n == kMaxIov || (lb.n > 0 && (lb.server != server || lb.kind != op.kind)))
        local_batch(lb);
      lb.server = server;
      lb.kind = op.kind;
      lb.ops[lb.n] = &op;
      lb.file[lb.n] = slab->file != nullptr ? slab->file->get() : -1;
      lb.remote[lb.n] = slab->local_addr + op.remote.offset;
      ++lb.n;
      continue;
    }
    local_batch(lb);
    if (e != Errc::kOk) {
      complete(op.cookie, e);
      continue;
    }
    Conn* c = conn_for(*server);
    if (c->dead) {
      complete(op.cookie, Errc::kUnavailable);
      continue;
    }
    const uint32_t idx = free_slots_.back();
    free_slots_.pop_back();
    Slot& s = slots_[idx];
    s.op = op;
    s.tag = c->next_tag++;
    const bool write = op.kind == IoKind::kWrite;
    wire::encode_frame_header(s.head, write ? wire::MsgType::kWrite : wire::MsgType::kRead, s.tag,
                              static_cast<uint32_t>(wire::kIoReqSize) + (write ? op.length : 0));
    uint8_t* req = s.head + wire::kHeaderSize;
    wire::put_u32(req, op.remote.slab);
    wire::put_u32(req + 4, op.length);
    wire::put_u64(req + 8, op.remote.offset);
    c->fifo[c->tail % c->fifo.size()] = idx;
    ++c->tail;
    ++in_flight_;
  }
  local_batch(lb);
  for (auto& c : conns_)
    if (!c->dead && c->sent < c->tail) flush(*c);
  return Errc::kOk;
}

// The bytes of n one-sided ops of one kind: through `file`, at consecutive
// offsets from the first op's (preadv / pwritev), or with file -1 between
// the ops' buffers and their views at remote[i] in the donor pid
// (process_vm_readv / process_vm_writev). What the call returned; *want
// is what it should have.
ssize_t TcpTransport::Queue::move_local(int pid, int file, IoKind kind, const IoOp* const* ops,
                                        const uint64_t* remote, size_t n, size_t* want) {
  FARMEM_BUG_ON(n == 0 || n > kMaxIov);
  iovec l[kMaxIov], r[kMaxIov];
  *want = 0;
  for (size_t i = 0; i < n; ++i) {
    l[i] = {ops[i]->local, ops[i]->length};
    r[i] = {reinterpret_cast<void*>(remote[i]), ops[i]->length};
    *want += ops[i]->length;
  }
  const auto off = static_cast<off_t>(ops[0]->remote.offset);
  if (file >= 0)
    return kind == IoKind::kRead ? preadv(file, l, static_cast<int>(n), off)
                                 : pwritev(file, l, static_cast<int>(n), off);
  return kind == IoKind::kRead ? process_vm_readv(pid, l, n, r, n, 0)
                               : process_vm_writev(pid, l, n, r, n, 0);
}

void TcpTransport::Queue::local_batch(LocalBatch& b) {
  const size_t n = b.n;
  b.n = 0;
  if (n == 0) return;
  const Server& server = *b.server;
  if (n == 1 || std::find(local_dead_.begin(), local_dead_.end(), server.id) != local_dead_.end()) {
    for (size_t i = 0; i < n; ++i)
      complete(b.ops[i]->cookie, local_io(server, *b.ops[i], b.remote[i], b.file[i]));
    return;
  }
  const LocalDonor& d = *server.local;
  // One call: through the file when the ops are one run of consecutive
  // offsets in one slab's file (a prefetch window), else between the views
  // (a write-back batch, scattered over slabs). Through the views the
  // donor must be alive before a WRITE (it must never reach a reused pid)
  // and after any op (a READ's bytes came from it), as in local_io().
  bool one_run = b.file[0] >= 0;
  for (size_t i = 1; i < n && one_run; ++i)
    one_run = b.file[i] == b.file[0] &&
              b.ops[i]->remote.offset == b.ops[i - 1]->remote.offset + b.ops[i - 1]->length;
  pollfd pf{d.pidfd.get(), POLLIN, 0};
  bool all = one_run || b.kind == IoKind::kRead || ::poll(&pf, 1, 0) == 0;
  if (all) {
    size_t want = 0;
    ++local_calls_;
    all = move_local(d.pid, one_run ? b.file[0] : -1, b.kind, b.ops, b.remote, n, &want) ==
          static_cast<ssize_t>(want);
  }
  if (all && (one_run || ::poll(&pf, 1, 0) == 0)) {
    for (size_t i = 0; i < n; ++i) complete(b.ops[i]->cookie, Errc::kOk);
    return;
  }
  // Something failed: each op again on its own, which says which and
  // fails the donor as local_io() does (ops are idempotent).
  for (size_t i = 0; i < n; ++i)
    complete(b.ops[i]->cookie, local_io(server, *b.ops[i], b.remote[i], b.file[i]));
}

Errc TcpTransport::Queue::local_io(const Server& server, const IoOp& op, uint64_t remote,
                                   int file) {
  if (std::find(local_dead_.begin(), local_dead_.end(), server.id) != local_dead_.end())
    return Errc::kUnavailable;
  const LocalDonor& d = *server.local;
  // Through the view, before a WRITE too: once the donor is gone its pid
  // may name another process, which a WRITE must never reach. A READ from
  // such a process is caught by the look after it, and its bytes are not
  // used. Through a file, neither ("Local donors", Liveness).
  pollfd pf{d.pidfd.get(), POLLIN, 0};
  bool gone = file < 0 && op.kind == IoKind::kWrite && ::poll(&pf, 1, 0) != 0;
  ssize_t n = -1;
  if (!gone) {
    const IoOp* ops[1] = {&op};
    size_t want = 0;
    ++local_calls_;
    n = move_local(d.pid, file, op.kind, ops, &remote, 1, &want);
    gone = file < 0 && ::poll(&pf, 1, 0) != 0;
  }
  if (n == static_cast<ssize_t>(op.length) && !gone) return Errc::kOk;
  // As a lost connection: this op and every later one on this donor fail.
  local_dead_.push_back(server.id);
  FARMEM_LOG(kWarn,
             "tcp transport: one-sided %s of %u bytes on the local donor %s (pid %d) failed: %s; "
             "this and every later op for it on this queue fail with unavailable",
             op.kind == IoKind::kRead ? "READ" : "WRITE", op.length,
             server.session->endpoint().to_string().c_str(), d.pid,
             gone                                      ? "the donor exited"
             : file >= 0 && (n >= 0 || errno == EPERM) ? "the lease was revoked (its file is empty)"
             : n < 0                                   ? strerror(errno)
                                                       : "short transfer");
  return Errc::kUnavailable;
}

void TcpTransport::Queue::flush(Conn& c) {
  while (c.sent < c.tail) {
    iovec iov[kMaxIov];
    int n = 0;
    size_t want = 0;
    size_t off = c.send_off;
    for (uint64_t i = c.sent; i < c.tail && n + 2 <= kMaxIov; ++i, off = 0) {
      Slot& s = slots_[c.at(i)];
      if (off < kFrameHead) {
        iov[n++] = iovec{s.head + off, kFrameHead - off};
        want += kFrameHead - off;
      }
      if (s.op.kind == IoKind::kWrite) {
        // Straight from the caller's registered buffer: no copy.
        const size_t d = off > kFrameHead ? off - kFrameHead : 0;
        iov[n++] = iovec{static_cast<uint8_t*>(s.op.local) + d, s.op.length - d};
        want += s.op.length - d;
      }
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(n);
    const ssize_t r = ::sendmsg(c.fd.get(), &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      kill(c, "send failed", errno);
      return;
    }
    size_t left = static_cast<size_t>(r);
    while (left > 0) {
      const Slot& s = slots_[c.at(c.sent)];
      const size_t total = kFrameHead + (s.op.kind == IoKind::kWrite ? s.op.length : 0);
      const size_t rem = total - c.send_off;
      if (left >= rem) {
        left -= rem;
        ++c.sent;
        c.send_off = 0;
      } else {
        c.send_off += left;
        left = 0;
      }
    }
    if (static_cast<size_t>(r) < want) return;  // the socket buffer is full
  }
}

bool TcpTransport::Queue::parse(Conn& c) {
  for (;;) {
    const size_t avail = c.rlen - c.rpos;
    switch (c.rstate) {
      case Conn::Rx::kHeader: {
        if (avail < wire::kHeaderSize) return true;
        if (c.head == c.sent) {
          kill(c, "the donor sent a reply to no request (protocol out of step)", 0);
          return false;
        }
        wire::Header h;
        const char* why = "";
        if (wire::decode_header(c.rx.get() + c.rpos, &h, &why) != Errc::kOk) {
          kill(c, why, 0);
          return false;
        }
        const Slot& s = slots_[c.at(c.head)];
        if (h.tag != s.tag) {
          kill(c, "a reply's tag does not match the oldest request (protocol out of step)", 0);
          return false;
        }
        c.rpos += wire::kHeaderSize;
        c.payload_len = h.payload_len;
        c.got = 0;
        if (h.type == wire::MsgType::kError && h.payload_len >= 4) {
          c.rstate = Conn::Rx::kError;
        } else if (h.type == wire::MsgType::kReadData && s.op.kind == IoKind::kRead &&
                   h.payload_len == s.op.length) {
          c.rstate = Conn::Rx::kData;
        } else if (h.type == wire::MsgType::kWritten && s.op.kind == IoKind::kWrite) {
          finish_head(c, Errc::kOk);
        } else {
          kill(c, "the donor answered a READ/WRITE with an unexpected frame type or length", 0);
          return false;
        }
        break;
      }
      case Conn::Rx::kData: {
        const Slot& s = slots_[c.at(c.head)];
        const size_t take = std::min<size_t>(avail, c.payload_len - c.got);
        std::memcpy(static_cast<uint8_t*>(s.op.local) + c.got, c.rx.get() + c.rpos, take);
        c.rpos += take;
        c.got += static_cast<uint32_t>(take);
        if (c.got < c.payload_len) return true;
        c.rstate = Conn::Rx::kHeader;
        finish_head(c, Errc::kOk);
        break;
      }
      case Conn::Rx::kError: {
        const size_t take = std::min<size_t>(avail, c.payload_len - c.got);
        std::memcpy(c.err + c.got, c.rx.get() + c.rpos, take);
        c.rpos += take;
        c.got += static_cast<uint32_t>(take);
        if (c.got < c.payload_len) return true;
        const uint16_t code = wire::get_u16(c.err);
        const Errc e = code == 0 || code > static_cast<uint16_t>(Errc::kCancelled)
                           ? Errc::kInternal
                           : static_cast<Errc>(code);
        const Slot& s = slots_[c.at(c.head)];
        FARMEM_LOG(kDebug, "tcp transport: donor %s refused %s of %u bytes at slab %u + %llu: %.*s",
                   c.donor.c_str(), s.op.kind == IoKind::kRead ? "READ" : "WRITE", s.op.length,
                   s.op.remote.slab, static_cast<unsigned long long>(s.op.remote.offset),
                   static_cast<int>(c.payload_len - 4), reinterpret_cast<const char*>(c.err + 4));
        c.rstate = Conn::Rx::kHeader;
        finish_head(c, e);
        break;
      }
    }
  }
}

void TcpTransport::Queue::receive(Conn& c) {
  for (;;) {
    if (!parse(c)) return;
    if (c.head == c.sent) return;  // no reply is due
    if (c.rpos == c.rlen) {
      c.rpos = c.rlen = 0;
    } else if (c.rpos > 0) {
      // parse() leaves at most part of a header behind.
      std::memmove(c.rx.get(), c.rx.get() + c.rpos, c.rlen - c.rpos);
      c.rlen -= c.rpos;
      c.rpos = 0;
    }
    iovec iov[2];
    int n = 0;
    size_t direct = 0;
    if (c.rstate == Conn::Rx::kData && c.rlen == 0) {
      // The rest of this READ_DATA goes straight into the op's buffer.
      const Slot& s = slots_[c.at(c.head)];
      direct = c.payload_len - c.got;
      iov[n++] = iovec{static_cast<uint8_t*>(s.op.local) + c.got, direct};
    }
    iov[n++] = iovec{c.rx.get() + c.rlen, kRxBufferSize - c.rlen};
    const size_t want = direct + (kRxBufferSize - c.rlen);
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(n);
    const ssize_t r = ::recvmsg(c.fd.get(), &m, MSG_DONTWAIT);
    if (r == 0) {
      kill(c, "the donor closed the connection", 0);
      return;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      kill(c, "recv failed", errno);
      return;
    }
    size_t got = static_cast<size_t>(r);
    if (direct > 0) {
      const size_t d = std::min(got, direct);
      c.got += static_cast<uint32_t>(d);
      got -= d;
      if (c.got == c.payload_len) {
        c.rstate = Conn::Rx::kHeader;
        finish_head(c, Errc::kOk);
      }
    }
    c.rlen += got;
    if (static_cast<size_t>(r) < want) {  // the socket is drained for now
      parse(c);
      return;
    }
  }
}

void TcpTransport::Queue::progress() {
  for (auto& c : conns_) {
    if (c->dead) continue;
    if (c->sent < c->tail) flush(*c);
    if (!c->dead && c->head < c->sent) receive(*c);
  }
}

size_t TcpTransport::Queue::drain(std::span<IoCompletion> out) {
  const size_t n = std::min(out.size(), done_count_);
  for (size_t i = 0; i < n; ++i) out[i] = done_[(done_head_ + i) % depth_];
  done_head_ = (done_head_ + n) % depth_;
  done_count_ -= n;
  outstanding_ -= n;
  return n;
}

size_t TcpTransport::Queue::poll(std::span<IoCompletion> out) {
  if (out.empty()) return 0;
  if (in_flight_ > 0 && done_count_ < out.size()) progress();
  return drain(out);
}

size_t TcpTransport::Queue::wait(std::span<IoCompletion> out, int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  if (out.empty() || outstanding_ == 0) return 0;
  if (done_count_ > 0) return drain(out);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  // poll(2) says which sockets have replies, so no recv is made only to
  // learn EAGAIN: a READ at queue depth 1 costs sendmsg, poll, recvmsg.
  for (;;) {
    for (auto& c : conns_)
      if (!c->dead && c->sent < c->tail) flush(*c);
    if (done_count_ > 0) return drain(out);  // a connection died while sending
    nfds_t nfds = 0;
    for (auto& c : conns_) {
      if (c->dead || c->head == c->tail) continue;
      short events = 0;
      if (c->head < c->sent) events |= POLLIN;
      if (c->sent < c->tail) events |= POLLOUT;
      pfd_conn_[nfds] = c.get();
      pfds_[nfds++] = pollfd{c->fd.get(), events, 0};
    }
    if (nfds == 0) return 0;  // nothing in flight (cannot happen while outstanding_ > 0)
    int ms = -1;
    if (timeout_ms >= 0) {
      const auto left = deadline - Clock::now();
      ms = left <= Clock::duration::zero()
               ? 0
               : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
    }
    const int pr = ::poll(pfds_.data(), nfds, ms);
    if (pr < 0) {
      if (errno == EINTR) continue;
      FARMEM_LOG(kError, "tcp transport: poll failed: %s", strerror(errno));
      return 0;
    }
    if (pr == 0) return 0;  // timed out
    for (nfds_t i = 0; i < nfds; ++i) {
      if (pfds_[i].revents == 0) continue;
      Conn& c = *pfd_conn_[i];
      // POLLHUP / POLLERR: the next send or recv reports the cause.
      if (c.sent < c.tail) flush(c);
      if (!c.dead && c.head < c.sent) receive(c);
    }
    if (done_count_ > 0) return drain(out);
    if (timeout_ms >= 0 && Clock::now() >= deadline) return 0;
  }
}

}  // namespace farmem
