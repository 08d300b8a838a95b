// Shared pieces of the evaluation workloads (bench/eval/run.sh drives them).
//
//   eval::Args a(argc, argv);                 // --name value pairs
//   uint64_t mib = a.u64("mib", 256);
//   eval::Rng rng(a.u64("seed", 1));
//   eval::Zipf z(n, 0.99);  uint64_t rank = z.next(rng);
//   eval::LatHist h;  h.add(ns);  h.percentile_ns(0.99);
//   eval::Result r("kv");  r.num("runtime_s", s);  r.hex("checksum", c);  r.print();
//   eval::hold_for_harness();                 // see below
//
// Every workload is an ordinary program: its big arrays come from plain
// new/malloc, so under LD_PRELOAD=libfarmem_preload.so they live in the
// far heap and under a cgroup limit they are swapped, without a change.
// Each prints exactly one JSON line on stdout; its "checksum" depends only
// on the inputs (sizes, seed), never on timing, so the harness can require
// the same value from every system.
//
// hold_for_harness(): with FARMEM_EVAL_HOLD=1 the program, after printing
// its line, reads stdin until EOF before it exits. The harness uses the
// pause to read the far-memory stats socket (the fetch-latency histogram
// is not in the FARMEM_STATS summary, and the socket closes at exit).
#pragma once

#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace eval {

inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "eval workload: %s\n", what);
  std::exit(2);
}

// --name value arguments; an unknown or malformed one is an error that
// names it (a typo must not silently run the default size).
class Args {
 public:
  Args(int argc, char** argv) {
    for (int i = 1; i < argc; i += 2) {
      std::string_view k = argv[i];
      if (k.substr(0, 2) != "--" || i + 1 >= argc) {
        std::fprintf(stderr, "eval workload: arguments are --name value pairs; got '%s'\n",
                     argv[i]);
        std::exit(2);
      }
      keys_.emplace_back(k.substr(2));
      vals_.emplace_back(argv[i + 1]);
      used_.push_back(false);
    }
  }
  uint64_t u64(const char* name, uint64_t def) {
    const char* v = find(name);
    if (v == nullptr) return def;
    char* end = nullptr;
    unsigned long long x = std::strtoull(v, &end, 10);
    if (end == v || *end != '\0') bad(name, v);
    return x;
  }
  double f64(const char* name, double def) {
    const char* v = find(name);
    if (v == nullptr) return def;
    char* end = nullptr;
    double x = std::strtod(v, &end);
    if (end == v || *end != '\0') bad(name, v);
    return x;
  }
  std::string str(const char* name, const char* def) {
    const char* v = find(name);
    return v == nullptr ? std::string(def) : std::string(v);
  }
  // Call after reading every option: an unread one was misspelt.
  void check_all_used() const {
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (!used_[i]) {
        std::fprintf(stderr, "eval workload: unknown option --%s\n", keys_[i].c_str());
        std::exit(2);
      }
    }
  }

 private:
  const char* find(const char* name) {
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i] == name) {
        used_[i] = true;
        return vals_[i].c_str();
      }
    }
    return nullptr;
  }
  [[noreturn]] static void bad(const char* name, const char* v) {
    std::fprintf(stderr, "eval workload: --%s wants a number, got '%s'\n", name, v);
    std::exit(2);
  }
  std::vector<std::string> keys_, vals_;
  std::vector<bool> used_;
};

// splitmix64: tiny, fast, and the same sequence on every system.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Order-dependent running hash for checksums.
struct Hasher {
  uint64_t h = 0x243F6A8885A308D3ull;
  void add(uint64_t v) { h = mix64(h ^ v) + 0x9E3779B97F4A7C15ull; }
};

// Zipfian ranks in [0, n), rank 0 the most popular (Gray et al., "Quickly
// generating billion-record synthetic databases", as YCSB does). zeta(n) is
// computed once, O(n).
class Zipf {
 public:
  Zipf(uint64_t n, double theta) : n_(n), theta_(theta) {
    double zetan = 0;
    for (uint64_t i = 1; i <= n; ++i) zetan += 1.0 / std::pow(static_cast<double>(i), theta);
    zetan_ = zetan;
    const double zeta2 = 1.0 + std::pow(0.5, theta);
    alpha_ = 1.0 / (1.0 - theta);
    eta_ = (1.0 - std::pow(2.0 / static_cast<double>(n), 1.0 - theta)) / (1.0 - zeta2 / zetan);
    half_pow_ = 1.0 + std::pow(0.5, theta);
  }
  uint64_t next(Rng& r) const {
    const double u = r.uniform();
    const double uz = u * zetan_;
    if (uz < 1.0) return 0;
    if (uz < half_pow_) return 1 < n_ ? 1 : 0;
    uint64_t k =
        static_cast<uint64_t>(static_cast<double>(n_) * std::pow(eta_ * u - eta_ + 1.0, alpha_));
    return k < n_ ? k : n_ - 1;
  }

 private:
  uint64_t n_;
  double theta_, zetan_ = 0, alpha_ = 0, eta_ = 0, half_pow_ = 0;
};

// Log-linear latency histogram in nanoseconds: exact below 16 ns, then 8
// sub-buckets per power of two (at most 12.5% wide). No allocation on add.
class LatHist {
 public:
  static constexpr int kBuckets = 16 + 8 * 44;
  void add(uint64_t ns) { ++counts_[static_cast<size_t>(bucket(ns))]; }
  void merge(const LatHist& o) {
    for (int i = 0; i < kBuckets; ++i) counts_[i] += o.counts_[i];
  }
  uint64_t total() const {
    uint64_t t = 0;
    for (uint64_t c : counts_) t += c;
    return t;
  }
  // Midpoint of the bucket holding the q-quantile; 0 when empty.
  double percentile_ns(double q) const {
    const uint64_t t = total();
    if (t == 0) return 0;
    const uint64_t want = static_cast<uint64_t>(std::ceil(q * static_cast<double>(t)));
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += counts_[static_cast<size_t>(i)];
      if (seen >= want && counts_[static_cast<size_t>(i)] > 0) {
        return 0.5 * static_cast<double>(lower(i) + lower(i + 1));
      }
    }
    return static_cast<double>(lower(kBuckets));
  }
  // [[upper_bound_ns, count], ...] of the non-empty buckets. Appended piece
  // by piece: `"[" + std::to_string(x)` (operator+(const char*, string&&))
  // trips gcc 12's -Wrestrict at -O3, a false positive (GCC PR 105329).
  std::string to_json() const {
    std::string s = "[";
    for (int i = 0; i < kBuckets; ++i) {
      if (counts_[static_cast<size_t>(i)] == 0) continue;
      if (s.size() > 1) s += ',';
      s += '[';
      s += std::to_string(lower(i + 1));
      s += ',';
      s += std::to_string(counts_[static_cast<size_t>(i)]);
      s += ']';
    }
    s += ']';
    return s;
  }

 private:
  static int bucket(uint64_t v) {
    if (v < 16) return static_cast<int>(v);
    const int e = 63 - __builtin_clzll(v);  // >= 4
    const int sub = static_cast<int>((v >> (e - 3)) & 7);
    const int b = 16 + (e - 4) * 8 + sub;
    return b < kBuckets ? b : kBuckets - 1;
  }
  static uint64_t lower(int b) {
    if (b < 16) return static_cast<uint64_t>(b);
    const int e = (b - 16) / 8 + 4, sub = (b - 16) % 8;
    return (uint64_t{8} + static_cast<uint64_t>(sub)) << (e - 3);
  }
  uint64_t counts_[kBuckets] = {};
};

// The one JSON line a workload prints.
class Result {
 public:
  explicit Result(const char* workload) { s_ = std::string("{\"workload\":\"") + workload + "\""; }
  void num(const char* k, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    raw(k, buf);
  }
  void u64(const char* k, uint64_t v) { raw(k, std::to_string(v)); }
  void hex(const char* k, uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "\"%016llx\"", static_cast<unsigned long long>(v));
    raw(k, buf);
  }
  void str(const char* k, const std::string& v) { raw(k, "\"" + v + "\""); }
  void raw(const char* k, const std::string& v) { s_ += std::string(",\"") + k + "\":" + v; }
  void print() {
    std::printf("%s}\n", s_.c_str());
    std::fflush(stdout);
  }

 private:
  std::string s_;
};

inline void hold_for_harness() {
  const char* h = std::getenv("FARMEM_EVAL_HOLD");
  if (h == nullptr || std::strcmp(h, "1") != 0) return;
  char buf[256];
  while (read(0, buf, sizeof buf) > 0) {
  }
}

// Reads an 8-byte word through a volatile pointer so that the compiler
// keeps every access the workload means to make.
inline uint64_t load(const uint64_t* p) {
  return *static_cast<const volatile uint64_t*>(p);
}

}  // namespace eval
