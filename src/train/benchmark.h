// `primus-cli benchmark train`: the training step of an experiment config timed on synthetic tokens.
#pragma once

#include <cstdint>
#include <string>

#include "config/experiment.h"
#include "observe/progress.h"

namespace primus {

struct BenchmarkOptions {
  int64_t warmup_steps = 3;
  int64_t timed_steps = 10;
  ProgressOutput progress;  // bars for the warm-up and the timed steps; none by default
  // When set, one more step after the timed ones (so their times are unaffected) is recorded into a Perfetto trace
  // written here: phases, layers and ops on the host and device tracks (tools/trace_summary.py reads it).
  std::string trace_path;
};

struct BenchmarkResult {
  std::string device;
  int world_size = 1;          // ranks (data parallel) the global batch was split over
  int64_t parameters = 0;
  int64_t tokens_per_step = 0;
  double step_ms = 0.0;        // median of the timed steps
  double step_ms_min = 0.0;
  double step_ms_max = 0.0;
  double tokens_per_s = 0.0;   // the whole job's
  double tflops_per_gpu = 0.0; // by the model family's flops_per_token, per rank
  double mfu = 0.0;            // against kPeakBf16Tflops (GPU only)
  double mem_peak_gib = 0.0;   // device allocator peak (host tensors' on the CPU)
  double time_to_first_step_s = 0.0;  // from process start to the end of step 1
  double first_loss = 0.0;
  double last_loss = 0.0;
};

// Builds the configured model with random weights on the configured device, runs warm-up and timed steps
// on mock tokens (whatever data_path says), with the config's batch shape, optimizer and clipping. Logs the
// memory table first; a device out of memory ends in OutOfMemoryError carrying it and what to try.
// `args` with a vocab_size: the config's, or the tokenizer's padded as a run pads it (the tokenizer file is read only
// then, so a config whose model gives its vocabulary needs no tokenizer). For commands on random tokens.
ModelArgs with_vocab_size(ModelArgs args, const TrainingArgs& t);

BenchmarkResult run_benchmark_train(const ExperimentConfig& config, const BenchmarkOptions& options);

// A table for people and one JSON line for scripts.
std::string format_benchmark(const ExperimentConfig& config, const BenchmarkResult& result);

}  // namespace primus
