// Checkpoint directories: temporaries, manifest, trainer state, commit, and the single-file writer.
#include "checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "checkpoint/hf_config.h"
#include "checkpoint/tensor_catalog.h"
#include "core/error.h"
#include "core/file_io.h"

namespace primus {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string temporary_checkpoint_dir(const std::string& save_dir, int64_t iteration) {
  return save_dir + "/" + checkpoint_dir_name(iteration) + ".tmp";
}

std::vector<std::string> remove_stale_temporaries(const std::string& save_dir) {
  std::vector<std::string> removed;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(save_dir, error)) {
    const std::string name = entry.path().filename().string();
    const bool temporary =
        name.rfind("iter_", 0) == 0 && (name.ends_with(".tmp") || name.find(".tmp.") != std::string::npos);
    if (!temporary) continue;
    fs::remove_all(entry.path());
    removed.push_back(name);
  }
  if (error) throw RuntimeError(fmt::format("{}: cannot list the save directory: {}", save_dir, error.message()));
  std::sort(removed.begin(), removed.end());
  return removed;
}

void check_free_space(const std::string& dir, uint64_t bytes_needed) {
  std::error_code error;
  const fs::space_info space = fs::space(dir, error);
  if (error) throw RuntimeError(fmt::format("{}: cannot read the free space: {}", dir, error.message()));
  if (space.available < bytes_needed) {
    throw RuntimeError(fmt::format(
        "{}: {:.2f} GB free, the checkpoint needs about {:.2f} GB: not saving (the previous checkpoint stays the "
        "latest); free space, or keep fewer checkpoints (keep_latest_k)",
        dir, static_cast<double>(space.available) / 1e9, static_cast<double>(bytes_needed) / 1e9));
  }
}

uint64_t checkpoint_bytes_estimate(int64_t numel) { return 12 * static_cast<uint64_t>(numel) + (uint64_t{16} << 20); }

std::string prepare_temporary_dir(const std::string& save_dir, int64_t iteration, uint64_t bytes_needed) {
  fs::create_directories(save_dir);
  remove_stale_temporaries(save_dir);
  check_free_space(save_dir, bytes_needed);
  const std::string tmp_dir = temporary_checkpoint_dir(save_dir, iteration);
  fs::create_directories(tmp_dir);
  return tmp_dir;
}

void ManifestFiles::add(const std::string& name, uint64_t bytes, uint32_t crc32c) {
  files_[name] = {{"bytes", bytes}, {"crc32c", crc32c}};
}

void ManifestFiles::write_text(const std::string& dir, const std::string& name, const std::string& text) {
  write_file_atomic(dir + "/" + name, text);
  add(name, text.size(), crc32c(text));
}

void ManifestFiles::write_manifest(const std::string& dir, int64_t iteration, int format_version) const {
  const json manifest = {{"format_version", format_version}, {"iteration", iteration}, {"files", files_}};
  write_file_atomic(dir + "/" + kManifestFile, manifest.dump(2) + "\n");
  fsync_directory(dir);
}

std::string trainer_state_text(const TrainerState& state, int format_version) {
  json trainer = {{"format_version", format_version},
                  {"iteration", state.iteration},
                  {"consumed_train_samples", state.consumed_train_samples},
                  {"optimizer_steps", state.optimizer_steps},
                  {"seed", state.seed}};
  if (!state.fp8_scaling.empty()) trainer["fp8_scaling"] = json::parse(fp8_scaling_text(state.fp8_scaling));
  return trainer.dump(2) + "\n";
}

std::string fp8_scaling_text(const std::vector<Fp8ScalingRecord>& records) {
  json out = json::array();
  for (const Fp8ScalingRecord& r : records) {
    json history = json::array();
    for (const float v : r.amax_history) history.push_back(std::isnan(v) ? json(nullptr) : json(v));
    out.push_back({{"name", r.name}, {"amax_history", history}, {"scale", r.scale}});
  }
  return out.dump();
}

std::string hf_config_json_text(const ModelArgs& args) { return hf_config_from_model(args).dump(2) + "\n"; }

namespace {

// The iteration the tracker names, or -1 when there is no tracker (or it does not hold a plain number).
int64_t tracked_iteration(const std::string& save_dir) {
  const std::string tracker = save_dir + "/" + kTrackerFile;
  if (!fs::is_regular_file(tracker)) return -1;
  const std::string text = read_file(tracker, FileKinds::kRegularOnly);
  if (text.empty() || text.find_first_not_of("0123456789\n") != std::string::npos || text.size() > 20) return -1;
  return std::stoll(text);
}

}  // namespace

void commit_checkpoint_dir(const std::string& tmp_dir, const std::string& save_dir, int64_t iteration) {
  const std::string final_dir = save_dir + "/" + checkpoint_dir_name(iteration);
  if (tracked_iteration(save_dir) == iteration) {
    throw RuntimeError(fmt::format("{} is already the latest checkpoint: an iteration is saved once, so it is kept "
                                   "as it is",
                                   final_dir));
  }
  if (fs::exists(final_dir)) {
    // The tracker names another iteration, which stays whole whatever happens here; a crash between the renames
    // leaves `.tmp.replaced`, a temporary the next run removes.
    const std::string replaced = temporary_checkpoint_dir(save_dir, iteration) + ".replaced";
    fs::remove_all(replaced);
    fs::rename(final_dir, replaced);
    fs::rename(tmp_dir, final_dir);
    fs::remove_all(replaced);
  } else {
    fs::rename(tmp_dir, final_dir);
  }
  fsync_directory(save_dir);
  write_file_atomic(save_dir + "/" + kTrackerFile, std::to_string(iteration) + "\n");
}

void finish_checkpoint_dir(ManifestFiles& files, const std::string& tmp_dir, const std::string& save_dir,
                           const std::string& hf_config_json, const TrainerState& state,
                           const std::string& config_yaml, int format_version) {
  files.write_text(tmp_dir, "config.json", hf_config_json);
  files.write_text(tmp_dir, "trainer_state.json", trainer_state_text(state, format_version));
  files.write_text(tmp_dir, "config.yaml", config_yaml);
  files.write_manifest(tmp_dir, state.iteration, format_version);
  commit_checkpoint_dir(tmp_dir, save_dir, state.iteration);
}

int64_t write_single_file_checkpoint(const std::string& save_dir, const SafetensorsWriter& weights,
                                     const SafetensorsWriter& moments, const std::string& hf_config_json,
                                     const TrainerState& state, const std::string& config_yaml,
                                     const CheckpointProgressFn& progress) {
  const uint64_t data_bytes = weights.file_bytes() + moments.file_bytes();
  const std::string tmp_dir = prepare_temporary_dir(save_dir, state.iteration, data_bytes + (uint64_t{16} << 20));
  try {
    int64_t done = 0;
    const auto on_bytes = save_progress(progress, static_cast<int64_t>(data_bytes), done);
    ManifestFiles files;
    const SafetensorsWriter::Written model = weights.write(tmp_dir + "/model.safetensors", on_bytes);
    files.add("model.safetensors", model.bytes, model.crc32c);
    const SafetensorsWriter::Written optim = moments.write(tmp_dir + "/optimizer.safetensors", on_bytes);
    files.add("optimizer.safetensors", optim.bytes, optim.crc32c);
    finish_checkpoint_dir(files, tmp_dir, save_dir, hf_config_json, state, config_yaml, kFirstCheckpointFormatVersion);
    return done;
  } catch (...) {
    // A failed save (a full disk, say) must not leave gigabytes behind.
    std::error_code ignored;
    fs::remove_all(tmp_dir, ignored);
    throw;
  }
}

namespace {

// Views of [begin, end) in per-owned-range tensors of the optimizer (`of(i)` for owned range i).
std::vector<Tensor> owned_views(const AdamW& optimizer, const std::function<Tensor(size_t)>& of, int64_t begin,
                                int64_t end, const char* what) {
  // Owned ranges in flat order (the optimizer keeps them in its own order).
  const std::vector<FlatRange>& owned = optimizer.owned();
  std::vector<size_t> order(owned.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return owned[a].begin < owned[b].begin; });
  std::vector<Tensor> views;
  int64_t pos = begin;
  for (size_t i : order) {
    const FlatRange r = owned[i];
    if (r.end <= pos || pos >= end) continue;
    if (r.begin > pos) break;  // pos is not owned
    const int64_t stop = std::min(end, r.end);
    views.push_back(of(i).slice_elements(pos - r.begin, {stop - pos}));
    pos = stop;
  }
  if (pos < end) {
    throw RuntimeError(
        fmt::format("[checkpoint] the optimizer does not own flat element {} (saving [{}, {})): a "
                    "rank saves the {} of its own shards only",
                    pos, begin, end, what));
  }
  return views;
}

}  // namespace

std::vector<Tensor> moment_views(const AdamW& optimizer, bool second, int64_t begin, int64_t end) {
  return owned_views(
      optimizer, [&](size_t i) { return second ? optimizer.exp_avg_sq(i) : optimizer.exp_avg(i); }, begin, end,
      "moments");
}

std::vector<Tensor> weight_views(const ParamStore& params, const AdamW& optimizer, int64_t begin, int64_t end) {
  if (!optimizer.holds_weights()) return {params.flat_params().slice_elements(begin, {end - begin})};
  return owned_views(optimizer, [&](size_t i) { return optimizer.weights(i); }, begin, end, "weights");
}

namespace {

// The bytes of the concatenation of 1-D f32 views on any device.
SafetensorsWriter::Producer concatenation(std::vector<Tensor> views) {
  return [views = std::move(views)](uint64_t offset, uint64_t bytes, void* dst) {
    int64_t want_begin = static_cast<int64_t>(offset / 4);
    const int64_t want_end = static_cast<int64_t>((offset + bytes) / 4);
    float* out = static_cast<float*>(dst);
    int64_t view_begin = 0;
    for (const Tensor& view : views) {
      const int64_t view_end = view_begin + view.numel();
      const int64_t a = std::max(want_begin, view_begin);
      const int64_t b = std::min(want_end, view_end);
      if (a < b) {
        copy_to_host(view.slice_elements(a - view_begin, {b - a}), out);
        out += b - a;
        want_begin = b;
      }
      view_begin = view_end;
    }
  };
}

}  // namespace

void add_views(SafetensorsWriter& writer, const std::string& name, const Shape& shape, std::vector<Tensor> views) {
  if (views.size() == 1) {
    writer.add(name, views.front().reshape(shape));
  } else {
    writer.add(name, DType::kF32, shape, concatenation(std::move(views)));
  }
}

std::function<void(uint64_t)> save_progress(const CheckpointProgressFn& progress, int64_t total, int64_t& done) {
  if (progress) progress({"save", done, total});
  return [&progress, total, &done](uint64_t bytes) {
    done += static_cast<int64_t>(bytes);
    if (progress) progress({"save", done, total});
  };
}

}  // namespace primus
