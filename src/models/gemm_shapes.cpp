#include "models/gemm_shapes.h"

#include <algorithm>

namespace primus {

namespace {

// Multi-head latent attention's projections (layers/mla.h; DeepSeek-V2's names): the query full-rank or through its
// low rank, the joint key/value compression with the shared RoPE key, its up-projection to every head's key and value.
std::vector<GemmShape> latent_attention_gemms(const ModelArgs& a) {
  const int64_t c = a.hidden_size, h = a.num_attention_heads, qk = a.qk_head_dim + a.qk_pos_emb_head_dim;
  std::vector<GemmShape> gemms;
  if (a.q_lora_rank > 0) {
    gemms.push_back({"q_a_proj", c, a.q_lora_rank});
    gemms.push_back({"q_b_proj", a.q_lora_rank, h * qk});
  } else {
    gemms.push_back({"q_proj", c, h * qk});
  }
  gemms.push_back({"kv_a_proj_with_mqa", c, a.kv_lora_rank + a.qk_pos_emb_head_dim});
  gemms.push_back({"kv_b_proj", a.kv_lora_rank, h * (a.qk_head_dim + a.v_head_dim)});
  gemms.push_back({"o_proj", h * a.v_head_dim, c});
  return gemms;
}

}  // namespace

std::vector<GemmShape> layer_gemms(const ModelArgs& a, int64_t ep, bool moe) {
  const int64_t c = a.hidden_size, d = a.kv_channels;
  std::vector<GemmShape> gemms = a.multi_latent_attention ? latent_attention_gemms(a)
                                                          : std::vector<GemmShape>{
                                                                {"q_proj", c, a.num_attention_heads * d},
                                                                {"k_proj", c, a.num_query_groups * d},
                                                                {"v_proj", c, a.num_query_groups * d},
                                                                {"o_proj", a.num_attention_heads * d, c},
                                                            };
  if (!moe) {
    // gate_proj and up_proj run as one GEMM (layers/attention.h: SwiGluMlp).
    gemms.push_back({"gate_up_proj", c, 2 * a.ffn_hidden_size});
    gemms.push_back({"down_proj", a.ffn_hidden_size, c});
    return gemms;
  }
  const int64_t local_experts = a.num_experts / std::max<int64_t>(1, ep), f = a.moe_ffn_hidden_size;
  gemms.push_back({"router", c, a.num_experts});
  gemms.push_back({"experts.gate_up", c, 2 * f, local_experts, a.moe_router_topk});
  gemms.push_back({"experts.down", f, c, local_experts, a.moe_router_topk});
  if (const int64_t s = a.moe_shared_expert_intermediate_size; s > 0) {
    gemms.push_back({"shared_experts.gate_up", c, 2 * s});
    gemms.push_back({"shared_experts.down", s, c});
  }
  return gemms;
}

GemmShape output_gemm(const ModelArgs& a) { return {"lm_head", a.hidden_size, a.vocab_size}; }

std::vector<GemmShape> mtp_gemms(const ModelArgs& a, int64_t ep) {
  std::vector<GemmShape> gemms{{"eh_proj", 2 * a.hidden_size, a.hidden_size}};
  for (GemmShape& g : layer_gemms(a, ep, a.is_mtp_moe_layer())) gemms.push_back(std::move(g));
  return gemms;
}

}  // namespace primus
