// The backend seam: one virtual entry per op family, with typed argument structs.
// The CPU backend is the numerical spec; device backends (CUDA now, HIP later) override entries.
// An entry a backend does not implement throws naming the op and the backend.
//
// Conventions: row-major, contiguous tensors; shapes are written next to each field.
// "accumulate" outputs are added to (gradients); all others are overwritten.
//
// Dtypes. The CPU backend is fp32 only (cast aside). The CUDA backend also runs mixed precision: activations
// ("act" below: f32, or bf16 on CUDA) and the compute copy of the weights in bf16, math in fp32 inside every
// kernel; per-row statistics (rstd, lse, losses), parameter gradients (dw, dweight, dtable), master weights and
// optimizer state always fp32. Each field names its dtype where it is not "act".
#pragma once

#include <memory>
#include <string>

#include "core/fp8.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace primus {

// C = alpha * op(A) · op(B) + beta * C, op(X) = X or Xᵀ. A: [M,K] (or [K,M] if trans_a), B: [K,N] (or [N,K]).
// A and B share one dtype (act); C has that dtype or f32 (bf16 A·B into an f32 C: weight gradients accumulated
// into the fp32 gradient buffer, fp32 logits). Products are accumulated in fp32.
struct GemmArgs {
  const Tensor* a = nullptr;
  const Tensor* b = nullptr;
  Tensor* c = nullptr;  // [M, N]
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// The rows of a vocabulary one tensor-parallel rank holds (Megatron's VocabParallelEmbedding and
// vocab_parallel_cross_entropy): rows [begin, begin + Vl) of `total`, where Vl is the local table's rows or the
// local logits' columns. total 0 means unsharded: the local rows are the whole vocabulary. src/ops checks
// 0 ≤ begin, begin + Vl ≤ total; kernels check every id and target against total.
struct VocabShard {
  int64_t begin = 0;
  int64_t total = 0;  // 0: the local rows, unsharded
};

// `shard` with total 0 spelt out for a local vocabulary of `rows`.
inline VocabShard resolve_shard(VocabShard shard, int64_t rows) {
  return shard.total == 0 ? VocabShard{0, rows} : shard;
}

// Ids must lie in [0, shard.total) (a backend reports others). An id in [begin, begin + V) reads (forward) or
// accumulates into (backward) table row id − begin; any other id gives a zero output row and no gradient.
struct EmbeddingArgs {
  const Tensor* ids = nullptr;    // [N] i32
  const Tensor* table = nullptr;  // [V, C]  (forward) this shard's rows
  Tensor* out = nullptr;          // [N, C]  (forward)
  const Tensor* dout = nullptr;   // [N, C]  (backward)
  Tensor* dtable = nullptr;       // [V, C]  (backward, accumulate) f32
  VocabShard shard;
};

struct RmsNormArgs {
  const Tensor* x = nullptr;       // [N, C]
  const Tensor* weight = nullptr;  // [C]
  float eps = 1e-5f;
  Tensor* y = nullptr;             // [N, C]  (forward)
  Tensor* rstd = nullptr;          // [N] f32 (forward writes, backward reads) 1/sqrt(mean(x²)+eps)
  const Tensor* dy = nullptr;      // [N, C]  (backward)
  Tensor* dx = nullptr;            // [N, C]  (backward)
  Tensor* dweight = nullptr;       // [C]     (backward, accumulate) f32
};

// Rotary embedding in the Hugging Face "rotate half" layout: pair (i, i + D/2) rotates by angle[p, i], where the
// table row p of token (b, t) is t, or positions[b, t] when given (packed documents whose positions restart at
// each document, Megatron's reset_position_ids). Applied in place. backward applies the inverse rotation to the
// incoming gradient.
struct RopeArgs {
  Tensor* x = nullptr;                // [B, T, H, D]
  const Tensor* cos = nullptr;        // [T, D/2] f32, or [P, D/2] with positions
  const Tensor* sin = nullptr;        // [T, D/2] f32, or [P, D/2] with positions
  const Tensor* positions = nullptr;  // [B, T] i32, optional; every value in [0, P) (a backend reports others)
  // false: Hugging Face's "rotate half" pairs (x[i], x[i + D/2]); true: adjacent pairs (x[2i], x[2i + 1]), both by
  // angle i. DeepSeek's checkpoints keep their RoPE features interleaved (HF de-interleaves them before rotating):
  // rotating adjacent pairs gives the same features in the checkpoint's order, and the same q · k.
  bool interleaved = false;
};

// Per-head vectors joined along the feature dimension, and split again (multi-head latent attention assembles its
// queries and keys from a part without RoPE and a RoPE part, and splits the kv up-projection into keys and values):
//   forward:  out[n, h, :] = (a[n, h, :], b[n, g(h), :]), g(h) = h, or 0 when b has one head shared by every head
//   backward: da[n, h, :] = dout[n, h, :Da]; db[n, g, :] = Σ over the heads h with g(h) = g of dout[n, h, Da:]
// (in head order), both overwritten.
struct HeadConcatArgs {
  const Tensor* a = nullptr;     // [N, H, Da]      act (forward)
  const Tensor* b = nullptr;     // [N, Hb, Db]     act (forward), Hb = H or 1
  Tensor* out = nullptr;         // [N, H, Da + Db] act (forward)
  const Tensor* dout = nullptr;  // [N, H, Da + Db] act (backward)
  Tensor* da = nullptr;          // [N, H, Da]      act (backward)
  Tensor* db = nullptr;          // [N, Hb, Db]     act (backward)
};

// Which keys of a key/value block a query of the query block (the same length T) attends to: causal, keys j ≤ t
// (positions counted within the blocks: the blocks are the same part of the sequence), or none, every key (the
// key/value block lies wholly before the queries: a block of ring attention, layers/context_parallel.h).
enum class AttentionMask { kCausal, kNone };

// Grouped-query attention of a query block against a key/value block of the same length, softmax scale
// 1/sqrt(D). Query head h reads kv head h / (Hq / Hkv). With the causal mask query t attends to keys j ≤ t, or with
// segment_start to keys segment_start[b, t] ≤ j ≤ t only (documents packed into one sequence attend within
// themselves, Megatron's reset_attention_mask); without a mask to every key (segment_start must then be null).
//
// Backward reads out and lse as given: with a block's own forward results it is that block's gradient; with the
// out and lse of the whole attention that the block is part of (merged over blocks, attention_merge) it gives the
// block's exact contributions to dq, dk and dv of the whole (p = exp(s − lse) is then the block's part of the
// whole softmax, and Δ = dout · out the whole's), which sum over the blocks to the whole's gradients.
// The value head size Dv may differ from D (multi-head latent attention): out, dout and dv then have Dv features a
// head.
struct AttentionArgs {
  const Tensor* q = nullptr;    // [B, T, Hq, D]
  const Tensor* k = nullptr;    // [B, T, Hkv, D]
  const Tensor* v = nullptr;    // [B, T, Hkv, Dv]
  Tensor* out = nullptr;        // [B, T, Hq, Dv]  (forward writes, backward reads)
  Tensor* lse = nullptr;        // [B, Hq, T] f32 log-sum-exp of scaled scores (forward writes, backward reads)
  const Tensor* dout = nullptr; // [B, T, Hq, Dv]  (backward)
  Tensor* dq = nullptr;         // [B, T, Hq, D]  (backward)
  Tensor* dk = nullptr;         // [B, T, Hkv, D] (backward)
  Tensor* dv = nullptr;         // [B, T, Hkv, Dv] (backward)
  const Tensor* segment_start = nullptr;  // [B, T] i32, optional; 0 ≤ segment_start[b, t] ≤ t (a backend reports others)
  AttentionMask mask = AttentionMask::kCausal;
};

// Merges the attention of the same queries over a further key/value block into a partial result (flash
// attention's and ring attention's rescaling), row by row (b, t, h):
//   lse' = log(exp(lse) + exp(block_lse)),   out' = exp(lse − lse') · out + exp(block_lse − lse') · block_out
// in place. A row whose lse and block_lse are both −inf (no key seen yet) keeps out and lse; −inf on one side
// takes the other's row. Math in fp32 (the exponent weights in double on the CPU).
struct AttentionMergeArgs {
  Tensor* out = nullptr;              // [B, T, Hq, D] act, updated
  Tensor* lse = nullptr;              // [B, Hq, T] f32, updated
  const Tensor* block_out = nullptr;  // [B, T, Hq, D] act
  const Tensor* block_lse = nullptr;  // [B, Hq, T] f32
};

// SwiGLU over a packed input: each row of gate_up is the gate (F values) then the up projection (F values),
// as one GEMM against the adjacent gate_proj and up_proj weights produces it. out = silu(gate) * up.
struct SwiGluArgs {
  const Tensor* gate_up = nullptr;  // [N, 2F]
  Tensor* out = nullptr;            // [N, F]   (forward)
  const Tensor* dout = nullptr;     // [N, F]   (backward)
  Tensor* dgate_up = nullptr;       // [N, 2F]  (backward; may alias gate_up)
};

// Softmax cross-entropy per row. Rows whose target is negative are ignored (loss 0, gradient 0).
//
// Vocabulary-parallel (Megatron's vocab_parallel_cross_entropy): a rank holds the logits of columns
// [shard.begin, shard.begin + V) of a vocabulary of shard.total, and the loss layer reduces per-row statistics over
// its group between the steps
//   row_max (local max) → group max → cross_entropy_shard_stats (local Σ exp, target logit) → group sums
//   → cross_entropy_finish (lse, losses) → cross_entropy_backward with the shard (this rank's dlogits columns).
// Targets must lie below shard.total (a backend reports others); only the rank holding a target's column adds
// its one-hot term and its logit.
struct CrossEntropyArgs {
  const Tensor* logits = nullptr;   // [N, V]
  const Tensor* targets = nullptr;  // [N] i32
  Tensor* losses = nullptr;         // [N] f32 (forward, finish) -log softmax(logits)[target]
  Tensor* lse = nullptr;            // [N] f32 (forward and finish write, backward reads)
  float grad_scale = 1.0f;          // (backward) dL/dloss_i for every counted row, e.g. 1/num_tokens
  Tensor* dlogits = nullptr;        // [N, V] (backward; may alias logits)
  VocabShard shard;                 // (backward, shard_stats) the columns logits holds
  const Tensor* max = nullptr;      // [N] f32 (shard_stats, finish) the row max over the whole vocabulary
  // [N] f32 each: shard_stats writes this shard's Σ exp(logit − max) and the target's logit (0 unless held here);
  // finish reads their sums over the group.
  Tensor* sum_exp = nullptr;
  Tensor* target_logit = nullptr;
};

// ---- Mixture of experts (Megatron's TopKRouter, token permutation and grouped GEMM) ----
// Routing tensors (logits, scores, weights, losses) are f32 everywhere, as Megatron keeps its router in mixed
// precision; the token rows that permutation moves (MoePermuteArgs's x, out, dout, dx, y, dy) are "act".

enum class MoeScoreFunction { kSoftmax, kSigmoid };

// How a router turns logits into each token's top-k experts and their weights:
//   scores   = softmax(logits) or sigmoid(logits)                          [N, E]
//   selected = the k experts of the largest scores + expert_bias (the bias only ranks; with num_groups > 1 only the
//              experts of the group_topk groups of the largest Σ of their topk / group_topk best biased scores)
//   weights  = scores[selected], divided by their sum when `normalize`, times scaling_factor
// Mixtral and Qwen3-MoE with norm_topk_prob (Megatron's softmax after top-k): softmax, normalize. Qwen3-MoE without
// it (Megatron's moe_router_pre_softmax): softmax, no normalize. DeepSeek-V3: sigmoid, normalize (Σ + 1e-20).
// Ties go to the lower expert index, so every backend selects the same experts.
struct MoeRouting {
  int64_t topk = 1;
  MoeScoreFunction score_function = MoeScoreFunction::kSoftmax;
  bool normalize = true;
  float scaling_factor = 1.0f;
  int64_t num_groups = 1;  // 1: no grouped selection
  int64_t group_topk = 1;
};

struct MoeRouterArgs {
  MoeRouting routing;
  const Tensor* logits = nullptr;       // [N, E]
  const Tensor* expert_bias = nullptr;  // [E], optional (selection only)
  Tensor* scores = nullptr;             // [N, E] (forward writes, backward reads)
  Tensor* topk_experts = nullptr;       // [N, k] i32 (forward writes, backward reads), best first
  Tensor* topk_weights = nullptr;       // [N, k] (forward)
  const Tensor* dweights = nullptr;     // [N, k] (backward)
  const Tensor* dscores = nullptr;      // [N, E] (backward, optional): a further gradient of the scores (aux loss)
  Tensor* dlogits = nullptr;            // [N, E] (backward, overwritten)
};

// The routing entries (token t's j-th choice is entry t·k + j) in expert order, tokens ascending within an expert:
// row s of the permuted tokens is entry slots[s]; expert e's rows are [offsets[e], offsets[e + 1]). The counts stay
// on the device as offsets, so a device never needs the host to size the experts' GEMMs.
struct MoeSortArgs {
  const Tensor* topk_experts = nullptr;  // [N, k] i32, each in [0, E) (a backend reports others)
  Tensor* slots = nullptr;               // [N·k] i32
  Tensor* offsets = nullptr;             // [E + 1] i32
};

// Permutation: out[s] = x[slots[s] / k]; backward: dx[t] = Σ over s with slots[s] / k = t of dout[s] (overwritten).
// Un-permutation: out[t] = Σ_j weights[t, j] · y[s(t, j)], s(t, j) the row holding entry t·k + j (overwritten);
// backward: dy[s] = weights[slot] · dout[t], dweights[slot] = y[s] · dout[t] (both overwritten).
struct MoePermuteArgs {
  int64_t topk = 1;
  const Tensor* slots = nullptr;    // [M = N·k] i32
  const Tensor* x = nullptr;        // [N, C]  (permute)
  Tensor* out = nullptr;            // [M, C] (permute) or [N, C] (unpermute)
  const Tensor* dout = nullptr;     // [M, C] (permute backward) or [N, C] (unpermute backward)
  Tensor* dx = nullptr;             // [N, C] (permute backward)
  const Tensor* y = nullptr;        // [M, C] (unpermute, its backward)
  const Tensor* weights = nullptr;  // [N, k] f32 (unpermute, its backward)
  Tensor* dy = nullptr;             // [M, C] (unpermute backward)
  Tensor* dweights = nullptr;       // [N, k] f32 (unpermute backward)
};

// Expert capacity (Megatron's moe_expert_capacity_factor): each expert keeps at most `capacity` of the routing
// entries that chose it, the others are dropped. By weight (drop policy probs): the entries of the largest
// topk_weights, ties to the earlier entry; by position: the earliest entries (token order). kept_experts is
// topk_experts with every dropped entry replaced by `experts` (E, a bucket past the last expert that moe_sort with
// offsets [E + 2] puts last and no expert computes).
struct MoeCapacityArgs {
  int64_t experts = 0;                   // E
  int64_t capacity = 0;                  // ≥ 0 entries per expert
  bool by_position = false;              // false: keep the largest weights
  const Tensor* topk_experts = nullptr;  // [N, k] i32 in [0, E)
  const Tensor* topk_weights = nullptr;  // [N, k] f32
  Tensor* kept_experts = nullptr;        // [N, k] i32 in [0, E] (overwritten)
};

// Padding to capacity (moe_pad_expert_input_to_capacity): local expert l's rows [offsets[l], offsets[l + 1]) of
// rows [M, C] are rows [l·P, l·P + n_l) of padded [L·P, C]. Pad: padded ← rows, the other rows of padded zero. Unpad:
// rows ← padded (the padding rows are not read). Every n_l must be ≤ P (a device reports one above at its next wait).
// offsets stay on the device: no host synchronisation. rows and padded are f32, or bf16 on a device.
struct MoePadArgs {
  int64_t per_expert = 0;            // P
  const Tensor* offsets = nullptr;   // [L + 1] i32, 0 = offsets[0] ≤ ... ≤ offsets[L] = M
  const Tensor* in = nullptr;        // pad: rows [M, C]; unpad: padded [L·P, C]
  Tensor* out = nullptr;             // pad: padded [L·P, C]; unpad: rows [M, C] (overwritten)
};

// One GEMM per expert over its rows: y[r] = x[r] · w[e]ᵀ for r in [offsets[e], offsets[e + 1]). Backward:
// dx[r] = dy[r] · w[e] (overwritten), dw[e] += dy[rows]ᵀ · x[rows] (accumulated). offsets as MoeSortArgs's.
struct GroupedLinearArgs {
  const Tensor* x = nullptr;        // [M, in]
  const Tensor* w = nullptr;        // [E, out, in]
  const Tensor* offsets = nullptr;  // [E + 1] i32, 0 = offsets[0] ≤ ... ≤ offsets[E] = M
  Tensor* y = nullptr;              // [M, out] (forward)
  const Tensor* dy = nullptr;       // [M, out] (backward)
  Tensor* dx = nullptr;             // [M, in]  (backward, optional)
  Tensor* dw = nullptr;             // [E, out, in] (backward, accumulate, optional)
};

// Megatron's load-balancing losses of one router over N tokens and E experts.
// Aux loss (switch_load_balancing_loss_func): coeff · E / (k · N²) · Σ_e count_e · Σ_t p[t, e], count_e the routing
// entries of expert e (offsets), p the scores (softmax), or each row's sigmoid scores over their sum (+1e-20).
// z-loss: coeff / N · Σ_t logsumexp(logits[t])².
// Each writes its value into loss[0] and grad_scale × its gradient: aux into dscores (overwritten), z into dlogits
// (accumulated).
struct MoeAuxLossArgs {
  int64_t topk = 1;
  float coeff = 0.0f;
  float grad_scale = 1.0f;
  bool sigmoid_scores = false;      // aux: p = scores / Σ_e scores per row
  const Tensor* scores = nullptr;   // [N, E] (aux)
  const Tensor* offsets = nullptr;  // [E + 1] i32 (aux)
  const Tensor* logits = nullptr;   // [N, E] (z)
  Tensor* loss = nullptr;           // [1]
  Tensor* dscores = nullptr;        // [N, E] (aux)
  Tensor* dlogits = nullptr;        // [N, E] (z)
};

// fp8 quantisation (core/fp8.h: the formats, the rounding and the scale rule; docs/fp8.md: the recipes). A tiling
// cuts a matrix [R, C] into tiles of rows × cols elements (0: the whole dimension), each with one scale; edge tiles
// are partial. Tensorwise scaling is {0, 0}; the blockwise recipe (DeepSeek-V3) uses {1, 128} for activations and
// gradients and {128, 128} for weights. A tile grid is [ceil(R / rows), ceil(C / cols)] (fp8_tile_grid in
// ops/fp8_ops.h). "transposed" tiles lie over xᵀ [C, R] instead: the copy the backward GEMMs read.
struct Fp8Tiling {
  int64_t rows = 0;  // 0: all rows
  int64_t cols = 0;  // 0: all columns
  bool whole_tensor() const { return rows == 0 && cols == 0; }  // one tile: tensorwise scaling
};

// amax[t] = max |x| over tile t (overwritten, or with accumulate max(amax[t], that)); NaN when the tile holds a NaN
// (never skipped), +inf for an infinity. x may be bf16 (the CUDA engine's activations): each element widened to f32
// exactly, so the result equals that of the same values in f32.
struct Fp8AmaxArgs {
  const Tensor* x = nullptr;  // [R, C] f32 or bf16
  Fp8Tiling tiling;
  bool transposed = false;    // tiles of xᵀ: amax is xᵀ's grid
  bool accumulate = false;    // max with amax's current values, a NaN in either kept (the delayed recipe's step max)
  Tensor* amax = nullptr;     // tile grid, f32
};

// Per tile: scale = fp8_scale_from_amax(amax, format's max_finite, margin) (core/fp8.h); scale_inv = 1 / scale. A
// zero or non-finite amax keeps the previous scale (keep_previous: the delayed recipe, as Transformer Engine) or
// gives 1 (current scaling); each non-finite amax is counted into non_finite for the caller to report.
struct Fp8ScaleOptions {
  int margin = 0;              // fp8_margin: scales divided by 2^margin
  bool power_of_two = false;   // scales rounded down to powers of two (exact scale_inv)
  bool keep_previous = false;  // fallback: scale's current value (true) or 1 (false)
};
struct Fp8ScaleArgs {
  const Tensor* amax = nullptr;  // [...] f32
  Fp8Format format = Fp8Format::kE4M3;
  Fp8ScaleOptions options;
  Tensor* scale = nullptr;       // [...] f32 like amax: read (keep_previous) and written
  Tensor* scale_inv = nullptr;   // [...] f32 (overwritten)
  Tensor* non_finite = nullptr;  // [1] i32 (accumulated): tiles whose amax was NaN or ±inf
};

// codes = fp8_encode(x · scale of its tile, format, saturating), the product rounded to f32 first; codes_t (optional)
// the same of xᵀ with scale_t over xᵀ's tiles. Dequantise: y = fp8_decode(code) · scale_inv of its tile.
struct Fp8QuantizeArgs {
  const Tensor* x = nullptr;        // [R, C] f32 or bf16 (widened exactly: the codes of the same values in f32)
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Tiling tiling;
  const Tensor* scale = nullptr;    // x's tile grid, f32
  Tensor* codes = nullptr;          // [R, C] u8 (overwritten)
  const Tensor* scale_t = nullptr;  // xᵀ's tile grid, f32 (with codes_t)
  Tensor* codes_t = nullptr;        // [C, R] u8 (overwritten), optional
};
struct Fp8DequantizeArgs {
  const Tensor* codes = nullptr;      // [R, C] u8
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Tiling tiling;
  const Tensor* scale_inv = nullptr;  // codes' tile grid, f32
  Tensor* y = nullptr;                // [R, C] f32 (overwritten)
};

// The fp8 GEMM: C [M, N] = A · Bᵀ, or C += A · Bᵀ with accumulate, where A = decode(a codes) · a_scale_inv of each
// element's tile and likewise B. A [M, K] and B [N, K] are both row-major with K contiguous: the one layout Hopper's
// fp8 tensor cores read (cuBLASLt's "TN"). The training GEMMs: forward y = x·Wᵀ (A = x, B = W); data gradient
// dx = dy·W (A = dy, B = the transposed copy Wᵀ [in, out]); weight gradient dW += dyᵀ·x (A = dyᵀ, B = xᵀ, both the
// transposed copies, f32 C, accumulate). Tilings (ops/fp8_ops.h checks them): tensorwise {0, 0} with tensorwise, or
// blockwise: A {1, 128}, B {128, 128} or {1, 128}. Products and sums in f32 or wider; C rounded once to its dtype.
struct Fp8GemmArgs {
  const Tensor* a = nullptr;            // [M, K] u8 codes
  Fp8Format a_format = Fp8Format::kE4M3;
  Fp8Tiling a_tiling;
  const Tensor* a_scale_inv = nullptr;  // a's tile grid, f32
  const Tensor* b = nullptr;            // [N, K] u8 codes
  Fp8Format b_format = Fp8Format::kE4M3;
  Fp8Tiling b_tiling;
  const Tensor* b_scale_inv = nullptr;  // b's tile grid, f32
  Tensor* c = nullptr;                  // [M, N] f32 or bf16
  bool accumulate = false;              // C += A·Bᵀ (C read, the sum rounded once)
  // Tensorwise only, a device speed option: Hopper's fp8 MMA then keeps its partial sums in its own narrower
  // accumulator instead of promoting them to f32 every few K steps (Transformer Engine uses it for the forward GEMM).
  // The CPU reference is exact either way; block scaling refuses it (cuBLASLt has no such kernel).
  bool fast_accumulation = false;
};

// Decoupled-weight-decay Adam (Loshchilov & Hutter), one step, in place, with bias correction. Folding the clip
// factor and the bf16 copy in saves two passes over the parameters per step.
struct AdamWArgs {
  Tensor* param = nullptr;        // [n] f32 master weights
  const Tensor* grad = nullptr;   // [n] f32
  Tensor* exp_avg = nullptr;      // [n] f32 first moment
  Tensor* exp_avg_sq = nullptr;   // [n] f32 second moment
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;               // 1-based step count for bias correction
  float grad_scale = 1.0f;        // g = grad · grad_scale before the update (gradient clipping's factor)
  Tensor* compute_copy = nullptr; // [n] bf16, optional: receives the updated param rounded (the compute weights)
};

// A point in a device's queue of work, for timing (profiles, per-phase step times). The host backend runs ops
// as they are called, so its marks are host clock readings; a GPU's are events on its stream.
class DeviceMark {
 public:
  virtual ~DeviceMark() = default;
};

// A queue of device work, in order. The null handle is the backend's compute stream (the one every op runs
// on); a device backend hands out a communication stream beside it (Backend::stream). On the host backend
// work runs when it is called, so a stream is only a name.
struct Stream {
  void* handle = nullptr;  // cudaStream_t on CUDA (hipStream_t on HIP); null: the compute stream
};
enum class StreamKind { kCompute, kComm };

// A point in a stream's queue that another stream (or the host) can wait for.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;

  virtual void gemm(const GemmArgs& args);
  virtual void embedding_forward(const EmbeddingArgs& args);
  virtual void embedding_backward(const EmbeddingArgs& args);
  virtual void rmsnorm_forward(const RmsNormArgs& args);
  virtual void rmsnorm_backward(const RmsNormArgs& args);
  virtual void rope_forward(const RopeArgs& args);
  virtual void rope_backward(const RopeArgs& args);
  virtual void attention_forward(const AttentionArgs& args);
  virtual void attention_backward(const AttentionArgs& args);
  virtual void attention_merge(const AttentionMergeArgs& args);
  virtual void head_concat(const HeadConcatArgs& args);
  virtual void head_concat_backward(const HeadConcatArgs& args);
  virtual void swiglu_forward(const SwiGluArgs& args);
  virtual void swiglu_backward(const SwiGluArgs& args);
  virtual void cross_entropy_forward(const CrossEntropyArgs& args);
  virtual void cross_entropy_backward(const CrossEntropyArgs& args);
  // Both at once (every field of args): the forward, then the backward. A device may fuse them into one pass.
  virtual void cross_entropy_forward_backward(const CrossEntropyArgs& args);
  // The vocabulary-parallel steps (CrossEntropyArgs). shard_stats reads logits, targets, shard and max and writes
  // sum_exp (for every row, ignored or not: lse stays defined as in cross_entropy_forward) and target_logit (0 for
  // a target outside the shard or negative); finish reads max, sum_exp, target_logit and targets and writes
  // lse = max + log(sum_exp) and losses = lse − target_logit (0 for a negative target).
  virtual void cross_entropy_shard_stats(const CrossEntropyArgs& args);
  virtual void cross_entropy_finish(const CrossEntropyArgs& args);
  // max[r] = max over the row x[r, :] (x [N, C] act, C ≥ 1; max [N] f32).
  virtual void row_max(const Tensor& x, Tensor& max);
  virtual void adamw_step(const AdamWArgs& args);
  virtual void fp8_amax(const Fp8AmaxArgs& args);
  virtual void fp8_scale(const Fp8ScaleArgs& args);
  virtual void fp8_quantize(const Fp8QuantizeArgs& args);
  virtual void fp8_dequantize(const Fp8DequantizeArgs& args);
  virtual void fp8_gemm(const Fp8GemmArgs& args);
  // Mixture of experts (MoeRouterArgs ... MoeAuxLossArgs above).
  virtual void moe_router_forward(const MoeRouterArgs& args);
  virtual void moe_router_backward(const MoeRouterArgs& args);
  virtual void moe_sort(const MoeSortArgs& args);
  virtual void moe_capacity(const MoeCapacityArgs& args);
  virtual void moe_pad_rows(const MoePadArgs& args);
  virtual void moe_unpad_rows(const MoePadArgs& args);
  virtual void moe_permute(const MoePermuteArgs& args);
  virtual void moe_permute_backward(const MoePermuteArgs& args);
  virtual void moe_unpermute(const MoePermuteArgs& args);
  virtual void moe_unpermute_backward(const MoePermuteArgs& args);
  virtual void grouped_linear_forward(const GroupedLinearArgs& args);
  virtual void grouped_linear_backward(const GroupedLinearArgs& args);
  virtual void moe_aux_loss(const MoeAuxLossArgs& args);
  virtual void moe_z_loss(const MoeAuxLossArgs& args);
  // y += x (same shape, same dtype: act)
  virtual void add_inplace(Tensor& y, const Tensor& x);
  // x *= s (f32)
  virtual void scale_inplace(Tensor& x, float s);
  // Σ x² (f32) accumulated in double, in an order that does not depend on thread scheduling.
  virtual double sum_squares(const Tensor& x);
  // acc[0] += Σ x (acc [1] f32, x f32), Σ in double in a fixed order; queued like any op, so a device can sum
  // losses over micro-batches without waiting for the host.
  virtual void sum_into(Tensor& acc, const Tensor& x);

  // Memory entries. The backend of a device also copies between that device and the host.
  // dst ← src, same dtype and element count; each lives on this backend's device or on the host. Returns
  // once a host dst holds the data; other copies are ordered with this backend's later work.
  virtual void copy(Tensor& dst, const Tensor& src);
  // dst ← src converted, f32 <-> bf16 (or the same dtype: a copy), same element count, both on this backend's
  // device. Narrowing rounds to nearest even as core/bf16.h does, so every backend gives the same bits.
  virtual void cast(Tensor& dst, const Tensor& src);
  // Every element of an f32 tensor set to value (poisoning outputs in tests, resetting buffers).
  virtual void fill(Tensor& x, float value);
  // f32 x[k] = float(normal_at(seed, k) · std) (core/rng.h): random initialisation drawn where x lives.
  virtual void fill_normal(Tensor& x, uint64_t seed, double std, StreamIndex index);
  // Every byte set to 0, any dtype (gradient buffers before accumulation).
  virtual void zero(Tensor& x);
  // Waits for all queued work of this backend; throws errors its kernels found in the data (bad ids).
  virtual void synchronize();

  // Streams and events (parallel/ overlaps communication with compute through them). record_event marks the
  // work queued on `stream` so far; wait_event makes later work on `stream` wait for that mark (the host
  // does not wait); wait_host blocks the host until the mark is reached. The host backend runs everything at
  // once, so its events are always reached.
  virtual Stream stream(StreamKind kind);
  virtual std::unique_ptr<DeviceEvent> record_event(Stream stream);
  virtual void wait_event(Stream stream, const DeviceEvent& event);
  virtual void wait_host(const DeviceEvent& event);
  // Tells the allocator that `t`'s memory is in use by work queued on `stream` (not the compute stream):
  // when `t` is freed, its block is not handed out again before that work is done (PyTorch's record_stream).
  // A no-op where memory is not reused asynchronously (the host).
  virtual void record_stream(const Tensor& t, Stream stream);
  // Page-locks host memory so that copies between it and the device run at the bus's full speed, without the
  // driver staging them (the snapshot of an asynchronous checkpoint save); unpin_host undoes it before the memory
  // is freed. No-ops on the host backend.
  virtual void pin_host(void* ptr, size_t bytes);
  // Deterministic mode (Megatron's deterministic_mode): every later op gives the same bits for the same inputs, run
  // after run, at some cost in speed (a device backend drops algorithms that sum with atomics). The host backend
  // always is.
  virtual void set_deterministic(bool deterministic);
  virtual void unpin_host(void* ptr);

  // Timing and profiling. mark() queues a timestamp without waiting; elapsed_ms waits until `to` is reached.
  virtual std::unique_ptr<DeviceMark> mark();
  virtual double elapsed_ms(const DeviceMark& from, const DeviceMark& to);
  // Named ranges for external profilers (NVTX for Nsight Systems on CUDA); nothing on the host backend.
  virtual void range_push(const char* name);
  virtual void range_pop();

 protected:
  [[noreturn]] void unimplemented(const char* op) const;
};

// The backend that owns tensors on this device (src/ops registers and starts them on first use;
// ops::to_device and ops::copy move tensors between devices).
Backend& backend_for(Device device);
// The started backend of a device type, or null (profiling scopes look for a GPU without starting one).
Backend* started_backend(DeviceType type);
void register_backend(DeviceType type, Backend* backend);

}  // namespace primus
