#include "pyckpt/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace pyckpt {

int DefaultThreads() {
  if (const char* env = std::getenv("PYCKPT_THREADS")) {
    int v = std::atoi(env);
    if (v > 0) return std::min(v, 256);
  }
  unsigned hw = std::thread::hardware_concurrency();
  return std::max(2, static_cast<int>(std::min(hw, 64u)));
}

int ResolveThreads(int threads) { return threads > 0 ? threads : DefaultThreads(); }

Status ParallelFor(size_t n, int threads, const std::function<Status(size_t, int)>& fn) {
  if (n == 0) return Status::OK();
  threads = ResolveThreads(threads);
  const int workers = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), n));

  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t first_bad = n;
  Status first_error;

  auto body = [&](int worker) {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      Status st = fn(i, worker);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < first_bad) {
          first_bad = i;
          first_error = std::move(st);
        }
        failed.store(true, std::memory_order_relaxed);
      }
    }
  };

  if (workers == 1) {
    body(0);
  } else {
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(workers - 1));
    for (int w = 1; w < workers; ++w) {
      try {
        pool.emplace_back(body, w);
      } catch (...) {  // out of threads: the ones already running finish the work
        break;
      }
    }
    body(0);
    for (auto& t : pool) t.join();
  }
  return first_error;
}

}  // namespace pyckpt
