// STREAM-like sequential scan: copy, scale, add and triad over three arrays.
//
//   farmem_eval_scan --mib 384 [--passes 6]
//
// Three arrays of doubles from plain new, --mib MiB together. Each pass runs
// STREAM's four kernels in order (c = a; b = q*c; c = a + b; a = b + q*c)
// and counts the bytes STREAM counts (16, 16, 24 and 24 bytes per element).
// With less local memory than the arrays every pass streams the whole set
// in and out: this is what prefetch and the replacement policy are for.
// Only the passes are timed.
//
// Output: runtime_s, throughput (bytes/s), checksum (bits of the three
// arrays' sums: the same arithmetic in the same order everywhere), ws_bytes.
#include "common.h"

int main(int argc, char** argv) {
  eval::Args args(argc, argv);
  const uint64_t mib = args.u64("mib", 384);
  const int passes = static_cast<int>(args.u64("passes", 6));
  args.check_all_used();
  if (mib == 0 || passes <= 0) eval::die("--mib and --passes must be > 0");

  const uint64_t n = (mib << 20) / (3 * sizeof(double));
  double* a = new double[n];
  double* b = new double[n];
  double* c = new double[n];
  for (uint64_t i = 0; i < n; ++i) {
    a[i] = 1.0 + static_cast<double>(i % 7);
    b[i] = 2.0;
    c[i] = 0.0;
  }
  const double q = 0.5;  // keeps the values bounded over many passes

  const uint64_t t0 = eval::now_ns();
  for (int p = 0; p < passes; ++p) {
    for (uint64_t i = 0; i < n; ++i) c[i] = a[i];
    for (uint64_t i = 0; i < n; ++i) b[i] = q * c[i];
    for (uint64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
    for (uint64_t i = 0; i < n; ++i) a[i] = b[i] + q * c[i];
  }
  const double secs = static_cast<double>(eval::now_ns() - t0) / 1e9;

  double sa = 0, sb = 0, sc = 0;
  for (uint64_t i = 0; i < n; ++i) {
    sa += a[i];
    sb += b[i];
    sc += c[i];
  }
  eval::Hasher sum;
  for (double s : {sa, sb, sc}) {
    uint64_t bits;
    std::memcpy(&bits, &s, sizeof bits);
    sum.add(bits);
  }
  eval::Result r("scan");
  r.num("runtime_s", secs);
  r.num("throughput", static_cast<double>(80 * n) * passes / secs);
  r.str("throughput_unit", "bytes/s");
  r.u64("ws_bytes", 3 * n * sizeof(double));
  r.hex("checksum", sum.h);
  r.print();
  eval::hold_for_harness();
  delete[] a;
  delete[] b;
  delete[] c;
  return 0;
}
