// CPU kernels of the row-store ops: a thin layer over mxrec::RowStore. Errors of
// the core cross into TensorFlow here, once, as OP_REQUIRES statuses.
#include <string>
#include <vector>

#include "../core/row_store.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"
#include "resource_util.h"
#include "tf_status.h"

namespace mxrec {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::core::RefCountPtr;
namespace errors = ::tensorflow::errors;

// The row store of one dynamic-expansion table as a TensorFlow resource.
// Thread-safe: RowStore locks internally (shared for reads, exclusive for writes).
class RowStoreResource : public ::tensorflow::ResourceBase {
 public:
  // How a failed lookup names the store (see LookupOrFail).
  static constexpr char kKind[] = "the row store of dynamic-expansion table";
  static constexpr char kFirstUse[] = "lookup";

  RowStoreResource(int64_t dim, const std::string& table_name)
      : store_(dim, RowStore::kDefaultBlockRows, table_name) {}

  RowStore& store() { return store_; }
  const RowStore& store() const { return store_; }

  std::string DebugString() const override {
    return "RowStore(table=" + store_.name() + ", rows=" + std::to_string(store_.size()) +
           ", dim=" + std::to_string(store_.dim()) + ")";
  }
  int64_t MemoryUsed() const override { return store_.MemoryBytes(); }

 private:
  RowStore store_;
};

namespace {

// LookupOrCreate with rows of `dim` floats; an existing store must have that dim.
::tensorflow::Status LookupOrCreateStore(OpKernelContext* ctx, int64_t dim,
                                         const std::string& table_name,
                                         RefCountPtr<RowStoreResource>* resource) {
  return LookupOrCreateChecked(
      ctx, table_name, "the row store (host memory)",
      [&] { return new RowStoreResource(dim, table_name); },
      [&](const RowStoreResource& existing) -> ::tensorflow::Status {
        if (existing.store().dim() == dim) return ::tensorflow::OkStatus();
        return errors::InvalidArgument("table '", table_name,
                                       "' already has a row store of dim ",
                                       existing.store().dim(), ", not ", dim);
      },
      resource);
}

// `rows` must be a vector and `values` a matrix of as many rows, `width` wide
// when width >= 0.
::tensorflow::Status CheckRowsAndValues(const RowStore& store, const Tensor& rows,
                                        const Tensor& values, int64_t width) {
  if (rows.dims() != 1 || values.dims() != 2 || values.dim_size(0) != rows.dim_size(0) ||
      (width >= 0 && values.dim_size(1) != width)) {
    return errors::InvalidArgument(
        "table '", store.name(), "': rows must be a vector [n] and values a matrix [n, ",
        width >= 0 ? std::to_string(width) : std::string("width"), "], got ",
        rows.shape().DebugString(), " and ", values.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

class RowStoreCreateOp : public OpKernel {
 public:
  explicit RowStoreCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<RowStoreResource> resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateStore(ctx, dim_, table_name_, &resource));
    resource->store().Clear();
  }

 private:
  int64_t dim_;
  std::string table_name_;
};

class RowStoreSizeOp : public ExistingResourceOp<RowStoreResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, RowStoreResource& resource) override {
    const RowStore& store = resource.store();
    OP_REQUIRES_OK(ctx, OutputScalars(ctx, {store.size(), store.num_slots(), store.MemoryBytes()}));
  }
};

class RowStoreAppendOp : public ExistingResourceOp<RowStoreResource> {
 public:
  explicit RowStoreAppendOp(OpKernelConstruction* ctx) : ExistingResourceOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void ComputeWith(OpKernelContext* ctx, RowStoreResource& resource) override {
    RowStore& store = resource.store();
    int64_t expected = 0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, &expected,
                                    "expected_size must be a scalar, got shape "));
    const Tensor& values = ctx->input(2);
    OP_REQUIRES(ctx, values.dims() == 2 && values.dim_size(1) == store.dim() && dim_ == store.dim(),
                errors::InvalidArgument("table '", store.name(), "': new rows must be [n, ",
                                        store.dim(), "], got ", values.shape().DebugString()));
    int64_t size;
    OP_REQUIRES_OK(ctx, GuardAllocation(store.name(), "new rows (host memory)", [&] {
                     return store.Append(expected, values.flat<float>().data(),
                                         values.dim_size(0), &size);
                   }));
    OP_REQUIRES_OK(ctx, OutputScalars(ctx, {size}));
  }

 private:
  int64_t dim_;
};

class RowStoreSetSlotsOp : public ExistingResourceOp<RowStoreResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, RowStoreResource& resource) override {
    RowStore& store = resource.store();
    const Tensor& initial = ctx->input(1);
    OP_REQUIRES(ctx, initial.dims() == 1,
                errors::InvalidArgument("initial_values must be a vector, got shape ",
                                        initial.shape().DebugString()));
    OP_REQUIRES_OK(ctx, GuardAllocation(store.name(), "the optimizer slots (host memory)", [&] {
                     return store.SetSlots(initial.flat<float>().data(), initial.NumElements());
                   }));
  }
};

class RowStoreLookupOp : public ExistingResourceOp<RowStoreResource> {
 public:
  explicit RowStoreLookupOp(OpKernelConstruction* ctx) : ExistingResourceOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void ComputeWith(OpKernelContext* ctx, RowStoreResource& resource) override {
    const RowStore& store = resource.store();
    const Tensor& rows = ctx->input(1);
    const Tensor& anchor = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckVector(store.name(), rows, "rows"));
    OP_REQUIRES(ctx, anchor.dims() == 2 && anchor.dim_size(1) == store.dim() && dim_ == store.dim(),
                errors::InvalidArgument("table '", store.name(), "': the anchor must be [0, ",
                                        store.dim(), "], got ", anchor.shape().DebugString()));
    const int64_t n = rows.NumElements();
    Tensor* embeddings;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, store.dim()}), &embeddings));
    OP_REQUIRES_OK(ctx, ToTf(store.Lookup(rows.flat<int64_t>().data(), n,
                                          embeddings->flat<float>().data())));
    ctx->set_output(1, rows);
  }

 private:
  int64_t dim_;
};

class RowStoreReadRowsOp : public ExistingResourceOp<RowStoreResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, RowStoreResource& resource) override {
    const RowStore& store = resource.store();
    const Tensor& rows = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(store.name(), rows, "rows"));
    std::vector<float> values, initial;
    int64_t width = 0;
    OP_REQUIRES_OK(ctx, GuardAllocation(store.name(), "the rows read (host memory)", [&] {
                     return store.ReadRows(rows.flat<int64_t>().data(), rows.NumElements(),
                                           &values, &width, &initial);
                   }));
    OP_REQUIRES_OK(ctx, OutputCopy(ctx, 0, TensorShape({rows.NumElements(), width}), values));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 1, initial));
  }
};

class RowStoreWriteRowsOp : public ExistingResourceOp<RowStoreResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, RowStoreResource& resource) override {
    RowStore& store = resource.store();
    const Tensor& rows = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRowsAndValues(store, rows, values, -1));
    OP_REQUIRES_OK(ctx, ToTf(store.WriteRows(rows.flat<int64_t>().data(), rows.NumElements(),
                                             values.flat<float>().data(), values.dim_size(1))));
  }
};

class RowStoreExportOp : public ExistingResourceOp<RowStoreResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, RowStoreResource& resource) override {
    const RowStore& store = resource.store();
    std::vector<float> values, initial;
    OP_REQUIRES_OK(ctx, GuardAllocation(store.name(), "the exported rows (host memory)",
                                        [&] { store.Export(&values, &initial); }));
    const int64_t width = store.dim() * (1 + static_cast<int64_t>(initial.size()));
    const int64_t size = static_cast<int64_t>(values.size()) / width;
    OP_REQUIRES_OK(ctx, OutputCopy(ctx, 0, TensorShape({size, width}), values));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 1, initial));
  }
};

class RowStoreImportOp : public OpKernel {
 public:
  explicit RowStoreImportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(1);
    const Tensor& initial = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckVector(table_name_, initial, "slot_initial_values"));
    const int64_t width = dim_ * (1 + initial.NumElements());
    OP_REQUIRES(ctx, values.dims() == 2 && values.dim_size(1) == width,
                errors::InvalidArgument("table '", table_name_, "': imported rows must be [n, ",
                                        width, "] (dim ", dim_, ", ", initial.NumElements(),
                                        " slots), got ", values.shape().DebugString()));
    RefCountPtr<RowStoreResource> resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateStore(ctx, dim_, table_name_, &resource));
    OP_REQUIRES_OK(ctx, GuardAllocation(table_name_, "the imported rows (host memory)", [&] {
                     return resource->store().Import(values.flat<float>().data(),
                                                     values.dim_size(0),
                                                     initial.flat<float>().data(),
                                                     initial.NumElements());
                   }));
  }

 private:
  int64_t dim_;
  std::string table_name_;
};

// Base of the fused updates: inputs (handle, rows [n], grad [n, dim], scalars...).
class RowStoreApplyOp : public ExistingResourceOp<RowStoreResource> {
 public:
  explicit RowStoreApplyOp(OpKernelConstruction* ctx) : ExistingResourceOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void ComputeWith(OpKernelContext* ctx, RowStoreResource& resource) override {
    RowStore& store = resource.store();
    const Tensor& rows = ctx->input(1);
    const Tensor& grad = ctx->input(2);
    OP_REQUIRES(ctx, dim_ == store.dim(),
                errors::InvalidArgument("table '", store.name(), "': dim ", dim_,
                                        " given, the table has ", store.dim()));
    OP_REQUIRES_OK(ctx, CheckRowsAndValues(store, rows, grad, store.dim()));
    std::vector<float> scalars(ctx->num_inputs() - 3);
    for (size_t i = 0; i < scalars.size(); ++i) {
      const int input = static_cast<int>(3 + i);
      OP_REQUIRES_OK(ctx, ScalarInput(ctx, input, &scalars[i], "hyperparameter input ", input,
                                      " of ", ctx->op_kernel().name(),
                                      " must be a scalar, got shape "));
    }
    OP_REQUIRES_OK(ctx, ToTf(Apply(store, rows.flat<int64_t>().data(), rows.NumElements(),
                                   grad.flat<float>().data(), scalars)));
  }

 protected:
  virtual Status Apply(RowStore& store, const int64_t* rows, int64_t n, const float* grad,
                       const std::vector<float>& scalars) = 0;

 private:
  int64_t dim_;
};

class RowStoreApplySgdOp : public RowStoreApplyOp {
 public:
  using RowStoreApplyOp::RowStoreApplyOp;

 protected:
  Status Apply(RowStore& store, const int64_t* rows, int64_t n, const float* grad,
               const std::vector<float>& s) override {
    return store.ApplySgd(rows, n, grad, s[0], s[1]);
  }
};

class RowStoreApplyAdagradOp : public RowStoreApplyOp {
 public:
  using RowStoreApplyOp::RowStoreApplyOp;

 protected:
  Status Apply(RowStore& store, const int64_t* rows, int64_t n, const float* grad,
               const std::vector<float>& s) override {
    return store.ApplyAdagrad(rows, n, grad, s[0]);
  }
};

class RowStoreApplyAdamOp : public RowStoreApplyOp {
 public:
  using RowStoreApplyOp::RowStoreApplyOp;

 protected:
  Status Apply(RowStore& store, const int64_t* rows, int64_t n, const float* grad,
               const std::vector<float>& s) override {
    return store.ApplyAdam(rows, n, grad, s[0], s[1], s[2], s[3]);
  }
};

}  // namespace

// The store is host state, as the key index: CPU kernels only.
MXREC_REGISTER_CPU("MxRowStoreHandle", NamedHandleOp<RowStoreResource>);
MXREC_REGISTER_CPU("MxRowStoreCreate", RowStoreCreateOp);
MXREC_REGISTER_CPU("MxRowStoreSize", RowStoreSizeOp);
MXREC_REGISTER_CPU("MxRowStoreAppend", RowStoreAppendOp);
MXREC_REGISTER_CPU("MxRowStoreSetSlots", RowStoreSetSlotsOp);
MXREC_REGISTER_CPU("MxRowStoreLookup", RowStoreLookupOp);
MXREC_REGISTER_CPU("MxRowStoreReadRows", RowStoreReadRowsOp);
MXREC_REGISTER_CPU("MxRowStoreWriteRows", RowStoreWriteRowsOp);
MXREC_REGISTER_CPU("MxRowStoreExport", RowStoreExportOp);
MXREC_REGISTER_CPU("MxRowStoreImport", RowStoreImportOp);
MXREC_REGISTER_CPU("MxRowStoreApplySgd", RowStoreApplySgdOp);
MXREC_REGISTER_CPU("MxRowStoreApplyAdagrad", RowStoreApplyAdagradOp);
MXREC_REGISTER_CPU("MxRowStoreApplyAdam", RowStoreApplyAdamOp);

}  // namespace mxrec
