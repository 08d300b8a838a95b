// Writes the seed corpus of the wire fuzz targets: real encoded frames, so
// that libFuzzer starts from inputs that get past the header checks. Seeds
// are generated at build/run time instead of committed as binary files.
//
//   farmem_fuzz_make_corpus build-fuzz/corpus     # writes seed-*.bin, prints the count
//
// Each seed is one connection's worth of bytes: every message type on its
// own, the two handshakes followed by requests, and a few streams that must
// be refused (unknown type, non-zero flags, oversize payload, truncation).
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/status.h"
#include "runtime/wire.h"

namespace farmem::wire {
namespace {

using Bytes = std::vector<uint8_t>;

struct Seed {
  const char* name;
  Bytes bytes;
};

Hello hello(Role role) {
  Hello h;
  h.role = role;
  h.client_id = 0x0123456789ABCDEFull;
  return h;
}

Challenge challenge() {
  Challenge c;
  c.instance_id = 0xFEEDFACEull;
  for (size_t i = 0; i < c.nonce.size(); ++i) c.nonce[i] = static_cast<uint8_t>(i * 7 + 1);
  return c;
}

Welcome welcome() {
  Welcome w;
  w.session_id = 42;
  w.secret.fill(0x5A);
  w.capacity = 256ull << 20;
  w.slab_size = 64ull << 20;
  w.quota = 0;
  w.heartbeat_ms = 1000;
  w.grace_ms = 5000;
  w.instance_id = 0xFEEDFACEull;
  return w;
}

Leased leased(uint32_t n) {
  Leased l;
  for (uint32_t i = 0; i < n; ++i) l.slabs.push_back({i + 1, 0, 64ull << 20, 0});
  return l;
}

StatsReply stats() {
  StatsReply s;
  s.capacity = 256ull << 20;
  s.leased = 64ull << 20;
  s.slab_size = 64ull << 20;
  s.clients = 1;
  s.connections = 2;
  s.bytes_read = 4096;
  s.bytes_written = 8192;
  s.reads = 1;
  s.writes = 2;
  s.instance_id = 0xFEEDFACEull;
  return s;
}

Bytes write_req(uint64_t tag, uint32_t slab, uint32_t length, uint64_t offset) {
  Bytes data(length);
  for (uint32_t i = 0; i < length; ++i) data[i] = static_cast<uint8_t>(i ^ 0xA5);
  Bytes b;
  encode_io_req(b, MsgType::kWrite, tag, IoReq{slab, length, offset}, data.data());
  return b;
}

std::vector<Seed> seeds() {
  std::vector<Seed> s;
  auto add = [&s](const char* name, auto&& build) {
    Bytes b;
    build(b);
    s.push_back({name, std::move(b)});
  };
  add("hello-control", [](Bytes& b) { encode_hello(b, 1, hello(Role::kControl)); });
  add("hello-data", [](Bytes& b) { encode_hello(b, 1, hello(Role::kData)); });
  add("challenge", [](Bytes& b) { encode_challenge(b, 1, challenge()); });
  add("auth", [](Bytes& b) {
    Auth a;
    a.mac.fill(0xAB);
    encode_auth(b, 2, a);
  });
  add("attach", [](Bytes& b) {
    Attach a;
    a.session_id = 42;
    a.mac.fill(0xCD);
    encode_attach(b, 2, a);
  });
  add("welcome", [](Bytes& b) { encode_welcome(b, 2, welcome()); });
  add("attached", [](Bytes& b) { encode_empty(b, MsgType::kAttached, 2); });
  add("lease", [](Bytes& b) { encode_lease(b, 3, LeaseReq{128ull << 20}); });
  add("leased-2", [](Bytes& b) { encode_leased(b, 3, leased(2)); });
  add("leased-max", [](Bytes& b) { encode_leased(b, 3, leased(kMaxSlabsPerLease)); });
  add("release", [](Bytes& b) { encode_release(b, 4, ReleaseReq{1}); });
  add("released", [](Bytes& b) { encode_empty(b, MsgType::kReleased, 4); });
  add("heartbeat", [](Bytes& b) { encode_empty(b, MsgType::kHeartbeat, 5); });
  add("heartbeat-ack", [](Bytes& b) { encode_empty(b, MsgType::kHeartbeatAck, 5); });
  add("stats", [](Bytes& b) { encode_empty(b, MsgType::kStats, 6); });
  add("stats-reply", [](Bytes& b) { encode_stats_reply(b, 6, stats()); });
  add("read", [](Bytes& b) { encode_io_req(b, MsgType::kRead, 7, IoReq{1, 4096, 8192}, nullptr); });
  add("read-data", [](Bytes& b) {
    Bytes data(64, 0x3C);
    b.resize(kHeaderSize);
    encode_frame_header(b.data(), MsgType::kReadData, 7, static_cast<uint32_t>(data.size()));
    b.insert(b.end(), data.begin(), data.end());
  });
  add("write", [](Bytes& b) { b = write_req(8, 1, 64, 4096); });
  add("written", [](Bytes& b) { encode_empty(b, MsgType::kWritten, 8); });
  add("error", [](Bytes& b) {
    encode_error(b, 9, Errc::kOutOfRange,
                 "READ of 4096 bytes at offset 67108864 is outside slab 1");
  });
  add("clients", [](Bytes& b) { encode_clients(b, 10, ClientsReq{0}); });
  add("clients-reply", [](Bytes& b) {
    ClientsReply r;
    r.total = 3;
    r.more = true;
    for (uint64_t i = 1; i <= 2; ++i) {
      ClientInfo c;
      c.session_id = i * 100;
      c.client_id = i;
      c.leased = 64ull << 20;
      c.bytes_read = 4096 * i;
      c.bytes_written = 8192 * i;
      c.reads = i;
      c.writes = 2 * i;
      c.age_ms = 1500;
      c.data_conns = 1;
      c.idle_ms = 20;
      c.peer = "127.0.0.1:4" + std::to_string(i);
      r.clients.push_back(c);
    }
    encode_clients_reply(b, 10, r);
  });
  // Whole conversations, client side, as a daemon would receive them.
  add("control-session", [](Bytes& b) {
    encode_hello(b, 1, hello(Role::kControl));
    Auth a;
    a.mac.fill(0x11);
    encode_auth(b, 2, a);
    encode_lease(b, 3, LeaseReq{64ull << 20});
    encode_empty(b, MsgType::kStats, 4);
    encode_empty(b, MsgType::kHeartbeat, 5);
    encode_release(b, 6, ReleaseReq{1});
    encode_clients(b, 7, ClientsReq{0});
  });
  add("data-session", [](Bytes& b) {
    encode_hello(b, 1, hello(Role::kData));
    Attach a;
    a.session_id = 42;
    a.mac.fill(0x22);
    encode_attach(b, 2, a);
    Bytes w = write_req(3, 1, 32, 0);
    b.insert(b.end(), w.begin(), w.end());
    encode_io_req(b, MsgType::kRead, 4, IoReq{1, 32, 0}, nullptr);
    encode_io_req(b, MsgType::kRead, 5, IoReq{2, 4096, 1ull << 26}, nullptr);
  });
  // ... and server side, as a client would receive them.
  add("server-replies", [](Bytes& b) {
    encode_challenge(b, 1, challenge());
    encode_welcome(b, 2, welcome());
    encode_leased(b, 3, leased(1));
    encode_stats_reply(b, 4, stats());
    encode_empty(b, MsgType::kHeartbeatAck, 5);
    encode_empty(b, MsgType::kReleased, 6);
  });
  // Streams that must be refused.
  add("bad-type", [](Bytes& b) {
    encode_empty(b, MsgType::kHeartbeat, 1);
    put_u16(b.data() + 4, kMaxMsgType + 1);
  });
  add("bad-flags", [](Bytes& b) {
    encode_empty(b, MsgType::kStats, 1);
    put_u16(b.data() + 6, 1);
  });
  add("bad-length", [](Bytes& b) {
    encode_lease(b, 1, LeaseReq{4096});
    put_u32(b.data(), 9);
  });
  add("oversize-write", [](Bytes& b) {
    b.resize(kHeaderSize);
    encode_frame_header(b.data(), MsgType::kWrite, 1, kIoReqSize + kMaxIoLength + 1);
  });
  add("truncated", [](Bytes& b) {
    encode_hello(b, 1, hello(Role::kControl));
    encode_lease(b, 2, LeaseReq{4096});
    b.resize(b.size() - 3);
  });
  add("bad-fields", [](Bytes& b) {
    Hello h = hello(Role::kControl);
    h.magic = 0x12345678;
    encode_hello(b, 1, h);
    encode_lease(b, 2, LeaseReq{0});
    encode_io_req(b, MsgType::kRead, 3, IoReq{1, 0, 0}, nullptr);
    encode_io_req(b, MsgType::kRead, 4, IoReq{1, kMaxIoLength + 1, 0}, nullptr);
  });
  return s;
}

int write_file(const std::string& path, const Bytes& b) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::fprintf(stderr, "make_corpus: cannot create %s: %s\n", path.c_str(), std::strerror(errno));
    return 1;
  }
  bool ok = std::fwrite(b.data(), 1, b.size(), f) == b.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::fprintf(stderr, "make_corpus: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace farmem::wire

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR   (created if missing)\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "make_corpus: cannot create directory %s: %s\n", dir.c_str(),
                 std::strerror(errno));
    return 1;
  }
  auto all = farmem::wire::seeds();
  for (const auto& s : all) {
    if (farmem::wire::write_file(dir + "/seed-" + s.name + ".bin", s.bytes) != 0) return 1;
  }
  std::printf("make_corpus: wrote %zu seeds to %s\n", all.size(), dir.c_str());
  return 0;
}
