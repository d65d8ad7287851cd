// Registration and shape functions of the fused row optimizers
// (MxLazyAdamRows, MxAdagradRows, MxFtrlRows, MxSgdRows): one op sums the
// gradients of a batch's repeated rows and updates its distinct rows of a
// table variable and of its slot variables in one pass. Kernels in
// native/kernels/row_optimizer_kernels.cc; the math in
// native/core/row_optimizers.cc (no TF there). Used by the hash optimizers'
// `_update_rows` (mxrec_pipeline/optimizers). MxGatherByRestore: a lookup's
// per-id read of its distinct rows; MxSumByRestore: its gradient, summed per
// distinct row (core/restore_sum.py).
#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace mxrec {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// `handles` scalar resource handles, then rows [n] and grad [n, dim], then
// `scalars` scalars. No outputs.
Status RowUpdateShape(InferenceContext* c, int handles, int scalars) {
  for (int i = 0; i < handles; ++i) TF_RETURN_IF_ERROR(ScalarInput(c, i));
  ShapeHandle rows, grad;
  TF_RETURN_IF_ERROR(VectorInput(c, handles, &rows));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(handles + 1), 2, &grad));
  ::tensorflow::shape_inference::DimensionHandle unused;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(rows, 0), c->Dim(grad, 0), &unused));
  for (int i = 0; i < scalars; ++i) TF_RETURN_IF_ERROR(ScalarInput(c, handles + 2 + i));
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("MxLazyAdamRows")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("rows: int64")
    .Input("grad: float")
    .Input("lr_t: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Attr("epsilon_inside_sqrt: bool = false")
    .SetShapeFn([](InferenceContext* c) { return RowUpdateShape(c, 3, 4); })
    .Doc(R"doc(
Lazy Adam on rows `rows` of the float32 [capacity, dim] variables var, m and v,
in one pass: m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
var -= lr_t m / (sqrt(v) + epsilon), g = grad[i] for row rows[i]; with
epsilon_inside_sqrt (TPUEmbedding's sum_inside_sqrt) var -= lr_t m / sqrt(v + epsilon^2).

rows: [n] int64 in [0, capacity); a row may repeat: the gradients of its
  positions are summed first (as tf.unique + unsorted_segment_sum would).
grad: [n, dim] float32, grad[i] the gradient of rows[i].
lr_t: float32 scalar, lr * sqrt(1 - beta2^t) / (1 - beta1^t).
)doc");

REGISTER_OP("MxAdagradRows")
    .Input("var: resource")
    .Input("accumulator: resource")
    .Input("rows: int64")
    .Input("grad: float")
    .Input("lr: float")
    .SetShapeFn([](InferenceContext* c) { return RowUpdateShape(c, 2, 1); })
    .Doc(R"doc(
Adagrad on rows `rows`: accumulator += g^2; var -= lr g / sqrt(accumulator).
Inputs as MxLazyAdamRows.
)doc");

REGISTER_OP("MxFtrlRows")
    .Input("var: resource")
    .Input("accumulator: resource")
    .Input("linear: resource")
    .Input("rows: int64")
    .Input("grad: float")
    .Input("lr: float")
    .Input("power: float")
    .Input("l1: float")
    .Input("l2: float")
    .Input("l2_shrinkage: float")
    .SetShapeFn([](InferenceContext* c) { return RowUpdateShape(c, 3, 5); })
    .Doc(R"doc(
FTRL-Proximal on rows `rows` (TF's ApplyFtrlV2 math, power = -learning_rate_power);
see native/core/row_optimizers.h. Inputs as MxLazyAdamRows.
)doc");

REGISTER_OP("MxSgdRows")
    .Input("var: resource")
    .Input("rows: int64")
    .Input("grad: float")
    .Input("lr: float")
    .Input("weight_decay: float")
    .SetShapeFn([](InferenceContext* c) { return RowUpdateShape(c, 1, 2); })
    .Doc(R"doc(
SGD on rows `rows`: var -= lr (g + weight_decay var). Inputs as MxLazyAdamRows.
)doc");

REGISTER_OP("MxSumByRestore")
    .Input("grad: float")
    .Input("restore: int32")
    .Input("num_unique: int32")
    .Output("summed: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle grad, restore;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &restore));
      ::tensorflow::shape_inference::DimensionHandle unused, num_unique;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(grad, 0), c->Dim(restore, 0), &unused));
      TF_RETURN_IF_ERROR(ScalarInput(c, 2));
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &num_unique));
      c->set_output(0, c->Matrix(num_unique, c->Dim(grad, 1)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The gradients of a batch's ids summed per distinct row:
summed[u] = sum of grad[i] over the ids i with restore[i] == u, added in order
of i (the values of tf.math.unsorted_segment_sum(grad, restore, num_unique)),
by restore index instead of hashing, one range of rows per intra-op thread.
The gradient of core/lookup.py's per-id read of the distinct rows.

grad: [n, dim] float32, the ids' gradients.
restore: [n] int32 in [0, num_unique): each id's position among the distinct
  rows (key index insertion's restore indices); InvalidArgument otherwise.
num_unique: int32 scalar, the number of distinct rows.
summed: [num_unique, dim] float32 (zeros for a row without ids).
)doc");

REGISTER_OP("MxGatherByRestore")
    .Input("unique_emb: float")
    .Input("restore: int32")
    .Output("emb: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unique_emb, emb;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &unique_emb));
      TF_RETURN_IF_ERROR(c->Concatenate(c->input(1), c->Vector(c->Dim(unique_emb, 1)), &emb));
      c->set_output(0, emb);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Each id's embedding: emb[i] = unique_emb[restore[i]] (the values of
tf.gather(unique_emb, restore)), copied over ranges of the ids on the intra-op
threads into an output buffer the kernel reuses from step to step while no one
else holds it, so that a large per-id read does not map fresh pages each step.

unique_emb: [num_unique, dim] float32, the embeddings of a batch's distinct rows.
restore: [*ids_shape] int32 in [0, num_unique): each id's position among the
  distinct rows (key index insertion's restore indices); InvalidArgument otherwise.
emb: [*ids_shape, dim] float32.
)doc");

}  // namespace mxrec
