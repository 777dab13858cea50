// `primus-cli -- projection memory`: will a config fit, on how many GPUs of which kind, before any GPU is allocated
// (train/projection.h).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/cli.h"
#include "config/config.h"
#include "train/projection.h"

namespace primus::cli {

namespace {

struct ProjectionOptions {
  std::string config_path;
  int nnodes = 1;
  int gpus_per_node = 1;
  std::string gpu;  // empty: this machine's GPU, else H200
  bool json = false;
};

int run_projection_memory(const LaunchOptions& launch, const ProjectionOptions& o,
                          const std::vector<std::string>& overrides) {
  const int64_t world = int64_t{o.nnodes} * o.gpus_per_node;
  // The config resolves as each rank of that job would see it (torchrun's WORLD_SIZE sets the data-parallel size).
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  LoadedConfig loaded = load_experiment_config(o.config_path, overrides);
  if (launch.dry_run) {
    print_dry_run(launch, o.config_path, overrides, &loaded);
    return static_cast<int>(kExitOk);
  }
  GpuModel gpu;
  if (!o.gpu.empty()) {
    gpu = find_gpu(o.gpu);
  } else if (!local_gpu(&gpu)) {
    gpu = find_gpu("H200");
    gpu.source += "; no GPU here, --gpu names another";
  }
  const MemoryProjection projection = project_memory(loaded.config, gpu, static_cast<int>(world));
  if (o.json) {
    fmt::print("{}\n", memory_projection_json(projection).dump());
  } else {
    fmt::print("{}", format_memory_projection(projection));
  }
  std::fflush(stdout);
  return static_cast<int>(kExitOk);
}

}  // namespace

void add_projection_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  CLI::App* projection =
      root.add_subcommand("projection", "Plan before you train: memory per GPU of a config at a given scale");
  projection->require_subcommand(1);
  CLI::App* memory = projection->add_subcommand(
      "memory", "Per-GPU bytes of each pipeline stage and a verdict (FITS, AT-RISK, OOM), without a GPU");
  auto o = std::make_shared<ProjectionOptions>();
  memory->add_option("--config", o->config_path, "Experiment YAML file")->required()->type_name("FILE");
  memory->add_option("--nnodes", o->nnodes, "Nodes of the job (default 1)")->check(CLI::PositiveNumber);
  memory->add_option("--gpus-per-node", o->gpus_per_node, "GPUs per node (default 1)")->check(CLI::PositiveNumber);
  memory->add_option("--gpu", o->gpu, "H100, H200, B200, MI300X, MI325X or MI355X (default: this machine's GPU, else H200)");
  memory->add_flag("--json", o->json, "One JSON object instead of the table");
  memory->allow_extras();
  memory->footer(
      "Overrides: KEY=VALUE as for 'train pretrain' (micro_batch_size=2, tensor_model_parallel_size=2, ...).\n"
      "The layout (tp x pp x cp, the data-parallel size from nnodes x gpus-per-node) is checked against the model\n"
      "as a job's would be. The bytes are the trainer's own memory table (the one `train pretrain` logs at its\n"
      "start): fp32 master weights, the bf16 copy, gradients, AdamW state (sharded with the distributed optimizer or\n"
      "FSDP), communication buffers and one rank's activations (recompute, sequence and context parallelism, the\n"
      "micro-batches a pipeline stage holds in flight). FITS: at most 90% of the GPU's memory; AT-RISK: up to 100%\n"
      "(workspaces, the CUDA context and the allocator's rounding are not in the table); OOM beyond.\n\n"
      "Examples:\n"
      "  primus-cli -- projection memory --config configs/H200/llama3.2_3B-bf16-pretrain.yaml\n"
      "  primus-cli -- projection memory --config exp.yaml --nnodes 8 --gpus-per-node 8 --gpu MI300X "
      "tensor_model_parallel_size=8 --json");
  memory->final_callback([&launch, &action, memory, o] {
    action = [&launch, memory, o] { return run_projection_memory(launch, *o, normalize_overrides(memory->remaining())); };
  });
}

}  // namespace primus::cli
