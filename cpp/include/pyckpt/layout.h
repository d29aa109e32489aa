// Placement of tensors into shard files (docs/FORMAT.md, "Layout").
//
// Contract: PlanLayout assigns every tensor of nbytes[i] > 0 a file in
// [0, num_files) and an offset aligned to `alignment`, balancing the bytes per
// file (largest tensors first, each to the lightest file) so parallel writers
// and uploads finish together. Inside a file, tensors keep their input order.
// Zero-byte tensors get file 0, offset 0. Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "pyckpt/status.h"

namespace pyckpt {

struct Layout {
  std::vector<uint32_t> file;
  std::vector<uint64_t> offset;
  std::vector<uint64_t> file_sizes;
};

Status PlanLayout(const std::vector<uint64_t>& nbytes, uint32_t num_files, uint64_t alignment,
                  Layout* out);

}  // namespace pyckpt
