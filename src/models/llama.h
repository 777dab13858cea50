// The dense decoder family: Llama 2/3/3.1/3.2 and Qwen3 (q/k RMSNorm, explicit head_dim).
// Builds the parameter table with Hugging Face names, owns the flat ParamStore, and runs an explicit
// forward (keeping saved activations) and backward over one micro-batch.
#pragma once

#include <memory>
#include <vector>

#include "config/experiment.h"
#include "ops/param_store.h"
#include "layers/attention.h"

namespace primus {

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
};

class LlamaModel {
 public:
  // `args.vocab_size` must be resolved (> 0). Parameters are allocated but not initialised.
  // compute_dtype kBF16 (mixed precision, CUDA): matmuls and activations in bf16 from a bf16 copy of the
  // weights; the ParamStore keeps fp32 master weights and fp32 gradients either way.
  LlamaModel(const ModelArgs& args, int64_t max_seq_length, Device device = kCpuDevice,
             DType compute_dtype = DType::kF32);

  static std::vector<ParamSpec> param_specs(const ModelArgs& args);
  // Parameters in the matmuls of one token's forward, the output layer included even when tied.
  static int64_t matmul_params(const ModelArgs& args);
  // Training FLOPs per token: 6 × matmul_params + 12 × layers × seq × heads × head_dim (causal not halved).
  static double flops_per_token(const ModelArgs& args, int64_t seq_length);
  Device device() const { return device_; }

  const ModelArgs& args() const { return args_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  // Call after the master weights changed (initialisation, loading, an optimizer step): the bf16 copy is
  // refreshed before the next forward. No-op in fp32.
  void weights_changed() { compute_weights_stale_ = true; }
  // The bf16 compute copy (null in fp32), for an optimizer that rewrites it as it updates the master weights
  // (AdamW::step); the copy is then current and weights_changed() is not needed.
  Tensor* compute_weights() { return compute_dtype_ == DType::kF32 ? nullptr : &compute_weights_; }
  DType compute_dtype() const { return compute_dtype_; }

  // Applies to the next forward. Full: a recomputed layer keeps no activations, only the input of its chunk,
  // and backward runs the chunk's forward again just before its backward. Selective: every MLP drops its
  // SwiGLU output and recomputes it.
  void set_recompute(const RecomputeConfig& recompute);

  // Training forward of one micro-batch: tokens, labels [B, T] i32 on the model's device, T <= max_seq_length.
  // The loss gradient (grad_scale × Σ token losses) is formed with the loss, chunk by chunk (LmLoss), so
  // grad_scale is given here: 1 / the tokens counted over the global batch (counted_tokens). Adds Σ token
  // losses to loss_sum ([1] f32 on the model's device) without waiting for the device. Saves activations.
  // `packed` (tensors [B, T] on the model's device) gives documents packed into a row their own positions
  // (< max_seq_length) and attention; labels < 0 (e.g. an EOD input under eod_mask_loss) count for nothing.
  void forward(const Tensor& tokens, const Tensor& labels, float grad_scale, Tensor& loss_sum,
               const PackedSequence& packed = {});
  // Accumulates the parameter gradients of the last forward's grad_scale × Σ token losses; frees activations.
  void backward();
  // Σ token losses and counted tokens of one micro-batch, keeping nothing (evaluation); waits for the device.
  LossSum evaluate(const Tensor& tokens, const Tensor& labels, const PackedSequence& packed = {});
  // Labels that count (>= 0) in a host [.., ..] i32 tensor.
  static int64_t counted_tokens(const Tensor& host_labels);
  // Logits of the last position of `context` ([T] ids, T <= max_seq_length) without keeping activations.
  std::vector<float> next_token_logits(const std::vector<int32_t>& context);

 private:
  struct Block {
    std::string name;  // "model.layers.{i}", for profiling scopes
    RmsNorm input_norm;
    Attention attention;
    RmsNorm post_attention_norm;
    SwiGluMlp mlp;
    RmsNormSaved input_norm_saved;
    AttentionSaved attention_saved;
    RmsNormSaved post_norm_saved;
    MlpSaved mlp_saved;
    Tensor chunk_input;  // full recompute: the input of the chunk this block starts, else undefined
  };

  void bind_layers();
  // Embedding, blocks, final norm: [B·T, C], activations saved (packed kept for backward).
  Tensor forward_hidden(const Tensor& tokens, const PackedSequence& packed);
  Tensor block_forward(Block& b, const Tensor& x, const RopeTable& rope);
  Tensor block_backward(Block& b, const Tensor& dx, const RopeTable& rope);
  void release_block(Block& b);
  // The layers [first, end) recomputed together with layer i; first == end when layer i keeps its activations.
  std::pair<int64_t, int64_t> recompute_chunk(int64_t i) const;
  void release_activations();
  // The rope rows a forward of `seq` tokens reads: the first `seq` rows of rope_, or all of them for per-token
  // positions (packed_.position_ids).
  RopeTable rope_for(int64_t seq) const;

  ModelArgs args_;
  RecomputeConfig recompute_;
  int64_t max_seq_length_;
  Device device_;
  DType compute_dtype_;
  ParamStore params_;
  Tensor compute_weights_;  // [numel] bf16 copy of the master weights (mixed precision only)
  bool compute_weights_stale_ = true;
  Embedding embedding_;
  std::vector<Block> blocks_;
  RmsNorm final_norm_;
  RmsNormSaved final_norm_saved_;
  LmLoss lm_loss_;
  LmLossSaved lm_loss_saved_;
  Tensor tokens_;  // [N] ids of the last forward
  PackedSequence packed_;  // of the last forward (undefined tensors when not packed)
  RopeTable rope_;  // [max_seq_length, D/2]
};

}  // namespace primus
