#include "models/llama.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

namespace {

std::string layer_prefix(int64_t i) { return fmt::format("model.layers.{}.", i); }

RopeConfig rope_config(const ModelArgs& a) {
  return RopeConfig{a.rotary_base, a.use_rope_scaling, a.rope_scaling_factor, a.rope_scaling_low_freq_factor,
                    a.rope_scaling_high_freq_factor, a.rope_scaling_original_max_position_embeddings};
}

}  // namespace

std::vector<ParamSpec> LlamaModel::param_specs(const ModelArgs& a) {
  PRIMUS_CHECK(a.vocab_size > 0, "model vocab_size must be resolved before building the model");
  const int64_t C = a.hidden_size, F = a.ffn_hidden_size, D = a.kv_channels;
  const int64_t q_out = a.num_attention_heads * D, kv_out = a.num_query_groups * D;
  const double std = a.init_method_std;
  // Megatron's scaled init for the projections that write into the residual stream.
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(a.num_layers));
  auto norm = [](std::string name, int64_t n) { return ParamSpec{std::move(name), {n}, ParamInit::kOnes, 0.0, false}; };
  auto weight = [](std::string name, Shape shape, double s) { return ParamSpec{std::move(name), std::move(shape), ParamInit::kNormal, s, true}; };

  std::vector<ParamSpec> specs;
  specs.push_back(weight("model.embed_tokens.weight", {a.vocab_size, C}, std));
  for (int64_t i = 0; i < a.num_layers; ++i) {
    const std::string p = layer_prefix(i);
    specs.push_back(norm(p + "input_layernorm.weight", C));
    specs.push_back(weight(p + "self_attn.q_proj.weight", {q_out, C}, std));
    specs.push_back(weight(p + "self_attn.k_proj.weight", {kv_out, C}, std));
    specs.push_back(weight(p + "self_attn.v_proj.weight", {kv_out, C}, std));
    specs.push_back(weight(p + "self_attn.o_proj.weight", {C, q_out}, out_std));
    if (a.qk_layernorm) {
      specs.push_back(norm(p + "self_attn.q_norm.weight", D));
      specs.push_back(norm(p + "self_attn.k_norm.weight", D));
    }
    specs.push_back(norm(p + "post_attention_layernorm.weight", C));
    specs.push_back(weight(p + "mlp.gate_proj.weight", {F, C}, std));
    specs.push_back(weight(p + "mlp.up_proj.weight", {F, C}, std));
    specs.push_back(weight(p + "mlp.down_proj.weight", {C, F}, out_std));
  }
  specs.push_back(norm("model.norm.weight", C));
  if (a.untie_embeddings_and_output_weights) specs.push_back(weight("lm_head.weight", {a.vocab_size, C}, std));
  return specs;
}

double LlamaModel::flops_per_token(const ModelArgs& a, int64_t seq_length) {
  // 6 FLOPs per matmul parameter (forward 2, backward 4) plus attention's QKᵀ and PV, forward and backward,
  // without halving for causality (the PaLM/Megatron convention the reference uses too).
  return 6.0 * static_cast<double>(matmul_params(a)) +
         12.0 * static_cast<double>(a.num_layers * seq_length * a.num_attention_heads * a.kv_channels);
}

int64_t LlamaModel::matmul_params(const ModelArgs& a) {
  int64_t total = 0;
  for (const ParamSpec& s : param_specs(a)) {
    if (s.shape.size() == 2 && s.name != "model.embed_tokens.weight") total += shape_numel(s.shape);
  }
  if (!a.untie_embeddings_and_output_weights) total += a.vocab_size * a.hidden_size;  // tied head still multiplies
  return total;
}

LlamaModel::LlamaModel(const ModelArgs& args, int64_t max_seq_length, Device device, DType compute_dtype)
    : args_(args),
      max_seq_length_(max_seq_length),
      device_(device),
      compute_dtype_(compute_dtype),
      params_(param_specs(args), device) {
  PRIMUS_CHECK(compute_dtype == DType::kF32 || compute_dtype == DType::kBF16, "[model] compute dtype {} unsupported",
               dtype_name(compute_dtype));
  if (compute_dtype_ != DType::kF32) compute_weights_ = Tensor::empty({params_.numel()}, compute_dtype_, device_);
  RopeTable host_rope = make_rope_table(args_.kv_channels, max_seq_length_, rope_config(args_));
  rope_ = RopeTable{ops::to_device(host_rope.cos, device_), ops::to_device(host_rope.sin, device_)};
  bind_layers();
}

void LlamaModel::bind_layers() {
  const float eps = static_cast<float>(args_.norm_epsilon);
  // Layers compute with the bf16 copy in mixed precision, else with the master weights themselves.
  auto p = [&](const std::string& name) {
    if (compute_dtype_ == DType::kF32) return params_.param(name);
    const size_t i = params_.index_of(name);
    return compute_weights_.slice_elements(params_.offset(i), params_.specs()[i].shape);
  };
  auto g = [&](const std::string& name) { return params_.grad(name); };
  // Two [rows, C] tensors adjacent in the flat buffers (param_specs keeps them so) as one [rows_a + rows_b, C].
  auto joined = [&](const Tensor& flat, const std::string& a, const std::string& b) {
    const size_t ia = params_.index_of(a), ib = params_.index_of(b);
    const Shape& sa = params_.specs()[ia].shape;
    const Shape& sb = params_.specs()[ib].shape;
    PRIMUS_CHECK(params_.offset(ib) == params_.offset(ia) + shape_numel(sa) && sa[1] == sb[1],
                 "[model] {} and {} must be adjacent for one GEMM", a, b);
    return flat.slice_elements(params_.offset(ia), {sa[0] + sb[0], sa[1]});
  };
  const Tensor& compute_flat = compute_dtype_ == DType::kF32 ? params_.flat_params() : compute_weights_;
  auto p2 = [&](const std::string& a, const std::string& b) { return joined(compute_flat, a, b); };
  auto g2 = [&](const std::string& a, const std::string& b) { return joined(params_.flat_grads(), a, b); };
  embedding_ = Embedding{p("model.embed_tokens.weight"), g("model.embed_tokens.weight")};
  blocks_.resize(args_.num_layers);
  for (int64_t i = 0; i < args_.num_layers; ++i) {
    const std::string pre = layer_prefix(i);
    Block& b = blocks_[i];
    b.name = fmt::format("model.layers.{}", i);
    b.input_norm = RmsNorm{p(pre + "input_layernorm.weight"), g(pre + "input_layernorm.weight"), eps};
    b.post_attention_norm =
        RmsNorm{p(pre + "post_attention_layernorm.weight"), g(pre + "post_attention_layernorm.weight"), eps};
    Attention& at = b.attention;
    at.wq = p(pre + "self_attn.q_proj.weight");
    at.dwq = g(pre + "self_attn.q_proj.weight");
    at.wk = p(pre + "self_attn.k_proj.weight");
    at.dwk = g(pre + "self_attn.k_proj.weight");
    at.wv = p(pre + "self_attn.v_proj.weight");
    at.dwv = g(pre + "self_attn.v_proj.weight");
    at.wo = p(pre + "self_attn.o_proj.weight");
    at.dwo = g(pre + "self_attn.o_proj.weight");
    at.qk_norm = args_.qk_layernorm;
    if (at.qk_norm) {
      at.q_norm = RmsNorm{p(pre + "self_attn.q_norm.weight"), g(pre + "self_attn.q_norm.weight"), eps};
      at.k_norm = RmsNorm{p(pre + "self_attn.k_norm.weight"), g(pre + "self_attn.k_norm.weight"), eps};
    }
    SwiGluMlp& m = b.mlp;
    m.w_gate_up = p2(pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight");
    m.dw_gate_up = g2(pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight");
    m.w_down = p(pre + "mlp.down_proj.weight");
    m.dw_down = g(pre + "mlp.down_proj.weight");
  }
  final_norm_ = RmsNorm{p("model.norm.weight"), g("model.norm.weight"), eps};
  const std::string head = args_.untie_embeddings_and_output_weights ? "lm_head.weight" : "model.embed_tokens.weight";
  lm_loss_ = LmLoss{p(head), g(head)};
}

RopeTable LlamaModel::rope_for(int64_t seq) const {
  if (packed_.position_ids.defined()) return rope_;
  const int64_t half = args_.kv_channels / 2;
  return RopeTable{rope_.cos.slice_elements(0, {seq, half}), rope_.sin.slice_elements(0, {seq, half})};
}

int64_t LlamaModel::counted_tokens(const Tensor& host_labels) {
  const int32_t* labels = host_labels.i32();
  int64_t counted = 0;
  for (int64_t k = 0; k < host_labels.numel(); ++k) counted += labels[k] >= 0;
  return counted;
}

Tensor LlamaModel::forward_hidden(const Tensor& tokens, const PackedSequence& packed) {
  PRIMUS_CHECK(tokens.ndim() == 2, "[model] tokens {} must be [B, T]", tokens.describe());
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  PRIMUS_CHECK(T <= max_seq_length_, "[model] sequence of {} tokens exceeds the model's {}", T, max_seq_length_);
  for (const Tensor* t : {&packed.position_ids, &packed.segment_start}) {
    PRIMUS_CHECK(!t->defined() || t->shape() == tokens.shape(), "[model] packed-sequence input {} must match tokens {}",
                 t->describe(), tokens.describe());
  }
  packed_ = packed;
  if (compute_dtype_ != DType::kF32 && compute_weights_stale_) {
    ops::cast(compute_weights_, params_.flat_params());
    compute_weights_stale_ = false;
  }
  const RopeTable rope = rope_for(T);
  tokens_ = tokens.reshape({B * T});
  Tensor x;
  {
    const ops::ProfileScope scope("model.embed_tokens");
    x = embedding_.forward(tokens_);  // [N, C]
  }
  for (int64_t i = 0; i < args_.num_layers; ++i) {
    Block& b = blocks_[i];
    b.attention.shape = AttentionShape{B, T, args_.num_attention_heads, args_.num_query_groups, args_.kv_channels};
    const auto [first, end] = recompute_chunk(i);
    if (first == end) {
      x = block_forward(b, x, rope);
      continue;
    }
    if (i == first) b.chunk_input = x;
    x = block_forward(b, x, rope);
    release_block(b);  // backward recomputes the chunk from chunk_input
  }
  const ops::ProfileScope scope("model.norm");
  return final_norm_.forward(x, final_norm_saved_);
}

Tensor LlamaModel::block_forward(Block& b, const Tensor& x, const RopeTable& rope) {
  const ops::ProfileScope block(b.name);
  Tensor a;
  {
    const ops::ProfileScope scope(b.name + ".self_attn");
    Tensor h = b.input_norm.forward(x, b.input_norm_saved);
    a = b.attention.forward(h, rope, packed_, b.attention_saved);
    ops::add_inplace(a, x);  // a = x + attention(x): the block's mid residual
  }
  const ops::ProfileScope scope(b.name + ".mlp");
  Tensor h2 = b.post_attention_norm.forward(a, b.post_norm_saved);
  Tensor m = b.mlp.forward(h2, b.mlp_saved);
  ops::add_inplace(m, a);
  return m;
}

Tensor LlamaModel::block_backward(Block& b, const Tensor& dx, const RopeTable& rope) {
  // x_out = mid + mlp(norm(mid)); mid = x_in + attn(norm(x_in)): each residual passes dx through.
  const ops::ProfileScope block(b.name + " (backward)");
  Tensor dmid;
  {
    const ops::ProfileScope scope(b.name + ".mlp (backward)");
    dmid = b.post_attention_norm.backward(b.mlp.backward(dx, b.mlp_saved), b.post_norm_saved);
    ops::add_inplace(dmid, dx);
  }
  const ops::ProfileScope scope(b.name + ".self_attn (backward)");
  Tensor dx_in =
      b.input_norm.backward(b.attention.backward(dmid, rope, packed_, b.attention_saved), b.input_norm_saved);
  ops::add_inplace(dx_in, dmid);
  release_block(b);
  return dx_in;
}

void LlamaModel::release_block(Block& b) {
  b.input_norm_saved = RmsNormSaved();
  b.attention_saved = AttentionSaved();
  b.post_norm_saved = RmsNormSaved();
  b.mlp_saved = MlpSaved();
}

std::pair<int64_t, int64_t> LlamaModel::recompute_chunk(int64_t i) const {
  if (recompute_.granularity != RecomputeConfig::Granularity::kFull) return {i, i};
  const int64_t n = recompute_.num_layers;
  if (recompute_.block) return i < n ? std::pair{i, i + 1} : std::pair{i, i};
  const int64_t first = i / n * n;
  return {first, std::min(first + n, args_.num_layers)};
}

void LlamaModel::set_recompute(const RecomputeConfig& recompute) {
  PRIMUS_CHECK(recompute.num_layers >= 1, "[model] recompute_num_layers {} must be >= 1", recompute.num_layers);
  recompute_ = recompute;
  for (Block& b : blocks_) b.mlp.recompute_act = recompute.granularity == RecomputeConfig::Granularity::kSelective;
}

RecomputeConfig RecomputeConfig::from(const TrainingArgs& t) {
  RecomputeConfig r;
  if (t.recompute_granularity == "full") {
    r.granularity = Granularity::kFull;
    r.block = t.recompute_method == "block";
    r.num_layers = std::max<int64_t>(1, t.recompute_num_layers);
  } else if (t.recompute_granularity == "selective") {
    r.granularity = Granularity::kSelective;
  }
  return r;
}

void LlamaModel::forward(const Tensor& tokens, const Tensor& labels, float grad_scale, Tensor& loss_sum,
                         const PackedSequence& packed) {
  PRIMUS_CHECK(labels.shape() == tokens.shape(), "[model] labels {} must match tokens {}", labels.describe(),
               tokens.describe());
  const Tensor hidden = forward_hidden(tokens, packed);
  const ops::ProfileScope scope("lm_head (loss and its gradient)");
  const Tensor losses =
      lm_loss_.forward_with_grad(hidden, labels.reshape({labels.numel()}), grad_scale, lm_loss_saved_);
  ops::sum_into(loss_sum, losses);  // ignored targets have loss 0
}

LossSum LlamaModel::evaluate(const Tensor& tokens, const Tensor& labels, const PackedSequence& packed) {
  PRIMUS_CHECK(labels.shape() == tokens.shape(), "[model] labels {} must match tokens {}", labels.describe(),
               tokens.describe());
  const Tensor hidden = forward_hidden(tokens, packed);
  const Tensor losses = lm_loss_.forward(hidden, labels.reshape({labels.numel()}));
  release_activations();
  Tensor sum = ops::zeros({1}, DType::kF32, device_);
  ops::sum_into(sum, losses);
  const Tensor host_labels = labels.device().is_cpu() ? labels : ops::to_device(labels, kCpuDevice);
  return LossSum{static_cast<double>(ops::to_device(sum, kCpuDevice).f32()[0]), counted_tokens(host_labels)};
}

void LlamaModel::backward() {
  const RopeTable rope = rope_for(blocks_.empty() ? 1 : blocks_[0].attention.shape.seq);
  Tensor dx;
  {
    const ops::ProfileScope scope("model.norm (backward)");
    dx = final_norm_.backward(lm_loss_.backward(lm_loss_saved_), final_norm_saved_);
  }
  for (int64_t i = args_.num_layers - 1; i >= 0; --i) {
    const auto [first, end] = recompute_chunk(i);
    if (first != end && i == end - 1) {  // entering a recomputed chunk from its top: run its forward again
      const ops::ProfileScope scope("recompute");
      Tensor x = blocks_[first].chunk_input;
      blocks_[first].chunk_input = Tensor();
      for (int64_t j = first; j < end; ++j) x = block_forward(blocks_[j], x, rope);
    }
    dx = block_backward(blocks_[i], dx, rope);
  }
  {
    const ops::ProfileScope scope("model.embed_tokens (backward)");
    embedding_.backward(tokens_, dx);
  }
  release_activations();
}

void LlamaModel::release_activations() {
  for (Block& b : blocks_) {
    release_block(b);
    b.chunk_input = Tensor();
  }
  final_norm_saved_ = RmsNormSaved();
  lm_loss_saved_ = LmLossSaved();
  packed_ = PackedSequence();
}

std::vector<float> LlamaModel::next_token_logits(const std::vector<int32_t>& context) {
  const int64_t T = static_cast<int64_t>(context.size());
  PRIMUS_CHECK(T >= 1 && T <= max_seq_length_, "[model] context of {} tokens (1..{} allowed)", T, max_seq_length_);
  Tensor tokens = Tensor::empty({1, T}, DType::kI32);
  std::copy(context.begin(), context.end(), tokens.i32());
  const Tensor hidden = forward_hidden(ops::to_device(tokens, device_), PackedSequence());
  release_activations();
  Tensor last_row = lm_loss_.logits(hidden.slice_elements((T - 1) * hidden.dim(1), {1, hidden.dim(1)}));
  if (last_row.dtype() != DType::kF32) {
    Tensor f32 = Tensor::empty(last_row.shape(), DType::kF32, device_);
    ops::cast(f32, last_row);
    last_row = f32;
  }
  const Tensor logits = ops::to_device(last_row, kCpuDevice);
  return std::vector<float>(logits.f32(), logits.f32() + logits.numel());
}

}  // namespace primus
