// Registration and shape function of MxRowInit, the initial rows of a
// RowInitializer (mxrec_pipeline/core/initializers.py). Kernel in
// native/kernels/row_init_kernels.cc; the math in native/core/row_init.cc (no TF
// there).
#include <cstdint>

#include "common.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace mxrec {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("MxRowInit")
    .Input("globals: int64")
    .Output("rows: float")
    .Attr("dim: int >= 1")
    .Attr("kind: {'truncated_normal', 'normal', 'uniform', 'constant'}")
    .Attr("mean: float = 0")
    .Attr("stddev: float = 1")
    .Attr("minval: float = 0")
    .Attr("maxval: float = 1")
    .Attr("value: float = 0")
    .Attr("scale: float = 1")
    .Attr("seed: int = 0")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle globals;
      TF_RETURN_IF_ERROR(VectorInput(c, 0, &globals));
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(globals, 0), dim));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Initial rows of global rows `globals`: row i depends only on (seed, globals[i],
the attrs), never on the other globals or their number, so a flat table (rows
0..n-1 at once) and a tiered table (each row when its id first reaches the
device) start a key from the same values. Stateless and deterministic.

Element (g, j) is SplitMix64 at counter g * dim + j mapped to a uniform u in
(0, 1), then by `kind`: "uniform" minval + u (maxval - minval), in [minval,
maxval); "truncated_normal" the normal of `mean` and `stddev` truncated at 2
stddev, by inversion; "normal" mean + stddev Phi^-1(u); "constant" `value`.
Every value is then multiplied by `scale` (see native/core/row_init.h).

The float attrs are 32-bit floats: a Python float passed in is rounded to
float32 (mean, stddev, minval, maxval, value, scale); the math is in double.

globals: [n] int64 global rows, each >= 0.
rows: [n, dim] float32.
dim: columns per row.
seed: the table's 64-bit seed, as a signed int64 (its bits are used).
)doc");

}  // namespace mxrec
