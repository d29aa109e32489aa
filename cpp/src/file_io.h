// Thin POSIX file wrappers used by the shard writer and reader. Every OS call
// of the core goes through here, so errors carry the path and errno and a
// future Env (io_uring, O_DIRECT) has one place to live.
// Thread-safety: PWrite/PRead on one File from several threads are safe
// (positional I/O); Open/Close are not.
#pragma once

#include <cstdint>
#include <string>

#include "pyckpt/status.h"

namespace pyckpt {

class File {
 public:
  File() = default;
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }

  // Creates a new file; fails if it exists (shard names are unique per save).
  Status OpenNew(const std::string& path);
  Status OpenRead(const std::string& path);
  Status Close();

  Status PWrite(const char* data, uint64_t n, uint64_t offset);
  // Reads exactly n bytes; a short file is reported as Corruption (truncation).
  Status PRead(char* dst, uint64_t n, uint64_t offset) const;
  Status Size(uint64_t* size) const;
  Status Truncate(uint64_t size);
  // Asks the kernel to start writing back a range now (no wait).
  void StartWriteback(uint64_t offset, uint64_t n);
  void AdviseSequential();
  Status Sync();

  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  std::string path_;
};

// fsync()s a directory so that entries created or renamed in it are durable.
Status SyncDir(const std::string& dir);

std::string RangeString(uint64_t begin, uint64_t end);  // "[begin, end)"

}  // namespace pyckpt
