// `primus-cli projection memory`: every rank's memory of a job, planned before the job exists, from the trainer's own
// table (train/memory_report.h: the same model the run logs at its start, so projection and log never disagree).
// It lives beside that model in src/train, which src/tools may not use.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "config/experiment.h"
#include "train/memory_report.h"

namespace primus {

// A GPU the projection plans for: the memory a job may use, and the rates a step's time is projected from.
struct GpuModel {
  std::string name;
  int64_t memory_bytes = 0;
  std::string source;  // where the figure is from: "the vendor's capacity", "the driver (cuda:0)"
  double bf16_tflops = 0.0;        // dense bf16 peak (the datasheet's; the MFU denominator)
  double gemm_efficiency = 0.0;    // the share of it the engine's GEMMs reach at the shapes of a training step
  double grouped_gemm_efficiency = 0.0;  // the share the experts' grouped GEMMs reach (MoE layers)
  double attention_tflops = 0.0;   // causal flash attention at head dim 128, forward and backward, causal half
  double hbm_gbytes_per_s = 0.0;   // what a device copy reaches (read + write)
  double elementwise_gbytes_per_s = 0.0;  // what a step's memory-bound kernels reach, launch gaps included
  double link_gbytes_per_s = 0.0;  // a collective's bus bandwidth inside a node (NVLink / xGMI)
  std::string rates_source;        // where the seven figures above come from
};

// The shipped table: the vendors' HBM capacities; the H200's rates as measured by this engine, the others' scaled from
// their datasheets (see known_gpus in projection.cpp).
const std::vector<GpuModel>& known_gpus();
// A known GPU by name, any case; UsageError naming --gpu and the known names for another.
GpuModel find_gpu(std::string_view name);
// This machine's CUDA device 0 as the driver reports it; false without one (a laptop, a CPU-only build).
bool local_gpu(GpuModel* gpu);

enum class MemoryVerdict { kFits, kAtRisk, kOutOfMemory };
// "FITS", "AT-RISK", "OOM".
const char* verdict_name(MemoryVerdict verdict);
// FITS up to 90% of the GPU's memory (the table leaves out workspaces, the CUDA context and the allocator's rounding:
// a few percent on the shipped configs), AT-RISK up to 100%, OOM beyond.
MemoryVerdict memory_verdict(int64_t bytes, int64_t capacity);

// The plan of one rank of each pipeline stage (a stage's ranks hold the same bytes: tensor-parallel ranks equal
// slices, data-parallel ranks replicas; with the distributed optimizer the rank with the largest shards is shown).
struct MemoryProjection {
  GpuModel gpu;
  int world_size = 1;
  std::string layout;  // "dp 4 x tp 2 x pp 1 x cp 1 = 8 ranks"
  std::vector<MemoryPlan> stages;
  std::vector<MemoryVerdict> verdicts;  // per stage
  MemoryVerdict verdict = MemoryVerdict::kFits;  // the worst stage's
  std::vector<std::string> suggestions;          // what to change, when the worst stage does not fit
};

// `config` resolved for `world_size` ranks (WORLD_SIZE when it was loaded). Its layout is checked against the world
// and the model as a job's would be (UsageError naming the key); a vocabulary the config leaves to the tokenizer is
// read from it.
MemoryProjection project_memory(const ExperimentConfig& config, const GpuModel& gpu, int world_size);

// The report: the layout, each stage's table and verdict, what to change.
std::string format_memory_projection(const MemoryProjection& projection);
// One object: the GPU, the layout, per stage the bytes by kind and the total (per rank), its verdict, and the
// overall verdict.
nlohmann::json memory_projection_json(const MemoryProjection& projection);

}  // namespace primus
