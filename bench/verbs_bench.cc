// verbs_bench: our verbs transport's READ/WRITE latency (queue depth 1,
// p50/p99) and bandwidth at queue depths 1, 8 and 32, against an
// in-process farmemd serving verbs. Runs in the Soft-RoCE guest next to
// perftest (tools/softroce/verbs_tests.sh compares them); emulated figures
// mean something only as a ratio to perftest's in the same run.
//
//   verbs_bench [--addr 10.0.0.1] [--size 4096] [--footprint 16777216]
//               [--lat-iters 1000] [--bw-ops 4000] [--qd 1,8,32]
//               [--only read_lat,write_lat,read_bw,write_bw,wait_lat]
//
// Like perftest: one QP, ops of --size bytes, the latency loop busy-polls
// (poll(), never sleeps), a bandwidth run keeps --qd ops in flight and
// times first post to last completion. --footprint is how many bytes the
// ops walk through on both sides (local buffer and remote slab): perftest's
// ib_*_bw and ib_read_lat reuse ONE buffer of --size bytes (its cycle
// buffer is a page), so pass --footprint SIZE to compare like with like;
// the 16 MiB default touches fresh pages the way the pager does.
// wait_lat (not in the default set) is the READ latency through wait(),
// the path the pager takes: it spins, then sleeps on the CQ channel.
//
// Output: one "RESULT <name> <value>" line per figure, e.g.
//   RESULT read_lat_min_us 52.0          (also _p50_us, _p99_us)
//   RESULT read_lat_p50_us 61.2
//   RESULT read_bw_qd8_MBps 180.4        (MB = 2^20 bytes, as perftest)
// Exit: 0 done; 1 an op failed; 2 bad usage; 77 no RDMA device reaches --addr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/verbs_transport.h"

namespace farmem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSlab = 16u << 20;
constexpr ServerId kServer = 1;

struct Bench {
  std::unique_ptr<DonorServer> server;
  std::unique_ptr<DonorSession> session;
  std::unique_ptr<VerbsTransport> transport;
  std::unique_ptr<VerbsTransport::Queue> q;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kSlab);
  SlabDesc slab;
  uint32_t len = 4096;
  uint64_t footprint = kSlab;  // a multiple of len, <= kSlab

  // The i-th op's offset, on both sides.
  uint64_t offset(uint64_t i) const { return (i * len) % footprint; }
};

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// One op at a time: per-op latency in microseconds, completions reaped
// with busy poll() (as perftest) or with wait() (as the pager).
bool latency(Bench& b, IoKind kind, int iters, const char* name, bool use_wait = false) {
  // As perftest's ib_read_lat: a timestamp before each post, and an op's
  // latency is the time to the next op's post (the loop's own work
  // included); the last op ends at its completion.
  std::vector<Clock::time_point> ts;
  ts.reserve(size_t(iters) + 1);
  IoCompletion c[1];
  for (int i = 0; i < iters; ++i) {
    const uint64_t off = b.offset(uint64_t(i));
    IoOp op{kind, b.len, {kServer, b.slab.slab, off}, b.buf.data() + off, uint64_t(i)};
    ts.push_back(Clock::now());
    if (b.q->post({&op, 1}) != Errc::kOk) return false;
    size_t n = 0;
    while (n == 0) n = use_wait ? b.q->wait(c, 1000) : b.q->poll(c);
    if (c[0].status != Errc::kOk) {
      std::fprintf(stderr, "verbs_bench: %s op failed: %s\n", name, errc_name(c[0].status));
      return false;
    }
  }
  ts.push_back(Clock::now());
  std::vector<double> us(static_cast<size_t>(iters));
  for (size_t i = 0; i < us.size(); ++i)
    us[i] = std::chrono::duration<double, std::micro>(ts[i + 1] - ts[i]).count();
  std::sort(us.begin(), us.end());
  // min: host load only ever adds time, so the minimum is the figure least
  // moved by a busy host (perftest's t_min beside it).
  std::printf("RESULT %s_lat_min_us %.2f\n", name, us.front());
  std::printf("RESULT %s_lat_p50_us %.2f\n", name, us[us.size() / 2]);
  std::printf("RESULT %s_lat_p99_us %.2f\n", name, us[us.size() * 99 / 100]);
  return true;
}

// `qd` ops kept in flight; posts refill in batches as completions arrive.
bool bandwidth(Bench& b, IoKind kind, size_t qd, int total, const char* name) {
  std::vector<IoOp> ops(qd);
  IoCompletion c[64];
  int posted = 0, done = 0;
  const auto t0 = Clock::now();
  auto refill = [&](size_t n) {
    for (size_t k = 0; k < n; ++k) {
      const uint64_t off = b.offset(uint64_t(posted));
      ops[k] = IoOp{kind, b.len, {kServer, b.slab.slab, off}, b.buf.data() + off, uint64_t(posted)};
      ++posted;
    }
    return b.q->post(std::span(ops.data(), n)) == Errc::kOk;
  };
  if (!refill(std::min<size_t>(qd, total))) return false;
  while (done < total) {
    const size_t n = b.q->poll(c);
    for (size_t k = 0; k < n; ++k)
      if (c[k].status != Errc::kOk) {
        std::fprintf(stderr, "verbs_bench: %s op failed: %s\n", name, errc_name(c[k].status));
        return false;
      }
    done += static_cast<int>(n);
    const size_t more = std::min<size_t>(n, static_cast<size_t>(total - posted));
    if (more > 0 && !refill(more)) return false;
  }
  const double s = us_since(t0) / 1e6;
  std::printf("RESULT %s_bw_qd%zu_MBps %.2f\n", name, qd,
              double(total) * b.len / double(1 << 20) / s);
  return true;
}

// "1,8,32" -> {1, 8, 32}; false on anything but positive integers.
bool parse_list(const std::string& s, std::vector<size_t>* out) {
  out->clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const unsigned long v = std::strtoul(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v == 0) return false;
    out->push_back(v);
    pos = comma + 1;
  }
  return !out->empty();
}

int usage(const char* why) {
  std::fprintf(stderr,
               "verbs_bench: %s\nusage: verbs_bench [--addr IP] [--size BYTES] [--footprint BYTES] "
               "[--lat-iters N] [--bw-ops N] [--qd 1,8,32] "
               "[--only read_lat,write_lat,read_bw,write_bw,wait_lat]\n",
               why);
  return 2;
}

int bench_main(int argc, char** argv) {
  std::string addr = "10.0.0.1";
  std::string only = "read_lat,write_lat,read_bw,write_bw";
  int lat_iters = 1000, bw_ops = 4000;
  uint64_t size = 4096, footprint = kSlab;
  std::vector<size_t> qds = {1, 8, 32};
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("option " + a + " needs a value").c_str());
    const char* v = argv[i + 1];
    if (a == "--addr") {
      addr = v;
    } else if (a == "--lat-iters") {
      lat_iters = std::atoi(v);
    } else if (a == "--bw-ops") {
      bw_ops = std::atoi(v);
    } else if (a == "--size") {
      size = std::strtoull(v, nullptr, 10);
    } else if (a == "--footprint") {
      footprint = std::strtoull(v, nullptr, 10);
    } else if (a == "--qd") {
      if (!parse_list(v, &qds)) return usage("--qd needs positive depths such as 1,8,32");
    } else if (a == "--only") {
      only = v;
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }
  if (lat_iters < 100 || bw_ops < 100) return usage("--lat-iters and --bw-ops must be >= 100");
  if (size == 0 || size > wire::kMaxIoLength || size > kSlab)
    return usage("--size must be between 1 and the transport's largest op (wire::kMaxIoLength)");
  if (footprint < size || footprint > kSlab)
    return usage("--footprint must be at least --size and at most 16 MiB (the slab)");
  footprint -= footprint % size;
  // --only: a comma-separated subset of these names.
  static constexpr const char* kFigures[] = {"read_lat", "write_lat", "read_bw", "write_bw",
                                             "wait_lat"};
  std::vector<std::string> figures;
  for (size_t pos = 0; pos <= only.size();) {
    const size_t comma = std::min(only.find(',', pos), only.size());
    figures.push_back(only.substr(pos, comma - pos));
    pos = comma + 1;
  }
  for (const std::string& f : figures)
    if (std::find(std::begin(kFigures), std::end(kFigures), f) == std::end(kFigures))
      return usage(
          ("--only: unknown figure '" + f + "' (read_lat, write_lat, read_bw, write_bw, wait_lat)")
              .c_str());
  auto want = [&](const char* name) {
    return std::find(figures.begin(), figures.end(), name) != figures.end();
  };
  std::string why;
  if (!verbs::reachable(addr, &why)) {
    std::printf("SKIP: no RDMA device reaches %s: %s\n", addr.c_str(), why.c_str());
    return 77;
  }
  Bench b;
  b.len = static_cast<uint32_t>(size);
  b.footprint = footprint;
  DonorOptions o;
  o.listen = {addr, 0};
  o.capacity = kSlab;
  o.slab_size = kSlab;
  o.token = "verbs-bench";
  o.try_hugepages = false;
  o.transport = DonorTransportMode::kVerbs;
  auto srv = DonorServer::start(o);
  if (!srv.ok()) return std::fprintf(stderr, "%s\n", srv.status().to_string().c_str()), 1;
  b.server = std::move(*srv);
  DonorClientOptions c;
  c.server = {addr, b.server->port()};
  c.token = o.token;
  auto s = DonorSession::connect(c);
  if (!s.ok()) return std::fprintf(stderr, "%s\n", s.status().to_string().c_str()), 1;
  b.session = std::move(*s);
  auto t = VerbsTransport::create();
  if (!t.ok()) return std::fprintf(stderr, "%s\n", t.status().to_string().c_str()), 1;
  b.transport = std::move(*t);
  auto l = b.session->lease(kSlab);
  Status st = b.transport->add_server(kServer, b.session.get());
  if (st.ok() && l.ok()) st = b.transport->add_slab(kServer, (*l)[0]);
  if (st.ok()) st = b.transport->register_buffer(b.buf.data(), b.buf.size());
  if (!st.ok() || !l.ok())
    return std::fprintf(stderr, "set-up: %s %s\n", st.to_string().c_str(),
                        l.status().to_string().c_str()),
           1;
  b.slab = (*l)[0];
  auto q = b.transport->open_queue();
  if (!q.ok()) return std::fprintf(stderr, "%s\n", q.status().to_string().c_str()), 1;
  b.q = std::move(*q);
  // Warm-up, not reported: connects the QP (the first post blocks for the
  // rdma_cm handshake). Both buffers are registered, hence already present.
  {
    for (uint64_t i = 0; i < 100; ++i) {
      const uint64_t off = b.offset(i);
      IoOp op{IoKind::kWrite, b.len, {kServer, b.slab.slab, off}, b.buf.data() + off, i};
      IoCompletion done[1];
      if (b.q->post({&op, 1}) != Errc::kOk) return 1;
      while (b.q->wait(done, 1000) == 0) {
      }
      if (done[0].status != Errc::kOk)
        return std::fprintf(stderr, "verbs_bench: warm-up write failed: %s\n",
                            errc_name(done[0].status)),
               1;
    }
  }
  bool ok = true;
  if (want("read_lat")) ok = ok && latency(b, IoKind::kRead, lat_iters, "read");
  if (want("write_lat")) ok = ok && latency(b, IoKind::kWrite, lat_iters, "write");
  if (want("wait_lat")) ok = ok && latency(b, IoKind::kRead, lat_iters, "wait_read", true);
  for (size_t qd : qds) {
    if (qd > b.q->depth()) return usage("a --qd is deeper than the transport's queue");
    if (want("read_bw")) ok = ok && bandwidth(b, IoKind::kRead, qd, bw_ops, "read");
    if (want("write_bw")) ok = ok && bandwidth(b, IoKind::kWrite, qd, bw_ops, "write");
  }
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace farmem

int main(int argc, char** argv) {
  return farmem::bench_main(argc, argv);
}
