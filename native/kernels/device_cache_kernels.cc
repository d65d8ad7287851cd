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
using ::tensorflow::core::RefCountPtr;
namespace errors = ::tensorflow::errors;

// The device cache of one tiered table as a TensorFlow resource. Thread-safe:
// DeviceCache locks internally.
class DeviceCacheResource : public ::tensorflow::ResourceBase {
 public:
  // How a failed lookup names the cache (see LookupOrFail).
  static constexpr char kKind[] = "the device cache of table";
  static constexpr char kFirstUse[] = "lookup";

  DeviceCacheResource(int64_t device_rows, int64_t total_rows, DeviceCache::Policy policy,
                      const std::string& table_name, double wait_seconds, bool pin_until_finish)
      : cache_(device_rows, total_rows, policy, table_name, wait_seconds, pin_until_finish) {}

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
  bool pin_until_finish;

  ::tensorflow::Status Read(OpKernelConstruction* ctx) {
    std::string policy_name;
    TF_RETURN_IF_ERROR(ctx->GetAttr("device_rows", &device_rows));
    TF_RETURN_IF_ERROR(ctx->GetAttr("total_rows", &total_rows));
    TF_RETURN_IF_ERROR(ctx->GetAttr("policy", &policy_name));
    TF_RETURN_IF_ERROR(ctx->GetAttr("table_name", &table_name));
    TF_RETURN_IF_ERROR(ctx->GetAttr("wait_seconds", &wait_seconds));
    TF_RETURN_IF_ERROR(ctx->GetAttr("pin_until_finish", &pin_until_finish));
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

// LookupOrCreate with `attrs`; an existing cache must have their sizes and policy.
::tensorflow::Status LookupOrCreateCache(OpKernelContext* ctx, const CacheAttrs& attrs,
                                         RefCountPtr<DeviceCacheResource>* resource) {
  return LookupOrCreateChecked(
      ctx, attrs.table_name,
      "the device cache of device_vocabulary_size=" + std::to_string(attrs.device_rows) +
          " over " + std::to_string(attrs.total_rows) + " rows (at least " +
          std::to_string(8 * attrs.total_rows + 70 * attrs.device_rows) +
          " bytes of host memory)",
      [&] {
        return new DeviceCacheResource(attrs.device_rows, attrs.total_rows, attrs.policy,
                                       attrs.table_name, attrs.wait_seconds,
                                       attrs.pin_until_finish);
      },
      [&](const DeviceCacheResource& existing) -> ::tensorflow::Status {
        const DeviceCache& cache = existing.cache();
        if (cache.device_rows() != attrs.device_rows || cache.total_rows() != attrs.total_rows ||
            cache.policy() != attrs.policy ||
            cache.pin_until_finish() != attrs.pin_until_finish) {
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

// Reads the plan token, input 1 (a scalar).
::tensorflow::Status TokenInput(OpKernelContext* ctx, const DeviceCache& cache, int64_t* token) {
  return ScalarInput(ctx, 1, token, "table '", cache.name(),
                     "': the device cache token must be a scalar, got ");
}

class DeviceCacheCreateOp : public OpKernel {
 public:
  explicit DeviceCacheCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DeviceCacheResource> resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateCache(ctx, attrs_, &resource));
    resource->cache().Clear();
  }

 private:
  CacheAttrs attrs_;
};

class DeviceCachePlanOp : public ExistingResourceOp<DeviceCacheResource> {
 public:
  explicit DeviceCachePlanOp(OpKernelConstruction* ctx) : ExistingResourceOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("wait", &wait_));
  }

  void ComputeWith(OpKernelContext* ctx, DeviceCacheResource& resource) override {
    DeviceCache& cache = resource.cache();
    const Tensor& globals = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(cache.name(), globals, "globals"));
    Tensor* slots;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, globals.shape(), &slots));
    Tensor* token;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &token));
    // A stopped input pipeline (iterator deleted, session closed) cancels a
    // plan waiting for room instead of holding the process for wait_seconds.
    ::tensorflow::CancellationManager* cancellation = ctx->cancellation_manager();
    const auto cancelled = [cancellation] {
      return cancellation != nullptr && cancellation->IsCancelled();
    };
    OP_REQUIRES_OK(ctx, GuardAllocation(cache.name(), "the device cache plan (host memory)", [&] {
                     return cache.Plan(globals.flat<int64_t>().data(), globals.NumElements(),
                                       slots->flat<int64_t>().data(),
                                       &token->scalar<int64_t>()(), cancelled, wait_);
                   }));
  }

 private:
  bool wait_;
};

class DeviceCacheApplyOp : public ExistingResourceOp<DeviceCacheResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, DeviceCacheResource& resource) override {
    DeviceCache& cache = resource.cache();
    int64_t token = 0;
    OP_REQUIRES_OK(ctx, TokenInput(ctx, cache, &token));
    DeviceCache::Moves moves;
    OP_REQUIRES_OK(ctx, GuardAllocation(cache.name(), "the device cache moves (host memory)",
                                        [&] { return cache.Apply(token, &moves); }));
    OP_REQUIRES_OK(ctx, OutputVectors(ctx, {&moves.swap_out_slots, &moves.swap_out_globals,
                                            &moves.swap_in_slots, &moves.swap_in_globals,
                                            &moves.swap_in_sources, &moves.erase_globals}));
  }
};

class DeviceCacheFinishOp : public ExistingResourceOp<DeviceCacheResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, DeviceCacheResource& resource) override {
    int64_t token = 0;
    OP_REQUIRES_OK(ctx, TokenInput(ctx, resource.cache(), &token));
    OP_REQUIRES_OK(ctx, ToTf(resource.cache().Finish(token)));
  }
};

class DeviceCacheReleaseOp : public ExistingResourceOp<DeviceCacheResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, DeviceCacheResource& resource) override {
    DeviceCache& cache = resource.cache();
    const Tensor& globals = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(cache.name(), globals, "released globals"));
    OP_REQUIRES_OK(ctx, GuardAllocation(cache.name(), "the device cache release (host memory)",
                                        [&] {
                                          return cache.Release(globals.flat<int64_t>().data(),
                                                               globals.NumElements());
                                        }));
  }
};

class DeviceCacheLocateOp : public ExistingResourceOp<DeviceCacheResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, DeviceCacheResource& resource) override {
    const DeviceCache& cache = resource.cache();
    const Tensor& globals = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(cache.name(), globals, "globals"));
    Tensor* slots;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, globals.shape(), &slots));
    cache.Locate(globals.flat<int64_t>().data(), globals.NumElements(),
                 slots->flat<int64_t>().data());
  }
};

class DeviceCacheExportStateOp : public ExistingResourceOp<DeviceCacheResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, DeviceCacheResource& resource) override {
    const DeviceCache& cache = resource.cache();
    DeviceCache::State state;
    OP_REQUIRES_OK(ctx, GuardAllocation(cache.name(), "the exported device cache (host memory)",
                                        [&] { cache.ExportState(&state); }));
    OP_REQUIRES_OK(ctx, OutputVectors(ctx, {&state.slots, &state.globals, &state.last_used,
                                            &state.frequency, &state.dropped, &state.counters}));
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
      OP_REQUIRES_OK(ctx, CheckVector(attrs_.table_name, input, "device cache state ", kNames[i]));
      const auto flat = input.flat<int64_t>();
      OP_REQUIRES_OK(ctx, GuardAllocation(attrs_.table_name,
                                          "the imported device cache (host memory)", [&] {
                                            parts[i]->assign(flat.data(),
                                                             flat.data() + flat.size());
                                          }));
    }
    RefCountPtr<DeviceCacheResource> resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateCache(ctx, attrs_, &resource));
    OP_REQUIRES_OK(ctx, GuardAllocation(attrs_.table_name,
                                        "the imported device cache (host memory)",
                                        [&] { return resource->cache().ImportState(state); }));
  }

 private:
  CacheAttrs attrs_;
};

class DeviceCacheStatsOp : public ExistingResourceOp<DeviceCacheResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, DeviceCacheResource& resource) override {
    const DeviceCache::Stats stats = resource.cache().stats();
    OP_REQUIRES_OK(ctx, OutputScalars(ctx, {stats.device_rows, stats.occupied, stats.hits,
                                            stats.misses, stats.swap_outs, stats.swap_ins}));
  }
};

}  // namespace

// The cache is host state, planned by the key process: CPU kernels only.
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

}  // namespace mxrec
