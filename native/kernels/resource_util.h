// Kernel helpers shared by the resource ops of the key index, the row store,
// the tier store and the device cache: the handle op, the base of the ops on an
// existing resource, the checked LookupOrCreate, input checks and output copies,
// and the CPU registration macro.
#ifndef MXREC_PIPELINE_NATIVE_KERNELS_RESOURCE_UTIL_H_
#define MXREC_PIPELINE_NATIVE_KERNELS_RESOURCE_UTIL_H_

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/refcount.h"
#include "tf_status.h"

// Registers `kernel` for the op `name` on the CPU: every resource here is host
// state (each kernel file says why).
#define MXREC_REGISTER_CPU(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(::tensorflow::DEVICE_CPU), kernel)

namespace mxrec {

// Outputs the handle of the resource R named by the attrs `container` and
// `shared_name` (the table name); does not create it.
template <typename R>
class NamedHandleOp : public ::tensorflow::OpKernel {
 public:
  explicit NamedHandleOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
    OP_REQUIRES(ctx, !shared_name_.empty(),
                ::tensorflow::errors::InvalidArgument(
                    "shared_name (the table name) must not be empty"));
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    ::tensorflow::Tensor* output;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ::tensorflow::TensorShape({}), &output));
    output->scalar<::tensorflow::ResourceHandle>()() =
        ::tensorflow::MakeResourceHandle<R>(ctx, container_, shared_name_);
  }

 private:
  std::string container_;
  std::string shared_name_;
};

// Looks up the resource R behind input 0 into *resource. Otherwise
// FailedPrecondition "<R::kKind> '<table>' does not exist ... create_table()
// must run before the first <R::kFirstUse>; ...".
template <typename R>
::tensorflow::Status LookupOrFail(::tensorflow::OpKernelContext* ctx,
                                  ::tensorflow::core::RefCountPtr<R>* resource) {
  const ::tensorflow::ResourceHandle& handle = HandleFromInput(ctx, 0);
  ::tensorflow::Status status = LookupResource(ctx, handle, resource);
  if (!status.ok()) {
    return ::tensorflow::errors::FailedPrecondition(
        R::kKind, " '", handle.name(),
        "' does not exist on this device/session. create_table() must run before the first ",
        R::kFirstUse, "; in a tf.compat.v1 session, run "
        "tf.compat.v1.global_variables_initializer() (it initializes the table) or "
        "restore a checkpoint first. (", status.message(), ")");
  }
  return ::tensorflow::OkStatus();
}

// The kernel of an op on the existing resource R behind input 0 (every op of R
// but its handle op and the ones that create it). Compute looks R up as
// LookupOrFail does, holds one reference for the call and hands R to
// ComputeWith. (Not TF's ResourceOpKernel, which creates its resource.)
template <typename R>
class ExistingResourceOp : public ::tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(::tensorflow::OpKernelContext* ctx) final {
    ::tensorflow::core::RefCountPtr<R> resource;
    OP_REQUIRES_OK(ctx, LookupOrFail(ctx, &resource));
    ComputeWith(ctx, *resource);
  }

  // The op's work on R, as OpKernel::Compute.
  virtual void ComputeWith(::tensorflow::OpKernelContext* ctx, R& resource) = 0;
};

// LookupOrCreate of the resource R behind input 0: `make()` returns a new R*
// (a std::bad_alloc becomes ResourceExhausted "cannot allocate <what>"), then
// `init(R&)`, which returns a status, prepares it; on error the new R is
// dropped and that status returned. The resource found or made must pass
// `check(const R&)`, which returns a status; on error the reference is dropped
// and that status returned.
template <typename R, typename Make, typename Init, typename Check>
::tensorflow::Status LookupOrCreateChecked(::tensorflow::OpKernelContext* ctx,
                                           const std::string& table_name, const std::string& what,
                                           Make&& make, Init&& init, Check&& check,
                                           ::tensorflow::core::RefCountPtr<R>* resource) {
  TF_RETURN_IF_ERROR(::tensorflow::LookupOrCreateResource<R>(
      ctx, HandleFromInput(ctx, 0), resource, [&](R** created) {
        *created = nullptr;
        TF_RETURN_IF_ERROR(GuardAllocation(table_name, what, [&] { *created = make(); }));
        ::tensorflow::Status initialized = init(**created);
        if (!initialized.ok()) {
          (*created)->Unref();
          *created = nullptr;
        }
        return initialized;
      }));
  ::tensorflow::Status matches = check(static_cast<const R&>(**resource));
  if (!matches.ok()) resource->reset();
  return matches;
}

// As above, for a resource that needs no preparation once made.
template <typename R, typename Make, typename Check>
::tensorflow::Status LookupOrCreateChecked(::tensorflow::OpKernelContext* ctx,
                                           const std::string& table_name, const std::string& what,
                                           Make&& make, Check&& check,
                                           ::tensorflow::core::RefCountPtr<R>* resource) {
  return LookupOrCreateChecked(
      ctx, table_name, what, std::forward<Make>(make),
      [](R&) { return ::tensorflow::OkStatus(); }, std::forward<Check>(check), resource);
}

// Input `i` must be a scalar: reads it into *value. Otherwise InvalidArgument
// of `message...` followed by the input's shape (the message names the input).
template <typename T, typename... Message>
::tensorflow::Status ScalarInput(::tensorflow::OpKernelContext* ctx, int i, T* value,
                                 const Message&... message) {
  const ::tensorflow::Tensor& input = ctx->input(i);
  if (!::tensorflow::TensorShapeUtils::IsScalar(input.shape())) {
    return ::tensorflow::errors::InvalidArgument(message..., input.shape().DebugString());
  }
  *value = input.scalar<T>()();
  return ::tensorflow::OkStatus();
}

// `tensor` must be a vector. Otherwise InvalidArgument "table '<table>':
// <what...> must be a vector, got <its shape>".
template <typename... What>
::tensorflow::Status CheckVector(const std::string& table, const ::tensorflow::Tensor& tensor,
                                 const What&... what) {
  if (::tensorflow::TensorShapeUtils::IsVector(tensor.shape())) return ::tensorflow::OkStatus();
  return ::tensorflow::errors::InvalidArgument("table '", table, "': ", what...,
                                               " must be a vector, got ",
                                               tensor.shape().DebugString());
}

// Copies `values` into a new output `i` of `shape`, which holds as many elements.
template <typename T>
::tensorflow::Status OutputCopy(::tensorflow::OpKernelContext* ctx, int i,
                                const ::tensorflow::TensorShape& shape,
                                const std::vector<T>& values) {
  DCHECK_EQ(shape.num_elements(), static_cast<int64_t>(values.size()));
  ::tensorflow::Tensor* out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(i, shape, &out));
  std::copy(values.begin(), values.end(), out->flat<T>().data());
  return ::tensorflow::OkStatus();
}

// Copies `values` into a new [size] output `i`.
template <typename T>
::tensorflow::Status OutputVector(::tensorflow::OpKernelContext* ctx, int i,
                                  const std::vector<T>& values) {
  return OutputCopy(ctx, i, ::tensorflow::TensorShape({static_cast<int64_t>(values.size())}),
                    values);
}

// OutputVector of each of `values` in turn, as outputs 0, 1, ...
inline ::tensorflow::Status OutputVectors(
    ::tensorflow::OpKernelContext* ctx,
    std::initializer_list<const std::vector<int64_t>*> values) {
  int i = 0;
  for (const std::vector<int64_t>* vector : values) {
    TF_RETURN_IF_ERROR(OutputVector(ctx, i++, *vector));
  }
  return ::tensorflow::OkStatus();
}

// Each of `values` in turn as an int64 scalar output 0, 1, ...
inline ::tensorflow::Status OutputScalars(::tensorflow::OpKernelContext* ctx,
                                          std::initializer_list<int64_t> values) {
  int i = 0;
  for (int64_t value : values) {
    ::tensorflow::Tensor* out;
    TF_RETURN_IF_ERROR(ctx->allocate_output(i++, ::tensorflow::TensorShape({}), &out));
    out->scalar<int64_t>()() = value;
  }
  return ::tensorflow::OkStatus();
}

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_KERNELS_RESOURCE_UTIL_H_
