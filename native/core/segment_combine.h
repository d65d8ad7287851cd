// The sparse core's combiner over contiguous segments, fused: the ids of one
// position are the rows [row_splits[s], row_splits[s+1]) of a [n, dim] matrix
// (a tf.RaggedTensor's innermost partition), and each position gets
//   sum:   sum_i e_i
//   mean:  sum_i e_i / count
//   sqrtn: sum_i e_i / sqrt(count)
// (weights 1: tf.nn.embedding_lookup_sparse's and TPUEmbedding's combiners
// without weights; mxrec_pipeline/core/combiner.py holds the TF reference).
// Positions without ids give zeros. One pass forward, one pass backward,
// instead of the segment ids, two segment sums and a division of TF ops.
// No TensorFlow includes: native/kernels/segment_combine_kernels.cc wraps these.
#ifndef MXREC_PIPELINE_NATIVE_CORE_SEGMENT_COMBINE_H_
#define MXREC_PIPELINE_NATIVE_CORE_SEGMENT_COMBINE_H_

#include <cstdint>

namespace mxrec {

enum class Combiner { kSum, kMean, kSqrtn };

// The divisor of a segment of `count` ids: 1 (sum), count (mean) or
// sqrt(count) (sqrtn); 1 for a segment of at most one id. Outputs and
// gradients are divided by it, as TF's divide_no_nan(total, norm) and its
// gradient divide: one rounding, not a product with a rounded reciprocal.
float CombinerNorm(Combiner combiner, int64_t count);

// out[s] = (sum of values[row_splits[s] .. row_splits[s+1])) / norm(s) for
// s in [begin, end). values is [n, dim], out [num_segments, dim], both row-major;
// row_splits (num_segments + 1) is non-decreasing from 0 to n (callers check).
// Each output row is summed in the order of its ids, in float32 (as TF's
// segment sums on CPU). Segments are independent: callers may split [begin,
// end) over threads.
template <typename Split>
void SegmentCombine(Combiner combiner, const float* values, const Split* row_splits, int64_t dim,
                    int64_t begin, int64_t end, float* out);

// The gradient of SegmentCombine with respect to values: every id of segment
// s gets grad[s] / norm(s). grad is [num_segments, dim], values_grad [n, dim];
// writes the ids of segments [begin, end).
template <typename Split>
void SegmentCombineGrad(Combiner combiner, const float* grad, const Split* row_splits,
                        int64_t dim, int64_t begin, int64_t end, float* values_grad);

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_SEGMENT_COMBINE_H_
