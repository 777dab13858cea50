// The pieces of the numpy/Python world that Megatron's index caches are made of: read-only memory-mapped
// files, .npy arrays (format version 1.0 written; 1.0, 2.0 and 3.0 read) and MD5 digests that name caches.
//
// An IndexArray is a read-only integer array (int32, uint32 or int64, little-endian) either owned in memory
// or mapped from a .npy file, read element by element with memcpy (mapped data need not be aligned).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace primus {

// A whole file mapped read-only. An empty file maps to data() == nullptr, size() == 0.
class MappedFile {
 public:
  // Throws RuntimeError naming the path and the OS error.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

// Lower-case hex MD5 (RFC 1321) of `bytes`.
std::string md5_hex(std::string_view bytes);

enum class IndexDType { kI32, kU32, kI64 };
const char* npy_descr(IndexDType dtype);  // "<i4", "<u4", "<i8"

class IndexArray {
 public:
  IndexArray() = default;
  // Owned values with the given shape (product of shape == values.size()).
  IndexArray(std::vector<int64_t> values, std::vector<int64_t> shape);
  // Maps a .npy file. Throws RuntimeError naming the file and byte offset when it is not a C-order int32,
  // uint32 or int64 little-endian array whose data fills the file exactly.
  static IndexArray map_npy(const std::string& path);

  int64_t size() const { return size_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  IndexDType dtype() const { return dtype_; }
  // Where the values live: the .npy path, or "memory".
  std::string source() const;

  int64_t operator[](int64_t i) const;

 private:
  std::shared_ptr<const MappedFile> file_;
  const unsigned char* data_ = nullptr;  // mapped values (file_ set) or null (owned_ used)
  std::vector<int64_t> owned_;
  std::vector<int64_t> shape_;
  int64_t size_ = 0;
  IndexDType dtype_ = IndexDType::kI64;
};

// Writes `values` (shape `shape`) as a .npy v1.0 file of `dtype` atomically. PRIMUS_CHECK that every value
// fits the dtype. Throws RuntimeError on I/O failure.
void write_npy(const std::string& path, const std::vector<int64_t>& values, const std::vector<int64_t>& shape,
               IndexDType dtype);

}  // namespace primus
