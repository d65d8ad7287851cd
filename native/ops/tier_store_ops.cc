// Registrations and shape functions of the tier-store ops: the host-memory and
// SSD tiers of a tiered table. Kernels live in native/kernels/tier_store_kernels.cc;
// the store in native/core/tier_store.h (no TF there).
#include "common.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace mxrec {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// Input `i` is a [k, width] matrix whose k matches the vector input `i - 1`; sets
// *k and *width (width from the attr when the op has one).
Status GlobalsAndValues(InferenceContext* c, int i, bool width_attr, DimensionHandle* k,
                        DimensionHandle* width) {
  ShapeHandle globals, values;
  TF_RETURN_IF_ERROR(VectorInput(c, i - 1, &globals));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &values));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(globals, 0), c->Dim(values, 0), k));
  *width = c->Dim(values, 1);
  if (width_attr) {
    int64_t attr;
    TF_RETURN_IF_ERROR(c->GetAttr("width", &attr));
    TF_RETURN_IF_ERROR(c->Merge(*width, c->MakeDim(attr), width));
  }
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("MxTierStoreHandle")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Handle of the host/SSD store named `shared_name`; does not create it.");

REGISTER_OP("MxTierStoreCreate")
    .Input("handle: resource")
    .Attr("width: int >= 1")
    .Attr("host_rows: int >= 1")
    .Attr("ssd_rows: int >= 0")
    .Attr("ssd_dirs: list(string) = []")
    .Attr("total_rows: int >= 1")
    .Attr("table_name: string")
    .SetIsStateful()
    .SetShapeFn(ScalarHandle)
    .Doc(R"doc(
Creates the host/SSD store of a tiered table (and its SSD data files), or empties
an existing one.

width: floats per row (embedding and optimizer slots).
host_rows: rows held in host memory (host_vocabulary_size).
ssd_rows: rows held on SSD (ssd_vocabulary_size), 0 for none.
ssd_dirs: directories of the SSD data files, used in order as they fill.
total_rows: global rows of the table; globals are in [0, total_rows).
)doc");

REGISTER_OP("MxTierStoreSwap")
    .Input("handle: resource")
    .Input("erase_globals: int64")
    .Input("take_globals: int64")
    .Input("put_globals: int64")
    .Input("put_values: float")
    .Output("taken: float")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle take;
      TF_RETURN_IF_ERROR(VectorInput(c, 1));  // erase_globals
      TF_RETURN_IF_ERROR(VectorInput(c, 2, &take));
      DimensionHandle e, width;
      TF_RETURN_IF_ERROR(GlobalsAndValues(c, 4, /*width_attr=*/false, &e, &width));
      c->set_output(0, c->Matrix(c->Dim(take, 0), width));
      c->set_output(1, take);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Erases rows, then takes rows out, then stores rows (in that order).

erase_globals: [r] int64 globals whose rows are dropped (absent ones ignored).
take_globals: [f] int64 distinct globals whose rows are copied out and removed.
put_globals: [e] int64 distinct globals stored with put_values [e, width]
  (present ones overwritten); ResourceExhausted when the tiers are full.
taken: [f, width] float32, zeros for absent globals.
found: [f] bool, whether each take global was stored.
)doc");

REGISTER_OP("MxTierStoreRead")
    .Input("handle: resource")
    .Input("globals: int64")
    .Output("values: float")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle globals;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &globals));
      c->set_output(0, c->Matrix(c->Dim(globals, 0), InferenceContext::kUnknownDim));
      c->set_output(1, globals);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Reads rows without removing them.

globals: [n] int64.
values: [n, width] float32, zeros for absent globals.
found: [n] bool.
)doc");

REGISTER_OP("MxTierStoreExport")
    .Input("handle: resource")
    .Input("exclude: int64")
    .Output("globals: int64")
    .Output("values: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(VectorsShape(c, 1, 1));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Every stored row, for checkpoints.

exclude: [m] int64 globals left out (e.g. the rows the device cache holds).
globals: [k] int64, ascending.
values: [k, width] float32.
)doc");

REGISTER_OP("MxTierStoreImport")
    .Input("handle: resource")
    .Input("globals: int64")
    .Input("values: float")
    .Attr("width: int >= 1")
    .Attr("host_rows: int >= 1")
    .Attr("ssd_rows: int >= 0")
    .Attr("ssd_dirs: list(string) = []")
    .Attr("total_rows: int >= 1")
    .Attr("table_name: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      DimensionHandle k, width;
      return GlobalsAndValues(c, 2, /*width_attr=*/true, &k, &width);
    })
    .Doc(R"doc(
Creates the store if needed (attrs as MxTierStoreCreate) and replaces its content
with (globals [k] int64, distinct; values [k, width] float32).
)doc");

REGISTER_OP("MxTierStoreStats")
    .Input("handle: resource")
    .Output("host_rows_used: int64")
    .Output("ssd_rows_used: int64")
    .Output("host_bytes: int64")
    .Output("ssd_bytes: int64")
    .SetIsStateful()
    .SetShapeFn(HandleToScalars<4>)
    .Doc(R"doc(
Rows held in host memory and on SSD, host bytes allocated (rows and index) and
SSD bytes in use, as int64 scalars.
)doc");

}  // namespace mxrec
