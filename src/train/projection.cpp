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

const std::vector<GpuModel>& known_gpus() {
  static const std::vector<GpuModel> gpus = {
      {"H100", 80 * kGB, "the vendor's capacity (H100 SXM, 80 GB HBM3)"},
      {"H200", 141 * kGB, "the vendor's capacity (H200 SXM, 141 GB HBM3e)"},
      {"B200", 180 * kGB, "the vendor's capacity (B200, 180 GB HBM3e)"},
      {"MI300X", 192 * kGB, "the vendor's capacity (MI300X, 192 GB HBM3)"},
      {"MI325X", 256 * kGB, "the vendor's capacity (MI325X, 256 GB HBM3e)"},
      {"MI355X", 288 * kGB, "the vendor's capacity (MI355X, 288 GB HBM3e)"},
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
  *gpu = GpuModel{info.name, info.total_bytes, "the driver (cuda:0)"};
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
