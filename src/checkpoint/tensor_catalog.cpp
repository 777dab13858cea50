// The tensor catalog: index.json, single-file checkpoints and Hugging Face folders seen as one map from logical
// tensor names to stored slices.
#include "checkpoint/tensor_catalog.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/checkpoint_json.h"
#include "core/error.h"
#include "core/file_io.h"
#include "ops/ops.h"

namespace primus {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Host staging for device reads and writes: 4 Mi elements (16 MiB) at a time.
constexpr int64_t kStagingElements = int64_t{4} << 20;

int64_t json_int(const json& v, const std::string& where) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    throw RuntimeError(fmt::format("{}: expected an integer, found {}", where, v.dump()));
  }
  return v.get<int64_t>();
}

// index.json of a sharded checkpoint, its format checked.
json read_sharded_index(const std::string& index_path) {
  json index = read_json_object(index_path);
  const JsonFields fields(index, index_path);
  const std::string format = fields.string("format");
  if (format != kShardedIndexFormat)
    fields.fail("format", fmt::format("is \"{}\", expected \"{}\"", format, kShardedIndexFormat));
  return index;
}

// A sharded checkpoint has at most one shard per rank; the bound keeps a damaged index from asking for billions of
// file names before the manifest is consulted.
constexpr int64_t kMaxShards = int64_t{1} << 20;

int64_t world_size_of(const json& index, const std::string& index_path) {
  return JsonFields(index, index_path).integer("world_size", 1, kMaxShards);
}

// Whether `file` is shard_<r>_of_<world_size>.safetensors for some r < world_size.
bool is_shard_file(const std::string& file, int64_t world_size) {
  const std::string prefix = "shard_";
  int64_t rank = -1;
  const char* digits = file.data() + std::min(prefix.size(), file.size());
  std::from_chars(digits, file.data() + file.size(), rank);
  return file.rfind(prefix, 0) == 0 && rank >= 0 && rank < world_size &&
         file == shard_file_name(static_cast<int>(rank), static_cast<int>(world_size));
}

// Whether `path` is strictly inside `root` (both absolute and canonical).
bool inside(const fs::path& path, const fs::path& root) {
  const auto [r, p] = std::mismatch(root.begin(), root.end(), path.begin(), path.end());
  return r == root.end() && p != path.end();
}

// The path of `name`, a weight_map file of the Hugging Face folder `dir`, when it stays in the folder: a relative
// path without '..' whose real location, symbolic links resolved, is inside the folder, or inside the blobs
// folder of Hugging Face's cache when `dir` is one of its snapshots (huggingface_hub makes
// snapshots/<revision>/<file> a link to ../../blobs/<hash>). UsageError naming `where` (index and key) otherwise:
// a downloaded index must not make the loader read /etc/passwd or a device.
std::string confined_path(const std::string& dir, const std::string& name, const std::string& where) {
  const fs::path relative(name);
  bool lexically_inside = relative.is_relative() && name.find('\0') == std::string::npos;
  for (const fs::path& part : relative) lexically_inside = lexically_inside && part != "..";
  if (!lexically_inside) {
    throw UsageError(
        fmt::format("{}: '{}' leads outside the folder {} (weight_map names files by paths relative to "
                    "it, without '..')",
                    where, name, dir));
  }
  std::error_code error;
  const fs::path root = fs::canonical(dir, error);
  const fs::path real = error ? fs::path() : fs::weakly_canonical(root / relative, error);
  if (error) throw UsageError(fmt::format("{}: cannot resolve '{}' in {}: {}", where, name, dir, error.message()));
  const bool cache_blob =
      root.parent_path().filename() == "snapshots" && inside(real, root.parent_path().parent_path() / "blobs");
  if (!inside(real, root) && !cache_blob) {
    throw UsageError(fmt::format("{}: '{}' resolves to {}, outside the folder {}", where, name, real.string(), dir));
  }
  return dir + "/" + name;
}

}  // namespace

std::string shard_file_name(int rank, int size) { return fmt::format("shard_{}_of_{}.safetensors", rank, size); }

void copy_to_host(const Tensor& src, float* dst) {
  PRIMUS_CHECK(src.dtype() == DType::kF32, "[checkpoint] copy_to_host of a {} tensor", src.describe());
  if (src.device().is_cpu()) {
    std::memcpy(dst, src.data(), src.nbytes());
    return;
  }
  Tensor staging = Tensor::empty(src.shape(), DType::kF32);
  ops::copy(staging, src);
  std::memcpy(dst, staging.data(), src.nbytes());
}

const SafetensorsFile& TensorCatalog::file(const std::string& path) const {
  auto it = files_.find(path);
  if (it == files_.end()) it = files_.emplace(path, SafetensorsFile::open(path)).first;
  return it->second;
}

void TensorCatalog::add_whole_tensor(const std::string& path, const SafetensorsEntry& entry) {
  if (tensors_.count(entry.name) != 0) {
    throw RuntimeError(
        fmt::format("{}: tensor '{}' is also in {}", path, entry.name, tensors_.at(entry.name).slices.front().file));
  }
  const TensorBox box = TensorBox::whole(entry.shape);
  tensors_[entry.name] = CatalogTensor{
      entry.shape, {TensorSlice{path, entry.name, box, 0, shape_numel(entry.shape), strided_runs(box, entry.shape)}}};
}

void TensorCatalog::add_whole_tensors(const std::string& path) {
  for (const SafetensorsEntry& entry : file(path).entries()) add_whole_tensor(path, entry);
}

TensorCatalog TensorCatalog::open_checkpoint(const std::string& dir) {
  TensorCatalog catalog;
  const std::string index_path = dir + "/" + kShardedIndexFile;
  if (!is_sharded_checkpoint(dir)) {
    // The single-file format: weights and moments under their own names in two files.
    const std::string model_file = dir + "/model.safetensors";
    const std::string optim_file = dir + "/optimizer.safetensors";
    for (const std::string& path : {model_file, optim_file}) {
      if (!fs::exists(path)) {
        throw RuntimeError(fmt::format("{}: no {} and no {} — not a checkpoint directory", dir,
                                       fs::path(path).filename().string(), kShardedIndexFile));
      }
    }
    catalog.source_ = model_file;
    catalog.add_whole_tensors(model_file);
    catalog.add_whole_tensors(optim_file);
    return catalog;
  }

  catalog.source_ = index_path;
  catalog.sharded_ = true;
  const json index = read_sharded_index(index_path);
  const int64_t world_size = world_size_of(index, index_path);
  for (const auto& [name, list] : JsonFields(index, index_path).object("tensors").items()) {
    const std::string where = fmt::format("{}: tensors.{}", index_path, name);
    if (!list.is_array() || list.empty()) throw RuntimeError(fmt::format("{}: expected a list of slices", where));
    CatalogTensor tensor;
    for (size_t k = 0; k < list.size(); ++k) {
      const json& s = list[k];
      const std::string at = fmt::format("{}[{}]", where, k);
      if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("key") ||
          !s["key"].is_string() || !s.contains("shape") || !s["shape"].is_array() || !s.contains("slice") ||
          !s["slice"].is_array() || s["slice"].size() != 2 ||
          (s.contains("box") &&
           (!s["box"].is_object() || !s["box"].contains("offset") || !s["box"]["offset"].is_array() ||
            !s["box"].contains("shape") || !s["box"]["shape"].is_array()))) {
        throw RuntimeError(
            fmt::format("{}: expected {{\"file\", \"key\", \"shape\", optionally \"box\": {{\"offset\", "
                        "\"shape\"}}, \"slice\": [begin, end], \"dtype\"}}, found {}",
                        at, s.dump()));
      }
      // Only the shards, which verification requires the manifest to cover, are ever read.
      const std::string file = s["file"].get<std::string>();
      if (!is_shard_file(file, world_size)) {
        throw RuntimeError(fmt::format("{}: file '{}' is not one of the {} shards shard_<r>_of_{}.safetensors", at,
                                       file, world_size, world_size));
      }
      Shape shape;
      for (const json& d : s["shape"]) shape.push_back(json_int(d, at + ".shape"));
      // shape_numel multiplies without checks: a negative or overflowing shape must not reach it.
      int64_t numel = 1;
      for (int64_t d : shape) {
        if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
          throw RuntimeError(
              fmt::format("{}: shape {} has a negative dimension or more than 2^63 elements", at, shape_str(shape)));
        }
      }
      if (k == 0) {
        tensor.shape = shape;
      } else if (shape != tensor.shape) {
        throw RuntimeError(fmt::format("{}: shape {} differs from the first slice's {}", at, shape_str(shape),
                                       shape_str(tensor.shape)));
      }
      // Without "box" (every checkpoint before tensor parallelism, and unsliced tensors), the whole tensor.
      TensorBox box = TensorBox::whole(shape);
      if (s.contains("box")) {
        box.offset.clear();
        box.shape.clear();
        for (const json& d : s["box"]["offset"]) box.offset.push_back(json_int(d, at + ".box.offset"));
        for (const json& d : s["box"]["shape"]) box.shape.push_back(json_int(d, at + ".box.shape"));
        if (const std::string flaw = box_flaw(box, shape); !flaw.empty()) {
          throw RuntimeError(fmt::format("{}: {}", at, flaw));
        }
      }
      const int64_t begin = json_int(s["slice"][0], at + ".slice");
      const int64_t end = json_int(s["slice"][1], at + ".slice");
      if (begin < 0 || end < begin || end > box.numel()) {
        throw RuntimeError(fmt::format("{}: slice [{}, {}) is outside the {} elements of {}", at, begin, end,
                                       box.numel(), s.contains("box") ? "its box " + box.str() : "the tensor"));
      }
      const StridedRuns runs = strided_runs(box, shape);
      tensor.slices.push_back(
          TensorSlice{dir + "/" + file, s["key"].get<std::string>(), std::move(box), begin, end, runs});
    }
    // Every element once: the save checked it, and a damaged index must not load some elements twice or none.
    std::vector<TensorPiece> pieces;
    for (const TensorSlice& slice : tensor.slices) {
      pieces.push_back(TensorPiece{slice.box, slice.begin, slice.end,
                                   fmt::format("{}:{}", fs::path(slice.file).filename().string(), slice.key)});
    }
    if (const std::string flaw = coverage_flaw(tensor.shape, pieces); !flaw.empty()) {
      throw RuntimeError(fmt::format("{}: {}", where, flaw));
    }
    catalog.tensors_[name] = std::move(tensor);
  }
  return catalog;
}

TensorCatalog TensorCatalog::open_hf_folder(const std::string& dir) {
  TensorCatalog catalog;
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(single)) {
    catalog.source_ = single;
    catalog.add_whole_tensors(single);
    return catalog;
  }
  if (!fs::exists(index_path)) {
    throw UsageError(fmt::format("{}: neither model.safetensors nor model.safetensors.index.json", dir));
  }
  catalog.source_ = index_path;
  json index;
  try {
    index = json::parse(read_file(index_path, FileKinds::kRegularOnly));
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past a double's range
    throw UsageError(fmt::format("{}: not valid JSON ({})", index_path, e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw UsageError(fmt::format("{}: no \"weight_map\" object", index_path));
  }
  for (const auto& [name, file] : index["weight_map"].items()) {
    const std::string where = fmt::format("{}: weight_map.{}", index_path, name);
    if (!file.is_string() || file.get<std::string>().empty()) {
      throw UsageError(fmt::format("{} is not a file name: {}", where, file.dump()));
    }
    const std::string path = confined_path(dir, file.get<std::string>(), where);
    const SafetensorsEntry* entry = catalog.file(path).find(name);
    if (entry == nullptr) {
      throw RuntimeError(fmt::format("{}: no tensor named '{}' ({} maps it there)", path, name, index_path));
    }
    catalog.add_whole_tensor(path, *entry);
  }
  return catalog;
}

bool is_sharded_checkpoint(const std::string& dir) { return fs::exists(dir + "/" + kShardedIndexFile); }

int64_t sharded_checkpoint_world_size(const std::string& dir) {
  const std::string index_path = dir + "/" + kShardedIndexFile;
  return world_size_of(read_sharded_index(index_path), index_path);
}

const CatalogTensor* TensorCatalog::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const CatalogTensor& TensorCatalog::require(const std::string& name, const Shape& shape) const {
  const CatalogTensor* tensor = find(name);
  if (tensor == nullptr) throw RuntimeError(fmt::format("{}: no tensor named '{}'", source_, name));
  if (tensor->shape != shape) {
    throw RuntimeError(fmt::format("{}: tensor '{}' has shape {} but the model needs {}", source_, name,
                                   shape_str(tensor->shape), shape_str(shape)));
  }
  return *tensor;
}

void TensorCatalog::read_f32(const std::string& name, int64_t begin, int64_t end, float* dst) const {
  const CatalogTensor* tensor = find(name);
  if (tensor == nullptr) throw RuntimeError(fmt::format("{}: no tensor named '{}'", source_, name));
  read_f32(name, TensorBox::whole(tensor->shape), begin, end, dst);
}

void TensorCatalog::for_each_stretch(const std::string& name, const TensorBox& box, int64_t begin, int64_t end,
                                     const Stretch& stretch) const {
  const CatalogTensor* tensor = find(name);
  if (tensor == nullptr) throw RuntimeError(fmt::format("{}: no tensor named '{}'", source_, name));
  if (const std::string flaw = box_flaw(box, tensor->shape); !flaw.empty()) {
    throw RuntimeError(fmt::format("{}: tensor '{}': {}", source_, name, flaw));
  }
  PRIMUS_CHECK(begin >= 0 && begin <= end && end <= box.numel(), "[checkpoint] elements [{}, {}) of box {} of '{}'",
               begin, end, box.str(), name);
  const std::vector<TensorSlice>& slices = tensor->slices;
  std::vector<RunSource> sources;
  for (const TensorSlice& s : slices) sources.push_back(RunSource{s.runs, s.begin, s.end});
  std::vector<const SafetensorsEntry*> checked(slices.size(), nullptr);
  const int64_t missing = copy_box_range(
      strided_runs(box, tensor->shape), begin, end, sources, [&](size_t i, int64_t offset, int64_t count, int64_t at) {
        const TensorSlice& s = slices[i];
        if (checked[i] == nullptr) {
          const SafetensorsEntry* entry = file(s.file).find(s.key);
          if (entry == nullptr) {
            throw RuntimeError(fmt::format("{}: no tensor named '{}' ({} lists it)", s.file, s.key, source_));
          }
          if (shape_numel(entry->shape) != s.end - s.begin) {
            throw RuntimeError(fmt::format("{}: tensor '{}' has {} elements but {} gives it slice [{}, {}) of '{}'",
                                           s.file, s.key, shape_numel(entry->shape), source_, s.begin, s.end, name));
          }
          checked[i] = entry;
        }
        stretch(s, *checked[i], offset, count, at);
      });
  if (missing >= 0) {
    throw RuntimeError(fmt::format("{}: element {} of box {} of tensor '{}' is in no slice (needed [{}, {}))", source_,
                                   begin + missing, box.str(), name, begin, end));
  }
}

void TensorCatalog::read_f32(const std::string& name, const TensorBox& box, int64_t begin, int64_t end,
                             float* dst) const {
  for_each_stretch(name, box, begin, end,
                   [&](const TensorSlice& s, const SafetensorsEntry&, int64_t offset, int64_t count, int64_t at) {
                     file(s.file).read_f32_into(s.key, offset, count, dst + at);
                   });
}

std::vector<TensorCatalog::StoredRun> TensorCatalog::locate(const std::string& name, const TensorBox& box,
                                                            int64_t begin, int64_t end) const {
  std::vector<StoredRun> runs;
  for_each_stretch(
      name, box, begin, end,
      [&](const TensorSlice& s, const SafetensorsEntry& entry, int64_t offset, int64_t count, int64_t at) {
        if (entry.dtype != "F32") {
          throw RuntimeError(fmt::format("{}: tensor '{}' is {}; a checkpoint stores F32", s.file, s.key, entry.dtype));
        }
        runs.push_back(StoredRun{s.file, entry.data_offset + 4 * static_cast<uint64_t>(offset), count, at});
      });
  return runs;
}

void TensorCatalog::read_into(const std::string& name, int64_t begin, int64_t end, const Tensor& dst) const {
  const CatalogTensor* tensor = find(name);
  if (tensor == nullptr) throw RuntimeError(fmt::format("{}: no tensor named '{}'", source_, name));
  read_into(name, TensorBox::whole(tensor->shape), begin, end, dst);
}

void TensorCatalog::read_into(const std::string& name, const TensorBox& box, int64_t begin, int64_t end,
                              const Tensor& dst) const {
  PRIMUS_CHECK(dst.dtype() == DType::kF32 && dst.numel() == end - begin,
               "[checkpoint] reading {} elements of '{}' into {}", end - begin, name, dst.describe());
  if (dst.device().is_cpu()) {
    read_f32(name, box, begin, end, dst.f32());
    return;
  }
  const Tensor flat = dst.reshape({dst.numel()});
  Tensor staging;
  for (int64_t at = begin; at < end; at += kStagingElements) {
    const int64_t n = std::min(kStagingElements, end - at);
    if (!staging.defined() || staging.numel() != n) staging = Tensor::empty({n}, DType::kF32);
    read_f32(name, box, at, at + n, staging.f32());
    Tensor target = flat.slice_elements(at - begin, {n});
    ops::copy(target, staging);
  }
}

}  // namespace primus
