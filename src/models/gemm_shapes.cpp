#include "models/gemm_shapes.h"

#include <algorithm>

namespace primus {

std::vector<GemmShape> layer_gemms(const ModelArgs& a, int64_t ep, bool moe) {
  const int64_t c = a.hidden_size, d = a.kv_channels;
  std::vector<GemmShape> gemms = {
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

}  // namespace primus
