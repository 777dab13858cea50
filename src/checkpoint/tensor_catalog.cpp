// The tensor catalog: index.json, single-file checkpoints and Hugging Face folders seen as one map from logical
// tensor names to stored slices.
#include "checkpoint/tensor_catalog.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file_io.h"
#include "ops/ops.h"

namespace primus {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Host staging for device reads and writes: 4 Mi elements (16 MiB) at a time.
constexpr int64_t kStagingElements = int64_t{4} << 20;

// A name index.json gives for a shard: a plain file name inside the checkpoint directory, so a hostile index
// cannot point the loader elsewhere.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

int64_t json_int(const json& v, const std::string& where) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})) {
    throw RuntimeError(fmt::format("{}: expected an integer of int64's range, found {}", where, v.dump()));
  }
  return v.get<int64_t>();
}

}  // namespace

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
  tensors_[entry.name] = CatalogTensor{entry.shape, {TensorSlice{path, entry.name, 0, shape_numel(entry.shape)}}};
}

void TensorCatalog::add_whole_tensors(const std::string& path) {
  for (const SafetensorsEntry& entry : file(path).entries()) add_whole_tensor(path, entry);
}

TensorCatalog TensorCatalog::open_checkpoint(const std::string& dir) {
  TensorCatalog catalog;
  const std::string index_path = dir + "/" + kShardedIndexFile;
  if (!fs::exists(index_path)) {
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
  json index;
  try {
    index = json::parse(read_file(index_path, FileKinds::kRegularOnly));
  } catch (const json::exception& e) {
    throw RuntimeError(fmt::format("{}: unreadable index ({})", index_path, e.what()));
  }
  // Compared as JSON: value("format", ...) throws nlohmann's type_error when "format" is not a string.
  if (!index.is_object() || !index.contains("format") || index["format"] != kShardedIndexFormat) {
    throw RuntimeError(
        fmt::format("{}: not a {} index (\"format\" is missing or different)", index_path, kShardedIndexFormat));
  }
  if (!index.contains("tensors") || !index["tensors"].is_object()) {
    throw RuntimeError(fmt::format("{}: no \"tensors\" object", index_path));
  }
  for (const auto& [name, list] : index["tensors"].items()) {
    const std::string where = fmt::format("{}: tensors.{}", index_path, name);
    if (!list.is_array() || list.empty()) throw RuntimeError(fmt::format("{}: expected a list of slices", where));
    CatalogTensor tensor;
    for (size_t k = 0; k < list.size(); ++k) {
      const json& s = list[k];
      const std::string at = fmt::format("{}[{}]", where, k);
      if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("key") ||
          !s["key"].is_string() || !s.contains("shape") || !s["shape"].is_array() || !s.contains("slice") ||
          !s["slice"].is_array() || s["slice"].size() != 2) {
        throw RuntimeError(
            fmt::format("{}: expected {{\"file\", \"key\", \"shape\", \"slice\": [begin, end], "
                        "\"dtype\"}}, found {}",
                        at, s.dump()));
      }
      const std::string file = s["file"].get<std::string>();
      if (!plain_file_name(file)) throw RuntimeError(fmt::format("{}: file '{}' is not a plain file name", at, file));
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
      const int64_t begin = json_int(s["slice"][0], at + ".slice");
      const int64_t end = json_int(s["slice"][1], at + ".slice");
      if (begin < 0 || end < begin || end > shape_numel(shape)) {
        throw RuntimeError(
            fmt::format("{}: slice [{}, {}) is outside the tensor's {} elements", at, begin, end, shape_numel(shape)));
      }
      tensor.slices.push_back(TensorSlice{dir + "/" + file, s["key"].get<std::string>(), begin, end});
    }
    std::sort(tensor.slices.begin(), tensor.slices.end(),
              [](const TensorSlice& a, const TensorSlice& b) { return a.begin < b.begin; });
    for (size_t k = 1; k < tensor.slices.size(); ++k) {
      if (tensor.slices[k].begin < tensor.slices[k - 1].end) {
        throw RuntimeError(fmt::format("{}: slices [{}, {}) and [{}, {}) overlap", where, tensor.slices[k - 1].begin,
                                       tensor.slices[k - 1].end, tensor.slices[k].begin, tensor.slices[k].end));
      }
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
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{}: not valid JSON ({})", index_path, e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw UsageError(fmt::format("{}: no \"weight_map\" object", index_path));
  }
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string() || !plain_file_name(file.get<std::string>())) {
      throw UsageError(fmt::format("{}: weight_map.{} is not a file name: {}", index_path, name, file.dump()));
    }
    const std::string path = dir + "/" + file.get<std::string>();
    const SafetensorsEntry* entry = catalog.file(path).find(name);
    if (entry == nullptr) {
      throw RuntimeError(fmt::format("{}: no tensor named '{}' ({} maps it there)", path, name, index_path));
    }
    catalog.add_whole_tensor(path, *entry);
  }
  return catalog;
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
  const int64_t numel = shape_numel(tensor->shape);
  PRIMUS_CHECK(begin >= 0 && begin <= end && end <= numel, "[checkpoint] elements [{}, {}) of '{}' ({} elements)",
               begin, end, name, numel);
  const std::vector<TensorSlice>& slices = tensor->slices;
  // The first slice that ends after `begin`; slices are ascending and disjoint.
  auto it = std::upper_bound(slices.begin(), slices.end(), begin,
                             [](int64_t at, const TensorSlice& s) { return at < s.end; });
  int64_t pos = begin;
  for (; pos < end && it != slices.end(); ++it) {
    if (it->begin > pos) break;  // a gap
    const SafetensorsFile& f = file(it->file);
    const SafetensorsEntry* entry = f.find(it->key);
    if (entry == nullptr) {
      throw RuntimeError(fmt::format("{}: no tensor named '{}' ({} lists it)", it->file, it->key, source_));
    }
    if (shape_numel(entry->shape) != it->end - it->begin) {
      throw RuntimeError(fmt::format("{}: tensor '{}' has {} elements but {} gives it slice [{}, {}) of '{}'", it->file,
                                     it->key, shape_numel(entry->shape), source_, it->begin, it->end, name));
    }
    const int64_t take = std::min(end, it->end) - pos;
    f.read_f32_into(it->key, pos - it->begin, take, dst + (pos - begin));
    pos += take;
  }
  if (pos < end) {
    throw RuntimeError(
        fmt::format("{}: element {} of tensor '{}' is in no slice (needed [{}, {}))", source_, pos, name, begin, end));
  }
}

void TensorCatalog::read_into(const std::string& name, int64_t begin, int64_t end, const Tensor& dst) const {
  PRIMUS_CHECK(dst.dtype() == DType::kF32 && dst.numel() == end - begin,
               "[checkpoint] reading {} elements of '{}' into {}", end - begin, name, dst.describe());
  if (dst.device().is_cpu()) {
    read_f32(name, begin, end, dst.f32());
    return;
  }
  const Tensor flat = dst.reshape({dst.numel()});
  Tensor staging;
  for (int64_t at = begin; at < end; at += kStagingElements) {
    const int64_t n = std::min(kStagingElements, end - at);
    if (!staging.defined() || staging.numel() != n) staging = Tensor::empty({n}, DType::kF32);
    read_f32(name, at, at + n, staging.f32());
    Tensor target = flat.slice_elements(at - begin, {n});
    ops::copy(target, staging);
  }
}

}  // namespace primus
