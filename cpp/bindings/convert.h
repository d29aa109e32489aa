// Conversions from Python arguments to the core's native structs. Called with
// the GIL held, before it is released; no Python object crosses into a worker
// thread (only raw pointers into buffers that the caller keeps alive).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pyckpt/tensor_view.h"

namespace pyckpt {
namespace binding {

namespace py = pybind11;

// A view of a numpy array (any dtype, including ml_dtypes' custom ones).
inline TensorView ArrayView(const py::handle& obj, bool writable, const char* what) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(std::string(what) + " must be a numpy.ndarray");
  auto arr = py::reinterpret_borrow<py::array>(obj);
  if (writable && !arr.writeable())
    throw py::value_error(std::string(what) + " is read-only");
  TensorView v;
  v.data = static_cast<char*>(const_cast<void*>(arr.data()));
  v.itemsize = static_cast<int64_t>(arr.itemsize());
  const auto nd = static_cast<size_t>(arr.ndim());
  v.shape.resize(nd);
  v.strides.resize(nd);
  for (size_t k = 0; k < nd; ++k) {
    v.shape[k] = static_cast<int64_t>(arr.shape(static_cast<py::ssize_t>(k)));
    v.strides[k] = static_cast<int64_t>(arr.strides(static_cast<py::ssize_t>(k)));
  }
  return v;
}

// Copies a 1-d numpy array of integers into a vector of T.
template <typename T>
std::vector<T> IntVector(const py::handle& obj, size_t expected, const char* what) {
  auto arr = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!arr) throw py::type_error(std::string(what) + " must be an integer array");
  if (arr.ndim() != 1 || static_cast<size_t>(arr.shape(0)) != expected)
    throw py::value_error(std::string(what) + " has the wrong length");
  return std::vector<T>(arr.data(), arr.data() + expected);
}

template <typename T>
py::array_t<T> ToNumpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(heap->size())}, {sizeof(T)}, heap->data(), owner);
}

}  // namespace binding
}  // namespace pyckpt
