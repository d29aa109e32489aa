// The one place where a C++ Status becomes a Python exception.
//
//   NotFound        -> pyckpt.errors.CheckpointNotFoundError (FileNotFoundError)
//   Corruption      -> pyckpt.errors.CorruptCheckpointError  (ValueError)
//   IOError         -> pyckpt.errors.CheckpointIOError        (OSError, with errno)
//   InvalidArgument -> ValueError
#pragma once

#include <pybind11/pybind11.h>

#include <cstring>
#include <string>

#include "pyckpt/status.h"

namespace pyckpt {
namespace binding {

namespace py = pybind11;

// Call with the GIL held. Returns normally when s is OK.
inline void RaiseIfError(const Status& s) {
  if (s.ok()) return;
  py::object errors = py::module_::import("pyckpt.errors");
  // the message as text: lone surrogates of Python strings (file names, keys) come
  // back as they were; bytes that are no UTF-8 at all as escapes
  const std::string& m = s.message();
  PyObject* text = PyUnicode_DecodeUTF8(m.data(), static_cast<Py_ssize_t>(m.size()),
                                        "surrogatepass");
  if (text == nullptr) {
    PyErr_Clear();
    text = PyUnicode_DecodeUTF8(m.data(), static_cast<Py_ssize_t>(m.size()), "backslashreplace");
  }
  if (text == nullptr) throw py::error_already_set();
  py::object message = py::reinterpret_steal<py::object>(text);
  py::object exc;
  switch (s.code()) {
    case Status::Code::kNotFound:
      exc = errors.attr("CheckpointNotFoundError")(message);
      break;
    case Status::Code::kCorruption:
      exc = errors.attr("CorruptCheckpointError")(message);
      break;
    case Status::Code::kIOError: {
      exc = errors.attr("CheckpointIOError")(s.os_errno(), message);
      // the OS error as the cause, as the Python stores do (errors.io_error)
      py::object cause = py::reinterpret_borrow<py::object>(PyExc_OSError)(
          s.os_errno(), std::strerror(s.os_errno()));
      PyException_SetCause(exc.ptr(), cause.release().ptr());
      break;
    }
    case Status::Code::kInvalidArgument:
    default:
      exc = py::reinterpret_borrow<py::object>(PyExc_ValueError)(message);
      break;
  }
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

}  // namespace binding
}  // namespace pyckpt
