// CPU kernel of MxRowInit: checks the globals and fills the [n, dim] output with
// mxrec::InitialRows (native/core/row_init.cc), split over TF's intra-op
// threads (rows are independent). CPU only: it runs in the host pipeline, and
// its callers place it on /CPU:0.
#include <cstdint>
#include <string>

#include "../core/row_init.h"
#include "resource_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/threadpool.h"

namespace mxrec {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

namespace {

// Estimated CPU cycles per element of `kind` (measured: about 5 ns for the
// normal kinds, 1 ns for uniform), for the sharding of rows over the intra-op
// threads.
int64_t CyclesPerElement(RowInitKind kind) {
  switch (kind) {
    case RowInitKind::kTruncatedNormal:
    case RowInitKind::kNormal:
      return 15;
    case RowInitKind::kUniform:
      return 3;
    case RowInitKind::kConstant:
      return 1;
  }
  return 15;
}

::tensorflow::Status ParseKind(const std::string& kind, RowInitKind* out) {
  if (kind == "truncated_normal") {
    *out = RowInitKind::kTruncatedNormal;
  } else if (kind == "normal") {
    *out = RowInitKind::kNormal;
  } else if (kind == "uniform") {
    *out = RowInitKind::kUniform;
  } else if (kind == "constant") {
    *out = RowInitKind::kConstant;
  } else {  // The attr's allowed values rule this out.
    return errors::InvalidArgument("MxRowInit: unknown kind '", kind, "'");
  }
  return ::tensorflow::OkStatus();
}

}  // namespace

class RowInitOp : public OpKernel {
 public:
  explicit RowInitOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    std::string kind;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kind", &kind));
    OP_REQUIRES_OK(ctx, ParseKind(kind, &spec_.kind));
    // float attrs: 32-bit, widened to double for the math.
    float mean, stddev, minval, maxval, value, scale;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("mean", &mean));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stddev", &stddev));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("minval", &minval));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("maxval", &maxval));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("value", &value));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale));
    int64_t seed;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed));
    spec_.mean = mean;
    spec_.stddev = stddev;
    spec_.minval = minval;
    spec_.maxval = maxval;
    spec_.value = value;
    spec_.scale = scale;
    spec_.seed = static_cast<uint64_t>(seed);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& globals = ctx->input(0);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsVector(globals.shape()),
                errors::InvalidArgument("MxRowInit: globals must be a vector, got shape ",
                                        globals.shape().DebugString()));
    const int64_t n = globals.NumElements();
    const int64_t* g = globals.flat<int64_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, g[i] >= 0,
                  errors::InvalidArgument("MxRowInit: globals must be >= 0, got ", g[i],
                                          " at position ", i));
    }
    TensorShape shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape({n, dim_}, &shape));
    Tensor* rows;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &rows));
    if (n == 0) return;
    float* out = rows->flat<float>().data();
    // Rows are independent: shards of them go to the intra-op threads.
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        n, dim_ * CyclesPerElement(spec_.kind), [this, g, out](int64_t begin, int64_t end) {
          InitialRows(spec_, g + begin, end - begin, dim_, out + begin * dim_);
        });
  }

 private:
  int64_t dim_;
  RowInitSpec spec_;
};

MXREC_REGISTER_CPU("MxRowInit", RowInitOp);

}  // namespace mxrec
