// farmem_transport_demo: moves a buffer to far memory and back through the
// tcp Transport, and checks every byte.
//
//   farmem_transport_demo --server 127.0.0.1:7400 --token-file /etc/farmem/token
//   FARMEM_SERVERS=a:7400,b:7400 FARMEM_TOKEN_FILE=tok farmem_transport_demo --size 64M
//
// What it does, in the order a far-memory runtime would:
//   1. connects a DonorSession to each donor (HELLO, CHALLENGE, AUTH, WELCOME)
//      and records the donor's STATS;
//   2. leases its share of --size from each donor and adds the slabs and one
//      registered local buffer to a TcpTransport;
//   3. fills the buffer with a pattern unique to this run, WRITEs it out in
//      --page sized ops striped over the donors, keeping up to --depth ops
//      in flight on one queue, then poisons the buffer;
//   4. READs everything back the same way and compares every byte;
//   5. prints what moved (ops, bytes, time, MiB/s) and the donors' STATS
//      before and after, and releases the leases.
// Exit status: 0 when every byte came back, 1 on a mismatch or any error,
// 2 on a usage error.
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/auth.h"
#include "runtime/donor_client.h"
#include "runtime/parse.h"
#include "runtime/status.h"
#include "runtime/tcp_transport.h"
#include "runtime/transport.h"

namespace farmem {
namespace {

constexpr uint16_t kDefaultPort = 7400;
constexpr int kCompletionTimeoutMs = 30000;  // no completion for this long: give up
constexpr uint8_t kPoison = 0xEE;            // fills the buffer before the READs
constexpr int kMaxMismatchReports = 5;

struct Args {
  std::vector<Endpoint> servers;
  std::string token_file;
  bool insecure = false;
  uint64_t size = 64ull << 20;
  uint32_t page = 4096;
  size_t depth = 64;
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: farmem_transport_demo [--server HOST:PORT[,HOST:PORT...]]\n"
               "                             [--token-file FILE | --insecure]\n"
               "                             [--size BYTES] [--page BYTES] [--depth N]\n"
               "  --server      donors to use (default: $FARMEM_SERVERS; port %u if omitted)\n"
               "  --token-file  the donors' shared token (default: $FARMEM_TOKEN_FILE)\n"
               "  --insecure    send no token (only donors started with --insecure accept it)\n"
               "  --size        bytes to move out and back (default 64M)\n"
               "  --page        bytes per READ/WRITE op, a multiple of 8 (default 4K, at most 2M)\n"
               "  --depth       ops in flight on the queue (default 64)\n",
               kDefaultPort);
}

bool usage_error(const Status& st) {
  std::fprintf(stderr, "farmem_transport_demo: %s\n", st.to_string().c_str());
  return false;
}

// Parses argv over the environment defaults; prints the problem and
// returns false on a usage error.
bool parse_args(int argc, char** argv, Args* a) {
  std::string servers;
  if (const char* env = std::getenv("FARMEM_SERVERS")) servers = env;
  if (const char* env = std::getenv("FARMEM_TOKEN_FILE")) a->token_file = env;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view value;
    bool inline_value = false;
    if (auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    auto take_value = [&]() -> bool {
      if (inline_value) return true;
      if (i + 1 >= argc) {
        return usage_error(make_error(Errc::kInvalidArgument, "%s needs a value", argv[i]));
      }
      value = argv[++i];
      return true;
    };
    if (arg == "-h" || arg == "--help") {
      usage(stdout);
      std::exit(0);
    } else if (arg == "--insecure") {
      a->insecure = true;
    } else if (arg == "--server" || arg == "--servers") {
      if (!take_value()) return false;
      servers = value;
    } else if (arg == "--token-file") {
      if (!take_value()) return false;
      a->token_file = value;
    } else if (arg == "--size") {
      if (!take_value()) return false;
      auto r = parse_size(value, "--size");
      if (!r.ok()) return usage_error(r.status());
      a->size = *r;
    } else if (arg == "--page") {
      if (!take_value()) return false;
      auto r = parse_size(value, "--page");
      if (!r.ok()) return usage_error(r.status());
      if (*r == 0 || *r > wire::kMaxIoLength || *r % 8 != 0)
        return usage_error(make_error(Errc::kInvalidArgument,
                                      "--page %" PRIu64 " must be a multiple of 8 in 8..%u", *r,
                                      wire::kMaxIoLength));
      a->page = static_cast<uint32_t>(*r);
    } else if (arg == "--depth") {
      if (!take_value()) return false;
      auto r = parse_uint(value, "--depth", 1, 4096);
      if (!r.ok()) return usage_error(r.status());
      a->depth = static_cast<size_t>(*r);
    } else {
      std::fprintf(stderr, "farmem_transport_demo: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return false;
    }
  }
  if (servers.empty())
    return usage_error(make_error(Errc::kInvalidArgument,
                                  "no donor given: pass --server HOST:PORT or set FARMEM_SERVERS"));
  auto eps = parse_endpoint_list(servers, "--server/FARMEM_SERVERS", kDefaultPort);
  if (!eps.ok()) return usage_error(eps.status());
  a->servers = std::move(*eps);
  if (a->servers.size() > 64)
    return usage_error(
        make_error(Errc::kInvalidArgument, "%zu donors given, at most 64", a->servers.size()));
  if (a->token_file.empty() && !a->insecure)
    return usage_error(make_error(Errc::kInvalidArgument,
                                  "no token: pass --token-file FILE (or set FARMEM_TOKEN_FILE), "
                                  "or --insecure for a donor started with --insecure"));
  if (a->size < a->page)
    return usage_error(make_error(
        Errc::kInvalidArgument, "--size %" PRIu64 " is smaller than --page %u", a->size, a->page));
  return true;
}

// The pattern: one 64-bit word per 8 bytes, a SplitMix64 hash of the run's
// seed and the word's index, so that every page differs and a stale or
// misplaced page from an earlier run cannot match.
uint64_t pattern_word(uint64_t seed, uint64_t index) {
  uint64_t z = seed + index * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void fill_pattern(uint8_t* buf, uint64_t bytes, uint64_t seed) {
  for (uint64_t w = 0; w < bytes / 8; ++w) {
    uint64_t v = pattern_word(seed, w);
    std::memcpy(buf + w * 8, &v, 8);
  }
}

struct Donor {
  std::unique_ptr<DonorSession> session;
  std::vector<SlabDesc> slabs;
  wire::StatsReply before{};
};

struct PhaseResult {
  uint64_t ops = 0;  // completed kOk
  uint64_t bytes = 0;
  double seconds = 0;
  uint64_t failed = 0;  // completed with an error
  Errc first_error = Errc::kOk;
  uint64_t first_error_page = 0;
  std::string aborted;  // why the phase stopped early; empty when it ran to the end
};

std::string where_str(const RemoteAddr& r) {
  char s[96];
  std::snprintf(s, sizeof s, "donor %u slab %u offset %" PRIu64, r.server, r.slab, r.offset);
  return s;
}

// Moves every page in one direction, keeping the queue as full as it
// allows: post what fits, wait for at least one completion, repeat.
PhaseResult run_phase(TcpTransport::Queue& q, IoKind kind, uint8_t* buf,
                      const std::vector<RemoteAddr>& where, uint32_t page) {
  PhaseResult r;
  const size_t n = where.size();
  std::vector<IoOp> batch(q.depth());
  std::vector<IoCompletion> done(q.depth());
  size_t next = 0;
  size_t completed = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (completed < n) {
    size_t k = 0;
    while (next < n && q.outstanding() + k < q.depth()) {
      batch[k++] = IoOp{kind, page, where[next], buf + next * page, next};
      ++next;
    }
    if (k > 0) {
      Errc e = q.post({batch.data(), k});
      if (e != Errc::kOk) {
        r.aborted = std::string("the queue refused ") + std::to_string(k) + " ops: " + errc_name(e);
        break;
      }
    }
    size_t got = q.wait(done, kCompletionTimeoutMs);
    if (got == 0) {
      r.aborted = "no completion within " + std::to_string(kCompletionTimeoutMs / 1000) +
                  " s with " + std::to_string(q.outstanding()) + " ops outstanding";
      break;
    }
    for (size_t i = 0; i < got; ++i) {
      if (done[i].status == Errc::kOk) {
        ++r.ops;
        r.bytes += page;
      } else if (r.failed++ == 0) {
        r.first_error = done[i].status;
        r.first_error_page = done[i].cookie;
      }
    }
    completed += got;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

bool report_phase(const char* name, const PhaseResult& r, const std::vector<RemoteAddr>& where) {
  double mib = static_cast<double>(r.bytes) / (1 << 20);
  double secs = r.seconds > 0 ? r.seconds : 1e-9;
  std::printf("%-5s %" PRIu64 " ops, %s in %.3f s: %.1f MiB/s, %.0f ops/s\n", name, r.ops,
              format_size(r.bytes).c_str(), r.seconds, mib / secs,
              static_cast<double>(r.ops) / secs);
  bool ok = true;
  if (r.failed > 0) {
    std::printf("%-5s FAILED: %" PRIu64 " ops completed with an error; the first: page %" PRIu64
                " (%s): %s\n",
                name, r.failed, r.first_error_page, where_str(where[r.first_error_page]).c_str(),
                errc_name(r.first_error));
    ok = false;
  }
  if (!r.aborted.empty()) {
    std::printf("%-5s FAILED: stopped early: %s\n", name, r.aborted.c_str());
    ok = false;
  }
  return ok;
}

// Compares the buffer with the pattern; prints the first few bad pages.
uint64_t verify(const uint8_t* buf, uint64_t pages, uint32_t page, uint64_t seed,
                const std::vector<RemoteAddr>& where) {
  uint64_t bad_pages = 0;
  const uint64_t words = page / 8;
  for (uint64_t p = 0; p < pages; ++p) {
    for (uint64_t w = 0; w < words; ++w) {
      uint64_t want = pattern_word(seed, p * words + w);
      uint64_t got;
      std::memcpy(&got, buf + p * page + w * 8, 8);
      if (got == want) continue;
      if (bad_pages < kMaxMismatchReports) {
        std::printf("verify: page %" PRIu64 " (%s) differs at byte %" PRIu64
                    ": expected 0x%016" PRIx64 ", got 0x%016" PRIx64 "\n",
                    p, where_str(where[p]).c_str(), w * 8, want, got);
      }
      ++bad_pages;
      break;
    }
  }
  return bad_pages;
}

void print_stats(size_t i, const Endpoint& ep, const wire::StatsReply& b,
                 const wire::StatsReply& a) {
  std::printf("donor %zu (%s) STATS     before        after        delta\n", i,
              ep.to_string().c_str());
  auto row = [](const char* name, uint64_t x, uint64_t y) {
    std::printf("  %-15s %12" PRIu64 " %12" PRIu64 " %+12" PRId64 "\n", name, x, y,
                static_cast<int64_t>(y - x));
  };
  row("capacity", b.capacity, a.capacity);
  row("leased", b.leased, a.leased);
  row("clients", b.clients, a.clients);
  row("connections", b.connections, a.connections);
  row("reads", b.reads, a.reads);
  row("writes", b.writes, a.writes);
  row("bytes_read", b.bytes_read, a.bytes_read);
  row("bytes_written", b.bytes_written, a.bytes_written);
  row("errors", b.errors, a.errors);
}

int fail(const char* what, const Status& st) {
  std::fprintf(stderr, "farmem_transport_demo: %s: %s\n", what, st.to_string().c_str());
  return 1;
}

int run(const Args& args) {
  std::string token;
  if (!args.insecure) {
    auto t = read_token_file(args.token_file);
    if (!t.ok()) return fail("reading the token", t.status());
    token = std::move(*t);
  }
  const size_t nd = args.servers.size();
  const uint64_t pages = args.size / args.page;
  const uint64_t bytes = pages * args.page;
  const uint64_t seed = random_u64();
  std::printf("farmem_transport_demo: %zu donor%s, %s in %" PRIu64
              " ops of %u bytes each way, queue depth %zu, pattern seed 0x%016" PRIx64 "\n",
              nd, nd == 1 ? "" : "s", format_size(bytes).c_str(), pages, args.page, args.depth,
              seed);

  // Declared before the transport: the sessions must outlive it.
  std::vector<Donor> donors(nd);
  TcpTransport transport(TcpTransport::Options{args.depth});
  std::vector<RemoteAddr> where(pages);
  for (size_t d = 0; d < nd; ++d) {
    const Endpoint& ep = args.servers[d];
    DonorClientOptions o;
    o.server = ep;
    o.token = token;
    auto s = DonorSession::connect(o);
    if (!s.ok()) return fail(("connecting to " + ep.to_string()).c_str(), s.status());
    donors[d].session = std::move(*s);
    DonorSession& sess = *donors[d].session;
    const wire::Welcome& w = sess.welcome();
    std::printf("donor %zu (%s): session 0x%016" PRIx64 ", capacity %s, slab size %s\n", d,
                ep.to_string().c_str(), w.session_id, format_size(w.capacity).c_str(),
                format_size(w.slab_size).c_str());
    auto st = sess.stats();
    if (!st.ok()) return fail(("STATS from " + ep.to_string()).c_str(), st.status());
    donors[d].before = *st;
    Status add = transport.add_server(static_cast<ServerId>(d), &sess);
    if (!add.ok()) return fail("adding a donor to the transport", add);

    // Pages are striped: page p lives on donor p % nd, packed into that
    // donor's slabs in order.
    const uint64_t my_pages = (pages - d + nd - 1) / nd;
    auto lease = sess.lease(my_pages * args.page);
    if (!lease.ok()) return fail(("leasing from " + ep.to_string()).c_str(), lease.status());
    donors[d].slabs = std::move(*lease);
    uint64_t leased = 0;
    uint64_t p = d;
    for (const SlabDesc& sd : donors[d].slabs) {
      leased += sd.size;
      Status added = transport.add_slab(static_cast<ServerId>(d), sd);
      if (!added.ok()) return fail("adding a slab to the transport", added);
      for (uint64_t off = 0; off + args.page <= sd.size && p < pages; off += args.page, p += nd)
        where[p] = RemoteAddr{static_cast<ServerId>(d), sd.slab, off};
    }
    std::printf("  leased %zu slab%s, %s\n", donors[d].slabs.size(),
                donors[d].slabs.size() == 1 ? "" : "s", format_size(leased).c_str());
    if (p < pages) {
      std::fprintf(stderr,
                   "farmem_transport_demo: %s leased %s, too little for %" PRIu64
                   " pages of %u bytes\n",
                   ep.to_string().c_str(), format_size(leased).c_str(), my_pages, args.page);
      return 1;
    }
  }

  std::vector<uint8_t> buf(bytes);
  Status reg = transport.register_buffer(buf.data(), buf.size());
  if (!reg.ok()) return fail("registering the local buffer", reg);
  auto queue = transport.open_queue();
  if (!queue.ok()) return fail("opening a queue", queue.status());
  TcpTransport::Queue& q = **queue;

  fill_pattern(buf.data(), bytes, seed);
  PhaseResult wr = run_phase(q, IoKind::kWrite, buf.data(), where, args.page);
  bool ok = report_phase("write", wr, where);
  if (ok) {
    std::memset(buf.data(), kPoison, buf.size());
    PhaseResult rd = run_phase(q, IoKind::kRead, buf.data(), where, args.page);
    ok = report_phase("read", rd, where);
    if (ok) {
      uint64_t bad = verify(buf.data(), pages, args.page, seed, where);
      if (bad == 0) {
        std::printf("verify: all %" PRIu64 " bytes came back byte-exact\n", bytes);
      } else {
        std::printf("verify: FAILED: %" PRIu64 " of %" PRIu64 " pages differ\n", bad, pages);
        ok = false;
      }
    }
  }

  for (size_t d = 0; d < nd; ++d) {
    auto after = donors[d].session->stats();
    if (!after.ok()) {
      fail(("STATS from " + args.servers[d].to_string()).c_str(), after.status());
      ok = false;
      continue;
    }
    print_stats(d, args.servers[d], donors[d].before, *after);
  }

  // Tear down in reverse: the queue, then the slabs, then the leases.
  queue->reset();
  size_t released = 0;
  for (size_t d = 0; d < nd; ++d) {
    for (const SlabDesc& sd : donors[d].slabs) {
      Status rm = transport.remove_slab(static_cast<ServerId>(d), sd.slab);
      Status rel = donors[d].session->release(sd.slab);
      if (!rm.ok() || !rel.ok()) {
        fail("releasing a slab", rm.ok() ? rel : rm);
        ok = false;
        continue;
      }
      ++released;
    }
  }
  std::printf("released %zu slab%s\n", released, released == 1 ? "" : "s");
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace farmem

int main(int argc, char** argv) {
  farmem::Args args;
  if (!farmem::parse_args(argc, argv, &args)) return 2;
  return farmem::run(args);
}
