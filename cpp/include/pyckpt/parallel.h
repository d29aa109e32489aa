// ParallelFor: run fn(i, worker) for every i in [0, n) on up to `threads`
// threads, taking items in increasing order from a shared counter.
//
// Contract: returns OK when every call returned OK; otherwise the error of the
// lowest-indexed failing item that ran (later items are skipped once an error
// is seen, so the run stops early). `worker` is in [0, threads) and identifies
// the calling thread, for per-thread scratch buffers.
// Threads are created per call and joined before return, so the core keeps no
// threads alive across calls (safe with fork(), as torchrun and multiprocessing do).
// Thread-safety: fn must be safe to call concurrently for distinct i.
#pragma once

#include <cstddef>
#include <functional>

#include "pyckpt/status.h"

namespace pyckpt {

// Worker count used when a caller passes threads <= 0: the PYCKPT_THREADS
// environment variable if set, else the number of online CPUs (at least 2:
// storage I/O overlaps well with a second thread even on one core).
int DefaultThreads();

// `threads` when positive, else DefaultThreads().
int ResolveThreads(int threads);

Status ParallelFor(size_t n, int threads, const std::function<Status(size_t i, int worker)>& fn);

}  // namespace pyckpt
