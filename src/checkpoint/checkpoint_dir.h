// What every checkpoint writer (single-file save, sharded save, Hugging Face import) and reader shares: the
// file names, the manifest, the trainer state file, the temporary directory and the commit that makes a
// directory the latest checkpoint. Internal to src/checkpoint.
//
// Commit protocol: a directory is built under `<save>/iter_N.tmp`, every file fsync'ed, the manifest last;
// then renamed to `<save>/iter_N`, the save directory fsync'ed, and the tracker replaced atomically. A crash
// before the rename leaves only the temporary, which the next save removes; a crash before the tracker
// leaves the previous iteration as the latest.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"

namespace primus {

inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kManifestFile = "manifest.json";
// format_version of manifest.json, trainer_state.json and index.json. 1: every slice of index.json is a flat range
// of its whole tensor. 2: slices may give a "box" of the tensor (tensor-parallel ranks' parts, tensor_box.h). A
// checkpoint without boxes is written as version 1, so that builds from before version 2 still read it; one with
// boxes as 2, which such builds refuse by its version instead of misreading its slices. This build reads both.
inline constexpr int kFirstCheckpointFormatVersion = 1;
inline constexpr int kCheckpointFormatVersion = 2;

// `<save>/iter_N.tmp`: one fixed name per iteration, so the ranks of a sharded save agree on it without a
// message, and a crashed attempt is found (and removed) by the next save.
std::string temporary_checkpoint_dir(const std::string& save_dir, int64_t iteration);
// Removes every `iter_*.tmp` and `iter_*.tmp.<suffix>` in save_dir: saves that crashed, checkpoints a crash left
// half replaced or half removed by retention. Only one job saves into a save directory at a time. Returns the
// names removed.
std::vector<std::string> remove_stale_temporaries(const std::string& save_dir);
// Throws RuntimeError naming `dir`, the bytes free there and the bytes needed when its filesystem has less room
// than `bytes_needed`: a save fails at once instead of after writing most of a checkpoint.
void check_free_space(const std::string& dir, uint64_t bytes_needed);
// A checkpoint's data files take about 12 bytes per parameter (fp32 weights and two moments); the headers and
// small files are well inside the margin added here.
uint64_t checkpoint_bytes_estimate(int64_t numel);
// What a save does before writing data: creates save_dir, removes stale temporaries, checks the free space for
// `bytes_needed` and creates the iteration's temporary directory, which it returns.
std::string prepare_temporary_dir(const std::string& save_dir, int64_t iteration, uint64_t bytes_needed);

// The manifest's file table, filled as files are written.
class ManifestFiles {
 public:
  void add(const std::string& name, uint64_t bytes, uint32_t crc32c);
  // Writes `text` as `dir/name` atomically and records it.
  void write_text(const std::string& dir, const std::string& name, const std::string& text);
  // Writes dir/manifest.json (last: its presence marks the directory complete) and fsyncs the directory.
  void write_manifest(const std::string& dir, int64_t iteration, int format_version) const;

 private:
  nlohmann::json files_ = nlohmann::json::object();
};

std::string trainer_state_text(const TrainerState& state, int format_version);
// trainer_state.json's fp8_scaling, a JSON array of {name, amax_history: [amax or null for NaN, ...], scale}, and
// back: every field checked (RuntimeError naming `where` and the entry). Pipeline stages exchange theirs so too.
std::string fp8_scaling_text(const std::vector<Fp8ScalingRecord>& records);
std::vector<Fp8ScalingRecord> parse_fp8_scaling(const std::string& text, const std::string& where);
// config.json beside fp32 weights: the Hugging Face config of `args`, pretty-printed.
std::string hf_config_json_text(const ModelArgs& args);
// Every field range-checked (checkpoint_verify.cpp): RuntimeError naming the file and the key.
TrainerState read_trainer_state(const std::string& checkpoint_dir);

// Renames tmp_dir to `<save>/iter_N`, fsyncs the save directory and points the tracker at N. An iteration is
// saved once: when the tracker already names N, nothing is replaced and RuntimeError says so. An `iter_N` that is
// not the latest (left by a run that went further before this one resumed from an earlier checkpoint) is
// replaced; a crash while it is swapped leaves the tracker naming the previous iteration, which stays complete.
void commit_checkpoint_dir(const std::string& tmp_dir, const std::string& save_dir, int64_t iteration);
// The last step of every save: config.json, trainer_state.json, config.yaml and the manifest written into tmp_dir
// beside the data files already in `files` (both JSON files of `format_version`), then committed.
void finish_checkpoint_dir(ManifestFiles& files, const std::string& tmp_dir, const std::string& save_dir,
                           const std::string& hf_config_json, const TrainerState& state,
                           const std::string& config_yaml, int format_version);

// The single-file format from its two safetensors files' contents: model.safetensors, config.json,
// optimizer.safetensors, trainer_state.json, config.yaml and the manifest, committed. Progress: "save" over the
// two safetensors files. Returns their bytes.
int64_t write_single_file_checkpoint(const std::string& save_dir, const SafetensorsWriter& weights,
                                     const SafetensorsWriter& moments, const std::string& hf_config_json,
                                     const TrainerState& state, const std::string& config_yaml,
                                     const CheckpointProgressFn& progress);

// The optimizer's moment views (exp_avg, or exp_avg_sq when `second`) of flat elements [begin, end), in order,
// one per owned range they cross. RuntimeError when the optimizer does not own all of them.
std::vector<Tensor> moment_views(const AdamW& optimizer, bool second, int64_t begin, int64_t end);
// The fp32 weights of flat elements [begin, end): from the ParamStore, or from the optimizer when it holds them
// (FSDP's packed shards, which must own the range).
std::vector<Tensor> weight_views(const ParamStore& params, const AdamW& optimizer, int64_t begin, int64_t end);
// Adds `name` (f32, `shape`) from 1-D f32 views on any device that together hold its elements in order: the
// view itself when there is one, else their concatenation, assembled piece by piece as the file is written.
void add_views(SafetensorsWriter& writer, const std::string& name, const Shape& shape, std::vector<Tensor> views);

// The on_bytes callback of SafetensorsWriter::write reporting "save" progress over `total` bytes, `done` of
// them already written (it reports that first, at once).
std::function<void(uint64_t)> save_progress(const CheckpointProgressFn& progress, int64_t total, int64_t& done);

}  // namespace primus
