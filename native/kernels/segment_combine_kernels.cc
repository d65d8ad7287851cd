// CPU kernels of MxSegmentCombine and MxSegmentCombineGrad: check the inputs
// (errors name the op and the bad value) and run mxrec::SegmentCombine /
// SegmentCombineGrad (native/core/segment_combine.cc) over TF's intra-op
// threads, split by segment.
#include <cstdint>
#include <string>

#include "../core/segment_combine.h"
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
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

namespace {

Status ParseCombiner(const std::string& name, Combiner* out) {
  if (name == "sum") {
    *out = Combiner::kSum;
  } else if (name == "mean") {
    *out = Combiner::kMean;
  } else if (name == "sqrtn") {
    *out = Combiner::kSqrtn;
  } else {  // The attr's allowed values rule this out.
    return errors::InvalidArgument("unknown combiner '", name, "'");
  }
  return ::tensorflow::OkStatus();
}

// row_splits must be a vector of at least one element, from 0, non-decreasing,
// ending at `n` (n < 0: any end, returned in *n).
template <typename Split>
Status CheckRowSplits(const char* op, const Tensor& row_splits, int64_t* n) {
  if (!::tensorflow::TensorShapeUtils::IsVector(row_splits.shape()) ||
      row_splits.NumElements() < 1) {
    return errors::InvalidArgument(op, ": row_splits must be a vector of at least one element, "
                                   "got shape ", row_splits.shape().DebugString());
  }
  const auto splits = row_splits.flat<Split>();
  const int64_t size = splits.size();
  if (splits(0) != 0) {
    return errors::InvalidArgument(op, ": row_splits must start at 0, got ", splits(0));
  }
  for (int64_t s = 1; s < size; ++s) {
    if (splits(s) < splits(s - 1)) {
      return errors::InvalidArgument(op, ": row_splits must be non-decreasing, got ",
                                     splits(s - 1), " then ", splits(s), " at position ", s);
    }
  }
  if (*n >= 0 && splits(size - 1) != *n) {
    return errors::InvalidArgument(op, ": row_splits must end at the number of values, ", *n,
                                   ", got ", splits(size - 1));
  }
  *n = splits(size - 1);
  return ::tensorflow::OkStatus();
}

// Runs fn(begin, end) over [0, segments), split over the intra-op threads
// when there is enough work (`cost` cycles per segment).
template <typename Fn>
void ForSegments(OpKernelContext* ctx, int64_t segments, int64_t cost, Fn fn) {
  ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(segments, cost, fn);
}

}  // namespace

template <typename Split>
class SegmentCombineOp : public OpKernel {
 public:
  explicit SegmentCombineOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string combiner;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &combiner));
    OP_REQUIRES_OK(ctx, ParseCombiner(combiner, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& row_splits = ctx->input(1);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsMatrix(values.shape()),
                errors::InvalidArgument("MxSegmentCombine: values must be a matrix [n, dim], "
                                        "got shape ", values.shape().DebugString()));
    int64_t n = values.dim_size(0);
    OP_REQUIRES_OK(ctx, CheckRowSplits<Split>("MxSegmentCombine", row_splits, &n));
    const int64_t dim = values.dim_size(1), segments = row_splits.NumElements() - 1;
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({segments, dim}), &out));
    if (segments == 0 || dim == 0) return;
    const float* v = values.flat<float>().data();
    const Split* splits = row_splits.flat<Split>().data();
    float* o = out->flat<float>().data();
    const int64_t cost = dim * (2 + n / segments);
    ForSegments(ctx, segments, cost, [&](int64_t begin, int64_t end) {
      SegmentCombine(combiner_, v, splits, dim, begin, end, o);
    });
  }

 private:
  Combiner combiner_;
};

template <typename Split>
class SegmentCombineGradOp : public OpKernel {
 public:
  explicit SegmentCombineGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string combiner;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &combiner));
    OP_REQUIRES_OK(ctx, ParseCombiner(combiner, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& row_splits = ctx->input(1);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsMatrix(grad.shape()),
                errors::InvalidArgument("MxSegmentCombineGrad: grad must be a matrix "
                                        "[num_segments, dim], got shape ",
                                        grad.shape().DebugString()));
    int64_t n = -1;
    OP_REQUIRES_OK(ctx, CheckRowSplits<Split>("MxSegmentCombineGrad", row_splits, &n));
    const int64_t dim = grad.dim_size(1), segments = row_splits.NumElements() - 1;
    OP_REQUIRES(ctx, grad.dim_size(0) == segments,
                errors::InvalidArgument("MxSegmentCombineGrad: grad has ", grad.dim_size(0),
                                        " rows, row_splits ", segments, " segments"));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim}), &out));
    if (n == 0 || dim == 0) return;
    const float* g = grad.flat<float>().data();
    const Split* splits = row_splits.flat<Split>().data();
    float* o = out->flat<float>().data();
    const int64_t cost = dim * (2 + n / segments);
    ForSegments(ctx, segments, cost, [&](int64_t begin, int64_t end) {
      SegmentCombineGrad(combiner_, g, splits, dim, begin, end, o);
    });
  }

 private:
  Combiner combiner_;
};

#define MXREC_REGISTER_SEGMENT_COMBINE(Split)                                              \
  REGISTER_KERNEL_BUILDER(Name("MxSegmentCombine")                                         \
                              .Device(::tensorflow::DEVICE_CPU)                            \
                              .TypeConstraint<Split>("Tsplits"),                           \
                          SegmentCombineOp<Split>);                                        \
  REGISTER_KERNEL_BUILDER(Name("MxSegmentCombineGrad")                                     \
                              .Device(::tensorflow::DEVICE_CPU)                            \
                              .TypeConstraint<Split>("Tsplits"),                           \
                          SegmentCombineGradOp<Split>)

MXREC_REGISTER_SEGMENT_COMBINE(int32_t);
MXREC_REGISTER_SEGMENT_COMBINE(int64_t);

}  // namespace mxrec
