// Registrations and shape functions of the device-cache ops of tiered tables.
// Kernels live in native/kernels/device_cache_kernels.cc; the planning in
// native/core/device_cache.cc (no TF there). Every op takes the cache handle
// first.
#include "common.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace mxrec {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// Handle and globals [n] -> slots [n] (and more outputs set by the caller).
Status GlobalsToSlots(InferenceContext* c) {
  TF_RETURN_IF_ERROR(ScalarHandle(c));
  ShapeHandle globals;
  TF_RETURN_IF_ERROR(VectorInput(c, 1, &globals));
  c->set_output(0, globals);
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("MxDeviceCacheHandle")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Handle of the device cache named `shared_name`; does not create it.");

REGISTER_OP("MxDeviceCacheCreate")
    .Input("handle: resource")
    .Attr("device_rows: int >= 1")
    .Attr("total_rows: int >= 1")
    .Attr("policy: string")
    .Attr("table_name: string")
    .Attr("wait_seconds: float = 60")
    .Attr("pin_until_finish: bool = false")
    .SetIsStateful()
    .SetShapeFn(ScalarHandle)
    .Doc(R"doc(
Creates the device cache of a tiered table, or empties an existing one (tokens
planned before then are refused).

device_rows: slots of the device variable (device_vocabulary_size).
total_rows: global rows of the table (device + host + ssd vocabulary).
policy: "lru" or "lfu", the choice of victims.
wait_seconds: how long a plan waits for batches in flight to be trained when
  the cache has too few evictable slots.
)doc");

REGISTER_OP("MxDeviceCachePlan")
    .Input("handle: resource")
    .Input("globals: int64")
    .Output("slots: int64")
    .Output("token: int64")
    .Attr("wait: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(GlobalsToSlots(c));
      c->set_output(1, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Plans a batch ahead of training (key-process side).

globals: [n] int64 distinct global rows of the batch; -1 (ids without a row)
  may repeat.
slots: [n] int64 device slot of each global, -1 for -1.
token: the plan, to give to MxDeviceCacheApply in the batch's training step.
wait: without room, wait up to the cache's wait_seconds for training steps to
  catch up (the key process on tf.data threads); false for a plan made by the
  training thread itself (eager or in-step lookups), which fails at once.
)doc");

REGISTER_OP("MxDeviceCacheApply")
    .Input("handle: resource")
    .Input("token: int64")
    .Output("swap_out_slots: int64")
    .Output("swap_out_globals: int64")
    .Output("swap_in_slots: int64")
    .Output("swap_in_globals: int64")
    .Output("swap_in_sources: int64")
    .Output("erase_globals: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      ShapeHandle swap_out = c->Vector(c->UnknownDim());
      ShapeHandle swap_in = c->Vector(c->UnknownDim());
      c->set_output(0, swap_out);
      c->set_output(1, swap_out);
      for (int i = 2; i < 5; ++i) c->set_output(i, swap_in);
      c->set_output(5, c->Vector(c->UnknownDim()));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The data moves the training step of plan `token` makes before its lookup,
composed over every earlier plan not applied yet; empty when already applied.
In this order: read the swap_out rows and the swap_in source rows (>= 0) from
the device variable; erase `erase_globals` from the host store; take the
swap_in globals whose source is -1 from the store (absent: a fresh row); put the
swap_out rows into the store; write every swap_in row into its slot.
)doc");

REGISTER_OP("MxDeviceCacheFinish")
    .Input("handle: resource")
    .Input("token: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      return ScalarInput(c, 1);
    })
    .Doc(R"doc(
The training step of the plan `token` finished (its optimizer update ran): that
batch's device rows stop being pinned, so the key process may evict them for the
next batch at once. Stale tokens are ignored.
)doc");

REGISTER_OP("MxDeviceCacheRelease")
    .Input("handle: resource")
    .Input("globals: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status { return VectorsShape(c, 1, 0); })
    .Doc(R"doc(
Globals freed by the key index (evicted idle keys): they leave the cache, and
their host-store rows are erased by the Apply of the next plan. -1 is ignored.
)doc");

REGISTER_OP("MxDeviceCacheLocate")
    .Input("handle: resource")
    .Input("globals: int64")
    .Output("slots: int64")
    .SetIsStateful()
    .SetShapeFn(GlobalsToSlots)
    .Doc(R"doc(
Evaluation reads on the applied mapping: the slot of each global, -1 when it is
not on the device (read the host store), -2 when its drop is pending (read the
initial value).
)doc");

REGISTER_OP("MxDeviceCacheExportState")
    .Input("handle: resource")
    .Output("slots: int64")
    .Output("globals: int64")
    .Output("last_used: int64")
    .Output("frequency: int64")
    .Output("dropped: int64")
    .Output("counters: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(VectorsShape(c, 0, 6));
      c->set_output(5, c->Vector(5));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The applied state, for checkpoints: (slots, globals, last_used, frequency) of
the cached rows, the globals with a pending drop, and counters = {applied_seq,
hits, misses, swap_outs, swap_ins}.
)doc");

REGISTER_OP("MxDeviceCacheImportState")
    .Input("handle: resource")
    .Input("slots: int64")
    .Input("globals: int64")
    .Input("last_used: int64")
    .Input("frequency: int64")
    .Input("dropped: int64")
    .Input("counters: int64")
    .Attr("device_rows: int >= 1")
    .Attr("total_rows: int >= 1")
    .Attr("policy: string")
    .Attr("table_name: string")
    .Attr("wait_seconds: float = 60")
    .Attr("pin_until_finish: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status { return VectorsShape(c, 6, 0); })
    .Doc(R"doc(
Creates the device cache if missing, then replaces its content with an exported
state (tokens planned before then are refused).
)doc");

REGISTER_OP("MxDeviceCacheStats")
    .Input("handle: resource")
    .Output("device_rows: int64")
    .Output("occupied: int64")
    .Output("hits: int64")
    .Output("misses: int64")
    .Output("swap_outs: int64")
    .Output("swap_ins: int64")
    .SetIsStateful()
    .SetShapeFn(HandleToScalars<6>)
    .Doc(R"doc(
Slots, slots holding a row (planned), hits and misses of the plans, rows
swapped out and in by the applies.
)doc");

}  // namespace mxrec
