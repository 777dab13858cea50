// Where the elements of each logical tensor of a checkpoint live, whatever wrote it: the single-file native
// format (model.safetensors + optimizer.safetensors), the sharded native format (index.json over shard files,
// each holding 1-D slices: flat ranges of a box of the tensor, tensor_box.h), or a Hugging Face folder
// (model.safetensors, or shards listed by model.safetensors.index.json). Readers ask for element ranges of a box
// of a logical tensor (the whole of it, or a tensor-parallel rank's part) by name and get them from whichever
// slices hold them, so a checkpoint loads into any layout: a model of one process, the slices of tensor-parallel
// ranks, the shards of a distributed optimizer, from a checkpoint written by any number of ranks of any layout.
//
// Files are memory-mapped on first use and kept open while the catalog lives; nothing is read up front
// except the safetensors headers and index.json. The checkpoint loader reads through locate() and preads instead
// (parallel_io.h); the mapping then serves only the headers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_box.h"
#include "core/tensor.h"

namespace primus {

// The sharded format's index, beside the shards in the checkpoint directory.
inline constexpr const char* kShardedIndexFile = "index.json";
inline constexpr const char* kShardedIndexFormat = "primus-sharded-checkpoint";
// A sharded checkpoint's data file of `rank` of `size`: "shard_0_of_4.safetensors".
std::string shard_file_name(int rank, int size);

// Whether `dir` holds the sharded format: it has index.json (else it is the single-file format). The loader and the
// verification decide the same way.
bool is_sharded_checkpoint(const std::string& dir);
// The number of shard files of a sharded checkpoint, `world_size` in its index.json: the files are
// shard_<r>_of_<world_size>.safetensors for every r < world_size, and the index names no others. RuntimeError
// naming index.json and the key when it is malformed.
int64_t sharded_checkpoint_world_size(const std::string& dir);

// One stored piece of a logical tensor: elements [begin, end) of `box` (the whole tensor unless a tensor-parallel
// rank wrote it) numbered row-major, held as the tensor `key` of `file` (end - begin elements, any shape).
struct TensorSlice {
  std::string file;  // a path
  std::string key;
  TensorBox box;
  int64_t begin = 0;
  int64_t end = 0;
  StridedRuns runs;  // the box's
};

struct CatalogTensor {
  Shape shape;                      // the logical tensor's
  std::vector<TensorSlice> slices;  // together every element once (coverage_flaw)
};

class TensorCatalog {
 public:
  // A native checkpoint iteration directory of either format. Throws RuntimeError naming the file for a
  // malformed index or safetensors header.
  static TensorCatalog open_checkpoint(const std::string& dir);
  // A Hugging Face model folder. Throws UsageError when it has neither model.safetensors nor an index, for a
  // malformed index, and for a weight_map file that is not inside the folder (absolute, with '..', or a symbolic
  // link out of it; the blobs of Hugging Face's cache excepted): the user named the folder. RuntimeError for a
  // malformed safetensors file.
  static TensorCatalog open_hf_folder(const std::string& dir);

  // What errors name as the catalog's source: index.json, or the safetensors file(s).
  const std::string& source() const { return source_; }
  bool sharded() const { return sharded_; }
  const std::map<std::string, CatalogTensor>& tensors() const { return tensors_; }
  const CatalogTensor* find(const std::string& name) const;
  // The named tensor, which must have `shape`; RuntimeError naming the source otherwise.
  const CatalogTensor& require(const std::string& name, const Shape& shape) const;

  // Elements [begin, end) of the named tensor (flattened) as f32 into host memory; every element must be in a
  // slice (RuntimeError naming the source and the first missing element otherwise).
  void read_f32(const std::string& name, int64_t begin, int64_t end, float* dst) const;
  // Same for elements [begin, end) of `box` of the tensor, numbered row-major over the box (a tensor-parallel
  // rank's part, a data-parallel shard of it); RuntimeError naming the source when the box does not fit the tensor.
  void read_f32(const std::string& name, const TensorBox& box, int64_t begin, int64_t end, float* dst) const;
  // Where elements [begin, end) of `box` of the named tensor are stored, for readers that fetch the bytes
  // themselves (parallel_io.h): element [at, at + count) of the range are `count` F32 elements at byte `offset` of
  // `file`. RuntimeError as read_f32, and naming the file for a stored slice that is not F32 (native checkpoints
  // store F32 only). Not for several threads at once (it opens the files' headers on first use, as the reads do).
  struct StoredRun {
    std::string file;
    uint64_t offset = 0;
    int64_t count = 0;
    int64_t at = 0;
  };
  std::vector<StoredRun> locate(const std::string& name, const TensorBox& box, int64_t begin, int64_t end) const;
  // Same into `dst` ([end - begin] f32 on any device), through the host in pieces of at most 16 MiB.
  void read_into(const std::string& name, int64_t begin, int64_t end, const Tensor& dst) const;
  void read_into(const std::string& name, const TensorBox& box, int64_t begin, int64_t end, const Tensor& dst) const;

 private:
  const SafetensorsFile& file(const std::string& path) const;
  // Calls `stretch` for each stored stretch of elements [begin, end) of `box` of the named tensor, in order, after
  // checking the tensor, the box and each slice's entry; RuntimeError naming the source for an element in no slice.
  using Stretch = std::function<void(const TensorSlice& slice, const SafetensorsEntry& entry, int64_t offset,
                                     int64_t count, int64_t at)>;
  void for_each_stretch(const std::string& name, const TensorBox& box, int64_t begin, int64_t end,
                        const Stretch& stretch) const;
  void add_whole_tensor(const std::string& path, const SafetensorsEntry& entry);
  void add_whole_tensors(const std::string& path);

  std::string source_;
  bool sharded_ = false;
  std::map<std::string, CatalogTensor> tensors_;
  mutable std::map<std::string, SafetensorsFile> files_;
};

// A 1-D f32 view on any device into host memory: a CPU tensor is read in place, a device one through a host
// staging copy.
void copy_to_host(const Tensor& src, float* dst);

}  // namespace primus
