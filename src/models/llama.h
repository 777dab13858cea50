// The decoder family: Llama 2/3/3.1/3.2 and Qwen3 (q/k RMSNorm, explicit head_dim), dense or with mixture-of-experts
// MLPs in some layers (Mixtral, Qwen3-MoE: num_experts; parameter names in moe_param_names below), and DeepSeek-V2/V3's
// multi-head latent attention in place of the q/k/v projections (multi_latent_attention, layers/mla.h).
// Builds the parameter table with Hugging Face names, owns the flat ParamStore and the modules that view it,
// and runs an explicit forward (into a per-micro-batch context) and backward over one micro-batch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/mla.h"
#include "layers/moe.h"
#include "models/model.h"

namespace primus {

// The Hugging Face names of one MoE layer's parameters ("model.layers.{i}." given): Mixtral's
// block_sparse_moe.{gate, experts.E.w1 (gate), w3 (up), w2 (down)} or, for Qwen3-MoE (qk_layernorm),
// mlp.{gate, experts.E.gate_proj, up_proj, down_proj}; a shared expert's {prefix}shared_experts.{gate,up,down}_proj.
struct MoeParamNames {
  std::string gate;                                        // router [E, C]
  // The router's selection bias [E] of aux-loss-free balancing (moe_router_enable_expert_bias), DeepSeek-V3's name.
  std::string expert_bias;
  std::vector<std::string> gate_proj, up_proj, down_proj;  // per expert: [F, C], [F, C], [C, F]
  std::string shared;                                      // "....shared_experts."
  std::string shared_gate, shared_up, shared_down;         // [S, C], [S, C], [C, S]
};
MoeParamNames moe_param_names(const ModelArgs& args, const std::string& layer_prefix);

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
  // Of pipeline stage `stage` too: the embedding on the first stage (and, tied, its copy as output layer on the
  // last), the chunks' layers, the final norm and untied output layer on the last.
  static std::vector<ParamSpec> param_specs(const ModelArgs& args, int tp_size, int tp_rank,
                                            const PipelineStage& stage);
  // And of expert-parallel rank `ep_rank` of `ep_size` (dividing num_experts): its experts
  // [ep_rank · E / ep_size, (ep_rank + 1) · E / ep_size) of every MoE layer, whole, under their own names.
  static std::vector<ParamSpec> param_specs(const ModelArgs& args, int tp_size, int tp_rank,
                                            const PipelineStage& stage, int ep_size, int ep_rank);
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

  int num_chunks() const override { return static_cast<int>(chunks_.size()); }
  int64_t chunk_rows(int64_t tokens) const override;
  std::unique_ptr<MicroBatchContext> forward_chunk(int chunk, const Tensor& tokens, const Tensor& labels,
                                                   const Tensor& input, float grad_scale, Tensor& loss_sum,
                                                   Tensor& output, const PackedSequence& packed = {}) override;
  Tensor backward_chunk(MicroBatchContext& ctx, const Tensor& grad_output) override;
  Tensor evaluate_chunk(int chunk, const Tensor& tokens, const Tensor& labels, const Tensor& input, LossSum& loss,
                        const PackedSequence& packed = {}) override;
  Tensor logits_chunk(int chunk, const std::vector<int32_t>& context, const Tensor& input,
                      std::vector<float>& logits) override;

  // q_proj, k_proj, v_proj, o_proj (with MLA: q_proj or q_a_proj and q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj),
  // then gate_up_proj (gate_proj and up_proj as one [2F, C] GEMM: gate rows first) and down_proj, of each layer in
  // order: "model.layers.{i}.self_attn.q_proj", "....mlp.gate_up_proj".
  void for_each_linear(const LinearVisitor& visit) override;

  std::vector<FlatRange> param_units() const override;
  void bind_units(const UnitBuffers& buffers) override;
  void set_param_hooks(ParamUnitHooks* hooks) override { hooks_ = hooks; }
  TensorParallelGradSums tensor_parallel_grad_sums() const override;
  std::vector<MoeLayerRouting> moe_routing() const override;
  void clear_moe_routing() override;
  std::vector<LossSum> mtp_losses() const override { return mtp_sums_; }
  void clear_mtp_losses() override { mtp_sums_.assign(mtp_.size(), LossSum()); }
  std::vector<FlatRange> expert_ranges() const override;
  std::vector<FlatRange> expert_weight_ranges() const override;

 private:
  struct Block {
    std::string name;  // "model.layers.{i}", for profiling scopes
    RmsNorm input_norm;
    Attention attention;     // unless multi_latent_attention
    MlaAttention mla;        // multi_latent_attention
    bool is_mla = false;
    RmsNorm post_attention_norm;
    SwiGluMlp mlp;  // dense layers
    bool is_moe = false;
    MoeLayer moe;   // MoE layers (ModelArgs::is_moe_layer)
  };
  struct BlockSaved;  // one block's activations in a Context
  // A multi-token prediction module (ModelArgs::mtp_num_layers): the RMSNorms of the shifted tokens' embedding and of
  // the previous depth's hidden state, eh_proj over their concatenation, one layer, its own final norm; the embedding
  // and the output layer are the model's.
  struct MtpModule {
    RmsNorm enorm;
    RmsNorm hnorm;
    std::unique_ptr<Linear> eh_proj;
    Block block;
    RmsNorm final_norm;
  };
  struct MtpSaved;  // one module's activations in a Context
  // What chunk `chunk` of this stage runs: layers [begin, end), whether it embeds the tokens (the first stage's
  // first chunk) and whether it ends in the final norm and the output layer (the last stage's last chunk).
  struct ChunkPlan {
    int64_t begin = 0;
    int64_t end = 0;
    bool embeds = false;
    bool head = false;
  };
  ChunkPlan chunk_plan(int chunk) const;
  // The embedding's weights are on this stage: the first, or the last with a tied output layer (its copy).
  bool owns_embedding() const {
    return pipeline_.first() || (pipeline_.last() && !args_.untie_embeddings_and_output_weights);
  }
  // Whether this stage holds layer i.
  bool owns_layer(int64_t i) const { return layer_unit_[static_cast<size_t>(i)] != kNoUnit; }
  // The whole model as one chunk, for forward, backward, evaluate and next_token_logits.
  void check_single_chunk(const char* what) const;
  struct Context;     // one micro-batch's (llama.cpp)

  // Points every module at its weights and gradients in `buffers`' pieces.
  void bind_layers(const UnitBuffers& buffers);
  // Hooks, when set.
  void hook_before_forward(size_t unit) { if (hooks_ != nullptr) hooks_->before_forward(unit); }
  void hook_after_forward(size_t unit) { if (hooks_ != nullptr) hooks_->after_forward(unit); }
  void hook_before_backward(size_t unit) { if (hooks_ != nullptr) hooks_->before_backward(unit); }
  void hook_after_backward(size_t unit) { if (hooks_ != nullptr) hooks_->after_backward(unit); }
  static constexpr size_t kNoUnit = static_cast<size_t>(-1);
  size_t last_unit() const { return head_unit_; }
  size_t block_unit(int64_t i) const { return layer_unit_[static_cast<size_t>(i)]; }
  // Chunk `chunk` into ctx (its tokens, packing and activations): the embedding of the tokens or `input`, the
  // chunk's blocks, and the final norm if it has the head: [B·T, C]. chunks: the tokens are this rank's chunks of the
  // sequences (context parallelism, when cp_ has several ranks), attention the ring's. The final norm's and the
  // output layer's units stay in use (hooks) until end_head_forward().
  Tensor forward_hidden(Context& ctx, int chunk, const Tensor& tokens, const Tensor& input,
                        const PackedSequence& packed, bool chunks);
  // Backward of the chunk ctx's forward ran: from the loss (head) or `grad_output`; the gradient of its input.
  Tensor backward_hidden(Context& ctx, const Tensor& grad_output, const GradsReadyFn& grads_ready);
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
  // Training: after the main loss, the modules' forwards, their losses and the losses' gradients (scaled by
  // mtp_loss_scaling_factor / D and by the micro-batch's counted tokens over the depth's), adding each depth's
  // Σ token losses and counted tokens to mtp_sums_.
  void mtp_forward(Context& ctx, const Tensor& labels, float grad_scale);
  // Their backward, from the last depth down: the gradient they give the decoder's last hidden state (before the
  // final norm).
  Tensor mtp_backward(Context& ctx);
  Tensor block_backward(Block& b, BlockSaved& saved, const Tensor& dx, const Context& ctx);
  // The rope rows a forward of `seq` tokens reads: the first `seq` rows of rope_, or all of them for per-token
  // positions (packed.position_ids).
  RopeTable rope_for(int64_t seq, const PackedSequence& packed) const;

  ModelArgs args_;
  PipelineStage pipeline_;
  std::vector<std::pair<int64_t, int64_t>> chunks_;  // this stage's chunks' layers (one chunk of all at pp 1)
  std::vector<size_t> layer_unit_;                   // [num_layers]: the unit of each layer held, else kNoUnit
  size_t head_unit_ = 0;                             // the final norm's (and untied output layer's) unit
  TensorParallelGroup tp_;
  ContextParallelGroup cp_;
  ExpertParallelGroup ep_;
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
  std::vector<MtpModule> mtp_;     // on the (only) stage: pipeline parallelism is refused with them
  std::vector<LossSum> mtp_sums_;  // per depth, since clear_mtp_losses
  RmsNorm final_norm_;
  LmLoss lm_loss_;
  RopeTable rope_;  // [max_seq_length, rope_dim() / 2]
  // The features RoPE rotates per head: the head dim, or MLA's qk_pos_emb_head_dim.
  int64_t rope_dim() const { return args_.multi_latent_attention ? args_.qk_pos_emb_head_dim : args_.kv_channels; }
};

}  // namespace primus
