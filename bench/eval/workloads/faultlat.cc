// Fault-latency probe: random single-word reads, one per 4 KiB page.
//
//   farmem_eval_faultlat --mib 256 --reads 200000 [--seed 1]
//
// One array from plain new, every page written once, then --reads reads of
// one word at a random page, each timed on its own. With the array larger
// than local memory most reads miss: the histogram of per-read latency is
// the fault latency an application sees, measured the same way under
// farmem and under Linux swap (the harness plots its CDF beside farmem's
// own fetch-latency histogram). Throughput is reads per second: "random
// 4 KiB reads at 25% resident" in DESIGN.md's figures.
//
// Output: runtime_s, throughput (reads/s), p50_us, p99_us, hist_ns
// ([[upper_ns, count], ...]), checksum (sum of the words read), ws_bytes.
#include "common.h"

int main(int argc, char** argv) {
  eval::Args args(argc, argv);
  const uint64_t mib = args.u64("mib", 256);
  const uint64_t reads = args.u64("reads", 200000);
  const uint64_t seed = args.u64("seed", 1);
  args.check_all_used();
  if (mib == 0 || reads == 0) eval::die("--mib and --reads must be > 0");

  const uint64_t pages = (mib << 20) / 4096, words_per_page = 4096 / 8;
  uint64_t* a = new uint64_t[pages * words_per_page];
  for (uint64_t p = 0; p < pages; ++p) {
    for (uint64_t w = 0; w < words_per_page; w += 64) {  // one word per cache line
      a[p * words_per_page + w] = eval::mix64(p * words_per_page + w);
    }
  }

  eval::Rng rng(seed);
  eval::LatHist lat;
  uint64_t sum = 0;
  const uint64_t t0 = eval::now_ns();
  for (uint64_t i = 0; i < reads; ++i) {
    const uint64_t p = rng.next() % pages;
    const uint64_t w = (rng.next() % 8) * 64;
    const uint64_t s0 = eval::now_ns();
    sum += eval::load(&a[p * words_per_page + w]);
    lat.add(eval::now_ns() - s0);
  }
  const double secs = static_cast<double>(eval::now_ns() - t0) / 1e9;

  eval::Result r("faultlat");
  r.num("runtime_s", secs);
  r.num("throughput", static_cast<double>(reads) / secs);
  r.str("throughput_unit", "reads/s");
  r.num("p50_us", lat.percentile_ns(0.50) / 1e3);
  r.num("p99_us", lat.percentile_ns(0.99) / 1e3);
  r.raw("hist_ns", lat.to_json());
  r.u64("ws_bytes", pages * 4096);
  r.hex("checksum", eval::mix64(sum));
  r.print();
  eval::hold_for_harness();
  delete[] a;
  return 0;
}
