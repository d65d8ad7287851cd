// GoogleTest unit tests of the TF-free fused combiner (native/core/segment_combine.h),
// under ASan/UBSan by `make native-test`: hand-checked sums, means and sqrtn of
// segments with an empty one, their gradients, and a split of the segments over
// two calls writing the same output as one call.
#include "../core/segment_combine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace mxrec {
namespace {

// Four segments of dim 2: {a, b, c}, {}, {d}, {e, f}.
const std::vector<float> kValues = {1, 2, 3, -1, 0.5f, 0.5f, 4, 8, 2, 0, -2, 6};
const std::vector<int64_t> kSplits = {0, 3, 3, 4, 6};
constexpr int64_t kDim = 2, kSegments = 4;

std::vector<float> Combine(Combiner combiner) {
  std::vector<float> out(kSegments * kDim, -7.0f);
  SegmentCombine(combiner, kValues.data(), kSplits.data(), kDim, 0, kSegments, out.data());
  return out;
}

TEST(SegmentCombineTest, SumMeanSqrtnWithAnEmptySegment) {
  EXPECT_EQ(Combine(Combiner::kSum), (std::vector<float>{4.5f, 1.5f, 0, 0, 4, 8, 0, 6}));
  EXPECT_EQ(Combine(Combiner::kMean), (std::vector<float>{1.5f, 0.5f, 0, 0, 4, 8, 0, 3}));
  const float r3 = std::sqrt(3.0f), r2 = std::sqrt(2.0f);
  EXPECT_EQ(Combine(Combiner::kSqrtn),
            (std::vector<float>{4.5f / r3, 1.5f / r3, 0, 0, 4, 8, 0, 6 / r2}));
}

TEST(SegmentCombineTest, GradientDividesEachSegmentsGradientByItsNorm) {
  const std::vector<float> grad = {3, 6, 100, 100, -1, 2, 4, -8};
  for (Combiner combiner : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    std::vector<float> out(6 * kDim, -7.0f);
    SegmentCombineGrad(combiner, grad.data(), kSplits.data(), kDim, 0, kSegments, out.data());
    const float n3 = CombinerNorm(combiner, 3), n2 = CombinerNorm(combiner, 2);
    EXPECT_EQ(out, (std::vector<float>{3 / n3, 6 / n3, 3 / n3, 6 / n3, 3 / n3, 6 / n3, -1, 2,
                                       4 / n2, -8 / n2, 4 / n2, -8 / n2}));
  }
  EXPECT_EQ(CombinerNorm(Combiner::kMean, 3), 3.0f);
  EXPECT_EQ(CombinerNorm(Combiner::kSqrtn, 4), 2.0f);
  EXPECT_EQ(CombinerNorm(Combiner::kMean, 0), 1.0f);
  EXPECT_EQ(CombinerNorm(Combiner::kSum, 5), 1.0f);
}

TEST(SegmentCombineTest, SplitRangesWriteWhatOneCallWrites) {
  const std::vector<int32_t> splits(kSplits.begin(), kSplits.end());
  std::vector<float> out(kSegments * kDim, -7.0f);
  SegmentCombine(Combiner::kMean, kValues.data(), splits.data(), kDim, 0, 2, out.data());
  SegmentCombine(Combiner::kMean, kValues.data(), splits.data(), kDim, 2, kSegments, out.data());
  EXPECT_EQ(out, Combine(Combiner::kMean));
}

}  // namespace
}  // namespace mxrec
