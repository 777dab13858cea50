// Entry point of `primus-cli train pretrain`: runs (or resumes) a pretraining job described by a
// validated experiment config. Throws UsageError / RuntimeError; the CLI maps them to exit codes.
#pragma once

#include "config/experiment.h"

namespace primus {

struct RunOptions {
  bool debug = false;       // verbose logging
};

// Trains until train_iters, writing <workspace>/<exp_name>/{config.yaml, logs/, metrics.jsonl} and
// checkpoints. Resumes from the latest complete checkpoint when one exists. Returns the exit code
// (0, or 128+N after a signal-triggered checkpoint and stop).
int run_pretrain(const ExperimentConfig& config, const RunOptions& options);

}  // namespace primus
