// Typed host launchers of the CUDA kernels, one op family per kernels/<op>.cu. The __global__ functions
// stay private to their .cu; CudaBackend dispatches on the tensors' dtype and calls these with raw pointers.
// Every launcher is a template over the storage type T of activations, float or bf16 (instantiated for both).
// Kernels load T into fp32, compute in fp32 (reductions in double where the CPU reference does) and round once
// on store. Per-row statistics (rstd, lse, losses), parameter gradients (dweight, dtable) and optimizer state
// are always fp32.
//
// All launchers queue work on ctx.stream and return without waiting for the device. Problems that need the
// data to detect (a token id outside the table) are recorded in ctx.error and reported by the backend at its
// next synchronisation. Limits that depend only on shapes are checked by the backend before launching (the
// .cu files stay free of fmt, whose compile-time format checks nvcc's C++20 front end rejects).
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_runtime.h"
#include "core/allocator.h"
#include "core/rng.h"

namespace primus::cuda {

// The first data error seen by any kernel since the last report; code 0 means none.
struct DeviceError {
  int code;
  int unused;
  long long position;  // row or token index
  long long value;     // the offending id or target
  long long limit;     // the valid range is [0, limit)
};

enum DeviceErrorCode : int {
  kNoError = 0,
  kEmbeddingForwardId = 1,
  kEmbeddingBackwardId = 2,
  kCrossEntropyForwardTarget = 3,
  kCrossEntropyBackwardTarget = 4,
  kRopePosition = 5,            // position: token (b·T + t), value: the position, limit: rows of the table
  kAttentionSegmentStart = 6,   // position: token (b·T + t), value: its segment start, limit: t + 1
  // An id of a vocabulary shard's table outside the whole vocabulary (limit: its total).
  kEmbeddingForwardVocabId = 7,
  kEmbeddingBackwardVocabId = 8,
  kCrossEntropyShardStatsTarget = 9,
  kMoeSortExpert = 10,      // position: routing entry (t·k + j), value: its expert, limit: E
  kMoeCapacityExpert = 11,  // as kMoeSortExpert, found by moe_capacity
  kMoePadRows = 12,         // position: local expert, value: its rows, limit: its padded capacity + 1
};

// bf16 storage: the raw bits of a bfloat16. Conversions go through core/bf16.h (round to nearest even), so a
// value rounded here has the same bits as on the CPU. A plain struct keeps this header free of vendor types.
struct bf16 {
  uint16_t bits;
};

struct KernelContext {
  gpuStream_t stream = nullptr;
  DeviceError* error = nullptr;          // device memory
  Allocator* allocator = nullptr;        // scratch buffers (stream-ordered, see caching_allocator.h)
  int64_t max_shared_bytes = 48 * 1024;  // per block, opt-in limit of the device
  int compute_capability = 0;            // major · 10 + minor (90: Hopper, where the wgmma kernels run)
  int multiprocessors = 0;               // SMs: the grid of persistent kernels (0: unknown, one block a tile)
};

// ids [N], table [rows, C] holding vocabulary rows [vocab_begin, vocab_begin + rows) of vocab_total (unsharded:
// 0 and rows), out [N, C]. Every id must lie in [0, vocab_total); one not held here gives a zero row (forward) and
// no gradient (backward).
// out[i, :] = table[ids[i] − vocab_begin, :]
template <typename T>
void embedding_forward(const KernelContext& ctx, const int32_t* ids, const T* table, T* out, int64_t n, int64_t rows,
                       int64_t channels, int64_t vocab_begin, int64_t vocab_total);
// dtable[ids[i] − vocab_begin, :] += dout[i, :] (fp32), repeated ids summed in token order (deterministic).
template <typename T>
void embedding_backward(const KernelContext& ctx, const int32_t* ids, const T* dout, float* dtable, int64_t n,
                        int64_t rows, int64_t channels, int64_t vocab_begin, int64_t vocab_total);

// x, y, dy, dx [N, C]; weight [C]; dweight [C] fp32; rstd [N]. dx or dweight may be null (skipped); dweight
// accumulates.
template <typename T>
void rmsnorm_forward(const KernelContext& ctx, const T* x, const T* weight, T* y, float* rstd, int64_t rows,
                     int64_t channels, float eps);
template <typename T>
void rmsnorm_backward(const KernelContext& ctx, const T* x, const T* weight, const float* rstd, const T* dy, T* dx,
                      float* dweight, int64_t rows, int64_t channels);

// In place on x [B, T, H, D] with cos, sin [rows, D/2]; sign +1 rotates forward, -1 applies the inverse. Token
// (b, t) uses table row t (rows ≥ T), or positions[b·T + t] when positions ([B, T], may be null) is given; a
// position outside [0, rows) is recorded in ctx.error and its token left unchanged. Pair i is (x[i], x[i + D/2]),
// or with interleaved (multi-head latent attention, DeepSeek's checkpoint order) (x[2i], x[2i + 1]).
struct RopeShape {
  int64_t batch, seq, heads, head_dim;
  int64_t rows;  // of the cos/sin tables
  bool interleaved = false;
};
template <typename T>
void rope(const KernelContext& ctx, const RopeShape& shape, T* x, const float* cos, const float* sin,
          const int32_t* positions, float sign);

struct AttentionShape {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
  int64_t v_dim = 0;  // the value (and output) head size Dv; 0: head_dim (multi-head latent attention's differs)
  int64_t value_dim() const { return v_dim > 0 ? v_dim : head_dim; }
};
// Limits of the attention kernels, checked by the backend before it launches them: the head sizes (D and Dv), the
// grid (y: heads ≤ 65535, z: batch ≤ 65535) and the dynamic shared memory per block, whose largest use (the
// dk/dv kernel: a key and a value row and two rows of T scores) must fit the device's opt-in limit with the
// kernels' static shared memory (under 1 KiB).
inline constexpr int64_t kAttentionMaxHeadDim = 512;
inline constexpr int64_t kAttentionMaxGridDim = 65535;
inline constexpr int64_t kAttentionStaticSharedBytes = 1024;
// A row of scores in shared memory is padded to a multiple of 4 floats: the compiler may read the last
// element of a row together with its neighbour (compute-sanitizer flagged such 8-byte reads at T = 1).
inline int64_t attention_score_slots(int64_t seq) { return (seq + 3) / 4 * 4; }
inline int64_t attention_shared_bytes(const AttentionShape& s) {
  return (s.head_dim + s.value_dim() + 2 * attention_score_slots(s.seq)) * static_cast<int64_t>(sizeof(float));
}
// q, dq [B, T, Hq, D]; k, dk [B, T, Hkv, D]; v, dv [B, T, Hkv, Dv]; out, dout [B, T, Hq, Dv]; lse [B, Hq, T]. causal:
// query t attends to keys j ≤ t, else to every key of the block. segment_start ([B, T], may be null; causal only):
// query t attends to keys [segment_start[b·T + t], t] only; a start outside [0, t] is recorded in ctx.error (forward
// and dq then use [t, t] for that row so nothing is read out of bounds).
template <typename T>
void attention_forward(const KernelContext& ctx, const AttentionShape& shape, const T* q, const T* k, const T* v,
                       T* out, float* lse, const int32_t* segment_start = nullptr, bool causal = true);
template <typename T>
void attention_backward(const KernelContext& ctx, const AttentionShape& shape, const T* q, const T* k, const T* v,
                        const T* out, const float* lse, const T* dout, T* dq, T* dk, T* dv,
                        const int32_t* segment_start = nullptr, bool causal = true);
// out [B, T, Hq, D] and lse [B, Hq, T] merged in place with block_out and block_lse (backend.h, AttentionMergeArgs);
// shape.kv_heads and shape.v_dim are not read (D is out's head size).
template <typename T>
void attention_merge(const KernelContext& ctx, const AttentionShape& shape, T* out, float* lse, const T* block_out,
                     const float* block_lse);

// Multi-head latent attention's per-head concatenation (head_concat.cu; backend.h, HeadConcatArgs): a, da
// [rows, heads, a_dim], b, db [rows, b_heads, b_dim] (b_heads = heads, or 1: one b row shared by every head), out,
// dout [rows, heads, a_dim + b_dim]. The backward overwrites da and db; a shared db sums its heads in head order in
// fp32, as the CPU does.
struct HeadConcatShape {
  int64_t rows, heads, a_dim, b_heads, b_dim;
};
template <typename T>
void head_concat(const KernelContext& ctx, const HeadConcatShape& shape, const T* a, const T* b, T* out);
template <typename T>
void head_concat_backward(const KernelContext& ctx, const HeadConcatShape& shape, const T* dout, T* da, T* db);

// gate_up, dgate_up [rows, 2F] (per row: gate then up; dgate_up may be gate_up); out, dout [rows, F].
template <typename T>
void swiglu_forward(const KernelContext& ctx, const T* gate_up, T* out, int64_t rows, int64_t f);
template <typename T>
void swiglu_backward(const KernelContext& ctx, const T* gate_up, const T* dout, T* dgate_up, int64_t rows, int64_t f);

// The experts' grouped GEMM (backend.h, GroupedLinearArgs; kernels/grouped_gemm.cu): x, dx [rows, in], y, dy
// [rows, out] of T, w [experts, out, in] of T, dw [experts, out, in] fp32, offsets [experts + 1] i32 on the device
// (0 = offsets[0] ≤ … ≤ offsets[experts] = rows), read by the kernels only: the host never waits for them. bf16
// runs on tensor cores with fp32 accumulation where in and out are multiples of 8 and the pointers 16-byte
// aligned (wgmma with TMA on sm_90, kernels/grouped_gemm_wgmma.cu; mma.sync elsewhere; the environment variable
// PRIMUS_GROUPED_GEMM=v1|wgmma|auto overrides), everything else through an fp32 kernel; all deterministic. The
// backend checks grouped_gemm_blocks_fit first.
struct GroupedGemmShape {
  int64_t rows, experts, in, out;
};
// y[r] = x[r] · w[e]ᵀ for the rows r of each expert e.
template <typename T>
void grouped_linear_forward(const KernelContext& ctx, const GroupedGemmShape& s, const T* x, const T* w,
                            const int32_t* offsets, T* y);
// dx[r] = dy[r] · w[e] (overwritten).
template <typename T>
void grouped_linear_backward_data(const KernelContext& ctx, const GroupedGemmShape& s, const T* dy, const T* w,
                                  const int32_t* offsets, T* dx);
// dw[e] += dy[rows of e]ᵀ · x[rows of e]; an expert without rows keeps its dw.
template <typename T>
void grouped_linear_backward_weight(const KernelContext& ctx, const GroupedGemmShape& s, const T* dy, const T* x,
                                    const int32_t* offsets, float* dw);
// Whether the launches' grids stay within 2^31 − 1 blocks (64 × 64 tiles, the smaller of the two kernels').
inline bool grouped_gemm_blocks_fit(const GroupedGemmShape& s) {
  const int64_t limit = (int64_t{1} << 31) - 1;
  const int64_t rows = (s.rows + 63) / 64 + s.experts, in = (s.in + 63) / 64, out = (s.out + 63) / 64;
  if (s.experts > limit || rows > limit) return false;
  return rows * (in > out ? in : out) <= limit && (out == 0 || s.experts * out <= limit / (in > 0 ? in : 1));
}

// logits, dlogits [N, V] (dlogits may be the same memory as logits); targets, losses, lse [N].
// With dlogits (may be null), the forward also writes the backward's gradient for grad_scale in the same launch.
template <typename T>
void cross_entropy_forward(const KernelContext& ctx, const T* logits, const int32_t* targets, float* losses, float* lse,
                           int64_t rows, int64_t vocab, float grad_scale = 0.0f, T* dlogits = nullptr);
// With a vocabulary shard, logits and dlogits hold columns [vocab_begin, vocab_begin + vocab) of vocab_total
// (unsharded: 0 and vocab); targets must lie below vocab_total.
template <typename T>
void cross_entropy_backward(const KernelContext& ctx, const T* logits, const int32_t* targets, const float* lse,
                            float grad_scale, T* dlogits, int64_t rows, int64_t vocab, int64_t vocab_begin,
                            int64_t vocab_total);
// The vocabulary-parallel steps (backend.h). max[r] = max of x[r, :], x [rows, columns].
template <typename T>
void row_max(const KernelContext& ctx, const T* x, float* max, int64_t rows, int64_t columns);
// sum_exp[r] = Σ_v exp(logits[r, v] − max[r]); target_logit[r] = the target's logit where this shard holds its
// column, else 0. logits [rows, vocab] as for cross_entropy_backward; max, sum_exp, target_logit [rows] f32.
template <typename T>
void cross_entropy_shard_stats(const KernelContext& ctx, const T* logits, const int32_t* targets, const float* max,
                               float* sum_exp, float* target_logit, int64_t rows, int64_t vocab, int64_t vocab_begin,
                               int64_t vocab_total);
// lse = max + log(sum_exp) (in double, rounded once); losses = lse − target_logit, 0 for a negative target.
void cross_entropy_finish(const KernelContext& ctx, const float* max, const float* sum_exp, const float* target_logit,
                          const int32_t* targets, float* losses, float* lse, int64_t rows);

// ---- Mixture of experts (moe.cu; backend.h, MoeRouting ... MoeAuxLossArgs, has the math) ----
// Limits the backend checks before launching: the router keeps a token's experts in one warp's registers (16 per
// lane) and ranks groups one per lane; a token's k rows are sorted in shared memory.
inline constexpr int64_t kMoeRouterMaxExperts = 512;
inline constexpr int64_t kMoeRouterMaxGroups = 32;
inline constexpr int64_t kMoeMaxTopk = 64;
struct MoeRouterShape {
  int64_t tokens, experts, topk;
  bool sigmoid, normalize;
  float scaling_factor;
  int64_t num_groups, group_topk;
};
// logits, scores, dscores, dlogits [N, E]; bias [E] (may be null); topk_experts [N, k] i32; topk_weights, dweights
// [N, k]; all f32. dscores may be null; dlogits is overwritten.
void moe_router_forward(const KernelContext& ctx, const MoeRouterShape& shape, const float* logits, const float* bias,
                        float* scores, int32_t* topk_experts, float* topk_weights);
void moe_router_backward(const KernelContext& ctx, const MoeRouterShape& shape, const float* scores,
                         const int32_t* topk_experts, const float* dweights, const float* dscores, float* dlogits);
// topk_experts [entries] → slots [entries], offsets [E + 1]; an expert outside [0, E) is recorded in ctx.error.
void moe_sort(const KernelContext& ctx, const int32_t* topk_experts, int64_t entries, int64_t experts, int32_t* slots,
              int32_t* offsets);
// topk_experts [entries] i32, topk_weights [entries] f32 → kept_experts [entries] i32: each expert's first `capacity`
// entries by descending weight (ties: entry order) or (by_position) by entry order keep their expert, the rest get E
// (moe_capacity.cu). An expert outside [0, E) is recorded in ctx.error and its entry dropped.
void moe_capacity(const KernelContext& ctx, const int32_t* topk_experts, const float* topk_weights, int64_t entries,
                  int64_t experts, int64_t capacity, bool by_position, int32_t* kept_experts);
// rows [M, C], padded [L·P, C], offsets [L + 1] i32 on the device (MoePadArgs); an expert above P rows is recorded in
// ctx.error.
template <typename T>
void moe_pad_rows(const KernelContext& ctx, const T* rows, const int32_t* offsets, T* padded, int64_t local,
                  int64_t per_expert, int64_t channels);
template <typename T>
void moe_unpad_rows(const KernelContext& ctx, const T* padded, const int32_t* offsets, T* rows, int64_t rows_count,
                    int64_t local, int64_t per_expert, int64_t channels);
// x, dx, out (unpermute) [N, C]; out (permute), dout (permute backward), y, dy [N·k, C]; slots [N·k] i32;
// weights, dweights [N, k] f32.
template <typename T>
void moe_permute(const KernelContext& ctx, const T* x, const int32_t* slots, T* out, int64_t rows, int64_t k,
                 int64_t channels);
template <typename T>
void moe_permute_backward(const KernelContext& ctx, const T* dout, const int32_t* slots, T* dx, int64_t tokens,
                          int64_t k, int64_t channels);
template <typename T>
void moe_unpermute(const KernelContext& ctx, const T* y, const int32_t* slots, const float* weights, T* out,
                   int64_t tokens, int64_t k, int64_t channels);
template <typename T>
void moe_unpermute_backward(const KernelContext& ctx, const T* y, const int32_t* slots, const float* weights,
                            const T* dout, T* dy, float* dweights, int64_t tokens, int64_t k, int64_t channels);
// scores [N, E], offsets [E + 1] i32, loss [1], dscores [N, E] (may be null, overwritten).
void moe_aux_loss(const KernelContext& ctx, const float* scores, const int32_t* offsets, int64_t tokens,
                  int64_t experts, int64_t topk, float coeff, bool sigmoid_scores, float grad_scale, float* loss,
                  float* dscores);
// logits [N, E], loss [1], dlogits [N, E] (may be null, accumulated).
void moe_z_loss(const KernelContext& ctx, const float* logits, int64_t tokens, int64_t experts, float coeff,
                float grad_scale, float* loss, float* dlogits);

// Step scalars computed on the host in double and rounded once, exactly as the CPU backend does.
struct AdamWScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float decay;                  // 1 − lr·wd
  float step_size;              // lr / (1 − β1^t)
  float bias_correction2_sqrt;  // sqrt(1 − β2^t)
  float eps;
  float grad_scale;             // g = grad · grad_scale
};
// compute_copy (bf16, may be null) receives the updated param rounded.
void adamw_step(const KernelContext& ctx, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                bf16* compute_copy, int64_t n, const AdamWScalars& s);

template <typename T>
void add_inplace(const KernelContext& ctx, T* y, const T* x, int64_t n);
// dst[i] = src[i] converted (Src, Dst each float or bf16).
template <typename Src, typename Dst>
void cast(const KernelContext& ctx, const Src* src, Dst* dst, int64_t n);
template <typename T>
void scale_inplace(const KernelContext& ctx, T* x, float s, int64_t n);
template <typename T>
void fill(const KernelContext& ctx, T* x, float value, int64_t n);
// x[k] = float(normal_at(seed, k) · std), core/rng.h.
void fill_normal(const KernelContext& ctx, float* x, uint64_t seed, double std, int64_t n, StreamIndex index);
// *result (device memory) = Σ x² in double, by fixed chunks then chunk order: deterministic.
template <typename T>
void sum_squares(const KernelContext& ctx, const T* x, int64_t n, double* result);
// acc[0] += Σ x (acc device memory), Σ in double by the same fixed scheme: deterministic, no host wait.
void sum_into(const KernelContext& ctx, const float* x, int64_t n, float* acc);

}  // namespace primus::cuda
