// preload/mathlite.h against libm: exp and log within 2 ulp over their
// whole range (special cases exact), round exact.
#include "preload/mathlite.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace farmem::mathlite {
namespace {

// Distance in ulps between two finite doubles of the same sign.
uint64_t ulps(double a, double b) {
  const uint64_t x = bits(a), y = bits(b);
  return x > y ? x - y : y - x;
}

TEST(MathLite, ExpWithinTwoUlpAndSpecialCases) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> wide(-745.0, 709.7), narrow(-2.0, 2.0);
  uint64_t worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? wide(rng) : narrow(rng);
    const double want = std::exp(x);
    if (want < 0x1p-1022) {  // subnormal: two roundings, a looser bound
      EXPECT_LE(std::fabs(exp(x) - want), 0x1p-1073) << x;
      continue;
    }
    const uint64_t d = ulps(exp(x), want);
    worst = d > worst ? d : worst;
    ASSERT_LE(d, 2u) << "exp(" << x << ") = " << exp(x) << ", libm " << want;
  }
  printf("exp: worst %llu ulp\n", static_cast<unsigned long long>(worst));
  EXPECT_EQ(exp(0.0), 1.0);
  EXPECT_EQ(exp(710.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(exp(-746.0), 0.0);
  EXPECT_EQ(exp(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(exp(std::numeric_limits<double>::infinity()), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(exp(std::numeric_limits<double>::quiet_NaN())));
}

TEST(MathLite, LogWithinTwoUlpAndSpecialCases) {
  std::mt19937_64 rng(2);
  uint64_t worst = 0;
  for (int i = 0; i < 200000; ++i) {
    // Every binade, subnormals included, and values near 1.
    double x = i % 3 ? from_bits(rng() % bits(std::numeric_limits<double>::max()) + 1)
                     : 1.0 + std::ldexp(static_cast<double>(rng() % 2000000) - 1e6, -20);
    if (!(x > 0)) continue;
    const double want = std::log(x);
    const uint64_t d = want == 0 ? (log(x) == 0 ? 0 : 99) : ulps(log(x), want);
    worst = d > worst ? d : worst;
    ASSERT_LE(d, 2u) << "log(" << x << ") = " << log(x) << ", libm " << want;
  }
  printf("log: worst %llu ulp\n", static_cast<unsigned long long>(worst));
  EXPECT_EQ(log(1.0), 0.0);
  EXPECT_EQ(log(0.0), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(log(-1.0)));
  EXPECT_EQ(log(std::numeric_limits<double>::infinity()), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(log(std::numeric_limits<double>::quiet_NaN())));
}

TEST(MathLite, RoundIsExact) {
  const double cases[] = {0.0,
                          -0.0,
                          0.49999999999999994,
                          0.5,
                          -0.5,
                          1.5,
                          2.5,
                          -2.5,
                          3.7,
                          -3.2,
                          1e300,
                          -1e300,
                          0x1p52,
                          0x1p52 + 1,
                          0x1p51 + 0.5,
                          4503599627370495.5,
                          std::numeric_limits<double>::infinity()};
  for (double x : cases) {
    EXPECT_EQ(bits(round(x)), bits(std::round(x))) << x;
  }
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> d(-1e6, 1e6);
  for (int i = 0; i < 100000; ++i) {
    const double x = i % 2 ? d(rng) : std::ldexp(d(rng), -20);
    ASSERT_EQ(bits(round(x)), bits(std::round(x))) << x;
  }
  EXPECT_TRUE(std::isnan(round(std::numeric_limits<double>::quiet_NaN())));
}

}  // namespace
}  // namespace farmem::mathlite
