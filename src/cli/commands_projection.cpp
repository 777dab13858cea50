// `primus-cli -- projection memory|performance`: will a config fit, and how fast will it run, on how many GPUs of which
// kind, before any GPU is allocated (train/projection.h, train/step_projection.h).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>

#include "cli/cli.h"
#include "config/config.h"
#include "train/projection.h"
#include "train/step_projection.h"
#include "train/tune.h"
#include "cli/tune_confirm.h"

namespace primus::cli {

namespace {

struct ProjectionOptions {
  std::string config_path;
  int nnodes = 1;
  int gpus_per_node = 1;
  std::string gpu;  // empty: this machine's GPU, else H200
  bool json = false;
  double nic_gbps = 400.0;         // performance only
  std::vector<std::string> rates;  // performance only: JSONL of benchmark gemm|attention
};

GpuModel chosen_gpu(const ProjectionOptions& o) {
  GpuModel gpu;
  if (!o.gpu.empty()) return find_gpu(o.gpu);
  if (local_gpu(&gpu)) return gpu;
  gpu = find_gpu("H200");
  gpu.source += "; no GPU here, --gpu names another";
  return gpu;
}

// Loads the config as each rank of the job would see it (torchrun's WORLD_SIZE sets the data-parallel size) and runs
// `project` on it, unless --dry-run.
int run_projection(const LaunchOptions& launch, const ProjectionOptions& o, const std::vector<std::string>& overrides,
                   const std::function<void(const ExperimentConfig&, int world)>& project) {
  const int64_t world = int64_t{o.nnodes} * o.gpus_per_node;
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  LoadedConfig loaded = load_experiment_config(o.config_path, overrides);
  if (launch.dry_run) {
    print_dry_run(launch, o.config_path, overrides, &loaded);
    return static_cast<int>(kExitOk);
  }
  project(loaded.config, static_cast<int>(world));
  std::fflush(stdout);
  return static_cast<int>(kExitOk);
}

int run_projection_memory(const LaunchOptions& launch, const ProjectionOptions& o,
                          const std::vector<std::string>& overrides) {
  return run_projection(launch, o, overrides, [&o](const ExperimentConfig& config, int world) {
    const MemoryProjection projection = project_memory(config, chosen_gpu(o), world);
    fmt::print("{}", o.json ? memory_projection_json(projection).dump() + "\n" : format_memory_projection(projection));
  });
}

int run_projection_performance(const LaunchOptions& launch, const ProjectionOptions& o,
                               const std::vector<std::string>& overrides) {
  return run_projection(launch, o, overrides, [&o](const ExperimentConfig& config, int) {
    const ClusterShape cluster{o.nnodes, o.gpus_per_node, o.nic_gbps};
    const MeasuredRates measured = read_measured_rates(o.rates);
    const PerformanceProjection projection =
        project_performance(config, chosen_gpu(o), cluster, o.rates.empty() ? nullptr : &measured);
    fmt::print("{}", o.json ? performance_projection_json(projection).dump() + "\n"
                            : format_performance_projection(projection));
  });
}

struct TuneOptions {
  int top = 10;
  int confirm = 0;  // candidates timed with benchmark train
  int confirm_warmup = 2;
  int confirm_steps = 5;
};

constexpr const char* kOverridesHeading = "as overrides (under modules.<module>.overrides, or key=value on the command line):\n";

int run_tune(const LaunchOptions& launch, const ProjectionOptions& o, const TuneOptions& u,
             const std::vector<std::string>& overrides) {
  if (u.confirm > 0 && o.nnodes > 1) {
    throw UsageError(fmt::format("--confirm runs the candidates on this machine's GPUs; with --nnodes {} time them as "
                                 "jobs (`primus-cli slurm ... -- benchmark train`) with the overrides tune prints",
                                 o.nnodes));
  }
  if (launch.dry_run) {
    setenv("WORLD_SIZE", std::to_string(int64_t{o.nnodes} * o.gpus_per_node).c_str(), 1);
    LoadedConfig loaded = load_experiment_config(o.config_path, overrides);
    print_dry_run(launch, o.config_path, overrides, &loaded);
    return static_cast<int>(kExitOk);
  }
  const ClusterShape cluster{o.nnodes, o.gpus_per_node, o.nic_gbps};
  const GpuModel gpu = chosen_gpu(o);
  const TuneResult result = tune_layouts(o.config_path, overrides, gpu, cluster);
  // The top candidates timed for real, each with the user's overrides and its own.
  std::vector<ConfirmRun> runs;
  const int confirming = std::min<int>(u.confirm, static_cast<int>(result.ranked.size()));
  for (int i = 0; i < confirming; ++i) {
    std::vector<std::string> all = overrides;
    const std::vector<std::string>& own = result.ranked[static_cast<size_t>(i)].overrides;
    all.insert(all.end(), own.begin(), own.end());
    if (!o.json) fmt::print(stderr, "tune: timing candidate {} of {} with benchmark train\n", i + 1, confirming);
    runs.push_back(confirm_layout(o.config_path, all, o.gpus_per_node, u.confirm_warmup, u.confirm_steps));
  }
  int measured_best = -1;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].ok && (measured_best < 0 || runs[i].tokens_per_s_per_gpu > runs[measured_best].tokens_per_s_per_gpu)) {
      measured_best = static_cast<int>(i);
    }
  }
  if (o.json) {
    nlohmann::json ranked = nlohmann::json::array();
    for (int i = 0; i < std::min<int>(std::max(u.top, u.confirm), static_cast<int>(result.ranked.size())); ++i) {
      const TuneCandidate& c = result.ranked[static_cast<size_t>(i)];
      nlohmann::json row = {{"overrides", c.overrides},
                            {"summary", c.summary},
                            {"memory_bytes", c.memory_bytes},
                            {"projection", performance_projection_json(c.performance)}};
      if (static_cast<size_t>(i) < runs.size()) {
        const ConfirmRun& run = runs[static_cast<size_t>(i)];
        row["measured"] = run.ok ? nlohmann::json{{"tokens_per_s_per_gpu", run.tokens_per_s_per_gpu},
                                                  {"step_ms", run.step_ms}}
                                 : nlohmann::json{{"failure", run.failure}};
      }
      ranked.push_back(row);
    }
    fmt::print("{}\n", nlohmann::json{{"tried", result.tried},
                                      {"fit", result.ranked.size()},
                                      {"too_big", result.too_big},
                                      {"invalid", result.invalid},
                                      {"ranked", ranked},
                                      {"measured_best", measured_best}}
                           .dump());
  } else {
    fmt::print("{}", format_tune_result(result, gpu, cluster, u.top));
    if (!runs.empty()) {
      fmt::print("\nTimed with benchmark train ({} warm-up + {} steps on {} rank(s)):\n", u.confirm_warmup,
                 u.confirm_steps, o.gpus_per_node);
      fmt::print("  {:>4}  {:>12}  {:>12}  {:>8}  {}\n", "rank", "projected", "measured", "ratio", "layout");
      for (size_t i = 0; i < runs.size(); ++i) {
        const TuneCandidate& c = result.ranked[i];
        const double projected = c.performance.tokens_per_s_per_gpu;
        if (runs[i].ok) {
          fmt::print("  {:>4}  {:>12.0f}  {:>12.0f}  {:>8.3f}  {}\n", i + 1, projected, runs[i].tokens_per_s_per_gpu,
                     runs[i].tokens_per_s_per_gpu / projected, c.summary);
        } else {
          fmt::print("  {:>4}  {:>12.0f}  {:>12}  {:>8}  {} ({})\n", i + 1, projected, "failed", "", c.summary,
                     runs[i].failure);
        }
      }
    }
    if (!result.ranked.empty()) {
      const bool measured = measured_best >= 0;
      const TuneCandidate& winner = result.ranked[static_cast<size_t>(measured ? measured_best : 0)];
      fmt::print("\nThe fastest {}, {}{}", measured ? "measured" : "by projection", kOverridesHeading,
                 format_overrides_yaml(winner.overrides));
    }
  }
  std::fflush(stdout);
  return static_cast<int>(kExitOk);
}

// The options both subcommands take.
void add_common_options(CLI::App* command, ProjectionOptions& o) {
  command->add_option("--config", o.config_path, "Experiment YAML file")->required()->type_name("FILE");
  command->add_option("--nnodes", o.nnodes, "Nodes of the job (default 1)")->check(CLI::PositiveNumber);
  command->add_option("--gpus-per-node", o.gpus_per_node, "GPUs per node (default 1)")->check(CLI::PositiveNumber);
  command->add_option("--gpu", o.gpu, "H100, H200, B200, MI300X, MI325X or MI355X (default: this machine's GPU, else H200)");
  command->add_flag("--json", o.json, "One JSON object instead of the table");
  command->allow_extras();
}

}  // namespace

void add_projection_commands(CLI::App& root, const LaunchOptions& launch, Action& action) {
  CLI::App* projection =
      root.add_subcommand("projection", "Plan before you train: memory per GPU and step time of a config at a given scale");
  projection->require_subcommand(1);
  CLI::App* memory = projection->add_subcommand(
      "memory", "Per-GPU bytes of each pipeline stage and a verdict (FITS, AT-RISK, OOM), without a GPU");
  auto o = std::make_shared<ProjectionOptions>();
  add_common_options(memory, *o);
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

  CLI::App* performance = projection->add_subcommand(
      "performance", "Step time, tokens/s per GPU and MFU of a config at a scale, part by part, without a GPU");
  auto p = std::make_shared<ProjectionOptions>();
  add_common_options(performance, *p);
  performance->add_option("--nic-gbps", p->nic_gbps, "NIC line rate per GPU between nodes, Gb/s (default 400)")
      ->check(CLI::PositiveNumber);
  performance->add_option("--rates", p->rates,
                          "JSONL of `benchmark gemm|attention --jsonl` measured on the GPU: their TFLOP/s replace the "
                          "table's for the ops they time (repeatable)")
      ->type_name("FILE");
  performance->footer(
      "Overrides: KEY=VALUE as for 'train pretrain'. The step of one rank of the slowest pipeline stage: every GEMM\n"
      "of a layer (forward, data and weight gradient; a recomputed layer's forward twice) at the GPU's GEMM rate or\n"
      "at the rate --rates measured for it, causal attention at the attention rate, the memory-bound passes (norms,\n"
      "RoPE, SwiGLU, residual adds, the loss) at the HBM bandwidth, the tp all-reduces, ep all-to-alls and the\n"
      "cp ring's excess over attention, times the micro-batches a step; the pipeline bubble (p - 1)/v micro-batches;\n"
      "the gradient all-reduce or reduce-scatter and the weight all-gather, as much as overlap_grad_reduce and\n"
      "overlap_param_gather leave showing; AdamW. Collectives: ring traffic at the link's bus bandwidth (NVLink/xGMI\n"
      "inside a node, the NIC across nodes) plus a latency per step. Only the H200's rates are calibrated against\n"
      "the engine's measured steps (docs/perf/projection.md); the other GPUs' are their datasheets scaled alike.\n\n"
      "Examples:\n"
      "  primus-cli -- projection performance --config configs/H200/llama3.2_3B-bf16-pretrain.yaml\n"
      "  primus-cli -- projection performance --config exp.yaml --nnodes 8 --gpus-per-node 8 --gpu MI300X "
      "tensor_model_parallel_size=8\n"
      "  primus-cli -- benchmark gemm --config exp.yaml --jsonl gemm.jsonl && \\\n"
      "    primus-cli -- projection performance --config exp.yaml --rates gemm.jsonl");
  performance->final_callback([&launch, &action, performance, p] {
    action = [&launch, performance, p] {
      return run_projection_performance(launch, *p, normalize_overrides(performance->remaining()));
    };
  });

  CLI::App* tune = root.add_subcommand(
      "tune", "Rank the layouts a config could train with on a cluster by projected tokens/s, memory as a hard limit");
  auto u = std::make_shared<ProjectionOptions>();
  auto tuning = std::make_shared<TuneOptions>();
  add_common_options(tune, *u);
  tune->add_option("--nic-gbps", u->nic_gbps, "NIC line rate per GPU between nodes, Gb/s (default 400)")
      ->check(CLI::PositiveNumber);
  tune->add_option("--top", tuning->top, "Candidates shown (default 10)")->check(CLI::PositiveNumber);
  tune->add_option("--confirm", tuning->confirm,
                   "Time the K best with `benchmark train` on this machine's --gpus-per-node GPUs and pick the "
                   "fastest measured (one node only)")
      ->check(CLI::NonNegativeNumber);
  tune->add_option("--confirm-warmup", tuning->confirm_warmup, "Untimed steps of each confirmation run (default 2)")
      ->check(CLI::NonNegativeNumber);
  tune->add_option("--confirm-steps", tuning->confirm_steps, "Timed steps of each confirmation run (default 5)")
      ->check(CLI::PositiveNumber);
  tune->footer(
      "Overrides: KEY=VALUE as for 'train pretrain'; they hold for every candidate. The search: tensor parallelism 1,\n"
      "2, 4, 8 inside a node (with sequence_parallel), pipeline stages in powers of two with and without two virtual\n"
      "stages, context parallelism 1-8, expert parallelism over the experts, micro_batch_size 1-8 and recompute\n"
      "none/selective/full; the data-parallel size is what is left, with the distributed optimizer and overlapped\n"
      "communication. Each candidate is loaded and checked as a job would be, planned for memory (only FITS counts:\n"
      "`projection memory`) and ranked by `projection performance`. The global batch and sequence length stay.\n"
      "With --confirm K the K best run as short `benchmark train` jobs here (a child process each, so an\n"
      "out-of-memory candidate only fails its row) and the fastest measured wins.\n\n"
      "Examples:\n"
      "  primus-cli -- tune --config configs/H200/llama3.2_3B-bf16-pretrain.yaml --gpus-per-node 8\n"
      "  primus-cli -- tune --config exp.yaml --nnodes 4 --gpus-per-node 8 --gpu MI300X global_batch_size=256\n"
      "  primus-cli -- tune --config configs/H200/llama3.2_1B-bf16-pretrain.yaml --confirm 3");
  tune->final_callback([&launch, &action, tune, u, tuning] {
    action = [&launch, tune, u, tuning] { return run_tune(launch, *u, *tuning, normalize_overrides(tune->remaining())); };
  });
}

}  // namespace primus::cli
