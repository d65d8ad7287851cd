// CPU kernels of the device-cache ops: a thin layer over mxrec::DeviceCache.
// Errors of the core cross into TensorFlow here, once, as OP_REQUIRES statuses.
#include <string>
#include <vector>

#include "../core/device_cache.h"
#include "../core/key_index.h"
#include "resource_util.h"
#include "tf_status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"

namespace mxrec {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// The device cache of one tiered table as a TensorFlow resource. Thread-safe:
// DeviceCache locks internally.
class DeviceCacheResource : public ::tensorflow::ResourceBase {
 public:
  DeviceCacheResource(int64_t device_rows, int64_t total_rows, DeviceCache::Policy policy,
                      const std::string& table_name, double wait_seconds)
      : cache_(device_rows, total_rows, policy, table_name, wait_seconds) {}

  DeviceCache& cache() { return cache_; }
  const DeviceCache& cache() const { return cache_; }

  std::string DebugString() const override {
    const DeviceCache::Stats stats = cache_.stats();
    return "DeviceCache(table=" + cache_.name() + ", occupied=" + std::to_string(stats.occupied) +
           ", device_rows=" + std::to_string(stats.device_rows) +
           ", total_rows=" + std::to_string(cache_.total_rows()) + ")";
  }
  int64_t MemoryUsed() const override { return cache_.MemoryBytes(); }

 private:
  DeviceCache cache_;
};

namespace {

const char* PolicyName(DeviceCache::Policy policy) {
  return policy == DeviceCache::Policy::kLru ? "lru" : "lfu";
}

// The attrs shared by Create and ImportState, checked.
struct CacheAttrs {
  int64_t device_rows;
  int64_t total_rows;
  DeviceCache::Policy policy;
  std::string table_name;
  float wait_seconds;

  ::tensorflow::Status Read(OpKernelConstruction* ctx) {
    std::string policy_name;
    TF_RETURN_IF_ERROR(ctx->GetAttr("device_rows", &device_rows));
    TF_RETURN_IF_ERROR(ctx->GetAttr("total_rows", &total_rows));
    TF_RETURN_IF_ERROR(ctx->GetAttr("policy", &policy_name));
    TF_RETURN_IF_ERROR(ctx->GetAttr("table_name", &table_name));
    TF_RETURN_IF_ERROR(ctx->GetAttr("wait_seconds", &wait_seconds));
    if (policy_name == "lru") {
      policy = DeviceCache::Policy::kLru;
    } else if (policy_name == "lfu") {
      policy = DeviceCache::Policy::kLfu;
    } else {
      return errors::InvalidArgument("table '", table_name, "': device cache policy must be "
                                     "\"lru\" or \"lfu\", got \"", policy_name, "\"");
    }
    if (device_rows > DeviceCache::kMaxDeviceRows) {
      return errors::InvalidArgument("table '", table_name, "': device_vocabulary_size=",
                                     device_rows, " is above the supported maximum of ",
                                     DeviceCache::kMaxDeviceRows, " rows");
    }
    if (total_rows < device_rows || total_rows > KeyIndex::kMaxCapacity) {
      return errors::InvalidArgument(
          "table '", table_name, "': the table's total rows (device + host + ssd vocabulary) ",
          total_rows, " must be in [device_vocabulary_size=", device_rows, ", ",
          KeyIndex::kMaxCapacity, "]");
    }
    if (!(wait_seconds >= 0)) {
      return errors::InvalidArgument("table '", table_name,
                                     "': the device cache wait_seconds must be >= 0, got ",
                                     wait_seconds);
    }
    return ::tensorflow::OkStatus();
  }
};

// Looks up the cache behind input 0; the caller owns one reference on success.
::tensorflow::Status LookupCache(OpKernelContext* ctx, DeviceCacheResource** resource) {
  return LookupOrFail(ctx, "the device cache of table", "lookup", resource);
}

// LookupOrCreate with `attrs`; an existing cache must have their sizes and policy.
::tensorflow::Status LookupOrCreateCache(OpKernelContext* ctx, const CacheAttrs& attrs,
                                         DeviceCacheResource** resource) {
  return LookupOrCreateChecked(
      ctx, attrs.table_name,
      "the device cache of device_vocabulary_size=" + std::to_string(attrs.device_rows) +
          " over " + std::to_string(attrs.total_rows) + " rows (at least " +
          std::to_string(8 * attrs.total_rows + 70 * attrs.device_rows) +
          " bytes of host memory)",
      [&] {
        return new DeviceCacheResource(attrs.device_rows, attrs.total_rows, attrs.policy,
                                       attrs.table_name, attrs.wait_seconds);
      },
      [&](const DeviceCacheResource& existing) -> ::tensorflow::Status {
        const DeviceCache& cache = existing.cache();
        if (cache.device_rows() != attrs.device_rows || cache.total_rows() != attrs.total_rows ||
            cache.policy() != attrs.policy) {
          return errors::InvalidArgument(
              "table '", attrs.table_name, "' already has a device cache with "
              "device_vocabulary_size=", cache.device_rows(), ", total rows ", cache.total_rows(),
              " and policy ", PolicyName(cache.policy()), ", not ", attrs.device_rows, ", ",
              attrs.total_rows, " and ", PolicyName(attrs.policy));
        }
        return ::tensorflow::OkStatus();
      },
      resource);
}

// Copies `values` into a new [size] int64 output `i`.
::tensorflow::Status OutputVector(OpKernelContext* ctx, int i, const std::vector<int64_t>& values) {
  Tensor* out;
  TF_RETURN_IF_ERROR(
      ctx->allocate_output(i, TensorShape({static_cast<int64_t>(values.size())}), &out));
  std::copy(values.begin(), values.end(), out->flat<int64_t>().data());
  return ::tensorflow::OkStatus();
}

::tensorflow::Status CheckVector(const DeviceCache& cache, const Tensor& tensor,
                                 const char* what) {
  if (tensor.dims() == 1) return ::tensorflow::OkStatus();
  return errors::InvalidArgument("table '", cache.name(), "': ", what, " must be a vector, got ",
                                 tensor.shape().DebugString());
}

class DeviceCacheCreateOp : public OpKernel {
 public:
  explicit DeviceCacheCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    DeviceCacheResource* resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateCache(ctx, attrs_, &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    resource->cache().Clear();
  }

 private:
  CacheAttrs attrs_;
};

class DeviceCachePlanOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    DeviceCacheResource* resource;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    DeviceCache& cache = resource->cache();
    const Tensor& globals = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(cache, globals, "globals"));
    Tensor* slots;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, globals.shape(), &slots));
    Tensor* token;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &token));
    OP_REQUIRES_OK(ctx, GuardAllocation(cache.name(), "the device cache plan (host memory)", [&] {
                     return cache.Plan(globals.flat<int64_t>().data(), globals.NumElements(),
                                       slots->flat<int64_t>().data(),
                                       &token->scalar<int64_t>()());
                   }));
  }
};

class DeviceCacheApplyOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    DeviceCacheResource* resource;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    DeviceCache& cache = resource->cache();
    const Tensor& token = ctx->input(1);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(token.shape()),
                errors::InvalidArgument("table '", cache.name(),
                                        "': the device cache token must be a scalar, got ",
                                        token.shape().DebugString()));
    DeviceCache::Moves moves;
    OP_REQUIRES_OK(ctx, GuardAllocation(cache.name(), "the device cache moves (host memory)",
                                        [&] { return cache.Apply(token.scalar<int64_t>()(),
                                                                 &moves); }));
    const std::vector<int64_t>* parts[] = {&moves.swap_out_slots,  &moves.swap_out_globals,
                                           &moves.swap_in_slots,   &moves.swap_in_globals,
                                           &moves.swap_in_sources, &moves.erase_globals};
    for (int i = 0; i < 6; ++i) OP_REQUIRES_OK(ctx, OutputVector(ctx, i, *parts[i]));
  }
};

class DeviceCacheFinishOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    DeviceCacheResource* resource;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    const Tensor& token = ctx->input(1);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(token.shape()),
                errors::InvalidArgument("table '", resource->cache().name(),
                                        "': the device cache token must be a scalar, got ",
                                        token.shape().DebugString()));
    resource->cache().Finish(token.scalar<int64_t>()());
  }
};

class DeviceCacheReleaseOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    DeviceCacheResource* resource;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    DeviceCache& cache = resource->cache();
    const Tensor& globals = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(cache, globals, "released globals"));
    OP_REQUIRES_OK(ctx, GuardAllocation(cache.name(), "the device cache release (host memory)",
                                        [&] {
                                          return cache.Release(globals.flat<int64_t>().data(),
                                                               globals.NumElements());
                                        }));
  }
};

class DeviceCacheLocateOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    DeviceCacheResource* resource;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    const DeviceCache& cache = resource->cache();
    const Tensor& globals = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(cache, globals, "globals"));
    Tensor* slots;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, globals.shape(), &slots));
    cache.Locate(globals.flat<int64_t>().data(), globals.NumElements(),
                 slots->flat<int64_t>().data());
  }
};

class DeviceCacheExportStateOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    DeviceCacheResource* resource;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    const DeviceCache& cache = resource->cache();
    DeviceCache::State state;
    OP_REQUIRES_OK(ctx, GuardAllocation(cache.name(), "the exported device cache (host memory)",
                                        [&] { cache.ExportState(&state); }));
    const std::vector<int64_t>* parts[] = {&state.slots,     &state.globals, &state.last_used,
                                           &state.frequency, &state.dropped, &state.counters};
    for (int i = 0; i < 6; ++i) OP_REQUIRES_OK(ctx, OutputVector(ctx, i, *parts[i]));
  }
};

class DeviceCacheImportStateOp : public OpKernel {
 public:
  explicit DeviceCacheImportStateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    static const char* const kNames[] = {"slots",     "globals", "last_used",
                                         "frequency", "dropped", "counters"};
    DeviceCache::State state;
    std::vector<int64_t>* parts[] = {&state.slots,     &state.globals, &state.last_used,
                                     &state.frequency, &state.dropped, &state.counters};
    for (int i = 0; i < 6; ++i) {
      const Tensor& input = ctx->input(i + 1);
      OP_REQUIRES(ctx, input.dims() == 1,
                  errors::InvalidArgument("table '", attrs_.table_name, "': device cache state ",
                                          kNames[i], " must be a vector, got ",
                                          input.shape().DebugString()));
      const auto flat = input.flat<int64_t>();
      OP_REQUIRES_OK(ctx, GuardAllocation(attrs_.table_name,
                                          "the imported device cache (host memory)", [&] {
                                            parts[i]->assign(flat.data(),
                                                             flat.data() + flat.size());
                                          }));
    }
    DeviceCacheResource* resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateCache(ctx, attrs_, &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    OP_REQUIRES_OK(ctx, GuardAllocation(attrs_.table_name,
                                        "the imported device cache (host memory)",
                                        [&] { return resource->cache().ImportState(state); }));
  }

 private:
  CacheAttrs attrs_;
};

class DeviceCacheStatsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    DeviceCacheResource* resource;
    OP_REQUIRES_OK(ctx, LookupCache(ctx, &resource));
    ::tensorflow::core::ScopedUnref unref(resource);
    const DeviceCache::Stats stats = resource->cache().stats();
    const int64_t values[6] = {stats.device_rows, stats.occupied,  stats.hits,
                               stats.misses,      stats.swap_outs, stats.swap_ins};
    for (int i = 0; i < 6; ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({}), &out));
      out->scalar<int64_t>()() = values[i];
    }
  }
};

}  // namespace

// The cache is host state, planned by the key process: CPU kernels only.
#define MXREC_REGISTER_CPU(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(::tensorflow::DEVICE_CPU), kernel)
MXREC_REGISTER_CPU("MxDeviceCacheHandle", NamedHandleOp<DeviceCacheResource>);
MXREC_REGISTER_CPU("MxDeviceCacheCreate", DeviceCacheCreateOp);
MXREC_REGISTER_CPU("MxDeviceCachePlan", DeviceCachePlanOp);
MXREC_REGISTER_CPU("MxDeviceCacheApply", DeviceCacheApplyOp);
MXREC_REGISTER_CPU("MxDeviceCacheFinish", DeviceCacheFinishOp);
MXREC_REGISTER_CPU("MxDeviceCacheRelease", DeviceCacheReleaseOp);
MXREC_REGISTER_CPU("MxDeviceCacheLocate", DeviceCacheLocateOp);
MXREC_REGISTER_CPU("MxDeviceCacheExportState", DeviceCacheExportStateOp);
MXREC_REGISTER_CPU("MxDeviceCacheImportState", DeviceCacheImportStateOp);
MXREC_REGISTER_CPU("MxDeviceCacheStats", DeviceCacheStatsOp);
#undef MXREC_REGISTER_CPU

}  // namespace mxrec
