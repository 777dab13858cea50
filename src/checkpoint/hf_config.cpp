// config.json export/import for Llama, Qwen3, Mixtral, Qwen3-MoE and DeepSeek-V2/V3 (multi-head latent attention); defaults for absent keys follow transformers' LlamaConfig and
// Qwen3Config so a file means the same model here as it does there.
#include "checkpoint/hf_config.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"
#include "models/model.h"

namespace primus {

namespace {

using nlohmann::json;

// Reads typed fields of one JSON object, naming `source` and the key in every error.
class FieldReader {
 public:
  FieldReader(const json& j, const std::string& source, std::string prefix = "")
      : j_(j), source_(source), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int64_t positive_int(const char* key) const {
    if (!has(key)) fail(key, "is required but missing");
    const json& v = j_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      fail(key, fmt::format("must be a positive integer, got {}", v.dump()));
    return v.get<int64_t>();
  }
  int64_t positive_int(const char* key, int64_t fallback) const { return has(key) ? positive_int(key) : fallback; }

  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_number()) fail(key, fmt::format("must be a number, got {}", v.dump()));
    return v.get<double>();
  }
  double positive_number(const char* key, double fallback) const {
    double x = number(key, fallback);
    if (!(x > 0)) fail(key, fmt::format("must be positive, got {}", j_.at(key).dump()));
    return x;
  }

  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail(key, fmt::format("must be true or false, got {}", v.dump()));
    return v.get<bool>();
  }

  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (!v.is_string()) fail(key, fmt::format("must be a string, got {}", v.dump()));
    return v.get<std::string>();
  }

  [[noreturn]] void fail(const char* key, const std::string& what) const {
    throw UsageError(fmt::format("{}: {}{} {}", source_, prefix_, key, what));
  }

 private:
  const json& j_;
  const std::string& source_;
  std::string prefix_;
};

// Applies "llama3" frequency scaling from a rope_scaling (or transformers v5 rope_parameters) object.
void read_rope(const json& rope, const std::string& source, const char* key, ModelArgs& m) {
  if (!rope.is_object()) {
    throw UsageError(fmt::format("{}: {} must be an object or null, got {}", source, key, rope.dump()));
  }
  FieldReader r(rope, source, std::string(key) + ".");
  // Older files call the field "type".
  std::string type = r.string("rope_type", r.string("type", "default"));
  if (type == "default") return;
  if (type != "llama3") {
    r.fail("rope_type", fmt::format("\"{}\" is not supported (supported: default, llama3)", type));
  }
  m.use_rope_scaling = true;
  auto required_number = [&](const char* field) {
    if (!r.has(field)) r.fail(field, "is required for rope_type llama3 but missing");
    return r.positive_number(field, 0.0);
  };
  m.rope_scaling_factor = required_number("factor");
  m.rope_scaling_low_freq_factor = required_number("low_freq_factor");
  m.rope_scaling_high_freq_factor = required_number("high_freq_factor");
  m.rope_scaling_original_max_position_embeddings = r.positive_int("original_max_position_embeddings");
}

// The first of `m`'s MoE settings that Hugging Face's config of its model type cannot state, or "" when all can.
const char* inexpressible_moe_key(const ModelArgs& m) {
  if (m.moe_shared_expert_intermediate_size > 0) return "moe_shared_expert_intermediate_size";
  if (m.moe_router_score_function != "softmax") return "moe_router_score_function";
  if (m.moe_router_num_groups > 1) return "moe_router_num_groups";
  if (m.moe_router_topk_scaling_factor != 1.0) return "moe_router_topk_scaling_factor";
  if (m.qk_layernorm) return "";
  if (m.moe_router_pre_softmax) return "moe_router_pre_softmax";
  for (int64_t i = 0; i < m.num_layers; ++i) {
    if (!m.is_moe_layer(i)) return "moe_layer_freq";
  }
  return "";
}

// The MoE fields of Mixtral's and Qwen3-MoE's config.json, and every MoE key under "primus_moe" so that a checkpoint
// reads back to exactly its model. Routing that Hugging Face's config of that type cannot state makes the file's
// model_type "primus_moe": transformers then refuses it instead of loading a different model.
void write_moe_fields(const ModelArgs& m, json& j) {
  const bool qwen3 = m.qk_layernorm;
  j["num_experts_per_tok"] = m.moe_router_topk;
  j["router_aux_loss_coef"] = m.moe_router_load_balancing_type == "aux_loss" ? m.moe_aux_loss_coeff : 0.0;
  j["output_router_logits"] = false;
  if (qwen3) {
    j["num_experts"] = m.num_experts;
    j["moe_intermediate_size"] = m.moe_ffn_hidden_size;
    j["norm_topk_prob"] = !m.moe_router_pre_softmax;
    j["decoder_sparse_step"] = 1;
    json dense = json::array();
    for (int64_t i = 0; i < m.num_layers; ++i) {
      if (!m.is_moe_layer(i)) dense.push_back(i);
    }
    j["mlp_only_layers"] = dense;
  } else {
    j["num_local_experts"] = m.num_experts;
    j["intermediate_size"] = m.moe_ffn_hidden_size;  // Mixtral's is each expert's
    j["sliding_window"] = nullptr;
  }
  j["primus_moe"] = {{"qk_layernorm", m.qk_layernorm},
                     {"ffn_hidden_size", m.ffn_hidden_size},
                     {"num_experts", m.num_experts},
                     {"moe_router_topk", m.moe_router_topk},
                     {"moe_ffn_hidden_size", m.moe_ffn_hidden_size},
                     {"moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size},
                     {"moe_layer_freq", m.moe_layer_freq},
                     {"moe_first_k_dense_replace", m.moe_first_k_dense_replace},
                     {"moe_router_score_function", m.moe_router_score_function},
                     {"moe_router_pre_softmax", m.moe_router_pre_softmax},
                     {"moe_router_topk_scaling_factor", m.moe_router_topk_scaling_factor},
                     {"moe_aux_loss_coeff", m.moe_aux_loss_coeff},
                     {"moe_z_loss_coeff", m.moe_z_loss_coeff},
                     {"moe_router_load_balancing_type", m.moe_router_load_balancing_type},
                     {"moe_router_num_groups", m.moe_router_num_groups},
                     {"moe_router_group_topk", m.moe_router_group_topk},
                     {"moe_expert_capacity_factor", m.moe_expert_capacity_factor},
                     {"moe_token_drop_policy", m.moe_token_drop_policy},
                     {"moe_pad_expert_input_to_capacity", m.moe_pad_expert_input_to_capacity}};
  if (const char* key = inexpressible_moe_key(m); *key != '\0') {
    j["model_type"] = "primus_moe";
    j["architectures"] = json::array({"PrimusMoeForCausalLM"});
    j["primus_moe_note"] = fmt::format("{} has no {} equivalent in Hugging Face's config; the primus_moe keys are the "
                                       "model",
                                       key, qwen3 ? "Qwen3-MoE" : "Mixtral");
  }
}

// The "primus_moe" block of a config.json this engine wrote: every MoE key as it was.
void read_primus_moe(const json& block, const std::string& source_name, ModelArgs& m) {
  FieldReader r(block, source_name, "primus_moe.");
  auto get_int = [&](const char* key) {
    if (!block.contains(key) || !block.at(key).is_number_integer()) r.fail(key, "must be an integer");
    return block.at(key).get<int64_t>();
  };
  m.ffn_hidden_size = r.positive_int("ffn_hidden_size");
  m.num_experts = r.positive_int("num_experts");
  m.moe_router_topk = r.positive_int("moe_router_topk");
  if (m.moe_router_topk > m.num_experts) {
    r.fail("moe_router_topk", fmt::format("({}) exceeds the {} experts", m.moe_router_topk, m.num_experts));
  }
  m.moe_ffn_hidden_size = r.positive_int("moe_ffn_hidden_size");
  m.moe_shared_expert_intermediate_size = get_int("moe_shared_expert_intermediate_size");
  const json& freq = block.contains("moe_layer_freq") ? block.at("moe_layer_freq") : json();
  if (!freq.is_array() || freq.empty()) r.fail("moe_layer_freq", "must be a non-empty list of integers");
  m.moe_layer_freq.clear();
  for (const json& v : freq) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) r.fail("moe_layer_freq", fmt::format("entry {}", v.dump()));
    m.moe_layer_freq.push_back(v.get<int64_t>());
  }
  if (m.moe_layer_freq.size() != 1 && static_cast<int64_t>(m.moe_layer_freq.size()) != m.num_layers) {
    r.fail("moe_layer_freq", fmt::format("lists {} layers of {}", m.moe_layer_freq.size(), m.num_layers));
  }
  m.moe_first_k_dense_replace = get_int("moe_first_k_dense_replace");
  m.moe_router_score_function = r.string("moe_router_score_function", "softmax");
  if (m.moe_router_score_function != "softmax" && m.moe_router_score_function != "sigmoid") {
    r.fail("moe_router_score_function", fmt::format("\"{}\" is not softmax or sigmoid", m.moe_router_score_function));
  }
  m.moe_router_pre_softmax = r.boolean("moe_router_pre_softmax", false);
  m.moe_router_topk_scaling_factor = r.positive_number("moe_router_topk_scaling_factor", 1.0);
  m.moe_aux_loss_coeff = r.number("moe_aux_loss_coeff", 0.0);
  m.moe_z_loss_coeff = r.number("moe_z_loss_coeff", 0.0);
  m.moe_router_load_balancing_type = r.string("moe_router_load_balancing_type", "aux_loss");
  m.moe_router_num_groups = r.positive_int("moe_router_num_groups", 1);
  m.moe_router_group_topk = r.positive_int("moe_router_group_topk", 1);
  // Expert capacity (absent from files written before it existed: dropless).
  m.moe_expert_capacity_factor = r.number("moe_expert_capacity_factor", 0.0);
  m.moe_token_drop_policy = r.string("moe_token_drop_policy", "probs");
  if (m.moe_token_drop_policy != "probs" && m.moe_token_drop_policy != "position") {
    r.fail("moe_token_drop_policy", fmt::format("\"{}\" is not probs or position", m.moe_token_drop_policy));
  }
  m.moe_pad_expert_input_to_capacity = r.boolean("moe_pad_expert_input_to_capacity", false);
  if (m.num_experts % m.moe_router_num_groups != 0 || m.moe_router_group_topk > m.moe_router_num_groups) {
    r.fail("moe_router_num_groups", fmt::format("({}, top {}) do not split {} experts", m.moe_router_num_groups,
                                                m.moe_router_group_topk, m.num_experts));
  }
}

// The MoE keys of a Mixtral or Qwen3-MoE config.json (transformers' defaults where absent).
void read_moe_fields(const json& j, FieldReader& r, bool qwen3, ModelArgs& m) {
  m.num_experts = r.positive_int(qwen3 ? "num_experts" : "num_local_experts", qwen3 ? 128 : 8);
  m.moe_router_topk = r.positive_int("num_experts_per_tok", qwen3 ? 8 : 2);
  if (m.moe_router_topk > m.num_experts) {
    r.fail("num_experts_per_tok", fmt::format("({}) exceeds the {} experts", m.moe_router_topk, m.num_experts));
  }
  m.moe_aux_loss_coeff = r.number("router_aux_loss_coef", 0.001);
  m.moe_ffn_hidden_size = qwen3 ? r.positive_int("moe_intermediate_size", 768) : m.ffn_hidden_size;
  if (!qwen3) return;
  m.moe_router_pre_softmax = !r.boolean("norm_topk_prob", false);
  // transformers: layer i is sparse unless listed in mlp_only_layers, when (i + 1) % decoder_sparse_step == 0.
  const int64_t step = r.positive_int("decoder_sparse_step", 1);
  std::vector<int64_t> pattern(static_cast<size_t>(m.num_layers), 0);
  for (int64_t i = 0; i < m.num_layers; ++i) pattern[static_cast<size_t>(i)] = (i + 1) % step == 0 ? 1 : 0;
  if (r.has("mlp_only_layers")) {
    const json& dense = j.at("mlp_only_layers");
    if (!dense.is_array()) r.fail("mlp_only_layers", fmt::format("must be a list of layer indices, got {}", dense.dump()));
    for (const json& v : dense) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= m.num_layers) {
        r.fail("mlp_only_layers", fmt::format("entry {} is not a layer index below {}", v.dump(), m.num_layers));
      }
      pattern[static_cast<size_t>(v.get<int64_t>())] = 0;
    }
  }
  if (std::find(pattern.begin(), pattern.end(), 0) != pattern.end()) m.moe_layer_freq = pattern;
}

}  // namespace

namespace {

// The fields Llama's, Qwen3's, Mixtral's and DeepSeek-V2's config.json write alike (a json object keeps its keys
// sorted, so where they are set does not matter).
void add_decoder_fields(json& j, const ModelArgs& m) {
  j["hidden_size"] = m.hidden_size;
  j["intermediate_size"] = m.ffn_hidden_size;
  j["num_hidden_layers"] = m.num_layers;
  j["num_attention_heads"] = m.num_attention_heads;
  j["max_position_embeddings"] = m.max_position_embeddings;
  j["rms_norm_eps"] = m.norm_epsilon;
  j["rope_theta"] = m.rotary_base;
  j["tie_word_embeddings"] = !m.untie_embeddings_and_output_weights;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
}

// DeepSeek-V2's config.json (model_type deepseek_v2, which DeepSeek-V3's checkpoints extend) for a model with
// multi-head latent attention: its attention, YaRN and MoE fields under their names there. A setting that file
// cannot state is refused naming the key, rather than written as another model.
json deepseek_config(const ModelArgs& m, const std::string& torch_dtype) {
  json j = json::object();
  j["architectures"] = json::array({"DeepseekV2ForCausalLM"});
  j["model_type"] = "deepseek_v2";
  add_decoder_fields(j, m);
  j["num_key_value_heads"] = m.num_attention_heads;
  j["vocab_size"] = m.vocab_size;
  j["q_lora_rank"] = m.q_lora_rank > 0 ? json(m.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = m.kv_lora_rank;
  j["qk_nope_head_dim"] = m.qk_head_dim;
  j["qk_rope_head_dim"] = m.qk_pos_emb_head_dim;
  j["v_head_dim"] = m.v_head_dim;
  // DeepSeek-V3's key for its multi-token prediction modules (model.layers.{num_hidden_layers + k - 1}).
  if (m.mtp_num_layers > 0) j["num_nextn_predict_layers"] = m.mtp_num_layers;
  if (m.yarn) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", m.rotary_scaling_factor},
                         {"original_max_position_embeddings", m.original_max_position_embeddings},
                         {"beta_fast", m.beta_fast},
                         {"beta_slow", m.beta_slow},
                         {"mscale", m.mscale},
                         {"mscale_all_dim", m.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (m.num_experts > 0) {
    auto refuse = [](const char* key) {
      throw UsageError(fmt::format("[checkpoint] {}: the setting has no equivalent in DeepSeek-V2's config.json", key));
    };
    if (m.moe_layer_freq.size() != 1) refuse("moe_layer_freq");
    const int64_t shared = m.moe_shared_expert_intermediate_size;
    if (shared % m.moe_ffn_hidden_size != 0) refuse("moe_shared_expert_intermediate_size");
    if (m.moe_router_score_function == "softmax" && m.moe_router_num_groups > 1) refuse("moe_router_num_groups");
    j["n_routed_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.moe_router_topk;
    j["moe_intermediate_size"] = m.moe_ffn_hidden_size;
    j["n_shared_experts"] = shared > 0 ? json(shared / m.moe_ffn_hidden_size) : json(nullptr);
    j["first_k_dense_replace"] = m.moe_first_k_dense_replace;
    j["moe_layer_freq"] = m.moe_layer_freq[0];
    j["scoring_func"] = m.moe_router_score_function;
    j["norm_topk_prob"] = m.moe_router_score_function == "sigmoid" || !m.moe_router_pre_softmax;
    j["routed_scaling_factor"] = m.moe_router_topk_scaling_factor;
    j["topk_method"] = m.moe_router_enable_expert_bias ? "noaux_tc"
                       : m.moe_router_num_groups > 1 ? "group_limited_greedy"
                                                     : "greedy";
    j["n_group"] = m.moe_router_num_groups;
    j["topk_group"] = m.moe_router_group_topk;
    j["aux_loss_alpha"] = m.moe_router_load_balancing_type == "none" ? 0.0 : m.moe_aux_loss_coeff;
    j["seq_aux"] = m.moe_router_load_balancing_type == "seq_aux_loss";
  } else {
    j["n_routed_experts"] = nullptr;
  }
  j["initializer_range"] = m.init_method_std;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j;
}

// The MLA, YaRN and MoE fields of a deepseek_v2 config.json (transformers' DeepseekV2Config defaults where absent).
void read_deepseek_fields(const json& j, FieldReader& r, const std::string& source_name, ModelArgs& m) {
  m.multi_latent_attention = true;
  m.num_query_groups = m.num_attention_heads;
  m.kv_channels = std::max<int64_t>(1, m.hidden_size / m.num_attention_heads);  // unused under MLA
  m.q_lora_rank = r.positive_int("q_lora_rank", 0);
  m.kv_lora_rank = r.positive_int("kv_lora_rank", 512);
  m.qk_head_dim = r.positive_int("qk_nope_head_dim", 128);
  m.qk_pos_emb_head_dim = r.positive_int("qk_rope_head_dim", 64);
  if (m.qk_pos_emb_head_dim % 2 != 0) r.fail("qk_rope_head_dim", fmt::format("({}) must be even", m.qk_pos_emb_head_dim));
  m.v_head_dim = r.positive_int("v_head_dim", 128);
  m.mtp_num_layers = r.has("num_nextn_predict_layers") ? j.at("num_nextn_predict_layers").get<int64_t>() : 0;
  if (m.mtp_num_layers < 0) r.fail("num_nextn_predict_layers", fmt::format("({}) must be >= 0", m.mtp_num_layers));
  if (r.has("rope_scaling")) {
    const json& rope = j.at("rope_scaling");
    if (!rope.is_object()) r.fail("rope_scaling", fmt::format("must be an object or null, got {}", rope.dump()));
    FieldReader y(rope, source_name, "rope_scaling.");
    const std::string type = y.string("type", y.string("rope_type", "default"));
    if (type != "yarn") y.fail("type", fmt::format("\"{}\" is not supported for deepseek_v2 (supported: yarn)", type));
    m.yarn = true;
    m.rotary_scaling_factor = y.positive_number("factor", 1.0);
    m.original_max_position_embeddings = y.positive_int("original_max_position_embeddings", 4096);
    m.beta_fast = y.positive_number("beta_fast", 32.0);
    m.beta_slow = y.positive_number("beta_slow", 1.0);
    m.mscale = y.number("mscale", 1.0);
    m.mscale_all_dim = y.number("mscale_all_dim", 0.0);
  }
  if (!r.has("n_routed_experts")) return;
  m.num_experts = r.positive_int("n_routed_experts");
  m.moe_router_topk = r.positive_int("num_experts_per_tok");
  if (m.moe_router_topk > m.num_experts) {
    r.fail("num_experts_per_tok", fmt::format("({}) exceeds the {} experts", m.moe_router_topk, m.num_experts));
  }
  m.moe_ffn_hidden_size = r.positive_int("moe_intermediate_size");
  m.moe_shared_expert_intermediate_size = r.has("n_shared_experts")
                                              ? r.positive_int("n_shared_experts") * m.moe_ffn_hidden_size
                                              : 0;
  m.moe_first_k_dense_replace = r.has("first_k_dense_replace") ? j.at("first_k_dense_replace").get<int64_t>() : 0;
  m.moe_layer_freq = {r.positive_int("moe_layer_freq", 1)};
  m.moe_router_score_function = r.string("scoring_func", "softmax");
  if (m.moe_router_score_function != "softmax" && m.moe_router_score_function != "sigmoid") {
    r.fail("scoring_func", fmt::format("\"{}\" is not softmax or sigmoid", m.moe_router_score_function));
  }
  m.moe_router_pre_softmax = m.moe_router_score_function == "softmax" && !r.boolean("norm_topk_prob", false);
  m.moe_router_topk_scaling_factor = r.positive_number("routed_scaling_factor", 1.0);
  const std::string method = r.string("topk_method", "greedy");
  m.moe_router_enable_expert_bias = method == "noaux_tc";
  m.moe_router_num_groups = method == "greedy" ? 1 : r.positive_int("n_group", 1);
  m.moe_router_group_topk = method == "greedy" ? 1 : r.positive_int("topk_group", 1);
  m.moe_aux_loss_coeff = r.number("aux_loss_alpha", 0.001);
  m.moe_router_load_balancing_type = r.boolean("seq_aux", true) ? "seq_aux_loss" : "aux_loss";
}

}  // namespace

json hf_config_from_model(const ModelArgs& m, const std::string& torch_dtype) {
  PRIMUS_CHECK(m.num_layers > 0 && m.hidden_size > 0 && m.ffn_hidden_size > 0 && m.num_attention_heads > 0 &&
                   m.vocab_size > 0 && m.max_position_embeddings > 0,
               "hf_config_from_model: unresolved model shape (layers {}, hidden {}, ffn {}, heads {}, vocab {}, "
               "max positions {})",
               m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.vocab_size,
               m.max_position_embeddings);
  if (m.multi_latent_attention) return deepseek_config(m, torch_dtype);
  const bool qwen3 = m.qk_layernorm, moe = m.num_experts > 0;
  json j = json::object();
  j["architectures"] = json::array({moe ? (qwen3 ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM")
                                        : (qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM")});
  j["model_type"] = std::string(model_family_name(m));
  add_decoder_fields(j, m);
  j["num_key_value_heads"] = m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads;
  j["head_dim"] = m.kv_channels > 0 ? m.kv_channels : m.hidden_size / m.num_attention_heads;
  j["vocab_size"] = m.vocab_size;
  if (m.use_rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", m.rope_scaling_factor},
                         {"low_freq_factor", m.rope_scaling_low_freq_factor},
                         {"high_freq_factor", m.rope_scaling_high_freq_factor},
                         {"original_max_position_embeddings", m.rope_scaling_original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (qwen3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = m.num_layers;
  } else if (!moe) {
    j["mlp_bias"] = false;
  }
  if (moe) write_moe_fields(m, j);
  j["initializer_range"] = m.init_method_std;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j;
}

ModelArgs model_args_from_hf_config(const json& j, const std::string& source_name) {
  if (!j.is_object()) {
    throw UsageError(fmt::format("{}: expected a JSON object at the top level, got {}", source_name, j.type_name()));
  }
  FieldReader r(j, source_name);
  if (!r.has("model_type")) r.fail("model_type", "is required but missing");
  const std::string model_type = r.string("model_type", "");
  if (model_type != "llama" && model_type != "qwen3" && model_type != "mixtral" && model_type != "qwen3_moe" &&
      model_type != "primus_moe" && model_type != "deepseek_v2") {
    r.fail("model_type", fmt::format("\"{}\" is not supported (supported: llama, qwen3, mixtral, qwen3_moe, "
                                     "primus_moe, deepseek_v2)",
                                     model_type));
  }
  const bool deepseek = model_type == "deepseek_v2";
  const bool primus_moe = r.has("primus_moe");
  if (model_type == "primus_moe" && !primus_moe) r.fail("primus_moe", "is required with model_type primus_moe");
  if (primus_moe && !j.at("primus_moe").is_object()) r.fail("primus_moe", "must be an object");
  const bool qwen3 = model_type == "qwen3" || model_type == "qwen3_moe" ||
                     (model_type == "primus_moe" && j.at("primus_moe").value("qk_layernorm", false) == true);

  ModelArgs m;
  m.preset = source_name;
  m.hidden_size = r.positive_int("hidden_size");
  m.ffn_hidden_size = r.positive_int("intermediate_size");
  m.num_layers = r.positive_int("num_hidden_layers");
  m.num_attention_heads = r.positive_int("num_attention_heads");
  m.vocab_size = r.positive_int("vocab_size");
  m.num_query_groups = r.positive_int("num_key_value_heads", m.num_attention_heads);
  if (m.num_attention_heads % m.num_query_groups != 0) {
    r.fail("num_key_value_heads",
           fmt::format("({}) must divide num_attention_heads ({})", m.num_query_groups, m.num_attention_heads));
  }
  // LlamaConfig derives head_dim from the hidden size; Qwen3Config defaults it to 128 regardless.
  if (!qwen3 && !deepseek && !r.has("head_dim") && m.hidden_size % m.num_attention_heads != 0) {
    r.fail("head_dim", fmt::format("is missing and hidden_size ({}) is not divisible by num_attention_heads ({})",
                                   m.hidden_size, m.num_attention_heads));
  }
  m.kv_channels = r.positive_int("head_dim", qwen3 ? 128 : m.hidden_size / m.num_attention_heads);
  m.max_position_embeddings = r.positive_int("max_position_embeddings", qwen3 ? 32768 : 2048);
  m.norm_epsilon = r.positive_number("rms_norm_eps", 1e-6);
  m.init_method_std = r.positive_number("initializer_range", 0.02);
  m.untie_embeddings_and_output_weights = !r.boolean("tie_word_embeddings", false);
  m.qk_layernorm = qwen3;

  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", fmt::format("\"{}\" is not supported (supported: silu)", act));
  if (r.boolean("attention_bias", false)) r.fail("attention_bias", "true is not supported (our attention has no bias)");
  if (r.boolean("mlp_bias", false)) r.fail("mlp_bias", "true is not supported (our MLP has no bias)");
  if (r.boolean("use_sliding_window", false)) r.fail("use_sliding_window", "true is not supported");

  // transformers v5 moved rope_theta and the scaling into rope_parameters; accept either layout.
  m.rotary_base = r.positive_number("rope_theta", 10000.0);
  if (r.has("rope_parameters")) {
    FieldReader p(j.at("rope_parameters"), source_name, "rope_parameters.");
    if (j.at("rope_parameters").is_object()) m.rotary_base = p.positive_number("rope_theta", m.rotary_base);
    read_rope(j.at("rope_parameters"), source_name, "rope_parameters", m);
  }
  if (deepseek) {
    read_deepseek_fields(j, r, source_name, m);
    return m;
  }
  if (r.has("rope_scaling")) read_rope(j.at("rope_scaling"), source_name, "rope_scaling", m);
  if (primus_moe) {
    read_primus_moe(j.at("primus_moe"), source_name, m);
  } else if (model_type == "mixtral" || model_type == "qwen3_moe") {
    read_moe_fields(j, r, qwen3, m);
  }
  return m;
}

namespace {

// What config.json calls the rope scaling of `m`, for messages: null, or the llama3 parameters.
std::string rope_scaling_text(const ModelArgs& m) {
  if (!m.use_rope_scaling) return "null";
  return fmt::format("llama3 (factor {}, low_freq_factor {}, high_freq_factor {}, original_max_position_embeddings {})",
                     m.rope_scaling_factor, m.rope_scaling_low_freq_factor, m.rope_scaling_high_freq_factor,
                     m.rope_scaling_original_max_position_embeddings);
}

bool nearly_equal(double a, double b) { return std::abs(a - b) <= 1e-6 * std::max(std::abs(a), std::abs(b)); }

// The head count and head size config.json gets for `m` (hf_config_from_model's defaults for unresolved args).
int64_t kv_heads(const ModelArgs& m) { return m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads; }
int64_t head_dim(const ModelArgs& m) {
  return m.kv_channels > 0 ? m.kv_channels : m.hidden_size / m.num_attention_heads;
}

}  // namespace

void require_same_model(const ModelArgs& theirs, const ModelArgs& ours, const std::string& source) {
  auto differ = [&](const char* key, const auto& a, const auto& b) {
    throw UsageError(fmt::format("{}: {} is {} but the configured model has {}", source, key, a, b));
  };
  const std::string_view their_type = model_family_name(theirs), our_type = model_family_name(ours);
  if (their_type != our_type) differ("model_type", their_type, our_type);
  const std::pair<const char*, std::pair<int64_t, int64_t>> sizes[] = {
      {"num_hidden_layers", {theirs.num_layers, ours.num_layers}},
      {"hidden_size", {theirs.hidden_size, ours.hidden_size}},
      {"intermediate_size", {theirs.ffn_hidden_size, ours.ffn_hidden_size}},
      {"num_attention_heads", {theirs.num_attention_heads, ours.num_attention_heads}},
      {"num_key_value_heads", {kv_heads(theirs), kv_heads(ours)}},
      {"head_dim", {head_dim(theirs), head_dim(ours)}},
      {"vocab_size", {theirs.vocab_size, ours.vocab_size}},
      {"num_experts", {theirs.num_experts, ours.num_experts}},
      {"num_experts_per_tok", {theirs.moe_router_topk, ours.moe_router_topk}},
      {"moe_intermediate_size", {theirs.moe_ffn_hidden_size, ours.moe_ffn_hidden_size}},
  };
  for (const auto& [key, values] : sizes) {
    if (values.first != values.second && std::string_view(key) == "vocab_size") {
      // Most often the padding: Megatron's rounds the tokenizer's vocabulary up to a multiple of
      // make_vocab_size_divisible_by × tensor_model_parallel_size, so another tp pads it differently.
      throw UsageError(
          fmt::format("{}: vocab_size is {} but the configured model has {} (the tokenizer's vocabulary "
                      "padded to a multiple of make_vocab_size_divisible_by x "
                      "tensor_model_parallel_size; set vocab_size: {} to use these weights at another "
                      "tensor-parallel size)",
                      source, values.first, values.second, values.first));
    }
    if (values.first != values.second) differ(key, values.first, values.second);
  }
  const bool their_tie = !theirs.untie_embeddings_and_output_weights,
             our_tie = !ours.untie_embeddings_and_output_weights;
  if (their_tie != our_tie) differ("tie_word_embeddings", their_tie, our_tie);
  if (!nearly_equal(theirs.rotary_base, ours.rotary_base)) differ("rope_theta", theirs.rotary_base, ours.rotary_base);
  if (!nearly_equal(theirs.norm_epsilon, ours.norm_epsilon))
    differ("rms_norm_eps", theirs.norm_epsilon, ours.norm_epsilon);
  const bool same_scaling =
      theirs.use_rope_scaling == ours.use_rope_scaling &&
      (!ours.use_rope_scaling ||
       (nearly_equal(theirs.rope_scaling_factor, ours.rope_scaling_factor) &&
        nearly_equal(theirs.rope_scaling_low_freq_factor, ours.rope_scaling_low_freq_factor) &&
        nearly_equal(theirs.rope_scaling_high_freq_factor, ours.rope_scaling_high_freq_factor) &&
        theirs.rope_scaling_original_max_position_embeddings == ours.rope_scaling_original_max_position_embeddings));
  if (!same_scaling) differ("rope_scaling", rope_scaling_text(theirs), rope_scaling_text(ours));
  if (!ours.multi_latent_attention) return;
  const std::pair<const char*, std::pair<int64_t, int64_t>> latent[] = {
      {"q_lora_rank", {theirs.q_lora_rank, ours.q_lora_rank}},
      {"kv_lora_rank", {theirs.kv_lora_rank, ours.kv_lora_rank}},
      {"qk_nope_head_dim", {theirs.qk_head_dim, ours.qk_head_dim}},
      {"qk_rope_head_dim", {theirs.qk_pos_emb_head_dim, ours.qk_pos_emb_head_dim}},
      {"v_head_dim", {theirs.v_head_dim, ours.v_head_dim}},
      {"num_nextn_predict_layers", {theirs.mtp_num_layers, ours.mtp_num_layers}},
      {"rope_scaling.original_max_position_embeddings",
       {theirs.yarn ? theirs.original_max_position_embeddings : 0, ours.yarn ? ours.original_max_position_embeddings : 0}},
  };
  for (const auto& [key, values] : latent) {
    if (values.first != values.second) differ(key, values.first, values.second);
  }
  if (theirs.yarn != ours.yarn) differ("rope_scaling (yarn)", theirs.yarn, ours.yarn);
  const std::pair<const char*, std::pair<double, double>> yarn[] = {
      {"rope_scaling.factor", {theirs.rotary_scaling_factor, ours.rotary_scaling_factor}},
      {"rope_scaling.beta_fast", {theirs.beta_fast, ours.beta_fast}},
      {"rope_scaling.beta_slow", {theirs.beta_slow, ours.beta_slow}},
      {"rope_scaling.mscale", {theirs.mscale, ours.mscale}},
      {"rope_scaling.mscale_all_dim", {theirs.mscale_all_dim, ours.mscale_all_dim}},
  };
  for (const auto& [key, values] : yarn) {
    if (ours.yarn && !nearly_equal(values.first, values.second)) differ(key, values.first, values.second);
  }
}

ModelArgs read_hf_config(const std::string& path) {
  std::string text;
  try {
    text = read_file(path, FileKinds::kRegularOnly);
  } catch (const RuntimeError& e) {
    throw UsageError(e.what());
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw UsageError(fmt::format("{}: not valid JSON at byte {}: {}", path, e.byte, e.what()));
  }
  return model_args_from_hf_config(j, path);
}

void write_hf_config(const std::string& path, const ModelArgs& m, const std::string& torch_dtype) {
  write_file_atomic(path, hf_config_from_model(m, torch_dtype).dump(2) + "\n");
}

}  // namespace primus
