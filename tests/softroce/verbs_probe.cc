// verbs_probe: checks, on a real verbs device (Soft-RoCE in the qemu guest),
// the facts the verbs transport will rely on, and prints the device's
// limits. One process, two threads: a server that registers a buffer and
// hands out {addr, rkey, length} in the rdma_cm accept, and a client that
// connects an RC queue pair to it over rdma_cm and moves bytes one-sided.
//
//   verbs_probe                      # first device, 10.0.0.1, 64 KiB region
//   verbs_probe --device rxe0 --addr 10.0.0.1 --size 65536
//
// Checks (each prints PASS/FAIL; the last line counts them):
//   device      the device opens and answers ibv_query_device / _port
//   connect     rdma_cm resolve, route, connect, accept with private data
//   read        one RDMA READ of the whole region (several MTUs), byte-exact
//   write       one RDMA WRITE of half the region; the server thread finds
//               exactly those bytes in its own memory after the disconnect
//   readback    a READ after the WRITE's completion sees the WRITE
//   batch       8 READs posted as one list, only the last signalled: one
//               completion, all 8 destinations filled (RC ordering)
//   bounds      a READ past the end of the remote MR completes with
//               IBV_WC_REM_ACCESS_ERR and moves no byte; the next op on the
//               broken QP is flushed (or refused at post)
// It also prints 4 KiB READ/WRITE latencies at queue depth 1 (facts, not
// checks: emulation speed means nothing).
//
// Exit status: 0 all checks passed; 1 a check failed; 77 no RDMA device
// here (the host has no RDMA stack: run it through tools/softroce/run.sh).
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/status.h"

namespace farmem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kCmTimeoutMs = 10000;
constexpr int kCqTimeoutMs = 5000;
constexpr int kLatencyIters = 200;
constexpr uint32_t kBatch = 8;
constexpr uint32_t kBatchOpBytes = 4096;

std::atomic<int> g_passed{0};
std::atomic<int> g_failed{0};

void report(const char* check, const Status& st) {
  if (st.ok()) {
    ++g_passed;
    std::printf("PASS %s\n", check);
  } else {
    ++g_failed;
    std::printf("FAIL %s: %s\n", check, st.to_string().c_str());
  }
  std::fflush(stdout);
}

// A deterministic byte pattern that differs per seed and never repeats
// within a region, so that an offset error cannot pass a comparison.
void fill_pattern(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x >> 24);
  }
}

Status compare(const uint8_t* got, const uint8_t* want, size_t n, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      return make_error(Errc::kInternal, "%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, i,
                        n, got[i], want[i]);
    }
  }
  return ok_status();
}

// ---- RAII for every verbs / rdma_cm object --------------------------------
struct ChannelDeleter {
  void operator()(rdma_event_channel* c) const { rdma_destroy_event_channel(c); }
};
struct IdDeleter {
  void operator()(rdma_cm_id* id) const {
    if (id->qp != nullptr) rdma_destroy_qp(id);
    rdma_destroy_id(id);
  }
};
struct EventDeleter {
  void operator()(rdma_cm_event* e) const { rdma_ack_cm_event(e); }
};
struct PdDeleter {
  void operator()(ibv_pd* pd) const { ibv_dealloc_pd(pd); }
};
struct MrDeleter {
  void operator()(ibv_mr* mr) const { ibv_dereg_mr(mr); }
};
struct CqDeleter {
  void operator()(ibv_cq* cq) const { ibv_destroy_cq(cq); }
};
struct ContextDeleter {
  void operator()(ibv_context* c) const { ibv_close_device(c); }
};
struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using ChannelPtr = std::unique_ptr<rdma_event_channel, ChannelDeleter>;
using IdPtr = std::unique_ptr<rdma_cm_id, IdDeleter>;
using EventPtr = std::unique_ptr<rdma_cm_event, EventDeleter>;
using PdPtr = std::unique_ptr<ibv_pd, PdDeleter>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;
using CqPtr = std::unique_ptr<ibv_cq, CqDeleter>;
using ContextPtr = std::unique_ptr<ibv_context, ContextDeleter>;
using BufPtr = std::unique_ptr<uint8_t, FreeDeleter>;

Status errno_error(const char* what) {
  int e = errno;
  return make_error(Errc::kIo, "%s failed: %s (errno %d)", what, std::strerror(e), e);
}

Result<BufPtr> alloc_buffer(size_t n) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, n) != 0) {
    return make_error(Errc::kResourceExhausted, "cannot allocate a %zu-byte buffer", n);
  }
  std::memset(p, 0, n);
  return BufPtr(static_cast<uint8_t*>(p));
}

Result<ChannelPtr> make_channel() {
  ChannelPtr ch(rdma_create_event_channel());
  if (!ch) return errno_error("rdma_create_event_channel");
  // Non-blocking, so that every wait below has a deadline.
  int flags = fcntl(ch->fd, F_GETFL);
  if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return errno_error("fcntl(O_NONBLOCK) on the rdma_cm channel");
  }
  return ch;
}

// Waits up to timeout_ms for the next event on `ch`, which must be `want`.
Result<EventPtr> wait_event(rdma_event_channel* ch, rdma_cm_event_type want, int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    rdma_cm_event* raw = nullptr;
    if (rdma_get_cm_event(ch, &raw) == 0) {
      EventPtr ev(raw);
      if (ev->event != want) {
        return make_error(Errc::kProtocol, "expected rdma_cm event %s, got %s (status %d)",
                          rdma_event_str(want), rdma_event_str(ev->event), ev->status);
      }
      return ev;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_error("rdma_get_cm_event");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return make_error(Errc::kTimeout, "no rdma_cm event %s within %d ms", rdma_event_str(want),
                        timeout_ms);
    }
    pollfd pfd{ch->fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) < 0 && errno != EINTR) {
      return errno_error("poll on the rdma_cm channel");
    }
  }
}

// Busy-polls `cq` for exactly one completion, within kCqTimeoutMs.
Result<ibv_wc> poll_one(ibv_cq* cq) {
  auto deadline = Clock::now() + std::chrono::milliseconds(kCqTimeoutMs);
  for (uint32_t spins = 0;; ++spins) {
    ibv_wc wc{};
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) return make_error(Errc::kIo, "ibv_poll_cq returned %d", n);
    if (n == 1) return wc;
    if ((spins & 1023) == 0 && Clock::now() > deadline) {
      return make_error(Errc::kTimeout, "no completion within %d ms", kCqTimeoutMs);
    }
  }
}

// ---- device facts ----------------------------------------------------------
struct DeviceFacts {
  uint32_t max_qp_rd_atom = 0;
  uint32_t max_qp_init_rd_atom = 0;
};

Result<DeviceFacts> probe_device(const std::string& want_name) {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr || num == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    return make_error(Errc::kNotFound,
                      "no RDMA device (ibv_get_device_list found none); run this inside the "
                      "Soft-RoCE guest: tools/softroce/run.sh -- verbs_probe");
  }
  ibv_device* dev = nullptr;
  for (int i = 0; i < num; ++i) {
    if (want_name.empty() || want_name == ibv_get_device_name(list[i])) {
      dev = list[i];
      break;
    }
  }
  if (dev == nullptr) {
    ibv_free_device_list(list);
    return make_error(Errc::kNotFound, "no RDMA device named '%s' (ibv_devices lists them)",
                      want_name.c_str());
  }
  std::string name = ibv_get_device_name(dev);
  ContextPtr ctx(ibv_open_device(dev));
  ibv_free_device_list(list);
  if (!ctx) return errno_error("ibv_open_device");

  ibv_device_attr_ex ax{};
  if (int rc = ibv_query_device_ex(ctx.get(), nullptr, &ax); rc != 0) {
    errno = rc;
    return errno_error("ibv_query_device_ex");
  }
  const ibv_device_attr& a = ax.orig_attr;
  std::printf("fact: device=%s fw_ver=%s vendor_id=0x%x vendor_part_id=%u\n", name.c_str(),
              a.fw_ver, a.vendor_id, a.vendor_part_id);
  std::printf("fact: max_mr_size=%" PRIu64 " page_size_cap=0x%" PRIx64 " max_mr=%d max_pd=%d\n",
              a.max_mr_size, a.page_size_cap, a.max_mr, a.max_pd);
  std::printf("fact: max_qp=%d max_qp_wr=%d max_sge=%d max_sge_rd=%d max_cq=%d max_cqe=%d\n",
              a.max_qp, a.max_qp_wr, a.max_sge, a.max_sge_rd, a.max_cq, a.max_cqe);
  std::printf("fact: max_qp_rd_atom=%d max_qp_init_rd_atom=%d max_res_rd_atom=%d atomic_cap=%d\n",
              a.max_qp_rd_atom, a.max_qp_init_rd_atom, a.max_res_rd_atom, a.atomic_cap);
  std::printf(
      "fact: device_cap_flags=0x%x odp_general_caps=0x%" PRIx64 " odp_rc_caps=0x%x (ODP %s)\n",
      a.device_cap_flags, ax.odp_caps.general_caps, ax.odp_caps.per_transport_caps.rc_odp_caps,
      (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) ? "supported" : "absent");

  ibv_port_attr pa{};
  if (int rc = ibv_query_port(ctx.get(), 1, &pa); rc != 0) {
    errno = rc;
    return errno_error("ibv_query_port(1)");
  }
  std::printf("fact: port1 state=%s active_mtu=%d max_mtu=%d link_layer=%s gid_tbl_len=%d\n",
              ibv_port_state_str(pa.state), 128 << pa.active_mtu, 128 << pa.max_mtu,
              pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "ethernet" : "infiniband", pa.gid_tbl_len);
  for (int i = 0; i < std::min(pa.gid_tbl_len, 4); ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(ctx.get(), 1, i, &gid) != 0) break;
    char text[INET6_ADDRSTRLEN] = {};
    inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
    std::printf("fact: gid[%d]=%s\n", i, text);
  }
  std::fflush(stdout);
  return DeviceFacts{static_cast<uint32_t>(a.max_qp_rd_atom),
                     static_cast<uint32_t>(a.max_qp_init_rd_atom)};
}

// ---- the connection --------------------------------------------------------
// Server -> client, in the rdma_cm accept's private data, little-endian:
//
//   0          8          12         16
//   +----------+----------+----------+
//   | addr u64 | rkey u32 | len u32  |
//   +----------+----------+----------+
struct RegionInfo {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
};
static_assert(sizeof(RegionInfo) == 16);

// The objects of one side, destroyed in exact reverse order of creation:
// QP (with the id), CQ, MR, PD, id, channel.
struct Side {
  ChannelPtr channel;
  IdPtr listen_id;  // server only
  IdPtr id;
  PdPtr pd;
  BufPtr buf;
  MrPtr mr;
  CqPtr cq;

  ~Side() {
    if (id && id->qp != nullptr) rdma_destroy_qp(id.get());
    cq.reset();
    mr.reset();
    pd.reset();
    id.reset();
    listen_id.reset();
    channel.reset();
  }
};

Status make_qp(Side& s, size_t buf_len, int access, uint32_t send_wr) {
  s.pd.reset(ibv_alloc_pd(s.id->verbs));
  if (!s.pd) return errno_error("ibv_alloc_pd");
  auto buf = alloc_buffer(buf_len);
  if (!buf.ok()) return buf.status();
  s.buf = std::move(*buf);
  s.mr.reset(ibv_reg_mr(s.pd.get(), s.buf.get(), buf_len, access));
  if (!s.mr) return errno_error("ibv_reg_mr");
  s.cq.reset(ibv_create_cq(s.id->verbs, static_cast<int>(send_wr * 2), nullptr, nullptr, 0));
  if (!s.cq) return errno_error("ibv_create_cq");
  ibv_qp_init_attr qa{};
  qa.send_cq = s.cq.get();
  qa.recv_cq = s.cq.get();
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;  // selective signalling: each WR says whether it completes
  qa.cap.max_send_wr = send_wr;
  qa.cap.max_recv_wr = 1;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = 64;
  if (rdma_create_qp(s.id.get(), s.pd.get(), &qa) != 0) return errno_error("rdma_create_qp");
  std::printf("fact: qp granted max_send_wr=%u max_inline_data=%u (asked %u, 64)\n",
              qa.cap.max_send_wr, qa.cap.max_inline_data, send_wr);
  return ok_status();
}

struct Options {
  std::string device;
  std::string addr = "10.0.0.1";
  uint32_t size = 64 * 1024;
};

// Seeds of the two patterns: the server's initial bytes, the client's WRITE.
constexpr uint64_t kServerSeed = 1;
constexpr uint64_t kClientSeed = 2;

Status run_server(const Options& o, const DeviceFacts& facts, std::promise<Result<uint16_t>>& port,
                  std::atomic<bool>& wrote) {
  Side s;
  auto fail_port = [&](Status st) {
    port.set_value(st);
    return st;
  };
  auto ch = make_channel();
  if (!ch.ok()) return fail_port(ch.status());
  s.channel = std::move(*ch);
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(s.channel.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    return fail_port(errno_error("rdma_create_id (server)"));
  }
  s.listen_id.reset(raw);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  if (inet_pton(AF_INET, o.addr.c_str(), &sin.sin_addr) != 1) {
    return fail_port(
        make_error(Errc::kInvalidArgument, "--addr '%s' is not an IPv4 address", o.addr.c_str()));
  }
  if (rdma_bind_addr(s.listen_id.get(), reinterpret_cast<sockaddr*>(&sin)) != 0) {
    return fail_port(errno_error("rdma_bind_addr (is an rxe device on that address?)"));
  }
  if (rdma_listen(s.listen_id.get(), 4) != 0) return fail_port(errno_error("rdma_listen"));
  port.set_value(ntohs(rdma_get_src_port(s.listen_id.get())));

  auto req = wait_event(s.channel.get(), RDMA_CM_EVENT_CONNECT_REQUEST, kCmTimeoutMs);
  if (!req.ok()) return req.status().with_context("server");
  s.id.reset((*req)->id);
  // The event's conn params are already from the acceptor's point of view.
  rdma_conn_param want = (*req)->param.conn;
  req->reset();
  std::printf("fact: connect request asks responder_resources=%u initiator_depth=%u\n",
              want.responder_resources, want.initiator_depth);

  FARMEM_RETURN_IF_ERROR(make_qp(
      s, o.size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE, 4));
  fill_pattern(s.buf.get(), o.size, kServerSeed);

  RegionInfo info{reinterpret_cast<uint64_t>(s.buf.get()), s.mr->rkey, o.size};
  rdma_conn_param p{};
  p.private_data = &info;
  p.private_data_len = sizeof(info);
  p.responder_resources =
      static_cast<uint8_t>(std::min<uint32_t>(want.responder_resources, facts.max_qp_rd_atom));
  p.initiator_depth =
      static_cast<uint8_t>(std::min<uint32_t>(want.initiator_depth, facts.max_qp_init_rd_atom));
  p.rnr_retry_count = 7;
  if (rdma_accept(s.id.get(), &p) != 0) return errno_error("rdma_accept");
  auto est = wait_event(s.channel.get(), RDMA_CM_EVENT_ESTABLISHED, kCmTimeoutMs);
  if (!est.ok()) return est.status().with_context("server");
  est->reset();

  // The client moves bytes, then disconnects; only then look at memory.
  auto disc = wait_event(s.channel.get(), RDMA_CM_EVENT_DISCONNECTED, 4 * kCmTimeoutMs);
  if (!disc.ok()) return disc.status().with_context("server");
  disc->reset();
  if (!wrote.load()) return ok_status();  // the client failed before its WRITE

  // The client wrote its pattern over the second half; the first half is
  // untouched (the READs and the refused out-of-bounds READ wrote nothing).
  uint32_t half = o.size / 2;
  std::vector<uint8_t> want_bytes(o.size);
  fill_pattern(want_bytes.data(), o.size, kServerSeed);
  std::vector<uint8_t> client(o.size);
  fill_pattern(client.data(), o.size, kClientSeed);
  std::memcpy(want_bytes.data() + half, client.data() + half, o.size - half);
  return compare(s.buf.get(), want_bytes.data(), o.size, "server memory after the client's WRITE");
}

// Posts one signalled op and waits for its completion.
Result<ibv_wc> one_op(Side& s, ibv_wr_opcode opcode, void* local, uint32_t len, uint64_t raddr,
                      uint32_t rkey, uint64_t wr_id) {
  ibv_sge sge{reinterpret_cast<uint64_t>(local), len, s.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = opcode;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(s.id->qp, &wr, &bad); rc != 0) {
    errno = rc;
    return errno_error("ibv_post_send");
  }
  return poll_one(s.cq.get());
}

Status expect_ok(const Result<ibv_wc>& wc, uint64_t wr_id, const char* what) {
  if (!wc.ok()) return wc.status().with_context(what);
  if (wc->status != IBV_WC_SUCCESS) {
    return make_error(Errc::kIo, "%s completed with %s (vendor_err 0x%x)", what,
                      ibv_wc_status_str(wc->status), wc->vendor_err);
  }
  if (wc->wr_id != wr_id) {
    return make_error(Errc::kInternal, "%s: completion for wr_id %" PRIu64 ", expected %" PRIu64,
                      what, wc->wr_id, wr_id);
  }
  return ok_status();
}

void print_latency(Side& s, ibv_wr_opcode opcode, const char* name, const RegionInfo& r) {
  std::vector<double> us;
  us.reserve(kLatencyIters);
  for (int i = 0; i < kLatencyIters; ++i) {
    auto t0 = Clock::now();
    auto wc = one_op(s, opcode, s.buf.get(), 4096, r.addr, r.rkey, 1000 + i);
    if (!expect_ok(wc, 1000 + i, name).ok()) return;
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("fact: %s 4 KiB qd1 over %d ops: p50 %.1f us, p99 %.1f us (emulated: ratios only)\n",
              name, kLatencyIters, us[us.size() / 2], us[us.size() * 99 / 100]);
}

Status run_client(const Options& o, const DeviceFacts& facts, uint16_t port,
                  std::atomic<bool>& wrote) {
  Side s;
  auto ch = make_channel();
  if (!ch.ok()) return ch.status();
  s.channel = std::move(*ch);
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(s.channel.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    return errno_error("rdma_create_id (client)");
  }
  s.id.reset(raw);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  inet_pton(AF_INET, o.addr.c_str(), &dst.sin_addr);

  auto t0 = Clock::now();
  if (rdma_resolve_addr(s.id.get(), nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) != 0) {
    return errno_error("rdma_resolve_addr");
  }
  auto ev = wait_event(s.channel.get(), RDMA_CM_EVENT_ADDR_RESOLVED, kCmTimeoutMs);
  if (!ev.ok()) return ev.status().with_context("client");
  ev->reset();
  if (rdma_resolve_route(s.id.get(), 2000) != 0) return errno_error("rdma_resolve_route");
  ev = wait_event(s.channel.get(), RDMA_CM_EVENT_ROUTE_RESOLVED, kCmTimeoutMs);
  if (!ev.ok()) return ev.status().with_context("client");
  ev->reset();

  // Room for the batch plus the error test's two ops.
  FARMEM_RETURN_IF_ERROR(make_qp(s, o.size, IBV_ACCESS_LOCAL_WRITE, kBatch + 8));
  rdma_conn_param p{};
  // How many READs may be outstanding at once: sized from the device, as
  // the verbs transport will (never a teaching default of 1).
  p.initiator_depth = static_cast<uint8_t>(std::min<uint32_t>(facts.max_qp_init_rd_atom, 255));
  p.responder_resources = static_cast<uint8_t>(std::min<uint32_t>(facts.max_qp_rd_atom, 255));
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  if (rdma_connect(s.id.get(), &p) != 0) return errno_error("rdma_connect");
  ev = wait_event(s.channel.get(), RDMA_CM_EVENT_ESTABLISHED, kCmTimeoutMs);
  if (!ev.ok()) return ev.status().with_context("client");
  const rdma_conn_param& got = (*ev)->param.conn;
  if (got.private_data == nullptr || got.private_data_len < sizeof(RegionInfo)) {
    return make_error(Errc::kProtocol, "accept carried %u bytes of private data, expected %zu",
                      got.private_data_len, sizeof(RegionInfo));
  }
  std::printf("fact: accept private_data_len=%u (sent %zu); connect took %.1f ms\n",
              got.private_data_len, sizeof(RegionInfo),
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  RegionInfo r;
  std::memcpy(&r, got.private_data, sizeof(r));
  ev->reset();
  report("connect", ok_status());
  if (r.length != o.size) {
    return make_error(Errc::kProtocol, "server region is %u bytes, expected %u", r.length, o.size);
  }

  std::vector<uint8_t> server_bytes(o.size), client_bytes(o.size);
  fill_pattern(server_bytes.data(), o.size, kServerSeed);
  fill_pattern(client_bytes.data(), o.size, kClientSeed);
  uint8_t* local = s.buf.get();
  uint32_t half = o.size / 2;

  // read: the whole region, several MTUs in one op.
  Status st = expect_ok(one_op(s, IBV_WR_RDMA_READ, local, o.size, r.addr, r.rkey, 1), 1, "READ");
  if (st.ok()) st = compare(local, server_bytes.data(), o.size, "READ of the server region");
  report("read", st);

  // write: our pattern over the second half of the server region.
  std::memcpy(local + half, client_bytes.data() + half, o.size - half);
  st =
      expect_ok(one_op(s, IBV_WR_RDMA_WRITE, local + half, o.size - half, r.addr + half, r.rkey, 2),
                2, "WRITE");
  if (st.ok()) wrote.store(true);
  report("write", st);  // the server thread checks the bytes themselves

  // readback: a READ after the WRITE's completion sees the WRITE.
  std::memset(local, 0, o.size);
  st = expect_ok(one_op(s, IBV_WR_RDMA_READ, local, o.size - half, r.addr + half, r.rkey, 3), 3,
                 "READ after WRITE");
  if (st.ok()) st = compare(local, client_bytes.data() + half, o.size - half, "read-back");
  report("readback", st);

  // batch: one post of kBatch READs, only the last signalled.
  std::memset(local, 0, o.size);
  ibv_sge sges[kBatch];
  ibv_send_wr wrs[kBatch] = {};
  uint32_t stride = std::min<uint32_t>(kBatchOpBytes, o.size / kBatch);
  for (uint32_t i = 0; i < kBatch; ++i) {
    // Scattered: destination i takes remote block kBatch-1-i.
    uint32_t remote_off = (kBatch - 1 - i) * stride;
    sges[i] = {reinterpret_cast<uint64_t>(local + i * stride), stride, s.mr->lkey};
    wrs[i].wr_id = 100 + i;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].opcode = IBV_WR_RDMA_READ;
    wrs[i].send_flags = (i == kBatch - 1) ? IBV_SEND_SIGNALED : 0;
    wrs[i].wr.rdma.remote_addr = r.addr + remote_off;
    wrs[i].wr.rdma.rkey = r.rkey;
    wrs[i].next = (i + 1 < kBatch) ? &wrs[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(s.id->qp, wrs, &bad); rc != 0) {
    errno = rc;
    st = errno_error("ibv_post_send of the batch");
  } else {
    st = expect_ok(poll_one(s.cq.get()), 100 + kBatch - 1, "last READ of the batch");
    // The current region: server pattern in the first half, ours after.
    std::vector<uint8_t> now = server_bytes;
    std::memcpy(now.data() + half, client_bytes.data() + half, o.size - half);
    for (uint32_t i = 0; st.ok() && i < kBatch; ++i) {
      st = compare(local + i * stride, now.data() + (kBatch - 1 - i) * stride, stride,
                   "batched READ destination");
    }
    ibv_wc extra{};
    if (st.ok() && ibv_poll_cq(s.cq.get(), 1, &extra) != 0) {
      st = make_error(Errc::kInternal,
                      "an unsignalled READ produced a completion (wr_id %" PRIu64 ")", extra.wr_id);
    }
  }
  report("batch", st);

  print_latency(s, IBV_WR_RDMA_READ, "READ", r);
  print_latency(s, IBV_WR_RDMA_WRITE, "WRITE", r);
  // The latency WRITEs put our first 4 KiB over the server's first block;
  // put the server's bytes back so that the server's final check holds.
  std::memcpy(local, server_bytes.data(), 4096);
  st = expect_ok(one_op(s, IBV_WR_RDMA_WRITE, local, 4096, r.addr, r.rkey, 4), 4, "restore WRITE");
  if (!st.ok()) report("restore", st);

  // bounds: 4 KiB starting 2 KiB before the end of the remote MR. The
  // responder refuses it; the QP goes to the error state.
  std::memset(local, 0xAB, 4096);
  auto wc = one_op(s, IBV_WR_RDMA_READ, local, 4096, r.addr + o.size - 2048, r.rkey, 5);
  if (!wc.ok()) {
    st = wc.status().with_context("out-of-bounds READ");
  } else {
    std::printf("fact: out-of-bounds READ completed with %s (vendor_err 0x%x)\n",
                ibv_wc_status_str(wc->status), wc->vendor_err);
    st = wc->status == IBV_WC_REM_ACCESS_ERR
             ? ok_status()
             : make_error(Errc::kInternal, "out-of-bounds READ completed with %s, expected %s",
                          ibv_wc_status_str(wc->status), ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
    for (size_t i = 0; st.ok() && i < 4096; ++i) {
      if (local[i] != 0xAB)
        st = make_error(Errc::kInternal, "refused READ wrote local byte %zu", i);
    }
  }
  if (st.ok()) {
    // The QP is in the error state now: what does the next op do?
    ibv_sge sge{reinterpret_cast<uint64_t>(local), 64, s.mr->lkey};
    ibv_send_wr w{};
    w.wr_id = 6;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_READ;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = r.addr;
    w.wr.rdma.rkey = r.rkey;
    if (int rc = ibv_post_send(s.id->qp, &w, &bad); rc != 0) {
      std::printf("fact: post on a QP in error state refused: %s\n", std::strerror(rc));
    } else {
      auto flushed = poll_one(s.cq.get());
      if (!flushed.ok()) {
        st = flushed.status().with_context("op after the error");
      } else {
        std::printf("fact: op posted after the error completed with %s\n",
                    ibv_wc_status_str(flushed->status));
        if (flushed->status != IBV_WC_WR_FLUSH_ERR) {
          st = make_error(Errc::kInternal, "op on a broken QP completed with %s, expected %s",
                          ibv_wc_status_str(flushed->status),
                          ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR));
        }
      }
    }
  }
  report("bounds", st);

  if (rdma_disconnect(s.id.get()) != 0) return errno_error("rdma_disconnect");
  ev = wait_event(s.channel.get(), RDMA_CM_EVENT_DISCONNECTED, kCmTimeoutMs);
  if (!ev.ok()) return ev.status().with_context("client");
  return ok_status();
}

int probe_main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--device" || a == "--addr" || a == "--size") && i + 1 < argc) {
      std::string v = argv[++i];
      if (a == "--device") o.device = v;
      if (a == "--addr") o.addr = v;
      if (a == "--size") o.size = static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 0));
    } else {
      std::fprintf(stderr, "usage: verbs_probe [--device NAME] [--addr IPV4] [--size BYTES]\n");
      return 2;
    }
  }
  if (o.size < 2 * 4096 * kBatch / 4 || o.size % 4096 != 0) {
    std::fprintf(stderr, "verbs_probe: --size must be a multiple of 4096 and at least 16384\n");
    return 2;
  }

  auto facts = probe_device(o.device);
  if (!facts.ok()) {
    if (facts.status().code() == Errc::kNotFound) {
      std::printf("SKIP: %s\n", facts.status().to_string().c_str());
      return 77;
    }
    report("device", facts.status());
    return 1;
  }
  report("device", ok_status());

  std::promise<Result<uint16_t>> port;
  auto port_future = port.get_future();
  std::atomic<bool> wrote{false};
  Status server_status;
  std::thread server([&] { server_status = run_server(o, *facts, port, wrote); });
  Result<uint16_t> p = port_future.get();
  Status client_status = p.ok() ? run_client(o, *facts, *p, wrote) : p.status();
  server.join();
  if (!client_status.ok()) report("client", client_status);
  // The server's final look at its own memory proves the WRITE landed.
  report("server", server_status);

  std::printf("verbs_probe: %d passed, %d failed\n", g_passed.load(), g_failed.load());
  return g_failed.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace farmem

int main(int argc, char** argv) {
  return farmem::probe_main(argc, argv);
}
