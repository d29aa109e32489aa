#include "scratch.h"

#include <mutex>
#include <new>

namespace pyckpt {
namespace {

// At most this many idle buffers are kept for reuse.
constexpr size_t kPoolLimit = 16;

std::mutex& PoolMutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::unique_ptr<ScratchBuffer>>& Pool() {
  static auto* pool = new std::vector<std::unique_ptr<ScratchBuffer>>();
  return *pool;
}

}  // namespace

ScratchBuffer::~ScratchBuffer() = default;

char* ScratchBuffer::Get(size_t n) {
  if (size_ < n) {
    buf_.reset();
    size_ = 0;
    buf_.reset(new (std::nothrow) char[n]);
    if (!buf_) return nullptr;
    size_ = n;
  }
  return buf_.get();
}

ScratchSet::ScratchSet(int workers) {
  std::lock_guard<std::mutex> lock(PoolMutex());
  auto& pool = Pool();
  for (int w = 0; w < workers; ++w) {
    if (!pool.empty()) {
      bufs_.push_back(std::move(pool.back()));
      pool.pop_back();
    } else {
      bufs_.push_back(std::make_unique<ScratchBuffer>());
    }
  }
}

ScratchSet::~ScratchSet() {
  std::lock_guard<std::mutex> lock(PoolMutex());
  auto& pool = Pool();
  for (auto& b : bufs_)
    if (pool.size() < kPoolLimit) pool.push_back(std::move(b));
}

}  // namespace pyckpt
