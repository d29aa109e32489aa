#include "pyckpt/layout.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

namespace pyckpt {

Status PlanLayout(const std::vector<uint64_t>& nbytes, uint32_t num_files, uint64_t alignment,
                  Layout* out) {
  if (num_files == 0) return Status::InvalidArgument("num_files must be positive");
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    return Status::InvalidArgument("alignment must be a power of two");
  const size_t n = nbytes.size();
  out->file.assign(n, 0);
  out->offset.assign(n, 0);
  out->file_sizes.assign(num_files, 0);

  std::vector<size_t> by_size(n);
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return nbytes[a] > nbytes[b]; });
  using Load = std::pair<uint64_t, uint32_t>;  // (bytes, file): lightest first, then lowest index
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (uint32_t f = 0; f < num_files; ++f) heap.push({0, f});
  const uint64_t pad = alignment - 1;
  for (size_t i : by_size) {
    if (nbytes[i] == 0) continue;
    Load l = heap.top();
    heap.pop();
    out->file[i] = l.second;
    if (nbytes[i] > (UINT64_MAX >> 2) || l.first > (UINT64_MAX >> 2))
      return Status::InvalidArgument("checkpoint too large");
    heap.push({l.first + ((nbytes[i] + pad) & ~pad), l.second});
  }
  // Offsets in input order within each file.
  std::vector<uint64_t> pos(num_files, 0);
  for (size_t i = 0; i < n; ++i) {
    if (nbytes[i] == 0) continue;
    uint32_t f = out->file[i];
    out->offset[i] = pos[f];
    out->file_sizes[f] = pos[f] + nbytes[i];
    pos[f] = (pos[f] + nbytes[i] + pad) & ~pad;
  }
  return Status::OK();
}

}  // namespace pyckpt
