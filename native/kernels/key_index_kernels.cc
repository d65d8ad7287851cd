// CPU kernels of the key-index ops: a thin layer over mxrec::KeyIndex. Errors of
// the core cross into TensorFlow here, once, as OP_REQUIRES statuses.
#include <atomic>
#include <limits>
#include <new>
#include <string>
#include <vector>

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

// The key index of one table as a TensorFlow resource. Thread-safe: KeyIndex
// locks internally (shared for reads, exclusive for writes).
class KeyIndexResource : public ::tensorflow::ResourceBase {
 public:
  // How a failed lookup names the index (see LookupOrFail).
  static constexpr char kKind[] = "the key index of table";
  static constexpr char kFirstUse[] = "insertion or lookup";

  KeyIndexResource(int64_t capacity, const std::string& table_name, bool growable,
                   const std::string& rows_text, const std::string& grow_text)
      : index_(capacity, table_name, growable, rows_text, grow_text) {}

  KeyIndex& index() { return index_; }
  const KeyIndex& index() const { return index_; }

  // Distinct keys of the last insertion batch: Deduplicate's expected_unique
  // for the next one (batches of a stream hold about as many). Speed only.
  int64_t unique_hint() const { return unique_hint_.load(std::memory_order_relaxed); }
  void set_unique_hint(int64_t unique) { unique_hint_.store(unique, std::memory_order_relaxed); }

  std::string DebugString() const override {
    return "KeyIndex(table=" + index_.name() + ", size=" + std::to_string(index_.size()) +
           ", capacity=" + std::to_string(index_.capacity()) +
           (index_.growable() ? ", growable)" : ")");
  }
  int64_t MemoryUsed() const override { return index_.MemoryBytes(); }

 private:
  KeyIndex index_;
  std::atomic<int64_t> unique_hint_{0};
};

namespace {

// The attrs of MxKeyIndexCreate, MxKeyIndexImport and MxKeyIndexImportState.
struct IndexAttrs {
  int64_t capacity;
  bool growable;
  std::string table_name;
  std::string rows_text, grow_text;  // Wording of the "table is full" error (KeyIndex).

  explicit IndexAttrs(OpKernelConstruction* ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("capacity", &capacity));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("growable", &growable));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rows_text", &rows_text));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("grow_text", &grow_text));
  }
};

// LookupOrCreate with `attrs.capacity` rows (growable or not); an existing
// index must have that capacity and mode.
::tensorflow::Status LookupOrCreateIndex(OpKernelContext* ctx, const IndexAttrs& attrs,
                                         RefCountPtr<KeyIndexResource>* resource) {
  const int64_t capacity = attrs.capacity;
  const bool growable = attrs.growable;
  const std::string& table_name = attrs.table_name;
  if (capacity > KeyIndex::kMaxCapacity) {
    return errors::InvalidArgument("table '", table_name, "': device_vocabulary_size=", capacity,
                                   " is above the supported maximum of ",
                                   KeyIndex::kMaxCapacity, " rows");
  }
  // The slot array is allocated on creation: when the host cannot hold it, the
  // op fails instead of an exception escaping into TensorFlow.
  return LookupOrCreateChecked(
      ctx, table_name,
      "the key index of device_vocabulary_size=" + std::to_string(capacity) + " (at least " +
          std::to_string(32 * capacity) +
          " bytes of host memory); create the table with a smaller device_vocabulary_size",
      [&] {
        return new KeyIndexResource(capacity, table_name, growable, attrs.rows_text,
                                    attrs.grow_text);
      },
      [&](const KeyIndexResource& existing) -> ::tensorflow::Status {
        const int64_t existing_capacity = existing.index().capacity();
        const bool existing_growable = existing.index().growable();
        if (existing_growable != growable) {
          return errors::InvalidArgument("table '", table_name, "' already has a ",
                                         existing_growable ? "growable" : "fixed-size",
                                         " key index; it cannot become ",
                                         growable ? "growable" : "fixed-size");
        }
        if (existing_capacity != capacity) {
          return errors::InvalidArgument(
              "table '", table_name, "' already has a key index with device_vocabulary_size=",
              existing_capacity, ", not ", capacity);
        }
        return ::tensorflow::OkStatus();
      },
      resource);
}

// The insertion ops' common start: checks that `keys` has at most 2^31-1
// elements, allocates output 1, restore (keys' shape) int32, and fills it and
// *unique with the distinct keys in first-occurrence order (sized by the
// resource's hint, which it then updates).
::tensorflow::Status DedupKeys(OpKernelContext* ctx, KeyIndexResource& resource, const Tensor& keys,
                               std::vector<int64_t>* unique, Tensor** restore) {
  const KeyIndex& index = resource.index();
  const int64_t n = keys.NumElements();
  if (n > std::numeric_limits<int32_t>::max()) {
    return errors::InvalidArgument("table '", index.name(), "': ", n,
                                   " keys in one insertion; at most 2^31-1 are supported");
  }
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, keys.shape(), restore));
  TF_RETURN_IF_ERROR(GuardAllocation(index.name(), "the distinct keys (host memory)", [&] {
    Deduplicate(keys.flat<int64_t>().data(), n, unique, (*restore)->flat<int32_t>().data(),
                resource.unique_hint());
  }));
  resource.set_unique_hint(static_cast<int64_t>(unique->size()));
  return ::tensorflow::OkStatus();
}

class KeyIndexCreateOp : public OpKernel {
 public:
  explicit KeyIndexCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<KeyIndexResource> resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateIndex(ctx, attrs_, &resource));
    resource->index().Clear();
  }

 private:
  IndexAttrs attrs_;
};

class KeyIndexInsertOp : public ExistingResourceOp<KeyIndexResource> {
 public:
  explicit KeyIndexInsertOp(OpKernelConstruction* ctx) : ExistingResourceOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("training", &training_));
  }

  void ComputeWith(OpKernelContext* ctx, KeyIndexResource& resource) override {
    KeyIndex& index = resource.index();
    std::vector<int64_t> unique;
    Tensor* restore;
    OP_REQUIRES_OK(ctx, DedupKeys(ctx, resource, ctx->input(1), &unique, &restore));

    const int64_t num_unique = static_cast<int64_t>(unique.size());
    Tensor* rows;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_unique}), &rows));
    if (training_) {
      // Each key's occurrences in the batch, when the index counts touches
      // (recent_key_count_threshold of delta checkpoints).
      std::vector<int64_t> occurrences;
      if (index.counting_touches()) {
        occurrences.assign(unique.size(), 0);
        const auto positions = restore->flat<int32_t>();
        for (int64_t i = 0; i < positions.size(); ++i) ++occurrences[positions(i)];
      }
      OP_REQUIRES_OK(ctx, GuardAllocation(index.name(), "new keys (host memory)", [&] {
                       return index.FindOrInsert(unique.data(), num_unique,
                                                 rows->flat<int64_t>().data(),
                                                 occurrences.empty() ? nullptr
                                                                     : occurrences.data());
                     }));
    } else {
      index.Find(unique.data(), num_unique, rows->flat<int64_t>().data());
    }
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, unique));
  }

 private:
  bool training_;
};

class KeyIndexSizeOp : public ExistingResourceOp<KeyIndexResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, KeyIndexResource& resource) override {
    OP_REQUIRES_OK(ctx,
                   OutputScalars(ctx, {resource.index().size(), resource.index().MemoryBytes()}));
  }
};

class KeyIndexExportOp : public ExistingResourceOp<KeyIndexResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, KeyIndexResource& resource) override {
    std::vector<int64_t> keys, rows;
    OP_REQUIRES_OK(ctx, GuardAllocation(resource.index().name(), "the exported keys (host memory)",
                                        [&] { resource.index().Export(&keys, &rows); }));
    OP_REQUIRES_OK(ctx, OutputVectors(ctx, {&keys, &rows}));
  }
};

class KeyIndexImportOp : public OpKernel {
 public:
  explicit KeyIndexImportOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& rows = ctx->input(2);
    OP_REQUIRES(ctx, keys.dims() == 1 && rows.dims() == 1 &&
                         keys.NumElements() == rows.NumElements(),
                errors::InvalidArgument("table '", attrs_.table_name,
                                        "': keys and rows must be vectors of one length, got ",
                                        keys.shape().DebugString(), " and ",
                                        rows.shape().DebugString()));
    RefCountPtr<KeyIndexResource> resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateIndex(ctx, attrs_, &resource));
    OP_REQUIRES_OK(ctx, GuardAllocation(attrs_.table_name, "the imported keys (host memory)", [&] {
                     return resource->index().Import(keys.flat<int64_t>().data(),
                                                      rows.flat<int64_t>().data(),
                                                      keys.NumElements());
                   }));
  }

 private:
  IndexAttrs attrs_;
};

class KeyIndexInsertAdmitOp : public ExistingResourceOp<KeyIndexResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, KeyIndexResource& resource) override {
    KeyIndex& index = resource.index();
    const Tensor& keys = ctx->input(1);
    const Tensor& counts = ctx->input(2);
    const Tensor& timestamp = ctx->input(3);
    const Tensor& threshold = ctx->input(4);
    const int64_t n = keys.NumElements();
    OP_REQUIRES(ctx, counts.shape() == keys.shape(),
                errors::InvalidArgument("table '", index.name(), "': counts must have the keys' "
                                        "shape ", keys.shape().DebugString(), ", got ",
                                        counts.shape().DebugString()));
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(timestamp.shape()) &&
                         ::tensorflow::TensorShapeUtils::IsScalar(threshold.shape()),
                errors::InvalidArgument("table '", index.name(), "': timestamp and "
                                        "access_threshold must be scalars, got ",
                                        timestamp.shape().DebugString(), " and ",
                                        threshold.shape().DebugString()));
    std::vector<int64_t> unique;
    Tensor* restore;
    OP_REQUIRES_OK(ctx, DedupKeys(ctx, resource, keys, &unique, &restore));
    const auto restore_flat = restore->flat<int32_t>();
    const int64_t num_unique = static_cast<int64_t>(unique.size());
    // Sums each distinct key's counts over its occurrences.
    std::vector<int64_t> unique_counts;
    OP_REQUIRES_OK(ctx, GuardAllocation(index.name(), "the key counts (host memory)",
                                        [&] { unique_counts.assign(unique.size(), 0); }));
    const auto counts_flat = counts.flat<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, counts_flat(i) >= 0,
                  errors::InvalidArgument("table '", index.name(), "': counts must be >= 0, got ",
                                          counts_flat(i)));
      unique_counts[restore_flat(i)] += counts_flat(i);
    }
    Tensor* rows;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_unique}), &rows));
    OP_REQUIRES_OK(ctx, GuardAllocation(index.name(), "new or pending keys (host memory)", [&] {
                     return index.FindOrInsertAdmitting(
                         unique.data(), unique_counts.data(), num_unique,
                         threshold.scalar<int64_t>()(), timestamp.scalar<int64_t>()(),
                         rows->flat<int64_t>().data());
                   }));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, unique));
  }
};

class KeyIndexEvictOp : public ExistingResourceOp<KeyIndexResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, KeyIndexResource& resource) override {
    KeyIndex& index = resource.index();
    int64_t idle = 0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, &idle, "idle_seconds must be a scalar, got "));
    OP_REQUIRES(ctx, idle >= 0,
                errors::InvalidArgument("table '", index.name(),
                                        "': eviction_threshold must be >= 0 seconds, got ",
                                        idle));
    std::vector<int64_t> freed;
    OP_REQUIRES_OK(ctx, GuardAllocation(index.name(), "the freed rows (host memory)",
                                        [&] { index.Evict(idle, &freed); }));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, freed));
  }
};

class KeyIndexStatsOp : public ExistingResourceOp<KeyIndexResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, KeyIndexResource& resource) override {
    const KeyIndex::Stats stats = resource.index().stats();
    OP_REQUIRES_OK(ctx, OutputVector<int64_t>(ctx, 0, {stats.size, stats.capacity,
                                                       stats.admissions, stats.evictions,
                                                       stats.pending}));
  }
};

class KeyIndexExportStateOp : public ExistingResourceOp<KeyIndexResource> {
 public:
  using ExistingResourceOp::ExistingResourceOp;

  void ComputeWith(OpKernelContext* ctx, KeyIndexResource& resource) override {
    KeyIndex::State state;
    OP_REQUIRES_OK(ctx, GuardAllocation(resource.index().name(),
                                        "the exported admission state (host memory)",
                                        [&] { resource.index().ExportState(&state); }));
    OP_REQUIRES_OK(ctx, OutputVectors(ctx, {&state.keys, &state.rows, &state.last_seen,
                                            &state.pending_keys, &state.pending_counts,
                                            &state.pending_last_seen, &state.counters}));
  }
};

class KeyIndexExportChangesOp : public ExistingResourceOp<KeyIndexResource> {
 public:
  explicit KeyIndexExportChangesOp(OpKernelConstruction* ctx) : ExistingResourceOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clear", &clear_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_count", &min_count_));
  }

  void ComputeWith(OpKernelContext* ctx, KeyIndexResource& resource) override {
    KeyIndex::Changes changes;
    OP_REQUIRES_OK(ctx, GuardAllocation(resource.index().name(),
                                        "the exported changes (host memory)", [&] {
                                          resource.index().ExportChanges(clear_, &changes,
                                                                         min_count_);
                                        }));
    KeyIndex::State& state = changes.changed;
    OP_REQUIRES_OK(ctx, OutputVectors(ctx, {&state.keys, &state.rows, &state.last_seen,
                                            &state.pending_keys, &state.pending_counts,
                                            &state.pending_last_seen, &state.counters,
                                            &changes.deleted}));
  }

 private:
  bool clear_ = false;
  int64_t min_count_ = 0;
};

class KeyIndexImportStateOp : public OpKernel {
 public:
  explicit KeyIndexImportStateOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    KeyIndex::State state;
    std::vector<int64_t>* parts[] = {&state.keys,           &state.rows,
                                     &state.last_seen,      &state.pending_keys,
                                     &state.pending_counts, &state.pending_last_seen,
                                     &state.counters};
    for (int i = 0; i < 7; ++i) {
      const Tensor& input = ctx->input(i + 1);
      OP_REQUIRES_OK(ctx, CheckVector(attrs_.table_name, input, "admission state input ", i));
      const auto flat = input.flat<int64_t>();
      parts[i]->assign(flat.data(), flat.data() + flat.size());
    }
    RefCountPtr<KeyIndexResource> resource;
    OP_REQUIRES_OK(ctx, LookupOrCreateIndex(ctx, attrs_, &resource));
    OP_REQUIRES_OK(ctx, GuardAllocation(attrs_.table_name,
                                        "the imported admission state (host memory)",
                                        [&] { return resource->index().ImportState(state); }));
  }

 private:
  IndexAttrs attrs_;
};

}  // namespace

// The index is host state: kernels are registered for the CPU only, and a GPU
// graph places these ops on the host, as mxRec runs its key process on the host.
MXREC_REGISTER_CPU("MxKeyIndexHandle", NamedHandleOp<KeyIndexResource>);
MXREC_REGISTER_CPU("MxKeyIndexCreate", KeyIndexCreateOp);
MXREC_REGISTER_CPU("MxKeyIndexInsert", KeyIndexInsertOp);
MXREC_REGISTER_CPU("MxKeyIndexSize", KeyIndexSizeOp);
MXREC_REGISTER_CPU("MxKeyIndexExport", KeyIndexExportOp);
MXREC_REGISTER_CPU("MxKeyIndexImport", KeyIndexImportOp);
MXREC_REGISTER_CPU("MxKeyIndexInsertAdmit", KeyIndexInsertAdmitOp);
MXREC_REGISTER_CPU("MxKeyIndexEvict", KeyIndexEvictOp);
MXREC_REGISTER_CPU("MxKeyIndexStats", KeyIndexStatsOp);
MXREC_REGISTER_CPU("MxKeyIndexExportState", KeyIndexExportStateOp);
MXREC_REGISTER_CPU("MxKeyIndexImportState", KeyIndexImportStateOp);
MXREC_REGISTER_CPU("MxKeyIndexExportChanges", KeyIndexExportChangesOp);

}  // namespace mxrec
