// Registrations and shape functions of the row-store ops of dynamic-expansion
// tables. Kernels live in native/kernels/row_store_kernels.cc; the math in
// native/core/row_store.cc (no TF there). Every op takes the store handle first.
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

// Input `rows` (a vector) and input `values` (a matrix of as many rows, whose
// width is `width` when known). Returns the merged row count.
Status RowsAndMatrix(InferenceContext* c, int rows_input, int values_input,
                     DimensionHandle width, DimensionHandle* n) {
  ShapeHandle rows, values;
  TF_RETURN_IF_ERROR(VectorInput(c, rows_input, &rows));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(values_input), 2, &values));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(rows, 0), c->Dim(values, 0), n));
  DimensionHandle unused;
  return c->Merge(c->Dim(values, 1), width, &unused);
}

Status DimAttr(InferenceContext* c, DimensionHandle* dim) {
  int64_t value;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &value));
  *dim = c->MakeDim(value);
  return ::tensorflow::OkStatus();
}

// Input `i` must be a matrix of `dim` (the attr) columns; sets *dim.
Status DimWideMatrix(InferenceContext* c, int i, DimensionHandle* dim) {
  ShapeHandle matrix;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &matrix));
  TF_RETURN_IF_ERROR(DimAttr(c, dim));
  DimensionHandle merged;
  return c->Merge(c->Dim(matrix, 1), *dim, &merged);
}

// Fused updates: (handle, rows [n], grad [n, dim], scalar hyperparameters...).
Status ApplyShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(ScalarHandle(c));
  DimensionHandle dim, n;
  TF_RETURN_IF_ERROR(DimAttr(c, &dim));
  TF_RETURN_IF_ERROR(RowsAndMatrix(c, 1, 2, dim, &n));
  for (int i = 3; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(ScalarInput(c, i));
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("MxRowStoreHandle")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Handle of the row store named `shared_name`; does not create it.");

REGISTER_OP("MxRowStoreCreate")
    .Input("handle: resource")
    .Attr("dim: int >= 1")
    .Attr("table_name: string")
    .SetIsStateful()
    .SetShapeFn(ScalarHandle)
    .Doc("Creates the row store of `dim`-wide embeddings, or empties an existing one.");

REGISTER_OP("MxRowStoreSize")
    .Input("handle: resource")
    .Output("size: int64")
    .Output("num_slots: int64")
    .Output("memory_bytes: int64")
    .SetIsStateful()
    .SetShapeFn(HandleToScalars<3>)
    .Doc("Rows held, optimizer slots per row (-1 before the first update), bytes of rows.");

REGISTER_OP("MxRowStoreAppend")
    .Input("handle: resource")
    .Input("expected_size: int64")
    .Input("values: float")
    .Output("size: int64")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      DimensionHandle dim;
      TF_RETURN_IF_ERROR(DimWideMatrix(c, 2, &dim));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Appends rows to the store if it holds `expected_size` rows (else does nothing:
another step grew it first).

values: [n, dim] float32 embeddings of the new rows; their slots start at their
  initial values.
size: rows held afterwards.
)doc");

REGISTER_OP("MxRowStoreSetSlots")
    .Input("handle: resource")
    .Input("initial_values: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status { return VectorsShape(c, 1, 0); })
    .Doc(R"doc(
Sets the optimizer slots of the rows: one per entry of `initial_values` ([k]
float32, each slot's initial value). The first call lays the rows out again;
later calls must give the same values (FailedPrecondition otherwise).
)doc");

REGISTER_OP("MxRowStoreLookup")
    .Input("handle: resource")
    .Input("rows: int64")
    .Input("anchor: float")
    .Output("embeddings: float")
    .Output("addresses: int64")
    .Attr("dim: int >= 1")
    .Attr("table_name: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &rows));
      DimensionHandle dim;
      TF_RETURN_IF_ERROR(DimWideMatrix(c, 2, &dim));
      c->set_output(0, c->Matrix(c->Dim(rows, 0), dim));
      c->set_output(1, rows);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Embeddings of rows of the store, and the rows' addresses.

rows: [n] int64 distinct rows from the table's key index; -1 (an unseen id at
  evaluation) reads zeros.
anchor: [0, dim] float32, the table's gradient anchor variable. Its value is not
  read; the op's gradient with respect to it is the table's gradient:
  IndexedSlices of the embeddings' gradients at `addresses`.
embeddings: [n, dim] float32 copies of the rows' embeddings.
addresses: [n] int64, the rows: what *_by_addr optimizers update.
)doc");

REGISTER_OP("MxRowStoreReadRows")
    .Input("handle: resource")
    .Input("rows: int64")
    .Output("values: float")
    .Output("slot_initial_values: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(VectorInput(c, 1, &rows));
      c->set_output(0, c->Matrix(c->Dim(rows, 0), InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Whole rows, [n, dim * (1 + k)] float32 (embedding then each slot), and the k
slots' initial values ([0] before the first update), read together.
)doc");

REGISTER_OP("MxRowStoreWriteRows")
    .Input("handle: resource")
    .Input("rows: int64")
    .Input("values: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      DimensionHandle n;
      return RowsAndMatrix(c, 1, 2, c->UnknownDim(), &n);
    })
    .Doc(R"doc(
Overwrites rows with `values`: [n, dim * (1 + slots)] whole rows, or [n, dim]
embeddings (the rows' slots then go back to their initial values).
)doc");

REGISTER_OP("MxRowStoreExport")
    .Input("handle: resource")
    .Output("values: float")
    .Output("slot_initial_values: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      c->set_output(0, c->Matrix(InferenceContext::kUnknownDim, InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Every row in row order, [size, dim * (1 + k)] float32, and the k slots' initial
values ([0] before the first update).
)doc");

REGISTER_OP("MxRowStoreImport")
    .Input("handle: resource")
    .Input("values: float")
    .Input("slot_initial_values: float")
    .Attr("dim: int >= 1")
    .Attr("table_name: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(ScalarHandle(c));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &unused));
      return VectorInput(c, 2);
    })
    .Doc("Creates the store if needed and replaces its content (as MxRowStoreExport gives).");

REGISTER_OP("MxRowStoreApplySgd")
    .Input("handle: resource")
    .Input("rows: int64")
    .Input("grad: float")
    .Input("learning_rate: float")
    .Input("weight_decay: float")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn(ApplyShape)
    .Doc("w -= learning_rate * (grad + weight_decay * w) on distinct rows (no slots).");

REGISTER_OP("MxRowStoreApplyAdagrad")
    .Input("handle: resource")
    .Input("rows: int64")
    .Input("grad: float")
    .Input("learning_rate: float")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn(ApplyShape)
    .Doc("acc += grad^2; w -= learning_rate * grad / sqrt(acc) on distinct rows (1 slot).");

REGISTER_OP("MxRowStoreApplyAdam")
    .Input("handle: resource")
    .Input("rows: int64")
    .Input("grad: float")
    .Input("lr_t: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn(ApplyShape)
    .Doc(R"doc(
Lazy Adam on distinct rows (2 slots, m and v): m = beta1 m + (1 - beta1) grad;
v = beta2 v + (1 - beta2) grad^2; w -= lr_t * m / (sqrt(v) + epsilon), where
lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t) is computed by the caller.
)doc");

}  // namespace mxrec
