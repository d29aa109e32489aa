// Helpers shared by the C++ unit tests (*_test.cc): random bytes, strided
// views, a reference for a view's logical bytes, and per-test temporary
// directories.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pyckpt/tensor_view.h"

namespace pyckpt {
namespace testutil {

inline std::vector<char> RandomBytes(size_t n, unsigned seed) {
  std::vector<char> v(n);
  std::mt19937 rng(seed);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

// A view of `data` with the given item size, shape and byte strides.
inline TensorView View(char* data, int64_t itemsize, std::vector<int64_t> shape,
                       std::vector<int64_t> strides) {
  TensorView v;
  v.data = data;
  v.itemsize = itemsize;
  v.shape = std::move(shape);
  v.strides = std::move(strides);
  return v;
}

// The view's logical bytes, element by element in C order: a reference that
// shares no code with GatherRange/ScatterRange.
inline std::vector<char> LogicalBytes(const TensorView& v) {
  std::vector<char> out;
  size_t count = 1;
  for (int64_t s : v.shape) count *= static_cast<size_t>(s);
  std::vector<int64_t> idx(v.shape.size(), 0);
  for (size_t e = 0; e < count; ++e) {
    int64_t off = 0;
    for (size_t k = 0; k < idx.size(); ++k) off += idx[k] * v.strides[k];
    out.insert(out.end(), v.data + off, v.data + off + v.itemsize);
    for (size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < v.shape[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

// A new directory under /tmp (path() is empty if it could not be made),
// removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/pyckpt_test_XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace testutil
}  // namespace pyckpt
