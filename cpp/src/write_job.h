// WriteJob: one planned write of tensors into shard files, run once, optionally
// gated per tensor (see staged_writer.h). WriteShardFiles is Prepare + Run.
// Thread-safety: Prepare and Run from one thread; the gate may be fed from others.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "pieces.h"
#include "pyckpt/shard_writer.h"

namespace pyckpt {

// Tensors become ready one by one (as they are staged); writers wait for them.
// It also tells the stager when a tensor was written (every piece holding its
// bytes processed), so that its staging memory can be reused (a ring of
// pinned memory smaller than the state): Expect() before the writers start,
// PieceDone() per piece and item, Finish() once the writers ended.
class ReadyGate {
 public:
  explicit ReadyGate(size_t n) : ready_(n, 0), left_(n, 0), written_(n, 0) {}

  void Mark(size_t item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_[item] = 1;
    }
    cv_.notify_all();
  }
  void Abandon() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      abandoned_ = true;
    }
    cv_.notify_all();
  }
  // False when the gate was abandoned before the item became ready.
  bool Wait(size_t item) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_[item] || abandoned_; });
    return ready_[item] != 0;
  }
  bool WaitRange(const std::vector<size_t>& order, size_t first, size_t last) {
    for (size_t k = first; k < last; ++k)
      if (!Wait(order[k])) return false;
    return true;
  }
  // pieces[i]: how many pieces hold bytes of item i (0: written at once).
  void Expect(const std::vector<uint32_t>& pieces) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < pieces.size() && i < left_.size(); ++i) {
      left_[i] = pieces[i];
      written_[i] = pieces[i] == 0;
    }
  }
  void PieceDone(size_t item) {
    bool now = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (left_[item] > 0 && --left_[item] == 0) {
        written_[item] = 1;
        now = true;
      }
    }
    if (now) cv_.notify_all();
  }
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    cv_.notify_all();
  }
  // True once every piece of the item was written; false when the writers
  // ended (an error) or the gate was abandoned first.
  bool WaitWritten(size_t item) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return written_[item] || finished_ || abandoned_; });
    return written_[item] != 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> ready_;
  std::vector<uint32_t> left_;
  std::vector<char> written_;
  bool abandoned_ = false;
  bool finished_ = false;
};

class WriteJob {
 public:
  Status Prepare(const std::vector<std::string>& files, const std::vector<uint64_t>& file_sizes,
                 const std::vector<ShardWriteItem>& items, const ShardWriteOptions& options);
  // Items in the order the writers need them (first use in the piece order).
  std::vector<size_t> ItemOrder() const;
  Status Run(ReadyGate* gate);
  ChecksumResult TakeResult() { return std::move(result_); }
  const std::vector<ShardWriteItem>& items() const { return items_; }
  // Points item i at other staging memory of the same size (before it is marked
  // ready: the writers read it only after the gate says so).
  Status SetSource(size_t item, const TensorView& src);

 private:
  std::vector<std::string> files_;
  std::vector<uint64_t> sizes_;
  std::vector<ShardWriteItem> items_;
  ShardWriteOptions options_;
  PiecePlan plan_;
  ChecksumResult result_;
};

}  // namespace pyckpt
