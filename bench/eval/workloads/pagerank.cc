// PageRank on a generated R-MAT graph (pull direction, CSR of in-edges).
//
//   farmem_eval_pagerank --scale 20 [--edge-factor 16] [--iters 20] [--seed 1]
//
// 2^scale vertices and edge-factor * 2^scale directed edges drawn with the
// R-MAT recursion (a, b, c, d = 0.57, 0.19, 0.19, 0.05, as Graph500). The
// edges are generated twice from the same seed (count, then fill) so that
// no edge list is ever held: the heap is the CSR (offsets, in-neighbours),
// the out-degrees and two rank arrays, all from plain new. Each iteration
// streams the in-neighbour array and reads the contribution array at
// random. Only the iterations are timed.
//
// Output: runtime_s, throughput (edges/s over all iterations), checksum of
// the final ranks' bits (same on every system: same operations in the same
// order), ws_bytes.
#include "common.h"

namespace {

struct Edge {
  uint32_t src, dst;
};

Edge rmat_edge(eval::Rng& rng, int scale) {
  // 16 bits of randomness per level, four levels per draw; thresholds are
  // a, a+b, a+b+c in 1/65536ths.
  constexpr uint32_t kA = 37355, kAB = 49807, kABC = 62259;  // .57, .76, .95
  uint32_t src = 0, dst = 0;
  uint64_t bits = 0;
  for (int level = 0; level < scale; ++level) {
    if (level % 4 == 0) bits = rng.next();
    const uint32_t r = static_cast<uint32_t>(bits & 0xffff);
    bits >>= 16;
    src = (src << 1) | (r >= kAB ? 1u : 0u);
    dst = (dst << 1) | ((r >= kA && r < kAB) || r >= kABC ? 1u : 0u);
  }
  return {src, dst};
}

}  // namespace

int main(int argc, char** argv) {
  eval::Args args(argc, argv);
  const int scale = static_cast<int>(args.u64("scale", 20));
  const uint64_t ef = args.u64("edge-factor", 16);
  const int iters = static_cast<int>(args.u64("iters", 20));
  const uint64_t seed = args.u64("seed", 1);
  args.check_all_used();
  if (scale < 4 || scale > 28 || ef == 0 || iters <= 0) {
    eval::die("--scale must be 4..28, --edge-factor and --iters > 0");
  }
  const uint64_t nv = uint64_t{1} << scale, ne = ef * nv;

  uint64_t* offsets = new uint64_t[nv + 1]();
  uint32_t* outdeg = new uint32_t[nv]();
  {
    eval::Rng rng(seed);
    for (uint64_t e = 0; e < ne; ++e) {
      const Edge ed = rmat_edge(rng, scale);
      ++offsets[ed.dst + 1];
      ++outdeg[ed.src];
    }
  }
  for (uint64_t v = 0; v < nv; ++v) offsets[v + 1] += offsets[v];
  uint32_t* in = new uint32_t[ne];
  {
    uint64_t* cursor = new uint64_t[nv];
    for (uint64_t v = 0; v < nv; ++v) cursor[v] = offsets[v];
    eval::Rng rng(seed);
    for (uint64_t e = 0; e < ne; ++e) {
      const Edge ed = rmat_edge(rng, scale);
      in[cursor[ed.dst]++] = ed.src;
    }
    delete[] cursor;
  }

  double* rank = new double[nv];
  double* contrib = new double[nv];
  const double d = 0.85, base = (1.0 - d) / static_cast<double>(nv);
  for (uint64_t v = 0; v < nv; ++v) rank[v] = 1.0 / static_cast<double>(nv);

  const uint64_t t0 = eval::now_ns();
  for (int it = 0; it < iters; ++it) {
    double dangling = 0;
    for (uint64_t v = 0; v < nv; ++v) {
      if (outdeg[v] == 0) {
        dangling += rank[v];
        contrib[v] = 0;
      } else {
        contrib[v] = rank[v] / outdeg[v];
      }
    }
    const double spread = base + d * dangling / static_cast<double>(nv);
    for (uint64_t v = 0; v < nv; ++v) {
      double s = 0;
      for (uint64_t e = offsets[v]; e < offsets[v + 1]; ++e) s += contrib[in[e]];
      rank[v] = spread + d * s;
    }
  }
  const double secs = static_cast<double>(eval::now_ns() - t0) / 1e9;

  eval::Hasher sum;
  double total = 0;
  for (uint64_t v = 0; v < nv; ++v) {
    uint64_t bits;
    std::memcpy(&bits, &rank[v], sizeof bits);
    sum.add(bits);
    total += rank[v];
  }
  if (std::fabs(total - 1.0) > 1e-6) {
    std::fprintf(stderr, "eval pagerank: ranks sum to %.9f, not 1\n", total);
    return 1;
  }
  eval::Result r("pagerank");
  r.num("runtime_s", secs);
  r.num("throughput", static_cast<double>(ne) * iters / secs);
  r.str("throughput_unit", "edges/s");
  r.u64("ws_bytes", (nv + 1) * 8 + nv * 4 + ne * 4 + nv * 16);
  r.hex("checksum", sum.h);
  r.print();
  eval::hold_for_harness();
  delete[] rank;
  delete[] contrib;
  delete[] in;
  delete[] outdeg;
  delete[] offsets;
  return 0;
}
