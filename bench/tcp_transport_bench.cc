// The tcp Transport on loopback against the limit of this machine: a bare
// TCP request/response of the same size.
//
//   ./bench/farmem_bench_tcp_transport                       # everything
//   ./bench/farmem_bench_tcp_transport --benchmark_filter=qd:8
//
// What runs (all in this process, on 127.0.0.1):
//  * read4k/tcp_transport: 4 KiB READs through TcpTransport from an
//    in-process DonorServer, keeping `qd` READs in flight per connection.
//  * read4k/bare_tcp: a plain socket to a tiny server thread that answers
//    each 16-byte request with 4 KiB, also `qd` in flight per connection.
//  * write4k/tcp_transport: 4 KiB WRITEs at qd 8.
// `conns:N` runs N benchmark threads, each with its own connection (its own
// TcpTransport queue, or its own socket), i.e. 2 connections are driven by 2
// threads. Counters: items_per_second = ops/s and bytes_per_second summed
// over the connections; p50_us / p99_us = latency of one op from its post
// to its reaping, averaged over the threads; ops_per_wake = replies
// collected per blocking wait()/recv(). Both clients work the same way:
// reap what has arrived, repost that many in one call, block for more.
#include <benchmark/benchmark.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/donor_client.h"
#include "runtime/donor_server.h"
#include "runtime/log.h"
#include "runtime/net.h"
#include "runtime/tcp_transport.h"

namespace farmem {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kIoSize = 4096;
constexpr uint32_t kRequestSize = 16;
constexpr uint64_t kSlabSize = 4u << 20;
constexpr size_t kMaxDepth = 32;

// The bare baseline: answers every 16-byte request with kIoSize bytes,
// gathering the replies to all complete requests read at once into one
// sendmsg (as a good server would).
class EchoServer {
 public:
  EchoServer() {
    auto l = tcp_listen({"127.0.0.1", 0});
    if (!l.ok()) fatal("echo server: %s", l.status().to_string().c_str());
    listener_ = std::move(*l);
    port_ = local_port(listener_.get());
    reply_.assign(kIoSize, 0x42);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~EchoServer() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    accept_thread_.join();
    std::lock_guard lk(mu_);
    for (auto& t : conn_threads_) t.join();
  }
  uint16_t port() const { return port_; }

 private:
  void accept_loop() {
    for (;;) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::lock_guard lk(mu_);
      conn_threads_.emplace_back([this, fd] { serve(Fd(fd)); });
    }
  }
  void serve(Fd fd) {
    uint8_t in[kRequestSize * 64];
    size_t have = 0;
    iovec iov[64];
    for (;;) {
      ssize_t n = ::recv(fd.get(), in + have, sizeof in - have, 0);
      if (n <= 0) return;
      have += static_cast<size_t>(n);
      const size_t k = have / kRequestSize;
      for (size_t i = 0; i < k; ++i) iov[i] = iovec{reply_.data(), reply_.size()};
      if (k > 0 && sendv_all(fd.get(), iov, static_cast<int>(k)) != Errc::kOk) return;
      std::memmove(in, in + k * kRequestSize, have - k * kRequestSize);
      have -= k * kRequestSize;
    }
  }

  Fd listener_;
  uint16_t port_ = 0;
  std::vector<uint8_t> reply_;
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> conn_threads_;
};

// One donor, one session, one transport for the whole run; each benchmark
// thread opens its own queue (its own data connection).
struct Env {
  std::unique_ptr<DonorServer> server;
  std::unique_ptr<DonorSession> session;
  std::unique_ptr<TcpTransport> transport;
  std::vector<SlabDesc> slabs;
  EchoServer echo;

  Env() {
    DonorOptions o;
    o.listen = {"127.0.0.1", 0};
    o.capacity = 2 * kSlabSize;
    o.slab_size = kSlabSize;
    o.token = "bench-token";
    o.try_hugepages = false;
    auto srv = DonorServer::start(o);
    if (!srv.ok()) fatal("donor: %s", srv.status().to_string().c_str());
    server = std::move(*srv);
    DonorClientOptions c;
    c.server = {"127.0.0.1", server->port()};
    c.token = o.token;
    auto s = DonorSession::connect(c);
    if (!s.ok()) fatal("session: %s", s.status().to_string().c_str());
    session = std::move(*s);
    transport = std::make_unique<TcpTransport>(TcpTransportOptions{.depth = kMaxDepth});
    if (!transport->add_server(0, session.get()).ok()) fatal("add_server");
    auto l = session->lease(2 * kSlabSize);
    if (!l.ok()) fatal("lease: %s", l.status().to_string().c_str());
    slabs = *l;
    for (auto& d : slabs)
      if (!transport->add_slab(0, d).ok()) fatal("add_slab");
  }
  ~Env() {
    transport.reset();
    session.reset();
    server.reset();
  }
};

Env& env() {
  static Env e;
  return e;
}

// Latency samples of one thread -> p50 / p99 counters.
void report(benchmark::State& state, std::vector<uint64_t>& lat_ns, uint64_t wakeups) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  // How many replies one blocking call brought back on average.
  if (wakeups > 0)
    state.counters["ops_per_wake"] =
        benchmark::Counter(static_cast<double>(state.iterations()) / static_cast<double>(wakeups),
                           benchmark::Counter::kAvgThreads);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kIoSize);
  if (lat_ns.empty()) return;
  std::sort(lat_ns.begin(), lat_ns.end());
  auto pct = [&](double p) {
    return static_cast<double>(lat_ns[static_cast<size_t>(p * (lat_ns.size() - 1))]) / 1000.0;
  };
  state.counters["p50_us"] = benchmark::Counter(pct(0.50), benchmark::Counter::kAvgThreads);
  state.counters["p99_us"] = benchmark::Counter(pct(0.99), benchmark::Counter::kAvgThreads);
}

void bm_transport(benchmark::State& state, IoKind kind, size_t qd) {
  Env& e = env();
  const int t = state.thread_index();
  std::vector<uint8_t> buf(qd * kIoSize, static_cast<uint8_t>(t + 1));
  if (!e.transport->register_buffer(buf.data(), buf.size()).ok()) fatal("register_buffer");
  auto qr = e.transport->open_queue();
  if (!qr.ok()) fatal("open_queue: %s", qr.status().to_string().c_str());
  auto q = std::move(qr).value();

  // Thread t works in its own slab.
  std::vector<IoOp> ops(qd);
  for (size_t i = 0; i < qd; ++i)
    ops[i] = IoOp{kind,
                  kIoSize,
                  {0, e.slabs[t % e.slabs.size()].slab, i * kIoSize},
                  buf.data() + i * kIoSize,
                  i};
  std::vector<Clock::time_point> posted(qd, Clock::now());
  std::vector<IoOp> repost;
  repost.reserve(qd);
  std::vector<uint64_t> lat;
  lat.reserve(1 << 20);
  if (q->post(ops) != Errc::kOk) fatal("post");

  IoCompletion comp[kMaxDepth];
  size_t nc = 0, ci = 0;
  uint64_t wakeups = 0;
  Clock::time_point reaped;
  for (auto _ : state) {
    if (ci == nc) {
      if (!repost.empty()) {
        const auto now = Clock::now();
        for (const IoOp& o : repost) posted[o.cookie] = now;
        if (q->post(repost) != Errc::kOk) fatal("post");
        repost.clear();
      }
      nc = q->wait(comp, 5000);
      ++wakeups;
      ci = 0;
      reaped = Clock::now();
      if (nc == 0) {
        state.SkipWithError("no completion within 5 s");
        break;
      }
    }
    const IoCompletion& c = comp[ci++];
    if (c.status != Errc::kOk) {
      state.SkipWithError(errc_name(c.status));
      break;
    }
    lat.push_back(static_cast<uint64_t>((reaped - posted[c.cookie]).count()));
    repost.push_back(ops[c.cookie]);
  }
  while (q->outstanding() > 0)
    if (q->wait(comp, 5000) == 0) fatal("drain timed out");
  q.reset();
  (void)e.transport->unregister_buffer(buf.data());
  report(state, lat, wakeups);
}

void bm_bare(benchmark::State& state, size_t qd) {
  Env& e = env();
  auto fd = tcp_connect({"127.0.0.1", e.echo.port()});
  if (!fd.ok()) fatal("connect: %s", fd.status().to_string().c_str());
  std::vector<uint8_t> req(qd * kRequestSize, 0);
  std::vector<uint8_t> rx(kMaxDepth * kIoSize + kIoSize);
  size_t rx_have = 0;  // bytes of a partly received reply
  // Replies come back in request order: a FIFO of post times.
  std::vector<Clock::time_point> posted(qd, Clock::now());
  size_t head = 0, tail = qd;
  std::vector<uint64_t> lat;
  lat.reserve(1 << 20);
  if (send_all(fd->get(), req.data(), req.size()) != Errc::kOk) fatal("send");

  size_t ready = 0, resend = 0;
  uint64_t wakeups = 0;
  Clock::time_point reaped;
  for (auto _ : state) {
    if (ready == 0) {
      if (resend > 0) {
        const auto now = Clock::now();
        for (size_t i = 0; i < resend; ++i) posted[tail++ % qd] = now;
        if (send_all(fd->get(), req.data(), resend * kRequestSize) != Errc::kOk) fatal("send");
        resend = 0;
      }
      while (ready == 0) {
        ++wakeups;
        ssize_t n = ::recv(fd->get(), rx.data() + rx_have, rx.size() - rx_have, 0);
        if (n <= 0) fatal("recv from the echo server failed");
        rx_have += static_cast<size_t>(n);
        ready = rx_have / kIoSize;
        rx_have %= kIoSize;  // the partial reply's bytes need not be kept
      }
      reaped = Clock::now();
    }
    --ready;
    lat.push_back(static_cast<uint64_t>((reaped - posted[head++ % qd]).count()));
    ++resend;
  }
  // Drain the replies still in flight so that the server's thread ends
  // cleanly when the socket closes.
  size_t left = (tail - head) * kIoSize - ready * kIoSize - rx_have;
  while (left > 0) {
    ssize_t n = ::recv(fd->get(), rx.data(), std::min(left, rx.size()), 0);
    if (n <= 0) break;
    left -= static_cast<size_t>(n);
  }
  report(state, lat, wakeups);
}

void register_all() {
  for (int conns : {1, 2}) {
    for (size_t qd : {size_t{1}, size_t{8}, size_t{32}}) {
      const std::string suffix = "/qd:" + std::to_string(qd) + "/conns:" + std::to_string(conns);
      benchmark::RegisterBenchmark(("read4k/tcp_transport" + suffix).c_str(), bm_transport,
                                   IoKind::kRead, qd)
          ->Threads(conns)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("read4k/bare_tcp" + suffix).c_str(), bm_bare, qd)
          ->Threads(conns)
          ->UseRealTime();
    }
  }
  benchmark::RegisterBenchmark("write4k/tcp_transport/qd:8/conns:1", bm_transport, IoKind::kWrite,
                               size_t{8})
      ->Threads(1)
      ->UseRealTime();
}

}  // namespace
}  // namespace farmem

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  farmem::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
