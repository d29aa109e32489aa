// Per-worker scratch buffers, recycled across calls: on VMs, memory touched
// for the first time costs a host page fault, so buffers are kept instead of
// being allocated and dropped on every save or load.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace pyckpt {

class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  // A buffer of at least n bytes, or nullptr when memory is exhausted.
  char* Get(size_t n);

 private:
  std::unique_ptr<char[]> buf_;
  size_t size_ = 0;
};

// One ScratchBuffer per worker, returned to a process-wide pool on destruction.
class ScratchSet {
 public:
  explicit ScratchSet(int workers);
  ~ScratchSet();
  ScratchBuffer& operator[](int worker) { return *bufs_[static_cast<size_t>(worker)]; }

 private:
  std::vector<std::unique_ptr<ScratchBuffer>> bufs_;
};

}  // namespace pyckpt
