// Parallel copies between tensors of equal byte size (snapshot, copy_state).
//
// Contract: copies the logical bytes of src[i] into dst[i] for every i, using
// up to `threads` threads; large tensors are split into pieces so that one big
// tensor still uses every thread. Strided tensors on either side are handled.
// piece_size is the split unit (0: kDefaultCopyPieceSize); threads <= 0 means
// DefaultThreads(). Returns InvalidArgument when the counts differ or a pair
// differs in byte size.
// Thread-safety: destinations must not overlap each other or any source.
#pragma once

#include <cstdint>
#include <vector>

#include "pyckpt/defaults.h"
#include "pyckpt/status.h"
#include "pyckpt/tensor_view.h"

namespace pyckpt {

Status CopyTensors(const std::vector<TensorView>& src, const std::vector<TensorView>& dst,
                   int threads, uint64_t piece_size = kDefaultCopyPieceSize);

}  // namespace pyckpt
