// The dense decoder family: Llama 2/3/3.1/3.2 and Qwen3 (q/k RMSNorm, explicit head_dim).
// Builds the parameter table with Hugging Face names, owns the flat ParamStore and the modules that view it,
// and runs an explicit forward (into a per-micro-batch context) and backward over one micro-batch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/model.h"

namespace primus {

class LlamaModel final : public Model {
 public:
  // `args.vocab_size` must be resolved (> 0). Parameters are allocated but not initialised.
  // compute_dtype kBF16 (mixed precision, CUDA): matmuls and activations in bf16 from a bf16 copy of the
  // weights; the ParamStore keeps fp32 master weights and fp32 gradients either way.
  LlamaModel(const ModelArgs& args, int64_t max_seq_length, Device device = kCpuDevice,
             DType compute_dtype = DType::kF32, const ModelParallel& parallel = {});

  // The whole model's parameters (one rank).
  static std::vector<ParamSpec> param_specs(const ModelArgs& args) { return param_specs(args, 1, 0); }
  // Tensor-parallel rank `tp_rank` of `tp_size`'s slices (heads, MLP columns and vocabulary rows divide evenly:
  // ParallelDims checked it).
  static std::vector<ParamSpec> param_specs(const ModelArgs& args, int tp_size, int tp_rank);
  // Parameters in the matmuls of one token's forward, the output layer included even when tied.
  static int64_t matmul_params(const ModelArgs& args);
  // Training FLOPs per token: 6 × matmul_params + 12 × layers × seq × heads × head_dim (causal not halved).
  static double flops_per_token(const ModelArgs& args, int64_t seq_length);

  std::string_view family() const override { return model_family_name(args_); }
  const ModelArgs& args() const override { return args_; }
  int64_t max_seq_length() const override { return max_seq_length_; }
  Device device() const override { return device_; }
  ParamStore& params() override { return params_; }
  const ParamStore& params() const override { return params_; }

  DType compute_dtype() const override { return compute_dtype_; }
  Tensor* compute_weights() override {
    return compute_dtype_ == DType::kF32 || external_units_ ? nullptr : &compute_weights_;
  }
  void weights_changed() override { compute_weights_stale_ = !external_units_; }
  void set_recompute(const RecomputeConfig& recompute) override;

  std::unique_ptr<MicroBatchContext> forward(const Tensor& tokens, const Tensor& labels, float grad_scale,
                                             Tensor& loss_sum, const PackedSequence& packed = {}) override;
  void backward(MicroBatchContext& ctx, const GradsReadyFn& grads_ready = {}) override;
  LossSum evaluate(const Tensor& tokens, const Tensor& labels, const PackedSequence& packed = {}) override;
  std::vector<float> next_token_logits(const std::vector<int32_t>& context) override;

  // q_proj, k_proj, v_proj, o_proj, then gate_up_proj (gate_proj and up_proj as one [2F, C] GEMM: gate rows
  // first) and down_proj, of each layer in order: "model.layers.{i}.self_attn.q_proj", "....mlp.gate_up_proj".
  void for_each_linear(const LinearVisitor& visit) override;

  std::vector<FlatRange> param_units() const override;
  void bind_units(const UnitBuffers& buffers) override;
  void set_param_hooks(ParamUnitHooks* hooks) override { hooks_ = hooks; }
  TensorParallelGradSums tensor_parallel_grad_sums() const override;

 private:
  struct Block {
    std::string name;  // "model.layers.{i}", for profiling scopes
    RmsNorm input_norm;
    Attention attention;
    RmsNorm post_attention_norm;
    SwiGluMlp mlp;
  };
  struct BlockSaved;  // one block's activations in a Context
  struct Context;     // one micro-batch's (llama.cpp)

  // Points every module at its weights and gradients in `buffers` (one tensor per param_units() unit).
  void bind_layers(const UnitBuffers& buffers);
  // The unit (of param_units()) holding parameter i of the ParamStore.
  size_t unit_of(size_t i, const std::vector<FlatRange>& units) const;
  // Hooks, when set.
  void hook_before_forward(size_t unit) { if (hooks_ != nullptr) hooks_->before_forward(unit); }
  void hook_after_forward(size_t unit) { if (hooks_ != nullptr) hooks_->after_forward(unit); }
  void hook_before_backward(size_t unit) { if (hooks_ != nullptr) hooks_->before_backward(unit); }
  void hook_after_backward(size_t unit) { if (hooks_ != nullptr) hooks_->after_backward(unit); }
  size_t last_unit() const { return static_cast<size_t>(args_.num_layers) + 1; }
  // Embedding, blocks, final norm into ctx (its tokens, packing and activations): [B·T, C]. chunks: the tokens are
  // this rank's chunks of the sequences (context parallelism, when cp_ has several ranks), attention the ring's.
  // The final norm's and the output layer's units stay in use (hooks) until end_head_forward().
  Tensor forward_hidden(Context& ctx, const Tensor& tokens, const PackedSequence& packed, bool chunks);
  void end_head_forward();
  // The tensor-parallel seams: the input of a column-parallel region (this rank's rows gathered under sequence
  // parallelism, else x itself) and the output of a row-parallel one (partial sums reduce-scattered into this rank's
  // rows, else all-reduced). Backward uses the same pair the other way round: the gradient of a gathered input is
  // summed(), that of a summed output gathered().
  Tensor gathered(const Tensor& x, const Context& ctx) const;
  Tensor summed(Tensor x, const Context& ctx) const;
  // Training and evaluation under sequence parallelism must split their rows.
  void check_split(const Context& ctx) const;
  Tensor block_forward(Block& b, BlockSaved& saved, const Tensor& x, const Context& ctx);
  Tensor block_backward(Block& b, BlockSaved& saved, const Tensor& dx, const Context& ctx);
  // The rope rows a forward of `seq` tokens reads: the first `seq` rows of rope_, or all of them for per-token
  // positions (packed.position_ids).
  RopeTable rope_for(int64_t seq, const PackedSequence& packed) const;

  ModelArgs args_;
  TensorParallelGroup tp_;
  ContextParallelGroup cp_;
  bool sequence_parallel_ = false;  // with more than one tp rank
  Tensor cp_positions_;  // [2B, C] i32 on the device: the positions of the last chunk layout seen (context parallel)
  RecomputeConfig recompute_;  // for the forwards to come
  int64_t max_seq_length_;
  Device device_;
  DType compute_dtype_;
  ParamStore params_;
  Tensor compute_weights_;  // [numel] bf16 copy of the master weights (mixed precision only)
  bool compute_weights_stale_ = true;
  bool external_units_ = false;       // bind_units: the modules use buffers owned elsewhere
  ParamUnitHooks* hooks_ = nullptr;
  Embedding embedding_;
  std::vector<Block> blocks_;
  RmsNorm final_norm_;
  LmLoss lm_loss_;
  RopeTable rope_;  // [max_seq_length, D/2]
};

}  // namespace primus
