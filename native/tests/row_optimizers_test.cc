// GoogleTest of the fused row optimizers against values computed by hand (in
// double, from the formulas in row_optimizers.h). Run under ASan/UBSan by
// `make native-test`.
#include "../core/row_optimizers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mxrec {
namespace {

TEST(SumRepeatedRowsTest, DistinctRowsAreLeftAsTheyAre) {
  const std::vector<int64_t> rows = {4, 0, 9};
  const std::vector<float> grad = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> unique = {7};
  std::vector<float> summed;
  EXPECT_FALSE(SumRepeatedRows(rows.data(), grad.data(), 3, 2, 10, &unique, &summed));
  EXPECT_TRUE(summed.empty());
}

// Capacity 6 checks distinctness with the bitmap, 1 << 30 (> 1024 n) by hashing.
class SumRepeatedRowsCapacityTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SumRepeatedRowsCapacityTest, RepeatedRowsSumInFirstOccurrenceOrder) {
  const int64_t capacity = GetParam();
  // Row 5 at positions 0, 2 and 3; row 2 at position 1.
  const std::vector<int64_t> rows = {5, 2, 5, 5};
  const std::vector<float> grad = {1, -1, 10, 20, 0.5f, 0.25f, 2, 4};
  std::vector<int64_t> unique;
  std::vector<float> summed;
  ASSERT_TRUE(SumRepeatedRows(rows.data(), grad.data(), 4, 2, capacity, &unique, &summed));
  EXPECT_EQ(unique, (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(summed, (std::vector<float>{3.5f, 3.25f, 10, 20}));
}

TEST_P(SumRepeatedRowsCapacityTest, DistinctRowsIncludingTheLastRowAreLeftAsTheyAre) {
  const int64_t capacity = GetParam();
  const std::vector<int64_t> rows = {capacity - 1, 0, 4, 1};
  const std::vector<float> grad = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int64_t> unique;
  std::vector<float> summed;
  EXPECT_FALSE(SumRepeatedRows(rows.data(), grad.data(), 4, 2, capacity, &unique, &summed));
}

INSTANTIATE_TEST_SUITE_P(BitmapAndHash, SumRepeatedRowsCapacityTest,
                         ::testing::Values(int64_t{6}, int64_t{1} << 30));

TEST(RowsAreDistinctTest, FindsARepeatAcrossBitmapWords) {
  const std::vector<int64_t> rows = {63, 64, 127, 0, 64};
  EXPECT_FALSE(RowsAreDistinct(rows.data(), 5, 128));
  EXPECT_TRUE(RowsAreDistinct(rows.data(), 4, 128));
  EXPECT_TRUE(RowsAreDistinct(rows.data(), 0, 0));
}

TEST(FindBadRestoreTest, ReportsTheFirstPositionOutOfRange) {
  const std::vector<int32_t> too_big = {0, 1, 2, 0};
  EXPECT_EQ(FindBadRestore(too_big.data(), 4, 2), 2);
  EXPECT_EQ(FindBadRestore(too_big.data(), 4, 3), -1);
  const std::vector<int32_t> negative = {0, -1, 1, 0};
  EXPECT_EQ(FindBadRestore(negative.data(), 4, 2), 1);
}

// restore {2, 0, 2, 2, 0}: value 0 at positions 1, 4; value 1 nowhere; value 2
// at 0, 2, 3.
TEST(SumByRestoreTest, SumsEachValuesRowsAndZerosValuesWithoutRows) {
  const std::vector<int32_t> restore = {2, 0, 2, 2, 0};
  const std::vector<float> grad = {1, 2, 10, 20, 0.5f, 0.25f, 3, 4, -10, -20};
  std::vector<float> summed(6, 99.0f);
  // Two ranges, as two threads would sum them.
  SumByRestore(grad.data(), restore.data(), 5, 2, 0, 1, summed.data());
  EXPECT_EQ(summed, (std::vector<float>{0, 0, 99, 99, 99, 99}));
  SumByRestore(grad.data(), restore.data(), 5, 2, 1, 3, summed.data());
  EXPECT_EQ(summed, (std::vector<float>{0, 0, 0, 0, 4.5f, 6.25f}));
}

// unique [3, 2]; restore {2, 0, 2, 1}: each id's row copied, in two ranges of
// ids as two threads would copy them; nothing outside the range written.
TEST(GatherByRestoreTest, CopiesEachIdsRowWithinItsRange) {
  const std::vector<float> unique = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> restore = {2, 0, 2, 1};
  std::vector<float> out(8, 99.0f);
  GatherByRestore(unique.data(), restore.data(), 2, 0, 1, out.data());
  EXPECT_EQ(out, (std::vector<float>{5, 6, 99, 99, 99, 99, 99, 99}));
  GatherByRestore(unique.data(), restore.data(), 2, 1, 4, out.data());
  EXPECT_EQ(out, (std::vector<float>{5, 6, 1, 2, 5, 6, 3, 4}));
}

// A [4, 2] table: rows 3 and 1 are updated, rows 0 and 2 must not change.
TEST(RowOptimizersTest, LazyAdamUpdatesOnlyTheGivenRows) {
  std::vector<float> var = {0, 0, 1, -1, 5, 5, 2, 3};
  std::vector<float> m = {0, 0, 0.5f, 0, 7, 7, 0, -0.2f};
  std::vector<float> v = {0, 0, 0.25f, 0, 7, 7, 0.04f, 0.01f};
  const std::vector<int64_t> rows = {3, 1};
  const std::vector<float> grad = {1, -2, 0.5f, 4};  // row 3: (1, -2); row 1: (0.5, 4)
  const float lr_t = 0.1f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  LazyAdamRows(var.data(), m.data(), v.data(), 2, rows.data(), grad.data(), 0, 2, lr_t, b1, b2,
               eps);
  // Row 3, column 0: m = 0.9*0 + 0.1*1 = 0.1; v = 0.999*0.04 + 0.001*1 = 0.04096;
  // var = 2 - 0.1 * 0.1 / (sqrt(0.04096) + 1e-8) = 2 - 0.01 / 0.2023858...
  EXPECT_NEAR(m[6], 0.1, 1e-7);
  EXPECT_NEAR(v[6], 0.04096, 1e-7);
  EXPECT_NEAR(var[6], 2 - 0.01 / (std::sqrt(0.04096) + 1e-8), 1e-6);
  // Row 3, column 1: m = 0.9*-0.2 + 0.1*-2 = -0.38; v = 0.999*0.01 + 0.001*4 = 0.01399.
  EXPECT_NEAR(m[7], -0.38, 1e-7);
  EXPECT_NEAR(v[7], 0.01399, 1e-7);
  EXPECT_NEAR(var[7], 3 + 0.1 * 0.38 / (std::sqrt(0.01399) + 1e-8), 1e-6);
  // Row 1: m = (0.9*0.5 + 0.05, 0.4) = (0.5, 0.4); v = (0.999*0.25 + 0.00025, 0.016).
  EXPECT_NEAR(m[2], 0.5, 1e-7);
  EXPECT_NEAR(m[3], 0.4, 1e-7);
  // float32, as TF computes it: 1 - 0.999f is 0.00099998713, so v is 2e-7 low.
  EXPECT_NEAR(v[2], 0.25, 1e-6);
  EXPECT_NEAR(v[3], 0.016, 1e-6);
  EXPECT_NEAR(var[2], 1 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-6);
  EXPECT_NEAR(var[3], -1 - 0.1 * 0.4 / (std::sqrt(0.016) + 1e-8), 1e-5);
  // Untouched rows.
  EXPECT_EQ(var[0], 0);
  EXPECT_EQ(var[4], 5);
  EXPECT_EQ(m[4], 7);
  EXPECT_EQ(v[5], 7);
}

TEST(RowOptimizersTest, LazyAdamWithEpsilonInsideTheSqrt) {
  std::vector<float> var = {1}, m = {0}, v = {0};
  const std::vector<int64_t> rows = {0};
  const std::vector<float> grad = {2};
  LazyAdamRows(var.data(), m.data(), v.data(), 1, rows.data(), grad.data(), 0, 1, 0.1f, 0.5f,
               0.75f, 0.5f, true);
  // m = 1, v = 0.25 * 4 = 1; var = 1 - 0.1 * 1 / sqrt(1 + 0.25).
  EXPECT_NEAR(var[0], 1 - 0.1 / std::sqrt(1.25), 1e-6);
}

TEST(RowOptimizersTest, RangesSplitTheBatch) {
  // Updating [0, 1) then [1, 2) equals updating [0, 2).
  std::vector<float> a = {1, 2, 3, 4}, b = a, ma(4, 0), va(4, 0), mb(4, 0), vb(4, 0);
  const std::vector<int64_t> rows = {1, 0};
  const std::vector<float> grad = {0.3f, -0.1f, 2, 1};
  LazyAdamRows(a.data(), ma.data(), va.data(), 2, rows.data(), grad.data(), 0, 2, 0.01f, 0.9f,
               0.99f, 1e-7f);
  LazyAdamRows(b.data(), mb.data(), vb.data(), 2, rows.data(), grad.data(), 0, 1, 0.01f, 0.9f,
               0.99f, 1e-7f);
  LazyAdamRows(b.data(), mb.data(), vb.data(), 2, rows.data(), grad.data(), 1, 2, 0.01f, 0.9f,
               0.99f, 1e-7f);
  EXPECT_EQ(a, b);
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(va, vb);
}

TEST(RowOptimizersTest, AdagradAndSgd) {
  std::vector<float> var = {1, 1, 2, 2}, acc = {0.9f, 0.9f, 0.1f, 0.1f};
  const std::vector<int64_t> rows = {1};
  const std::vector<float> grad = {0.5f, -1};
  AdagradRows(var.data(), acc.data(), 2, rows.data(), grad.data(), 0, 1, 0.1f);
  // acc = (0.1 + 0.25, 0.1 + 1) = (0.35, 1.1); var = 2 - 0.1 * g / sqrt(acc).
  EXPECT_NEAR(acc[2], 0.35, 1e-7);
  EXPECT_NEAR(acc[3], 1.1, 1e-7);
  EXPECT_NEAR(var[2], 2 - 0.05 / std::sqrt(0.35), 1e-6);
  EXPECT_NEAR(var[3], 2 + 0.1 / std::sqrt(1.1), 1e-6);
  EXPECT_EQ(var[0], 1);
  EXPECT_EQ(acc[0], 0.9f);
  std::vector<float> w = {1, 2, 3, 4};
  SgdRows(w.data(), 2, rows.data(), grad.data(), 0, 1, 0.5f, 0.1f);
  // var -= 0.5 * (g + 0.1 * var): (3 - 0.5 * 0.8, 4 - 0.5 * -0.6) = (2.6, 4.3).
  EXPECT_NEAR(w[2], 2.6, 1e-6);
  EXPECT_NEAR(w[3], 4.3, 1e-6);
  EXPECT_EQ(w[0], 1);
}

TEST(RowOptimizersTest, Ftrl) {
  // One row of dim 2: w = (0.5, -0.2), n = (0.1, 0.1), z = (0, 1), g = (1, 0.01).
  std::vector<float> var = {9, 9, 0.5f, -0.2f}, n = {9, 9, 0.1f, 0.1f}, z = {9, 9, 0, 1};
  const std::vector<int64_t> rows = {1};
  const std::vector<float> grad = {1, 0.01f};
  FtrlRows(var.data(), n.data(), z.data(), 2, rows.data(), grad.data(), 0, 1, 0.1f, 0.5f, 0.05f,
           0.01f, 0.0f);
  // Column 0: n_new = 1.1; z = 0 + 1 - (sqrt(1.1) - sqrt(0.1)) / 0.1 * 0.5;
  // w = (sign(z) * 0.05 - z) / (sqrt(1.1) / 0.1 + 0.02).
  const double z0 = 1 - (std::sqrt(1.1) - std::sqrt(0.1)) / 0.1 * 0.5;
  EXPECT_NEAR(n[2], 1.1, 1e-6);
  EXPECT_NEAR(z[2], z0, 1e-5);
  EXPECT_NEAR(var[2], ((z0 > 0 ? 1 : -1) * 0.05 - z0) / (std::sqrt(1.1) / 0.1 + 0.02), 1e-6);
  // Column 1: n_new = 0.1001; z = 1 + 0.01 - (sqrt(0.1001) - sqrt(0.1)) / 0.1 * -0.2.
  const double z1 = 1.01 + (std::sqrt(0.1001) - std::sqrt(0.1)) / 0.1 * 0.2;
  EXPECT_NEAR(z[3], z1, 1e-6);
  EXPECT_NEAR(var[3], (0.05 - z1) / (std::sqrt(0.1001) / 0.1 + 0.02), 1e-6);
  // |z| <= l1 gives 0; another power goes through pow.
  std::vector<float> w2 = {1}, n2 = {1}, z2 = {0};
  const std::vector<int64_t> row0 = {0};
  const std::vector<float> tiny = {0.01f};
  FtrlRows(w2.data(), n2.data(), z2.data(), 1, row0.data(), tiny.data(), 0, 1, 1.0f, 0.25f, 1.0f,
           0.0f, 0.0f);
  EXPECT_EQ(w2[0], 0.0f);
  EXPECT_NEAR(z2[0], 0.01 - (std::pow(1.0001, 0.25) - 1.0), 1e-7);
  EXPECT_EQ(var[0], 9);
  EXPECT_EQ(n[1], 9);
}

}  // namespace
}  // namespace mxrec
