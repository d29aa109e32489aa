#include "pyckpt/staged_writer.h"

#include <atomic>

#include "pieces.h"
#include "pyckpt/defaults.h"
#include "pyckpt/parallel.h"
#include "write_job.h"

namespace pyckpt {

StagedWrite::StagedWrite() = default;

StagedWrite::~StagedWrite() {
  if (!joined_) {
    if (gate_) gate_->Abandon();
    writer_.join();
  }
}

Status StagedWrite::Start(const std::vector<std::string>& files,
                          const std::vector<uint64_t>& file_sizes,
                          const std::vector<ShardWriteItem>& items,
                          const std::vector<TensorView>& live, const ShardWriteOptions& options) {
  external_ = live.empty() && !items.empty();
  if (!external_ && live.size() != items.size())
    return Status::InvalidArgument("one live tensor per item");
  for (size_t i = 0; i < live.size(); ++i) {
    PYCKPT_RETURN_IF_ERROR(ValidateView(live[i], "tensor '" + items[i].key + "'"));
    if (live[i].NumBytes() != items[i].src.NumBytes())
      return Status::InvalidArgument("tensor '" + items[i].key + "': staging buffer size differs");
  }
  job_ = std::make_unique<WriteJob>();
  PYCKPT_RETURN_IF_ERROR(job_->Prepare(files, file_sizes, items, options));
  gate_ = std::make_unique<ReadyGate>(items.size());
  live_ = live;
  marked_.assign(items.size(), 0);
  marked_count_ = 0;
  try {
    writer_ = std::thread([this] {
      status_ = job_->Run(gate_.get());
      gate_->Finish();
    });
  } catch (...) {
    return Status::IOError("cannot start the writer thread");
  }
  joined_ = false;
  return Status::OK();
}

Status StagedWrite::Stage(int threads) {
  if (!job_) return Status::InvalidArgument("Start() first");
  if (external_) return Status::InvalidArgument("this write is staged externally (MarkReady)");
  const std::vector<ShardWriteItem>& items = job_->items();
  const std::vector<size_t> order = job_->ItemOrder();
  // Split big tensors into copy pieces; a tensor is ready when its last piece is done.
  std::vector<ItemRange> jobs;
  std::vector<std::atomic<uint32_t>> left(items.size());
  for (size_t i : order) {
    const size_t count = SplitItem(i, items[i].src.NumBytes(), kDefaultCopyPieceSize, &jobs);
    left[i].store(static_cast<uint32_t>(count));
    if (count == 0) gate_->Mark(i);
  }
  Status st = ParallelFor(jobs.size(), threads, [&](size_t j, int) {
    const ItemRange& job = jobs[j];
    if (!CopyRangeDirect(live_[job.item], items[job.item].src, job.begin, job.end - job.begin))
      return Status::InvalidArgument("staging buffers must be contiguous");
    if (left[job.item].fetch_sub(1) == 1) gate_->Mark(job.item);
    return Status::OK();
  });
  if (!st.ok()) {
    gate_->Abandon();
    return st;
  }
  staged_ = true;
  return Status::OK();
}

std::vector<size_t> StagedWrite::Order() const {
  return job_ ? job_->ItemOrder() : std::vector<size_t>();
}

Status StagedWrite::MarkReady(size_t item, const TensorView* src) {
  if (!job_ || !external_) return Status::InvalidArgument("MarkReady needs an externally staged write");
  if (item >= marked_.size()) return Status::InvalidArgument("MarkReady: item out of range");
  if (!marked_[item]) {
    if (src != nullptr) PYCKPT_RETURN_IF_ERROR(job_->SetSource(item, *src));
    marked_[item] = 1;
    if (++marked_count_ == marked_.size()) staged_ = true;
    gate_->Mark(item);
  }
  return Status::OK();
}

Status StagedWrite::WaitWritten(size_t item) {
  if (!job_ || !external_) return Status::InvalidArgument("WaitWritten needs an externally staged write");
  if (item >= marked_.size()) return Status::InvalidArgument("WaitWritten: item out of range");
  if (!marked_[item]) return Status::InvalidArgument("WaitWritten: item not marked ready");
  if (gate_->WaitWritten(item)) return Status::OK();
  return Status::IOError("the write ended before tensor '" + job_->items()[item].key +
                         "' was written");
}

Status StagedWrite::Wait(ChecksumResult* result) {
  if (!job_) return Status::InvalidArgument("Start() first");
  if (!staged_) gate_->Abandon();
  if (!joined_) {
    writer_.join();
    joined_ = true;
  }
  PYCKPT_RETURN_IF_ERROR(status_);
  if (!staged_) return Status::IOError("the write was abandoned before its tensors were staged");
  *result = job_->TakeResult();
  return Status::OK();
}

}  // namespace pyckpt
