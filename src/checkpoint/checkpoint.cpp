#include "checkpoint/checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "core/file_io.h"
#include "ops/ops.h"

namespace primus {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kTracker = "latest_checkpointed_iteration.txt";
constexpr const char* kManifest = "manifest.json";
constexpr int kFormatVersion = 1;

// The tensor itself when it lives on the host, else a host copy (one transfer for a whole flat buffer).
Tensor on_host(const Tensor& t) { return t.device().is_cpu() ? t : ops::to_device(t, kCpuDevice); }

// The weights as a safetensors writer over one host copy of the flat buffer (kept alive by the writer).
SafetensorsWriter model_writer(const LlamaModel& model) {
  SafetensorsWriter writer;
  const ParamStore& params = model.params();
  const Tensor flat = on_host(params.flat_params());
  for (size_t i = 0; i < params.specs().size(); ++i) {
    writer.add(params.specs()[i].name, flat.slice_elements(params.offset(i), params.specs()[i].shape));
  }
  return writer;
}

std::string hf_config_text(const LlamaModel& model) { return hf_config_from_model(model.args()).dump(2) + "\n"; }

// Size and CRC32C of a file read in pieces (a checkpoint file can be larger than the host memory);
// `on_bytes` hears of each piece.
SafetensorsWriter::Written checksum_file(const std::string& path, const std::function<void(uint64_t)>& on_bytes) {
  constexpr size_t kPieceBytes = size_t{16} << 20;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RuntimeError(fmt::format("{}: cannot open for reading", path));
  std::vector<char> piece(kPieceBytes);
  SafetensorsWriter::Written sum;
  while (in) {
    in.read(piece.data(), static_cast<std::streamsize>(piece.size()));
    const auto got = static_cast<uint64_t>(in.gcount());
    if (got == 0) break;
    sum.crc32c = crc32c(piece.data(), got, sum.crc32c);
    sum.bytes += got;
    if (on_bytes) on_bytes(got);
  }
  if (in.bad()) throw RuntimeError(fmt::format("{}: read error after {} bytes", path, sum.bytes));
  return sum;
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

int64_t save_checkpoint(const std::string& save_dir, const LlamaModel& model, const AdamW& optimizer,
                        const TrainerState& state, const std::string& config_yaml,
                        const CheckpointProgressFn& progress) {
  fs::create_directories(save_dir);
  const std::string final_dir = save_dir + "/" + checkpoint_dir_name(state.iteration);
  const std::string tmp_dir = fmt::format("{}.tmp.{}", final_dir, getpid());
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  // A device model is copied to the host first, one flat buffer at a time (weights, two moments).
  const ParamStore& params = model.params();
  const bool on_device = !params.flat_params().device().is_cpu();
  const int64_t copy_total = on_device ? 3 * 4 * params.numel() : 0;
  auto copied = [&](int64_t buffers) {
    if (progress && on_device) progress({"copy", buffers * copy_total / 3, copy_total});
  };
  copied(0);
  const SafetensorsWriter weights = model_writer(model);
  copied(1);
  SafetensorsWriter moments;
  const Tensor exp_avg = on_host(optimizer.exp_avg());
  copied(2);
  const Tensor exp_avg_sq = on_host(optimizer.exp_avg_sq());
  copied(3);
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    moments.add("exp_avg." + spec.name, exp_avg.slice_elements(params.offset(i), spec.shape));
    moments.add("exp_avg_sq." + spec.name, exp_avg_sq.slice_elements(params.offset(i), spec.shape));
  }
  const int64_t total = static_cast<int64_t>(weights.file_bytes() + moments.file_bytes());
  int64_t done = 0;
  auto on_bytes = [&](uint64_t bytes) {
    done += static_cast<int64_t>(bytes);
    if (progress) progress({"save", done, total});
  };
  if (progress) progress({"save", 0, total});

  json files = json::object();
  auto record = [&](const char* name, SafetensorsWriter::Written written) {
    files[name] = {{"bytes", written.bytes}, {"crc32c", written.crc32c}};
  };
  auto write_text = [&](const char* name, const std::string& text) {
    write_file_atomic(tmp_dir + "/" + name, text);
    record(name, {text.size(), crc32c(text)});
  };
  record("model.safetensors", weights.write(tmp_dir + "/model.safetensors", on_bytes));
  write_text("config.json", hf_config_text(model));
  record("optimizer.safetensors", moments.write(tmp_dir + "/optimizer.safetensors", on_bytes));
  json trainer = {{"format_version", kFormatVersion},
                  {"iteration", state.iteration},
                  {"consumed_train_samples", state.consumed_train_samples},
                  {"optimizer_steps", state.optimizer_steps},
                  {"seed", state.seed}};
  write_text("trainer_state.json", trainer.dump(2) + "\n");
  write_text("config.yaml", config_yaml);

  json manifest = {{"format_version", kFormatVersion}, {"iteration", state.iteration}, {"files", files}};
  write_file_atomic(tmp_dir + "/" + kManifest, manifest.dump(2) + "\n");
  fsync_directory(tmp_dir);

  // Replace an older directory of the same iteration (a re-run) only once the new one is complete.
  if (fs::exists(final_dir)) {
    const std::string old_dir = final_dir + ".old";
    fs::remove_all(old_dir);
    fs::rename(final_dir, old_dir);
    fs::rename(tmp_dir, final_dir);
    fs::remove_all(old_dir);
  } else {
    fs::rename(tmp_dir, final_dir);
  }
  fsync_directory(save_dir);
  write_file_atomic(save_dir + "/" + kTracker, std::to_string(state.iteration) + "\n");
  return done;
}

std::optional<std::string> find_latest_checkpoint(const std::string& dir) {
  const std::string tracker = dir + "/" + kTracker;
  if (!fs::exists(tracker)) return std::nullopt;
  const std::string text = read_file(tracker);
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

void verify_checkpoint(const std::string& checkpoint_dir, const CheckpointProgressFn& progress) {
  const std::string manifest_path = checkpoint_dir + "/" + kManifest;
  if (!fs::exists(manifest_path)) {
    throw RuntimeError(fmt::format("{}: no {} — the checkpoint is incomplete and will not be loaded", checkpoint_dir, kManifest));
  }
  json manifest;
  try {
    manifest = json::parse(read_file(manifest_path));
  } catch (const json::exception& e) {
    throw RuntimeError(fmt::format("{}: unreadable manifest ({})", manifest_path, e.what()));
  }
  if (!manifest.contains("files") || !manifest["files"].is_object() || manifest["files"].empty()) {
    throw RuntimeError(fmt::format("{}: manifest lists no files", manifest_path));
  }
  // Presence and sizes first (cheap), then the CRCs, which read every byte.
  int64_t total = 0;
  for (const auto& [name, entry] : manifest["files"].items()) {
    const std::string path = checkpoint_dir + "/" + name;
    if (!fs::exists(path)) throw RuntimeError(fmt::format("{}: missing (listed in the manifest)", path));
    const uint64_t size = fs::file_size(path);
    const uint64_t want_bytes = entry.value("bytes", uint64_t{0});
    if (size != want_bytes) {
      throw RuntimeError(fmt::format("{}: {} bytes, the manifest says {} — truncated or modified; not loading", path,
                                     size, want_bytes));
    }
    total += static_cast<int64_t>(size);
  }
  int64_t done = 0;
  if (progress) progress({"verify", 0, total});
  for (const auto& [name, entry] : manifest["files"].items()) {
    const std::string path = checkpoint_dir + "/" + name;
    const uint32_t crc = checksum_file(path, [&](uint64_t bytes) {
                           done += static_cast<int64_t>(bytes);
                           if (progress) progress({"verify", done, total});
                         }).crc32c;
    const uint32_t want_crc = entry.value("crc32c", uint32_t{0});
    if (crc != want_crc) {
      throw RuntimeError(
          fmt::format("{}: CRC32C {:#010x}, the manifest says {:#010x} — corrupt; not loading", path, crc, want_crc));
    }
  }
}

TrainerState load_checkpoint(const std::string& checkpoint_dir, LlamaModel& model, AdamW& optimizer,
                             const CheckpointProgressFn& progress) {
  verify_checkpoint(checkpoint_dir, progress);
  const std::string model_file = checkpoint_dir + "/model.safetensors";
  const std::string optim_file = checkpoint_dir + "/optimizer.safetensors";
  SafetensorsFile weights = SafetensorsFile::open(model_file);
  SafetensorsFile moments = SafetensorsFile::open(optim_file);
  ParamStore& params = model.params();
  // Weights and both moments, 4 bytes an element each.
  const int64_t total = 3 * 4 * params.numel();
  int64_t done = 0;
  if (progress) progress({"load", 0, total});
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    copy_into(weights.read_f32(spec.name), params.param(i), spec.name, model_file);
    copy_into(moments.read_f32("exp_avg." + spec.name), optimizer.exp_avg().slice_elements(params.offset(i), spec.shape),
              "exp_avg." + spec.name, optim_file);
    copy_into(moments.read_f32("exp_avg_sq." + spec.name),
              optimizer.exp_avg_sq().slice_elements(params.offset(i), spec.shape), "exp_avg_sq." + spec.name, optim_file);
    done += 3 * 4 * shape_numel(spec.shape);
    if (progress) progress({"load", done, total});
  }
  const std::string state_file = checkpoint_dir + "/trainer_state.json";
  TrainerState state;
  try {
    json j = json::parse(read_file(state_file));
    state.iteration = j.at("iteration").get<int64_t>();
    state.consumed_train_samples = j.at("consumed_train_samples").get<int64_t>();
    state.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    state.seed = j.at("seed").get<int64_t>();
  } catch (const json::exception& e) {
    throw RuntimeError(fmt::format("{}: {}", state_file, e.what()));
  }
  optimizer.set_steps_taken(state.optimizer_steps);
  return state;
}

void export_hf_model(const std::string& dir, const LlamaModel& model) {
  fs::create_directories(dir);
  model_writer(model).write(dir + "/model.safetensors");
  write_file_atomic(dir + "/config.json", hf_config_text(model));
}

void load_hf_weights(const std::string& dir, LlamaModel& model) {
  const std::string config_path = dir + "/config.json";
  if (!fs::exists(config_path)) throw UsageError(fmt::format("pretrained_checkpoint: {} does not exist", config_path));
  json config;
  try {
    config = json::parse(read_file(config_path));
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
    json index = json::parse(read_file(index_path));
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
