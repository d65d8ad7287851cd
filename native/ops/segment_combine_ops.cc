// Registration and shape functions of MxSegmentCombine and its gradient
// MxSegmentCombineGrad: the sparse core's combiner (sum, mean, sqrtn; no
// weights) over a ragged tensor's innermost rows. Kernels in
// native/kernels/segment_combine_kernels.cc; the math in
// native/core/segment_combine.cc (no TF there); the gradient is registered in
// mxrec_pipeline/core/combiner.py.
#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace mxrec {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// [num_segments = len(row_splits) - 1, dim of input `matrix`].
Status SegmentsShape(InferenceContext* c, int matrix, int splits, DimensionHandle rows) {
  ShapeHandle values, row_splits;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(matrix), 2, &values));
  TF_RETURN_IF_ERROR(VectorInput(c, splits, &row_splits));
  c->set_output(0, c->Matrix(rows, c->Dim(values, 1)));
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("MxSegmentCombine")
    .Input("values: float")
    .Input("row_splits: Tsplits")
    .Output("combined: float")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .Attr("Tsplits: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle row_splits;  // rank checked before its length is read
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &row_splits));
      DimensionHandle segments;
      TF_RETURN_IF_ERROR(c->Subtract(c->Dim(row_splits, 0), 1, &segments));
      return SegmentsShape(c, 0, 1, segments);
    })
    .Doc(R"doc(
The combiner over contiguous segments: combined[s] is the sum of
values[row_splits[s] .. row_splits[s+1]) divided by 1 ("sum"), the segment's
id count ("mean") or its square root ("sqrtn"); zeros for an empty segment.
As mxrec_pipeline.core.combiner.combine of a tf.RaggedTensor without weights
(tf.nn.embedding_lookup_sparse's combiners).

values: [n, dim] float32, the ids' embeddings.
row_splits: [num_segments + 1] int32/int64, from 0 to n, non-decreasing (a
  ragged tensor's innermost row_splits).
combined: [num_segments, dim] float32.
)doc");

REGISTER_OP("MxSegmentCombineGrad")
    .Input("grad: float")
    .Input("row_splits: Tsplits")
    .Output("values_grad: float")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .Attr("Tsplits: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) -> Status {
      return SegmentsShape(c, 0, 1, c->UnknownDim());
    })
    .Doc(R"doc(
The gradient of MxSegmentCombine with respect to its values: every id of
segment s gets grad[s] divided by the segment's norm (1, count or sqrt(count)).

grad: [num_segments, dim] float32, the gradient of `combined`.
row_splits: [num_segments + 1], as for MxSegmentCombine.
values_grad: [n, dim] float32, n = row_splits[num_segments].
)doc");

}  // namespace mxrec
