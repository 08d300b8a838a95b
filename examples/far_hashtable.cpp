// A hash table whose buckets and entries live in far memory, with the C++
// API (farmem.hpp): std::unordered_map on far_allocator.
//
//   FARMEM_TRANSPORT=loopback FARMEM_LOCAL_MEM=32M ./far_hashtable 2000000
//   FARMEM_SERVERS=127.0.0.1:7400 FARMEM_TOKEN_FILE=token ./far_hashtable
//
// Inserts N keys with 64-byte values, looks every key up again, prints a
// checksum and farmem's statistics. The table is several times the local
// budget: most of it is on the donor at any moment.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <system_error>
#include <unordered_map>

#include "farmem/farmem.hpp"

namespace {

using Value = std::array<uint64_t, 8>;
using Table = std::unordered_map<uint64_t, Value, std::hash<uint64_t>, std::equal_to<>,
                                 farmem::far_allocator<std::pair<const uint64_t, Value>>>;

uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ULL;
  x ^= x >> 27;
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : 1000000;
  try {
    farmem::Runtime rt;  // FARMEM_* from the environment
    uint64_t sum = 0;
    {
      Table t;
      t.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        Value v;
        for (size_t k = 0; k < v.size(); ++k) v[k] = mix(i * 8 + k);
        t.emplace(mix(i), v);
      }
      for (uint64_t i = 0; i < n; ++i) {
        auto it = t.find(mix(i));
        if (it == t.end() || it->second[3] != mix(i * 8 + 3)) {
          fprintf(stderr, "far_hashtable: key %llu lost or corrupt\n",
                  static_cast<unsigned long long>(i));
          return 1;
        }
        sum += it->second[7];
      }
      printf("%llu entries, checksum %016llx, buckets in far memory: %s\n",
             static_cast<unsigned long long>(t.size()), static_cast<unsigned long long>(sum),
             fm_is_far(&*t.begin()) ? "yes" : "no");
    }
    fm_stats_t s = rt.stats();
    printf("resident peak %llu KiB of a %llu KiB budget; %llu pages fetched, %llu written back\n",
           static_cast<unsigned long long>(s.resident_peak_bytes >> 10),
           static_cast<unsigned long long>(s.budget_bytes >> 10),
           static_cast<unsigned long long>(s.faults_remote),
           static_cast<unsigned long long>(s.evictions_dirty));
  } catch (const std::system_error& e) {
    fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
