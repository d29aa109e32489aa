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
class ReadyGate {
 public:
  explicit ReadyGate(size_t n) : ready_(n, 0) {}

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

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> ready_;
  bool abandoned_ = false;
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

 private:
  std::vector<std::string> files_;
  std::vector<uint64_t> sizes_;
  std::vector<ShardWriteItem> items_;
  ShardWriteOptions options_;
  PiecePlan plan_;
  ChecksumResult result_;
};

}  // namespace pyckpt
