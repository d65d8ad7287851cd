// Registrations and shape functions of the key-index ops. Kernels live in
// native/kernels/key_index_kernels.cc; the math in native/core (no TF there).
#include "common.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace mxrec {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// The insertion ops' outputs: unique_rows and unique_keys [num_unique], restore
// of the keys' (input 1's) shape, known or not.
void InsertionOutputs(InferenceContext* c) {
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, c->input(1));
  c->set_output(2, c->Vector(c->UnknownDim()));
}

}  // namespace

REGISTER_OP("MxKeyIndexHandle")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Handle of the key index named `shared_name`; does not create it.");

REGISTER_OP("MxKeyIndexCreate")
    .Input("handle: resource")
    .Attr("capacity: int >= 1")
    .Attr("growable: bool = false")
    .Attr("table_name: string")
    .Attr("rows_text: string = ''")
    .Attr("grow_text: string = ''")
    .SetIsStateful()
    .SetShapeFn(ScalarHandle)
    .Doc(R"doc(
Creates the key index with `capacity` rows, or empties an existing one.

growable: rows are handed out past `capacity` (dynamic-expansion tables): the
  index grows instead of failing when full.
rows_text: how the "table is full" error states the rows (a tiered table's
  device + host + SSD rows); empty: "device_vocabulary_size=<capacity> rows".
grow_text: the remedy that error gives; empty: "Create the table with a
  larger device_vocabulary_size".
)doc");

REGISTER_OP("MxKeyIndexInsert")
    .Input("handle: resource")
    .Input("keys: int64")
    .Output("unique_rows: int64")
    .Output("restore: int32")
    .Output("unique_keys: int64")
    .Attr("training: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      InsertionOutputs(c);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Deduplicates `keys` and maps each distinct key to its row.

keys: [any shape] int64 raw feature ids.
unique_rows: [num_unique] int64 rows, in first-occurrence order. With training
  true, absent keys get rows (the op fails with ResourceExhausted when the table is
  full, inserting nothing); with training false absent keys read -1.
restore: keys' shape, int32: keys == unique_keys[restore].
unique_keys: [num_unique] int64 distinct keys.
)doc");

REGISTER_OP("MxKeyIndexSize")
    .Input("handle: resource")
    .Output("size: int64")
    .Output("memory_bytes: int64")
    .SetIsStateful()
    .SetShapeFn(HandleToScalars<2>)
    .Doc("Number of stored keys, and bytes held by the index (not the rows).");

REGISTER_OP("MxKeyIndexExport")
    .Input("handle: resource")
    .Output("keys: int64")
    .Output("rows: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status { return VectorsShape(c, 0, 2); })
    .Doc("Every stored (key, row) pair as two [size] int64 vectors, unordered.");

REGISTER_OP("MxKeyIndexImport")
    .Input("handle: resource")
    .Input("keys: int64")
    .Input("rows: int64")
    .Attr("capacity: int >= 1")
    .Attr("growable: bool = false")
    .Attr("table_name: string")
    .Attr("rows_text: string = ''")
    .Attr("grow_text: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle keys, rows;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &keys));
      TF_RETURN_IF_ERROR(VectorInput(c, 2, &rows));
      return c->Merge(keys, rows, &keys);
    })
    .Doc("Creates the index if needed and replaces its content with (keys, rows).");

REGISTER_OP("MxKeyIndexInsertAdmit")
    .Input("handle: resource")
    .Input("keys: int64")
    .Input("counts: int64")
    .Input("timestamp: int64")
    .Input("access_threshold: int64")
    .Output("unique_rows: int64")
    .Output("restore: int32")
    .Output("unique_keys: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->input(1), c->input(2), &unused));
      TF_RETURN_IF_ERROR(ScalarInput(c, 3));
      TF_RETURN_IF_ERROR(ScalarInput(c, 4));
      InsertionOutputs(c);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Training insertion with feature admission (mxRec's access_threshold).

keys: [any shape] int64 raw feature ids.
counts: keys' shape, int64 >= 0: what each occurrence adds to its key's count
  (the feature's faae_coefficient).
timestamp: int64 scalar, the batch's time in seconds (-1: none); the last-seen
  time of every key of the batch.
access_threshold: int64 scalar; an absent key gets a row once its summed count
  reaches it, else its unique row is -1 (it reads the default value).
unique_rows, restore, unique_keys: as MxKeyIndexInsert.
)doc");

REGISTER_OP("MxKeyIndexEvict")
    .Input("handle: resource")
    .Input("idle_seconds: int64")
    .Output("freed_rows: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      c->set_output(0, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Removes keys last seen more than `idle_seconds` before the latest timestamp seen.

freed_rows: [num_evicted] int64, ascending: rows now free (reused lowest first).
)doc");

REGISTER_OP("MxKeyIndexStats")
    .Input("handle: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      c->set_output(0, c->Vector(5));
      return ::tensorflow::OkStatus();
    })
    .Doc("[5] int64: size, capacity, admissions, evictions, pending keys.");

REGISTER_OP("MxKeyIndexExportState")
    .Input("handle: resource")
    .Output("keys: int64")
    .Output("rows: int64")
    .Output("last_seen: int64")
    .Output("pending_keys: int64")
    .Output("pending_counts: int64")
    .Output("pending_last_seen: int64")
    .Output("counters: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(VectorsShape(c, 0, 6));
      c->set_output(6, c->Vector(3));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The index with its admission and eviction state, for checkpoints: admitted
(keys, rows, last_seen), pending (keys, counts, last_seen), and counters
[admissions, evictions, latest timestamp].
)doc");

REGISTER_OP("MxKeyIndexExportChanges")
    .Input("handle: resource")
    .Output("keys: int64")
    .Output("rows: int64")
    .Output("last_seen: int64")
    .Output("pending_keys: int64")
    .Output("pending_counts: int64")
    .Output("pending_last_seen: int64")
    .Output("counters: int64")
    .Output("deleted_keys: int64")
    .Attr("clear: bool")
    .Attr("min_count: int >= 0 = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(VectorsShape(c, 0, 6));
      c->set_output(6, c->Vector(3));
      c->set_output(7, c->Vector(InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
What changed since change tracking began or since the last call with `clear`
(which starts anew and turns tracking on), for delta checkpoints: the
admitted keys whose rows training touched (keys, rows, last_seen; every
admitted key before tracking began), the whole pending state, the counters
and the keys eviction removed. `min_count` > 0 (mxRec's
recent_key_count_threshold): only the keys touched at least that often since
the last clear; with `clear`, touches are counted from then on (0: not).
)doc");

REGISTER_OP("MxKeyIndexImportState")
    .Input("handle: resource")
    .Input("keys: int64")
    .Input("rows: int64")
    .Input("last_seen: int64")
    .Input("pending_keys: int64")
    .Input("pending_counts: int64")
    .Input("pending_last_seen: int64")
    .Input("counters: int64")
    .Attr("capacity: int >= 1")
    .Attr("growable: bool = false")
    .Attr("table_name: string")
    .Attr("rows_text: string = ''")
    .Attr("grow_text: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle admitted, pending;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &admitted));
      TF_RETURN_IF_ERROR(c->Merge(admitted, c->input(2), &admitted));
      TF_RETURN_IF_ERROR(c->Merge(admitted, c->input(3), &admitted));
      TF_RETURN_IF_ERROR(VectorInput(c, 4, &pending));
      TF_RETURN_IF_ERROR(c->Merge(pending, c->input(5), &pending));
      TF_RETURN_IF_ERROR(c->Merge(pending, c->input(6), &pending));
      return VectorInput(c, 7);
    })
    .Doc("Creates the index if needed and replaces its content with an exported state.");

}  // namespace mxrec
