// Multi-head latent attention (DeepSeek-V2/V3; docs/mla.md). Per token x [C]:
//   q      = q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x)))              [H, Dn + Dr]  (Dn: no RoPE, Dr: RoPE)
//   (c, r) = kv_a_proj_with_mqa(x)                                           [R], [Dr]
//   (k_nope, v) = kv_b_proj(kv_a_layernorm(c))                               [H, Dn], [H, Dv]
//   k      = (k_nope, rope(r)) per head: the RoPE key is one, shared by the heads
//   q      = (q_nope, rope(q_pe)) · m²                                       m² = 1, or YaRN's mscale_all_dim factor
//   o_proj(causal attention(q, k, v) with scale 1/sqrt(Dn + Dr))             [C]
// RoPE rotates adjacent feature pairs: DeepSeek's checkpoints keep the RoPE features interleaved and Hugging Face
// de-interleaves them before its rotate-half; rotating them in place gives the same scores (q · k sums over both in the
// same order), so weights load and save as they are. YaRN's m² multiplies the queries after RoPE (the same scores as
// multiplying the softmax scale). Not split over tensor- or context-parallel ranks.
#pragma once

#include <memory>

#include "layers/attention.h"

namespace primus {

// What one micro-batch's forward keeps for its backward.
struct MlaSaved {
  int64_t batch = 0;
  Tensor input;            // [N, C]
  RmsNormSaved q_a_norm;   // over [N, Rq] (q_lora_rank only)
  Tensor q_compressed;     // [N, Rq] q_b_proj's input (q_lora_rank only)
  RmsNormSaved kv_a_norm;  // over [N, R]
  Tensor kv_compressed;    // [N, R] kv_b_proj's input
  Tensor q, k;             // [B, T, H, Dn + Dr] as attention consumed them (RoPE applied, q scaled)
  Tensor v;                // [B, T, H, Dv]
  Tensor out;              // [B, T, H, Dv]
  Tensor lse;              // [B, H, T]
};

struct MlaAttention {
  std::unique_ptr<Linear> q_proj;              // [H·(Dn+Dr), C] without q_lora_rank, else null
  std::unique_ptr<Linear> q_a_proj;            // [Rq, C] with q_lora_rank, else null
  RmsNorm q_a_norm;                            // weight [Rq] (q_a_layernorm)
  std::unique_ptr<Linear> q_b_proj;            // [H·(Dn+Dr), Rq] with q_lora_rank, else null
  std::unique_ptr<Linear> kv_a_proj_with_mqa;  // [R + Dr, C]
  RmsNorm kv_a_norm;                           // weight [R] (kv_a_layernorm)
  std::unique_ptr<Linear> kv_b_proj;           // [H·(Dn+Dv), R]
  std::unique_ptr<Linear> o_proj;              // [C, H·Dv]
  int64_t heads = 0;
  int64_t nope_dim = 0;   // Dn (qk_head_dim)
  int64_t rope_dim = 0;   // Dr (qk_pos_emb_head_dim)
  int64_t v_dim = 0;      // Dv (v_head_dim)
  float query_scale = 1;  // YaRN's m² (yarn_softmax_scale_factor), else 1

  // x [B·T, C] -> [B·T, C]; rope [T, Dr/2] (or with packed.position_ids rows covering the positions), packed as
  // Attention's.
  Tensor forward(const Tensor& x, int64_t batch, const RopeTable& rope, const PackedSequence& packed, MlaSaved& saved);
  // -> dx [N, C]; releases `saved`.
  Tensor backward(const Tensor& dy, const RopeTable& rope, const PackedSequence& packed, MlaSaved& saved);
};

}  // namespace primus
