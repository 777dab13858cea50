// The GEMMs one rank runs for a layer and for the output layer: what `benchmark gemm` times and what `projection
// performance` costs, from one list so the two never disagree about which GEMMs a model has.
//
// A linear module maps `in` to `out` columns over the rows of the rank's tokens; each runs three GEMMs a step
// (forward y = x·wᵀ, data gradient dx = dy·w, weight gradient dw += dyᵀ·x), 2·rows·in·out FLOPs each. Routed experts
// run as one grouped GEMM over `experts` weight matrices whose rows are the tokens' routed copies (top-k of them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/experiment.h"

namespace primus {

struct GemmShape {
  std::string op;              // HF module name: "q_proj", "gate_up_proj", "experts.gate_up", "lm_head"
  int64_t in = 0;
  int64_t out = 0;
  int64_t experts = 0;         // a grouped GEMM over this many experts (this rank's share); 0: a plain GEMM
  int64_t rows_per_token = 1;  // rows per token: moe_router_topk for routed experts, else 1

  // FLOPs of one pass (forward, data or weight gradient) over `tokens` tokens.
  double pass_flops(int64_t tokens) const {
    return 2.0 * static_cast<double>(tokens * rows_per_token) * static_cast<double>(in) * static_cast<double>(out);
  }
};

// The GEMMs of one decoder layer on one rank, in the order the forward runs them. `rank_args` are the rank's shapes
// (tensor_parallel_shapes: its heads, MLP columns and vocabulary); `ep` ranks split the routed experts; `moe` picks
// a MoE layer (router, routed experts, the shared expert if any) over a dense SwiGLU MLP.
std::vector<GemmShape> layer_gemms(const ModelArgs& rank_args, int64_t ep, bool moe);
// The output layer (logits over the rank's vocabulary rows).
GemmShape output_gemm(const ModelArgs& rank_args);
// One multi-token prediction module's own GEMMs (ModelArgs::mtp_num_layers): eh_proj over the concatenated normed
// embedding and hidden state [2C -> C], then its layer's (of the last layer's kind); it runs output_gemm once more.
std::vector<GemmShape> mtp_gemms(const ModelArgs& rank_args, int64_t ep);

}  // namespace primus
