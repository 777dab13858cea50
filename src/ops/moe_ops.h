// Mixture-of-experts op entry points (backend/backend.h, MoeRouting ... MoeAuxLossArgs, has the math): the router,
// the sort of routing entries into expert order, token permutation and un-permutation, the per-expert grouped GEMM
// and the load-balancing losses. Shapes, dtypes and devices are checked here with messages naming the op. A layer runs them in this order:
//   moe_router_forward → (moe_capacity) → moe_sort → moe_permute → grouped_linear_forward ... → moe_unpermute
// and backward the other way round. The per-expert counts stay on the device as offsets: no host sync in a step.
// Dtypes: the router, sort and losses are f32 throughout; the token rows of moe_permute and moe_unpermute (x, out,
// y, dout, dx, dy) are the activation dtype, f32 or bf16 on cuda, with weights and dweights f32.
#pragma once

#include "backend/backend.h"

namespace primus::ops {

// logits [N, E] → scores [N, E], topk_experts [N, k] i32 (best first), topk_weights [N, k]. expert_bias [E] or
// undefined: added to the scores for the selection only.
void moe_router_forward(const Tensor& logits, const Tensor& expert_bias, const MoeRouting& routing, Tensor& scores,
                        Tensor& topk_experts, Tensor& topk_weights);
// dlogits [N, E] (overwritten) from dweights [N, k] and, when defined, a further gradient dscores [N, E] of the scores.
void moe_router_backward(const Tensor& scores, const Tensor& topk_experts, const MoeRouting& routing,
                         const Tensor& dweights, const Tensor& dscores, Tensor& dlogits);

// topk_experts [N, k] → slots [N·k] i32 (routing entries in expert order) and offsets [E + 1] i32.
void moe_sort(const Tensor& topk_experts, Tensor& slots, Tensor& offsets);

// Expert capacity: kept_experts [N, k] i32 = topk_experts with the entries past an expert's `capacity` replaced by
// `experts` (E: dropped), keeping the largest topk_weights [N, k] or (by_position) the earliest (MoeCapacityArgs).
void moe_capacity(const Tensor& topk_experts, const Tensor& topk_weights, int64_t experts, int64_t capacity,
                  bool by_position, Tensor& kept_experts);
// The expert capacity Megatron gives `tokens` tokens routed to top-k of `experts`: ceil(tokens·k / E × factor).
int64_t moe_expert_capacity(int64_t tokens, int64_t topk, int64_t experts, double factor);

// Padding to capacity (MoePadArgs): rows [M, C] of L experts at offsets [L + 1] i32 → padded [L·P, C], each expert's
// rows then zero rows up to P (pad), and back (unpad: rows [M, C] overwritten). Each is the other's gradient.
void moe_pad_rows(const Tensor& rows, const Tensor& offsets, int64_t per_expert, Tensor& padded);
void moe_unpad_rows(const Tensor& padded, const Tensor& offsets, int64_t per_expert, Tensor& rows);

// out [N·k, C] = the token row of each slot; backward dx [N, C] (overwritten) sums its rows' gradients.
void moe_permute(const Tensor& x, const Tensor& slots, int64_t topk, Tensor& out);
void moe_permute_backward(const Tensor& dout, const Tensor& slots, int64_t topk, Tensor& dx);
// out [N, C] = Σ_j weights[t, j] · y[row of entry t·k + j]; backward dy [N·k, C] and dweights [N, k] (overwritten).
void moe_unpermute(const Tensor& y, const Tensor& slots, const Tensor& weights, Tensor& out);
void moe_unpermute_backward(const Tensor& y, const Tensor& slots, const Tensor& weights, const Tensor& dout, Tensor& dy,
                            Tensor& dweights);

// y [M, out] = per expert e, rows [offsets[e], offsets[e+1]) of x [M, in] times w[e]ᵀ (w [E, out, in]). x, w, y,
// dy and dx are f32 or bf16 (one dtype; bf16 products summed in fp32), dw is f32.
void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y);
// dx [M, in] (overwritten) and dw [E, out, in] (accumulated); either may be undefined (skipped).
void grouped_linear_backward(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& dy, Tensor& dx,
                             Tensor& dw);

// Aux loss of scores [N, E] and offsets [E + 1] into loss [1]; dscores [N, E] (overwritten, may be undefined) =
// grad_scale × its gradient. sigmoid_scores: the scores are normalised per row first.
void moe_aux_loss(const Tensor& scores, const Tensor& offsets, int64_t topk, float coeff, bool sigmoid_scores,
                  float grad_scale, Tensor& loss, Tensor& dscores);
// The sequence-level aux loss (DeepSeek-V2/V3, Megatron's seq_aux_loss) of `sequences` equal sequences whose tokens
// are consecutive rows of scores [N, E] and topk_experts [N, k] (the router's choices): the aux loss of each sequence
// alone (its own counts and N / sequences tokens) averaged over the sequences, into loss [1]; dscores [N, E]
// (overwritten, may be undefined) = grad_scale × its gradient. Composed of moe_sort and moe_aux_loss per sequence.
void moe_seq_aux_loss(const Tensor& scores, const Tensor& topk_experts, int64_t sequences, float coeff,
                      bool sigmoid_scores, float grad_scale, Tensor& loss, Tensor& dscores);
// z-loss of logits [N, E] into loss [1]; dlogits [N, E] += grad_scale × its gradient (skipped when undefined).
void moe_z_loss(const Tensor& logits, float coeff, float grad_scale, Tensor& loss, Tensor& dlogits);

}  // namespace primus::ops
