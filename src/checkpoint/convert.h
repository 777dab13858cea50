// Conversions between native checkpoints (either format, checkpoint.h / sharded_checkpoint.h) and Hugging Face
// model folders, behind `primus-cli checkpoint convert`. Both stream: a tensor goes from the input files to the
// output file in pieces of at most 16 MiB, so neither needs the model in memory, nor builds one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace primus {

// The checkpoint iteration directory that `path` names: `path` itself when it holds manifest.json, else the
// directory its latest_checkpointed_iteration.txt names. UsageError naming the path when it is neither (or
// does not exist); RuntimeError when its tracker is unreadable.
std::string resolve_checkpoint_dir(const std::string& path);

struct ConversionSummary {
  std::string written;  // the file written (export) or checkpoint directory committed (import)
  int64_t tensors = 0;
  int64_t parameters = 0;            // elements of the weights
  int64_t bytes = 0;                 // bytes of the safetensors files written
  int64_t iteration = 0;             // the checkpoint's
  bool sharded = false;              // export: the checkpoint was in the sharded format
  std::vector<std::string> ignored;  // import: tensors of the folder the model has no parameter for
};

// Verifies the checkpoint, then writes `hf_dir`/model.safetensors (every weight whole, F32, Hugging Face
// names; no optimizer state) and the checkpoint's config.json. Progress: "verify", then "save".
ConversionSummary export_checkpoint_to_hf(const std::string& checkpoint_dir, const std::string& hf_dir,
                                          const CheckpointProgressFn& progress = {});

// Writes a single-file native checkpoint of iteration 0 under `save_dir` (iter_0000000 and the tracker) from a
// Hugging Face folder (config.json and F32/BF16/F16 safetensors, one file or an index of shards): fp32 weights,
// zero AdamW moments and step count, no samples consumed, `seed` as the run's seed (a resumed run must use the
// same). The folder must hold every parameter of the model its config.json describes (UsageError naming the
// file and tensor); a save_dir that already has a tracker is refused. Progress: "save".
ConversionSummary import_hf_to_checkpoint(const std::string& hf_dir, const std::string& save_dir, int64_t seed,
                                          const CheckpointProgressFn& progress = {});

}  // namespace primus
