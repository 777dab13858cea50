// Native checkpoint <-> Hugging Face folder, streamed through the tensor catalog.
#include "checkpoint/convert.h"

#include <cstring>
#include <filesystem>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_catalog.h"
#include "core/error.h"
#include "core/file_io.h"
#include "models/model.h"

namespace primus {

namespace fs = std::filesystem;

namespace {

bool is_moment(const std::string& name) { return name.rfind("exp_avg.", 0) == 0 || name.rfind("exp_avg_sq.", 0) == 0; }

// A tensor of the catalog as F32 bytes, read from its slices as the writer asks for them.
SafetensorsWriter::Producer from_catalog(const TensorCatalog& catalog, std::string name) {
  return [&catalog, name = std::move(name)](uint64_t offset, uint64_t bytes, void* dst) {
    catalog.read_f32(name, static_cast<int64_t>(offset / 4), static_cast<int64_t>((offset + bytes) / 4),
                     static_cast<float*>(dst));
  };
}

void zeros(uint64_t, uint64_t bytes, void* dst) { std::memset(dst, 0, bytes); }

}  // namespace

std::string resolve_checkpoint_dir(const std::string& path) {
  if (!fs::exists(path)) throw UsageError(fmt::format("{}: does not exist", path));
  if (!fs::is_directory(path)) throw UsageError(fmt::format("{}: not a directory", path));
  if (fs::exists(path + "/" + kManifestFile)) return path;
  if (std::optional<std::string> latest = find_latest_checkpoint(path)) return *latest;
  throw UsageError(fmt::format("{}: neither a checkpoint directory ({}) nor a save directory ({})", path, kManifestFile,
                               kTrackerFile));
}

ConversionSummary export_checkpoint_to_hf(const std::string& checkpoint_dir, const std::string& hf_dir,
                                          const CheckpointProgressFn& progress) {
  verify_checkpoint(checkpoint_dir, progress);
  const TensorCatalog catalog = TensorCatalog::open_checkpoint(checkpoint_dir);
  ConversionSummary summary;
  summary.sharded = catalog.sharded();
  summary.iteration = read_trainer_state(checkpoint_dir).iteration;
  SafetensorsWriter weights;
  for (const auto& [name, tensor] : catalog.tensors()) {
    if (is_moment(name)) continue;
    weights.add(name, DType::kF32, tensor.shape, from_catalog(catalog, name));
    ++summary.tensors;
    summary.parameters += shape_numel(tensor.shape);
  }
  if (summary.tensors == 0) throw RuntimeError(fmt::format("{}: holds no weights", catalog.source()));
  const std::string config = read_file(checkpoint_dir + "/config.json", FileKinds::kRegularOnly);

  std::error_code error;
  fs::create_directories(hf_dir, error);
  if (error) throw UsageError(fmt::format("{}: cannot create the output folder: {}", hf_dir, error.message()));
  summary.written = hf_dir + "/model.safetensors";
  int64_t done = 0;
  summary.bytes = static_cast<int64_t>(
      weights.write(summary.written, save_progress(progress, static_cast<int64_t>(weights.file_bytes()), done)).bytes);
  write_file_atomic(hf_dir + "/config.json", config);
  return summary;
}

ConversionSummary import_hf_to_checkpoint(const std::string& hf_dir, const std::string& save_dir, int64_t seed,
                                          const CheckpointProgressFn& progress) {
  if (!fs::is_directory(hf_dir)) throw UsageError(fmt::format("{}: not a directory", hf_dir));
  if (fs::exists(save_dir + "/" + kTrackerFile)) {
    throw UsageError(fmt::format("{}: already holds checkpoints ({}); import into a new or empty directory", save_dir,
                                 kTrackerFile));
  }
  const ModelArgs args = read_hf_config(hf_dir + "/config.json");
  const std::vector<ParamSpec> specs = model_family(args).param_specs(args);
  const TensorCatalog catalog = TensorCatalog::open_hf_folder(hf_dir);

  ConversionSummary summary;
  SafetensorsWriter weights;
  SafetensorsWriter moments;
  for (const ParamSpec& spec : specs) {
    const CatalogTensor* tensor = catalog.find(spec.name);
    if (tensor == nullptr) {
      throw UsageError(fmt::format("{}: no tensor '{}', which the model of {}/config.json has", catalog.source(),
                                   spec.name, hf_dir));
    }
    if (tensor->shape != spec.shape) {
      throw UsageError(fmt::format("{}: tensor '{}' has shape {} but {}/config.json describes {}", catalog.source(),
                                   spec.name, shape_str(tensor->shape), hf_dir, shape_str(spec.shape)));
    }
    weights.add(spec.name, DType::kF32, spec.shape, from_catalog(catalog, spec.name));
    moments.add("exp_avg." + spec.name, DType::kF32, spec.shape, zeros);
    moments.add("exp_avg_sq." + spec.name, DType::kF32, spec.shape, zeros);
    ++summary.tensors;
    summary.parameters += shape_numel(spec.shape);
  }
  for (const auto& [name, tensor] : catalog.tensors()) {
    bool known = false;
    for (const ParamSpec& spec : specs) known = known || spec.name == name;
    if (!known) summary.ignored.push_back(name);
  }
  TrainerState state;
  state.seed = seed;
  const std::string config_yaml = fmt::format(
      "# Imported from the Hugging Face folder {} by `primus-cli checkpoint convert --to native`:\n"
      "# iteration 0, fresh optimizer state, seed {}. No experiment config was involved.\n",
      fs::absolute(hf_dir).string(), seed);
  summary.bytes =
      write_single_file_checkpoint(save_dir, weights, moments, hf_config_json_text(args), state, config_yaml, progress);
  summary.written = save_dir + "/" + checkpoint_dir_name(0);
  return summary;
}

}  // namespace primus
