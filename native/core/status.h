// Status of the TF-free core (native/core): the result of an operation that can
// fail. The op layer turns it into a TensorFlow status in one place
// (native/kernels/tf_status.h). No TensorFlow includes.
#ifndef MXREC_PIPELINE_NATIVE_CORE_STATUS_H_
#define MXREC_PIPELINE_NATIVE_CORE_STATUS_H_

#include <string>
#include <utility>

namespace mxrec {

// Result of an operation that can fail; never thrown.
class Status {
 public:
  enum class Code {
    kOk, kInvalidArgument, kResourceExhausted, kFailedPrecondition, kInternal, kCancelled
  };

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string message) {
    return Status(Code::kInvalidArgument, std::move(message));
  }
  static Status ResourceExhausted(std::string message) {
    return Status(Code::kResourceExhausted, std::move(message));
  }
  static Status FailedPrecondition(std::string message) {
    return Status(Code::kFailedPrecondition, std::move(message));
  }
  // I/O errors (e.g. of the SSD tier, native/core/tier_store.h).
  static Status Internal(std::string message) {
    return Status(Code::kInternal, std::move(message));
  }
  static Status Cancelled(std::string message) {
    return Status(Code::kCancelled, std::move(message));
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_STATUS_H_
