#include "pyckpt/copy.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "pyckpt/parallel.h"
#include "scratch.h"

namespace pyckpt {

Status CopyTensors(const std::vector<TensorView>& src, const std::vector<TensorView>& dst,
                   int threads, uint64_t piece_size) {
  if (src.size() != dst.size()) return Status::InvalidArgument("source/destination count differs");
  if (piece_size == 0) piece_size = 4u << 20;
  struct Job {
    size_t item;
    uint64_t begin, end;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < src.size(); ++i) {
    PYCKPT_RETURN_IF_ERROR(ValidateView(src[i], "source " + std::to_string(i)));
    PYCKPT_RETURN_IF_ERROR(ValidateView(dst[i], "destination " + std::to_string(i)));
    const uint64_t n = src[i].NumBytes();
    if (n != dst[i].NumBytes())
      return Status::InvalidArgument("copy " + std::to_string(i) + ": sizes differ");
    for (uint64_t b = 0; b < n; b += piece_size) jobs.push_back({i, b, std::min(n, b + piece_size)});
  }
  if (threads <= 0) threads = DefaultThreads();
  ScratchSet scratch(threads);
  return ParallelFor(jobs.size(), threads, [&](size_t j, int w) {
    const Job& job = jobs[j];
    const TensorView& s = src[job.item];
    const TensorView& d = dst[job.item];
    const uint64_t n = job.end - job.begin;
    if (d.IsContiguous()) {
      GatherRange(s, job.begin, n, d.data + job.begin);
    } else if (s.IsContiguous()) {
      ScatterRange(d, job.begin, n, s.data + job.begin);
    } else {
      char* buf = scratch[w].Get(n);
      if (!buf) return Status::IOError("out of memory for a scratch buffer");
      GatherRange(s, job.begin, n, buf);
      ScatterRange(d, job.begin, n, buf);
    }
    return Status::OK();
  });
}

}  // namespace pyckpt
