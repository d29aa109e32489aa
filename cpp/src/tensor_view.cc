#include "pyckpt/tensor_view.h"

#include <cstring>

namespace pyckpt {
namespace {

// The view as (outer dims..., run) where `run` is the longest contiguous
// innermost byte run; outer dims are merged where their strides allow.
struct RunLayout {
  int64_t run = 0;                 // bytes per contiguous run
  std::vector<int64_t> shape;      // outer dims, outermost first
  std::vector<int64_t> strides;    // outer strides in bytes
};

RunLayout MakeRuns(const TensorView& v) {
  // Dimensions as (size, stride), including the item bytes as the innermost.
  std::vector<int64_t> shape(v.shape);
  std::vector<int64_t> strides(v.strides);
  shape.push_back(v.itemsize);
  strides.push_back(1);
  // Drop size-1 dims (their stride never matters).
  std::vector<int64_t> s2, st2;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != 1 || i + 1 == shape.size()) {
      s2.push_back(shape[i]);
      st2.push_back(strides[i]);
    }
  }
  // Merge from the inside out.
  std::vector<int64_t> ms{s2.back()}, mst{st2.back()};
  for (size_t k = s2.size() - 1; k-- > 0;) {
    if (st2[k] == ms.front() * mst.front()) {
      ms.front() *= s2[k];
    } else {
      ms.insert(ms.begin(), s2[k]);
      mst.insert(mst.begin(), st2[k]);
    }
  }
  RunLayout out;
  if (mst.back() == 1) {
    out.run = ms.back();
    ms.pop_back();
    mst.pop_back();
  } else {
    out.run = 1;  // cannot happen: the item dim has stride 1; kept for safety
  }
  out.shape = std::move(ms);
  out.strides = std::move(mst);
  return out;
}

template <bool kGather>
void CopyRange(const TensorView& v, uint64_t begin, uint64_t len, char* buf) {
  if (len == 0) return;
  if (v.IsContiguous()) {
    if (kGather) std::memcpy(buf, v.data + begin, len);
    else std::memcpy(v.data + begin, buf, len);
    return;
  }
  RunLayout L = MakeRuns(v);
  const uint64_t run = static_cast<uint64_t>(L.run);
  uint64_t run_index = begin / run;
  uint64_t in_run = begin % run;
  // Unravel run_index over the outer dims (C order).
  const size_t d = L.shape.size();
  std::vector<int64_t> idx(d, 0);
  {
    uint64_t r = run_index;
    for (size_t k = d; k-- > 0;) {
      idx[k] = static_cast<int64_t>(r % static_cast<uint64_t>(L.shape[k]));
      r /= static_cast<uint64_t>(L.shape[k]);
    }
  }
  int64_t base = 0;
  for (size_t k = 0; k < d; ++k) base += idx[k] * L.strides[k];
  while (len > 0) {
    uint64_t n = run - in_run;
    if (n > len) n = len;
    char* p = v.data + base + static_cast<int64_t>(in_run);
    if (kGather) std::memcpy(buf, p, n);
    else std::memcpy(p, buf, n);
    buf += n;
    len -= n;
    in_run = 0;
    // Advance to the next run.
    for (size_t k = d; k-- > 0;) {
      base += L.strides[k];
      if (++idx[k] < L.shape[k]) break;
      base -= L.strides[k] * L.shape[k];
      idx[k] = 0;
    }
  }
}

}  // namespace

uint64_t TensorView::NumBytes() const {
  uint64_t n = static_cast<uint64_t>(itemsize);
  for (int64_t s : shape) n *= static_cast<uint64_t>(s);
  return n;
}

bool TensorView::IsContiguous() const {
  int64_t expected = itemsize;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] == 0) return true;
    if (shape[k] != 1 && strides[k] != expected) return false;
    expected *= shape[k];
  }
  return true;
}

TensorView TensorView::Bytes(char* data, uint64_t n) {
  TensorView v;
  v.data = data;
  v.itemsize = 1;
  v.shape = {static_cast<int64_t>(n)};
  v.strides = {1};
  return v;
}

Status ValidateView(const TensorView& v, const std::string& what) {
  if (v.itemsize <= 0) return Status::InvalidArgument(what + ": item size must be positive");
  if (v.shape.size() != v.strides.size())
    return Status::InvalidArgument(what + ": shape and strides differ in length");
  unsigned __int128 n = static_cast<unsigned __int128>(v.itemsize);
  for (int64_t s : v.shape) {
    if (s < 0) return Status::InvalidArgument(what + ": negative dimension");
    n *= static_cast<unsigned __int128>(s);
    if (n > (static_cast<unsigned __int128>(1) << 62))
      return Status::InvalidArgument(what + ": byte size overflows");
  }
  return Status::OK();
}

void GatherRange(const TensorView& src, uint64_t begin, uint64_t len, char* dst) {
  CopyRange<true>(src, begin, len, dst);
}

void ScatterRange(const TensorView& dst, uint64_t begin, uint64_t len, const char* src) {
  CopyRange<false>(dst, begin, len, const_cast<char*>(src));
}

bool CopyRangeDirect(const TensorView& src, const TensorView& dst, uint64_t begin, uint64_t len) {
  if (dst.IsContiguous()) {
    GatherRange(src, begin, len, dst.data + begin);
  } else if (src.IsContiguous()) {
    ScatterRange(dst, begin, len, src.data + begin);
  } else {
    return false;
  }
  return true;
}

}  // namespace pyckpt
