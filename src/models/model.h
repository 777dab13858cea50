// The interface every model family implements, so that training, evaluation, sampling, checkpoints, memory
// reports and benchmarks take a `Model&` instead of one concrete class, and the factory that builds one from the
// config. A family (llama, qwen3; mixtral, qwen3_moe, deepseek to come) names a parameter table and an
// implementation; families can share one (Llama and Qwen3 are both LlamaModel).
//
// Per-micro-batch state lives in a MicroBatchContext that forward returns and backward consumes, never in the
// model: several micro-batches may be in flight at once (a pipeline stage keeps up to pp of them under 1F1B).
// Parallel code reaches the model's modules from outside (for_each_linear) instead of editing model code.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/experiment.h"
#include "layers/attention.h"
#include "layers/context_parallel.h"
#include "layers/expert_parallel.h"
#include "layers/linear.h"
#include "layers/tensor_parallel.h"
#include "ops/param_store.h"

namespace primus {

// A module slot and its Hugging Face module name ("model.layers.3.self_attn.q_proj"). The visitor may replace
// the module held in the slot, e.g. wrap it: slot = std::make_unique<LoraLinear>(std::move(slot), ...).
using LinearVisitor = std::function<void(const std::string& name, std::unique_ptr<Linear>& slot)>;

struct LossSum {
  double loss_sum = 0.0;     // Σ token losses over counted tokens
  int64_t tokens = 0;        // counted tokens (labels >= 0)
};

// Activation recompute, Megatron's recompute_granularity / recompute_method / recompute_num_layers.
struct RecomputeConfig {
  enum class Granularity { kNone, kFull, kSelective };
  Granularity granularity = Granularity::kNone;
  bool block = false;      // full: only the first num_layers layers; else (uniform) every layer, in chunks
  int64_t num_layers = 1;  // full: layers recomputed (block) or layers per chunk (uniform)

  static RecomputeConfig from(const TrainingArgs& t);
  // The layers [first, end) of a `layers`-layer model recomputed together with layer i; first == end when
  // layer i keeps its activations.
  std::pair<int64_t, int64_t> chunk(int64_t i, int64_t layers) const;
};

// What one micro-batch's training forward kept for its backward (activations, its tokens and packing, the
// recompute setting it ran with). Opaque outside the model that made it; backward frees what it holds.
class MicroBatchContext {
 public:
  virtual ~MicroBatchContext() = default;
};

// How a model is split over ranks, handed in by the parallel code. Tensor parallelism: the model holds its rank's
// slice of the sliced parameters (heads of q/k/v/o, columns of the MLP, rows of the vocabulary; ParamSpec::slice)
// and calls the group's collectives where the slices meet (layers/tensor_parallel.h). Context parallelism: the
// model holds all of its (tensor-parallel) parameters, forward and evaluate take this rank's chunks of the sequences
// and attention runs around the ring (layers/context_parallel.h). sequence_parallel (with tp of more than one rank):
// between the tensor-parallel regions each rank holds its tp-th of the B·T rows (layers/tensor_parallel.h); forward
// and evaluate need B·T divisible by the tp size (sampling's odd contexts run without the split).
// Pipeline parallelism: the model holds only its stage's chunks (contiguous ranges of layers; several, interleaved
// with the other stages', with virtual stages), the first stage also the embedding, the last the final norm, the
// output layer and the loss; with tied embeddings the last stage holds a copy of the embedding as its output layer
// (the parallel code keeps the two equal). Parameter names stay the whole model's ("model.layers.5..."), so
// checkpoints and Hugging Face files need no renaming. Default: one rank, one stage of one chunk holding every layer.
// Expert parallelism (ep of more than one rank): every MoE layer holds its rank's num_experts / ep whole experts (the
// parameters keep their names, "...experts.5.w1.weight") and its tokens reach them through the all-to-all dispatcher
// (layers/expert_parallel.h); the router and everything else are whole on every rank.
struct PipelineStage {
  int stage = 0;
  int stages = 1;
  std::vector<std::pair<int64_t, int64_t>> chunks;  // layers [begin, end) of each chunk in order; empty: all, one chunk
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
};

struct ModelParallel {
  TensorParallelGroup tp;
  ContextParallelGroup cp;
  bool sequence_parallel = false;
  PipelineStage pipeline;
  ExpertParallelGroup ep;
};

// One MoE layer's routing over the training forwards of the last step (Model::moe_routing), on this rank.
struct MoeLayerRouting {
  int64_t layer = 0;
  std::vector<double> tokens_per_expert;  // routing entries (a token's choice of an expert) per expert
  double load_balancing_loss = 0.0;       // Σ over micro-batches of the aux loss without its coefficient
  double z_loss = 0.0;                    // Σ over micro-batches of the z-loss without its coefficient
  double dropped = 0.0;                   // routing entries dropped by the expert capacity (0 when dropless)
  int64_t micro_batches = 0;
};

class Model {
 public:
  virtual ~Model() = default;

  // The family key: "llama" (Llama 2/3/3.1/3.2), "qwen3", "mixtral", "qwen3_moe" or "deepseek_v2" (MLA).
  virtual std::string_view family() const = 0;
  virtual const ModelArgs& args() const = 0;
  // The longest sequence forward takes (the rows of its RoPE table): pretrained weights must know positions as far.
  virtual int64_t max_seq_length() const = 0;
  virtual Device device() const = 0;
  // fp32 master weights and gradients, one flat buffer each, Hugging Face names (the family's param_specs).
  virtual ParamStore& params() = 0;
  virtual const ParamStore& params() const = 0;

  // kF32, or kBF16 for mixed precision: matmuls and activations in bf16 from a bf16 copy of the weights.
  virtual DType compute_dtype() const = 0;
  // The bf16 compute copy (null in fp32), for an optimizer that rewrites it as it updates the master weights
  // (AdamW::step); the copy is then current and weights_changed() is not needed.
  virtual Tensor* compute_weights() = 0;
  // Call after the master weights changed (initialisation, loading, an optimizer step): the bf16 copy is
  // refreshed before the next forward. No-op in fp32.
  virtual void weights_changed() = 0;

  // Applies to the forwards that follow (a context keeps the setting its forward ran with). Full: a recomputed
  // layer keeps no activations, only the input of its chunk, and backward runs the chunk's forward again just
  // before its backward. Selective: every MLP drops its SwiGLU output and recomputes it.
  virtual void set_recompute(const RecomputeConfig& recompute) = 0;

  // Training forward of one micro-batch: tokens, labels [B, T] i32 on the model's device, T <= max_seq_length.
  // The loss gradient (grad_scale × Σ token losses) is formed with the loss, chunk by chunk (LmLoss), so
  // grad_scale is given here: 1 / the tokens counted over the global batch (counted_tokens). Adds Σ token
  // losses to loss_sum ([1] f32 on the model's device) without waiting for the device. The output layer's
  // gradient accumulates here already; the rest waits for backward(ctx). `packed` (tensors [B, T] on the
  // model's device) gives documents packed into a row their own positions (< max_seq_length) and attention;
  // labels < 0 (e.g. an EOD input under eod_mask_loss) count for nothing. Returns the activations kept for
  // backward; any number of contexts may be alive, and their backwards may run in any order.
  // With context parallelism (ModelParallel::cp of more than one rank) tokens and labels are this rank's chunks of B
  // sequences, [2B, T / (2·cp)] (ContextParallelGroup::local_chunks), every cp rank calls forward (and backward)
  // together, and the losses are those of its chunks; packed documents are not taken then.
  virtual std::unique_ptr<MicroBatchContext> forward(const Tensor& tokens, const Tensor& labels, float grad_scale,
                                                     Tensor& loss_sum, const PackedSequence& packed = {}) = 0;
  // Accumulates the parameter gradients of ctx's grad_scale × Σ token losses and frees ctx's activations (once
  // per context: a second backward of the same context is an error). grads_ready (optional) is called as
  // backward goes, each time the gradients of a range of the flat gradient buffer are final for this backward:
  // the output layer and final norm first, then each block from the last, the embedding last; the ranges are
  // disjoint and together cover the buffer (data parallelism starts reducing a bucket as soon as its range is
  // final).
  virtual void backward(MicroBatchContext& ctx, const GradsReadyFn& grads_ready = {}) = 0;
  // Σ token losses and counted tokens of one micro-batch, keeping nothing (evaluation); waits for the device. With
  // context parallelism, of this rank's chunks as forward's.
  virtual LossSum evaluate(const Tensor& tokens, const Tensor& labels, const PackedSequence& packed = {}) = 0;
  // Logits of the last position of `context` ([T] ids, T <= max_seq_length) without keeping activations. The whole
  // context on this rank, also under context parallelism (no ring: the other cp ranks need not call it).
  virtual std::vector<float> next_token_logits(const std::vector<int32_t>& context) = 0;

  // Pipeline parallelism (ModelParallel::pipeline): this stage's model chunks, run one micro-batch at a time by a
  // schedule (parallel/pipeline_schedule.h). Chunk `chunk`'s training forward takes tokens and labels [B, T] (as
  // forward's; every stage reads them, for the shapes) and `input`, the hidden state [chunk_rows(B·T), C] the previous virtual
  // stage sent (undefined for the first stage's chunk 0, which embeds the tokens). It sets `output` to the hidden
  // state to send on, except for the last stage's last chunk, which forms the loss and its gradient as forward does
  // (adding to loss_sum) and leaves `output` undefined. backward_chunk takes the gradient of that output (undefined
  // for the loss chunk), accumulates the chunk's parameter gradients and returns the gradient of its input
  // (undefined for the embedding chunk). At one stage of one chunk forward_chunk(0, ...) is forward.
  virtual int num_chunks() const = 0;
  // Rows of the hidden state one chunk sends the next for a micro-batch of `tokens` tokens: all of them, or this
  // rank's tp-th under sequence parallelism.
  virtual int64_t chunk_rows(int64_t tokens) const = 0;
  virtual std::unique_ptr<MicroBatchContext> forward_chunk(int chunk, const Tensor& tokens, const Tensor& labels,
                                                           const Tensor& input, float grad_scale, Tensor& loss_sum,
                                                           Tensor& output, const PackedSequence& packed = {}) = 0;
  virtual Tensor backward_chunk(MicroBatchContext& ctx, const Tensor& grad_output) = 0;
  // Evaluation's forward of one chunk, keeping nothing: the hidden state to send on, or (the loss chunk) an undefined
  // tensor and the micro-batch's losses in `loss` (counted tokens included).
  virtual Tensor evaluate_chunk(int chunk, const Tensor& tokens, const Tensor& labels, const Tensor& input,
                                LossSum& loss, const PackedSequence& packed = {}) = 0;
  // Sampling's forward of one chunk over `context` (as next_token_logits): the hidden state [T, C] to send on, or
  // (the loss chunk) an undefined tensor and the last position's logits in `logits`.
  virtual Tensor logits_chunk(int chunk, const std::vector<int32_t>& context, const Tensor& input,
                              std::vector<float>& logits) = 0;

  // Parameter units in forward order: ranges of the flat buffers that are used together and tile [0, numel)
  // (LlamaModel: the embedding, each block, the final norm with the output layer). A tied output layer reads and
  // writes unit 0 in the loss's forward.
  virtual std::vector<FlatRange> param_units() const = 0;
  // From now on the modules compute with and accumulate into these buffers instead of the ParamStore's flat
  // buffers and the model's compute copy (fully sharded data parallelism owns them and refreshes them itself:
  // compute_weights() is null and weights_changed() does nothing afterwards). Replaces the Linear modules, so wrap
  // them (for_each_linear) only afterwards.
  virtual void bind_units(const UnitBuffers& buffers) = 0;
  // Hooks called as forward and backward reach each unit (null: none).
  virtual void set_param_hooks(ParamUnitHooks* hooks) = 0;

  // Every Linear module with its Hugging Face module name, in parameter order (the multi-token prediction modules'
  // eh_proj and layer projections last), for code outside the model (tensor parallelism, LoRA, FP8) to inspect,
  // replace or wrap. Replace modules only while no context is alive.
  virtual void for_each_linear(const LinearVisitor& visit) = 0;

  // The gradients backward leaves partial on each tensor-parallel rank, to be summed over the group once per step
  // (empty at one rank).
  virtual TensorParallelGradSums tensor_parallel_grad_sums() const = 0;

  // Mixture of experts: the routing of this rank's MoE layers over the training forwards since the last
  // clear_moe_routing (a step's, when the trainer clears it as the step starts), in layer order, a multi-token
  // prediction module's MoE layer last as layer num_layers + k − 1; reading waits for the device. Empty for a dense
  // model.
  virtual std::vector<MoeLayerRouting> moe_routing() const { return {}; }
  virtual void clear_moe_routing() {}
  // Multi-token prediction (ModelArgs::mtp_num_layers): per depth, Σ token losses and counted tokens of the training
  // forwards since the last clear_mtp_losses (a step's, when the trainer clears it as the step starts), on this rank.
  // Empty without the modules.
  virtual std::vector<LossSum> mtp_losses() const { return {}; }
  virtual void clear_mtp_losses() {}
  // The ranges of the flat buffers holding this rank's share of the experts under expert parallelism (ascending,
  // disjoint): their gradients sum over the ranks holding the same experts, not over all data-parallel ranks. Empty
  // without expert parallelism.
  virtual std::vector<FlatRange> expert_ranges() const { return {}; }
  // Each MoE layer's experts as two ranges, their gate/up weights and their down weights (ascending, disjoint): the
  // weights whose layer reports their last read and their gradients' first write in backward itself
  // (ParamUnitHooks::weights_read, grads_to_write). Empty for a dense model.
  virtual std::vector<FlatRange> expert_weight_ranges() const { return {}; }
};

// A family's parameter table, cost figures and constructor.
struct ModelFamily {
  std::string_view name;
  std::vector<ParamSpec> (*param_specs)(const ModelArgs& args);  // `args.vocab_size` resolved
  // Parameters in the matmuls of one token's forward, the output layer included even when tied.
  int64_t (*matmul_params)(const ModelArgs& args);
  // Training FLOPs per token (the MFU numerator).
  double (*flops_per_token)(const ModelArgs& args, int64_t seq_length);
  std::unique_ptr<Model> (*make)(const ModelArgs& args, int64_t max_seq_length, Device device, DType compute_dtype,
                                 const ModelParallel& parallel);
};

// The family of a config: "qwen3" when it has Qwen3's q/k RMSNorm, else "llama"; with experts (num_experts)
// "qwen3_moe" or "mixtral" (the shape keys carry no model type; hf_config.cpp maps Hugging Face's model_type the
// same way).
std::string_view model_family_name(const ModelArgs& args);
// A family by key; throws UsageError naming an unknown one and the known ones.
const ModelFamily& find_model_family(std::string_view name);
inline const ModelFamily& model_family(const ModelArgs& args) { return find_model_family(model_family_name(args)); }

// The model of `args`' family. `args.vocab_size` must be resolved (> 0). Parameters are allocated but not
// initialised. compute_dtype kBF16 (mixed precision, CUDA) keeps fp32 master weights and gradients too.
std::unique_ptr<Model> make_model(const ModelArgs& args, int64_t max_seq_length, Device device = kCpuDevice,
                                  DType compute_dtype = DType::kF32, const ModelParallel& parallel = {});

// The shapes one rank of `tp` tensor-parallel ranks computes with: its share of the heads, query groups, MLP columns
// and vocabulary rows. Their parameter table has the shapes of the rank's slices (ModelParallel), so the memory
// plan and the activation estimate of a rank are those of these args.
ModelArgs tensor_parallel_shapes(const ModelArgs& args, int tp);

// Labels that count (>= 0) in a host [.., ..] i32 tensor.
int64_t counted_tokens(const Tensor& host_labels);

}  // namespace primus
