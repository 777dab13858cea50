// THE table of module keys. Each key is declared exactly once here: name (Megatron-LM's), type, default,
// limits, help, and the ExperimentConfig field it fills. Everything else (validation, `config show`,
// docs/config-reference.md, effective configs) is derived from this table.
#include "config/schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace primus::config {

namespace {

void assign(int64_t& field, const TypedValue& v) { field = v.i; }
void assign(double& field, const TypedValue& v) { field = v.f; }
void assign(bool& field, const TypedValue& v) { field = v.b; }
void assign(std::string& field, const TypedValue& v) { field = v.s; }
void assign(std::vector<std::string>& field, const TypedValue& v) { field = v.list; }
void assign(std::vector<int64_t>& field, const TypedValue& v) {  // entries checked by check_ranks
  field.clear();
  for (const std::string& s : v.list) field.push_back(std::stoll(s));
}

template <auto kMember>
void model_field(const TypedValue& v, ExperimentConfig& c) {
  assign(c.model.*kMember, v);
}

template <auto kMember>
void train_field(const TypedValue& v, ExperimentConfig& c) {
  assign(c.train.*kMember, v);
}

// A list of ranks: non-negative integers.
std::string check_ranks(const TypedValue& v) {
  for (const std::string& s : v.list) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) {
      return fmt::format("'{}' is not a rank (a non-negative integer)", s);
    }
  }
  return "";
}

// "969,30,1": one to three non-negative weights with a positive sum.
std::string check_split(const TypedValue& v) {
  std::string bad = fmt::format("expected 1 to 3 comma-separated non-negative weights like '969,30,1', got '{}'", v.s);
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t comma = v.s.find(',', start);
    parts.push_back(v.s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (parts.size() > 3) return bad;
  double sum = 0;
  for (std::string part : parts) {
    part.erase(0, part.find_first_not_of(' '));
    part.erase(part.find_last_not_of(' ') + 1);
    if (part.empty() ||
        !std::all_of(part.begin(), part.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; }) ||
        std::count(part.begin(), part.end(), '.') > 1 || part == ".") {
      return bad;
    }
    double weight = std::strtod(part.c_str(), nullptr);
    if (!std::isfinite(weight)) return fmt::format("weight '{}' in '{}' is too large", part, v.s);
    sum += weight;
  }
  if (sum <= 0) return fmt::format("the weights in '{}' sum to 0; at least one must be positive", v.s);
  return "";
}

// moe_layer_freq: one positive integer, or a list of 0/1 entries (its length is checked against num_layers later).
std::string check_layer_freq(const TypedValue& v) {
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  if (v.list.size() == 1) {
    if (!digits(v.list[0]) || std::stoll(v.list[0]) < 1) {
      return fmt::format("'{}' is not a layer frequency (a positive integer, or a list of 0/1 per layer)", v.list[0]);
    }
    return "";
  }
  for (const std::string& s : v.list) {
    if (s != "0" && s != "1") return fmt::format("entry '{}' of the per-layer list must be 0 (dense) or 1 (MoE)", s);
  }
  return "";
}

// position_embedding_type: yarn turns YaRN scaling of the RoPE table on.
void yarn_field(const TypedValue& v, ExperimentConfig& c) { c.model.yarn = v.s == "yarn"; }

// Sliding-window attention (Megatron's window_size "(left, right)"), refused when set.
std::string refuse_window(const TypedValue& v) {
  return v.is_set ? "sliding-window attention is not implemented; leave window_size unset" : "";
}

// GPT-OSS's clamped SwiGLU, refused when set.
std::string refuse_clamp(const TypedValue& v) {
  return v.is_set ? "the clamped SwiGLU of GPT-OSS is not implemented; leave activation_func_clamp_value unset" : "";
}

std::vector<KeySpec> build_specs() {
  using enum KeyType;
  using enum KeyGroup;
  using enum Presence;
  return {
      // ---- model ----
      {.name = "num_layers",
       .type = kInt,
       .group = kModel,
       .presence = kRequired,
       .min = 1,
       .max = 16384,
       .why = "far beyond any published model; per-layer tables stay small",
       .help = "Number of transformer layers.",
       .aliases = {"num_hidden_layers", "n_layers", "n_layer"},
       .apply = model_field<&ModelArgs::num_layers>},
      {.name = "hidden_size",
       .type = kInt,
       .group = kModel,
       .presence = kRequired,
       .min = 1,
       .help = "Model width: the embedding and residual-stream size.",
       .aliases = {"dim", "n_embd", "d_model"},
       .apply = model_field<&ModelArgs::hidden_size>},
      {.name = "ffn_hidden_size",
       .type = kInt,
       .group = kModel,
       .presence = kRequired,
       .min = 1,
       .help = "Inner size of the SwiGLU MLP.",
       .aliases = {"intermediate_size", "ffn_dim"},
       .apply = model_field<&ModelArgs::ffn_hidden_size>},
      {.name = "num_attention_heads",
       .type = kInt,
       .group = kModel,
       .presence = kRequired,
       .min = 1,
       .help = "Query heads per attention layer.",
       .aliases = {"n_heads", "n_head", "num_heads"},
       .apply = model_field<&ModelArgs::num_attention_heads>},
      {.name = "group_query_attention",
       .type = kBool,
       .group = kModel,
       .default_yaml = "false",
       .help = "Grouped-query attention with num_query_groups key/value heads."},
      {.name = "num_query_groups",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "Key/value heads; required when group_query_attention is true and must divide num_attention_heads. "
               "Derived: num_attention_heads otherwise.",
       .aliases = {"num_key_value_heads", "n_kv_heads"},
       .apply = model_field<&ModelArgs::num_query_groups>},
      {.name = "kv_channels",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "Per-head dimension. Derived: hidden_size / num_attention_heads.",
       .aliases = {"head_dim"},
       .apply = model_field<&ModelArgs::kv_channels>},
      {.name = "vocab_size",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .max = 2147483647,
       .why = "token ids are int32",
       .help = "Vocabulary size. Not given: the tokenizer's size padded to a multiple of make_vocab_size_divisible_by "
               "x tensor_model_parallel_size. Given: taken as is, and tensor_model_parallel_size must divide it.",
       .apply = model_field<&ModelArgs::vocab_size>},
      {.name = "make_vocab_size_divisible_by",
       .type = kInt,
       .group = kModel,
       .default_yaml = "128",
       .min = 1,
       .help = "Pads the tokenizer's vocabulary to a multiple of this x tensor_model_parallel_size (Megatron's "
               "padding: the vocabulary splits evenly over the tensor-parallel ranks and GEMMs stay aligned).",
       .apply = model_field<&ModelArgs::make_vocab_size_divisible_by>},
      {.name = "max_position_embeddings",
       .type = kInt,
       .group = kModel,
       .presence = kRequired,
       .min = 1,
       .help = "Longest sequence the position encoding is set up for; seq_length must not exceed it.",
       .aliases = {"max_seq_len", "n_positions"},
       .apply = model_field<&ModelArgs::max_position_embeddings>},
      {.name = "position_embedding_type",
       .type = kString,
       .group = kModel,
       .default_yaml = "rope",
       .choices = {"rope", "yarn"},
       .why = "rotary position embeddings, plain or YaRN-scaled, are implemented",
       .help = "Position encoding: rope, or yarn (YaRN-scaled RoPE: the rotary_scaling_factor, "
               "original_max_position_embeddings, beta_fast, beta_slow, mscale and mscale_all_dim keys; with "
               "multi_latent_attention only).",
       .apply = yarn_field},
      {.name = "rotary_base",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "10000.0",
       .min = 0,
       .min_exclusive = true,
       .help = "RoPE base frequency (theta).",
       .aliases = {"rope_theta"},
       .apply = model_field<&ModelArgs::rotary_base>},
      {.name = "use_rope_scaling",
       .type = kBool,
       .group = kModel,
       .default_yaml = "false",
       .help = "Llama 3.1 frequency scaling of RoPE (the rope_scaling_* keys).",
       .apply = model_field<&ModelArgs::use_rope_scaling>},
      {.name = "rope_scaling_factor",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "8.0",
       .min = 0,
       .min_exclusive = true,
       .help = "Llama 3.1 RoPE scaling: factor applied to low frequencies.",
       .apply = model_field<&ModelArgs::rope_scaling_factor>},
      {.name = "rope_scaling_low_freq_factor",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "1.0",
       .min = 0,
       .min_exclusive = true,
       .help = "Llama 3.1 RoPE scaling: low-frequency factor.",
       .apply = model_field<&ModelArgs::rope_scaling_low_freq_factor>},
      {.name = "rope_scaling_high_freq_factor",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "4.0",
       .min = 0,
       .min_exclusive = true,
       .help = "Llama 3.1 RoPE scaling: high-frequency factor.",
       .apply = model_field<&ModelArgs::rope_scaling_high_freq_factor>},
      {.name = "rope_scaling_original_max_position_embeddings",
       .type = kInt,
       .group = kModel,
       .default_yaml = "8192",
       .min = 1,
       .help = "Llama 3.1 RoPE scaling: the context length before scaling.",
       .apply = model_field<&ModelArgs::rope_scaling_original_max_position_embeddings>},
      {.name = "normalization",
       .type = kString,
       .group = kModel,
       .default_yaml = "RMSNorm",
       .choices = {"RMSNorm"},
       .why = "only RMSNorm is implemented",
       .help = "Normalization layer."},
      {.name = "norm_epsilon",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "1e-5",
       .min = 0,
       .min_exclusive = true,
       .help = "Epsilon added to the mean square in RMSNorm.",
       .aliases = {"rms_norm_eps", "layernorm_epsilon"},
       .apply = model_field<&ModelArgs::norm_epsilon>},
      {.name = "swiglu",
       .type = kBool,
       .group = kModel,
       .default_yaml = "true",
       .choices = {"true"},
       .why = "only SwiGLU MLPs are implemented",
       .help = "SwiGLU MLP: gate, up and down projections."},
      {.name = "qk_layernorm",
       .type = kBool,
       .group = kModel,
       .default_yaml = "false",
       .help = "RMSNorm over head_dim on queries and keys before RoPE (Qwen3).",
       .apply = model_field<&ModelArgs::qk_layernorm>},
      {.name = "untie_embeddings_and_output_weights",
       .type = kBool,
       .group = kModel,
       .default_yaml = "false",
       .help = "Separate output projection instead of reusing the embedding matrix.",
       .apply = model_field<&ModelArgs::untie_embeddings_and_output_weights>},
      {.name = "add_bias_linear",
       .type = kBool,
       .group = kModel,
       .default_yaml = "false",
       .choices = {"false"},
       .why = "biases in linear layers are not implemented",
       .help = "Biases in attention and MLP linear layers."},
      {.name = "init_method_std",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "0.02",
       .min = 0,
       .min_exclusive = true,
       .help = "Standard deviation of the normal weight initialisation.",
       .aliases = {"initializer_range"},
       .apply = model_field<&ModelArgs::init_method_std>},
      // ---- features of other model families, named so that their presets fail on what the engine lacks ----
      // ---- multi-head latent attention (DeepSeek-V2/V3) and YaRN RoPE: docs/mla.md ----
      {.name = "multi_latent_attention",
       .type = kBool,
       .group = kModel,
       .default_yaml = "false",
       .help = "DeepSeek's multi-head latent attention: low-rank q (q_lora_rank) and joint kv (kv_lora_rank) "
               "projections with RMSNorms, a RoPE key shared by the heads, value heads of v_head_dim. CPU engine "
               "for now (the CUDA path awaits its GPU tests); not with group_query_attention, tensor or context "
               "parallelism.",
       .apply = model_field<&ModelArgs::multi_latent_attention>},
      {.name = "q_lora_rank",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "MLA: rank of the query's low-rank projection (q_a_proj, q_a_layernorm, q_b_proj); unset: a "
               "full-rank q_proj (DeepSeek-V2-Lite).",
       .apply = model_field<&ModelArgs::q_lora_rank>},
      {.name = "kv_lora_rank",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "MLA: rank of the joint key/value compression (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj); "
               "required with multi_latent_attention.",
       .apply = model_field<&ModelArgs::kv_lora_rank>},
      {.name = "qk_head_dim",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "MLA: the per-head query/key width without RoPE (HF's qk_nope_head_dim); required with "
               "multi_latent_attention.",
       .aliases = {"qk_nope_head_dim"},
       .apply = model_field<&ModelArgs::qk_head_dim>},
      {.name = "qk_pos_emb_head_dim",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 2,
       .help = "MLA: the per-head width of the decoupled RoPE query and of the key shared by the heads (HF's "
               "qk_rope_head_dim); even; required with multi_latent_attention.",
       .aliases = {"qk_rope_head_dim"},
       .apply = model_field<&ModelArgs::qk_pos_emb_head_dim>},
      {.name = "v_head_dim",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "MLA: the per-head value width; required with multi_latent_attention.",
       .apply = model_field<&ModelArgs::v_head_dim>},
      {.name = "rotary_scaling_factor",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "40.0",
       .min = 1,
       .help = "YaRN (position_embedding_type: yarn): how much longer the context is than "
               "original_max_position_embeddings; long wavelengths are interpolated by it.",
       .apply = model_field<&ModelArgs::rotary_scaling_factor>},
      {.name = "original_max_position_embeddings",
       .type = kInt,
       .group = kModel,
       .default_yaml = "4096",
       .min = 1,
       .help = "YaRN: the context length the model was pretrained with before scaling.",
       .apply = model_field<&ModelArgs::original_max_position_embeddings>},
      {.name = "beta_fast",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "32.0",
       .min = 0,
       .min_exclusive = true,
       .help = "YaRN: frequencies turning more than beta_fast times over the original context keep their value "
               "(extrapolation); must exceed beta_slow.",
       .apply = model_field<&ModelArgs::beta_fast>},
      {.name = "beta_slow",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "1.0",
       .min = 0,
       .min_exclusive = true,
       .help = "YaRN: frequencies turning fewer than beta_slow times over the original context are divided by "
               "rotary_scaling_factor (interpolation); a linear ramp between.",
       .apply = model_field<&ModelArgs::beta_slow>},
      {.name = "mscale",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "0.707",
       .min = 0,
       .help = "YaRN: the cos/sin tables are multiplied by m(mscale) / m(mscale_all_dim), m(x) = 0.1 x "
               "ln(rotary_scaling_factor) + 1.",
       .apply = model_field<&ModelArgs::mscale>},
      {.name = "mscale_all_dim",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "0.707",
       .min = 0,
       .help = "YaRN with MLA: the softmax scale 1/sqrt(qk_head_dim + qk_pos_emb_head_dim) is multiplied by "
               "m(mscale_all_dim)^2.",
       .apply = model_field<&ModelArgs::mscale_all_dim>},
      // ---- multi-token prediction (DeepSeek-V3): docs/mla.md ----
      {.name = "mtp_num_layers",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 0,
       .help = "Multi-token prediction modules after the last layer (DeepSeek-V3: 1); module k predicts the token "
               "k + 1 ahead through eh_proj, one layer of the last layer's kind, its own final norm and the shared "
               "output layer; trained on the CPU engine in fp32 without tensor, context or pipeline parallelism. "
               "Unset or 0: none.",
       .aliases = {"num_nextn_predict_layers"},
       .apply = model_field<&ModelArgs::mtp_num_layers>},
      {.name = "mtp_loss_scaling_factor",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "0.1",
       .min = 0,
       .help = "Weight of the mean of the multi-token prediction losses added to the main loss (DeepSeek-V3: 0.3 "
               "for the first 10T tokens, then 0.1).",
       .apply = model_field<&ModelArgs::mtp_loss_scaling_factor>},
      {.name = "softmax_type",
       .type = kString,
       .group = kModel,
       .default_yaml = "vanilla",
       .choices = {"vanilla"},
       .why = "off-by-one and learnable softmax offsets (GPT-OSS's attention sinks) are not implemented",
       .help = "Attention softmax: vanilla, off-by-one, or learnable (a learned per-head sink logit)."},
      {.name = "window_size",
       .type = kString,
       .group = kModel,
       .presence = kOptional,
       .help = "Sliding-window attention as \"(left, right)\" tokens; unset: full causal attention.",
       .aliases = {"sliding_window"},
       .check = refuse_window},
      {.name = "activation_func_clamp_value",
       .type = kFloat,
       .group = kModel,
       .presence = kOptional,
       .help = "Clamp of the gated MLP's pre-activations (GPT-OSS: 7.0); unset: no clamp.",
       .check = refuse_clamp},
      // ---- mixture of experts (Megatron's keys) ----
      {.name = "num_experts",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .max = 65536,
       .why = "far beyond any published model",
       .help = "Routed experts per MoE layer; unset: a dense model. MoE runs on the CPU engine (fp32), without "
               "tensor parallelism; its CUDA kernels (fp32 or bf16, the router in fp32) await their run on a GPU.",
       .aliases = {"num_local_experts", "n_routed_experts"},
       .apply = model_field<&ModelArgs::num_experts>},
      {.name = "moe_router_topk",
       .type = kInt,
       .group = kModel,
       .default_yaml = "2",
       .min = 1,
       .help = "Experts each token is routed to; at most num_experts.",
       .aliases = {"num_experts_per_tok"},
       .apply = model_field<&ModelArgs::moe_router_topk>},
      {.name = "moe_ffn_hidden_size",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "Inner size of each routed expert's SwiGLU MLP. Derived: ffn_hidden_size (which dense layers keep).",
       .aliases = {"moe_intermediate_size"},
       .apply = model_field<&ModelArgs::moe_ffn_hidden_size>},
      {.name = "moe_shared_expert_intermediate_size",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "Inner size of a shared expert (a SwiGLU MLP every token passes through beside its routed experts, "
               "parameters mlp.shared_experts.*); unset: none.",
       .aliases = {"shared_expert_intermediate_size"},
       .apply = model_field<&ModelArgs::moe_shared_expert_intermediate_size>},
      {.name = "moe_layer_freq",
       .type = kStringList,
       .group = kModel,
       .default_yaml = "1",
       .help = "Which layers are MoE: one integer f (layer i is MoE when i % f == 0), or a list of num_layers "
               "0/1 entries (1: MoE). Layers below moe_first_k_dense_replace stay dense either way.",
       .apply = model_field<&ModelArgs::moe_layer_freq>,
       .check = check_layer_freq},
      {.name = "moe_first_k_dense_replace",
       .type = kInt,
       .group = kModel,
       .default_yaml = "0",
       .min = 0,
       .help = "The first k layers keep a dense MLP of ffn_hidden_size (DeepSeek's first_k_dense_replace).",
       .aliases = {"first_k_dense_replace"},
       .apply = model_field<&ModelArgs::moe_first_k_dense_replace>},
      {.name = "moe_router_score_function",
       .type = kString,
       .group = kModel,
       .default_yaml = "softmax",
       .choices = {"softmax", "sigmoid"},
       .help = "Router scores from its logits: softmax (Mixtral, Qwen3-MoE) or sigmoid (DeepSeek-V3).",
       .aliases = {"scoring_func"},
       .apply = model_field<&ModelArgs::moe_router_score_function>},
      {.name = "moe_router_pre_softmax",
       .type = kBool,
       .group = kModel,
       .default_yaml = "false",
       .help = "Softmax over all experts before the top-k, and the chosen scores are the weights as they are "
               "(Qwen3-MoE with norm_topk_prob: false). false: the weights are renormalised over the top-k (the same "
               "as a softmax over the top-k logits: Mixtral, Qwen3-MoE with norm_topk_prob: true).",
       .apply = model_field<&ModelArgs::moe_router_pre_softmax>},
      {.name = "moe_router_topk_scaling_factor",
       .type = kFloat,
       .group = kModel,
       .presence = kOptional,
       .min = 0,
       .min_exclusive = true,
       .help = "Multiplies the routing weights (DeepSeek's routed_scaling_factor); unset: 1.",
       .aliases = {"routed_scaling_factor"},
       .apply = model_field<&ModelArgs::moe_router_topk_scaling_factor>},
      {.name = "moe_aux_loss_coeff",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "0.0",
       .min = 0,
       .help = "Weight of the load-balancing loss E / (k N^2) x sum_e count_e x sum_t p[t, e] per MoE layer "
               "(Megatron's switch loss; with moe_router_load_balancing_type: aux_loss). A micro-batch's losses "
               "weigh as its share of the step's tokens.",
       .aliases = {"router_aux_loss_coef"},
       .apply = model_field<&ModelArgs::moe_aux_loss_coeff>},
      {.name = "moe_z_loss_coeff",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "0.0",
       .min = 0,
       .help = "Weight of the router z-loss mean_t logsumexp(logits[t])^2 per MoE layer; 0: none.",
       .apply = model_field<&ModelArgs::moe_z_loss_coeff>},
      {.name = "moe_router_load_balancing_type",
       .type = kString,
       .group = kModel,
       .default_yaml = "aux_loss",
       .choices = {"aux_loss", "seq_aux_loss", "none"},
       .why = "sinkhorn is not implemented",
       .help = "aux_loss: the switch load-balancing loss weighted by moe_aux_loss_coeff, over each micro-batch's "
               "tokens; seq_aux_loss: the same loss per sequence of the micro-batch (its own counts and mean "
               "scores), averaged over the sequences (DeepSeek-V2/V3; not with context parallelism); "
               "none: no balancing loss.",
       .apply = model_field<&ModelArgs::moe_router_load_balancing_type>},
      {.name = "moe_router_enable_expert_bias",
       .type = kBool,
       .group = kModel,
       .default_yaml = "false",
       .help = "DeepSeek-V3's aux-loss-free balancing: a per-expert bias (parameter mlp.gate.e_score_correction_bias, "
               "starting at 0) added to the scores for the selection only; after each step every MoE layer's bias "
               "moves by moe_router_bias_update_rate towards the experts that got fewer than the mean of the global "
               "batch's tokens. Not with use_megatron_fsdp.",
       .apply = model_field<&ModelArgs::moe_router_enable_expert_bias>},
      {.name = "moe_router_num_groups",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "Grouped routing (DeepSeek): experts in this many equal groups, tokens choose only from the "
               "moe_router_group_topk groups of the best scores; must divide num_experts. Unset: no groups.",
       .aliases = {"n_group"},
       .apply = model_field<&ModelArgs::moe_router_num_groups>},
      {.name = "moe_router_group_topk",
       .type = kInt,
       .group = kModel,
       .presence = kOptional,
       .min = 1,
       .help = "Groups each token chooses from with moe_router_num_groups (a group scores the sum of its "
               "moe_router_topk / moe_router_group_topk best scores); must divide moe_router_topk.",
       .aliases = {"topk_group"},
       .apply = model_field<&ModelArgs::moe_router_group_topk>},
      // ---- expert capacity (token dropping; Megatron's keys) ----
      {.name = "moe_expert_capacity_factor",
       .type = kFloat,
       .group = kModel,
       .presence = kOptional,
       .min = 0,
       .min_exclusive = true,
       .help = "Token dropping: each expert computes at most ceil(N x moe_router_topk / num_experts x factor) of the "
               "routing entries of the N tokens one rank routes in one micro-batch (before the all-to-all under "
               "expert parallelism); the others are dropped (the residual carries the token). metrics.jsonl counts "
               "them (moe dropped_tokens). Unset: dropless.",
       .apply = model_field<&ModelArgs::moe_expert_capacity_factor>},
      {.name = "moe_token_drop_policy",
       .type = kString,
       .group = kModel,
       .default_yaml = "probs",
       .choices = {"probs", "position"},
       .help = "Which routing entries an expert over its capacity keeps: probs, those of the largest routing "
               "weights (ties to the earlier token); position, the earliest tokens. With moe_expert_capacity_factor.",
       .apply = model_field<&ModelArgs::moe_token_drop_policy>},
      {.name = "moe_pad_expert_input_to_capacity",
       .type = kBool,
       .group = kModel,
       .default_yaml = "false",
       .help = "Pad each expert's rows with zero rows to its capacity (times the expert-parallel ranks sending to "
               "it), so every expert's GEMM has the same shape; the outputs are those without padding. Needs "
               "moe_expert_capacity_factor.",
       .apply = model_field<&ModelArgs::moe_pad_expert_input_to_capacity>},
      {.name = "attention_dropout",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "0.0",
       .min = 0,
       .max = 0,
       .why = "dropout is not implemented; must be 0",
       .help = "Dropout is not implemented; must be 0."},
      {.name = "hidden_dropout",
       .type = kFloat,
       .group = kModel,
       .default_yaml = "0.0",
       .min = 0,
       .max = 0,
       .why = "dropout is not implemented; must be 0",
       .help = "Dropout is not implemented; must be 0."},

      // ---- training ----
      {.name = "train_iters",
       .type = kInt,
       .group = kTraining,
       .presence = kRequired,
       .min = 1,
       .help = "Optimizer steps to train for.",
       .aliases = {"max_steps", "train_steps", "iters"},
       .apply = train_field<&TrainingArgs::train_iters>},
      {.name = "micro_batch_size",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1",
       .min = 1,
       .help = "Sequences per forward/backward pass on one data-parallel rank.",
       .aliases = {"batch_size", "per_device_train_batch_size", "local_batch_size"},
       .apply = train_field<&TrainingArgs::micro_batch_size>},
      {.name = "global_batch_size",
       .type = kInt,
       .group = kTraining,
       .presence = kOptional,
       .min = 1,
       .help = "Sequences per optimizer step; a multiple of micro_batch_size x data-parallel size (gradient "
               "accumulation makes up the rest). Derived: micro_batch_size x data-parallel size.",
       .apply = train_field<&TrainingArgs::global_batch_size>},
      {.name = "seq_length",
       .type = kInt,
       .group = kTraining,
       .presence = kRequired,
       .min = 1,
       .help = "Tokens per training sequence; at most max_position_embeddings.",
       .aliases = {"seq_len", "max_seq_length", "block_size", "sequence_length"},
       .apply = train_field<&TrainingArgs::seq_length>},
      {.name = "lr",
       .type = kFloat,
       .group = kTraining,
       .presence = kRequired,
       .min = 0,
       .min_exclusive = true,
       .help = "Peak learning rate.",
       .aliases = {"learning_rate"},
       .apply = train_field<&TrainingArgs::lr>},
      {.name = "min_lr",
       .type = kFloat,
       .group = kTraining,
       .default_yaml = "0.0",
       .min = 0,
       .help = "Learning rate at the end of the decay; at most lr.",
       .aliases = {"min_learning_rate"},
       .apply = train_field<&TrainingArgs::min_lr>},
      {.name = "lr_warmup_iters",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "0",
       .min = 0,
       .help = "Linear warmup steps from 0 to lr; at most lr_decay_iters.",
       .aliases = {"warmup_steps", "warmup_iters"},
       .apply = train_field<&TrainingArgs::lr_warmup_iters>},
      {.name = "lr_decay_style",
       .type = kString,
       .group = kTraining,
       .default_yaml = "cosine",
       .choices = {"constant", "linear", "cosine"},
       .help = "Learning-rate decay after warmup.",
       .aliases = {"lr_scheduler_type", "lr_schedule"},
       .apply = train_field<&TrainingArgs::lr_decay_style>},
      {.name = "lr_decay_iters",
       .type = kInt,
       .group = kTraining,
       .presence = kOptional,
       .min = 1,
       .help = "Step at which the decay reaches min_lr. Derived: train_iters.",
       .apply = train_field<&TrainingArgs::lr_decay_iters>},
      {.name = "weight_decay",
       .type = kFloat,
       .group = kTraining,
       .default_yaml = "0.01",
       .min = 0,
       .help = "AdamW decoupled weight decay.",
       .apply = train_field<&TrainingArgs::weight_decay>},
      {.name = "adam_beta1",
       .type = kFloat,
       .group = kTraining,
       .default_yaml = "0.9",
       .min = 0,
       .max = 1,
       .max_exclusive = true,
       .help = "AdamW first-moment decay.",
       .aliases = {"beta1"},
       .apply = train_field<&TrainingArgs::adam_beta1>},
      {.name = "adam_beta2",
       .type = kFloat,
       .group = kTraining,
       .default_yaml = "0.999",
       .min = 0,
       .max = 1,
       .max_exclusive = true,
       .help = "AdamW second-moment decay.",
       .aliases = {"beta2"},
       .apply = train_field<&TrainingArgs::adam_beta2>},
      {.name = "adam_eps",
       .type = kFloat,
       .group = kTraining,
       .default_yaml = "1e-8",
       .min = 0,
       .min_exclusive = true,
       .help = "AdamW denominator epsilon.",
       .aliases = {"adam_epsilon", "eps"},
       .apply = train_field<&TrainingArgs::adam_eps>},
      {.name = "clip_grad",
       .type = kFloat,
       .group = kTraining,
       .default_yaml = "1.0",
       .min = 0,
       .help = "Global gradient-norm clipping threshold; 0 disables clipping.",
       .aliases = {"max_grad_norm", "grad_clip"},
       .apply = train_field<&TrainingArgs::clip_grad>},
      {.name = "seed",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1234",
       .min = 0,
       .help = "Seed of weight initialisation, data order and mock data.",
       .apply = train_field<&TrainingArgs::seed>},
      {.name = "log_interval",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "100",
       .min = 1,
       .help = "Steps between log lines.",
       .aliases = {"logging_steps"},
       .apply = train_field<&TrainingArgs::log_interval>},
      {.name = "eval_interval",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1000",
       .min = 0,
       .help = "Steps between evaluations; 0 disables evaluation.",
       .aliases = {"eval_steps"},
       .apply = train_field<&TrainingArgs::eval_interval>},
      {.name = "eval_iters",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "100",
       .min = 0,
       .help = "Validation batches per evaluation.",
       .apply = train_field<&TrainingArgs::eval_iters>},
      {.name = "save",
       .type = kString,
       .group = kTraining,
       .default_yaml = "\"\"",
       .help = "Checkpoint directory; empty: <workspace>/<exp_name>/checkpoints.",
       .aliases = {"save_dir", "output_dir"},
       .apply = train_field<&TrainingArgs::save>},
      {.name = "save_interval",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "0",
       .min = 0,
       .help = "Steps between checkpoints; 0 saves only at the end.",
       .aliases = {"save_steps"},
       .apply = train_field<&TrainingArgs::save_interval>},
      {.name = "deterministic_mode",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Runs repeat bit for bit on a GPU: attention's backward without atomics (the only op that sums "
               "with them), at a cost in speed (docs/training.md). The CPU engine always repeats.",
       .apply = train_field<&TrainingArgs::deterministic_mode>},
      {.name = "async_save",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Save checkpoints in the background: training waits only while the state is copied to pinned host "
               "memory (host memory of one checkpoint shard per rank, kept for the run); the commit follows at a "
               "later step once every rank's files are written.",
       .apply = train_field<&TrainingArgs::async_save>},
      {.name = "keep_latest_k",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "0",
       .min = 0,
       .help = "Checkpoints kept in the save directory: after each save the oldest beyond the latest k are "
               "removed (except those keep_interval keeps); 0 keeps every one.",
       .apply = train_field<&TrainingArgs::keep_latest_k>},
      {.name = "keep_interval",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "0",
       .min = 0,
       .help = "With keep_latest_k: checkpoints whose iteration is a multiple of this are kept for good; a "
               "multiple of save_interval. 0: none.",
       .apply = train_field<&TrainingArgs::keep_interval>},
      {.name = "load",
       .type = kString,
       .group = kTraining,
       .default_yaml = "\"\"",
       .help = "Checkpoint directory to resume from; empty: the save directory.",
       .apply = train_field<&TrainingArgs::load>},
      {.name = "pretrained_checkpoint",
       .type = kString,
       .group = kTraining,
       .default_yaml = "\"\"",
       .help = "Hugging Face model directory whose weights start the run (no optimizer state).",
       .apply = train_field<&TrainingArgs::pretrained_checkpoint>},
      {.name = "mock_data",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Train on synthetic tokens; data_path is then ignored. Never switched on implicitly.",
       .apply = train_field<&TrainingArgs::mock_data>},
      {.name = "data_path",
       .type = kStringList,
       .group = kTraining,
       .default_yaml = "[]",
       .help = "Megatron indexed dataset prefixes (a blend: [w1, prefix1, w2, prefix2, ...]) or text files and "
               "directories (byte-level tokenizer); required unless mock_data.",
       .aliases = {"data", "dataset", "train_data_path"},
       .apply = train_field<&TrainingArgs::data_path>},
      {.name = "split",
       .type = kString,
       .group = kTraining,
       .default_yaml = "969,30,1",
       .help = "Train, validation and test weights: 1 to 3 comma-separated non-negative numbers, positive sum.",
       .apply = train_field<&TrainingArgs::split>,
       .check = check_split},
      {.name = "reset_position_ids",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Documents packed into one sample (separated by the tokenizer's EOD id) get RoPE positions that "
               "restart at 0 after each EOD (Megatron's switch). Needs data with EOD tokens (not mock_data).",
       .apply = train_field<&TrainingArgs::reset_position_ids>},
      {.name = "reset_attention_mask",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Tokens attend only to earlier tokens of their own document (the EOD ends a document), as Megatron's "
               "switch. Needs data with EOD tokens (not mock_data). On CUDA, bf16 attention then runs on the "
               "simple native O(T²) kernels instead of cuDNN: exact, but much slower (docs/training.md).",
       .apply = train_field<&TrainingArgs::reset_attention_mask>},
      {.name = "eod_mask_loss",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "No loss where the input token is the EOD id (predicting the next document's first token); the loss "
               "is the mean over the tokens that remain, as in Megatron. Needs data with EOD tokens (not mock_data).",
       .apply = train_field<&TrainingArgs::eod_mask_loss>},
      {.name = "tokenizer_type",
       .type = kString,
       .group = kTraining,
       .default_yaml = "ByteLevelTokenizer",
       .choices = {"ByteLevelTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer", "TikTokenizer", "Llama3Tokenizer",
                   "SentencePieceTokenizer", "Llama2Tokenizer", "GPTSentencePieceTokenizer"},
       .help = "Tokenizer (Megatron-LM names). All but ByteLevelTokenizer read tokenizer_model.",
       .aliases = {"tokenizer"},
       .apply = train_field<&TrainingArgs::tokenizer_type>},
      {.name = "tokenizer_model",
       .type = kString,
       .group = kTraining,
       .default_yaml = "\"\"",
       .help = "Tokenizer file or directory: tokenizer.json (HuggingFaceTokenizer), a tiktoken rank file "
               "(TikTokenizer, Llama3Tokenizer), a SentencePiece tokenizer.model, or a folder holding one.",
       .apply = train_field<&TrainingArgs::tokenizer_model>},
      {.name = "tensorboard_dir",
       .type = kString,
       .group = kTraining,
       .default_yaml = "\"\"",
       .help = "Write TensorBoard event files here (Megatron's tags: lm loss, learning-rate, grad-norm, "
               "lm loss validation, plus throughput); empty: off.",
       .apply = train_field<&TrainingArgs::tensorboard_dir>},
      {.name = "log_learning_rate_to_tensorboard",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "true",
       .help = "TensorBoard: learning-rate.",
       .apply = train_field<&TrainingArgs::log_learning_rate_to_tensorboard>},
      {.name = "log_throughput",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "TensorBoard: tokens-per-sec, tflops-per-gpu and (on a GPU) mfu.",
       .apply = train_field<&TrainingArgs::log_throughput>},
      {.name = "log_timers_to_tensorboard",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "TensorBoard: the step's phases, data-wait-ms, forward-time-ms, "
               "backward-time-ms and optimizer-time-ms (device time).",
       .apply = train_field<&TrainingArgs::log_timers_to_tensorboard>},
      {.name = "moe_router_bias_update_rate",
       .type = kFloat,
       .group = kTraining,
       .default_yaml = "0.001",
       .min = 0,
       .help = "With moe_router_enable_expert_bias: each step, bias[e] += rate × sign(mean load - load of e) "
               "(Megatron's and DeepSeek-V3's update).",
       .apply = train_field<&TrainingArgs::moe_router_bias_update_rate>},
      {.name = "moe_per_layer_logging",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "TensorBoard: each MoE layer's moe/load_balancing_loss_layer_<i>, moe/z_loss_layer_<i> and "
               "moe/max_load_layer_<i> besides the means over the layers (metrics.jsonl always has every layer).",
       .apply = train_field<&TrainingArgs::moe_per_layer_logging>},
      {.name = "log_memory_to_tensorboard",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "TensorBoard: mem-peak-gib (GPU runs).",
       .apply = train_field<&TrainingArgs::log_memory_to_tensorboard>},
      {.name = "log_validation_ppl_to_tensorboard",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "TensorBoard: lm loss validation ppl, exp of the eval loss.",
       .apply = train_field<&TrainingArgs::log_validation_ppl_to_tensorboard>},
      {.name = "mlflow_tracking_dir",
       .type = kString,
       .group = kTraining,
       .default_yaml = "\"\"",
       .help = "Log the run into this MLflow file store (an mlruns/ directory, created if missing; read it with "
               "`mlflow ui --backend-store-uri file:DIR`): params from the effective config, metrics at every logged "
               "step, status at the end. Written directly, no network. A resumed run continues the same MLflow run. "
               "Empty: off.",
       .apply = train_field<&TrainingArgs::mlflow_tracking_dir>},
      {.name = "mlflow_experiment_name",
       .type = kString,
       .group = kTraining,
       .presence = kOptional,
       .help = "MLflow experiment of the run (found by name in mlflow_tracking_dir, else created). Derived: exp_name.",
       .apply = train_field<&TrainingArgs::mlflow_experiment_name>},
      {.name = "bf16",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Mixed precision: bf16 weights copy, activations and matmuls, with fp32 master weights, optimizer "
               "state and gradient accumulation. Needs a CUDA device; the CPU engine computes in fp32.",
       .apply = train_field<&TrainingArgs::bf16>},
      // ---- fp8 (docs/fp8.md; Megatron's Transformer Engine keys) ----
      {.name = "fp8_format",
       .type = kString,
       .group = kTraining,
       .presence = kOptional,
       .choices = {"e4m3", "hybrid"},
       .help = "fp8 training: the GEMMs of the transformer layers read fp8 operands. e4m3: every operand in e4m3; "
               "hybrid: e4m3 forward (activations, weights), e5m2 gradients. On MI300X the fnuz variants of the same "
               "formats. Unset/null: off. Needs a GPU with fp8 tensor cores (Hopper sm_90 or newer); on the first GPU "
               "measurement it was slower than bf16 (docs/perf/fp8.md).",
       .aliases = {"fp8"},
       .apply = train_field<&TrainingArgs::fp8_format>},
      {.name = "fp8_recipe",
       .type = kString,
       .group = kTraining,
       .default_yaml = "delayed",
       .choices = {"tensorwise", "delayed", "blockwise"},
       .why = "mxfp8 needs Blackwell's block-scaled tensor cores",
       .help = "With fp8_format: how scales are chosen. tensorwise: one scale per tensor from its own amax (current "
               "scaling); delayed: one scale per tensor from the amax history of earlier steps "
               "(fp8_amax_history_len, fp8_amax_compute_algo, fp8_margin); blockwise: one scale per 1x128 tile of "
               "activations and gradients and per 128x128 block of weights (DeepSeek-V3).",
       .apply = train_field<&TrainingArgs::fp8_recipe>},
      {.name = "fp8_margin",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "0",
       .min = 0,
       .max = 64,
       .help = "fp8_recipe delayed: scales are divided by 2^margin, headroom for amaxes growing between steps.",
       .apply = train_field<&TrainingArgs::fp8_margin>},
      {.name = "fp8_amax_history_len",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1",
       .min = 1,
       .help = "fp8_recipe delayed: steps of amax history kept per tensor (the step in progress included).",
       .apply = train_field<&TrainingArgs::fp8_amax_history_len>},
      {.name = "fp8_amax_compute_algo",
       .type = kString,
       .group = kTraining,
       .default_yaml = "most_recent",
       .choices = {"most_recent", "max"},
       .help = "fp8_recipe delayed: the amax a scale comes from: the last step's (most_recent) or the largest in the "
               "history (max).",
       .apply = train_field<&TrainingArgs::fp8_amax_compute_algo>},
      {.name = "first_last_layers_bf16",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "With fp8_format: the first num_layers_at_start_in_bf16 and last num_layers_at_end_in_bf16 "
               "transformer layers keep bf16 GEMMs.",
       .apply = train_field<&TrainingArgs::first_last_layers_bf16>},
      {.name = "num_layers_at_start_in_bf16",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1",
       .min = 0,
       .help = "With first_last_layers_bf16: leading transformer layers kept in bf16.",
       .apply = train_field<&TrainingArgs::num_layers_at_start_in_bf16>},
      {.name = "num_layers_at_end_in_bf16",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1",
       .min = 0,
       .help = "With first_last_layers_bf16: trailing transformer layers kept in bf16.",
       .apply = train_field<&TrainingArgs::num_layers_at_end_in_bf16>},
      {.name = "profile",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Write a Chrome/Perfetto trace (run_dir/profile/trace_rank<R>.json) of iterations "
               "[profile_step_start, profile_step_end): training phases, layers (Hugging Face module names) and ops, "
               "as issued on the host and as run on the device. NVTX ranges with the same names are always on, for "
               "Nsight Systems.",
       .apply = train_field<&TrainingArgs::profile>},
      {.name = "profile_step_start",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "10",
       .min = 1,
       .help = "First profiled iteration (1-based).",
       .apply = train_field<&TrainingArgs::profile_step_start>},
      {.name = "profile_step_end",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "12",
       .min = 2,
       .help = "Iteration at which profiling stops (not profiled); must exceed profile_step_start.",
       .apply = train_field<&TrainingArgs::profile_step_end>},
      {.name = "profile_ranks",
       .type = kStringList,
       .group = kTraining,
       .default_yaml = "[0]",
       .help = "Ranks that write a trace.",
       .apply = train_field<&TrainingArgs::profile_ranks>,
       .check = check_ranks},
      {.name = "recompute_granularity",
       .type = kString,
       .group = kTraining,
       .presence = kOptional,
       .choices = {"full", "selective"},
       .help = "Activation recompute to save memory. full: recomputed layers keep only their input and run their "
               "forward again in backward (recompute_method, recompute_num_layers); selective: every layer drops "
               "its SwiGLU output (ffn_hidden_size values per token, the largest activation) and recomputes it in "
               "backward, for a few percent of step time. Absent/null: keep everything.",
       .apply = train_field<&TrainingArgs::recompute_granularity>},
      {.name = "recompute_method",
       .type = kString,
       .group = kTraining,
       .presence = kOptional,
       .choices = {"uniform", "block"},
       .help = "With recompute_granularity: full. uniform: all layers, in chunks of recompute_num_layers that keep "
               "one input each; block: only the first recompute_num_layers layers, each keeping its input. "
               "Derived: uniform.",
       .apply = train_field<&TrainingArgs::recompute_method>},
      {.name = "recompute_num_layers",
       .type = kInt,
       .group = kTraining,
       .presence = kOptional,
       .min = 1,
       .help = "With recompute_granularity: full: layers per recompute chunk (uniform) or layers recomputed "
               "(block). Derived: 1 (uniform) or num_layers (block).",
       .apply = train_field<&TrainingArgs::recompute_num_layers>},
      {.name = "device",
       .type = kString,
       .group = kTraining,
       .default_yaml = "auto",
       .choices = {"auto", "cpu", "cuda"},
       .help = "auto: the first CUDA GPU when the binary has CUDA and a GPU is usable, else the CPU; cuda: require one.",
       .apply = train_field<&TrainingArgs::device>},
      // ---- parallelism (Megatron-LM names) ----
      {.name = "tensor_model_parallel_size",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1",
       .min = 1,
       .help = "Tensor-parallel ranks per model replica: each holds its share of the attention heads, MLP "
               "columns and vocabulary (Megatron's column- and row-parallel layers, vocabulary-parallel embedding "
               "and cross-entropy). Ranks of a group are adjacent (tp is the fastest dimension).",
       .aliases = {"tp", "tensor_parallel_size", "tensor_parallel_degree"},
       .apply = train_field<&TrainingArgs::tensor_model_parallel_size>},
      {.name = "pipeline_model_parallel_size",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1",
       .min = 1,
       .help = "Pipeline stages per model replica: each holds a contiguous share of the layers (the first also the "
               "embedding, the last the final norm, output layer and loss); activations and gradients pass between "
               "stages point to point, micro-batches run under the 1F1B schedule (interleaved with virtual stages). "
               "The micro-batches per step should be at least this many, or the stages idle. Not with FSDP's "
               "optim_grads or optim_grads_params.",
       .aliases = {"pp", "pipeline_parallel_size", "pipeline_parallel_degree"},
       .apply = train_field<&TrainingArgs::pipeline_model_parallel_size>},
      {.name = "context_parallel_size",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1",
       .min = 1,
       .help = "Ranks each sequence is split over (ring attention): each holds 2 of 2 x this many chunks of every "
               "sequence (chunks i and 2cp-1-i, the load-balanced split for the causal mask), and the keys and values "
               "go around the ring. seq_length must be a multiple of 2 x context_parallel_size. Gradients reduce over "
               "data x context parallel ranks. Not with reset_position_ids or reset_attention_mask.",
       .aliases = {"cp", "context_parallel_degree"},
       .apply = train_field<&TrainingArgs::context_parallel_size>},
      {.name = "expert_model_parallel_size",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "1",
       .min = 1,
       .help = "Ranks the routed experts of every MoE layer are split over (expert parallelism): each holds "
               "num_experts / this many whole experts, and the tokens travel to the ranks of their experts and back "
               "by all-to-all (moe_token_dispatcher_type). The expert-parallel ranks are consecutive ranks of the "
               "data x context parallel ones, so this must divide both num_experts and data-parallel size x "
               "context_parallel_size; everything but the experts stays replicated over them. Expert gradients "
               "reduce over the ranks holding the same experts. Not with FSDP's optim_grads or optim_grads_params.",
       .aliases = {"ep", "expert_parallel_size"},
       .apply = train_field<&TrainingArgs::expert_model_parallel_size>},
      {.name = "moe_token_dispatcher_type",
       .type = kString,
       .group = kTraining,
       .default_yaml = "alltoall",
       .choices = {"alltoall", "allgather", "flex"},
       .help = "How tokens reach experts on other expert-parallel ranks: alltoall (sort by expert, exchange the "
               "per-expert counts, all-to-all the rows, the reverse after the experts). allgather and flex "
               "(Megatron's other dispatchers) are not implemented and refused.",
       .apply = train_field<&TrainingArgs::moe_token_dispatcher_type>},
      {.name = "sequence_parallel",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "With tensor parallelism: the activations between the tensor-parallel regions (norms, residual adds) "
               "are split over the tensor-parallel ranks by rows (the micro-batch's tokens), with reduce-scatter and "
               "all-gather instead of all-reduce. Needs tensor_model_parallel_size > 1, and micro_batch_size x "
               "seq_length / context_parallel_size divisible by it.",
       .apply = train_field<&TrainingArgs::sequence_parallel>},
      {.name = "num_layers_per_virtual_pipeline_stage",
       .type = kInt,
       .group = kTraining,
       .presence = kOptional,
       .min = 1,
       .help = "Interleaved pipeline schedule: layers per model chunk (virtual stage); each pipeline stage holds "
               "num_layers / pipeline_model_parallel_size / this many chunks, chunk v of stage s being the "
               "(v x pipeline_model_parallel_size + s)-th group of layers. Unset: no interleaving. Needs "
               "pipeline_model_parallel_size > 1; with decoder_first/last_pipeline_num_layers give "
               "num_virtual_stages_per_pipeline_rank instead. The micro-batches per step must be a multiple of "
               "pipeline_model_parallel_size.",
       .apply = train_field<&TrainingArgs::num_layers_per_virtual_pipeline_stage>},
      {.name = "num_virtual_stages_per_pipeline_rank",
       .type = kInt,
       .group = kTraining,
       .presence = kOptional,
       .min = 1,
       .help = "Interleaved pipeline schedule: model chunks (virtual stages) per pipeline stage, each stage's layers "
               "split evenly into them (also with decoder_first/last_pipeline_num_layers). Unset: no interleaving, "
               "or as num_layers_per_virtual_pipeline_stage gives (not both). Needs pipeline_model_parallel_size > 1.",
       .aliases = {"virtual_pipeline_model_parallel_size"},
       .apply = train_field<&TrainingArgs::num_virtual_stages_per_pipeline_rank>},
      {.name = "decoder_first_pipeline_num_layers",
       .type = kInt,
       .group = kTraining,
       .presence = kOptional,
       .min = 1,
       .help = "Layers of the first pipeline stage (which also holds the embedding); the remaining layers split "
               "evenly over the other stages. Unset: an even split. Needs pipeline_model_parallel_size > 1.",
       .aliases = {"num_layers_in_first_pipeline_stage"},
       .apply = train_field<&TrainingArgs::decoder_first_pipeline_num_layers>},
      {.name = "decoder_last_pipeline_num_layers",
       .type = kInt,
       .group = kTraining,
       .presence = kOptional,
       .min = 1,
       .help = "Layers of the last pipeline stage (which also holds the output layer and the loss); the remaining "
               "layers split evenly over the other stages. Unset: an even split. Needs "
               "pipeline_model_parallel_size > 1.",
       .aliases = {"num_layers_in_last_pipeline_stage"},
       .apply = train_field<&TrainingArgs::decoder_last_pipeline_num_layers>},
      {.name = "use_distributed_optimizer",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Shard the AdamW state over the data-parallel ranks (ZeRO-1, Megatron's distributed optimizer): "
               "gradients are reduce-scattered, each rank updates its shard, the updated weights are "
               "all-gathered. Same results as plain data parallelism.",
       .apply = train_field<&TrainingArgs::use_distributed_optimizer>},
      {.name = "overlap_grad_reduce",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Reduce gradient buckets on the communication stream as backward produces them, overlapped with "
               "the rest of backward; off: one reduction after backward.",
       .apply = train_field<&TrainingArgs::overlap_grad_reduce>},
      {.name = "overlap_param_gather",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "With use_distributed_optimizer (or FSDP): all-gather the updated weights on the communication "
               "stream after the optimizer step while the next forward runs; each layer waits only for its own.",
       .apply = train_field<&TrainingArgs::overlap_param_gather>},
      {.name = "ddp_bucket_size",
       .type = kInt,
       .group = kTraining,
       .presence = kOptional,
       .min = 1,
       .help = "Gradient bucket size in parameters. Derived as Megatron-Core: max(40,000,000, 1,000,000 x "
               "data-parallel size).",
       .apply = train_field<&TrainingArgs::ddp_bucket_size>},
      {.name = "use_megatron_fsdp",
       .type = kBool,
       .group = kTraining,
       .default_yaml = "false",
       .help = "Fully sharded data parallelism with data_parallel_sharding_strategy.",
       .aliases = {"fsdp", "use_torch_fsdp2"},
       .apply = train_field<&TrainingArgs::use_megatron_fsdp>},
      {.name = "data_parallel_sharding_strategy",
       .type = kString,
       .group = kTraining,
       .default_yaml = "no_shard",
       .choices = {"no_shard", "optim", "optim_grads", "optim_grads_params"},
       .help = "With use_megatron_fsdp: what is sharded over the data-parallel ranks. optim: AdamW state (as "
               "use_distributed_optimizer); optim_grads: also the reduced gradients (ZeRO-2); optim_grads_params: "
               "also the weights (ZeRO-3).",
       .apply = train_field<&TrainingArgs::data_parallel_sharding_strategy>},
      {.name = "distributed_timeout_minutes",
       .type = kFloat,
       .group = kTraining,
       .default_yaml = "10",
       .min = 0,
       .min_exclusive = true,
       .help = "How long a rank waits for the others (rendezvous, a collective) before failing with a message "
               "naming what it waited for.",
       .apply = train_field<&TrainingArgs::distributed_timeout_minutes>},
      {.name = "sample_length",
       .type = kInt,
       .group = kTraining,
       .default_yaml = "0",
       .min = 0,
       .help = "Tokens to generate from sample_prompt after training; 0: none.",
       .apply = train_field<&TrainingArgs::sample_length>},
      {.name = "sample_prompt",
       .type = kString,
       .group = kTraining,
       .default_yaml = "\"\"",
       .help = "Prompt for the sample generated after training.",
       .apply = train_field<&TrainingArgs::sample_prompt>},
  };
}

}  // namespace

const std::vector<KeySpec>& module_key_specs() {
  static const std::vector<KeySpec> specs = build_specs();
  return specs;
}

const KeySpec* find_key_spec(std::string_view name) {
  for (const KeySpec& spec : module_key_specs()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

const std::vector<std::string>& top_level_keys() {
  static const std::vector<std::string> keys = {"extends",   "work_group", "user_name", "exp_name",
                                                "workspace", "env",        "modules",   "container", "slurm"};
  return keys;
}

const std::vector<std::string>& module_section_keys() {
  static const std::vector<std::string> keys = {"framework", "model", "overrides"};
  return keys;
}

const char* type_name(KeyType type) {
  switch (type) {
    case KeyType::kBool:
      return "bool";
    case KeyType::kInt:
      return "int";
    case KeyType::kFloat:
      return "float";
    case KeyType::kString:
      return "string";
    case KeyType::kStringList:
      return "string_list";
  }
  return "string";
}

const char* group_name(KeyGroup group) { return group == KeyGroup::kModel ? "model" : "training"; }

}  // namespace primus::config
