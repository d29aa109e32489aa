#include "pyckpt/status.h"

namespace pyckpt {

std::string Status::ToString() const {
  const char* name = "OK";
  switch (code_) {
    case Code::kOk: return "OK";
    case Code::kNotFound: name = "NotFound"; break;
    case Code::kCorruption: name = "Corruption"; break;
    case Code::kInvalidArgument: name = "InvalidArgument"; break;
    case Code::kIOError: name = "IOError"; break;
  }
  return std::string(name) + ": " + message_;
}

}  // namespace pyckpt
