// Zipfian key-value store: get/set mix over an open-addressing hash table.
//
//   farmem_eval_kv --mib 256 --ops 4000000 [--theta 0.99] [--reads 90] [--seed 1]
//
// The table is one array of 128-byte slots (8-byte key, 120-byte value)
// from plain new, about --mib MiB, filled to 70% with keys; keys are drawn
// zipfian (theta 0.99: a few keys take most requests) and scattered over
// the table by a hash, so the hot keys live on many pages, as in a real
// store. A get reads the whole value and folds it into the checksum; a set
// rewrites the value from (key, op index). Only the get/set phase is
// timed; each op is timed on its own for the p99.
//
// Output: runtime_s, throughput (ops/s), p50_us, p99_us, checksum (of every
// value read and of the final table), ws_bytes.
#include "common.h"

namespace {

constexpr size_t kValueWords = 15;  // 120 bytes
struct Slot {
  uint64_t key;  // 0 = empty
  uint64_t value[kValueWords];
};
static_assert(sizeof(Slot) == 128);

uint64_t key_of(uint64_t rank) {
  return eval::mix64(rank + 1) | 1;
}  // never 0

void fill_value(Slot& s, uint64_t version) {
  for (size_t i = 0; i < kValueWords; ++i) s.value[i] = eval::mix64(s.key ^ (version * 31 + i));
}

}  // namespace

int main(int argc, char** argv) {
  eval::Args a(argc, argv);
  const uint64_t mib = a.u64("mib", 256);
  const uint64_t ops = a.u64("ops", 4000000);
  const double theta = a.f64("theta", 0.99);
  const uint64_t reads = a.u64("reads", 90);
  const uint64_t seed = a.u64("seed", 1);
  a.check_all_used();
  if (mib == 0 || reads > 100) eval::die("--mib must be > 0 and --reads a percentage");

  uint64_t slots = 1;
  while (slots * sizeof(Slot) < mib << 20) slots <<= 1;  // power of two: mask, not modulo
  const uint64_t mask = slots - 1;
  const uint64_t nkeys = slots * 7 / 10;
  Slot* table = new Slot[slots]();

  auto find = [&](uint64_t key) -> Slot& {
    uint64_t i = eval::mix64(key) & mask;
    while (table[i].key != key && table[i].key != 0) i = (i + 1) & mask;
    return table[i];
  };
  for (uint64_t r = 0; r < nkeys; ++r) {
    Slot& s = find(key_of(r));
    s.key = key_of(r);
    fill_value(s, 0);
  }

  eval::Zipf zipf(nkeys, theta);
  eval::Rng rng(seed);
  eval::LatHist lat;
  eval::Hasher sum;
  uint64_t gets = 0;
  const uint64_t t0 = eval::now_ns();
  for (uint64_t op = 0; op < ops; ++op) {
    const uint64_t key = key_of(zipf.next(rng));
    const bool is_get = rng.next() % 100 < reads;
    const uint64_t s0 = eval::now_ns();
    Slot& s = find(key);
    if (s.key != key) eval::die("a key that was inserted is missing from the table");
    if (is_get) {
      uint64_t x = 0;
      for (size_t i = 0; i < kValueWords; ++i) x = x * 0x100000001B3ull + s.value[i];
      sum.add(x);
      ++gets;
    } else {
      fill_value(s, op + 1);
    }
    lat.add(eval::now_ns() - s0);
  }
  const double secs = static_cast<double>(eval::now_ns() - t0) / 1e9;

  for (uint64_t i = 0; i < slots; ++i) {
    if (table[i].key != 0) sum.add(table[i].key ^ table[i].value[0] ^ table[i].value[14]);
  }
  eval::Result r("kv");
  r.num("runtime_s", secs);
  r.num("throughput", static_cast<double>(ops) / secs);
  r.str("throughput_unit", "ops/s");
  r.num("p50_us", lat.percentile_ns(0.50) / 1e3);
  r.num("p99_us", lat.percentile_ns(0.99) / 1e3);
  r.u64("gets", gets);
  r.u64("ws_bytes", slots * sizeof(Slot));
  r.hex("checksum", sum.h);
  r.print();
  eval::hold_for_harness();
  delete[] table;
  return 0;
}
