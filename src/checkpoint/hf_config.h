// Hugging Face config.json <-> ModelArgs for the dense decoder families we train: Llama (1/2/3/3.1 with
// "llama3" rope scaling) and Qwen3 (Llama plus RMSNorm on q and k, chosen when ModelArgs::qk_layernorm).
// Export writes the keys transformers reads for LlamaForCausalLM / Qwen3ForCausalLM; import accepts exactly
// what our model can reproduce and rejects the rest (biases, other activations, other rope types) with a
// UsageError naming the field and the file, instead of silently training a different model.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "config/experiment.h"

namespace primus {

// `m` must be resolved (layers, hidden, ffn, heads, vocab and max positions all positive).
// torch_dtype: "float32", "bfloat16" or "float16" — the dtype of the weights written beside it.
nlohmann::json hf_config_from_model(const ModelArgs& m, const std::string& torch_dtype = "float32");

// `source_name` (usually the config.json path) prefixes every error message and becomes ModelArgs::preset.
// Keys transformers gives defaults to may be absent and get the same defaults here; the shape keys
// (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size) are required.
ModelArgs model_args_from_hf_config(const nlohmann::json& j, const std::string& source_name);

// Throws UsageError when `theirs` (read from `source`, a config.json) describes another model than `ours`: the
// family (model_type), every shape key, vocab_size, tie_word_embeddings, rope_theta, rms_norm_eps and the rope
// scaling. Floats agree within a relative 1e-6 (a value printed with fewer digits). The message names `source`, the
// config.json key and both values. Not compared: max_position_embeddings (how far a caller needs it depends on the
// run's sequences) and initializer_range (it only seeds weights that are being replaced).
void require_same_model(const ModelArgs& theirs, const ModelArgs& ours, const std::string& source);

// File helpers: read + parse (UsageError for a missing or unparsable file: the user named it) and an atomic
// pretty-printed write.
ModelArgs read_hf_config(const std::string& path);
void write_hf_config(const std::string& path, const ModelArgs& m, const std::string& torch_dtype = "float32");

}  // namespace primus
