#include "train/benchmark.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sstream>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "ops/ops.h"
#include "ops/profile.h"
#include "train/fp8_training.h"
#include "train/memory_report.h"
#include "train/pipeline_step.h"
#include "train/train_step.h"

namespace primus {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds since this process started, from /proc (start time in clock ticks since boot vs uptime).
double seconds_since_process_start() {
  std::ifstream stat_file("/proc/self/stat");
  std::ifstream uptime_file("/proc/uptime");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  double uptime = 0.0;
  uptime_file >> uptime;
  // Field 22 (starttime) counted after the ")" that closes the command name, which may contain spaces.
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  const double start_ticks = std::stod(field);
  return uptime - start_ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Warm-up and timed steps of a built model; each phase has its own progress bar.
BenchmarkResult time_steps(Model& model, AdamW& optimizer, DataParallel& dp, const BatchSplit& split,
                           const TrainingArgs& t, Device device, const BenchmarkOptions& options,
                           const Pipeline& pipeline, Fp8Scaling* fp8) {
  MockTokens tokens(model.args().vocab_size, t.seq_length, static_cast<uint64_t>(t.seed));
  BatchLoader loader(tokens, t.micro_batch_size, t.seq_length, 0, {}, split.shard);
  BenchmarkResult result;
  std::vector<double> step_ms;
  int64_t step = 0;
  auto run_phase = [&](const char* label, int64_t steps) {
    ProgressBar bar({.label = label, .total = steps, .count_name = "steps", .keep = false}, options.progress);
    for (int64_t k = 1; k <= steps; ++k) {
      ++step;
      const Clock::time_point t0 = Clock::now();
      std::vector<Batch> batches;
      for (int64_t i = 0; i < micro_batches_per_step(t); ++i) batches.push_back(split.local(loader.next()));
      const StepResult r = train_step(model, optimizer, dp, batches, t, t.lr, nullptr, &pipeline, fp8);
      ops::synchronize(device);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (step == 1) {
        result.time_to_first_step_s = seconds_since_process_start();
        result.first_loss = r.loss;
      }
      result.last_loss = r.loss;
      if (step > options.warmup_steps) step_ms.push_back(ms);
      bar.update(k);
    }
    bar.finish();
  };
  run_phase("benchmark warm-up", options.warmup_steps);
  run_phase("benchmark timed", options.timed_steps);
  if (!options.trace_path.empty()) {
    ops::Trace::start(device);
    run_phase("benchmark traced", 1);
    step_ms.pop_back();  // the traced step pays for its marks: not a timed one
    const int64_t scopes = ops::Trace::stop_and_write(options.trace_path);
    spdlog::info("benchmark: step {} traced ({} scopes) into {} (open in https://ui.perfetto.dev; summary: "
                 "tools/trace_summary.py)",
                 step, scopes, options.trace_path);
  }
  std::sort(step_ms.begin(), step_ms.end());
  result.step_ms = step_ms[step_ms.size() / 2];
  result.step_ms_min = step_ms.front();
  result.step_ms_max = step_ms.back();
  return result;
}

}  // namespace

ModelArgs with_vocab_size(ModelArgs args, const TrainingArgs& t) {
  if (args.vocab_size == 0) {
    args.vocab_size = padded_vocab_size(make_tokenizer(t.tokenizer_type, t.tokenizer_model)->vocab_size(),
                                        args.make_vocab_size_divisible_by * t.tensor_model_parallel_size);
  }
  return args;
}

BenchmarkResult run_benchmark_train(const ExperimentConfig& config, const BenchmarkOptions& options) {
  PRIMUS_CHECK(options.timed_steps >= 1 && options.warmup_steps >= 0, "benchmark needs >= 1 timed step");
  TrainingArgs t = config.train;
  for (const auto& [on, key] : {std::pair{t.reset_position_ids, "reset_position_ids"},
                                std::pair{t.reset_attention_mask, "reset_attention_mask"},
                                std::pair{t.eod_mask_loss, "eod_mask_loss"}}) {
    if (on) {
      throw UsageError(fmt::format("[config] {}: benchmark train runs on mock tokens, which hold no documents to "
                                   "separate; turn {} off to benchmark (`{}=false`)",
                                   key, key, key));
    }
  }
  const DistributedEnv env = DistributedEnv::from_environment();
  const Device device = select_device(t.device, env.local_rank);
  if (t.deterministic_mode) ops::set_deterministic(device, true);
  // Synthetic tokens need no tokenizer, only a vocabulary size: the tokenizer file is read only when the model
  // takes its size from it, so a config naming data and a tokenizer benchmarks where they are not present.
  const ModelArgs args = with_vocab_size(config.model, t);
  trace_device_memory_peaks(device);
  MemoryPlan plan = plan_memory(args, t, device, compute_dtype(t, device));
  add_device_memory(plan, device);
  log_memory_plan(plan);
  check_memory_plan_fits(plan);

  BenchmarkResult result;
  try {
    // The config's layout (a world of one without a job).
    const std::shared_ptr<Communicator> world = connect_world(env, device, t);
    const ProcessGroups groups = make_process_groups(world, args, t);
    const std::unique_ptr<Model> model = make_parallel_model(args, t, device, groups);
    note_device_memory(device, "model built");
    model->set_recompute(RecomputeConfig::from(t));
    model->params().initialize(static_cast<uint64_t>(t.seed));
    note_device_memory(device, "initialize");
    const Pipeline pipeline = make_pipeline(groups, !args.untie_embeddings_and_output_weights);
    check_pipeline_schedule(pipeline, micro_batches_per_step(t));
    const std::unique_ptr<DataParallel> dp = make_data_parallel(groups, *model, t);
    note_device_memory(device, "data parallel");
    AdamW optimizer = make_optimizer(*model, *dp, t);
    note_device_memory(device, "optimizer");
    weights_ready(*model, *dp);
    note_device_memory(device, "weights ready");
    const std::shared_ptr<Fp8Scaling> fp8 = enable_fp8(*model, t, device, groups);
    result = time_steps(*model, optimizer, *dp, batch_split(groups), t, device, options, pipeline, fp8.get());
    result.world_size = world->size();
    result.parameters = model->params().numel();
  } catch (const OutOfMemoryError& error) {
    throw OutOfMemoryError(out_of_memory_message(error, plan), error.device(), error.requested_bytes());
  }
  result.device = device.str();
  result.tokens_per_step = t.global_batch_size * t.seq_length;
  result.tokens_per_s = static_cast<double>(result.tokens_per_step) / (result.step_ms / 1000.0);
  result.tflops_per_gpu = result.tokens_per_s * model_family(args).flops_per_token(args, t.seq_length) / 1e12 /
                          static_cast<double>(result.world_size);
  if (!device.is_cpu()) result.mfu = result.tflops_per_gpu / kPeakBf16Tflops;
  result.mem_peak_gib = device_peak_memory_gib(device);
  if (const std::string sites = device_memory_peak_sites(); !sites.empty()) {
    spdlog::info("where device memory peaked (PRIMUS_MEMORY_TRACE):\n{}", sites);
  }
  return result;
}

std::string format_benchmark(const ExperimentConfig& config, const BenchmarkResult& r) {
  const TrainingArgs& t = config.train;
  std::string text = fmt::format(
      "benchmark train: {} on {}{}, micro-batch {} x seq {} (global batch {}), {} parameters\n"
      "  step time (median)    {:10.1f} ms   (min {:.1f}, max {:.1f})\n"
      "  tokens/s              {:10.0f}\n"
      "  TFLOP/s per GPU       {:10.1f}\n"
      "  MFU (989 TFLOP/s)     {:10.3f}\n"
      "  peak memory           {:10.2f} GiB\n"
      "  time to first step    {:10.1f} s\n"
      "  loss first/last       {:.4f} / {:.4f}\n",
      config.model.preset, r.device, r.world_size > 1 ? fmt::format(" x {} ranks", r.world_size) : "", t.micro_batch_size, t.seq_length, t.global_batch_size, r.parameters, r.step_ms,
      r.step_ms_min, r.step_ms_max, r.tokens_per_s, r.tflops_per_gpu, r.mfu, r.mem_peak_gib, r.time_to_first_step_s,
      r.first_loss, r.last_loss);
  nlohmann::json line = {{"model", config.model.preset},
                         {"device", r.device},
                         {"world_size", r.world_size},
                         {"micro_batch_size", t.micro_batch_size},
                         {"global_batch_size", t.global_batch_size},
                         {"seq_length", t.seq_length},
                         {"parameters", r.parameters},
                         {"step_ms", r.step_ms},
                         {"tokens_per_s", r.tokens_per_s},
                         {"tflops_per_gpu", r.tflops_per_gpu},
                         {"mfu", r.mfu},
                         {"mem_peak_gib", r.mem_peak_gib},
                         {"time_to_first_step_s", r.time_to_first_step_s}};
  return text + line.dump() + "\n";
}

}  // namespace primus
