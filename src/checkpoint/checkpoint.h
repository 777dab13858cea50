// Training checkpoints: one directory per saved iteration, written atomically, verified before loading.
//
// Single-file format (a world of one; Hugging Face loads its model.safetensors as it is):
//   <save>/iter_0000100/model.safetensors      fp32 weights, Hugging Face names (loadable by transformers
//                       config.json            together with this HF config)
//                       optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name>
//                       trainer_state.json     iteration, consumed samples, optimizer steps, seeds, fp8 scaling
//                       config.yaml            the effective experiment config
//                       manifest.json          size and CRC32C of every file above (written last)
//   <save>/latest_checkpointed_iteration.txt   Megatron's tracker file, replaced atomically after the directory
// Sharded format (several ranks, sharded_checkpoint.h): shard_<r>_of_<n>.safetensors from each rank and
// index.json in place of model.safetensors and optimizer.safetensors; the other files are the same.
//
// A directory is built under a temporary name (`iter_N.tmp`), every file fsync'ed, then renamed into place;
// the tracker is updated last, so a crash at any point leaves the previous checkpoint as the latest complete
// one. The next save removes temporaries that crashed saves left behind.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "layers/fp8_scaling.h"
#include "models/model.h"
#include "optim/adamw.h"

namespace primus {

struct TrainerState {
  int64_t iteration = 0;               // completed training iterations
  int64_t consumed_train_samples = 0;  // data position: samples drawn from the training source
  int64_t optimizer_steps = 0;         // AdamW bias-correction step count
  int64_t seed = 0;                    // the run's seed (initialisation, data order and mock data derive from it)
  // fp8's delayed-scaling state (layers/fp8_scaling.h), so a resumed run scales as the uninterrupted one; empty
  // without it. NaN amaxes are stored as JSON null.
  std::vector<Fp8ScalingRecord> fp8_scaling;
};

std::string checkpoint_dir_name(int64_t iteration);  // "iter_0000100"
// The iteration N of a name checkpoint_dir_name(N) gives, or -1 for any other name.
int64_t checkpoint_dir_iteration(const std::string& name);

// Where a long checkpoint operation stands, reported on the calling thread: first with done_bytes 0, then
// as bytes go by, last with done_bytes == total_bytes. Phases: "save" (the safetensors files written; a device
// model's tensors are copied to the host piece by piece as they are written), "verify" (every file of the
// manifest read and checked), "load" (tensor bytes copied into the model and optimizer).
// The trainer draws progress bars from it (train/checkpoint_progress.h).
struct CheckpointProgress {
  const char* phase = "";
  int64_t done_bytes = 0;
  int64_t total_bytes = 0;
};
using CheckpointProgressFn = std::function<void(const CheckpointProgress&)>;

// How checkpoint files are read and written: on `threads` threads (0: min(8, CPUs), parallel_jobs.h). A save
// writes 16 MiB pieces at their offsets in parallel and starts their writeback at once; a load checksums 64 MiB
// ranges of every file in parallel, then reads 16 MiB pieces straight into the tensors (docs/perf/checkpoint.md).
struct CheckpointIo {
  int threads = 0;
};

// Writes a complete checkpoint for `state.iteration` under `save_dir` in the single-file format and points the
// tracker at it. The optimizer must own every element (in one range or several). The manifest's sizes and
// CRC32Cs are computed from the bytes as they are written. Returns the bytes written.
int64_t save_checkpoint(const std::string& save_dir, const Model& model, const AdamW& optimizer,
                        const TrainerState& state, const std::string& config_yaml,
                        const CheckpointProgressFn& progress = {}, const CheckpointIo& io = {});

// The directory named by `<dir>/latest_checkpointed_iteration.txt`, or nullopt when there is no tracker.
// Throws RuntimeError when the tracker is unreadable or names a missing directory.
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

// Checks the manifest (every file present, sizes and CRC32C match) and throws RuntimeError naming the first
// bad file; nothing is loaded from a checkpoint that fails. Files are read in pieces, never whole. The manifest
// does not decide what is verified: every file of the format must be listed (checkpoint_verify.cpp), its entries
// and trainer_state.json are range-checked, and the iteration must agree with the directory's name iter_N.
void verify_checkpoint(const std::string& checkpoint_dir, const CheckpointProgressFn& progress = {},
                       const CheckpointIo& io = {});

// Verifies, then loads weights, optimizer moments and trainer state from a checkpoint of either format into a
// model and an optimizer of any layout: every weight of this rank's part of each tensor (its tensor-parallel box,
// or the whole tensor), and the moments of the optimizer's owned ranges only, each from whichever stored pieces
// hold it (a checkpoint of 4 data-parallel ranks loads into 2 ranks or 1, a 1-process one into 4, one of tp 2 × dp
// 2 into tp 4 or one process). The checkpoint's config.json must describe the model (UsageError naming the key and both values: the run is
// configured for another model); a missing tensor or slice throws RuntimeError naming the file.
TrainerState load_checkpoint(const std::string& checkpoint_dir, Model& model, AdamW& optimizer,
                             const CheckpointProgressFn& progress = {}, const CheckpointIo& io = {});

// Hugging Face model folder: model.safetensors (fp32) + config.json, from a model of one process (a tensor-parallel
// rank's slices are refused: convert a checkpoint instead).
void export_hf_model(const std::string& dir, const Model& model);
// Loads weights from a Hugging Face model folder (F32/BF16/F16 safetensors; one file or an index of shards whose
// files stay inside the folder), each rank its tensor-parallel part. The folder's config.json must describe the model (require_same_model in
// hf_config.h) with max_position_embeddings at least the model's sequence length; UsageError names the file and key.
void load_hf_weights(const std::string& dir, Model& model);

}  // namespace primus
