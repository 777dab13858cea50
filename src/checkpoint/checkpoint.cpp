#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <filesystem>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/parallel_io.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint/tensor_catalog.h"
#include "core/file_io.h"

namespace primus {

namespace fs = std::filesystem;

namespace {

std::string hf_config_text(const Model& model) { return hf_config_json_text(model.args()); }

// The weights under their Hugging Face names, whole; a device model's are streamed to the file piece by piece.
SafetensorsWriter model_writer(const Model& model) {
  SafetensorsWriter writer;
  const ParamStore& params = model.params();
  for (size_t i = 0; i < params.specs().size(); ++i) {
    // A tensor-parallel rank's slice under the whole tensor's name would be a wrong Hugging Face file.
    PRIMUS_CHECK(!params.specs()[i].slice.sliced(),
                 "[checkpoint] export of '{}', a tensor-parallel slice: save a checkpoint and convert it instead",
                 params.specs()[i].name);
    writer.add(params.specs()[i].name, params.param(i));
  }
  return writer;
}

}  // namespace

std::string checkpoint_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

int64_t checkpoint_dir_iteration(const std::string& name) {
  if (name.rfind("iter_", 0) != 0 || name.size() > 24) return -1;
  int64_t n = -1;
  const auto [end, status] = std::from_chars(name.data() + 5, name.data() + name.size(), n);
  return status == std::errc() && end == name.data() + name.size() && checkpoint_dir_name(n) == name ? n : -1;
}

int64_t save_checkpoint(const std::string& save_dir, const Model& model, const AdamW& optimizer,
                        const TrainerState& state, const std::string& config_yaml,
                        const CheckpointProgressFn& progress, const CheckpointIo& io) {
  CheckpointSave save(save_dir, model, {{0, model.params().numel()}}, nullptr, state, config_yaml);
  save.write(live_state(model.params(), optimizer), progress, io);
  return save.finish();
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
        if (entry.is_directory() && checkpoint_dir_iteration(name) >= 0) {
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
        tracker, checkpoint_dir_iteration(stranded.back())));
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
                             const CheckpointProgressFn& progress, const CheckpointIo& io) {
  verify_checkpoint(checkpoint_dir, progress, io);
  // Before any tensor: a model of other shapes fails here naming the key, and one of the same shapes but another
  // rope_theta, norm epsilon or tying would otherwise load silently.
  const std::string config_path = checkpoint_dir + "/config.json";
  require_same_model(read_hf_config(config_path), model.args(), config_path);
  const TensorCatalog catalog = TensorCatalog::open_checkpoint(checkpoint_dir);
  ParamStore& params = model.params();
  const std::vector<ParamSpec>& specs = params.specs();
  // Where every destination element is stored, planned here; the bytes are then read on io.threads threads.
  std::vector<TensorRead> reads;
  auto plan = [&](const std::string& name, const TensorBox& box, int64_t begin, int64_t end, const Tensor& dst) {
    for (const TensorCatalog::StoredRun& run : catalog.locate(name, box, begin, end)) {
      reads.push_back(TensorRead{run.file, run.offset, run.count, dst.slice_elements(run.at, {run.count})});
    }
  };
  // Each tensor's part of this rank (the whole tensor, or its tensor-parallel box) from whichever pieces hold it.
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t n = shape_numel(specs[i].shape);
    catalog.require(specs[i].name, specs[i].whole_shape());
    plan(specs[i].name, param_box(specs[i]), 0, n, params.param(i).reshape({n}));
  }
  // Each owned range crosses some tensors; the part of each, a range of the tensor's box, comes the same way.
  for (size_t r = 0; r < optimizer.owned().size(); ++r) {
    const FlatRange range = optimizer.owned()[r];
    for (size_t i = 0; i < specs.size(); ++i) {
      const int64_t offset = params.offset(i);
      const int64_t lo = std::max(range.begin, offset);
      const int64_t hi = std::min(range.end, offset + shape_numel(specs[i].shape));
      if (lo >= hi) continue;
      for (const bool second : {false, true}) {
        const std::string name = (second ? "exp_avg_sq." : "exp_avg.") + specs[i].name;
        catalog.require(name, specs[i].whole_shape());
        const Tensor moments = second ? optimizer.exp_avg_sq(r) : optimizer.exp_avg(r);
        plan(name, param_box(specs[i]), lo - offset, hi - offset,
             moments.slice_elements(lo - range.begin, {hi - lo}));
      }
    }
  }
  // Every weight, and the moments of the owned ranges only; 4 bytes an element.
  int64_t total = 0;
  for (const TensorRead& read : reads) total += 4 * read.count;
  int64_t done = 0;
  if (progress) progress({"load", 0, total});
  read_tensors(reads, io.threads, [&](uint64_t bytes) {
    done += static_cast<int64_t>(bytes);
    if (progress) progress({"load", done, total});
  });
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
  const ModelArgs theirs = read_hf_config(config_path);
  require_same_model(theirs, model.args(), config_path);
  // Positions beyond the ones the weights were trained for would be used without a word.
  if (theirs.max_position_embeddings < model.max_seq_length()) {
    throw UsageError(fmt::format("{}: max_position_embeddings is {} but the run's sequences are {} tokens (seq_length): "
                                 "lower seq_length, or raise max_position_embeddings there to extend the context "
                                 "deliberately",
                                 config_path, theirs.max_position_embeddings, model.max_seq_length()));
  }
  const TensorCatalog catalog = TensorCatalog::open_hf_folder(dir);
  ParamStore& params = model.params();
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    const CatalogTensor* tensor = catalog.find(spec.name);
    if (tensor == nullptr) throw UsageError(fmt::format("{}: no tensor '{}'", catalog.source(), spec.name));
    if (tensor->shape != spec.whole_shape()) {
      throw UsageError(fmt::format("{}: tensor '{}' has shape {} but the model needs {}", catalog.source(), spec.name,
                                   shape_str(tensor->shape), shape_str(spec.whole_shape())));
    }
    const int64_t n = shape_numel(spec.shape);  // this rank's part (its tensor-parallel slice)
    catalog.read_into(spec.name, param_box(spec), 0, n, params.param(i).reshape({n}));
  }
  model.weights_changed();
}

}  // namespace primus
