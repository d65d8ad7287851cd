// Converts a status of the TF-free core (native/core) into a TensorFlow status:
// the one place where core errors cross into TensorFlow.
#ifndef MXREC_PIPELINE_NATIVE_KERNELS_TF_STATUS_H_
#define MXREC_PIPELINE_NATIVE_KERNELS_TF_STATUS_H_

#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "../core/status.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/status.h"

namespace mxrec {

inline ::tensorflow::Status ToTf(const Status& status) {
  namespace errors = ::tensorflow::errors;
  switch (status.code()) {
    case Status::Code::kOk:
      return ::tensorflow::OkStatus();
    case Status::Code::kResourceExhausted:
      return errors::ResourceExhausted(status.message());
    case Status::Code::kInvalidArgument:
      return errors::InvalidArgument(status.message());
    case Status::Code::kFailedPrecondition:
      return errors::FailedPrecondition(status.message());
    case Status::Code::kInternal:
      return errors::Internal(status.message());
    case Status::Code::kCancelled:
      return errors::Cancelled(status.message());
  }
  return errors::Internal(status.message());
}

// Runs `call`, a core call returning mxrec::Status, ::tensorflow::Status or
// nothing, and returns its status; a std::bad_alloc it throws becomes
// ResourceExhausted "table '<table_name>': cannot allocate <what>", so that
// nothing throws out of Compute.
template <typename Call>
::tensorflow::Status GuardAllocation(const std::string& table_name, const std::string& what,
                                     Call&& call) {
  using Result = std::invoke_result_t<Call>;
  try {
    if constexpr (std::is_void_v<Result>) {
      std::forward<Call>(call)();
      return ::tensorflow::OkStatus();
    } else if constexpr (std::is_same_v<Result, Status>) {
      return ToTf(std::forward<Call>(call)());
    } else {
      return std::forward<Call>(call)();
    }
  } catch (const std::bad_alloc&) {
    return ::tensorflow::errors::ResourceExhausted("table '", table_name, "': cannot allocate ",
                                                   what);
  }
}

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_KERNELS_TF_STATUS_H_
