#include "models/llama.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

namespace {

std::string layer_prefix(int64_t i) { return fmt::format("model.layers.{}.", i); }

RopeConfig rope_config(const ModelArgs& a) {
  return RopeConfig{a.rotary_base,
                    a.use_rope_scaling,
                    a.rope_scaling_factor,
                    a.rope_scaling_low_freq_factor,
                    a.rope_scaling_high_freq_factor,
                    a.rope_scaling_original_max_position_embeddings,
                    YarnConfig{a.yarn, a.rotary_scaling_factor, a.original_max_position_embeddings, a.beta_fast,
                               a.beta_slow, a.mscale, a.mscale_all_dim}};
}

}  // namespace

MoeParamNames moe_param_names(const ModelArgs& a, const std::string& pre) {
  const bool qwen3 = a.qk_layernorm || a.multi_latent_attention;  // DeepSeek-V2/V3 name theirs as Qwen3-MoE does
  const std::string block = pre + (qwen3 ? "mlp." : "block_sparse_moe.");
  MoeParamNames names;
  names.gate = block + "gate.weight";
  names.expert_bias = block + "gate.e_score_correction_bias";
  for (int64_t e = 0; e < a.num_experts; ++e) {
    const std::string expert = fmt::format("{}experts.{}.", block, e);
    names.gate_proj.push_back(expert + (qwen3 ? "gate_proj.weight" : "w1.weight"));
    names.up_proj.push_back(expert + (qwen3 ? "up_proj.weight" : "w3.weight"));
    names.down_proj.push_back(expert + (qwen3 ? "down_proj.weight" : "w2.weight"));
  }
  names.shared = block + "shared_experts.";
  names.shared_gate = names.shared + "gate_proj.weight";
  names.shared_up = names.shared + "up_proj.weight";
  names.shared_down = names.shared + "down_proj.weight";
  return names;
}

struct LlamaModel::BlockSaved {
  RmsNormSaved input_norm;
  AttentionSaved attention;
  MlaSaved mla;
  RmsNormSaved post_norm;
  MlpSaved mlp;
  MoeSaved moe;
  Tensor chunk_input;  // full recompute: the input of the chunk this block starts, else undefined

  void release_activations() {  // all but chunk_input
    input_norm = RmsNormSaved();
    attention = AttentionSaved();
    mla = MlaSaved();
    post_norm = RmsNormSaved();
    mlp = MlpSaved();
    moe = MoeSaved();
  }
};

struct LlamaModel::MtpSaved {
  Tensor tokens;  // [N] the tokens k ahead (0 past a row's end)
  RmsNormSaved enorm;
  RmsNormSaved hnorm;
  Tensor joined;  // [N, 2C] eh_proj's input
  BlockSaved block;
  RmsNormSaved final_norm;
  LmLossSaved loss;
};

// Everything one micro-batch's backward needs from its forward; nothing of it lives in the model, so contexts of
// several micro-batches (of any shapes and packings) can be alive at once.
struct LlamaModel::Context final : MicroBatchContext {
  const LlamaModel* model = nullptr;  // whose forward made it
  int chunk = 0;                      // the model chunk it ran (pipeline parallelism; 0 otherwise)
  bool awaiting_backward = false;     // a training forward's, not yet consumed by backward
  RecomputeConfig recompute;          // as set when the forward ran
  float aux_grad_scale = 0.0f;        // the MoE aux and z losses' weight: this micro-batch's share of the step's tokens
  int64_t batch = 0;                  // B of [B, T]
  Tensor tokens;                      // [N] ids
  PackedSequence packed;              // undefined tensors when not packed (context parallel: the chunks' positions)
  const ContextParallelGroup* ring = nullptr;  // context parallel: the tokens are this rank's chunks
  bool split_rows = false;            // sequence parallel: blocks pass this rank's tp-th of the rows between them
  RopeTable rope;                     // the rows of the model's table this micro-batch reads
  std::vector<BlockSaved> blocks;
  RmsNormSaved final_norm;
  LmLossSaved lm_loss;
  std::vector<MtpSaved> mtp;  // multi-token prediction modules, by depth
};

std::vector<ParamSpec> LlamaModel::param_specs(const ModelArgs& a, int tp_size, int tp_rank) {
  return param_specs(a, tp_size, tp_rank, PipelineStage());
}

std::vector<ParamSpec> LlamaModel::param_specs(const ModelArgs& a, int tp_size, int tp_rank,
                                               const PipelineStage& stage) {
  return param_specs(a, tp_size, tp_rank, stage, 1, 0);
}

std::vector<ParamSpec> LlamaModel::param_specs(const ModelArgs& a, int tp_size, int tp_rank,
                                               const PipelineStage& stage, int ep_size, int ep_rank) {
  PRIMUS_CHECK(ep_size >= 1 && ep_rank >= 0 && ep_rank < ep_size && (a.num_experts == 0 || a.num_experts % ep_size == 0),
               "[model] expert-parallel rank {} of {} for {} experts", ep_rank, ep_size, a.num_experts);
  PRIMUS_CHECK(a.vocab_size > 0, "model vocab_size must be resolved before building the model");
  PRIMUS_CHECK(a.num_experts == 0 || tp_size == 1,
               "[model] num_experts: MoE layers are not split over {} tensor-parallel ranks yet", tp_size);
  PRIMUS_CHECK(!a.multi_latent_attention || tp_size == 1,
               "[model] multi_latent_attention: MLA is not split over {} tensor-parallel ranks yet", tp_size);
  const int64_t C = a.hidden_size, D = a.kv_channels;
  const bool kv_replicated = a.num_query_groups < tp_size;  // each key/value group on tp / groups ranks
  PRIMUS_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size && a.num_attention_heads % tp_size == 0 &&
                   (kv_replicated ? tp_size % a.num_query_groups : a.num_query_groups % tp_size) == 0 &&
                   a.ffn_hidden_size % tp_size == 0 &&
                   a.vocab_size % tp_size == 0,
               "[model] {} heads, {} query groups, ffn {} and vocabulary {} do not split over {} tensor-parallel ranks",
               a.num_attention_heads, a.num_query_groups, a.ffn_hidden_size, a.vocab_size, tp_size);
  const double std = a.init_method_std;
  // Megatron's scaled init for the projections that write into the residual stream.
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(a.num_layers));
  auto norm = [](std::string name, int64_t n) { return ParamSpec{std::move(name), {n}, ParamInit::kOnes, 0.0, false, {}}; };
  // Rank tp_rank's part of a [rows, cols] weight cut along `dim` into tp_size equal slices.
  auto weight = [&](std::string name, int64_t rows, int64_t cols, int dim, double s) {
    Shape shape{rows, cols};
    ParamSlice slice;
    if (tp_size > 1) {
      const int64_t part = shape[dim] / tp_size;
      slice = ParamSlice{dim, tp_rank * part, shape[dim]};
      shape[dim] = part;
    }
    return ParamSpec{std::move(name), std::move(shape), ParamInit::kNormal, s, true, slice};
  };
  constexpr int kRows = 0, kColumns = 1;  // column-parallel layers split their output rows, row-parallel ones columns
  const int64_t q_out = a.num_attention_heads * D, kv_out = a.num_query_groups * D, F = a.ffn_hidden_size;
  // k/v: this rank's key/value heads; with fewer groups than ranks, the one group its query heads read (rank r's
  // heads are r's tp-th of the query heads, and group g serves the g-th num_query_groups-th of them).
  auto kv_weight = [&](std::string name) {
    if (!kv_replicated) return weight(std::move(name), kv_out, C, kRows, std);
    const int replicas = tp_size / static_cast<int>(a.num_query_groups);
    return ParamSpec{std::move(name), {D, C}, ParamInit::kNormal, std, true,
                     ParamSlice{kRows, (tp_rank / replicas) * D, kv_out, tp_rank % replicas}};
  };

  // The layers of the stage's chunks (ascending: chunk v of stage s is the (v·pp + s)-th group of layers).
  std::vector<bool> held(static_cast<size_t>(a.num_layers), stage.chunks.empty());
  for (const auto& [begin, end] : stage.chunks) {
    PRIMUS_CHECK(begin >= 0 && begin < end && end <= a.num_layers, "[model] pipeline chunk of layers [{}, {}) of {}",
                 begin, end, a.num_layers);
    for (int64_t i = begin; i < end; ++i) held[static_cast<size_t>(i)] = true;
  }
  const bool tied = !a.untie_embeddings_and_output_weights;
  std::vector<ParamSpec> specs;
  if (stage.first() || (stage.last() && tied)) {
    specs.push_back(weight("model.embed_tokens.weight", a.vocab_size, C, kRows, std));
  }
  // One transformer layer's parameters under prefix p ("model.layers.{i}."), its MLP a mixture of experts or dense.
  auto add_layer = [&](const std::string& p, bool moe) {
    specs.push_back(norm(p + "input_layernorm.weight", C));
    if (a.multi_latent_attention) {
      // DeepSeek-V2's names and order (layers/mla.h).
      const int64_t H = a.num_attention_heads, Dqk = a.qk_head_dim + a.qk_pos_emb_head_dim;
      if (a.q_lora_rank > 0) {
        specs.push_back(weight(p + "self_attn.q_a_proj.weight", a.q_lora_rank, C, kRows, std));
        specs.push_back(norm(p + "self_attn.q_a_layernorm.weight", a.q_lora_rank));
        specs.push_back(weight(p + "self_attn.q_b_proj.weight", H * Dqk, a.q_lora_rank, kRows, std));
      } else {
        specs.push_back(weight(p + "self_attn.q_proj.weight", H * Dqk, C, kRows, std));
      }
      specs.push_back(
          weight(p + "self_attn.kv_a_proj_with_mqa.weight", a.kv_lora_rank + a.qk_pos_emb_head_dim, C, kRows, std));
      specs.push_back(norm(p + "self_attn.kv_a_layernorm.weight", a.kv_lora_rank));
      specs.push_back(
          weight(p + "self_attn.kv_b_proj.weight", H * (a.qk_head_dim + a.v_head_dim), a.kv_lora_rank, kRows, std));
      specs.push_back(weight(p + "self_attn.o_proj.weight", C, H * a.v_head_dim, kColumns, out_std));
    } else {
      specs.push_back(weight(p + "self_attn.q_proj.weight", q_out, C, kRows, std));
      specs.push_back(kv_weight(p + "self_attn.k_proj.weight"));
      specs.push_back(kv_weight(p + "self_attn.v_proj.weight"));
      specs.push_back(weight(p + "self_attn.o_proj.weight", C, q_out, kColumns, out_std));
    }
    if (a.qk_layernorm) {
      specs.push_back(norm(p + "self_attn.q_norm.weight", D));
      specs.push_back(norm(p + "self_attn.k_norm.weight", D));
    }
    specs.push_back(norm(p + "post_attention_layernorm.weight", C));
    if (moe) {
      // Each expert's gate_proj then up_proj, expert after expert, then every down_proj: the [E, 2F, C] and
      // [E, C, F] weights of the grouped GEMMs are then views of the flat buffer.
      const MoeParamNames n = moe_param_names(a, p);
      const int64_t Fe = a.moe_ffn_hidden_size;
      specs.push_back(weight(n.gate, a.num_experts, C, kRows, std));
      // Not trained by the optimizer (no gradient, no decay): the trainer moves it after each step.
      if (a.moe_router_enable_expert_bias) specs.push_back({n.expert_bias, {a.num_experts}, ParamInit::kZeros, 0.0, false, {}});
      // This expert-parallel rank's experts (all of them at ep 1).
      const int64_t local = a.num_experts / ep_size, first = ep_rank * local;
      for (int64_t e = first; e < first + local; ++e) {
        specs.push_back(weight(n.gate_proj[e], Fe, C, kRows, std));
        specs.push_back(weight(n.up_proj[e], Fe, C, kRows, std));
      }
      for (int64_t e = first; e < first + local; ++e) specs.push_back(weight(n.down_proj[e], C, Fe, kColumns, out_std));
      if (const int64_t S = a.moe_shared_expert_intermediate_size; S > 0) {
        specs.push_back(weight(n.shared_gate, S, C, kRows, std));
        specs.push_back(weight(n.shared_up, S, C, kRows, std));
        specs.push_back(weight(n.shared_down, C, S, kColumns, out_std));
      }
      return;
    }
    specs.push_back(weight(p + "mlp.gate_proj.weight", F, C, kRows, std));
    specs.push_back(weight(p + "mlp.up_proj.weight", F, C, kRows, std));
    specs.push_back(weight(p + "mlp.down_proj.weight", C, F, kColumns, out_std));
  };
  for (int64_t i = 0; i < a.num_layers; ++i) {
    if (held[static_cast<size_t>(i)]) add_layer(layer_prefix(i), a.is_moe_layer(i));
  }
  if (!stage.last()) return specs;
  specs.push_back(norm("model.norm.weight", C));
  if (!tied) specs.push_back(weight("lm_head.weight", a.vocab_size, C, kRows, std));
  // Multi-token prediction modules after the output layer, on the last stage (they read its output layer), under
  // DeepSeek-V3's names: module k is "model.layers.{num_layers + k - 1}": enorm and hnorm (the RMSNorms of the
  // shifted tokens' embedding and of the previous depth's hidden state), eh_proj [C, 2C] over their concatenation
  // (embedding half first), one layer of the last layer's kind, and shared_head.norm (its final norm). The
  // checkpoint's embed_tokens and shared_head.head of the module are copies of the model's embedding and output
  // layer, which the module shares: they are no parameters of their own here.
  for (int64_t k = 1; k <= a.mtp_num_layers; ++k) {
    const std::string p = layer_prefix(a.num_layers + k - 1);
    specs.push_back(norm(p + "enorm.weight", C));
    specs.push_back(norm(p + "hnorm.weight", C));
    specs.push_back(weight(p + "eh_proj.weight", C, 2 * C, kRows, std));
    add_layer(p, a.is_mtp_moe_layer());
    specs.push_back(norm(p + "shared_head.norm.weight", C));
  }
  return specs;
}

double LlamaModel::flops_per_token(const ModelArgs& a, int64_t seq_length) {
  // 6 FLOPs per matmul parameter (forward 2, backward 4) plus attention's QKᵀ and PV, forward and backward,
  // without halving for causality (the PaLM/Megatron convention the reference uses too).
  // MLA: QKᵀ over Dn + Dr features a head, PV over Dv.
  const double attention_width = a.multi_latent_attention
                                     ? 0.5 * static_cast<double>(a.qk_head_dim + a.qk_pos_emb_head_dim + a.v_head_dim)
                                     : static_cast<double>(a.kv_channels);
  // Multi-token prediction modules add a layer's attention each (their matmuls are in matmul_params).
  const int64_t attention_layers = a.num_layers + a.mtp_num_layers;
  return 6.0 * static_cast<double>(matmul_params(a)) +
         12.0 * static_cast<double>(attention_layers * seq_length * a.num_attention_heads) * attention_width;
}

int64_t LlamaModel::matmul_params(const ModelArgs& a) {
  int64_t total = 0;
  for (const ParamSpec& s : param_specs(a)) {
    if (s.shape.size() == 2 && s.name != "model.embed_tokens.weight") total += shape_numel(s.shape);
  }
  if (!a.untie_embeddings_and_output_weights) total += a.vocab_size * a.hidden_size;  // tied head still multiplies
  // Each multi-token prediction module runs the shared output layer once more.
  total += a.mtp_num_layers * a.vocab_size * a.hidden_size;
  // A token passes through k of the E experts of a MoE layer: the others' weights do no work for it.
  const int64_t idle_experts = std::max<int64_t>(a.num_experts - a.moe_router_topk, 0);
  int64_t moe_layers = a.is_mtp_moe_layer() ? a.mtp_num_layers : 0;
  for (int64_t i = 0; i < a.num_layers; ++i) moe_layers += a.is_moe_layer(i) ? 1 : 0;
  total -= moe_layers * idle_experts * 3 * a.moe_ffn_hidden_size * a.hidden_size;
  return total;
}

LlamaModel::LlamaModel(const ModelArgs& args, int64_t max_seq_length, Device device, DType compute_dtype,
                       const ModelParallel& parallel)
    : args_(args),
      pipeline_(parallel.pipeline),
      tp_(parallel.tp),
      cp_(parallel.cp),
      ep_(parallel.ep),
      sequence_parallel_(parallel.sequence_parallel && parallel.tp.size() > 1),
      max_seq_length_(max_seq_length),
      device_(device),
      compute_dtype_(compute_dtype),
      params_(param_specs(args, parallel.tp.size(), parallel.tp.rank(), parallel.pipeline, parallel.ep.size(),
                          parallel.ep.rank()),
              device) {
  PRIMUS_CHECK(pipeline_.stages >= 1 && pipeline_.stage >= 0 && pipeline_.stage < pipeline_.stages,
               "[model] pipeline stage {} of {}", pipeline_.stage, pipeline_.stages);
  chunks_ = pipeline_.chunks;
  if (chunks_.empty()) {
    PRIMUS_CHECK(pipeline_.stages == 1, "[model] pipeline stage {} of {} without layers", pipeline_.stage,
                 pipeline_.stages);
    chunks_.push_back({0, args_.num_layers});
  }
  // Units in forward order (param_units): the embedding (or its tied copy), each layer held, the head.
  layer_unit_.assign(static_cast<size_t>(args_.num_layers), kNoUnit);
  size_t unit = owns_embedding() ? 1 : 0;
  for (int64_t i = 0; i < args_.num_layers; ++i) {
    if (params_.contains(layer_prefix(i) + "input_layernorm.weight")) layer_unit_[static_cast<size_t>(i)] = unit++;
  }
  head_unit_ = unit;
  PRIMUS_CHECK(compute_dtype == DType::kF32 || compute_dtype == DType::kBF16, "[model] compute dtype {} unsupported",
               dtype_name(compute_dtype));
  // MoE runs on the CPU engine in fp32 and on CUDA in fp32 or bf16 (the router in fp32 either way, layers/moe.h).
  if (args_.num_experts > 0 && device_.is_cpu() && compute_dtype_ != DType::kF32) {
    throw UsageError("[config] num_experts: MoE on the CPU engine runs in fp32 only; bf16 mixed precision runs on cuda");
  }
  if (args_.mtp_num_layers > 0) {
    // As MoE and MLA: fp32 on the CPU engine, fp32 or bf16 on CUDA.
    if (device_.is_cpu() && compute_dtype_ != DType::kF32) {
      throw UsageError("[config] mtp_num_layers: multi-token prediction on the CPU engine runs in fp32 only");
    }
    const std::string why = mtp_layout_refusal(args_, tp_.size(), pipeline_.stages, cp_.size(), false);
    if (!why.empty()) throw UsageError("[config] " + why);
  }
  // MLA runs on the CPU engine in fp32 and on CUDA in fp32 or bf16.
  if (args_.multi_latent_attention && device_.is_cpu() && compute_dtype_ != DType::kF32) {
    throw UsageError(
        "[config] multi_latent_attention: MLA on the CPU engine runs in fp32 only; bf16 mixed precision runs on cuda");
  }
  if (compute_dtype_ != DType::kF32) compute_weights_ = Tensor::empty({params_.numel()}, compute_dtype_, device_);
  RopeTable host_rope = make_rope_table(rope_dim(), max_seq_length_, rope_config(args_));
  rope_ = RopeTable{ops::to_device(host_rope.cos, device_), ops::to_device(host_rope.sin, device_)};
  // Layers compute with the bf16 copy in mixed precision, else with the master weights themselves.
  const Tensor& compute_flat = compute_dtype_ == DType::kF32 ? params_.flat_params() : compute_weights_;
  UnitBuffers own;
  for (const FlatRange& unit : param_units()) {
    own.ranges.push_back(unit);
    own.compute.push_back(compute_flat.slice_elements(unit.begin, {unit.size()}));
    own.grads.push_back(params_.flat_grads().slice_elements(unit.begin, {unit.size()}));
  }
  bind_layers(own);
}

std::vector<FlatRange> LlamaModel::param_units() const {
  // The flat layout (param_specs): embedding, blocks 0..L-1, final norm, untied head.
  auto start_of = [&](const std::string& name) { return params_.offset(params_.index_of(name)); };
  // On a pipeline stage: the units it holds, in the same order.
  std::vector<int64_t> starts;
  if (owns_embedding()) starts.push_back(0);
  for (int64_t i = 0; i < args_.num_layers; ++i) {
    if (owns_layer(i)) starts.push_back(start_of(layer_prefix(i) + "input_layernorm.weight"));
  }
  if (pipeline_.last()) starts.push_back(start_of("model.norm.weight"));
  starts.push_back(params_.numel());
  std::vector<FlatRange> units;
  for (size_t u = 0; u + 1 < starts.size(); ++u) units.push_back({starts[u], starts[u + 1]});
  return units;
}

void LlamaModel::bind_units(const UnitBuffers& buffers) {
  PRIMUS_CHECK(buffers.compute.size() == buffers.ranges.size() && buffers.grads.size() == buffers.ranges.size(),
               "[model] {} compute and {} gradient buffers for {} pieces", buffers.compute.size(), buffers.grads.size(),
               buffers.ranges.size());
  int64_t expected_begin = 0;
  for (size_t i = 0; i < buffers.ranges.size(); ++i) {
    const FlatRange& range = buffers.ranges[i];
    PRIMUS_CHECK(range.begin == expected_begin && !range.empty() && buffers.compute[i].numel() >= range.size() &&
                     buffers.compute[i].dtype() == compute_dtype_ && buffers.grads[i].numel() >= range.size() &&
                     buffers.grads[i].dtype() == DType::kF32,
                 "[model] piece {} [{}, {}) after {} bound to {} and {}", i, range.begin, range.end, expected_begin,
                 buffers.compute[i].describe(), buffers.grads[i].describe());
    expected_begin = range.end;
  }
  PRIMUS_CHECK(expected_begin == params_.numel(), "[model] the pieces cover [0, {}) of {} parameters", expected_begin,
               params_.numel());
  external_units_ = true;
  compute_weights_stale_ = false;
  compute_weights_ = Tensor();  // the model's own copy is no longer read
  bind_layers(buffers);
}

void LlamaModel::bind_layers(const UnitBuffers& buffers) {
  const float eps = static_cast<float>(args_.norm_epsilon);
  // The piece holding `numel` elements from `offset` (a parameter, or adjacent parameters bound as one tensor).
  auto piece_of = [&](int64_t offset, int64_t numel, const std::string& name) {
    const auto after = std::upper_bound(buffers.ranges.begin(), buffers.ranges.end(), offset,
                                        [](int64_t at, const FlatRange& r) { return at < r.begin; });
    PRIMUS_CHECK(after != buffers.ranges.begin() && offset + numel <= std::prev(after)->end,
                 "[model] {} ([{}, {})) does not lie within one piece of the bound buffers", name, offset,
                 offset + numel);
    return static_cast<size_t>(std::prev(after) - buffers.ranges.begin());
  };
  // A parameter's view in its piece's buffer; `rows` > 0 widens it to that many rows (two adjacent tensors as one).
  auto view = [&](const std::vector<Tensor>& piece_buffers, const std::string& name, int64_t rows = 0) {
    const size_t i = params_.index_of(name);
    Shape shape = params_.specs()[i].shape;
    if (rows > 0) shape[0] = rows;
    const size_t piece = piece_of(params_.offset(i), shape_numel(shape), name);
    return piece_buffers[piece].slice_elements(params_.offset(i) - buffers.ranges[piece].begin, shape);
  };
  auto p = [&](const std::string& name) { return view(buffers.compute, name); };
  auto g = [&](const std::string& name) { return view(buffers.grads, name); };
  // Two [rows, C] tensors adjacent in the flat buffers (param_specs keeps them so) as one [rows_a + rows_b, C].
  auto joined_rows = [&](const std::string& a, const std::string& b) {
    const size_t ia = params_.index_of(a), ib = params_.index_of(b);
    const Shape& sa = params_.specs()[ia].shape;
    const Shape& sb = params_.specs()[ib].shape;
    PRIMUS_CHECK(params_.offset(ib) == params_.offset(ia) + shape_numel(sa) && sa[1] == sb[1],
                 "[model] {} and {} must be adjacent for one GEMM", a, b);
    return sa[0] + sb[0];
  };
  // One MoE layer: the router, the experts' weights as [E, 2F, C] and [E, C, F] (param_specs keeps each kind
  // contiguous), the shared expert.
  auto bind_moe = [&](MoeLayer& moe, const std::string& pre) {
    const MoeParamNames n = moe_param_names(args_, pre);
    // This rank's experts: E of them, from `first` (all of them, from 0, without expert parallelism).
    const int64_t E = ep_.local_experts(args_.num_experts), first = ep_.first_expert(args_.num_experts);
    const int64_t C = args_.hidden_size, F = args_.moe_ffn_hidden_size;
    auto shaped = [&](const std::vector<Tensor>& piece_buffers, const std::string& name, const Shape& shape) {
      const size_t i = params_.index_of(name);
      const size_t piece = piece_of(params_.offset(i), shape_numel(shape), name);
      return piece_buffers[piece].slice_elements(params_.offset(i) - buffers.ranges[piece].begin, shape);
    };
    auto at = [&](const std::string& name) { return params_.offset(params_.index_of(name)); };
    for (int64_t e = first; e < first + E; ++e) {
      PRIMUS_CHECK(at(n.gate_proj[e]) == at(n.gate_proj[first]) + (e - first) * 2 * F * C &&
                       at(n.up_proj[e]) == at(n.gate_proj[e]) + F * C &&
                       at(n.down_proj[e]) == at(n.down_proj[first]) + (e - first) * C * F,
                   "[model] the experts of {} must be contiguous for the grouped GEMMs", pre);
    }
    moe.gate = std::make_unique<Linear>(p(n.gate), g(n.gate));
    // The fp32 master itself, not the bf16 copy: its steps (moe_router_bias_update_rate) are finer than bf16 resolves
    // near the bias's values, and the optimizer never changes it. Every expert's (the router is not split).
    moe.expert_bias = args_.moe_router_enable_expert_bias
                          ? params_.flat_params().slice_elements(at(n.expert_bias), {args_.num_experts})
                          : Tensor();
    moe.gate_up_weight = shaped(buffers.compute, n.gate_proj[first], {E, 2 * F, C});
    moe.gate_up_grad = shaped(buffers.grads, n.gate_proj[first], {E, 2 * F, C});
    moe.down_weight = shaped(buffers.compute, n.down_proj[first], {E, C, F});
    moe.down_grad = shaped(buffers.grads, n.down_proj[first], {E, C, F});
    // Expert parallelism injects the dispatcher that carries rows to the ranks of their experts.
    if (ep_.size() > 1) {
      moe.dispatcher = std::make_shared<AllToAllTokenDispatcher>(ep_);
    } else {
      moe.dispatcher = std::make_shared<LocalTokenDispatcher>();
    }
    moe.routing = MoeRouting{
        args_.moe_router_topk,
        args_.moe_router_score_function == "sigmoid" ? MoeScoreFunction::kSigmoid : MoeScoreFunction::kSoftmax,
        args_.moe_router_score_function == "sigmoid" || !args_.moe_router_pre_softmax,
        static_cast<float>(args_.moe_router_topk_scaling_factor), args_.moe_router_num_groups,
        args_.moe_router_group_topk};
    const bool balanced = args_.moe_router_load_balancing_type == "aux_loss" ||
                          args_.moe_router_load_balancing_type == "seq_aux_loss";
    moe.balancing = MoeBalancing{balanced ? static_cast<float>(args_.moe_aux_loss_coeff) : 0.0f,
                                 args_.moe_router_load_balancing_type == "seq_aux_loss",
                                 static_cast<float>(args_.moe_z_loss_coeff)};
    moe.capacity = MoeCapacity{args_.moe_expert_capacity_factor, args_.moe_token_drop_policy == "position",
                               args_.moe_pad_expert_input_to_capacity};
    moe.shared_expert = nullptr;
    if (args_.moe_shared_expert_intermediate_size > 0) {
      moe.shared_expert = std::make_unique<SwiGluMlp>();
      moe.shared_expert->gate_up_proj =
          std::make_unique<Linear>(view(buffers.compute, n.shared_gate, joined_rows(n.shared_gate, n.shared_up)),
                                   view(buffers.grads, n.shared_gate, joined_rows(n.shared_gate, n.shared_up)));
      moe.shared_expert->down_proj = std::make_unique<Linear>(p(n.shared_down), g(n.shared_down));
    }
  };
  auto p2 = [&](const std::string& a, const std::string& b) { return view(buffers.compute, a, joined_rows(a, b)); };
  auto g2 = [&](const std::string& a, const std::string& b) { return view(buffers.grads, a, joined_rows(a, b)); };
  // This rank's rows of the vocabulary (all of it on one rank), for the embedding and the output layer.
  const VocabShard vocab{tp_.rank() * (args_.vocab_size / tp_.size()), args_.vocab_size};
  // The embedding's and the output layer's sums over the vocabulary slices are the model's (summed()): all-reduced,
  // or reduce-scattered into this rank's rows under sequence parallelism.
  if (pipeline_.first()) embedding_ = Embedding{p("model.embed_tokens.weight"), g("model.embed_tokens.weight"), vocab, {}};
  // One layer's modules under prefix `pre` ("model.layers.{i}."): a MoE layer when `moe`.
  auto bind_block = [&](Block& b, const std::string& pre, bool moe) {
    b.name = pre.substr(0, pre.size() - 1);
    b.input_norm = RmsNorm{p(pre + "input_layernorm.weight"), g(pre + "input_layernorm.weight"), eps};
    b.post_attention_norm =
        RmsNorm{p(pre + "post_attention_layernorm.weight"), g(pre + "post_attention_layernorm.weight"), eps};
    auto linear = [&](const std::string& name) { return std::make_unique<Linear>(p(name), g(name)); };
    b.is_mla = args_.multi_latent_attention;
    if (b.is_mla) {
      MlaAttention& mla = b.mla;
      const std::string at = pre + "self_attn.";
      mla.q_proj = nullptr;  // rebinding (bind_units) replaces every module
      mla.q_a_proj = nullptr;
      mla.q_b_proj = nullptr;
      if (args_.q_lora_rank > 0) {
        mla.q_a_proj = linear(at + "q_a_proj.weight");
        mla.q_a_norm = RmsNorm{p(at + "q_a_layernorm.weight"), g(at + "q_a_layernorm.weight"), eps};
        mla.q_b_proj = linear(at + "q_b_proj.weight");
      } else {
        mla.q_proj = linear(at + "q_proj.weight");
      }
      mla.kv_a_proj_with_mqa = linear(at + "kv_a_proj_with_mqa.weight");
      mla.kv_a_norm = RmsNorm{p(at + "kv_a_layernorm.weight"), g(at + "kv_a_layernorm.weight"), eps};
      mla.kv_b_proj = linear(at + "kv_b_proj.weight");
      mla.o_proj = linear(at + "o_proj.weight");
      mla.heads = args_.num_attention_heads;
      mla.nope_dim = args_.qk_head_dim;
      mla.rope_dim = args_.qk_pos_emb_head_dim;
      mla.v_dim = args_.v_head_dim;
      mla.query_scale = static_cast<float>(yarn_softmax_scale_factor(rope_config(args_)));
    } else {
      Attention& at = b.attention;
      at.q_proj = linear(pre + "self_attn.q_proj.weight");
      at.k_proj = linear(pre + "self_attn.k_proj.weight");
      at.v_proj = linear(pre + "self_attn.v_proj.weight");
      at.o_proj = linear(pre + "self_attn.o_proj.weight");
      at.heads = args_.num_attention_heads / tp_.size();
      at.kv_heads = std::max<int64_t>(1, args_.num_query_groups / tp_.size());  // one replicated group when fewer
      at.head_dim = args_.kv_channels;
      at.qk_norm = args_.qk_layernorm;
      if (at.qk_norm) {
        // Each rank normalises its own heads with the shared weights: their gradients are partial, summed over the
        // group once per step (tensor_parallel_grad_sums).
        at.q_norm = RmsNorm{p(pre + "self_attn.q_norm.weight"), g(pre + "self_attn.q_norm.weight"), eps};
        at.k_norm = RmsNorm{p(pre + "self_attn.k_norm.weight"), g(pre + "self_attn.k_norm.weight"), eps};
      }
    }
    b.is_moe = moe;
    if (b.is_moe) {
      bind_moe(b.moe, pre);
      return;
    }
    SwiGluMlp& m = b.mlp;
    const std::string gate = pre + "mlp.gate_proj.weight", up = pre + "mlp.up_proj.weight";
    m.gate_up_proj = std::make_unique<Linear>(p2(gate, up), g2(gate, up));
    m.down_proj = linear(pre + "mlp.down_proj.weight");
  };
  blocks_.resize(args_.num_layers);
  for (int64_t i = 0; i < args_.num_layers; ++i) {
    if (owns_layer(i)) bind_block(blocks_[i], layer_prefix(i), args_.is_moe_layer(i));
  }
  if (!pipeline_.last()) return;
  final_norm_ = RmsNorm{p("model.norm.weight"), g("model.norm.weight"), eps};
  const std::string head = args_.untie_embeddings_and_output_weights ? "lm_head.weight" : "model.embed_tokens.weight";
  lm_loss_ = LmLoss{p(head), g(head), vocab, tp_};
  lm_loss_.dhidden_partial = true;
  // The multi-token prediction modules (param_specs: after the output layer, in the last unit).
  mtp_.resize(static_cast<size_t>(args_.mtp_num_layers));
  for (int64_t k = 0; k < args_.mtp_num_layers; ++k) {
    const std::string pre = layer_prefix(args_.num_layers + k);
    MtpModule& m = mtp_[static_cast<size_t>(k)];
    m.enorm = RmsNorm{p(pre + "enorm.weight"), g(pre + "enorm.weight"), eps};
    m.hnorm = RmsNorm{p(pre + "hnorm.weight"), g(pre + "hnorm.weight"), eps};
    m.eh_proj = std::make_unique<Linear>(p(pre + "eh_proj.weight"), g(pre + "eh_proj.weight"));
    bind_block(m.block, pre, args_.is_mtp_moe_layer());
    m.final_norm = RmsNorm{p(pre + "shared_head.norm.weight"), g(pre + "shared_head.norm.weight"), eps};
  }
  if (mtp_sums_.size() != mtp_.size()) clear_mtp_losses();
}

RopeTable LlamaModel::rope_for(int64_t seq, const PackedSequence& packed) const {
  if (packed.position_ids.defined()) return rope_;
  const int64_t half = rope_dim() / 2;
  return RopeTable{rope_.cos.slice_elements(0, {seq, half}), rope_.sin.slice_elements(0, {seq, half})};
}

LlamaModel::ChunkPlan LlamaModel::chunk_plan(int chunk) const {
  PRIMUS_CHECK(chunk >= 0 && chunk < num_chunks(), "[model] chunk {} of this stage's {}", chunk, num_chunks());
  const auto [begin, end] = chunks_[static_cast<size_t>(chunk)];
  return ChunkPlan{begin, end, pipeline_.first() && chunk == 0, pipeline_.last() && chunk + 1 == num_chunks()};
}

void LlamaModel::check_single_chunk(const char* what) const {
  PRIMUS_CHECK(pipeline_.stages == 1 && num_chunks() == 1,
               "[model] {} of the whole model on pipeline stage {} of {}: run its chunks (forward_chunk)", what,
               pipeline_.stage, pipeline_.stages);
}

Tensor LlamaModel::forward_hidden(Context& ctx, int chunk, const Tensor& tokens, const Tensor& input,
                                  const PackedSequence& packed, bool chunks) {
  PRIMUS_CHECK(tokens.ndim() == 2, "[model] tokens {} must be [B, T]", tokens.describe());
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  PRIMUS_CHECK(T <= max_seq_length_, "[model] sequence of {} tokens exceeds the model's {}", T, max_seq_length_);
  for (const Tensor* t : {&packed.position_ids, &packed.segment_start}) {
    PRIMUS_CHECK(!t->defined() || t->shape() == tokens.shape(), "[model] packed-sequence input {} must match tokens {}",
                 t->describe(), tokens.describe());
  }
  const ChunkPlan plan = chunk_plan(chunk);
  ctx.model = this;
  ctx.chunk = chunk;
  ctx.recompute = recompute_;
  ctx.batch = B;
  ctx.packed = packed;
  if (chunks && cp_.size() > 1) {
    PRIMUS_CHECK(!packed.packed(),
                 "[model] packed documents (reset_position_ids, reset_attention_mask) are not implemented with context "
                 "parallelism");
    PRIMUS_CHECK(B % 2 == 0 && 2 * cp_.size() * T <= max_seq_length_,
                 "[model] context parallel over {} ranks: tokens {} must be this rank's two chunks of each sequence "
                 "(ContextParallelGroup::local_chunks) of at most {} tokens",
                 cp_.size(), tokens.describe(), max_seq_length_);
    if (!cp_positions_.defined() || cp_positions_.shape() != tokens.shape()) {
      cp_positions_ = ops::to_device(cp_.positions(B / 2, T), device_);
    }
    ctx.packed.position_ids = cp_positions_;
    ctx.ring = &cp_;
  }
  ctx.rope = rope_for(T, ctx.packed);
  // Sampling's contexts of any length run unsplit (the same sums as all-reduces); training and evaluation split
  // (make_process_groups checked the batch's rows divide).
  ctx.split_rows = chunk_rows(B * T) != B * T;
  ctx.blocks.resize(args_.num_layers);
  if (compute_dtype_ != DType::kF32 && compute_weights_stale_) {
    ops::cast(compute_weights_, params_.flat_params());
    compute_weights_stale_ = false;
  }
  ctx.tokens = tokens.reshape({B * T});
  Tensor x;
  if (plan.embeds) {
    const ops::ProfileScope scope("model.embed_tokens");
    hook_before_forward(0);
    x = summed(embedding_.forward(ctx.tokens), ctx);  // [N, C] (this rank's N / tp rows with split_rows)
    hook_after_forward(0);
  } else {
    const int64_t rows = chunk_rows(B * T);
    PRIMUS_CHECK(input.ndim() == 2 && input.dim(0) == rows && input.dim(1) == args_.hidden_size,
                 "[model] chunk {} of pipeline stage {} takes the hidden state [{}, {}], not {}", chunk,
                 pipeline_.stage, rows, args_.hidden_size, input.describe());
    x = input;
  }
  for (int64_t i = plan.begin; i < plan.end; ++i) {
    BlockSaved& saved = ctx.blocks[i];
    // Recompute chunks count from the start of this model chunk, so that none crosses into another stage's layers.
    auto [first, end] = ctx.recompute.chunk(i - plan.begin, plan.end - plan.begin);
    first += plan.begin, end += plan.begin;
    const size_t unit = block_unit(i);
    hook_before_forward(unit);
    if (first != end && i == first) saved.chunk_input = x;
    x = block_forward(blocks_[i], saved, x, ctx);
    if (blocks_[i].is_moe && ctx.awaiting_backward) blocks_[i].moe.record_routing(saved.moe);
    if (first != end) saved.release_activations();  // backward recomputes the chunk from chunk_input
    hook_after_forward(unit);
  }
  if (!plan.head) return x;
  // The final norm's and the output layer's unit stays in use until the caller's loss or logits are done
  // (end_head_forward).
  hook_before_forward(last_unit());
  if (!args_.untie_embeddings_and_output_weights) hook_before_forward(0);
  const ops::ProfileScope scope("model.norm");
  return gathered(final_norm_.forward(x, ctx.final_norm), ctx);
}

int64_t LlamaModel::chunk_rows(int64_t tokens) const {
  return sequence_parallel_ && tokens % tp_.size() == 0 ? tokens / tp_.size() : tokens;
}

void LlamaModel::check_split(const Context& ctx) const {
  PRIMUS_CHECK(ctx.split_rows == sequence_parallel_,
               "[model] sequence parallel over {} ranks: the micro-batch's {} rows (micro_batch_size x seq_length / "
               "context_parallel_size) must divide by tensor_model_parallel_size",
               tp_.size(), ctx.tokens.numel());
}

Tensor LlamaModel::gathered(const Tensor& x, const Context& ctx) const {
  return ctx.split_rows ? tp_.gather_rows(x) : x;
}

Tensor LlamaModel::summed(Tensor x, const Context& ctx) const {
  if (ctx.split_rows) return tp_.reduce_scatter_rows(x);
  tp_.sum(x);
  return x;
}

void LlamaModel::end_head_forward() {
  if (!args_.untie_embeddings_and_output_weights) hook_after_forward(0);
  hook_after_forward(last_unit());
}

Tensor LlamaModel::block_forward(Block& b, BlockSaved& saved, const Tensor& x, const Context& ctx) {
  const ops::ProfileScope block(b.name);
  Tensor a;
  {
    const ops::ProfileScope scope(b.name + ".self_attn");
    Tensor h = gathered(b.input_norm.forward(x, saved.input_norm), ctx);
    if (b.is_mla) {
      PRIMUS_CHECK(ctx.ring == nullptr, "[model] multi_latent_attention: MLA has no ring (context-parallel) attention");
      a = b.mla.forward(h, ctx.batch, ctx.rope, ctx.packed, saved.mla);
    } else {
      a = b.attention.forward(h, ctx.batch, ctx.rope, ctx.packed, saved.attention, ctx.ring);
    }
    a = summed(a, ctx);      // o_proj is row-parallel: each rank's heads give part of it
    ops::add_inplace(a, x);  // a = x + attention(x): the block's mid residual
  }
  const ops::ProfileScope scope(b.name + ".mlp");
  Tensor h2 = gathered(b.post_attention_norm.forward(a, saved.post_norm), ctx);
  // down_proj is row-parallel (MoE layers run on one tensor-parallel rank only: the sum is the identity)
  Tensor m = summed(
      b.is_moe ? b.moe.forward(h2, ctx.batch, ctx.aux_grad_scale, saved.moe) : b.mlp.forward(h2, saved.mlp), ctx);
  ops::add_inplace(m, a);
  return m;
}

Tensor LlamaModel::block_backward(Block& b, BlockSaved& saved, const Tensor& dx, const Context& ctx) {
  // x_out = mid + mlp(norm(mid)); mid = x_in + attn(norm(x_in)): each residual passes dx through.
  const ops::ProfileScope block(b.name + " (backward)");
  Tensor dmid;
  {
    const ops::ProfileScope scope(b.name + ".mlp (backward)");
    // gate/up are column-parallel: each rank's columns give part of their input's gradient
    const Tensor dmlp = gathered(dx, ctx);
    Tensor dh2 = summed(b.is_moe ? b.moe.backward(dmlp, saved.moe, hooks_) : b.mlp.backward(dmlp, saved.mlp), ctx);
    dmid = b.post_attention_norm.backward(dh2, saved.post_norm);
    ops::add_inplace(dmid, dx);
  }
  const ops::ProfileScope scope(b.name + ".self_attn (backward)");
  Tensor dh = summed(b.is_mla ? b.mla.backward(gathered(dmid, ctx), ctx.rope, ctx.packed, saved.mla)
                              : b.attention.backward(gathered(dmid, ctx), ctx.rope, ctx.packed, saved.attention,
                                                     ctx.ring),
                     ctx);  // likewise q/k/v
  Tensor dx_in = b.input_norm.backward(dh, saved.input_norm);
  ops::add_inplace(dx_in, dmid);
  saved.release_activations();
  return dx_in;
}

void LlamaModel::set_recompute(const RecomputeConfig& recompute) {
  PRIMUS_CHECK(recompute.num_layers >= 1, "[model] recompute_num_layers {} must be >= 1", recompute.num_layers);
  recompute_ = recompute;
  const bool selective = recompute.granularity == RecomputeConfig::Granularity::kSelective;
  auto apply = [&](Block& b) {
    b.mlp.recompute_act = selective;
    if (b.moe.shared_expert != nullptr) b.moe.shared_expert->recompute_act = selective;
  };
  for (Block& b : blocks_) apply(b);
  for (MtpModule& m : mtp_) apply(m.block);  // never recomputed in full: they keep their activations
}

std::unique_ptr<MicroBatchContext> LlamaModel::forward(const Tensor& tokens, const Tensor& labels, float grad_scale,
                                                       Tensor& loss_sum, const PackedSequence& packed) {
  check_single_chunk("forward");
  Tensor output;
  return forward_chunk(0, tokens, labels, Tensor(), grad_scale, loss_sum, output, packed);
}

std::unique_ptr<MicroBatchContext> LlamaModel::forward_chunk(int chunk, const Tensor& tokens, const Tensor& labels,
                                                             const Tensor& input, float grad_scale, Tensor& loss_sum,
                                                             Tensor& output, const PackedSequence& packed) {
  PRIMUS_CHECK(labels.shape() == tokens.shape(), "[model] labels {} must match tokens {}", labels.describe(),
               tokens.describe());
  auto ctx = std::make_unique<Context>();
  // Σ over the step's micro-batches of their tokens × grad_scale is 1 (every label counted): the aux losses of the
  // micro-batches average, weighted by their tokens.
  ctx->aux_grad_scale = static_cast<float>(tokens.numel()) * grad_scale;
  ctx->awaiting_backward = true;  // before the forward: its MoE layers record their routing
  const Tensor hidden = forward_hidden(*ctx, chunk, tokens, input, packed, true);
  check_split(*ctx);
  if (!chunk_plan(chunk).head) {
    output = hidden;
    return ctx;
  }
  output = Tensor();
  const ops::ProfileScope scope("lm_head (loss and its gradient)");
  const Tensor losses =
      lm_loss_.forward_with_grad(hidden, labels.reshape({labels.numel()}), grad_scale, ctx->lm_loss);
  ops::sum_into(loss_sum, losses);  // ignored targets have loss 0
  if (!mtp_.empty()) mtp_forward(*ctx, labels, grad_scale);
  end_head_forward();
  return ctx;
}

void LlamaModel::mtp_forward(Context& ctx, const Tensor& labels, float grad_scale) {
  if (ctx.packed.packed()) {
    throw UsageError("[config] mtp_num_layers: multi-token prediction over packed documents (reset_position_ids, "
                     "reset_attention_mask) is not implemented: its shifted tokens would cross documents");
  }
  const ops::ProfileScope scope("mtp");
  const int64_t T = labels.dim(1), N = labels.numel(), C = args_.hidden_size;
  const int64_t D = args_.mtp_num_layers;
  // The shifts are built on the host: the tokens and labels of a CPU-engine micro-batch are there already.
  const Tensor host_tokens = ops::to_device(ctx.tokens, kCpuDevice);
  const Tensor host_labels = ops::to_device(labels.reshape({N}), kCpuDevice);
  const int64_t counted = counted_tokens(host_labels);
  Tensor h = ctx.final_norm.x;  // the decoder's last hidden state, before its final norm
  ctx.mtp.resize(static_cast<size_t>(D));
  for (int64_t k = 1; k <= D; ++k) {
    MtpModule& m = mtp_[static_cast<size_t>(k - 1)];
    MtpSaved& s = ctx.mtp[static_cast<size_t>(k - 1)];
    // Position t of each row reads the token k ahead and predicts the label k ahead; past the row's end there is
    // neither (token 0, no target), as Megatron's roll leaves it.
    Tensor ids = Tensor::empty({N}, DType::kI32), targets = Tensor::empty({N}, DType::kI32);
    for (int64_t i = 0; i < N; ++i) {
      const bool inside = i % T + k < T;
      ids.i32()[i] = inside ? host_tokens.i32()[i + k] : 0;
      targets.i32()[i] = inside ? host_labels.i32()[i + k] : -1;
    }
    const int64_t counted_k = counted_tokens(targets);
    s.tokens = ops::to_device(ids, device_);
    const Tensor e = m.enorm.forward(embedding_.forward(s.tokens), s.enorm);
    const Tensor hn = m.hnorm.forward(h, s.hnorm);
    s.joined = Tensor::empty({N, 2 * C}, e.dtype(), device_);
    Tensor joined_heads = s.joined.reshape({N, 1, 2 * C});
    ops::head_concat(e.reshape({N, 1, C}), hn.reshape({N, 1, C}), joined_heads);  // the embedding's half first
    h = block_forward(m.block, s.block, m.eh_proj->forward(s.joined), ctx);
    if (m.block.is_moe && ctx.awaiting_backward) m.block.moe.record_routing(s.block.moe);  // as a decoder layer's
    // The depth's mean loss, weighted λ / D, in the step's per-token scale: Megatron's calculate_per_token_loss form
    // (this micro-batch's counted tokens over the depth's).
    const double weight = args_.mtp_loss_scaling_factor / static_cast<double>(D) * static_cast<double>(counted) /
                          static_cast<double>(std::max<int64_t>(1, counted_k));
    const Tensor losses = lm_loss_.forward_with_grad(m.final_norm.forward(h, s.final_norm),
                                                     ops::to_device(targets, device_),
                                                     static_cast<float>(grad_scale * weight), s.loss);
    Tensor sum = ops::zeros({1}, DType::kF32, device_);
    ops::sum_into(sum, losses);
    LossSum& total = mtp_sums_[static_cast<size_t>(k - 1)];
    total.loss_sum += ops::to_device(sum, kCpuDevice).f32()[0];
    total.tokens += counted_k;
  }
}

Tensor LlamaModel::mtp_backward(Context& ctx) {
  const int64_t C = args_.hidden_size;
  Tensor dh;  // the gradient of the hidden state the depth being handled produced, from the depths after it
  for (int64_t k = args_.mtp_num_layers; k >= 1; --k) {
    const ops::ProfileScope scope("mtp (backward)");
    MtpModule& m = mtp_[static_cast<size_t>(k - 1)];
    MtpSaved& s = ctx.mtp[static_cast<size_t>(k - 1)];
    Tensor d = m.final_norm.backward(summed(lm_loss_.backward(s.loss), ctx), s.final_norm);
    if (dh.defined()) ops::add_inplace(d, dh);
    const Tensor dy = block_backward(m.block, s.block, d, ctx);
    Tensor djoined;
    m.eh_proj->backward(s.joined, dy, djoined);
    const int64_t N = djoined.dim(0);
    Tensor de = Tensor::empty({N, 1, C}, djoined.dtype(), device_), dhn = Tensor::empty({N, 1, C}, djoined.dtype(), device_);
    ops::head_concat_backward(djoined.reshape({N, 1, 2 * C}), de, dhn);
    embedding_.backward(s.tokens, m.enorm.backward(de.reshape({N, C}), s.enorm));
    dh = m.hnorm.backward(dhn.reshape({N, C}), s.hnorm);
    s = MtpSaved();
  }
  return dh;
}

LossSum LlamaModel::evaluate(const Tensor& tokens, const Tensor& labels, const PackedSequence& packed) {
  check_single_chunk("evaluate");
  LossSum loss;
  evaluate_chunk(0, tokens, labels, Tensor(), loss, packed);
  return loss;
}

Tensor LlamaModel::evaluate_chunk(int chunk, const Tensor& tokens, const Tensor& labels, const Tensor& input,
                                  LossSum& loss, const PackedSequence& packed) {
  PRIMUS_CHECK(labels.shape() == tokens.shape(), "[model] labels {} must match tokens {}", labels.describe(),
               tokens.describe());
  Tensor losses;
  {
    Context ctx;  // nothing is kept; freed before the sum, as soon as the losses are queued
    const Tensor hidden = forward_hidden(ctx, chunk, tokens, input, packed, true);
    check_split(ctx);
    if (!chunk_plan(chunk).head) return hidden;
    losses = lm_loss_.forward(hidden, labels.reshape({labels.numel()}));
    end_head_forward();
  }
  Tensor sum = ops::zeros({1}, DType::kF32, device_);
  ops::sum_into(sum, losses);
  const Tensor host_labels = labels.device().is_cpu() ? labels : ops::to_device(labels, kCpuDevice);
  loss = LossSum{static_cast<double>(ops::to_device(sum, kCpuDevice).f32()[0]), counted_tokens(host_labels)};
  return Tensor();
}

void LlamaModel::backward(MicroBatchContext& base, const GradsReadyFn& grads_ready) {
  check_single_chunk("backward");
  auto* found = dynamic_cast<Context*>(&base);
  PRIMUS_CHECK(found != nullptr && found->model == this, "[model] backward of a context from another model's forward");
  backward_hidden(*found, Tensor(), grads_ready);
}

Tensor LlamaModel::backward_chunk(MicroBatchContext& base, const Tensor& grad_output) {
  auto* found = dynamic_cast<Context*>(&base);
  PRIMUS_CHECK(found != nullptr && found->model == this, "[model] backward of a context from another model's forward");
  return backward_hidden(*found, grad_output, {});
}

Tensor LlamaModel::backward_hidden(Context& ctx, const Tensor& grad_output, const GradsReadyFn& grads_ready) {
  PRIMUS_CHECK(ctx.awaiting_backward, "[model] backward of a micro-batch context that has had its backward");
  const ChunkPlan plan = chunk_plan(ctx.chunk);
  // The flat layout (param_specs): embedding, blocks 0..L-1, final norm, untied head. Ranges are reported from
  // the end down; `ready_from` is the start of the gradients not reported yet.
  const ParamStore& store = params_;
  int64_t ready_from = store.numel();
  auto report_from = [&](int64_t begin) {
    if (grads_ready && begin < ready_from) grads_ready(begin, ready_from);
    ready_from = std::min(ready_from, begin);
  };
  auto start_of = [&](const std::string& name) { return store.offset(store.index_of(name)); };
  // An untied embedding's table is read by forward only: backward scatters into its gradient.
  if (plan.embeds && args_.untie_embeddings_and_output_weights && hooks_ != nullptr) {
    hooks_->weights_read(embedding_.table);
  }
  Tensor dx;
  if (plan.head) {
    const ops::ProfileScope scope("model.norm (backward)");
    hook_before_backward(last_unit());
    if (!args_.untie_embeddings_and_output_weights) hook_before_backward(0);
    // The modules' backward first (their gradients lie after the output layer's), then the main loss's; both reach
    // the decoder's last hidden state.
    const Tensor from_mtp = mtp_.empty() ? Tensor() : mtp_backward(ctx);
    // Each rank's vocabulary slice gives part of the hidden states' gradient.
    dx = final_norm_.backward(summed(lm_loss_.backward(ctx.lm_loss), ctx), ctx.final_norm);
    if (from_mtp.defined()) ops::add_inplace(dx, from_mtp);
    report_from(start_of("model.norm.weight"));  // with an untied head, lm_head's gradient was final in forward
    hook_after_backward(last_unit());
  } else {
    PRIMUS_CHECK(grad_output.defined(), "[model] backward of chunk {} of pipeline stage {} needs its output's gradient",
                 ctx.chunk, pipeline_.stage);
    dx = grad_output;
  }
  for (int64_t i = plan.end - 1; i >= plan.begin; --i) {
    auto [first, end] = ctx.recompute.chunk(i - plan.begin, plan.end - plan.begin);
    first += plan.begin, end += plan.begin;
    if (first != end && i == end - 1) {  // entering a recomputed chunk from its top: run its forward again
      const ops::ProfileScope scope("recompute");
      Tensor x = ctx.blocks[first].chunk_input;
      ctx.blocks[first].chunk_input = Tensor();
      for (int64_t j = first; j < end; ++j) {
        hook_before_backward(block_unit(j));
        x = block_forward(blocks_[j], ctx.blocks[j], x, ctx);
      }
    }
    hook_before_backward(block_unit(i));
    dx = block_backward(blocks_[i], ctx.blocks[i], dx, ctx);
    report_from(start_of(layer_prefix(i) + "input_layernorm.weight"));
    hook_after_backward(block_unit(i));
  }
  if (plan.embeds) {
    {
      const ops::ProfileScope scope("model.embed_tokens (backward)");
      hook_before_backward(0);
      embedding_.backward(ctx.tokens, gathered(dx, ctx));
    }
    report_from(0);
    hook_after_backward(0);
    dx = Tensor();
  }
  ctx = Context();  // frees every activation; awaiting_backward false
  ctx.model = this;
  return dx;
}

std::vector<float> LlamaModel::next_token_logits(const std::vector<int32_t>& context) {
  check_single_chunk("next_token_logits");
  std::vector<float> logits;
  logits_chunk(0, context, Tensor(), logits);
  return logits;
}

Tensor LlamaModel::logits_chunk(int chunk, const std::vector<int32_t>& context, const Tensor& input,
                                std::vector<float>& logits) {
  const int64_t T = static_cast<int64_t>(context.size());
  PRIMUS_CHECK(T >= 1 && T <= max_seq_length_, "[model] context of {} tokens (1..{} allowed)", T, max_seq_length_);
  Tensor tokens = Tensor::empty({1, T}, DType::kI32);
  std::copy(context.begin(), context.end(), tokens.i32());
  Tensor hidden;
  {
    Context ctx;  // nothing is kept: freed before the logits
    hidden = forward_hidden(ctx, chunk, ops::to_device(tokens, device_), input, PackedSequence(), false);
  }
  if (!chunk_plan(chunk).head) return hidden;
  // Each rank's vocabulary columns, gathered.
  Tensor last_row =
      tp_.gather_columns(lm_loss_.logits(hidden.slice_elements((T - 1) * hidden.dim(1), {1, hidden.dim(1)})));
  end_head_forward();
  if (last_row.dtype() != DType::kF32) {
    Tensor f32 = Tensor::empty(last_row.shape(), DType::kF32, device_);
    ops::cast(f32, last_row);
    last_row = f32;
  }
  const Tensor host = ops::to_device(last_row, kCpuDevice);
  logits.assign(host.f32(), host.f32() + host.numel());
  return Tensor();
}

void LlamaModel::for_each_linear(const LinearVisitor& visit) {
  auto each = [&](const std::string& name, std::unique_ptr<Linear>& slot) {
    visit(name, slot);
    PRIMUS_CHECK(slot != nullptr, "[model] {} was replaced by no module", name);
  };
  // One layer's projections under `pre` ("model.layers.{i}."), in parameter order.
  auto block_linears = [&](Block& b, const std::string& pre) {
    if (b.is_mla) {
      MlaAttention& mla = b.mla;
      if (mla.q_a_proj != nullptr) {
        each(pre + "self_attn.q_a_proj", mla.q_a_proj);
        each(pre + "self_attn.q_b_proj", mla.q_b_proj);
      } else {
        each(pre + "self_attn.q_proj", mla.q_proj);
      }
      each(pre + "self_attn.kv_a_proj_with_mqa", mla.kv_a_proj_with_mqa);
      each(pre + "self_attn.kv_b_proj", mla.kv_b_proj);
      each(pre + "self_attn.o_proj", mla.o_proj);
    } else {
      Attention& at = b.attention;
      each(pre + "self_attn.q_proj", at.q_proj);
      each(pre + "self_attn.k_proj", at.k_proj);
      each(pre + "self_attn.v_proj", at.v_proj);
      each(pre + "self_attn.o_proj", at.o_proj);
    }
    if (b.is_moe) {  // the router and the grouped experts are no Linear modules; a shared expert is
      SwiGluMlp* shared = b.moe.shared_expert.get();
      if (shared == nullptr) return;
      const std::string shared_pre = moe_param_names(args_, pre).shared;
      each(shared_pre + "gate_up_proj", shared->gate_up_proj);
      each(shared_pre + "down_proj", shared->down_proj);
      return;
    }
    each(pre + "mlp.gate_up_proj", b.mlp.gate_up_proj);
    each(pre + "mlp.down_proj", b.mlp.down_proj);
  };
  for (int64_t i = 0; i < args_.num_layers; ++i) {
    if (!owns_layer(i)) continue;  // another pipeline stage's
    block_linears(blocks_[i], blocks_[i].name + ".");
  }
  // The multi-token prediction modules (after the output layer in parameter order): eh_proj, then the layer's own.
  for (size_t k = 0; k < mtp_.size(); ++k) {
    const std::string pre = layer_prefix(args_.num_layers + static_cast<int64_t>(k));
    each(pre + "eh_proj", mtp_[k].eh_proj);
    block_linears(mtp_[k].block, pre);
  }
}

std::vector<MoeLayerRouting> LlamaModel::moe_routing() const {
  auto host_value = [](const Tensor& t) { return static_cast<double>(ops::to_device(t, kCpuDevice).f32()[0]); };
  std::vector<MoeLayerRouting> layers;
  // Layer `index` of the checkpoint's numbering: a decoder layer, or a multi-token prediction module's
  // (num_layers + k − 1), whose router the aux-loss-free bias update serves as any layer's.
  auto add = [&](const Block& b, int64_t index) {
    const MoeRoutingTally& tally = b.moe.tally;
    MoeLayerRouting r;
    r.layer = index;
    r.tokens_per_expert.assign(static_cast<size_t>(args_.num_experts), 0.0);
    r.micro_batches = static_cast<int64_t>(tally.offsets.size());
    for (const Tensor& offsets : tally.offsets) {
      const Tensor host = ops::to_device(offsets, kCpuDevice);
      for (size_t e = 0; e < r.tokens_per_expert.size(); ++e) r.tokens_per_expert[e] += host.i32()[e + 1] - host.i32()[e];
    }
    for (size_t m = 0; m < tally.kept_offsets.size(); ++m) {  // a capacity: the router's choices less the computed
      const Tensor kept = ops::to_device(tally.kept_offsets[m], kCpuDevice);
      const Tensor chosen = ops::to_device(tally.offsets[m], kCpuDevice);
      r.dropped += chosen.i32()[args_.num_experts] - kept.i32()[args_.num_experts];
    }
    // The logged losses are the coefficient-free ones, as Megatron's tracker logs them.
    for (const Tensor& loss : tally.aux_losses) r.load_balancing_loss += host_value(loss) / b.moe.balancing.aux_loss_coeff;
    for (const Tensor& loss : tally.z_losses) r.z_loss += host_value(loss) / b.moe.balancing.z_loss_coeff;
    layers.push_back(std::move(r));
  };
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (blocks_[i].is_moe && owns_layer(static_cast<int64_t>(i))) add(blocks_[i], static_cast<int64_t>(i));
  }
  for (size_t k = 0; k < mtp_.size(); ++k) {
    if (mtp_[k].block.is_moe) add(mtp_[k].block, args_.num_layers + static_cast<int64_t>(k));
  }
  return layers;
}

void LlamaModel::clear_moe_routing() {
  for (Block& b : blocks_) b.moe.tally = MoeRoutingTally();
  for (MtpModule& m : mtp_) m.block.moe.tally = MoeRoutingTally();
}

std::vector<FlatRange> LlamaModel::expert_ranges() const {
  std::vector<FlatRange> ranges;
  if (ep_.size() == 1) return ranges;
  const int64_t first = ep_.first_expert(args_.num_experts), local = ep_.local_experts(args_.num_experts);
  for (int64_t i = 0; i < args_.num_layers; ++i) {
    if (!owns_layer(i) || !args_.is_moe_layer(i)) continue;
    // Each layer's experts are one contiguous run: every gate/up projection, then every down projection.
    const MoeParamNames n = moe_param_names(args_, layer_prefix(i));
    const size_t last = params_.index_of(n.down_proj[first + local - 1]);
    const int64_t begin = params_.offset(params_.index_of(n.gate_proj[first]));
    ranges.push_back({begin, params_.offset(last) + shape_numel(params_.specs()[last].shape)});
  }
  return ranges;
}

std::vector<FlatRange> LlamaModel::expert_weight_ranges() const {
  std::vector<FlatRange> ranges;
  const int64_t first = ep_.first_expert(args_.num_experts), local = ep_.local_experts(args_.num_experts);
  auto range_of = [&](const std::string& from, const std::string& to) {
    const size_t last = params_.index_of(to);
    return FlatRange{params_.offset(params_.index_of(from)),
                     params_.offset(last) + shape_numel(params_.specs()[last].shape)};
  };
  for (int64_t i = 0; i < args_.num_layers; ++i) {
    if (!owns_layer(i) || !args_.is_moe_layer(i)) continue;
    const MoeParamNames n = moe_param_names(args_, layer_prefix(i));
    ranges.push_back(range_of(n.gate_proj[first], n.up_proj[first + local - 1]));
    ranges.push_back(range_of(n.down_proj[first], n.down_proj[first + local - 1]));
  }
  return ranges;
}

TensorParallelGradSums LlamaModel::tensor_parallel_grad_sums() const {
  TensorParallelGradSums sums;
  if (tp_.size() == 1) return sums;
  auto add = [&](std::vector<FlatRange>& ranges, const std::string& name) {
    const size_t i = params_.index_of(name);
    const int64_t begin = params_.offset(i), end = begin + shape_numel(params_.specs()[i].shape);
    if (!ranges.empty() && ranges.back().end == begin) {
      ranges.back().end = end;  // adjacent: one range
    } else {
      ranges.push_back({begin, end});
    }
  };
  const bool kv_replicated = args_.num_query_groups < tp_.size();
  for (int64_t i = 0; i < args_.num_layers; ++i) {
    if (!owns_layer(i)) continue;  // another pipeline stage's
    const std::string pre = layer_prefix(i);
    // In parameter order, so that adjacent ranges merge.
    if (sequence_parallel_) add(sums.group, pre + "input_layernorm.weight");
    if (kv_replicated) {
      add(sums.shared, pre + "self_attn.k_proj.weight");
      add(sums.shared, pre + "self_attn.v_proj.weight");
    }
    if (args_.qk_layernorm) {
      add(sums.group, pre + "self_attn.q_norm.weight");
      add(sums.group, pre + "self_attn.k_norm.weight");
    }
    if (sequence_parallel_) add(sums.group, pre + "post_attention_layernorm.weight");
  }
  if (sequence_parallel_ && pipeline_.last()) add(sums.group, "model.norm.weight");
  if (kv_replicated) {
    const int replicas = tp_.size() / static_cast<int>(args_.num_query_groups);
    sums.shared_slot = tp_.rank() / replicas;
    sums.shared_slots = static_cast<int>(args_.num_query_groups);
  }
  return sums;
}

}  // namespace primus
