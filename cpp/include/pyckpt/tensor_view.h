// TensorView: a borrowed, possibly strided, n-d array of fixed-size elements,
// seen as the C-order sequence of its bytes ("logical bytes").
//
// Contract: the view never owns memory; the caller keeps the buffer alive and
// (for writes) exclusive while an operation runs. Strides are in bytes and
// may be negative or zero (zero only for views that are read from).
// GatherRange/ScatterRange copy a range of logical bytes between the view and
// a contiguous buffer; ranges need not be element-aligned.
// Thread-safety: concurrent calls on disjoint logical ranges are safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pyckpt/status.h"

namespace pyckpt {

struct TensorView {
  char* data = nullptr;
  int64_t itemsize = 1;
  std::vector<int64_t> shape;    // elements per dimension
  std::vector<int64_t> strides;  // bytes per step in each dimension

  uint64_t NumBytes() const;
  bool IsContiguous() const;  // C-contiguous (true for 0-d and empty views)

  // A 1-d contiguous view of n bytes.
  static TensorView Bytes(char* data, uint64_t n);
};

// Checks shape/strides for negative sizes and byte-count overflow.
Status ValidateView(const TensorView& v, const std::string& what);

// Copies logical bytes [begin, begin + len) of `src` into `dst`.
void GatherRange(const TensorView& src, uint64_t begin, uint64_t len, char* dst);

// Copies `len` bytes from `src` into logical bytes [begin, begin + len) of `dst`.
void ScatterRange(const TensorView& dst, uint64_t begin, uint64_t len, const char* src);

// Copies logical bytes [begin, begin + len) of `src` into the same logical
// bytes of `dst` with a single gather (dst contiguous) or scatter (src
// contiguous). Returns false, copying nothing, when both views are strided:
// the caller then goes through a buffer of its own (or refuses).
bool CopyRangeDirect(const TensorView& src, const TensorView& dst, uint64_t begin, uint64_t len);

}  // namespace pyckpt
