// Status: the result of every fallible operation in the C++ core.
//
// Contract: functions return a Status (or fill an out-parameter and return a
// Status) and never throw. The Python binding converts a non-OK Status into a
// pyckpt.errors exception in exactly one place (cpp/bindings/status_to_python.h).
// Thread-safety: a Status is a plain value; copies may be used from any thread.
#pragma once

#include <string>
#include <utility>

namespace pyckpt {

class Status {
 public:
  enum class Code : int {
    kOk = 0,
    kNotFound = 1,         // a file or key that should exist does not
    kCorruption = 2,       // checksum, truncation or format failure
    kInvalidArgument = 3,  // the caller passed something unusable
    kIOError = 4,          // the OS refused a read/write/sync
  };

  Status() = default;  // OK

  static Status OK() { return Status(); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status InvalidArgument(std::string msg) {
    return Status(Code::kInvalidArgument, std::move(msg));
  }
  static Status IOError(std::string msg, int err = 0) {
    Status s(Code::kIOError, std::move(msg));
    s.errno_ = err;
    return s;
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  int os_errno() const { return errno_; }
  std::string ToString() const;

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}

  Code code_ = Code::kOk;
  std::string message_;
  int errno_ = 0;
};

// Propagate a non-OK status to the caller.
#define PYCKPT_RETURN_IF_ERROR(expr)     \
  do {                                   \
    ::pyckpt::Status _st = (expr);       \
    if (!_st.ok()) return _st;           \
  } while (0)

}  // namespace pyckpt
