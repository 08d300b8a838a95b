// exp, log and round for the preload library, so that it does not load
// libm into every program.
//
// The private jemalloc copy (allocator/CMakeLists.txt) calls exp(), log()
// and round() in its heap-profiling code only (prof sampling and
// unbiasing: reached with MALLOC_CONF=prof:true). They were the library's
// only libm symbols, and a loaded libm costs every program that does not
// use it itself (xz, zstd, GNU sort, python3) ~0.3 MiB of resident memory
// from relocation and IFUNC resolution alone, inside the budget a user
// measures (issue 16: farmem's own local memory). preload/math_subset.cc
// defines the three C functions, hidden, from these; tests compare them
// with libm's (tests/allocator/mathlite_test.cc).
//
// Accuracy: within 2 ulp of the correctly rounded result over the whole
// range (round() is exact); IEEE special cases as C99 Annex F (NaN in, NaN
// out; exp overflow +inf, underflow to 0 through subnormals; log(0) -inf,
// log(x < 0) NaN, log(+inf) +inf). errno is not set.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace farmem::mathlite {

inline uint64_t bits(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline double from_bits(uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// ln 2 in two parts: kLn2Hi has its low 21 bits zero (0x3fe62e42fee00000),
// so k * kLn2Hi is exact for |k| < 2^21.
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;

// 2^k for k in [-1074, 1023] (subnormal results below -1022).
inline double pow2(int k) {
  if (k >= -1022) return from_bits(static_cast<uint64_t>(k + 1023) << 52);
  return from_bits(uint64_t{1} << (k + 1074));
}

// Round half away from zero.
inline double round(double x) {
  const uint64_t u = bits(x);
  const int e = static_cast<int>((u >> 52) & 0x7ff) - 1023;
  if (e >= 52) return x;                                  // integral already, or inf / NaN
  if (e < -1) return from_bits(u & (uint64_t{1} << 63));  // |x| < 0.5: +-0
  if (e == -1) return from_bits((u & (uint64_t{1} << 63)) | bits(1.0));  // 0.5 <= |x| < 1
  // Clear the fraction bits below the units, after adding half a unit.
  const uint64_t half = uint64_t{1} << (51 - e);
  const uint64_t frac = (half << 1) - 1;
  return from_bits((u + half) & ~frac);
}

inline double exp(double x) {
  if (x != x) return x;
  if (x > 709.782712893384) return std::numeric_limits<double>::infinity();
  if (x < -745.1332191019412) return 0.0;
  // x = k ln2 + r, |r| <= ln2 / 2; ln2 in two parts so that k ln2 is exact.
  constexpr double kInvLn2 = 1.44269504088896338700e+00;
  const double kd = round(x * kInvLn2);
  const int k = static_cast<int>(kd);
  const double r = (x - kd * kLn2Hi) - kd * kLn2Lo;
  // exp(r) = 1 + (r + r^2 (1/2! + r (1/3! + ... r/14!))): the polynomial in
  // Horner form, and the 1 added last (one rounding of the result).
  double p = 1.0 / 87178291200.0;  // 1/14!
  constexpr double kInvFact[] = {1.0 / 2,       1.0 / 6,        1.0 / 24,        1.0 / 120,
                                 1.0 / 720,     1.0 / 5040,     1.0 / 40320,     1.0 / 362880,
                                 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800};
  for (int i = 11; i >= 0; --i) p = kInvFact[i] + r * p;
  const double sum = 1.0 + (r + r * r * p);
  // Scale by 2^k in two steps, so that neither factor over- or underflows
  // on its own.
  const int k1 = k / 2, k2 = k - k1;
  return sum * pow2(k1) * pow2(k2);
}

inline double log(double x) {
  if (x != x) return x;
  if (x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return x;
  // x = m 2^e with m in [sqrt(1/2), sqrt(2)).
  int e = 0;
  if (x < 0x1p-1022) {  // subnormal: scale up first
    x *= 0x1p54;
    e = -54;
  }
  const uint64_t u = bits(x);
  e += static_cast<int>((u >> 52) & 0x7ff) - 1023;
  double m = from_bits((u & ((uint64_t{1} << 52) - 1)) | bits(1.0));
  if (m > 1.4142135623730951) {
    m *= 0.5;
    ++e;
  }
  // log(1 + f) = 2 atanh(s), s = f / (2 + f): 2s = f - s f, so
  // log(1 + f) = f - s (f - R) with R = 2s^2/3 + 2s^4/5 + ... (|s| <= 0.1716):
  // f is exact and the correction is small against it.
  const double f = m - 1.0, s = f / (2.0 + f), s2 = s * s;
  double q = 2.0 / 41;
  for (int i = 39; i >= 3; i -= 2) q = 2.0 / i + s2 * q;
  const double R = s2 * q;
  return e * kLn2Hi + ((f - s * (f - R)) + e * kLn2Lo);
}

}  // namespace farmem::mathlite
