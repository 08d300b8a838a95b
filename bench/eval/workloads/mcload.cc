// Load generator for memcached (text protocol over TCP on 127.0.0.1).
//
//   farmem_eval_mcload --port 11211 --keys 200000 --ops 400000
//       [--value-size 1000] [--conns 2] [--reads 90] [--theta 0.99] [--seed 1]
//
// Phase 1 (untimed) stores every key once, pipelined with `noreply`, then
// waits on a `version` round trip. Phase 2 (timed) runs --ops requests,
// --reads percent gets and the rest sets, keys drawn zipfian (theta 0.99)
// and scattered by a permutation; each connection has one request in
// flight, and every request is timed for the p99.
//
// The checksum must not depend on how the connections interleave: each
// connection owns the keys with index % conns == its number and only ever
// touches those, so what it reads depends only on its own sequence. The
// per-connection hashes are combined in connection order. A get that
// misses (memcached evicted the key: its -m is too small) counts as a miss
// and changes the checksum, so the harness fails such a cell.
//
// Output: runtime_s, throughput (ops/s), p50_us, p99_us, misses, checksum,
// ws_bytes (keys * value size: the data alone, memcached's overhead aside).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <thread>

#include "common.h"

namespace {

struct Conn {
  int fd = -1;
  std::string in;  // received, not yet consumed
  size_t pos = 0;

  void send_all(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) eval::die("send to memcached failed (did it exit?)");
      off += static_cast<size_t>(n);
    }
  }
  void fill() {
    if (pos > 0 && pos == in.size()) {
      in.clear();
      pos = 0;
    }
    char buf[65536];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) eval::die("memcached closed the connection or recv failed");
    in.append(buf, static_cast<size_t>(n));
  }
  std::string line() {
    for (;;) {
      size_t e = in.find("\r\n", pos);
      if (e != std::string::npos) {
        std::string l = in.substr(pos, e - pos);
        pos = e + 2;
        return l;
      }
      fill();
    }
  }
  std::string_view bytes(size_t n) {  // n bytes then "\r\n"
    while (in.size() - pos < n + 2) fill();
    std::string_view v(in.data() + pos, n);
    pos += n + 2;
    return v;
  }
};

std::string key_name(uint64_t idx) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "key:%010llu", static_cast<unsigned long long>(idx));
  return buf;
}

void make_value(std::string& v, uint64_t idx, uint64_t version, size_t size) {
  v.resize(size);
  uint64_t x = 0;
  for (size_t i = 0; i < size; ++i) {
    if (i % 8 == 0) x = eval::mix64(idx * 0x10001 + version * 0x9E37 + i);
    v[i] = static_cast<char>('a' + (x & 0xff) % 26);
    x >>= 8;
  }
}

struct ThreadResult {
  eval::LatHist lat;
  uint64_t hash = 0, misses = 0, ops = 0;
};

int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    std::fprintf(stderr, "eval mcload: cannot connect to 127.0.0.1:%u: %s\n", port,
                 std::strerror(errno));
    std::exit(2);
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  eval::Args args(argc, argv);
  const uint16_t port = static_cast<uint16_t>(args.u64("port", 11211));
  const uint64_t keys = args.u64("keys", 200000);
  const uint64_t ops = args.u64("ops", 400000);
  const size_t vsize = args.u64("value-size", 1000);
  const uint64_t conns = args.u64("conns", 2);
  const uint64_t reads = args.u64("reads", 90);
  const double theta = args.f64("theta", 0.99);
  const uint64_t seed = args.u64("seed", 1);
  args.check_all_used();
  if (conns == 0 || keys < conns * 2 || vsize == 0 || reads > 100) {
    eval::die("need --conns > 0, --keys >= 2*conns, --value-size > 0, --reads <= 100");
  }
  const uint64_t per = keys / conns;  // keys owned by each connection
  const uint64_t kPerm = 2654435761ull;
  if (per % kPerm == 0) eval::die("--keys/--conns must not be a multiple of 2654435761");

  std::vector<Conn> cs(conns);
  for (auto& c : cs) c.fd = connect_to(port);

  // Phase 1: store every key, version 0.
  auto populate = [&](uint64_t t) {
    Conn& c = cs[t];
    std::string batch, v;
    for (uint64_t k = 0; k < per; ++k) {
      const uint64_t idx = k * conns + t;
      make_value(v, idx, 0, vsize);
      batch += "set " + key_name(idx) + " 0 0 " + std::to_string(vsize) + " noreply\r\n";
      batch += v;
      batch += "\r\n";
      if (batch.size() > 60000) {
        c.send_all(batch);
        batch.clear();
      }
    }
    batch += "version\r\n";
    c.send_all(batch);
    std::string l = c.line();
    if (l.rfind("VERSION", 0) != 0) {
      std::fprintf(stderr, "eval mcload: populate: memcached answered '%s'\n", l.c_str());
      std::exit(2);
    }
  };
  {
    std::vector<std::thread> ts;
    for (uint64_t t = 0; t < conns; ++t) ts.emplace_back(populate, t);
    for (auto& th : ts) th.join();
  }

  // Phase 2: the timed get/set mix.
  const eval::Zipf zipf(per, theta);
  std::vector<ThreadResult> res(conns);
  auto run = [&](uint64_t t) {
    Conn& c = cs[t];
    ThreadResult& r = res[t];
    eval::Rng rng(seed * 1000 + t);
    eval::Hasher h;
    std::string req, v;
    const uint64_t my_ops = ops / conns;
    for (uint64_t op = 0; op < my_ops; ++op) {
      const uint64_t rank = zipf.next(rng);
      const uint64_t idx = (rank * kPerm % per) * conns + t;
      const bool is_get = rng.next() % 100 < reads;
      const std::string key = key_name(idx);
      if (is_get) {
        req = "get " + key + "\r\n";
      } else {
        make_value(v, idx, op + 1, vsize);
        req = "set " + key + " 0 0 " + std::to_string(vsize) + "\r\n" + v + "\r\n";
      }
      const uint64_t s0 = eval::now_ns();
      c.send_all(req);
      std::string l = c.line();
      if (is_get) {
        if (l == "END") {
          ++r.misses;
          h.add(0);
        } else {
          // VALUE <key> <flags> <bytes>
          const size_t sp = l.rfind(' ');
          if (l.rfind("VALUE ", 0) != 0 || sp == std::string::npos) {
            std::fprintf(stderr, "eval mcload: get: unexpected reply '%s'\n", l.c_str());
            std::exit(2);
          }
          const size_t n = std::strtoull(l.c_str() + sp + 1, nullptr, 10);
          std::string_view data = c.bytes(n);
          uint64_t x = n;
          for (char ch : data) x = x * 0x100000001B3ull + static_cast<unsigned char>(ch);
          h.add(x);
          if (c.line() != "END") eval::die("get: reply without END");
        }
      } else if (l != "STORED") {
        std::fprintf(stderr, "eval mcload: set: unexpected reply '%s'\n", l.c_str());
        std::exit(2);
      }
      r.lat.add(eval::now_ns() - s0);
    }
    r.hash = h.h;
    r.ops = my_ops;
  };
  const uint64_t t0 = eval::now_ns();
  {
    std::vector<std::thread> ts;
    for (uint64_t t = 0; t < conns; ++t) ts.emplace_back(run, t);
    for (auto& th : ts) th.join();
  }
  const double secs = static_cast<double>(eval::now_ns() - t0) / 1e9;

  eval::LatHist all;
  eval::Hasher sum;
  uint64_t misses = 0, done = 0;
  for (auto& r : res) {
    sum.add(r.hash);
    misses += r.misses;
    done += r.ops;
  }
  for (auto& r : res) all.merge(r.lat);
  const double p50 = all.percentile_ns(0.50), p99 = all.percentile_ns(0.99);
  for (auto& c : cs) ::close(c.fd);

  eval::Result out("memcached");
  out.num("runtime_s", secs);
  out.num("throughput", static_cast<double>(done) / secs);
  out.str("throughput_unit", "ops/s");
  out.num("p50_us", p50 / 1e3);
  out.num("p99_us", p99 / 1e3);
  out.u64("misses", misses);
  out.u64("ws_bytes", keys * vsize);
  out.hex("checksum", sum.h);
  out.print();
  return 0;
}
