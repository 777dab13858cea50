// One optimizer step and one evaluation pass, shared by `train pretrain` and `benchmark train`, plus the
// device choice and memory figures they report.
#pragma once

#include "config/experiment.h"
#include "data/loader.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "parallel/distributed_env.h"
#include "parallel/parallel_dims.h"
#include "train/moe_routing.h"

namespace primus {

class Tokenizer;
class Fp8Scaling;  // layers/fp8_scaling.h
struct Pipeline;  // train/pipeline_step.h

// Datasheet dense bf16 peak of an H100/H200 SXM, the denominator of MFU (as in the PyTorch reference).
inline constexpr double kPeakBf16Tflops = 989.0;

struct StepResult {
  double loss = 0.0;       // mean token loss over the global batch
  double grad_norm = 0.0;  // before clipping
  int64_t tokens = 0;      // tokens with a label
  std::optional<MoeMetrics> moe;  // the step's routing when the step needed it (the expert-bias update)
};

// Device time of a step's phases, from marks queued between them (ops/profile.h's DeviceMark): summed over
// the micro-batches for forward and backward; optimizer = gradient norm + AdamW. Reading them waits for the
// step's work, so trainers ask only on steps they log.
struct StepTimes {
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  double optimizer_ms = 0.0;
};

// Each multi-token prediction depth's mean token loss over the step's micro-batches on every data-parallel rank (a
// collective over dp: every rank calls it on the same steps). Empty without the modules.
std::vector<double> reduce_mtp_losses(const Model& model, DataParallel& dp);

// Micro-batches per optimizer step on one data-parallel rank: global_batch_size / (micro_batch_size × dp size).
int64_t micro_batches_per_step(const TrainingArgs& t);

// Which part of the global batch a rank computes: the samples of its data-parallel rank (the loader's DataShard, as
// Megatron's sampler deals them over the dp group) and, of each sample, the chunks of its context-parallel rank
// (layers/context_parallel.h: every rank of a cp group reads the same samples and keeps its two chunks of each).
struct BatchSplit {
  DataShard shard;
  ContextParallelGroup cp;  // only its rank and size are read here (the model's own group runs the ring)
  // The part of `full` (host [B, T] tensors, as the loader reads them for `shard`) that this rank computes: `full`
  // itself at cp 1, else each tensor's local_chunks, [2B, T / (2·cp)]. Packed documents are refused at cp > 1.
  Batch local(const Batch& full) const;
};
// The split of this rank in `groups`.
BatchSplit batch_split(const ProcessGroups& groups);

// One optimizer step over this rank's share of a global batch (host micro-batches, BatchSplit::local): each is moved
// to the
// model's device, fp32 gradients of the global batch's mean token loss accumulate (the token count is global: the
// labels counted here, summed over dp's group, which is dp × cp), the last backward reduces them across that group
// bucket by bucket, then the global-norm clip
// and one AdamW step with `lr` over this rank's optimizer ranges, then the weights are gathered (distributed
// optimizer). The result (loss, norm, tokens) is the global batch's, the same on every rank. With `times`,
// also measures the phases (one wait for the device at the end of the step).
// With an active `pipeline` the micro-batches run through its schedule instead (pipeline_step.h); the tied
// embedding's gradients are summed over first and last stage and the gradients reduced over dp after the flush, the
// loss comes from the last stage and the norm sums over the stages; forward_ms then holds the whole schedule.
// With moe_router_enable_expert_bias, the step's routing over the global batch then moves each MoE layer's bias
// (update_expert_bias) and is returned. With `fp8` (enable_fp8), its scaling state ends the step (fp8_end_step).
StepResult train_step(Model& model, AdamW& optimizer, DataParallel& dp, const std::vector<Batch>& micro_batches,
                      const TrainingArgs& t, double lr, StepTimes* times = nullptr,
                      const Pipeline* pipeline = nullptr, Fp8Scaling* fp8 = nullptr);

// Mean token loss over eval_iters global batches read from the start of `source` (the same samples each time),
// with the same packed-document masks as training; each rank evaluates its share (`split`) and the sums are
// combined over dp's group, so every rank returns the loss one rank alone would.
// With an active `pipeline`, through its forward-only schedule, a step's micro-batches at a time.
double evaluate(Model& model, DataParallel& dp, const SampleSource& source, const TrainingArgs& t,
                const BatchSplit& split, const PackingOptions& packing = {}, const Pipeline* pipeline = nullptr);

// The data-parallel side of a run for `model`: the options of `t` (use_distributed_optimizer, use_megatron_fsdp
// with data_parallel_sharding_strategy, overlap_grad_reduce, overlap_param_gather, ddp_bucket_size) over the group
// `dp`. Throws UsageError for overlap_param_gather without a fully sharded strategy.
// ddp_bucket_size as the config resolves it (Megatron-Core's max(40M, 1M × dp) when not given), also for
// TrainingArgs built in code.
int64_t ddp_bucket_size(const TrainingArgs& t);

// The job's world communicator on `device` (a world of one without a launcher), every wait bounded by
// distributed_timeout_minutes.
std::shared_ptr<Communicator> connect_world(const DistributedEnv& env, Device device, const TrainingArgs& t);

// The config's layout (tensor_model_parallel_size, ...) over `world_size` ranks, checked against the model:
// UsageError naming the key when they do not fit. No communicator: also for planning a job (projection).
ParallelDims parallel_dims_for(const ModelArgs& model, const TrainingArgs& t, int world_size);
// The job's layout checked against the world and the model, and the rank's groups: UsageError naming the key when
// they do not fit.
ProcessGroups make_process_groups(std::shared_ptr<Communicator> world, const ModelArgs& model, const TrainingArgs& t);
// The model of the config, split as `groups` say. Its ring attention (cp > 1) runs on a split of the cp group of its
// own. Collective over the world.
std::unique_ptr<Model> make_parallel_model(const ModelArgs& args, const TrainingArgs& t, Device device,
                                           const ProcessGroups& groups);
// Data parallelism over the dp × cp group (Megatron's: the ranks of a cp group hold the same weights and each
// computes the gradients of its chunks, so they reduce as data-parallel ranks do).
// At pp > 1 the gradient norm also sums over the stages (the model group), leaving out the last stage's copy of a
// tied embedding.
std::unique_ptr<DataParallel> make_data_parallel(const ProcessGroups& groups, Model& model,
                                                 const TrainingArgs& t);
// "distributed optimizer", "FSDP optim_grads (ZeRO-2)", ... for the log.
std::string data_parallel_description(const TrainingArgs& t);
// AdamW over the ranges `dp` gives this rank: everything, the distributed optimizer's shards, or FSDP's packed
// shards (which then hold the fp32 master weights).
AdamW make_optimizer(Model& model, DataParallel& dp, const TrainingArgs& t);
// After the weights were initialised or loaded into the model's ParamStore: the compute copy is refreshed, or FSDP
// takes the weights (freeing the flat buffers) and the model is bound to its units and hooks.
void weights_ready(Model& model, DataParallel& dp);

// The packing switches of `t` (reset_position_ids, reset_attention_mask, eod_mask_loss) with the tokenizer's EOD
// id. Throws UsageError naming the key when one is on but the tokenizer has no EOD id.
PackingOptions packing_options(const TrainingArgs& t, const Tokenizer& tokenizer);

// The batch's packed-document tensors on `device` (undefined where the batch has none).
PackedSequence packed_on(const Batch& batch, Device device);

// `device` key: cpu, cuda (error when not built or no GPU), or auto (cuda when usable, else cpu). Starts the
// device backend. local_rank picks the GPU among the visible ones (torchrun's LOCAL_RANK); an error names it
// when there are fewer GPUs than local ranks.
Device select_device(const std::string& device_key, int local_rank = 0);
// The model's compute dtype for `bf16`; throws UsageError for bf16 on the CPU, and for fp8_format on any device (on
// the CPU and GPUs without fp8 tensor cores naming the device; elsewhere until the fp8 GEMM path exists).
DType compute_dtype(const TrainingArgs& t, Device device);
// Peak bytes allocated on the device since start, in GiB: the CUDA allocator's, or the host tensors' on the CPU
// (core/host_memory.h).
double device_peak_memory_gib(Device device);
// PRIMUS_MEMORY_TRACE=1 on a CUDA device: from now on, each time the allocator's peak grows by 64 MiB or more (or
// by a request of that size), records the total, the request and the profile scopes open (ops/profile.h);
// device_memory_peak_sites then lists the last records, the run's peak among them. Otherwise does nothing.
void trace_device_memory_peaks(Device device);
// Under trace_device_memory_peaks, records the bytes held now, after `what` (a setup stage).
void note_device_memory(Device device, const char* what);
// The records of trace_device_memory_peaks, one line each, the highest last ("" when none).
std::string device_memory_peak_sites();

}  // namespace primus
