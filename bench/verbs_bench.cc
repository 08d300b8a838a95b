// verbs_bench: our verbs transport's 4 KiB READ/WRITE latency (queue depth
// 1, p50/p99) and bandwidth at queue depths 1, 8 and 32, against an
// in-process farmemd serving verbs. Runs in the Soft-RoCE guest next to
// perftest (tools/softroce/verbs_tests.sh compares them); emulated figures
// mean something only as a ratio to perftest's in the same run.
//
//   verbs_bench [--addr 10.0.0.1] [--lat-iters 1000] [--bw-ops 4000]
//
// Output: one "RESULT <name> <value>" line per figure, e.g.
//   RESULT read_lat_p50_us 61.2
//   RESULT read_bw_qd8_MBps 180.4        (MB = 2^20 bytes, as perftest)
// Exit: 0 done; 1 an op failed; 77 no RDMA device reaches --addr.
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
constexpr uint32_t kLen = 4096;
constexpr uint64_t kSlab = 16u << 20;
constexpr ServerId kServer = 1;

struct Bench {
  std::unique_ptr<DonorServer> server;
  std::unique_ptr<DonorSession> session;
  std::unique_ptr<VerbsTransport> transport;
  std::unique_ptr<VerbsTransport::Queue> q;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kSlab);
  SlabDesc slab;
};

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// One op at a time: per-op latency in microseconds.
bool latency(Bench& b, IoKind kind, int iters, const char* name) {
  std::vector<double> us;
  us.reserve(iters);
  IoCompletion c[1];
  for (int i = 0; i < iters; ++i) {
    const uint64_t off = (uint64_t(i) * kLen) % kSlab;
    IoOp op{kind, kLen, {kServer, b.slab.slab, off}, b.buf.data() + off, uint64_t(i)};
    const auto t0 = Clock::now();
    if (b.q->post({&op, 1}) != Errc::kOk) return false;
    size_t n = 0;
    while (n == 0) n = b.q->poll(c);  // busy: what a latency benchmark measures
    us.push_back(us_since(t0));
    if (c[0].status != Errc::kOk) {
      std::fprintf(stderr, "verbs_bench: %s op failed: %s\n", name, errc_name(c[0].status));
      return false;
    }
  }
  std::sort(us.begin(), us.end());
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
      const uint64_t off = (uint64_t(posted) * kLen) % kSlab;
      ops[k] = IoOp{kind, kLen, {kServer, b.slab.slab, off}, b.buf.data() + off, uint64_t(posted)};
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
              double(total) * kLen / double(1 << 20) / s);
  return true;
}

int bench_main(int argc, char** argv) {
  std::string addr = "10.0.0.1";
  int lat_iters = 1000, bw_ops = 4000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--addr")
      addr = argv[i + 1];
    else if (a == "--lat-iters")
      lat_iters = std::atoi(argv[i + 1]);
    else if (a == "--bw-ops")
      bw_ops = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: verbs_bench [--addr IP] [--lat-iters N] [--bw-ops N]\n");
      return 2;
    }
  }
  if (lat_iters < 100 || bw_ops < 100) {
    std::fprintf(stderr, "verbs_bench: --lat-iters and --bw-ops must be at least 100\n");
    return 2;
  }
  std::string why;
  if (!verbs::reachable(addr, &why)) {
    std::printf("SKIP: no RDMA device reaches %s: %s\n", addr.c_str(), why.c_str());
    return 77;
  }
  Bench b;
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
  // Warm-up: connect the QP, touch the pages.
  if (!latency(b, IoKind::kWrite, 100, "warmup")) return 1;
  bool ok = latency(b, IoKind::kRead, lat_iters, "read") &&
            latency(b, IoKind::kWrite, lat_iters, "write");
  for (size_t qd : {size_t{1}, size_t{8}, size_t{32}}) {
    ok = ok && bandwidth(b, IoKind::kRead, qd, bw_ops, "read") &&
         bandwidth(b, IoKind::kWrite, qd, bw_ops, "write");
  }
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace farmem

int main(int argc, char** argv) {
  return farmem::bench_main(argc, argv);
}
