#include "train/train_step.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/host_memory.h"
#include "data/tokenizer.h"
#include "ops/ops.h"
#include "ops/profile.h"
#include "ops/scope_tracking.h"
#include "train/fp8_training.h"
#include "train/pipeline_step.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#endif

namespace primus {

int64_t micro_batches_per_step(const TrainingArgs& t) {
  return t.global_batch_size / (t.micro_batch_size * t.data_parallel_size);
}

Batch BatchSplit::local(const Batch& full) const {
  if (cp.size() == 1) return full;
  PRIMUS_CHECK(
      !full.position_ids.defined() && !full.segment_start.defined(),
      "[config] reset_position_ids and reset_attention_mask are not implemented with context_parallel_size > 1");
  Batch part;
  part.tokens = cp.local_chunks(full.tokens);
  part.labels = cp.local_chunks(full.labels);
  return part;
}

BatchSplit batch_split(const ProcessGroups& groups) {
  return BatchSplit{DataShard{groups.dp->rank(), groups.dp->size()},
                    groups.cp->size() > 1 ? ContextParallelGroup(groups.cp) : ContextParallelGroup()};
}

StepResult train_step(Model& model, AdamW& optimizer, DataParallel& dp, const std::vector<Batch>& batches,
                      const TrainingArgs& t, double lr, StepTimes* times, const Pipeline* pipeline,
                      Fp8Scaling* fp8) {
  PRIMUS_CHECK(!batches.empty(), "a training step without micro-batches");
  // The global batch's token count scales every micro-batch's gradient, so the reduced sum is the gradient of
  // the global mean whatever the split of tokens over ranks.
  int64_t local_tokens = 0;
  for (const Batch& batch : batches) local_tokens += counted_tokens(batch.labels);
  const int64_t counted = dp.global_tokens(local_tokens);
  PRIMUS_CHECK(counted > 0, "a global batch without any token to predict");
  const float grad_scale = static_cast<float>(1.0 / static_cast<double>(counted));
  Backend& device = backend_for(model.device());
  // Marks between phases, only when the caller wants the times: [start, after forward 1, after backward 1, ...].
  std::vector<std::unique_ptr<DeviceMark>> marks;
  auto mark = [&] {
    if (times != nullptr) marks.push_back(device.mark());
  };
  mark();
  dp.zero_grads();
  model.clear_moe_routing();  // so that it holds this step's routing
  model.clear_mtp_losses();   // likewise the multi-token prediction losses
  Tensor loss_sum = ops::zeros({1}, DType::kF32, model.device());  // summed on the device: no wait per micro-batch
  const bool pipelined = pipeline != nullptr && pipeline->active();
  if (pipelined) {
    {
      const ops::ProfileScope scope("pipeline");
      pipeline_forward_backward(model, *pipeline, batches, grad_scale, loss_sum);
    }
    mark();
    // After the flush (Megatron's finalize_model_grads): the tied copies' gradients summed, then the data-parallel
    // reduction of the whole buffer at once.
    sum_tied_embedding_grads(model, *pipeline);
    dp.before_backward(true);
    if (const GradsReadyFn ready = dp.grads_ready_hook(true)) ready(0, model.params().numel());
    dp.after_backward(true);
    pipeline->stages->all_reduce(loss_sum, ReduceOp::kSum);  // only the last stage's is not zero
    mark();
  }
  for (size_t i = 0; i < batches.size() && !pipelined; ++i) {
    const Batch& batch = batches[i];
    std::unique_ptr<MicroBatchContext> ctx;
    dp.begin_micro_batch();
    {
      const ops::ProfileScope scope("forward");
      ctx = model.forward(ops::to_device(batch.tokens, model.device()), ops::to_device(batch.labels, model.device()),
                          grad_scale, loss_sum, packed_on(batch, model.device()));
    }
    mark();
    {
      const ops::ProfileScope scope("backward");
      // Only the backward that completes the accumulated gradients reduces them (Megatron's no_sync for the
      // micro-batches before it).
      const bool last = i + 1 == batches.size();
      dp.before_backward(last);
      model.backward(*ctx, dp.grads_ready_hook(last));
      dp.after_backward(last);
    }
    mark();
  }
  StepResult result;
  result.tokens = counted;
  {
    const ops::ProfileScope scope("optimizer");
    dp.sum_tensor_parallel_grads();
    const GradClip clip = clip_for_norm(dp.grad_norm(), t.clip_grad);
    result.grad_norm = clip.norm;
    dp.sum_losses(loss_sum);
    result.loss = static_cast<double>(ops::to_device(loss_sum, kCpuDevice).f32()[0]) / static_cast<double>(counted);
    if (dp.sharded()) {
      // Each rank updates its shards (and their compute copy); the weights the model reads are then gathered
      // (FSDP gathers its units' compute weights itself).
      optimizer.step(model.params(), lr, clip.scale, model.compute_weights());
      Tensor* compute = model.compute_weights();
      dp.after_optimizer(compute != nullptr ? *compute : model.params().flat_params());
    } else if (UnitResidency* residency = dp.residency(); residency != nullptr) {
      optimizer.begin_step();
      residency->update_pieces([&](FlatRange range, const Tensor& grads, const Tensor& compute) {
        optimizer.update(model.params(), range, grads, compute, lr, clip.scale);
      });
    } else {
      optimizer.step(model.params(), lr, clip.scale, model.compute_weights());
    }
    if (model.args().moe_router_enable_expert_bias) {
      result.moe = reduce_moe_routing(model, dp, pipelined ? pipeline : nullptr);
      update_expert_bias(model, *result.moe, t.moe_router_bias_update_rate);
    }
    fp8_end_step(fp8, dp);
  }
  mark();
  if (times != nullptr) {
    *times = StepTimes();
    for (size_t i = 0; i + 2 < marks.size(); i += 2) {
      times->forward_ms += device.elapsed_ms(*marks[i], *marks[i + 1]);
      times->backward_ms += device.elapsed_ms(*marks[i + 1], *marks[i + 2]);
    }
    times->optimizer_ms = device.elapsed_ms(*marks[marks.size() - 2], *marks.back());
  }
  return result;
}

double evaluate(Model& model, DataParallel& dp, const SampleSource& source, const TrainingArgs& t,
                const BatchSplit& split, const PackingOptions& packing, const Pipeline* pipeline) {
  BatchLoader loader(source, t.micro_batch_size, t.seq_length, 0, packing, split.shard);
  const int64_t micro_batches = t.eval_iters * micro_batches_per_step(t);
  double loss_sum = 0.0;
  int64_t tokens = 0;
  if (pipeline != nullptr && pipeline->active()) {
    for (int64_t step = 0; step < t.eval_iters; ++step) {
      std::vector<Batch> batches;
      for (int64_t i = 0; i < micro_batches_per_step(t); ++i) batches.push_back(split.local(loader.next()));
      const LossSum s = pipeline_evaluate(model, *pipeline, batches);
      loss_sum += s.loss_sum;
      tokens += s.tokens;
    }
    return dp.sum(loss_sum) / static_cast<double>(std::max<int64_t>(dp.global_tokens(tokens), 1));
  }
  for (int64_t i = 0; i < micro_batches; ++i) {
    const Batch batch = split.local(loader.next());
    LossSum s = model.evaluate(ops::to_device(batch.tokens, model.device()), ops::to_device(batch.labels, model.device()),
                               packed_on(batch, model.device()));
    loss_sum += s.loss_sum;
    tokens += s.tokens;
  }
  return dp.sum(loss_sum) / static_cast<double>(std::max<int64_t>(dp.global_tokens(tokens), 1));
}

int64_t ddp_bucket_size(const TrainingArgs& t) {
  return t.ddp_bucket_size > 0 ? t.ddp_bucket_size : std::max<int64_t>(40'000'000, 1'000'000 * t.data_parallel_size);
}

std::shared_ptr<Communicator> connect_world(const DistributedEnv& env, Device device, const TrainingArgs& t) {
  const auto timeout = std::chrono::duration_cast<DistributedTimeout>(
      std::chrono::duration<double, std::ratio<60>>(t.distributed_timeout_minutes));
  return make_world_communicator(env, device, timeout);
}

ParallelDims parallel_dims_for(const ModelArgs& model, const TrainingArgs& t, int world_size) {
  return ParallelDims::make(
      world_size,
      ParallelSizes{.tp = static_cast<int>(t.tensor_model_parallel_size),
                    .pp = static_cast<int>(t.pipeline_model_parallel_size),
                    .cp = static_cast<int>(t.context_parallel_size),
                    .ep = static_cast<int>(t.expert_model_parallel_size),
                    .sequence_parallel = t.sequence_parallel,
                    .layers_per_virtual_stage = t.num_layers_per_virtual_pipeline_stage,
                    .virtual_stages = t.num_virtual_stages_per_pipeline_rank,
                    .first_stage_layers = t.decoder_first_pipeline_num_layers,
                    .last_stage_layers = t.decoder_last_pipeline_num_layers},
      ParallelModelShape{.num_attention_heads = model.num_attention_heads,
                         .num_query_groups = model.num_query_groups,
                         .ffn_hidden_size = model.ffn_hidden_size,
                         .vocab_size = model.vocab_size,
                         .num_layers = model.num_layers,
                         .seq_length = t.seq_length,
                         .micro_batch_size = t.micro_batch_size,
                         .num_experts = model.num_experts});
}

std::vector<double> reduce_mtp_losses(const Model& model, DataParallel& dp) {
  const std::vector<LossSum> depths = model.mtp_losses();
  if (depths.empty()) return {};
  const int64_t d = static_cast<int64_t>(depths.size());
  Tensor sums = Tensor::empty({2 * d}, DType::kF32);  // Σ token losses, then counted tokens, per depth
  for (int64_t k = 0; k < d; ++k) {
    sums.f32()[k] = static_cast<float>(depths[static_cast<size_t>(k)].loss_sum);
    sums.f32()[d + k] = static_cast<float>(depths[static_cast<size_t>(k)].tokens);
  }
  Tensor reduced = ops::to_device(sums, model.device());
  dp.sum_losses(reduced);
  sums = ops::to_device(reduced, kCpuDevice);
  std::vector<double> means;
  for (int64_t k = 0; k < d; ++k) means.push_back(sums.f32()[k] / std::max(1.0f, sums.f32()[d + k]));
  return means;
}

ProcessGroups make_process_groups(std::shared_ptr<Communicator> world, const ModelArgs& model, const TrainingArgs& t) {
  // Refused before the memory plan and the model.
  if (const std::string why = mtp_layout_refusal(model, t.tensor_model_parallel_size, t.pipeline_model_parallel_size,
                                                 t.context_parallel_size, t.use_megatron_fsdp);
      !why.empty()) {
    throw UsageError("[config] " + why);
  }
  const ParallelDims dims = parallel_dims_for(model, t, world->size());
  if (dims.dp() != t.data_parallel_size) {
    throw UsageError(fmt::format("[distributed] the config was resolved for a data-parallel size of {} but the job "
                                 "has {} (WORLD_SIZE {})",
                                 t.data_parallel_size, dims.dp(), world->size()));
  }
  return ProcessGroups::build(std::move(world), dims);
}

std::unique_ptr<Model> make_parallel_model(const ModelArgs& args, const TrainingArgs& t, Device device,
                                           const ProcessGroups& groups) {
  // The ring runs beside data parallelism's collectives (on another thread or stream), and at dp 1 the cp group may
  // be the very communicator data parallelism reduces on: it gets a communicator of its own.
  ContextParallelGroup cp;
  if (groups.cp->size() > 1)
    cp = ContextParallelGroup(std::shared_ptr<Communicator>(groups.cp->split(0, groups.cp->rank())));
  PipelineStage pipeline;
  if (groups.dims.pp() > 1) {
    pipeline.stage = groups.dims.coord(groups.world->rank()).pp;
    pipeline.stages = groups.dims.pp();
    for (int chunk = 0; chunk < groups.dims.vpp(); ++chunk) {
      const LayerRange layers = groups.dims.layers(pipeline.stage, chunk);
      pipeline.chunks.push_back({layers.begin, layers.end});
    }
  }
  // The experts' all-to-alls run inside forward and backward, beside data parallelism's collectives; at ep = dp × cp
  // the ep group is the very communicator those reduce on, so it gets one of its own too.
  ExpertParallelGroup ep;
  if (groups.ep->size() > 1)
    ep = ExpertParallelGroup(std::shared_ptr<Communicator>(groups.ep->split(0, groups.ep->rank())));
  return make_model(args, t.seq_length, device, compute_dtype(t, device),
                    ModelParallel{TensorParallelGroup(groups.tp), std::move(cp), groups.dims.sequence_parallel(),
                                  std::move(pipeline), std::move(ep)});
}

std::unique_ptr<DataParallel> make_data_parallel(const ProcessGroups& groups, Model& model,
                                                 const TrainingArgs& t) {
  const std::string& strategy = t.data_parallel_sharding_strategy;
  const bool fully_sharded = t.use_megatron_fsdp && (strategy == "optim_grads" || strategy == "optim_grads_params");
  DataParallelOptions options;
  options.distributed_optimizer = t.use_distributed_optimizer || (t.use_megatron_fsdp && strategy == "optim");
  options.overlap_grad_reduce = t.overlap_grad_reduce;
  options.bucket_size = ddp_bucket_size(t);
  options.overlap_param_gather = t.overlap_param_gather;
  options.units = model.param_units();
  options.compute_dtype = model.compute_dtype();
  options.tp = groups.tp;
  options.world = groups.world;
  options.tp_grad_sums = model.tensor_parallel_grad_sums();
  // What another rank of the tensor-parallel group holds too and counts: whole parameters (norms) on all but its
  // first rank, replicated key/value slices on all but their first replica.
  const ParamStore& params = model.params();
  if (groups.dims.pp() > 1) {
    options.model = groups.model;
    // The last stage's copy of a tied embedding: the first stage's is the one counted and saved.
    const bool last = groups.dims.is_last_stage(groups.world->rank());
    if (last && !model.args().untie_embeddings_and_output_weights) {
      const size_t i = params.index_of("model.embed_tokens.weight");
      options.copies.push_back({params.offset(i), params.offset(i) + shape_numel(params.specs()[i].shape)});
    }
  }
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSlice& slice = params.specs()[i].slice;
    if (slice.sliced() ? slice.replica == 0 : groups.tp->rank() == 0) continue;
    const int64_t begin = params.offset(i), end = begin + shape_numel(params.specs()[i].shape);
    if (!options.tp_duplicates.empty() && options.tp_duplicates.back().end == begin) {
      options.tp_duplicates.back().end = end;  // adjacent: one range
    } else {
      options.tp_duplicates.push_back({begin, end});
    }
  }
  options.expert_ranges = model.expert_ranges();
  options.expert_dp = groups.expert_dp;
  options.ep = groups.ep;
  if (fully_sharded) {
    options.fully_sharded = strategy == "optim_grads" ? FullyShardedDataParallel::Strategy::kOptimGrads
                                                      : FullyShardedDataParallel::Strategy::kOptimGradsParams;
  }
  if (t.overlap_param_gather && !options.distributed_optimizer && !fully_sharded) {
    throw UsageError("[config] overlap_param_gather: true needs sharded weights to gather: set "
                     "use_distributed_optimizer: true, or use_megatron_fsdp: true with a sharding strategy");
  }
  // One rank: gradients and the compute copy only while the step needs them. The distributed optimizer has nothing to
  // shard there (its one rank owns everything), so it gives way.
  if (groups.world->size() == 1 && !fully_sharded) {
    options.unit_residency = true;
    options.distributed_optimizer = false;
    options.overlap_param_gather = false;
    options.expert_weights = model.expert_weight_ranges();
  }
  return std::make_unique<DataParallel>(groups.dp_cp, model.params(), options);
}

std::string data_parallel_description(const TrainingArgs& t) {
  const std::string& strategy = t.data_parallel_sharding_strategy;
  if (t.use_megatron_fsdp && strategy == "optim_grads") return "FSDP optim_grads (ZeRO-2)";
  if (t.use_megatron_fsdp && strategy == "optim_grads_params") return "FSDP optim_grads_params (ZeRO-3)";
  if (t.use_distributed_optimizer || (t.use_megatron_fsdp && strategy == "optim")) return "distributed optimizer";
  return "replicated optimizer";
}

AdamW make_optimizer(Model& model, DataParallel& dp, const TrainingArgs& t) {
  const AdamWConfig config{t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay};
  FullyShardedDataParallel* fsdp = dp.fsdp();
  if (fsdp == nullptr) return AdamW(model.params(), config, dp.optimizer_ranges());
  return AdamW(model.params(), config, fsdp->owned(),
               PackedShards{fsdp->owned_offsets(), fsdp->master_shards(), fsdp->grad_shards(), fsdp->compute_shards()});
}

void weights_ready(Model& model, DataParallel& dp) {
  if (FullyShardedDataParallel* fsdp = dp.fsdp(); fsdp != nullptr) model.bind_units(fsdp->take_weights());
  if (UnitResidency* residency = dp.residency(); residency != nullptr) model.bind_units(residency->take_buffers());
  model.weights_changed();  // no-op once bound to FSDP's units or step-scoped buffers
  model.set_param_hooks(dp.param_hooks());
}

PackingOptions packing_options(const TrainingArgs& t, const Tokenizer& tokenizer) {
  PackingOptions packing{tokenizer.eod_id(), t.reset_position_ids, t.reset_attention_mask, t.eod_mask_loss};
  if (!packing.any() || packing.eod_id >= 0) return packing;
  const char* key = packing.first_key();
  throw UsageError(fmt::format("[config] {}: the {} tokenizer has no end-of-document (EOD) id to split documents at; "
                               "turn {} off or use a tokenizer with an EOS/EOD token",
                               key, tokenizer.name(), key));
}

PackedSequence packed_on(const Batch& batch, Device device) {
  PackedSequence packed;
  if (batch.position_ids.defined()) packed.position_ids = ops::to_device(batch.position_ids, device);
  if (batch.segment_start.defined()) packed.segment_start = ops::to_device(batch.segment_start, device);
  return packed;
}

Device select_device(const std::string& device_key, int local_rank) {
  if (device_key == "cpu") return kCpuDevice;
#if PRIMUS_WITH_CUDA
  std::string why;
  const int count = cuda_device_count(&why);
  if (count > 0) {
    if (local_rank >= count) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      throw UsageError(fmt::format("[distributed] LOCAL_RANK {} needs GPU {}, but only {} are visible "
                                   "(CUDA_VISIBLE_DEVICES={}); start at most {} processes per node",
                                   local_rank, local_rank, count, visible != nullptr ? visible : "unset", count));
    }
    start_cuda_backend(local_rank);
    return Device{DeviceType::kCuda, local_rank};
  }
  if (device_key == "cuda") throw UsageError(fmt::format("[config] device: cuda, but no CUDA device is usable: {}", why));
  spdlog::info("device auto: no usable CUDA device ({}), so the CPU", why);
#else
  if (device_key == "cuda") throw UsageError("[config] device: cuda, but this binary was built without CUDA");
#endif
  return kCpuDevice;
}

namespace {

// fp8 needs fp8 tensor cores: the CPU engine refuses it (unless PRIMUS_FP8_CPU_REFERENCE=1 asks for the reference
// path the tests check recipes with), and so does a GPU older than sm_90. On the GPU it waits for its first run on
// one (experiment.h). The refusals name fp8_format and the device.
void refuse_fp8(const TrainingArgs& t, Device device) {
  if (t.fp8_format.empty()) return;
  if (const std::string why = fp8_layout_refusal(t); !why.empty()) throw UsageError("[config] " + why);
  if (device.is_cpu()) {
    if (fp8_cpu_reference_requested()) return;
    throw UsageError(fmt::format("[config] fp8_format {}: {}; the CPU engine computes in fp32 (device {})",
                                 t.fp8_format, kFp8NeedsGpu, device.str()));
  }
#if PRIMUS_WITH_CUDA
  CudaDeviceInfo info;
  std::string why;
  if (cuda_device_info(device.index, &info, &why) && info.compute_major < 9) {
    throw UsageError(fmt::format("[config] fp8_format {}: {}; device {} is {} (sm_{}{})", t.fp8_format, kFp8NeedsGpu,
                                 device.str(), info.name, info.compute_major, info.compute_minor));
  }
#endif
}

}  // namespace

DType compute_dtype(const TrainingArgs& t, Device device) {
  refuse_fp8(t, device);
  if (!t.bf16) return DType::kF32;
  if (device.is_cpu()) {
    throw UsageError("[config] bf16: true needs a CUDA device; the CPU engine computes in fp32 (set bf16: false)");
  }
  return DType::kBF16;
}

double device_peak_memory_gib(Device device) {
#if PRIMUS_WITH_CUDA
  if (device.type == DeviceType::kCuda) {
    return static_cast<double>(start_cuda_backend(device.index).allocator().stats().peak_allocated_bytes) / (1ull << 30);
  }
#endif
  return static_cast<double>(host_memory_stats().peak_bytes) / (1ull << 30);
}

namespace {

struct PeakSite {
  size_t allocated = 0, request = 0;
  std::string scopes;
};
std::vector<PeakSite> g_peak_sites;    // the last few, the highest last
std::vector<PeakSite> g_memory_notes;  // note_device_memory's, in order

#if PRIMUS_WITH_CUDA
size_t g_peak_logged = 0;
bool g_tracing = false;

// Runs under the allocator's lock on every new peak: cheap unless the peak grew by 64 MiB since the last record.
void record_peak_site(size_t allocated, size_t request) {
  constexpr size_t kStep = size_t{64} << 20;
  if (allocated < g_peak_logged + kStep && request < kStep) return;
  g_peak_logged = allocated;
  if (g_peak_sites.size() == 8) g_peak_sites.erase(g_peak_sites.begin());
  g_peak_sites.push_back({allocated, request, ops::open_scopes()});
}
#endif

}  // namespace

void trace_device_memory_peaks(Device device) {
  const char* flag = std::getenv("PRIMUS_MEMORY_TRACE");
  if (flag == nullptr || std::string(flag) != "1" || device.is_cpu()) return;
#if PRIMUS_WITH_CUDA
  ops::track_open_scopes();
  start_cuda_backend(device.index).allocator().set_peak_observer(&record_peak_site);
  g_tracing = true;
#endif
}

void note_device_memory(Device device, const char* what) {
#if PRIMUS_WITH_CUDA
  if (g_tracing) g_memory_notes.push_back({start_cuda_backend(device.index).allocator().stats().allocated_bytes, 0, what});
#endif
}

std::string device_memory_peak_sites() {
  std::string text;
  for (const PeakSite& s : g_memory_notes) {
    text += fmt::format("  {:8.3f} GiB held after {}\n", static_cast<double>(s.allocated) / (1ull << 30), s.scopes);
  }
  for (const PeakSite& s : g_peak_sites) {
    text += fmt::format("  {:8.3f} GiB after a request of {:8.1f} MiB in {}\n", static_cast<double>(s.allocated) / (1ull << 30),
                        static_cast<double>(s.request) / (1ull << 20), s.scopes.empty() ? "(no scope)" : s.scopes);
  }
  return text;
}

}  // namespace primus
