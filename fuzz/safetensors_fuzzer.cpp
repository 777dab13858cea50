// The safetensors header reader and the two indexes over safetensors files: SafetensorsFile::open (header
// length, UTF-8, JSON, dtypes, shapes, offsets) and reading every tensor it accepts; TensorCatalog over a
// Hugging Face folder (model.safetensors.index.json's weight_map) and over a native sharded checkpoint
// (index.json's slices), reading every element the catalog accepts.
//
// Input: a mode byte, then
//   mode 0: a safetensors file
//   mode 1: model.safetensors.index.json \n@@\n a.safetensors \n@@\n b.safetensors
//   mode 2: index.json \n@@\n shard_0_of_2.safetensors \n@@\n shard_1_of_2.safetensors (the only data files an index
//           may name: the shards of its world size)
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_catalog.h"
#include "fuzz_input.h"

namespace {

// A catalog tensor is read only up to this many elements: its shape comes from the index, not from the bytes
// present, and reading a huge one would test the harness's memory, not the reader.
constexpr int64_t kMaxReadElements = int64_t{1} << 16;

void read_all(const primus::SafetensorsFile& file) {
  for (const primus::SafetensorsEntry& entry : file.entries()) {
    primus::fuzz::expect_clean_errors([&] { (void)file.read(entry.name); });
    primus::fuzz::expect_clean_errors([&] { (void)file.read_f32(entry.name); });
  }
}

void read_all(const primus::TensorCatalog& catalog) {
  std::vector<float> buffer;
  for (const auto& [name, tensor] : catalog.tensors()) {
    const int64_t numel = primus::shape_numel(tensor.shape);
    if (numel > kMaxReadElements) continue;
    buffer.assign(static_cast<size_t>(numel), 0.0f);
    primus::fuzz::expect_clean_errors([&, &name = name] { catalog.read_f32(name, 0, numel, buffer.data()); });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode == 0) {
    const std::string path = primus::fuzz::write_scratch("model.safetensors", input);
    primus::fuzz::expect_clean_errors([&] { read_all(primus::SafetensorsFile::open(path)); });
    return 0;
  }
  const std::string dir = primus::fuzz::fresh_scratch_dir("folder");
  std::vector<std::string_view> parts = primus::fuzz::split_parts(input, 3);
  primus::fuzz::write_scratch(mode == 1 ? "folder/model.safetensors.index.json" : "folder/index.json", parts[0]);
  const bool hf = mode == 1;
  if (parts.size() > 1) {
    primus::fuzz::write_scratch(hf ? "folder/a.safetensors" : "folder/shard_0_of_2.safetensors", parts[1]);
  }
  if (parts.size() > 2) {
    primus::fuzz::write_scratch(hf ? "folder/b.safetensors" : "folder/shard_1_of_2.safetensors", parts[2]);
  }
  primus::fuzz::expect_clean_errors(
      [&] { read_all(hf ? primus::TensorCatalog::open_hf_folder(dir) : primus::TensorCatalog::open_checkpoint(dir)); });
  return 0;
}
