// Whole-file reads, crash-safe writes and CRC32C.
//
// Atomic writes follow the classic recipe: write `<path>.tmp.<pid>` in the same directory, fsync it,
// rename() it over `path`, then fsync the directory so the rename itself survives a power cut. A reader
// therefore sees either the old complete file or the new complete file, never a torn one.
//
// CRC32C (TensorBoard records, checkpoint manifests) is in crc32c.h, included here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/crc32c.h"

namespace primus {

// The whole file as bytes. Throws RuntimeError naming the path and the OS error; callers reading a file the
// user named may catch it and rethrow as UsageError.
std::string read_file(const std::string& path);
// kRegularOnly: a FIFO, device or socket is refused at once (a FIFO would block a reader forever): for files a
// program writes, such as checkpoint metadata.
enum class FileKinds { kAny, kRegularOnly };
std::string read_file(const std::string& path, FileKinds kinds);

// Replaces `path` with `bytes` atomically (see above). Throws RuntimeError on any I/O failure; the old file
// is left untouched and the temporary removed.
void write_file_atomic(const std::string& path, std::string_view bytes);

// fsync() a directory so that renames and creations inside it are durable. Throws RuntimeError.
void fsync_directory(const std::string& dir);

// Streaming version of write_file_atomic for files too large to build in memory (checkpoints).
//   AtomicFileWriter w(path); w.append(...); ...; w.commit();
// Destroying the writer without commit() removes the temporary and leaves any old `path` intact.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void append(const void* data, size_t n);
  void append(std::string_view bytes) { append(bytes.data(), bytes.size()); }
  // Writes n bytes at `offset` of the temporary (pwrite), leaving the append position alone: several threads may
  // write disjoint ranges at once. A failure throws RuntimeError naming the temporary and the offset; the writer
  // is then to be destroyed (which removes the temporary), not committed.
  void write_at(uint64_t offset, const void* data, size_t n) const;
  // Asks the kernel to start writing bytes [offset, offset + n) back to the disk now (sync_file_range on Linux,
  // nothing elsewhere), so that commit()'s fsync finds little left to do. A hint: errors surface at fsync.
  void start_writeback(uint64_t offset, uint64_t n) const;
  // fsync, close, rename over the target, fsync the directory. The writer is finished afterwards.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_path_; }
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  void discard() noexcept;

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  uint64_t bytes_written_ = 0;
  bool committed_ = false;
};

// TensorBoard/TFRecord masking: rotate right by 15 and add a constant, so a CRC stored next to the data it
// covers does not look like data with a valid CRC.
inline uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }
inline uint32_t masked_crc32c(const void* data, size_t n) { return mask_crc32c(crc32c(data, n)); }

}  // namespace primus
