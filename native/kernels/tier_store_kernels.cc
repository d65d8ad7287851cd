// CPU kernels of the tier-store ops: a thin layer over mxrec::TierStore, the
// host-memory and SSD tiers of a tiered table. Errors of the core cross into
// TensorFlow here, once, as OP_REQUIRES statuses.
#include <string>
#include <vector>

#include "../core/tier_store.h"
#include "resource_util.h"
#include "tf_status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/errors.h"

namespace mxrec {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorShapeUtils;
using ::tensorflow::core::RefCountPtr;
namespace errors = ::tensorflow::errors;

// The host/SSD store of one table as a TensorFlow resource. Thread-safe:
// TierStore locks internally.
class TierStoreResource : public ::tensorflow::ResourceBase {
 public:
  // How a failed lookup names the store (see LookupOrFail).
  static constexpr char kKind[] = "the host/SSD store of table";
  static constexpr char kFirstUse[] = "lookup or update";

  TierStoreResource(const std::string& table_name, int64_t width, int64_t host_rows,
                    int64_t ssd_rows, const std::vector<std::string>& ssd_dirs,
                    int64_t total_rows)
      : store_(table_name, width, host_rows, ssd_rows, ssd_dirs, total_rows) {}

  TierStore& store() { return store_; }
  const TierStore& store() const { return store_; }

  std::string DebugString() const override {
    const TierStore::Stats stats = store_.stats();
    return "TierStore(table=" + store_.name() + ", width=" + std::to_string(store_.width()) +
           ", host=" + std::to_string(stats.host_rows_used) + "/" +
           std::to_string(store_.host_rows()) + ", ssd=" + std::to_string(stats.ssd_rows_used) +
           "/" + std::to_string(store_.ssd_rows()) + ")";
  }
  int64_t MemoryUsed() const override { return store_.MemoryBytes(); }

 private:
  TierStore store_;
};

namespace {

// The attrs of MxTierStoreCreate and MxTierStoreImport.
struct StoreAttrs {
  int64_t width, host_rows, ssd_rows, total_rows;
  std::vector<std::string> ssd_dirs;
  std::string table_name;

  explicit StoreAttrs(OpKernelConstruction* ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("width", &width));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("host_rows", &host_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ssd_rows", &ssd_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ssd_dirs", &ssd_dirs));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("total_rows", &total_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name));
  }
};

// LookupOrCreate of the store with `attrs`, opened (SSD files created); an
// existing store must have the same attrs.
::tensorflow::Status LookupOrCreateStore(OpKernelContext* ctx, const StoreAttrs& attrs,
                                         RefCountPtr<TierStoreResource>* resource) {
  const std::string& table = attrs.table_name;
  return LookupOrCreateChecked(
      ctx, table,
      "the host/SSD store index of " + std::to_string(attrs.total_rows) + " rows (" +
          std::to_string(8 * attrs.total_rows) + " bytes of host memory)",
      [&] {
        return new TierStoreResource(table, attrs.width, attrs.host_rows, attrs.ssd_rows,
                                     attrs.ssd_dirs, attrs.total_rows);
      },
      [](TierStoreResource& created) { return ToTf(created.store().Open()); },
      [&](const TierStoreResource& found) -> ::tensorflow::Status {
        const TierStore& existing = found.store();
        if (existing.width() != attrs.width || existing.host_rows() != attrs.host_rows ||
            existing.ssd_rows() != attrs.ssd_rows || existing.ssd_dirs() != attrs.ssd_dirs ||
            existing.total_rows() != attrs.total_rows) {
          return errors::InvalidArgument(
              "table '", table, "' already has a host/SSD store with width=", existing.width(),
              ", host_vocabulary_size=", existing.host_rows(),
              ", ssd_vocabulary_size=", existing.ssd_rows(), ", ", existing.ssd_dirs().size(),
              " SSD directories and ", existing.total_rows(), " global rows, not width=",
              attrs.width, ", host_vocabulary_size=", attrs.host_rows,
              ", ssd_vocabulary_size=", attrs.ssd_rows, ", ", attrs.ssd_dirs.size(),
              " SSD directories and ", attrs.total_rows, " global rows");
        }
        return ::tensorflow::OkStatus();
      },
      resource);
}

// `values` must be [globals.size, width].
::tensorflow::Status CheckValues(const std::string& table, int64_t width, const Tensor& globals,
                                 const Tensor& values) {
  TF_RETURN_IF_ERROR(CheckVector(table, globals, "the globals"));
  if (!TensorShapeUtils::IsMatrix(values.shape()) ||
      values.dim_size(0) != globals.NumElements() || values.dim_size(1) != width) {
    return errors::InvalidArgument("table '", table, "': values must be [",
                                   globals.NumElements(), ", ", width, "] (one row of width ",
                                   width, " per global), got ", values.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

class TierStoreCreateOp : public OpKernel {
 public:
  explicit TierStoreCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TierStoreResource> resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateStore(ctx, attrs_, &resource));
    resource->store().Clear();
  }

 private:
  StoreAttrs attrs_;
};

class TierStoreSwapOp : public ExistingResourceOp<TierStoreResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, TierStoreResource& resource) override {
    TierStore& store = resource.store();
    const std::string& table = store.name();
    const int64_t width = store.width();

    const Tensor& erase = ctx->input(1);
    const Tensor& take = ctx->input(2);
    const Tensor& put = ctx->input(3);
    const Tensor& put_values = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckVector(table, erase, "erase_globals"));
    OP_REQUIRES_OK(ctx, CheckVector(table, take, "take_globals"));
    OP_REQUIRES_OK(ctx, CheckValues(table, width, put, put_values));

    const int64_t f = take.NumElements();
    Tensor* taken;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({f, width}), &taken));
    Tensor* found;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({f}), &found));

    store.Erase(erase.flat<int64_t>().data(), erase.NumElements());
    OP_REQUIRES_OK(ctx, GuardAllocation(table, "the rows to take (host memory)", [&] {
                     return store.Take(take.flat<int64_t>().data(), f,
                                       taken->flat<float>().data(), found->flat<bool>().data());
                   }));
    OP_REQUIRES_OK(ctx, GuardAllocation(table, "host rows of the host/SSD store", [&] {
                     return store.Put(put.flat<int64_t>().data(), put.NumElements(),
                                      put_values.flat<float>().data());
                   }));
  }
};

class TierStoreReadOp : public ExistingResourceOp<TierStoreResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, TierStoreResource& resource) override {
    const TierStore& store = resource.store();
    const Tensor& globals = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(store.name(), globals, "globals"));
    const int64_t n = globals.NumElements();
    Tensor* values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, store.width()}), &values));
    Tensor* found;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &found));
    OP_REQUIRES_OK(ctx, ToTf(store.Read(globals.flat<int64_t>().data(), n,
                                        values->flat<float>().data(),
                                        found->flat<bool>().data())));
  }
};

class TierStoreExportOp : public ExistingResourceOp<TierStoreResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, TierStoreResource& resource) override {
    const TierStore& store = resource.store();
    const Tensor& exclude = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(store.name(), exclude, "exclude"));
    std::vector<int64_t> globals;
    std::vector<float> values;
    OP_REQUIRES_OK(ctx, GuardAllocation(store.name(), "the exported rows (host memory)", [&] {
                     return store.Export(exclude.flat<int64_t>().data(), exclude.NumElements(),
                                         &globals, &values);
                   }));
    const int64_t k = static_cast<int64_t>(globals.size());
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, globals));
    OP_REQUIRES_OK(ctx, OutputCopy(ctx, 1, TensorShape({k, store.width()}), values));
  }
};

class TierStoreImportOp : public OpKernel {
 public:
  explicit TierStoreImportOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& globals = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckValues(attrs_.table_name, attrs_.width, globals, values));
    RefCountPtr<TierStoreResource> resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateStore(ctx, attrs_, &resource));
    OP_REQUIRES_OK(ctx, GuardAllocation(attrs_.table_name, "the imported rows (host memory)", [&] {
                     return resource->store().Import(globals.flat<int64_t>().data(),
                                                     globals.NumElements(),
                                                     values.flat<float>().data());
                   }));
  }

 private:
  StoreAttrs attrs_;
};

class TierStoreStatsOp : public ExistingResourceOp<TierStoreResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, TierStoreResource& resource) override {
    const TierStore::Stats stats = resource.store().stats();
    OP_REQUIRES_OK(ctx, OutputScalars(ctx, {stats.host_rows_used, stats.ssd_rows_used,
                                            stats.host_bytes, stats.ssd_bytes}));
  }
};

}  // namespace

// Host state: kernels are registered for the CPU only (a GPU graph places these
// ops on the host).
MXREC_REGISTER_CPU("MxTierStoreHandle", NamedHandleOp<TierStoreResource>);
MXREC_REGISTER_CPU("MxTierStoreCreate", TierStoreCreateOp);
MXREC_REGISTER_CPU("MxTierStoreSwap", TierStoreSwapOp);
MXREC_REGISTER_CPU("MxTierStoreRead", TierStoreReadOp);
MXREC_REGISTER_CPU("MxTierStoreExport", TierStoreExportOp);
MXREC_REGISTER_CPU("MxTierStoreImport", TierStoreImportOp);
MXREC_REGISTER_CPU("MxTierStoreStats", TierStoreStatsOp);

}  // namespace mxrec
