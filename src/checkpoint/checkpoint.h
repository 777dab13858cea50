// Training checkpoints: one directory per saved iteration, written atomically, verified before loading.
//
//   <save>/iter_0000100/model.safetensors      fp32 weights, Hugging Face names (loadable by transformers
//                       config.json            together with this HF config)
//                       optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name>
//                       trainer_state.json     iteration, consumed samples, optimizer steps, seeds
//                       config.yaml            the effective experiment config
//                       manifest.json          size and CRC32C of every file above (written last)
//   <save>/latest_checkpointed_iteration.txt   Megatron's tracker file, replaced atomically after the directory
//
// A directory is built under a temporary name, every file fsync'ed, then renamed into place; the tracker
// is updated last, so a crash at any point leaves the previous checkpoint as the latest complete one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "models/llama.h"
#include "optim/adamw.h"

namespace primus {

struct TrainerState {
  int64_t iteration = 0;               // completed training iterations
  int64_t consumed_train_samples = 0;  // data position: samples drawn from the training source
  int64_t optimizer_steps = 0;         // AdamW bias-correction step count
  int64_t seed = 0;                    // the run's seed (initialisation, data order and mock data derive from it)
};

std::string checkpoint_dir_name(int64_t iteration);  // "iter_0000100"

// Writes a complete checkpoint for `state.iteration` under `save_dir` and points the tracker at it.
void save_checkpoint(const std::string& save_dir, const LlamaModel& model, const AdamW& optimizer,
                     const TrainerState& state, const std::string& config_yaml);

// The directory named by `<dir>/latest_checkpointed_iteration.txt`, or nullopt when there is no tracker.
// Throws RuntimeError when the tracker is unreadable or names a missing directory.
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

// Checks the manifest (every file present, sizes and CRC32C match) and throws RuntimeError naming the first
// bad file; nothing is loaded from a checkpoint that fails.
void verify_checkpoint(const std::string& checkpoint_dir);

// Verifies, then loads weights, optimizer moments and trainer state. Shapes must match the model.
TrainerState load_checkpoint(const std::string& checkpoint_dir, LlamaModel& model, AdamW& optimizer);

// Hugging Face model folder: model.safetensors (fp32) + config.json.
void export_hf_model(const std::string& dir, const LlamaModel& model);
// Loads weights from a Hugging Face model folder (F32/BF16/F16 safetensors; one file or an index of shards).
// The folder's config.json must describe the same shapes as the model; mismatches name the key.
void load_hf_weights(const std::string& dir, LlamaModel& model);

}  // namespace primus
