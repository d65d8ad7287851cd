// CPU kernels of the fused row optimizers (native/ops/row_optimizer_ops.cc):
// look up the resource variables, make them safe to update in place (TF's
// EnsureSparseVariableAccess, as its ResourceScatter* and sparse apply ops do),
// lock their mutexes exclusively in address order, check the rows and shapes,
// sum the gradients of repeated rows, and run native/core/row_optimizers.cc
// over shards of the distinct rows on TF's intra-op threads; and the kernels
// of a lookup's per-id read (MxGatherByRestore) and of its gradient summed
// per distinct row (MxSumByRestore). CPU only: the tables live on the host
// here. (GPU-ready structure: the per-row math is TF-free and takes
// [begin, end) ranges.)
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "../core/row_optimizers.h"
#include "resource_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/kernels/training_op_helpers.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/threadpool.h"

namespace mxrec {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::Var;
namespace errors = ::tensorflow::errors;

namespace {

// Cycles per element of a row update (a sqrt and a division at most).
constexpr int64_t kCyclesPerElement = 20;
// ... and of a row copy (MxGatherByRestore), from a row read at random.
constexpr int64_t kCopyCyclesPerElement = 2;

// The first `count` inputs' variables, locked for the update, with their
// float32 [capacity, dim] buffers. `name` names the op in errors.
class LockedVariables {
 public:
  ::tensorflow::Status Lock(OpKernelContext* ctx, int count, const char* name) {
    vars_.resize(count);
    for (int i = 0; i < count; ++i) {
      TF_RETURN_IF_ERROR(
          ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, i), &vars_[i]));
      // Copies the buffer first if a reader still holds it (copy on write).
      TF_RETURN_IF_ERROR((::tensorflow::EnsureSparseVariableAccess<Eigen::ThreadPoolDevice, float>(
          ctx, vars_[i].get())));
    }
    std::vector<::tensorflow::mutex*> mus;
    for (const auto& var : vars_) mus.push_back(var->mu());
    std::sort(mus.begin(), mus.end());
    mus.erase(std::unique(mus.begin(), mus.end()), mus.end());
    for (::tensorflow::mutex* mu : mus) locks_.push_back(std::make_unique<::tensorflow::mutex_lock>(*mu));
    for (int i = 0; i < count; ++i) {
      Tensor* t = vars_[i]->tensor();
      if (t->dtype() != ::tensorflow::DT_FLOAT || t->dims() != 2 ||
          (i > 0 && t->shape() != vars_[0]->tensor()->shape())) {
        return errors::InvalidArgument(name, ": variable ", i, " must be float32 of the shape ",
                                       vars_[0]->tensor()->shape().DebugString(),
                                       " (the table's [capacity, dim]), got ",
                                       ::tensorflow::DataTypeString(t->dtype()), " ",
                                       t->shape().DebugString());
      }
      if (i > 0 && t->flat<float>().data() == vars_[0]->tensor()->flat<float>().data()) {
        return errors::InvalidArgument(name, ": variable ", i, " is the table variable itself");
      }
    }
    return ::tensorflow::OkStatus();
  }
  float* data(int i) { return vars_[i]->tensor()->flat<float>().data(); }
  int64_t capacity() const { return vars_[0]->tensor()->dim_size(0); }
  int64_t dim() const { return vars_[0]->tensor()->dim_size(1); }

 private:
  std::vector<::tensorflow::core::RefCountPtr<Var>> vars_;
  std::vector<std::unique_ptr<::tensorflow::mutex_lock>> locks_;
};

// Checks rows (input `first`) and grad (input `first` + 1) against the
// variables; sets *n.
::tensorflow::Status CheckRows(OpKernelContext* ctx, int first, const LockedVariables& vars,
                               const char* name, int64_t* n) {
  const Tensor& rows = ctx->input(first);
  const Tensor& grad = ctx->input(first + 1);
  *n = rows.NumElements();
  if (rows.dims() != 1 || grad.dims() != 2 || grad.dim_size(0) != *n ||
      grad.dim_size(1) != vars.dim()) {
    return errors::InvalidArgument(name, ": rows must be [n] and grad [n, ", vars.dim(),
                                   "], got ", rows.shape().DebugString(), " and ",
                                   grad.shape().DebugString());
  }
  const int64_t* r = rows.flat<int64_t>().data();
  for (int64_t i = 0; i < *n; ++i) {
    if (r[i] < 0 || r[i] >= vars.capacity()) {
      return errors::InvalidArgument(name, ": row ", r[i], " (position ", i,
                                     ") is outside [0, ", vars.capacity(), ")");
    }
  }
  return ::tensorflow::OkStatus();
}

// The rows (input `first`) and gradients (input `first` + 1) to update: the
// inputs themselves when their rows are distinct, else the distinct rows and
// their summed gradients (SumRepeatedRows), held by this object.
class SummedRows {
 public:
  // `n` rows of `dim` elements, checked by CheckRows; `name` names the op in
  // the error of a failed allocation (nothing throws out of Compute).
  ::tensorflow::Status Sum(OpKernelContext* ctx, int first, int64_t n, int64_t dim,
                           int64_t capacity, const char* name) {
    rows_ = ctx->input(first).flat<int64_t>().data();
    grad_ = ctx->input(first + 1).flat<float>().data();
    n_ = n;
    try {
      if (SumRepeatedRows(rows_, grad_, n, dim, capacity, &unique_, &summed_)) {
        rows_ = unique_.data();
        grad_ = summed_.data();
        n_ = static_cast<int64_t>(unique_.size());
      }
    } catch (const std::bad_alloc&) {
      return errors::ResourceExhausted(name, ": cannot allocate the summed gradients of ", n,
                                       " rows of ", dim, " (host memory)");
    }
    return ::tensorflow::OkStatus();
  }
  const int64_t* rows() const { return rows_; }  // (n)
  const float* grad() const { return grad_; }    // (n, dim)
  int64_t n() const { return n_; }

 private:
  const int64_t* rows_ = nullptr;
  const float* grad_ = nullptr;
  int64_t n_ = 0;
  std::vector<int64_t> unique_;
  std::vector<float> summed_;
};

float Scalar(OpKernelContext* ctx, int i) { return ctx->input(i).scalar<float>()(); }

// Runs fn(begin, end) over shards of [0, n) rows of `dim` elements, each
// element costing `cycles` (TF's shard cost model).
template <typename Fn>
void ForRows(OpKernelContext* ctx, int64_t n, int64_t dim, Fn fn,
             int64_t cycles = kCyclesPerElement) {
  ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(n, dim * cycles, fn);
}

// InvalidArgument naming `op` and the first restore value outside
// [0, num_unique), with its position.
::tensorflow::Status CheckRestore(const char* op, const int32_t* restore, int64_t n,
                                  int64_t num_unique) {
  const int64_t bad = FindBadRestore(restore, n, num_unique);
  if (bad < 0) return ::tensorflow::OkStatus();
  return errors::InvalidArgument(op, ": restore[", bad, "] = ", restore[bad],
                                 " is outside [0, num_unique = ", num_unique, ")");
}

}  // namespace

class LazyAdamRowsOp : public OpKernel {
 public:
  explicit LazyAdamRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon_inside_sqrt", &epsilon_inside_sqrt_));
  }

  void Compute(OpKernelContext* ctx) override {
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Lock(ctx, 3, "MxLazyAdamRows"));
    int64_t n;
    OP_REQUIRES_OK(ctx, CheckRows(ctx, 3, vars, "MxLazyAdamRows", &n));
    SummedRows summed;
    OP_REQUIRES_OK(ctx, summed.Sum(ctx, 3, n, vars.dim(), vars.capacity(), "MxLazyAdamRows"));
    const int64_t* rows = summed.rows();
    const float* grad = summed.grad();
    n = summed.n();
    const float lr_t = Scalar(ctx, 5), beta1 = Scalar(ctx, 6), beta2 = Scalar(ctx, 7),
                epsilon = Scalar(ctx, 8);
    float *var = vars.data(0), *m = vars.data(1), *v = vars.data(2);
    const int64_t dim = vars.dim();
    const bool inside = epsilon_inside_sqrt_;
    ForRows(ctx, n, dim, [=](int64_t begin, int64_t end) {
      LazyAdamRows(var, m, v, dim, rows, grad, begin, end, lr_t, beta1, beta2, epsilon, inside);
    });
  }

 private:
  bool epsilon_inside_sqrt_;
};

class AdagradRowsOp : public OpKernel {
 public:
  explicit AdagradRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Lock(ctx, 2, "MxAdagradRows"));
    int64_t n;
    OP_REQUIRES_OK(ctx, CheckRows(ctx, 2, vars, "MxAdagradRows", &n));
    SummedRows summed;
    OP_REQUIRES_OK(ctx, summed.Sum(ctx, 2, n, vars.dim(), vars.capacity(), "MxAdagradRows"));
    const int64_t* rows = summed.rows();
    const float* grad = summed.grad();
    n = summed.n();
    const float lr = Scalar(ctx, 4);
    float *var = vars.data(0), *acc = vars.data(1);
    const int64_t dim = vars.dim();
    ForRows(ctx, n, dim, [=](int64_t begin, int64_t end) {
      AdagradRows(var, acc, dim, rows, grad, begin, end, lr);
    });
  }
};

class FtrlRowsOp : public OpKernel {
 public:
  explicit FtrlRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Lock(ctx, 3, "MxFtrlRows"));
    int64_t n;
    OP_REQUIRES_OK(ctx, CheckRows(ctx, 3, vars, "MxFtrlRows", &n));
    SummedRows summed;
    OP_REQUIRES_OK(ctx, summed.Sum(ctx, 3, n, vars.dim(), vars.capacity(), "MxFtrlRows"));
    const int64_t* rows = summed.rows();
    const float* grad = summed.grad();
    n = summed.n();
    const float lr = Scalar(ctx, 5), power = Scalar(ctx, 6), l1 = Scalar(ctx, 7),
                l2 = Scalar(ctx, 8), l2_shrinkage = Scalar(ctx, 9);
    float *var = vars.data(0), *accum = vars.data(1), *linear = vars.data(2);
    const int64_t dim = vars.dim();
    ForRows(ctx, n, dim, [=](int64_t begin, int64_t end) {
      FtrlRows(var, accum, linear, dim, rows, grad, begin, end, lr, power, l1, l2, l2_shrinkage);
    });
  }
};

class SgdRowsOp : public OpKernel {
 public:
  explicit SgdRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    LockedVariables vars;
    OP_REQUIRES_OK(ctx, vars.Lock(ctx, 1, "MxSgdRows"));
    int64_t n;
    OP_REQUIRES_OK(ctx, CheckRows(ctx, 1, vars, "MxSgdRows", &n));
    SummedRows summed;
    OP_REQUIRES_OK(ctx, summed.Sum(ctx, 1, n, vars.dim(), vars.capacity(), "MxSgdRows"));
    const int64_t* rows = summed.rows();
    const float* grad = summed.grad();
    n = summed.n();
    const float lr = Scalar(ctx, 3), weight_decay = Scalar(ctx, 4);
    float* var = vars.data(0);
    const int64_t dim = vars.dim();
    ForRows(ctx, n, dim, [=](int64_t begin, int64_t end) {
      SgdRows(var, dim, rows, grad, begin, end, lr, weight_decay);
    });
  }
};

// The gradients of a batch's ids summed per distinct row: SumByRestore over
// one range of the distinct rows per intra-op thread.
class SumByRestoreOp : public OpKernel {
 public:
  explicit SumByRestoreOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& restore = ctx->input(1);
    const Tensor& num_unique_t = ctx->input(2);
    OP_REQUIRES(ctx, grad.dims() == 2 && restore.dims() == 1 &&
                         restore.dim_size(0) == grad.dim_size(0) &&
                         ::tensorflow::TensorShapeUtils::IsScalar(num_unique_t.shape()),
                errors::InvalidArgument("MxSumByRestore: grad must be [n, dim], restore [n] and "
                                        "num_unique a scalar, got ",
                                        grad.shape().DebugString(), ", ",
                                        restore.shape().DebugString(), " and ",
                                        num_unique_t.shape().DebugString()));
    const int64_t n = grad.dim_size(0), dim = grad.dim_size(1);
    const int64_t num_unique = num_unique_t.scalar<int32_t>()();
    OP_REQUIRES(ctx, num_unique >= 0,
                errors::InvalidArgument("MxSumByRestore: num_unique must be >= 0, got ",
                                        num_unique));
    const int32_t* r = restore.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CheckRestore("MxSumByRestore", r, n, num_unique));
    Tensor* summed = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {num_unique, dim}, &summed));
    const float* g = grad.flat<float>().data();
    float* out = summed->flat<float>().data();
    // One range of distinct rows per thread (each range reads restore whole),
    // none for small batches.
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    const int64_t shards =
        std::max<int64_t>(1, std::min<int64_t>(workers->NumThreads(), n * dim / kMinShardElements));
    workers->ParallelFor(shards, kHugeShardCost, [=](int64_t first, int64_t last) {
      for (int64_t s = first; s < last; ++s) {
        SumByRestore(g, r, n, dim, num_unique * s / shards, num_unique * (s + 1) / shards, out);
      }
    });
  }

 private:
  // Elements of grad per range at least, and a cost that gives each range its
  // own task.
  static constexpr int64_t kMinShardElements = 1 << 16;
  static constexpr int64_t kHugeShardCost = int64_t{1} << 30;
};

// A lookup's per-id read of its distinct rows, the forward half of
// MxSumByRestore's pair: each id's embedding copied from its row's, over
// shards of the ids, into an output buffer the kernel keeps from one call to
// the next. The read's output is large (a 4096 x 16 x 64 batch: 16 MB) and
// freed every step; glibc malloc hands such blocks back to the kernel now and
// then, and the next step then takes a page fault per 4 KB to map them afresh
// (benchmarks/bench_sparse_core.py: ~5,000 minor faults in such a step, ~300 in
// the others). The kept buffer is reused only while no one else holds it
// (Tensor::RefCountIsOne): a consumer that still holds the last output, e.g. a
// caller of the function that returned it, gets a fresh buffer instead.
class GatherByRestoreOp : public OpKernel {
 public:
  explicit GatherByRestoreOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& unique_emb = ctx->input(0);
    const Tensor& restore = ctx->input(1);
    OP_REQUIRES(ctx, unique_emb.dims() == 2,
                errors::InvalidArgument("MxGatherByRestore: unique_emb must be [num_unique, dim], "
                                        "got ", unique_emb.shape().DebugString()));
    const int64_t num_unique = unique_emb.dim_size(0), dim = unique_emb.dim_size(1);
    const int64_t n = restore.NumElements();
    const int32_t* r = restore.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, CheckRestore("MxGatherByRestore", r, n, num_unique));
    ::tensorflow::TensorShape shape = restore.shape();
    OP_REQUIRES_OK(ctx, shape.AddDimWithStatus(dim));
    Tensor out;
    {
      ::tensorflow::mutex_lock lock(mu_);
      if (!kept_.IsInitialized() || kept_.shape() != shape || !kept_.RefCountIsOne()) {
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, shape, &kept_));
      }
      out = kept_;
    }
    const float* src = unique_emb.flat<float>().data();
    float* dst = out.flat<float>().data();
    ForRows(
        ctx, n, dim,
        [=](int64_t begin, int64_t end) { GatherByRestore(src, r, dim, begin, end, dst); },
        kCopyCyclesPerElement);
    ctx->set_output(0, out);
  }

 private:
  ::tensorflow::mutex mu_;
  Tensor kept_ TF_GUARDED_BY(mu_);  // The last output, reused once no one holds it.
};

MXREC_REGISTER_CPU("MxLazyAdamRows", LazyAdamRowsOp);
MXREC_REGISTER_CPU("MxAdagradRows", AdagradRowsOp);
MXREC_REGISTER_CPU("MxFtrlRows", FtrlRowsOp);
MXREC_REGISTER_CPU("MxSgdRows", SgdRowsOp);
MXREC_REGISTER_CPU("MxSumByRestore", SumByRestoreOp);
MXREC_REGISTER_CPU("MxGatherByRestore", GatherByRestoreOp);

}  // namespace mxrec
