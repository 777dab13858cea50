#include "train/projection.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "parallel/parallel_dims.h"
#include "train/benchmark.h"
#include "train/train_step.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/device_info.h"
#endif

namespace primus {

namespace {

constexpr int64_t kGB = 1'000'000'000;

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

// Rates: the H200's as the engine measured them there (docs/perf/projection.md): its GEMMs at 0.77 of the peak
// (740-790 TFLOP/s at a training step's shapes), cuDNN's fused attention at 456 TFLOP/s forward and backward at head
// dim 128, the experts' grouped GEMMs (its own mma.sync kernel, docs/perf/grouped-gemm.md) at 0.24 of the peak
// (160-280 TFLOP/s on the Mixtral and Qwen3-MoE shapes), device copies at 4.26 TB/s, and the memory-bound rest of a step (norms, RoPE, SwiGLU, adds, the loss,
// launch gaps) at 0.45 of that: the one figure fitted, to three measured steps. The other GPUs: their datasheets'
// dense bf16 peak and HBM bandwidth at the H200's shares, and each link's bandwidth per direction at the share NCCL's
// ring reaches over NVLink 4 without multicast (about 370 of 450 GB/s: assumed, no multi-GPU machine has been
// measured yet). Only the H200 row is calibrated.
const std::vector<GpuModel>& known_gpus() {
  constexpr double kGemmShare = 0.77, kGroupedGemmShare = 0.24, kAttentionShare = 456.0 / 989.0, kCopyShare = 0.8875, kElementwiseShare = 0.45,
                   kLinkShare = 0.82;
  const std::string measured = "measured by this engine on an H200 (docs/perf/projection.md); link assumed";
  const std::string scaled = "the datasheet's peak and bandwidths at the H200's measured shares (not calibrated)";
  auto gpu = [&](std::string name, int64_t gb, std::string what, double tflops, double hbm_tb, double link_gb,
                 const std::string& rates) {
    const double copy = kCopyShare * hbm_tb * 1000.0;
    return GpuModel{std::move(name), gb * kGB, "the vendor's capacity (" + what + ")", tflops, kGemmShare,
                    kGroupedGemmShare, kAttentionShare * tflops, copy, kElementwiseShare * copy,
                    kLinkShare * link_gb, rates};
  };
  static const std::vector<GpuModel> gpus = {
      gpu("H100", 80, "H100 SXM, 80 GB HBM3", 989.0, 3.35, 450.0, scaled),
      gpu("H200", 141, "H200 SXM, 141 GB HBM3e", 989.0, 4.8, 450.0, measured),
      gpu("B200", 180, "B200, 180 GB HBM3e", 2250.0, 8.0, 900.0, scaled),
      gpu("MI300X", 192, "MI300X, 192 GB HBM3", 1307.4, 5.3, 448.0, scaled),
      gpu("MI325X", 256, "MI325X, 256 GB HBM3e", 1307.4, 6.0, 448.0, scaled),
      gpu("MI355X", 288, "MI355X, 288 GB HBM3e", 2516.6, 8.0, 537.6, scaled),
  };
  return gpus;
}

GpuModel find_gpu(std::string_view name) {
  std::string names;
  for (const GpuModel& gpu : known_gpus()) {
    if (lower(gpu.name) == lower(name)) return gpu;
    names += (names.empty() ? "" : ", ") + gpu.name;
  }
  throw UsageError(fmt::format("--gpu {}: not a GPU the projection knows ({})", name, names));
}

bool local_gpu(GpuModel* gpu) {
#if PRIMUS_WITH_CUDA
  CudaDeviceInfo info;
  std::string why;
  if (!cuda_device_info(0, &info, &why)) return false;
  *gpu = GpuModel{};
  gpu->name = info.name;
  gpu->memory_bytes = info.total_bytes;
  gpu->source = "the driver (cuda:0)";
  return true;
#else
  (void)gpu;
  return false;
#endif
}

const char* verdict_name(MemoryVerdict verdict) {
  switch (verdict) {
    case MemoryVerdict::kFits:
      return "FITS";
    case MemoryVerdict::kAtRisk:
      return "AT-RISK";
    case MemoryVerdict::kOutOfMemory:
      return "OOM";
  }
  return "?";
}

MemoryVerdict memory_verdict(int64_t bytes, int64_t capacity) {
  if (bytes > capacity) return MemoryVerdict::kOutOfMemory;
  if (static_cast<double>(bytes) > 0.9 * static_cast<double>(capacity)) return MemoryVerdict::kAtRisk;
  return MemoryVerdict::kFits;
}

MemoryProjection project_memory(const ExperimentConfig& config, const GpuModel& gpu, int world_size) {
  const TrainingArgs& t = config.train;
  const ModelArgs args = with_vocab_size(config.model, t);
  const ParallelDims dims = parallel_dims_for(args, t, world_size);
  MemoryProjection p;
  p.gpu = gpu;
  p.world_size = world_size;
  p.layout = dims.describe();
  // The GPU need not be here: the plan names it, bf16 as the config asks.
  const DType dtype = t.bf16 ? DType::kBF16 : DType::kF32;
  for (int stage = 0; stage < dims.pp(); ++stage) {
    MemoryPlan plan = plan_memory(args, t, Device{DeviceType::kCuda, 0}, dtype, stage);
    plan.device = gpu.name;
    const MemoryVerdict verdict = memory_verdict(plan.total_bytes(), gpu.memory_bytes);
    if (p.stages.empty() || verdict > p.verdict) {
      p.verdict = verdict;
      p.suggestions = verdict == MemoryVerdict::kFits ? std::vector<std::string>() : memory_suggestions(plan);
    }
    p.stages.push_back(std::move(plan));
    p.verdicts.push_back(verdict);
  }
  return p;
}

std::string format_memory_projection(const MemoryProjection& p) {
  std::string text = fmt::format("{} on {} x {} ({} each, {})\n", p.layout, p.world_size, p.gpu.name,
                                 format_memory_bytes(p.gpu.memory_bytes), p.gpu.source);
  for (size_t s = 0; s < p.stages.size(); ++s) {
    for (const std::string& line : format_memory_table(p.stages[s])) text += line + "\n";
    text += fmt::format("  {:<36}{:>12}  {:.0f}% of {}'s {}\n\n", verdict_name(p.verdicts[s]),
                        format_memory_bytes(p.stages[s].total_bytes()),
                        100.0 * static_cast<double>(p.stages[s].total_bytes()) / static_cast<double>(p.gpu.memory_bytes),
                        p.gpu.name, format_memory_bytes(p.gpu.memory_bytes));
  }
  text += fmt::format("verdict: {}{}\n", verdict_name(p.verdict),
                      p.stages.size() > 1 ? " (the fullest pipeline stage)" : "");
  if (!p.suggestions.empty()) {
    text += "What to change:\n";
    for (const std::string& tip : p.suggestions) text += "  - " + tip + "\n";
  }
  return text;
}

nlohmann::json memory_projection_json(const MemoryProjection& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const MemoryPlan& plan = p.stages[s];
    stages.push_back({{"stage", s},
                      {"pipeline", plan.pipeline_stage},
                      {"parameters", plan.parameters},
                      {"bytes",
                       {{"parameters", plan.param_bytes},
                        {"compute_copy", plan.compute_copy_bytes},
                        {"gradients", plan.grad_bytes},
                        {"optimizer", plan.optimizer_bytes},
                        {"communication", plan.comm_bytes},
                        {"activations", plan.activations.peak_bytes},
                        {"not_at_once", plan.not_at_once_bytes},
                        {"total", plan.total_bytes()}}},
                      {"micro_batches_in_flight", plan.micro_batches_in_flight},
                      {"verdict", verdict_name(p.verdicts[s])}});
  }
  return {{"gpu", {{"name", p.gpu.name}, {"memory_bytes", p.gpu.memory_bytes}, {"source", p.gpu.source}}},
          {"world_size", p.world_size},
          {"layout", p.layout},
          {"stages", stages},
          {"verdict", verdict_name(p.verdict)},
          {"suggestions", p.suggestions}};
}

}  // namespace primus
