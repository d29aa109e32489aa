#include "pyckpt/copy.h"

#include <string>

#include "pieces.h"
#include "pyckpt/parallel.h"
#include "scratch.h"

namespace pyckpt {

Status CopyTensors(const std::vector<TensorView>& src, const std::vector<TensorView>& dst,
                   int threads, uint64_t piece_size) {
  if (src.size() != dst.size()) return Status::InvalidArgument("source/destination count differs");
  if (piece_size == 0) piece_size = kDefaultCopyPieceSize;
  std::vector<ItemRange> jobs;
  for (size_t i = 0; i < src.size(); ++i) {
    PYCKPT_RETURN_IF_ERROR(ValidateView(src[i], "source " + std::to_string(i)));
    PYCKPT_RETURN_IF_ERROR(ValidateView(dst[i], "destination " + std::to_string(i)));
    const uint64_t n = src[i].NumBytes();
    if (n != dst[i].NumBytes())
      return Status::InvalidArgument("copy " + std::to_string(i) + ": sizes differ");
    SplitItem(i, n, piece_size, &jobs);
  }
  threads = ResolveThreads(threads);
  ScratchSet scratch(threads);
  return ParallelFor(jobs.size(), threads, [&](size_t j, int w) {
    const ItemRange& job = jobs[j];
    const TensorView& s = src[job.item];
    const TensorView& d = dst[job.item];
    const uint64_t n = job.end - job.begin;
    if (CopyRangeDirect(s, d, job.begin, n)) return Status::OK();
    char* buf = scratch[w].Get(n);  // both strided: through a buffer
    if (!buf) return Status::IOError("out of memory for a scratch buffer");
    GatherRange(s, job.begin, n, buf);
    ScatterRange(d, job.begin, n, buf);
    return Status::OK();
  });
}

}  // namespace pyckpt
