// POSIX implementation of file_io.h: read loops, atomic replace, positioned writes (CRC32C: crc32c.cpp).
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "core/error.h"

namespace primus {

namespace {

std::string os_error(int err) { return std::generic_category().message(err); }

std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? std::string(".") : dir;
}

// close() that reports failure: on NFS and some other file systems a write error surfaces only here.
void close_or_throw(int fd, const std::string& path) {
  if (::close(fd) != 0) throw RuntimeError(fmt::format("close {}: {}", path, os_error(errno)));
}

}  // namespace

std::string read_file(const std::string& path) { return read_file(path, FileKinds::kAny); }

std::string read_file(const std::string& path, FileKinds kinds) {
  // O_NONBLOCK: opening a FIFO without a writer would block; regular files ignore it, and it is cleared below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw RuntimeError(fmt::format("cannot open {}: {}", path, os_error(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw RuntimeError(fmt::format("cannot stat {}: {}", path, os_error(err)));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw RuntimeError(fmt::format("cannot read {}: {}", path, os_error(EISDIR)));
  }
  if (kinds == FileKinds::kRegularOnly && !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw RuntimeError(fmt::format("{}: not a regular file (a FIFO, device or socket); refusing to read it", path));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a pipe (`--config <(...)`) is then read blocking
  std::string bytes;
  // st_size is a hint only (pipes and /proc files report 0); read until end of file either way.
  size_t capacity = st.st_size > 0 ? static_cast<size_t>(st.st_size) + 1 : 4096;
  bytes.resize(capacity);
  size_t used = 0;
  while (true) {
    if (used == bytes.size()) bytes.resize(bytes.size() * 2);
    ssize_t got = ::read(fd, bytes.data() + used, bytes.size() - used);
    if (got < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw RuntimeError(fmt::format("read {} at offset {}: {}", path, used, os_error(err)));
    }
    if (got == 0) break;
    used += static_cast<size_t>(got);
  }
  ::close(fd);
  bytes.resize(used);
  return bytes;
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(fmt::format("cannot open directory {}: {}", dir, os_error(errno)));
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    throw RuntimeError(fmt::format("fsync directory {}: {}", dir, os_error(err)));
  }
  close_or_throw(fd, dir);
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), tmp_path_(fmt::format("{}.tmp.{}", path_, ::getpid())) {
  // The rename would replace whatever is there: a device (/dev/full), a FIFO or a symlink given as an output
  // must not become a plain file.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw RuntimeError(fmt::format("{}: exists and is not a regular file (a directory, device, FIFO, socket or "
                                   "symbolic link); refusing to replace it",
                                   path_));
  }
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw RuntimeError(fmt::format("cannot create {}: {}", tmp_path_, os_error(errno)));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) discard();
}

void AtomicFileWriter::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::append(const void* data, size_t n) {
  PRIMUS_CHECK(fd_ >= 0 && !committed_, "append to {} after commit or failure", path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t put = ::write(fd_, p, n);
    if (put < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      discard();
      throw RuntimeError(fmt::format("write {} at offset {}: {}", tmp_path_, bytes_written_, os_error(err)));
    }
    p += put;
    n -= static_cast<size_t>(put);
    bytes_written_ += static_cast<uint64_t>(put);
  }
}

void AtomicFileWriter::write_at(uint64_t offset, const void* data, size_t n) const {
  PRIMUS_CHECK(fd_ >= 0 && !committed_, "write_at to {} after commit or failure", path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (put < 0) {
      if (errno == EINTR) continue;
      throw RuntimeError(fmt::format("write {} at offset {}: {}", tmp_path_, offset, os_error(errno)));
    }
    p += put;
    n -= static_cast<size_t>(put);
    offset += static_cast<uint64_t>(put);
  }
}

void AtomicFileWriter::start_writeback(uint64_t offset, uint64_t n) const {
#if defined(__linux__)
  if (fd_ >= 0) ::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
#else
  (void)offset;
  (void)n;
#endif
}

void AtomicFileWriter::commit() {
  PRIMUS_CHECK(fd_ >= 0 && !committed_, "commit of {} twice or after a failure", path_);
  try {
    if (::fsync(fd_) != 0) throw RuntimeError(fmt::format("fsync {}: {}", tmp_path_, os_error(errno)));
    int fd = fd_;
    fd_ = -1;
    close_or_throw(fd, tmp_path_);
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
      throw RuntimeError(fmt::format("rename {} -> {}: {}", tmp_path_, path_, os_error(errno)));
    }
  } catch (...) {
    discard();
    throw;
  }
  committed_ = true;
  // The new file is in place; a failing directory fsync still reports an error (durability is not assured).
  fsync_directory(parent_dir(path_));
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFileWriter writer(path);
  writer.append(bytes);
  writer.commit();
}

}  // namespace primus
