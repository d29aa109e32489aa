// StagedWrite: a write whose tensors are first copied ("staged") into buffers
// the caller owns, with the writing overlapping the copying.
//
// Contract: Start() plans the write of the staging buffers (items[i].src) and
// starts a writer thread that writes each tensor as soon as it is staged.
// Stage() copies live[i] into items[i].src (same byte size) from up to
// `threads` threads, in the order the writers need them, and returns when
// every copy is done: from then on the caller may modify the live tensors.
// Wait() joins the writer and returns its status and the chunk checksums.
// The destructor waits for the writer. Stage() must be called once before
// Wait(); if it is not, Wait() abandons the write with an IOError.
// Thread-safety: Stage and Wait from one thread at a time; the buffers (live
// until Stage returns, staging until Wait returns) must stay alive.
//
// External staging: Start() with no live tensors leaves the copying to the
// caller (device-to-host copies run by a copy engine): it fills the staging
// buffers itself, in Order() ideally, and calls MarkReady(i) as each one lands.
// Wait() abandons the write with an IOError unless every item was marked.
// MarkReady(i, &src) points item i at other memory of its size first, and
// WaitWritten(i) returns once item i was written: together they let the
// caller stage through a ring of buffers smaller than the state.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pyckpt/shard_writer.h"
#include "pyckpt/status.h"
#include "pyckpt/tensor_view.h"

namespace pyckpt {

class WriteJob;
class ReadyGate;

class StagedWrite {
 public:
  StagedWrite();
  ~StagedWrite();
  StagedWrite(const StagedWrite&) = delete;
  StagedWrite& operator=(const StagedWrite&) = delete;

  Status Start(const std::vector<std::string>& files, const std::vector<uint64_t>& file_sizes,
               const std::vector<ShardWriteItem>& items, const std::vector<TensorView>& live,
               const ShardWriteOptions& options);
  Status Stage(int threads);
  // External staging (no live tensors given to Start).
  std::vector<size_t> Order() const;
  Status MarkReady(size_t item, const TensorView* src = nullptr);
  Status WaitWritten(size_t item);
  Status Wait(ChecksumResult* result);

 private:
  std::unique_ptr<WriteJob> job_;
  std::unique_ptr<ReadyGate> gate_;
  std::vector<TensorView> live_;
  std::thread writer_;
  Status status_;
  bool staged_ = false;
  bool joined_ = true;
  bool external_ = false;
  std::vector<char> marked_;
  size_t marked_count_ = 0;
};

}  // namespace pyckpt
