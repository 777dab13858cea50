// Entry point of `primus-cli train pretrain`: runs (or resumes) a pretraining job described by a
// validated experiment config. Throws UsageError / RuntimeError; the CLI maps them to exit codes.
#pragma once

#include "config/experiment.h"
#include "observe/progress.h"

namespace primus {

struct RunOptions {
  bool debug = false;       // verbose logging
  // Progress bars: checkpoint save/load, and a bar between log lines on a terminal when log_interval > 1.
  ProgressOutput progress;  // none by default; the CLI passes ProgressOutput::standard_error()
};

// Trains until train_iters, writing <workspace>/<exp_name>/{config.yaml, logs/, metrics.jsonl} and
// checkpoints. Resumes from the latest complete checkpoint when one exists. Returns the exit code
// (0, or 128+N after a signal-triggered checkpoint and stop). Logs the memory table (train/memory_report.h)
// before it allocates the model; a device out of memory ends in OutOfMemoryError carrying that table and what
// to try.
int run_pretrain(const ExperimentConfig& config, const RunOptions& options);

}  // namespace primus
