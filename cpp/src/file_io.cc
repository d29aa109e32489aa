#include "file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pyckpt {
namespace {

Status Errno(const std::string& what, const std::string& path, int err) {
  return Status::IOError(what + " '" + path + "': " + std::strerror(err), err);
}

constexpr uint64_t kMaxIo = 1ull << 30;  // Linux caps one read/write at ~2 GiB

}  // namespace

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

Status File::OpenNew(const std::string& path) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) return Errno("cannot create", path, errno);
  return Status::OK();
}

Status File::OpenRead(const std::string& path) {
  path_ = path;
  // O_NOFOLLOW: pyckpt writes shard files as regular files only; a link in their
  // place could make a checkpoint read bytes from outside itself (FORMAT.md 2).
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd_ < 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound("missing shard file '" + path + "'");
    if (err == ELOOP)
      return Status::Corruption("shard file '" + path +
                                "' is a symbolic link; pyckpt refuses to follow links "
                                "inside a checkpoint");
    return Errno("cannot open", path, err);
  }
  return Status::OK();
}

Status File::Close() {
  if (fd_ < 0) return Status::OK();
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return Errno("cannot close", path_, errno);
  return Status::OK();
}

Status File::PWrite(const char* data, uint64_t n, uint64_t offset) {
  while (n > 0) {
    size_t step = static_cast<size_t>(n < kMaxIo ? n : kMaxIo);
    ssize_t w = ::pwrite(fd_, data, step, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write failed at " + RangeString(offset, offset + n) + " of", path_, errno);
    }
    data += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<uint64_t>(w);
  }
  return Status::OK();
}

Status File::PRead(char* dst, uint64_t n, uint64_t offset) const {
  const uint64_t begin = offset, end = offset + n;
  while (n > 0) {
    size_t step = static_cast<size_t>(n < kMaxIo ? n : kMaxIo);
    ssize_t r = ::pread(fd_, dst, step, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read failed at " + RangeString(begin, end) + " of", path_, errno);
    }
    if (r == 0)
      return Status::Corruption("file '" + path_ + "' is truncated: bytes " +
                                RangeString(offset, end) + " are missing");
    dst += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return Status::OK();
}

Status File::Size(uint64_t* size) const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return Errno("cannot stat", path_, errno);
  *size = static_cast<uint64_t>(st.st_size);
  return Status::OK();
}

Status File::Truncate(uint64_t size) {
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return Errno("cannot resize", path_, errno);
  return Status::OK();
}

void File::StartWriteback(uint64_t offset, uint64_t n) {
#ifdef __linux__
  ::sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(n),
                    SYNC_FILE_RANGE_WRITE);
#else
  (void)offset, (void)n;
#endif
}

void File::AdviseSequential() {
#ifdef POSIX_FADV_SEQUENTIAL
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
}

Status File::Sync() {
  if (::fsync(fd_) != 0) return Errno("cannot sync", path_, errno);
  return Status::OK();
}

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) return Errno("cannot sync directory", dir, err);
  return Status::OK();
}

std::string RangeString(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

}  // namespace pyckpt
