// The pretraining loop: data -> micro-batches with gradient accumulation -> clip -> AdamW, with logging,
// evaluation, checkpoints, resume and a generated sample at the end.
#include "train/pretrain.h"

#include <omp.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/convert.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "data/blended_dataset.h"
#include "data/loader.h"
#include "data/prefetch_loader.h"
#include "data/text_corpus.h"
#include "data/tokenizer.h"
#include "observe/metric_sinks.h"
#include "ops/ops.h"
#include "ops/profile.h"
#include "optim/lr_schedule.h"
#include "train/sampling.h"
#include "train/checkpoint_progress.h"
#include "train/checkpoint_saver.h"
#include "train/fp8_training.h"
#include "train/memory_report.h"
#include "train/moe_routing.h"
#include "train/pipeline_step.h"
#include "train/signals.h"
#include "train/step_monitor.h"
#include "train/run_schedule.h"
#include "train/train_step.h"
#include "parallel/parallel_dims.h"

namespace primus {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Megatron's padding: the tokenizer's vocabulary rounded up to a multiple of make_vocab_size_divisible_by x
// tensor_model_parallel_size, so that it splits evenly over the tensor-parallel ranks. A vocab_size in the config
// is taken as is (ParallelDims checks that tp divides it).
ModelArgs resolve_vocab(ModelArgs model, const Tokenizer& tokenizer, int64_t tensor_parallel) {
  if (model.vocab_size == 0) {
    model.vocab_size = padded_vocab_size(tokenizer.vocab_size(), model.make_vocab_size_divisible_by * tensor_parallel);
  } else if (model.vocab_size < tokenizer.vocab_size()) {
    throw UsageError(fmt::format("[config] vocab_size {} is smaller than the {} tokenizer's {} tokens",
                                 model.vocab_size, tokenizer.name(), tokenizer.vocab_size()));
  }
  return model;
}

// Training and validation samples: mock tokens, Megatron indexed datasets (one prefix or a weighted blend,
// read through GPTDataset), or windows of text files split by `split`.
struct DataSources {
  TokenCorpus corpus;                         // text input only: the sources below view its tokens
  std::shared_ptr<const SampleSource> train;
  std::shared_ptr<const SampleSource> valid;  // null when evaluation has no data
  bool thread_safe = false;                   // the sources may be read from a prefetch thread
};

// Packed-document switches need EOD-separated documents; an indexed dataset preprocessed without --append-eod
// has none, and the switches would silently do nothing.
void check_documents_end_with_eod(const TrainingArgs& t, const PackingOptions& packing) {
  if (!packing.any()) return;
  const std::vector<std::string> missing = datasets_without_eod(t.data_path, packing.eod_id);
  if (missing.empty()) return;
  throw UsageError(fmt::format("[config] {}: data_path {} has no document ending with the end-of-document id {} among "
                               "its first sequences (preprocessed without --append-eod?); the packed-document "
                               "switches need EOD-separated documents",
                               packing.first_key(), missing.front(), packing.eod_id));
}

// model_vocab_size: indexed datasets check every token id against it as samples are read.
DataSources make_data(const TrainingArgs& t, const Tokenizer& tokenizer, const PackingOptions& packing,
                      int64_t model_vocab_size) {
  DataSources d;
  const bool evaluating = t.eval_interval > 0 && t.eval_iters > 0;
  if (t.mock_data) {
    spdlog::info("data: mock random tokens (mock_data: true)");
    d.train = std::make_shared<MockTokens>(tokenizer.vocab_size(), t.seq_length, static_cast<uint64_t>(t.seed));
    d.valid = std::make_shared<MockTokens>(tokenizer.vocab_size(), t.seq_length, static_cast<uint64_t>(t.seed) + 1);
    d.thread_safe = true;
    return d;
  }
  if (names_indexed_datasets(t.data_path)) {
    if (t.seed < 0 || t.seed > 0xFFFFFFFFll) {
      throw UsageError(fmt::format("[config] seed: {} is outside [0, 2^32), which Megatron's dataset shuffle needs", t.seed));
    }
    check_documents_end_with_eod(t, packing);
    GPTDatasetConfig config{.seq_length = t.seq_length, .seed = static_cast<uint32_t>(t.seed), .split = t.split,
                            .cache_dir = "", .use_cache = true, .tokenizer = tokenizer.name(),
                            .vocab_size = model_vocab_size};
    // Megatron's sample counts: every training step, and every evaluation of the run.
    d.train = build_gpt_data(t.data_path, kSplitTrain, t.train_iters * t.global_batch_size, config);
    if (evaluating) {
      const int64_t valid_samples = (t.train_iters / t.eval_interval + 1) * t.eval_iters * t.global_batch_size;
      d.valid = build_gpt_data(t.data_path, kSplitValid, valid_samples, config);
    }
    d.thread_safe = true;
    spdlog::info("data: indexed datasets {} (split {})", fmt::join(t.data_path, " "), t.split);
    return d;
  }
  d.corpus = load_text_corpus(t.data_path, tokenizer);
  const TokenRange train = split_range(d.corpus.num_tokens(), t.split, kSplitTrain);
  const TokenRange valid = split_range(d.corpus.num_tokens(), t.split, kSplitValid);
  spdlog::info("data: {} text documents, {} tokens; train {} tokens, valid {} tokens (split {})",
               d.corpus.documents.size(), d.corpus.num_tokens(), train.size(), valid.size(), t.split);
  // A data-only seed, so the shuffle never repeats another stream derived from the run's seed.
  d.train = std::make_shared<ShuffledWindows>(d.corpus.slice(train), t.seq_length,
                                              Rng::mix(static_cast<uint64_t>(t.seed) ^ 0xDA7A));
  if (evaluating) {
    if (valid.size() > t.seq_length) {
      d.valid = std::make_shared<SequentialWindows>(d.corpus.slice(valid), t.seq_length);
    } else {
      spdlog::warn("evaluation is off: the validation split has {} tokens, fewer than seq_length + 1 = {}",
                   valid.size(), t.seq_length + 1);
    }
  }
  return d;
}

// Training micro-batches in sample order, prefetched on a thread when the source allows it; this rank's part of
// each (BatchSplit).
class MicroBatchStream {
 public:
  MicroBatchStream(const DataSources& data, const TrainingArgs& t, int64_t consumed, const PackingOptions& packing,
                   BatchSplit split)
      : split_(std::move(split)) {
    if (data.thread_safe) {
      prefetch_ = std::make_unique<PrefetchLoader>(*data.train, t.micro_batch_size, t.seq_length, consumed,
                                                   kPrefetchDepth, packing, split_.shard);
    } else {
      direct_ =
          std::make_unique<BatchLoader>(*data.train, t.micro_batch_size, t.seq_length, consumed, packing, split_.shard);
    }
  }
  std::vector<Batch> next_global_batch(int64_t micro_batches) {
    std::vector<Batch> batches;
    for (int64_t i = 0; i < micro_batches; ++i) {
      batches.push_back(split_.local(prefetch_ ? prefetch_->next() : direct_->next()));
    }
    return batches;
  }
  int64_t consumed_samples() const { return prefetch_ ? prefetch_->consumed_samples() : direct_->consumed_samples(); }

 private:
  static constexpr int64_t kPrefetchDepth = 4;  // micro-batches read ahead
  BatchSplit split_;
  std::unique_ptr<PrefetchLoader> prefetch_;
  std::unique_ptr<BatchLoader> direct_;
};

// Copies the log into the run directory for as long as the run lasts (a second run in the same process
// logs to its own file only).
class RunLogSink {
 public:
  explicit RunLogSink(const std::string& path)
      : sink_(std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false)) {
    spdlog::default_logger()->sinks().push_back(sink_);
    // Every line reaches the file at once: a run killed hard (SIGKILL, OOM) still leaves its log up to the end.
    spdlog::default_logger()->flush_on(spdlog::level::trace);
  }
  ~RunLogSink() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  RunLogSink(const RunLogSink&) = delete;
  RunLogSink& operator=(const RunLogSink&) = delete;

 private:
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> sink_;
};

// The run itself; `plan` is set as soon as the memory table is known, for run_pretrain's out-of-memory message.
int run_training(const ExperimentConfig& config, const RunOptions& options, std::optional<MemoryPlan>& plan) {
  const Clock::time_point start = Clock::now();
  const TrainingArgs& t = config.train;
  const std::string run_dir = config.run_dir();
  // The torchrun environment of a multi-process job (primus-cli direct --nproc-per-node, Slurm), or a world of
  // one. Rank 0 writes the run's files and metrics; every rank logs to its own file in the run directory.
  const DistributedEnv env = DistributedEnv::from_environment();
  const int rank = env.rank;
  const bool rank0 = rank == 0;
  fs::create_directories(run_dir + "/logs");
  const RunLogSink log_sink(rank0 ? run_dir + "/logs/train.log" : fmt::format("{}/logs/rank{}.log", run_dir, rank));
  if (rank0) write_file_atomic(run_dir + "/config.yaml", config.effective_yaml);
  spdlog::info("run directory: {}", fs::absolute(run_dir).lexically_normal().string());
  const Device device = select_device(t.device, env.local_rank);
  if (device.is_cpu()) {
    spdlog::info("device: cpu ({} OpenMP threads)", omp_get_max_threads());
  } else {
    spdlog::info("device: {}", device.str());
  }
  // The dtype refusals (bf16 on the CPU; fp8 on every device for now) before any tokenizer or data is read.
  (void)compute_dtype(t, device);
  if (t.deterministic_mode) {
    ops::set_deterministic(device, true);
    spdlog::info("deterministic_mode: ops that sum with atomics are replaced; the run repeats bit for bit");
  }

  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(t.tokenizer_type, t.tokenizer_model);
  const ModelArgs model_args = resolve_vocab(config.model, *tokenizer, t.tensor_model_parallel_size);
  const PackingOptions packing = packing_options(t, *tokenizer);
  if (packing.any()) {
    spdlog::info("packed documents (EOD id {}): reset_position_ids {}, reset_attention_mask {}, eod_mask_loss {}",
                 packing.eod_id, packing.reset_position_ids, packing.reset_attention_mask, packing.eod_mask_loss);
  }
  if (packing.reset_attention_mask && !device.is_cpu() && t.bf16) {
    spdlog::warn("reset_attention_mask: bf16 attention runs on the simple native CUDA kernels instead of cuDNN "
                 "(exact, but much slower; docs/training.md)");
  }
  const std::shared_ptr<Communicator> world = connect_world(env, device, t);
  const ProcessGroups groups = make_process_groups(world, model_args, t);
  DataSources data = make_data(t, *tokenizer, packing, model_args.vocab_size);
  plan = plan_memory(model_args, t, device, compute_dtype(t, device), groups.dims.coord(world->rank()).pp);
  add_device_memory(*plan, device);
  log_memory_plan(*plan);
  check_memory_plan_fits(*plan);
  const std::unique_ptr<Model> model_owner = make_parallel_model(model_args, t, device, groups);
  Model& model = *model_owner;
  model.set_recompute(RecomputeConfig::from(t));
  const Pipeline pipeline = make_pipeline(groups, !model_args.untie_embeddings_and_output_weights);
  check_pipeline_schedule(pipeline, micro_batches_per_step(t));
  const std::unique_ptr<DataParallel> dp = make_data_parallel(groups, model, t);
  AdamW optimizer = make_optimizer(model, *dp, t);
  if (world->size() > 1) {
    spdlog::info("distributed: rank {} of {} ({}), {}, {}", rank, world->size(), world->backend_name(),
                 groups.dims.describe(), data_parallel_description(t));
  }
  const LrSchedule schedule{t.lr, t.min_lr, t.lr_warmup_iters, t.lr_decay_iters, t.lr_decay_style};

  const std::string save_dir = t.save.empty() ? run_dir + "/checkpoints" : t.save;
  const std::string load_dir = t.load.empty() ? save_dir : t.load;
  TrainerState state;
  state.seed = t.seed;
  const CheckpointProgressFn checkpoint_bars = checkpoint_progress_bars(options.progress);
  std::optional<std::string> latest;
  if (!t.load.empty() && fs::absolute(load_dir).lexically_normal() != fs::absolute(save_dir).lexically_normal()) {
    // An explicit load elsewhere must name a checkpoint: training from scratch instead would be silent.
    try {
      latest = resolve_checkpoint_dir(load_dir);
    } catch (const UsageError& error) {
      throw UsageError(fmt::format("[config] load: {}", error.what()));
    }
  } else {
    latest = find_latest_checkpoint(load_dir);
  }
  if (latest) {
    state = load_checkpoint(*latest, model, optimizer, checkpoint_bars);
    if (state.seed != t.seed) {
      throw UsageError(fmt::format("[config] seed is {} but checkpoint {} was trained with seed {}", t.seed, *latest, state.seed));
    }
    spdlog::info("resumed from {} at iteration {} ({} samples consumed)", *latest, state.iteration,
                 state.consumed_train_samples);
    if (state.iteration > t.train_iters) {  // as in Megatron the run then ends at once, but not as if it had trained
      spdlog::warn("{}: iteration {} is beyond train_iters {}: nothing to train; raise train_iters to continue",
                   *latest, state.iteration, t.train_iters);
    }
  } else if (!t.pretrained_checkpoint.empty()) {
    load_hf_weights(t.pretrained_checkpoint, model);
    spdlog::info("initial weights from {}", t.pretrained_checkpoint);
  } else {
    model.params().initialize(static_cast<uint64_t>(t.seed));
  }
  broadcast_tied_embedding(model, pipeline);  // the last stage's copy starts as the first stage's embedding
  weights_ready(model, *dp);
  const std::shared_ptr<Fp8Scaling> fp8 = enable_fp8(model, t, device, groups);
  restore_fp8_scaling(fp8.get(), state.fp8_scaling, latest.has_value(), !pipeline.active());
  spdlog::info("model: {} layers, hidden {}, heads {}/{} (q/kv), head dim {}, ffn {}, vocab {}, {} parameters",
               model_args.num_layers, model_args.hidden_size, model_args.num_attention_heads,
               model_args.num_query_groups, model_args.kv_channels, model_args.ffn_hidden_size, model_args.vocab_size,
               model.params().numel());

  const BatchSplit split = batch_split(groups);
  MicroBatchStream loader(data, t, state.consumed_train_samples, packing, split);
  // Metric sinks on rank 0 only: every rank computes the same global loss and norm.
  MetricSinks sinks;
  if (rank0) {
    sinks.add(make_console_sink());
    sinks.add(make_jsonl_sink(run_dir + "/metrics.jsonl", state.iteration));
    if (!t.tensorboard_dir.empty()) {
      sinks.add(make_tensorboard_sink(
          t.tensorboard_dir,
          TensorBoardSwitches{.learning_rate = t.log_learning_rate_to_tensorboard, .throughput = t.log_throughput,
                              .timers = t.log_timers_to_tensorboard, .memory = t.log_memory_to_tensorboard,
                              .validation_ppl = t.log_validation_ppl_to_tensorboard}));
    }
    if (!t.mlflow_tracking_dir.empty()) {
      auto mlflow = std::make_unique<MlflowRun>(MlflowRunOptions{
          .tracking_dir = t.mlflow_tracking_dir, .experiment_name = t.mlflow_experiment_name,
          .run_name = config.exp_name, .user = config.user_name, .resume_file = run_dir + "/mlflow_run.json",
          .keep_through_step = state.iteration, .params = mlflow_config_params(config.effective_yaml),
          .tags = {{"primus.run_dir", fs::absolute(run_dir).string()}}});
      spdlog::info("MLflow: {} run {}", mlflow->reopened() ? "continuing" : "new", mlflow->run_path());
      sinks.add(make_mlflow_sink(std::move(mlflow)));
    }
  }
  if (rank0 && fs::is_directory(save_dir)) {
    // Saves that crashed (a kill, a full disk) leave temporaries that can be as large as a checkpoint.
    const std::vector<std::string> stale = remove_stale_temporaries(save_dir);
    if (!stale.empty()) {
      spdlog::warn("removed {} left in {} by interrupted saves: {}", stale.size() == 1 ? "a folder" : "folders",
                   save_dir, fmt::join(stale, ", "));
    }
  }
  CheckpointSaver saver(model, optimizer, *dp,
                        CheckpointSaverOptions{.save_dir = save_dir,
                                               .config_yaml = config.effective_yaml,
                                               .async_save = t.async_save,
                                               .retention = {.keep_latest_k = t.keep_latest_k,
                                                             .keep_every = t.keep_interval},
                                               .progress = checkpoint_bars});
  // An iteration is saved once: a stop signal on a save_interval step, or a run resumed at its last iteration,
  // does not save it again.
  int64_t saved_iteration = latest ? state.iteration : -1;
  auto save = [&]() {
    if (saved_iteration == state.iteration) return;
    saved_iteration = state.iteration;
    // Weights that overflowed (an update with a huge learning rate) would be saved as the latest checkpoint.
    double local = 0.0;
    for (const FlatRange& r : dp->shard_ranges()) {
      for (const Tensor& view : weight_views(model.params(), optimizer, r.begin, r.end)) local += ops::sum_squares(view);
    }
    if (dp->any(!std::isfinite(local))) {
      throw RuntimeError(fmt::format("the weights are not finite (inf or NaN) at iteration {}: not saving them (the "
                                     "previous checkpoint, if any, stays the latest); a smaller lr or clip_grad helps",
                                     state.iteration));
    }
    state.consumed_train_samples = loader.consumed_samples();
    state.optimizer_steps = optimizer.steps_taken();
    state.fp8_scaling = fp8 ? fp8_records_of_all_stages(*fp8, *groups.pp) : std::vector<Fp8ScalingRecord>();
    // Every rank writes its pieces in parallel (its data-parallel shard of its tensor-parallel part); rank 0
    // commits once all are on disk (a world of one writes the single-file format Hugging Face reads).
    saver.save(state);
  };

  const bool profile_this_rank =
      t.profile && std::find(t.profile_ranks.begin(), t.profile_ranks.end(), rank) != t.profile_ranks.end();
  const RunSchedule when(t, data.valid != nullptr, profile_this_rank);
  SlowStepMonitor slow_steps(rank);
  install_stop_handlers();
  const double flops_per_token = model_family(model_args).flops_per_token(model_args, t.seq_length);
  double window_loss = 0.0, window_s = 0.0;
  int64_t window_steps = 0, window_tokens = 0;
  // Between log lines, on a terminal only (elsewhere the log lines are the progress): step of train_iters,
  // steps/s and ETA. Log lines erase it first (observe/progress.h).
  std::optional<ProgressBar> step_bar;
  if (t.log_interval > 1) {
    step_bar.emplace(ProgressSpec{.label = "train",
                                  .total = t.train_iters,
                                  .start = state.iteration,
                                  .count_name = "steps",
                                  .line_interval_s = -1.0,
                                  .keep = false},
                     options.progress);
  }
  while (state.iteration < t.train_iters) {
    const int64_t step = state.iteration + 1;
    const double lr = schedule.at(step);
    if (when.profile_at(step) && !ops::Trace::active()) ops::Trace::start(device);
    const bool log_step = when.log_at(step);
    const Clock::time_point step_start = Clock::now();
    std::vector<Batch> batches;
    {
      const ops::ProfileScope scope("data");
      batches = loader.next_global_batch(micro_batches_per_step(t));
    }
    const double data_ms = 1000.0 * seconds_since(step_start);
    StepTimes times;
    const StepResult r = train_step(model, optimizer, *dp, batches, t, lr, log_step ? &times : nullptr, &pipeline, fp8.get());
    const double step_s = seconds_since(step_start);
    if (ops::Trace::active() && when.profile_ends_after(step)) {
      const std::string trace_path = fmt::format("{}/profile/trace_rank{}.json", run_dir, rank);
      std::filesystem::create_directories(run_dir + "/profile");
      const int64_t scopes = ops::Trace::stop_and_write(trace_path);
      spdlog::info("profile: iterations {}..{} ({} scopes) written to {} (open in https://ui.perfetto.dev)",
                   t.profile_step_start, step, scopes, trace_path);
    }
    slow_steps.add(step, 1000.0 * step_s);
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
      throw RuntimeError(fmt::format("iteration {}: loss {} / grad norm {} is not finite; stopping without saving",
                                     step, r.loss, r.grad_norm));
    }
    state.iteration = step;
    window_loss += r.loss;
    window_s += step_s;
    window_tokens += t.global_batch_size * t.seq_length;
    ++window_steps;

    std::optional<double> eval_loss;
    if (when.eval_at(step)) {
      if (fp8) fp8->pause_input_recording(true);
      eval_loss = evaluate(model, *dp, *data.valid, t, split, packing, &pipeline);
      if (fp8) fp8->pause_input_recording(false);
    }
    if (log_step || eval_loss) {
      StepMetrics m;
      m.step = step;
      m.train_iters = t.train_iters;
      m.loss = window_loss / static_cast<double>(window_steps);
      m.lr = lr;
      m.grad_norm = r.grad_norm;
      m.tokens_per_s = static_cast<double>(window_tokens) / window_s;
      m.step_ms = 1000.0 * window_s / static_cast<double>(window_steps);
      m.tflops_per_gpu = m.tokens_per_s * flops_per_token / static_cast<double>(world->size()) / 1e12;
      m.consumed_samples = loader.consumed_samples();
      m.elapsed_s = seconds_since(start);
      if (!device.is_cpu()) m.mfu = m.tflops_per_gpu / kPeakBf16Tflops;
      m.mem_peak_gib = device_peak_memory_gib(device);
      m.eval_loss = eval_loss;
      if (log_step) m.phases = StepMetrics::Phases{data_ms, times.forward_ms, times.backward_ms, times.optimizer_ms};
      if (model.args().num_experts > 0) {  // collective: every rank logs the same steps
        m.moe = r.moe ? *r.moe : reduce_moe_routing(model, *dp, &pipeline);
        m.moe->per_layer_tensorboard = t.moe_per_layer_logging;
      }
      if (model.args().mtp_num_layers > 0) m.mtp_losses = reduce_mtp_losses(model, *dp);
      if (const int64_t non_finite = fp8 ? fp8->take_non_finite() : 0; non_finite > 0) {
        spdlog::warn("fp8: {} amax{} since the last log line were NaN or infinite; their scales kept their previous "
                     "values (delayed) or became 1 (current scaling)",
                     non_finite, non_finite == 1 ? "" : "es");
      }
      sinks.write(m);
      window_loss = window_s = 0.0;
      window_steps = window_tokens = 0;
    }
    saver.poll();
    if (when.save_at(step)) save();
    if (step_bar) step_bar->update(step);
    // Every rank stops at the same step when any rank saw a signal, so they save one consistent checkpoint.
    if (dp->any(stop_requested())) {
      const int signal = stop_requested() ? stop_signal() : SIGTERM;
      spdlog::warn("signal {} received{}: saving a checkpoint at iteration {} and stopping", signal,
                   stop_requested() ? "" : " by another rank", step);
      save();
      saver.wait();
      sinks.finish(MlflowRunStatus::kKilled);
      return 128 + signal;
    }
  }
  if (step_bar) step_bar->finish();
  save();
  saver.wait();
  // Rank 0 shows the sample; under FSDP, tensor or expert parallelism every rank runs the same forwards, whose
  // weight gathers, tensor-parallel sums and token all-to-alls are collectives (the sampling is seeded, so the ranks
  // draw the same tokens).
  // Through a pipeline every stage runs its chunks (the last stage broadcasts the logits to the others).
  if (t.sample_length > 0 && pipeline.active()) {
    const std::string text = generate_sample(
        [&](const std::vector<int32_t>& context) { return pipeline_next_token_logits(model, pipeline, context); },
        *tokenizer, t.sample_prompt, t.sample_length, t.seq_length, static_cast<uint64_t>(t.seed));
    if (rank0) spdlog::info("sample after {} iterations:\n{}{}", state.iteration, t.sample_prompt, text);
  } else if (t.sample_length > 0 && (rank0 || dp->fsdp() != nullptr || groups.tp->size() > 1 ||
                                     groups.ep->size() > 1)) {
    const std::string text = generate_sample(model, *tokenizer, t.sample_prompt, t.sample_length, t.seq_length,
                                             static_cast<uint64_t>(t.seed));
    if (rank0) spdlog::info("sample after {} iterations:\n{}{}", state.iteration, t.sample_prompt, text);
  }
  spdlog::info("done: {} iterations in {:.1f} s; run directory {}", state.iteration, seconds_since(start), run_dir);
  sinks.finish(MlflowRunStatus::kFinished);
  return kExitOk;
}

}  // namespace

int run_pretrain(const ExperimentConfig& config, const RunOptions& options) {
  std::optional<MemoryPlan> plan;
  try {
    return run_training(config, options, plan);
  } catch (const OutOfMemoryError& error) {
    if (!plan) throw;
    throw OutOfMemoryError(out_of_memory_message(error, *plan), error.device(), error.requested_bytes());
  }
}

}  // namespace primus
