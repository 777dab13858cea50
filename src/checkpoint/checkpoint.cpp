#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_catalog.h"
#include "core/file_io.h"
#include "ops/ops.h"

namespace primus {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string hf_config_text(const Model& model) { return hf_config_json_text(model.args()); }

// The weights under their Hugging Face names, whole; a device model's are streamed to the file piece by piece.
SafetensorsWriter model_writer(const Model& model) {
  SafetensorsWriter writer;
  const ParamStore& params = model.params();
  for (size_t i = 0; i < params.specs().size(); ++i) writer.add(params.specs()[i].name, params.param(i));
  return writer;
}

// The same, with the weights from wherever the optimizer's step keeps them (FSDP's shards hold them).
SafetensorsWriter trained_weights_writer(const Model& model, const AdamW& optimizer) {
  if (!optimizer.holds_weights()) return model_writer(model);
  SafetensorsWriter writer;
  const ParamStore& params = model.params();
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const int64_t begin = params.offset(i);
    const Shape& shape = params.specs()[i].shape;
    add_views(writer, params.specs()[i].name, shape, weight_views(params, optimizer, begin, begin + shape_numel(shape)));
  }
  return writer;
}

void copy_into(const Tensor& source, Tensor target, const std::string& name, const std::string& file) {
  if (source.shape() != target.shape()) {
    throw RuntimeError(fmt::format("{}: tensor '{}' has shape {} but the model needs {}", file, name,
                                   shape_str(source.shape()), shape_str(target.shape())));
  }
  ops::copy(target, source);
}

}  // namespace

std::string checkpoint_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

int64_t save_checkpoint(const std::string& save_dir, const Model& model, const AdamW& optimizer,
                        const TrainerState& state, const std::string& config_yaml,
                        const CheckpointProgressFn& progress) {
  const ParamStore& params = model.params();
  const SafetensorsWriter weights = trained_weights_writer(model, optimizer);
  SafetensorsWriter moments;
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    const int64_t begin = params.offset(i);
    const int64_t end = begin + shape_numel(spec.shape);
    // One view when one owned range holds the tensor, else several (an optimizer that owns several ranges,
    // e.g. the shards of every bucket of a world of one).
    add_views(moments, "exp_avg." + spec.name, spec.shape, moment_views(optimizer, false, begin, end));
    add_views(moments, "exp_avg_sq." + spec.name, spec.shape, moment_views(optimizer, true, begin, end));
  }
  return write_single_file_checkpoint(save_dir, weights, moments, hf_config_text(model), state, config_yaml, progress);
}

std::optional<std::string> find_latest_checkpoint(const std::string& dir) {
  const std::string tracker = dir + "/" + kTrackerFile;
  if (!fs::exists(tracker)) {
    // Complete checkpoints without the tracker (deleted by hand, say): starting from scratch would overwrite them.
    std::vector<std::string> stranded;
    std::error_code ignored;
    if (fs::is_directory(dir, ignored)) {
      for (const auto& entry : fs::directory_iterator(dir, ignored)) {
        const std::string name = entry.path().filename().string();
        if (entry.is_directory() && name.size() == 12 && name.rfind("iter_", 0) == 0 &&
            name.find_first_not_of("0123456789", 5) == std::string::npos) {
          stranded.push_back(name);
        }
      }
    }
    if (stranded.empty()) return std::nullopt;
    std::sort(stranded.begin(), stranded.end());
    throw UsageError(fmt::format(
        "{}: holds checkpoints ({}{}) but no {}: a run would start from scratch and overwrite them. Write the "
        "iteration to resume from into {} (e.g. {}), or move the checkpoints away",
        dir, stranded.front(), stranded.size() > 1 ? fmt::format(" ... {}", stranded.back()) : "", kTrackerFile,
        tracker, std::stoll(stranded.back().substr(5))));
  }
  const std::string text = read_file(tracker, FileKinds::kRegularOnly);
  int64_t iteration = -1;
  try {
    size_t used = 0;
    iteration = std::stoll(text, &used);
    if (text.find_first_not_of(" \n", used) != std::string::npos) iteration = -1;
  } catch (const std::exception&) {
    iteration = -1;
  }
  if (iteration < 0) throw RuntimeError(fmt::format("{}: expected an iteration number, found '{}'", tracker, text));
  const std::string checkpoint = dir + "/" + checkpoint_dir_name(iteration);
  if (!fs::is_directory(checkpoint)) {
    throw RuntimeError(fmt::format("{} names iteration {} but {} does not exist", tracker, iteration, checkpoint));
  }
  return checkpoint;
}

TrainerState load_checkpoint(const std::string& checkpoint_dir, Model& model, AdamW& optimizer,
                             const CheckpointProgressFn& progress) {
  verify_checkpoint(checkpoint_dir, progress);
  const TensorCatalog catalog = TensorCatalog::open_checkpoint(checkpoint_dir);
  ParamStore& params = model.params();
  const std::vector<ParamSpec>& specs = params.specs();
  // Every weight, and the moments of the owned ranges only; 4 bytes an element.
  int64_t owned = 0;
  for (const FlatRange& r : optimizer.owned()) owned += r.size();
  const int64_t total = 4 * (params.numel() + 2 * owned);
  int64_t done = 0;
  if (progress) progress({"load", 0, total});
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t n = shape_numel(specs[i].shape);
    catalog.require(specs[i].name, specs[i].shape);
    catalog.read_into(specs[i].name, 0, n, params.param(i).reshape({n}));
    done += 4 * n;
    if (progress) progress({"load", done, total});
  }
  // Each owned range crosses some tensors; the part of each comes from whichever slices of the checkpoint hold it.
  for (size_t r = 0; r < optimizer.owned().size(); ++r) {
    const FlatRange range = optimizer.owned()[r];
    for (size_t i = 0; i < specs.size(); ++i) {
      const int64_t offset = params.offset(i);
      const int64_t lo = std::max(range.begin, offset);
      const int64_t hi = std::min(range.end, offset + shape_numel(specs[i].shape));
      if (lo >= hi) continue;
      for (const bool second : {false, true}) {
        const std::string name = (second ? "exp_avg_sq." : "exp_avg.") + specs[i].name;
        catalog.require(name, specs[i].shape);
        const Tensor moments = second ? optimizer.exp_avg_sq(r) : optimizer.exp_avg(r);
        catalog.read_into(name, lo - offset, hi - offset, moments.slice_elements(lo - range.begin, {hi - lo}));
      }
      done += 2 * 4 * (hi - lo);
      if (progress) progress({"load", done, total});
    }
  }
  const TrainerState state = read_trainer_state(checkpoint_dir);
  optimizer.set_steps_taken(state.optimizer_steps);
  model.weights_changed();
  return state;
}

void export_hf_model(const std::string& dir, const Model& model) {
  fs::create_directories(dir);
  model_writer(model).write(dir + "/model.safetensors");
  write_file_atomic(dir + "/config.json", hf_config_text(model));
}

void load_hf_weights(const std::string& dir, Model& model) {
  const std::string config_path = dir + "/config.json";
  if (!fs::exists(config_path)) throw UsageError(fmt::format("pretrained_checkpoint: {} does not exist", config_path));
  json config;
  try {
    config = json::parse(read_file(config_path, FileKinds::kRegularOnly));
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{}: not valid JSON ({})", config_path, e.what()));
  }
  const ModelArgs theirs = model_args_from_hf_config(config, config_path);
  const ModelArgs& ours = model.args();
  auto same = [&](const char* key, int64_t a, int64_t b) {
    if (a != b) throw UsageError(fmt::format("{}: {} is {} but the configured model has {}", config_path, key, a, b));
  };
  same("num_hidden_layers", theirs.num_layers, ours.num_layers);
  same("hidden_size", theirs.hidden_size, ours.hidden_size);
  same("intermediate_size", theirs.ffn_hidden_size, ours.ffn_hidden_size);
  same("num_attention_heads", theirs.num_attention_heads, ours.num_attention_heads);
  same("num_key_value_heads", theirs.num_query_groups, ours.num_query_groups);
  same("head_dim", theirs.kv_channels, ours.kv_channels);
  same("vocab_size", theirs.vocab_size, ours.vocab_size);

  // One file, or shards listed by model.safetensors.index.json's weight_map.
  std::map<std::string, std::string> file_of;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(dir + "/model.safetensors")) {
    for (const ParamSpec& spec : model.params().specs()) file_of[spec.name] = dir + "/model.safetensors";
  } else if (fs::exists(index_path)) {
    json index = json::parse(read_file(index_path, FileKinds::kRegularOnly));
    for (const auto& [name, file] : index.at("weight_map").items()) file_of[name] = dir + "/" + file.get<std::string>();
  } else {
    throw UsageError(fmt::format("pretrained_checkpoint: {} has neither model.safetensors nor an index", dir));
  }
  std::map<std::string, SafetensorsFile> open_files;
  ParamStore& params = model.params();
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const std::string& name = params.specs()[i].name;
    auto it = file_of.find(name);
    if (it == file_of.end()) throw UsageError(fmt::format("{}: no tensor '{}' in the weight map", index_path, name));
    auto file_it = open_files.find(it->second);
    if (file_it == open_files.end()) file_it = open_files.emplace(it->second, SafetensorsFile::open(it->second)).first;
    copy_into(file_it->second.read_f32(name), params.param(i), name, it->second);
  }
}

}  // namespace primus
