// Tiny model shapes for tests: a GQA Llama (optionally with Llama 3.1 rope scaling) and a Qwen3 with
// q/k norms, tied embeddings and a head_dim that differs from hidden/heads.
#pragma once

#include "config/experiment.h"

namespace primus::testing {

inline ModelArgs tiny_llama_args(bool rope_scaling = false) {
  ModelArgs a;
  a.num_layers = 2;
  a.hidden_size = 32;
  a.ffn_hidden_size = 48;
  a.num_attention_heads = 4;
  a.num_query_groups = 2;
  a.kv_channels = 8;
  a.vocab_size = 50;
  a.max_position_embeddings = 64;
  a.rotary_base = 10000.0;
  a.untie_embeddings_and_output_weights = true;
  a.use_rope_scaling = rope_scaling;
  a.rope_scaling_original_max_position_embeddings = 16;
  return a;
}

inline ModelArgs tiny_qwen3_args() {
  ModelArgs a;
  a.num_layers = 2;
  a.hidden_size = 24;
  a.ffn_hidden_size = 40;
  a.num_attention_heads = 4;
  a.num_query_groups = 2;
  a.kv_channels = 10;
  a.vocab_size = 40;
  a.max_position_embeddings = 64;
  a.rotary_base = 1000000.0;
  a.norm_epsilon = 1e-6;
  a.qk_layernorm = true;
  a.untie_embeddings_and_output_weights = false;
  return a;
}

}  // namespace primus::testing
