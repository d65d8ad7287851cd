// Shape-function helpers shared by the op registrations of native/ops: checks
// of the handle and of scalar and vector inputs, and the shape functions of ops
// with vector inputs and vector outputs or with scalar outputs only.
#ifndef MXREC_PIPELINE_NATIVE_OPS_COMMON_H_
#define MXREC_PIPELINE_NATIVE_OPS_COMMON_H_

#include "tensorflow/core/framework/shape_inference.h"

namespace mxrec {

// Input `i` must be a scalar.
inline ::tensorflow::Status ScalarInput(::tensorflow::shape_inference::InferenceContext* c,
                                        int i) {
  ::tensorflow::shape_inference::ShapeHandle unused;
  return c->WithRank(c->input(i), 0, &unused);
}

// Every resource op takes its handle first: input 0 must be a scalar.
inline ::tensorflow::Status ScalarHandle(::tensorflow::shape_inference::InferenceContext* c) {
  return ScalarInput(c, 0);
}

// Input `i` must be a vector; its shape goes to *vector.
inline ::tensorflow::Status VectorInput(::tensorflow::shape_inference::InferenceContext* c, int i,
                                        ::tensorflow::shape_inference::ShapeHandle* vector) {
  return c->WithRank(c->input(i), 1, vector);
}

// Input `i` must be a vector.
inline ::tensorflow::Status VectorInput(::tensorflow::shape_inference::InferenceContext* c,
                                        int i) {
  ::tensorflow::shape_inference::ShapeHandle unused;
  return VectorInput(c, i, &unused);
}

// The handle, then `vectors` vector inputs; `outputs` vector outputs of unknown
// length.
inline ::tensorflow::Status VectorsShape(::tensorflow::shape_inference::InferenceContext* c,
                                         int vectors, int outputs) {
  TF_RETURN_IF_ERROR(ScalarHandle(c));
  for (int i = 1; i <= vectors; ++i) TF_RETURN_IF_ERROR(VectorInput(c, i));
  for (int i = 0; i < outputs; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
  return ::tensorflow::OkStatus();
}

// The shape function of the ops that take the handle only and output `N`
// scalars (sizes and statistics).
template <int N>
::tensorflow::Status HandleToScalars(::tensorflow::shape_inference::InferenceContext* c) {
  TF_RETURN_IF_ERROR(ScalarHandle(c));
  for (int i = 0; i < N; ++i) c->set_output(i, c->Scalar());
  return ::tensorflow::OkStatus();
}

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_OPS_COMMON_H_
