// Quicksort of a large array of random 64-bit integers.
//
//   farmem_eval_sort --mib 256 [--seed 1]
//
// One array from plain new (--mib MiB of uint64_t), filled from a seeded
// generator, sorted in place by a plain quicksort (median of three, Hoare
// partition, recursion on the smaller side, insertion sort below 24
// elements). Partitioning streams through ever smaller ranges: mostly
// sequential, with the working set shrinking as it goes. Only the sort is
// timed. The result is checked to be sorted (exit 1 if not) and hashed in
// order, so the checksum is the same on every system.
//
// Output: runtime_s, throughput (elements/s), checksum, ws_bytes.
#include <utility>

#include "common.h"

namespace {

void insertion_sort(uint64_t* a, int64_t lo, int64_t hi) {
  for (int64_t i = lo + 1; i <= hi; ++i) {
    const uint64_t v = a[i];
    int64_t j = i - 1;
    while (j >= lo && a[j] > v) {
      a[j + 1] = a[j];
      --j;
    }
    a[j + 1] = v;
  }
}

void quicksort(uint64_t* a, int64_t lo, int64_t hi) {
  while (hi - lo > 24) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a[mid] < a[lo]) std::swap(a[mid], a[lo]);
    if (a[hi] < a[lo]) std::swap(a[hi], a[lo]);
    if (a[hi] < a[mid]) std::swap(a[hi], a[mid]);
    const uint64_t pivot = a[mid];
    int64_t i = lo - 1, j = hi + 1;
    for (;;) {
      do ++i;
      while (a[i] < pivot);
      do --j;
      while (a[j] > pivot);
      if (i >= j) break;
      std::swap(a[i], a[j]);
    }
    // [lo, j] and [j+1, hi]: recurse into the smaller, loop on the larger,
    // so the stack stays O(log n).
    if (j - lo < hi - j) {
      quicksort(a, lo, j);
      lo = j + 1;
    } else {
      quicksort(a, j + 1, hi);
      hi = j;
    }
  }
  insertion_sort(a, lo, hi);
}

}  // namespace

int main(int argc, char** argv) {
  eval::Args args(argc, argv);
  const uint64_t mib = args.u64("mib", 256);
  const uint64_t seed = args.u64("seed", 1);
  args.check_all_used();
  if (mib == 0) eval::die("--mib must be > 0");

  const uint64_t n = (mib << 20) / sizeof(uint64_t);
  uint64_t* a = new uint64_t[n];
  eval::Rng rng(seed);
  for (uint64_t i = 0; i < n; ++i) a[i] = rng.next();

  const uint64_t t0 = eval::now_ns();
  quicksort(a, 0, static_cast<int64_t>(n) - 1);
  const double secs = static_cast<double>(eval::now_ns() - t0) / 1e9;

  eval::Hasher sum;
  for (uint64_t i = 0; i < n; ++i) {
    if (i > 0 && a[i - 1] > a[i]) {
      std::fprintf(stderr, "eval sort: the array is not sorted at index %llu\n",
                   static_cast<unsigned long long>(i));
      return 1;
    }
    sum.add(a[i]);
  }
  eval::Result r("sort");
  r.num("runtime_s", secs);
  r.num("throughput", static_cast<double>(n) / secs);
  r.str("throughput_unit", "elements/s");
  r.u64("ws_bytes", n * sizeof(uint64_t));
  r.hex("checksum", sum.h);
  r.print();
  eval::hold_for_harness();
  delete[] a;
  return 0;
}
