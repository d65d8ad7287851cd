// GoogleTest unit tests of the TF-free row initializer (native/core/row_init.h).
// Run under ASan/UBSan by `make native-test`: the SplitMix64 counter scheme
// against reference outputs, per-element independence from the rest of the
// call, the moments of each distribution over ~200k values, and Ndtri against
// known quantiles and std::erfc.
#include "../core/row_init.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace mxrec {
namespace {

constexpr double kTwoToMinus53 = 1.0 / 9007199254740992.0;
constexpr double kSqrt2Pi = 2.5066282746310002;  // sqrt(2 pi)

RowInitSpec Spec(RowInitKind kind, uint64_t seed = 42) {
  RowInitSpec spec;
  spec.kind = kind;
  spec.mean = 0.0;
  spec.stddev = 1.0;
  spec.minval = 0.0;
  spec.maxval = 1.0;
  spec.value = 0.0;
  spec.scale = 1.0;
  spec.seed = seed;
  return spec;
}

std::vector<float> Rows(const RowInitSpec& spec, const std::vector<int64_t>& globals,
                        int64_t dim) {
  std::vector<float> out(globals.size() * dim, -12345.0f);
  InitialRows(spec, globals.data(), globals.size(), dim, out.data());
  return out;
}

// Globals 0..n-1.
std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> globals(n);
  for (int64_t i = 0; i < n; ++i) globals[i] = i;
  return globals;
}

struct Moments {
  double mean;
  double stddev;
  float min;
  float max;
};

Moments MomentsOf(const std::vector<float>& values) {
  double sum = 0, sum_sq = 0;
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (float v : values) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const double n = static_cast<double>(values.size());
  const double mean = sum / n;
  return {mean, std::sqrt(sum_sq / n - mean * mean), lo, hi};
}

// The standard normal CDF.
double Phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// 200,000 values: 6,250 rows of 32.
constexpr int64_t kRows = 6250;
constexpr int64_t kDim = 32;

TEST(RowInitUniformTest, IsSplitMix64OfTheCounter) {
  // The first outputs of the reference SplitMix64 seeded with 0 (its state
  // after c steps is c * 0x9E3779B97F4A7C15).
  const uint64_t reference[] = {0xE220A8397B1DCDAFULL, 0x6E789E6AA1B965F4ULL,
                                0x06C45D188009454FULL};
  for (uint64_t c = 1; c <= 3; ++c) {
    const double expected =
        (static_cast<double>(reference[c - 1] >> 11) + 0.5) * kTwoToMinus53;
    EXPECT_NEAR(RowInitUniform(0, c), expected, 1e-15) << "counter " << c;
  }
  // The seed is added to the state: seed s at counter c is seed 0 at a state
  // s further on; with s = 0x9E3779B97F4A7C15, counter c + 1.
  EXPECT_EQ(RowInitUniform(0x9E3779B97F4A7C15ULL, 1), RowInitUniform(0, 2));
}

TEST(RowInitUniformTest, StrictlyInsideTheUnitInterval) {
  for (uint64_t c = 0; c < 100000; ++c) {
    const double u = RowInitUniform(7, c);
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(InitialRowsTest, ElementIsTheUniformOfItsCounter) {
  // uniform on [0, 1): element (g, j) is float(u(seed, g * dim + j)).
  const RowInitSpec spec = Spec(RowInitKind::kUniform, 99);
  const std::vector<int64_t> globals = {0, 3, 1000000007, int64_t{1} << 60};
  const int64_t dim = 5;
  const std::vector<float> out = Rows(spec, globals, dim);
  for (size_t i = 0; i < globals.size(); ++i) {
    for (int64_t j = 0; j < dim; ++j) {
      const uint64_t counter = static_cast<uint64_t>(globals[i]) * dim + j;
      EXPECT_EQ(out[i * dim + j], static_cast<float>(RowInitUniform(99, counter)))
          << "global " << globals[i] << " column " << j;
    }
  }
}

TEST(InitialRowsTest, NormalKindsAreNdtriOfTheUniform) {
  // Element (g, j) is mean + stddev * Ndtri(u) (normal) or Ndtri of u mapped
  // into [Phi(-2), Phi(2)] (truncated), to float rounding; dims 3 and 150 (rows
  // of several blocks of the fill loop).
  const double low = Phi(-2.0);
  for (int64_t dim : {3, 150}) {
    for (RowInitKind kind : {RowInitKind::kNormal, RowInitKind::kTruncatedNormal}) {
      RowInitSpec spec = Spec(kind, 2024);
      spec.mean = 0.25;
      spec.stddev = 0.5;
      spec.scale = 3.0;
      const std::vector<int64_t> globals = {0, 17, 999999, int64_t{1} << 50};
      const std::vector<float> out = Rows(spec, globals, dim);
      for (size_t i = 0; i < globals.size(); ++i) {
        for (int64_t j = 0; j < dim; ++j) {
          const double u = RowInitUniform(2024, static_cast<uint64_t>(globals[i]) * dim + j);
          const double z = kind == RowInitKind::kNormal ? Ndtri(u)
                                                        : Ndtri(low + u * (1.0 - 2.0 * low));
          const double expected = (0.25 + 0.5 * z) * 3.0;
          ASSERT_NEAR(out[i * dim + j], expected, 1e-6 * std::max(1.0, std::fabs(expected)))
              << "global " << globals[i] << " column " << j << " dim " << dim;
        }
      }
    }
  }
}

TEST(InitialRowsTest, Deterministic) {
  for (RowInitKind kind : {RowInitKind::kTruncatedNormal, RowInitKind::kNormal,
                           RowInitKind::kUniform, RowInitKind::kConstant}) {
    const RowInitSpec spec = Spec(kind, 1234);
    const std::vector<int64_t> globals = {9, 2, 77, 2, 0};
    EXPECT_EQ(Rows(spec, globals, 8), Rows(spec, globals, 8));
  }
}

TEST(InitialRowsTest, RowDependsOnlyOnItsGlobal) {
  const int64_t dim = 6;
  const std::vector<int64_t> globals = {5,   0,   123456789012LL, 7, 5,
                                        (int64_t{1} << 62) + 3, 1};
  for (RowInitKind kind : {RowInitKind::kTruncatedNormal, RowInitKind::kNormal,
                           RowInitKind::kUniform}) {
    const RowInitSpec spec = Spec(kind, 0xDEADBEEFCAFEULL);
    const std::vector<float> together = Rows(spec, globals, dim);
    for (size_t i = 0; i < globals.size(); ++i) {
      const std::vector<float> alone = Rows(spec, {globals[i]}, dim);
      const std::vector<float> row(together.begin() + i * dim, together.begin() + (i + 1) * dim);
      EXPECT_EQ(row, alone) << "global " << globals[i];
    }
    // And of the call's length: a prefix of rows 0..99 is rows 0..9.
    const std::vector<float> hundred = Rows(spec, Range(100), dim);
    const std::vector<float> ten = Rows(spec, Range(10), dim);
    EXPECT_EQ(std::vector<float>(hundred.begin(), hundred.begin() + 10 * dim), ten);
  }
}

TEST(InitialRowsTest, SeedsColumnsAndRowsDiffer) {
  const std::vector<float> a = Rows(Spec(RowInitKind::kNormal, 1), Range(4), 8);
  const std::vector<float> b = Rows(Spec(RowInitKind::kNormal, 2), Range(4), 8);
  EXPECT_NE(a, b);
  int equal = 0;
  for (size_t i = 1; i < a.size(); ++i) equal += a[i] == a[i - 1];
  EXPECT_EQ(equal, 0);
}

TEST(InitialRowsTest, NoRowsWritesNothing) {
  float sentinel = 3.0f;
  InitialRows(Spec(RowInitKind::kNormal), nullptr, 0, 4, &sentinel);
  EXPECT_EQ(sentinel, 3.0f);
}

TEST(InitialRowsTest, UniformWithinMinvalMaxval) {
  RowInitSpec spec = Spec(RowInitKind::kUniform, 5);
  spec.minval = -0.05;
  spec.maxval = 0.05;
  const std::vector<float> values = Rows(spec, Range(kRows), kDim);
  const Moments m = MomentsOf(values);
  EXPECT_GE(m.min, static_cast<float>(spec.minval));
  EXPECT_LT(m.max, static_cast<float>(spec.maxval));
  EXPECT_LT(m.min, -0.0499f);
  EXPECT_GT(m.max, 0.0499f);
  EXPECT_NEAR(m.mean, 0.0, 0.001);
  EXPECT_NEAR(m.stddev, 0.1 / std::sqrt(12.0), 0.0005);
}

TEST(InitialRowsTest, UniformStaysBelowMaxvalInFloat) {
  // [1 - 2^-23, 1) holds two floats, 1 - 2^-23 and 1 - 2^-24; a quarter of the
  // doubles in it round to 1.0f, which must not occur.
  RowInitSpec spec = Spec(RowInitKind::kUniform, 8);
  spec.minval = 1.0 - std::ldexp(1.0, -23);
  spec.maxval = 1.0;
  int64_t top = 0;
  for (float v : Rows(spec, Range(100), 10)) {
    ASSERT_GE(v, static_cast<float>(spec.minval));
    ASSERT_LT(v, 1.0f);
    top += v == static_cast<float>(1.0 - std::ldexp(1.0, -24));
  }
  EXPECT_GT(top, 500);  // The doubles that rounded to 1.0f are here.
  // An empty range gives minval.
  spec.minval = spec.maxval = 0.25;
  for (float v : Rows(spec, Range(10), 10)) ASSERT_EQ(v, 0.25f);
}

TEST(InitialRowsTest, TruncatedNormalWithinTwoStddev) {
  RowInitSpec spec = Spec(RowInitKind::kTruncatedNormal, 11);
  spec.mean = 0.5;
  spec.stddev = 2.0;
  const std::vector<float> values = Rows(spec, Range(kRows), kDim);
  const Moments m = MomentsOf(values);
  EXPECT_GE(m.min, -3.5f);
  EXPECT_LE(m.max, 4.5f);
  EXPECT_LT(m.min, -3.49f);  // The truncation points are reached.
  EXPECT_GT(m.max, 4.49f);
  // A normal truncated at 2 sigma: mean unchanged, stddev 0.8796 sigma.
  EXPECT_NEAR(m.mean, 0.5, 0.02);
  EXPECT_NEAR(m.stddev, 0.8796 * 2.0, 0.01);
  // Its density at the edges is exp(-2) of the centre's: compare the share of
  // values in the outer and inner 0.1 sigma bins.
  int64_t outer = 0, inner = 0;
  for (float v : values) {
    const double z = (v - 0.5) / 2.0;
    outer += std::fabs(z) > 1.9;
    inner += std::fabs(z) < 0.1;
  }
  EXPECT_NEAR(static_cast<double>(outer) / inner, (Phi(2) - Phi(1.9)) / (Phi(0.1) - 0.5), 0.02);
}

TEST(InitialRowsTest, NormalMoments) {
  RowInitSpec spec = Spec(RowInitKind::kNormal, 12);
  spec.mean = -1.0;
  spec.stddev = 0.5;
  const std::vector<float> values = Rows(spec, Range(kRows), kDim);
  const Moments m = MomentsOf(values);
  EXPECT_NEAR(m.mean, -1.0, 0.005);
  EXPECT_NEAR(m.stddev, 0.5, 0.005);
  int64_t beyond2 = 0, beyond3 = 0;
  for (float v : values) {
    beyond2 += std::fabs(v + 1.0) > 2 * 0.5;
    beyond3 += std::fabs(v + 1.0) > 3 * 0.5;
  }
  const double n = static_cast<double>(values.size());
  EXPECT_NEAR(beyond2 / n, 2 * Phi(-2), 0.003);
  EXPECT_NEAR(beyond3 / n, 2 * Phi(-3), 0.001);
}

TEST(InitialRowsTest, ConstantAndScale) {
  RowInitSpec spec = Spec(RowInitKind::kConstant);
  spec.value = 0.25;
  spec.scale = 3.0;
  for (float v : Rows(spec, {4, 0, 9}, 7)) ASSERT_EQ(v, 0.75f);
  // Doubling is exact, so scale 2 is twice scale 1 to the bit.
  for (RowInitKind kind : {RowInitKind::kTruncatedNormal, RowInitKind::kNormal,
                           RowInitKind::kUniform}) {
    RowInitSpec one = Spec(kind, 77), two = Spec(kind, 77);
    two.scale = 2.0;
    const std::vector<float> a = Rows(one, Range(50), 16), b = Rows(two, Range(50), 16);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(2.0f * a[i], b[i]) << i;
  }
}

TEST(NdtriTest, KnownValues) {
  EXPECT_NEAR(Ndtri(0.975), 1.959963984540054, 1e-9);
  EXPECT_NEAR(Ndtri(0.025), -1.959963984540054, 1e-9);
  EXPECT_EQ(Ndtri(0.5), 0.0);
  EXPECT_NEAR(Ndtri(0.8413447460685429), 1.0, 1e-9);  // Phi(1).
  EXPECT_NEAR(Ndtri(1e-10), -6.361340902404056, 1e-9);
  EXPECT_NEAR(Ndtri(1 - 1e-10), 6.361340902404056, 1e-6);  // 1 - 1e-10 is inexact.
  EXPECT_NEAR(Ndtri(0.5 * std::erfc(std::sqrt(2.0))), -2.0, 1e-12);
}

TEST(NdtriTest, Symmetric) {
  // 1 - p is rounded here, by at most 2^-54: x moves by that over the density.
  for (double p : {1e-5, 0.01, 0.0228, 0.075, 0.1, 0.3, 0.49}) {
    EXPECT_NEAR(Ndtri(p), -Ndtri(1.0 - p), 1e-11) << p;
  }
  for (double p : {0.5, 0.625, 0.75, 0.875, 0.9375}) {  // 1 - p exact: exactly opposite.
    EXPECT_EQ(Ndtri(p), -Ndtri(1.0 - p)) << p;
  }
}

TEST(NdtriTest, InvertsTheNormalCdf) {
  // From 1e-300 to 1/2 (the lower half, where Phi(x) = erfc(-x / sqrt 2) / 2 is
  // accurate to the ulp), x is within 1e-12 of its Newton refinement, and
  // Phi(x) == p to a relative 1e-13 |x| (an error dx in x moves Phi(x) by a
  // relative |x| dx in the tail).
  for (double p = 1e-300; p <= 0.5; p *= 1.07) {
    const double x = Ndtri(p);
    const double density = std::exp(-0.5 * x * x) / kSqrt2Pi;
    ASSERT_NEAR((Phi(x) - p) / density, 0.0, 1e-12) << "p " << p;
    ASSERT_NEAR(Phi(x) / p, 1.0, 1e-13 * std::max(1.0, std::fabs(x))) << "p " << p;
  }
  // The centre, linearly.
  for (double p = 0.001; p < 1.0; p += 0.001) {
    const double x = Ndtri(p);
    ASSERT_NEAR(Phi(x), p, 1e-15) << "p " << p;
  }
}

TEST(NdtriTest, Edges) {
  EXPECT_EQ(Ndtri(0.0), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(Ndtri(1.0), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(Ndtri(-0.1)));
  EXPECT_TRUE(std::isnan(Ndtri(1.5)));
  EXPECT_TRUE(std::isnan(Ndtri(std::numeric_limits<double>::quiet_NaN())));
  EXPECT_TRUE(std::isfinite(Ndtri(std::numeric_limits<double>::denorm_min())));
}

}  // namespace
}  // namespace mxrec
