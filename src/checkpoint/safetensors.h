// Hugging Face safetensors files: a streaming, atomic writer and a validating memory-mapped reader.
//
// Layout (docs FORMATS.md §4): u64 LE header length N | N bytes of UTF-8 JSON, space-padded |
// tensor data, packed, little-endian, row-major. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data start) and may hold
// "__metadata__": {string: string}.
//
// Tensor data reaches the writer three ways: a host pointer, a tensor (a device tensor is copied to the host
// piece by piece as it is written, so a save never holds a host copy of a whole device buffer), or a producer
// that fills each piece on demand (a tensor assembled from slices of other files, zeros).
// The writer produces the same bytes as the reference writer: tensors ordered by dtype (wider first, in the
// reference's dtype order) then by name, "__metadata__" first with {"format": "pt"}, compact JSON, header
// padded with spaces to a multiple of 8 so every tensor starts 8-byte aligned.
// The reader checks everything a corrupt or hostile file could get wrong before handing out a pointer, and
// names the file and the offending offset or field in each error (RuntimeError).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace primus {

// "F32", "BF16", "F16", "I32", "I64", "U8" for the dtypes we compute with.
const char* safetensors_dtype_name(DType dtype);
// The DType for a safetensors dtype string, or nullopt for one we do not compute with (e.g. "F64", "BOOL").
std::optional<DType> dtype_from_safetensors(const std::string& name);

class SafetensorsWriter {
 public:
  // Registers a tensor. `data` (numel(shape) × dtype_size bytes, host memory) is not copied: it must stay
  // valid until write() returns. Throws RuntimeError on a duplicate or reserved name.
  void add(const std::string& name, DType dtype, const Shape& shape, const void* data);
  // Same, from a contiguous tensor on any device; the writer keeps a reference so the data stays alive. A
  // device tensor is copied to the host in pieces of at most 16 MiB during write().
  void add(const std::string& name, const Tensor& tensor);
  // Fills bytes [offset, offset + bytes) of the tensor's data into `dst` (host memory). write() calls it with
  // pieces of at most 16 MiB whose offset and size are whole elements, in any order and from any of its threads,
  // but never two calls at once (of any producer of the writer), and propagates what it throws.
  using Producer = std::function<void(uint64_t offset, uint64_t bytes, void* dst)>;
  // A tensor whose bytes come from `produce` while the file is written.
  void add(const std::string& name, DType dtype, const Shape& shape, Producer produce);
  // An entry of "__metadata__" ("format" is always "pt" and cannot be overridden).
  void add_metadata(const std::string& key, const std::string& value);

  // The header bytes (without the 8-byte length prefix), padded; exposed for tests and size estimates.
  std::string header() const;
  // Bytes write() produces: the 8-byte length, the header and every tensor.
  uint64_t file_bytes() const;
  // Writes the file atomically (temporary + fsync + rename), tensor data straight from the registered buffers in
  // pieces of at most 16 MiB, each written at its offset (pwrite) by one of `threads` threads (<= 0: the default,
  // parallel_jobs.h) and its writeback started at once, so that the fsync before the rename has little left.
  // `on_bytes` (optional) hears of each piece written, on the calling thread (a few times a second).
  // Returns the file's size and CRC32C, computed from the bytes as they are written (per piece, then joined).
  struct Written {
    uint64_t bytes = 0;
    uint32_t crc32c = 0;
  };
  Written write(const std::string& path, const std::function<void(uint64_t bytes)>& on_bytes = {},
                int threads = 0) const;

 private:
  struct Item {
    std::string name;
    DType dtype;
    Shape shape;
    const void* data;
    uint64_t nbytes;
    Tensor keep_alive;
    Producer produce;  // set when `data` is null and the tensor is not empty
  };
  std::vector<const Item*> ordered() const;

  std::vector<Item> items_;
  std::map<std::string, std::string> metadata_{{"format", "pt"}};
};

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as written in the file: "BF16", "F32", "F64", ...
  Shape shape;
  uint64_t data_offset = 0;  // absolute offset of the first byte in the file
  uint64_t nbytes = 0;
  const void* data = nullptr;  // into the read-only mapping; valid while any copy of the SafetensorsFile lives
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws RuntimeError for unreadable or malformed files.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  // Entries in file order (ascending data offset).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A new f32 CPU tensor holding the named tensor converted from F32, BF16 or F16.
  // Throws RuntimeError when the name is missing or the dtype is anything else.
  Tensor read_f32(const std::string& name) const;
  // A new CPU tensor in the stored dtype (which must be one of ours: F32, BF16, F16, I32, I64, U8).
  Tensor read(const std::string& name) const;
  // Elements [begin, begin + count) of the named tensor, flattened row-major, converted to f32 (from F32, BF16
  // or F16) into host memory at `dst`. Throws RuntimeError naming the file and tensor when the name is
  // missing, the range is outside the tensor or the dtype is another.
  void read_f32_into(const std::string& name, int64_t begin, int64_t count, float* dst) const;

 private:
  struct Mapping;
  const SafetensorsEntry& require(const std::string& name) const;

  std::string path_;
  std::shared_ptr<const Mapping> mapping_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace primus
