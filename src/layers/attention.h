// Self-attention block of Llama/Qwen3: q/k/v projections, optional per-head q/k RMSNorm (Qwen3),
// rotary embedding, causal grouped-query attention, output projection. With packed documents (PackedSequence)
// RoPE uses each token's position within its document and attention stays inside each document. With context
// parallelism (a ContextParallelGroup ring) the rows are this rank's chunks of the sequences and attention runs
// around the ring.
#pragma once

#include <memory>

#include "layers/basic_layers.h"
#include "layers/context_parallel.h"
#include "layers/linear.h"
#include "layers/rope_table.h"

namespace primus {

struct AttentionShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // key/value heads (groups)
  int64_t head_dim = 0;
};

// Per-token inputs for documents packed into one sequence (Megatron's reset_position_ids and
// reset_attention_mask), on the model's device. An undefined tensor means the plain case.
struct PackedSequence {
  Tensor position_ids;   // [B, T] i32: RoPE position of each token (row of the rope table); undefined: t
  Tensor segment_start;  // [B, T] i32: token t attends to keys [segment_start, t]; undefined: [0, t]
  bool packed() const { return position_ids.defined() || segment_start.defined(); }
};

// What one micro-batch's forward keeps for its backward.
struct AttentionSaved {
  AttentionShape shape;  // of the forward
  Tensor input;          // [N, C]; undefined after forward when what q/k/v_proj keep of it stands in for it (fp8)
  // What q/k/v_proj keep of `input` and o_proj of `out` (linear.h).
  LinearSaved qkv_input, o_input;
  Tensor q, k, v;        // [B, T, H, D] after norm and RoPE (what attention consumed)
  Tensor out;            // [B, T, Hq, D]
  Tensor lse;            // [B, Hq, T]
  RmsNormSaved q_norm;   // over [N*Hq, D] (qk_layernorm only)
  RmsNormSaved k_norm;   // over [N*Hkv, D]
};

// The projections are modules (owned here, replaceable from outside: Model::for_each_linear); the rest of the
// state is the fixed shape of the heads. Per-micro-batch state lives in AttentionSaved only.
struct Attention {
  std::unique_ptr<Linear> q_proj;  // [Hq*D, C]
  std::unique_ptr<Linear> k_proj;  // [Hkv*D, C]
  std::unique_ptr<Linear> v_proj;  // [Hkv*D, C]
  std::unique_ptr<Linear> o_proj;  // [C, Hq*D]
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // key/value heads (groups)
  int64_t head_dim = 0;
  bool qk_norm = false;
  RmsNorm q_norm;  // weight [D]
  RmsNorm k_norm;  // weight [D]

  // x [B·T, C] (`batch` rows of T tokens) -> [B·T, C]. rope: [T, D/2], or with packed.position_ids any rows that
  // cover the positions. ring (optional): the rows are this rank's chunks, chunk-major (`batch` = 2 × the sequences,
  // T the chunk length; context_parallel.h), packed.position_ids their positions, and attention is the ring's.
  Tensor forward(const Tensor& x, int64_t batch, const RopeTable& rope, const PackedSequence& packed,
                 AttentionSaved& saved, const ContextParallelGroup* ring = nullptr);
  // -> dx [N, C]; rope, packed and ring as in forward. Releases `saved`.
  Tensor backward(const Tensor& dy, const RopeTable& rope, const PackedSequence& packed, AttentionSaved& saved,
                  const ContextParallelGroup* ring = nullptr);
};

struct MlpSaved {
  Tensor input;    // [N, C]; undefined after forward when what gate_up_proj keeps of it stands in for it (fp8)
  Tensor gate_up;  // [N, 2F] per row the gate then the up projection
  Tensor act;      // [N, F] silu(gate) * up (dropped after forward when recompute_act, or when down_proj's codes do)
  LinearSaved gate_up_input, down_input;  // what the two projections keep of `input` and `act`
};

// SwiGLU MLP: down(silu(gate(x)) * up(x)). gate_proj and up_proj are adjacent in the flat parameter and
// gradient buffers, so one [2F, C] module over both makes the two projections one GEMM (and one each backward).
struct SwiGluMlp {
  std::unique_ptr<Linear> gate_up_proj;  // [2F, C]: gate_proj.weight then up_proj.weight
  std::unique_ptr<Linear> down_proj;     // [C, F]
  bool recompute_act = false;  // selective recompute: keep gate and up only, recompute the product in backward

  Tensor forward(const Tensor& x, MlpSaved& saved);    // x [N, C] -> [N, C]
  Tensor backward(const Tensor& dy, MlpSaved& saved);  // -> dx [N, C]; releases `saved`
};

}  // namespace primus
