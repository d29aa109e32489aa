#include "pyckpt/shard_writer.h"

#include <algorithm>
#include <cstring>

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "file_io.h"
#include "pieces.h"
#include "write_job.h"
#include "pyckpt/crc32c.h"
#include "pyckpt/parallel.h"
#include "scratch.h"

namespace pyckpt {
namespace {

Status CheckOptions(const ShardWriteOptions& o) {
  if (o.chunk_size == 0) return Status::InvalidArgument("chunk_size must be positive");
  return Status::OK();
}

Status CheckItems(const std::vector<ShardWriteItem>& items) {
  for (const auto& it : items) PYCKPT_RETURN_IF_ERROR(ValidateView(it.src, "tensor '" + it.key + "'"));
  return Status::OK();
}

std::vector<Span> Spans(const std::vector<ShardWriteItem>& items) {
  std::vector<Span> spans(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    spans[i] = Span{items[i].file, items[i].offset, items[i].src.NumBytes()};
  return spans;
}

void AllocateCrcs(const std::vector<Span>& spans, uint64_t chunk, ChecksumResult* r) {
  r->crc_begin.assign(spans.size() + 1, 0);
  for (size_t i = 0; i < spans.size(); ++i)
    r->crc_begin[i + 1] = r->crc_begin[i] + NumChunks(spans[i].nbytes, chunk);
  r->crcs.assign(r->crc_begin.back(), 0);
}

// Checksums a slice of one tensor and, when `file` is given, writes it.
Status WriteSlice(const Piece& p, const ShardWriteItem& it, uint64_t chunk, ScratchBuffer& scratch,
                  uint32_t* crcs, File* file) {
  const uint64_t step = StepSize(chunk);
  const uint64_t end = p.item_begin + (p.end - p.begin);
  const bool contiguous = it.src.IsContiguous();
  for (uint64_t b = p.item_begin; b < end; b += step) {
    const uint64_t len = std::min(step, end - b);
    const char* data = it.src.data + b;
    if (!contiguous) {
      char* buf = scratch.Get(len);
      if (!buf) return Status::IOError("out of memory for a scratch buffer");
      GatherRange(it.src, b, len, buf);
      data = buf;
    }
    ChunkChecksums(data, b, len, chunk, crcs);
    if (file) PYCKPT_RETURN_IF_ERROR(file->PWrite(data, len, it.offset + b));
  }
  return Status::OK();
}

// Gathers a run of small tensors (and their zero padding) into scratch,
// checksumming each; writes it with one call when `file` is given.
Status WriteRun(const Piece& p, const std::vector<ShardWriteItem>& items, const PiecePlan& plan,
                ScratchBuffer& scratch, ChecksumResult* r, File* file) {
  char* buf = scratch.Get(p.end - p.begin);
  if (!buf) return Status::IOError("out of memory for a scratch buffer");
  uint64_t pos = p.begin;
  for (size_t k = p.run_first; k < p.run_last; ++k) {
    const ShardWriteItem& it = items[plan.order[k]];
    const uint64_t n = it.src.NumBytes();
    if (it.offset > pos) std::memset(buf + (pos - p.begin), 0, it.offset - pos);  // padding
    char* dst = buf + (it.offset - p.begin);
    GatherRange(it.src, 0, n, dst);
    r->crcs[r->crc_begin[plan.order[k]]] = crc32c::Mask(crc32c::Value(dst, n));
    pos = it.offset + n;
  }
  if (file) return file->PWrite(buf, p.end - p.begin, p.begin);
  return Status::OK();
}

Status ProcessPiece(const Piece& p, const std::vector<ShardWriteItem>& items,
                    const PiecePlan& plan, uint64_t chunk, ScratchBuffer& scratch,
                    ChecksumResult* r, File* file) {
  if (p.run) return WriteRun(p, items, plan, scratch, r, file);
  return WriteSlice(p, items[p.item], chunk, scratch, &r->crcs[r->crc_begin[p.item]], file);
}

// Lowest CPU priority for the calling thread (once per thread). Background
// writers then use only the CPU time the caller's threads leave idle.
void LowerThreadPriority() {
  thread_local bool done = false;
  if (done) return;
  done = true;
#ifdef __linux__
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
#endif
}

Status CheckPlacement(const std::vector<std::string>& files, const std::vector<uint64_t>& file_sizes,
                      const std::vector<ShardWriteItem>& items, const std::vector<Span>& spans) {
  if (file_sizes.size() != files.size())
    return Status::InvalidArgument("one size is needed per shard file");
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (s.nbytes == 0) continue;
    if (s.file >= files.size() || s.offset > file_sizes[s.file] ||
        s.nbytes > file_sizes[s.file] - s.offset)
      return Status::InvalidArgument("tensor '" + items[i].key + "' is placed outside its file");
  }
  return Status::OK();
}

}  // namespace

Status WriteJob::Prepare(const std::vector<std::string>& files,
                         const std::vector<uint64_t>& file_sizes,
                         const std::vector<ShardWriteItem>& items,
                         const ShardWriteOptions& options) {
  PYCKPT_RETURN_IF_ERROR(CheckOptions(options));
  PYCKPT_RETURN_IF_ERROR(CheckItems(items));
  std::vector<Span> spans = Spans(items);
  PYCKPT_RETURN_IF_ERROR(CheckPlacement(files, file_sizes, items, spans));
  files_ = files;
  sizes_ = file_sizes;
  items_ = items;
  options_ = options;
  AllocateCrcs(spans, options.chunk_size, &result_);
  plan_ = PlanPieces(spans, options.chunk_size,
                     RoundToChunks(options.piece_size, options.chunk_size),
                     /*max_gap=*/options.chunk_size, options.whole_items);
  return Status::OK();
}

Status WriteJob::SetSource(size_t item, const TensorView& src) {
  if (item >= items_.size()) return Status::InvalidArgument("SetSource: item out of range");
  if (src.NumBytes() != items_[item].src.NumBytes() || !src.IsContiguous())
    return Status::InvalidArgument("tensor '" + items_[item].key +
                                   "': its staging buffer must be contiguous and of its size");
  items_[item].src = src;
  return Status::OK();
}

std::vector<size_t> WriteJob::ItemOrder() const {
  std::vector<size_t> order;
  std::vector<char> seen(items_.size(), 0);
  auto add = [&](size_t i) {
    if (!seen[i]) {
      seen[i] = 1;
      order.push_back(i);
    }
  };
  for (const Piece& p : plan_.pieces) {
    if (!p.run) add(p.item);
    else
      for (size_t k = p.run_first; k < p.run_last; ++k) add(plan_.order[k]);
  }
  for (size_t i = 0; i < items_.size(); ++i) add(i);  // empty items
  return order;
}

Status WriteJob::Run(ReadyGate* gate) {
  const uint64_t chunk = options_.chunk_size;
  std::vector<File> fds(files_.size());
  for (size_t f = 0; f < files_.size(); ++f) {
    PYCKPT_RETURN_IF_ERROR(fds[f].OpenNew(files_[f]));
    PYCKPT_RETURN_IF_ERROR(fds[f].Truncate(sizes_[f]));
  }
  const int threads = ResolveThreads(options_.threads);
  ScratchSet scratch(threads);
  if (gate != nullptr) {  // how many pieces hold each item's bytes
    std::vector<uint32_t> count(items_.size(), 0);
    for (const Piece& p : plan_.pieces) {
      if (!p.run) ++count[p.item];
      else
        for (size_t k = p.run_first; k < p.run_last; ++k) ++count[plan_.order[k]];
    }
    gate->Expect(count);
  }
  PYCKPT_RETURN_IF_ERROR(ParallelFor(plan_.pieces.size(), threads, [&](size_t i, int w) {
    const Piece& p = plan_.pieces[i];
    if (gate != nullptr) {
      LowerThreadPriority();  // a background write yields the CPU to staging and training
      bool ok = p.run ? gate->WaitRange(plan_.order, p.run_first, p.run_last) : gate->Wait(p.item);
      if (!ok) return Status::IOError("staging of the tensors was abandoned");
    }
    PYCKPT_RETURN_IF_ERROR(ProcessPiece(p, items_, plan_, chunk, scratch[w], &result_, &fds[p.file]));
    if (gate != nullptr) {  // its staging memory may be reused
      if (!p.run) gate->PieceDone(p.item);
      else
        for (size_t k = p.run_first; k < p.run_last; ++k) gate->PieceDone(plan_.order[k]);
    }
    if (options_.sync && options_.early_writeback) fds[p.file].StartWriteback(p.begin, p.end - p.begin);
    if (options_.progress) options_.progress->fetch_add(p.end - p.begin, std::memory_order_relaxed);
    return Status::OK();
  }));
  if (options_.sync) {
    PYCKPT_RETURN_IF_ERROR(ParallelFor(fds.size(), threads, [&](size_t f, int) { return fds[f].Sync(); }));
  }
  for (auto& fd : fds) PYCKPT_RETURN_IF_ERROR(fd.Close());
  return Status::OK();
}

Status WriteShardFiles(const std::vector<std::string>& files,
                       const std::vector<uint64_t>& file_sizes,
                       const std::vector<ShardWriteItem>& items, const ShardWriteOptions& options,
                       ChecksumResult* result) {
  WriteJob job;
  PYCKPT_RETURN_IF_ERROR(job.Prepare(files, file_sizes, items, options));
  PYCKPT_RETURN_IF_ERROR(job.Run(nullptr));
  *result = job.TakeResult();
  return Status::OK();
}

Status ComputeChecksums(const std::vector<ShardWriteItem>& items, const ShardWriteOptions& options,
                        ChecksumResult* result) {
  PYCKPT_RETURN_IF_ERROR(CheckOptions(options));
  PYCKPT_RETURN_IF_ERROR(CheckItems(items));
  // Each item as its own "file" so no runs form; slices still split big ones.
  std::vector<Span> spans(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    spans[i] = Span{static_cast<uint32_t>(i), 0, items[i].src.NumBytes()};
  const uint64_t chunk = options.chunk_size;
  AllocateCrcs(spans, chunk, result);
  PiecePlan plan = PlanPieces(spans, chunk, RoundToChunks(options.piece_size, chunk), 0);
  const int threads = ResolveThreads(options.threads);
  ScratchSet scratch(threads);
  return ParallelFor(plan.pieces.size(), threads, [&](size_t i, int w) {
    const Piece& p = plan.pieces[i];
    if (p.run) {  // a single small item
      const ShardWriteItem& it = items[plan.order[p.run_first]];
      const uint64_t n = it.src.NumBytes();
      const char* data = it.src.data;
      if (!it.src.IsContiguous()) {
        char* buf = scratch[w].Get(n);
        if (!buf) return Status::IOError("out of memory for a scratch buffer");
        GatherRange(it.src, 0, n, buf);
        data = buf;
      }
      result->crcs[result->crc_begin[plan.order[p.run_first]]] = crc32c::Mask(crc32c::Value(data, n));
      return Status::OK();
    }
    return ProcessPiece(p, items, plan, chunk, scratch[w], result, nullptr);
  });
}

}  // namespace pyckpt
