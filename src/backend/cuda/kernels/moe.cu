// Mixture-of-experts kernels: the router (scores, grouped top-k, weights, and their gradient), the sort of routing
// entries into expert order, token permutation and un-permutation, and the aux and z losses. backend.h
// (MoeRouting ... MoeAuxLossArgs) states the math; src/backend/cpu/moe.cpp is the reference, and these kernels
// follow its formulas and its orders of summation wherever that is cheap:
//  - router: one warp per token, each lane holding experts lane, lane + 32, ...; scores, normalisation sums and
//    gradients in double as on the CPU, so a score differs from the CPU's only when the double result lies within
//    its last bits of a float rounding boundary; selection by repeated warp arg-max with ties to the lower index
//    (the CPU's stable sort), so the chosen experts are the CPU's.
//  - sort: a stable radix sort of (expert, entry) pairs (entries ascending within an expert, the CPU's counting
//    sort gives the same slots), then offsets by binary search of the sorted experts: no host synchronisation. An
//    expert outside [0, E) is recorded for the host (reported at the next wait) and sorted past offsets[E].
//  - permute backward and un-permute: one block per token sums its k rows in ascending row order, as the CPU's
//    row loop does, multiply and add rounded separately (no fused multiply-add: the CPU build has none), so f32
//    results equal the CPU's bit for bit. No float atomics anywhere: every output element has one writer.
//  - losses: one warp per row, then one block sums the rows' terms in a fixed tree (deterministic).
#include <bit>
#include <climits>
#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kRouterWarps = 4;  // tokens per block of the router and loss kernels, one warp each
constexpr int kExpertsPerLane = static_cast<int>(kMoeRouterMaxExperts / kWarpSize);
constexpr int kRowThreads = 256;  // the row kernels (permute, un-permute)

// Whether (a, ia) comes before (b, ib) in the selection: the larger value, equal values by the lower expert (the
// CPU's stable sort over ascending experts). NaN is taken as −inf so the order stays total.
__device__ __forceinline__ bool selected_before(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}
__device__ __forceinline__ float selection_key(float v) { return isnan(v) ? -INFINITY : v; }

// Grouped selection: the groups allowed to this warp's token, one bit each. Lane g < G sums its group's best
// `best_of_group` biased scores (largest first, in double: the CPU's partial sort and sum), then groups are ranked by
// that score, ties to the lower group. `row` is this warp's [E] biased scores in shared memory (overwritten).
__device__ unsigned allowed_groups(float* row, const MoeRouterShape& p, int lane) {
  const int groups = static_cast<int>(p.num_groups);
  const int per_group = static_cast<int>(p.experts / p.num_groups);
  const int best_of_group = static_cast<int>(p.topk / p.group_topk);
  double score = 0.0;
  if (lane < groups) {
    float* g = row + lane * per_group;
    for (int r = 0; r < best_of_group; ++r) {
      int best = 0;
      for (int i = 1; i < per_group; ++i) {
        if (g[i] > g[best]) best = i;
      }
      score += static_cast<double>(g[best]);
      g[best] = -INFINITY;  // taken (this lane alone owns its group's entries)
    }
  }
  int rank = 0;
  for (int h = 0; h < groups; ++h) {
    const double other = __shfl_sync(kFullMask, score, h);
    if (other > score || (other == score && h < lane)) ++rank;
  }
  return __ballot_sync(kFullMask, lane < groups && rank < p.group_topk);
}

__global__ void router_forward_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                                      float* __restrict__ scores, int32_t* __restrict__ topk_experts,
                                      float* __restrict__ topk_weights, MoeRouterShape p) {
  extern __shared__ float biased_rows[];  // [kRouterWarps, E], grouped selection only
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (t >= p.tokens) return;  // the whole warp: no block-wide barrier follows
  const int experts = static_cast<int>(p.experts);
  const float* z = logits + t * experts;  // [E]
  float s[kExpertsPerLane], key[kExpertsPerLane];
  if (!p.sigmoid) {
    float max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e < experts) max = fmaxf(max, z[e]);
    }
    max = warp_max(max);
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e < experts) sum += exp(static_cast<double>(z[e]) - max);
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e < experts) s[i] = static_cast<float>(exp(static_cast<double>(z[e]) - max) / sum);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e < experts) s[i] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(z[e]))));
    }
  }
  float* row = biased_rows + warp * experts;
#pragma unroll
  for (int i = 0; i < kExpertsPerLane; ++i) {
    const int e = lane + i * kWarpSize;
    if (e >= experts) continue;
    scores[t * experts + e] = s[i];
    key[i] = selection_key(bias != nullptr ? s[i] + bias[e] : s[i]);
    if (p.num_groups > 1) row[e] = key[i];
  }
  unsigned groups_allowed = kFullMask;
  const int per_group = static_cast<int>(p.experts / p.num_groups);
  if (p.num_groups > 1) {
    __syncwarp();
    groups_allowed = allowed_groups(row, p, lane);
  }
  // k rounds of a warp arg-max over the experts not yet taken; every lane ends each round with the same winner.
  unsigned taken = 0;  // bit i: this lane's expert lane + 32·i is chosen
  double selected_sum = 0.0;
  for (int64_t j = 0; j < p.topk; ++j) {
    float best = -INFINITY, best_score = 0.0f;
    int best_expert = INT_MAX;
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e >= experts || (taken >> i & 1u) != 0 || (groups_allowed >> (e / per_group) & 1u) == 0) continue;
      if (selected_before(key[i], e, best, best_expert)) {
        best = key[i];
        best_expert = e;
        best_score = s[i];
      }
    }
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(kFullMask, best, offset);
      const int other_expert = __shfl_xor_sync(kFullMask, best_expert, offset);
      const float other_score = __shfl_xor_sync(kFullMask, best_score, offset);
      if (selected_before(other, other_expert, best, best_expert)) {
        best = other;
        best_expert = other_expert;
        best_score = other_score;
      }
    }
    // (INT_MAX, no expert left, cannot win: the op checks that k experts are allowed.)
    if (best_expert != INT_MAX && best_expert % kWarpSize == lane) taken |= 1u << (best_expert / kWarpSize);
    selected_sum += static_cast<double>(best_score);
    if (lane == 0) {
      topk_experts[t * p.topk + j] = best_expert;
      topk_weights[t * p.topk + j] = best_score;  // scaled below, once the divisor is known
    }
  }
  if (lane != 0) return;
  const double divisor = !p.normalize ? 1.0 : p.sigmoid ? selected_sum + 1e-20 : selected_sum;
  for (int64_t j = 0; j < p.topk; ++j) {
    float& w = topk_weights[t * p.topk + j];
    w = static_cast<float>(w / divisor * p.scaling_factor);
  }
}

__global__ void router_backward_kernel(const float* __restrict__ scores, const int32_t* __restrict__ topk_experts,
                                       const float* __restrict__ dweights, const float* __restrict__ dscores,
                                       float* __restrict__ dlogits, MoeRouterShape p) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (t >= p.tokens) return;
  const int experts = static_cast<int>(p.experts);
  const float* s = scores + t * experts;          // [E]
  const int32_t* chosen = topk_experts + t * p.topk;  // [k]
  const float* dw = dweights + t * p.topk;            // [k]
  // ds: the gradient of the scores, in double as on the CPU; this lane's experts.
  double ds[kExpertsPerLane];
#pragma unroll
  for (int i = 0; i < kExpertsPerLane; ++i) {
    const int e = lane + i * kWarpSize;
    ds[i] = dscores != nullptr && e < experts ? static_cast<double>(dscores[t * experts + e]) : 0.0;
  }
  // w_j = c · s_j / S: ds_j += c (dw_j − Σ_i dw_i s_i / S) / S (every lane forms the same sums, in the CPU's order).
  double sum = 1.0, dot = 0.0;
  if (p.normalize) {
    sum = 0.0;
    for (int64_t j = 0; j < p.topk; ++j) sum += s[chosen[j]];
    if (p.sigmoid) sum += 1e-20;
    for (int64_t j = 0; j < p.topk; ++j) dot += static_cast<double>(dw[j]) * s[chosen[j]] / sum;
  }
  for (int64_t j = 0; j < p.topk; ++j) {
    const int c = chosen[j];
    if (c % kWarpSize != lane) continue;
    const double add =
        p.normalize ? p.scaling_factor * (dw[j] - dot) / sum : static_cast<double>(p.scaling_factor) * dw[j];
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      if (i == c / kWarpSize) ds[i] += add;
    }
  }
  float* dz = dlogits + t * experts;  // [E]
  if (!p.sigmoid) {
    double softmax_dot = 0.0;
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e < experts) softmax_dot += ds[i] * s[e];
    }
    softmax_dot = warp_sum(softmax_dot);
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e < experts) dz[e] = static_cast<float>(s[e] * (ds[i] - softmax_dot));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kExpertsPerLane; ++i) {
      const int e = lane + i * kWarpSize;
      if (e < experts) dz[e] = static_cast<float>(ds[i] * s[e] * (1.0 - s[e]));
    }
  }
}

// keys[i] = the expert of routing entry i (E for one outside [0, E): recorded, sorted last), entries[i] = i.
__global__ void sort_keys_kernel(const int32_t* __restrict__ topk_experts, int32_t* __restrict__ keys,
                                 int32_t* __restrict__ entries, int64_t m, int64_t experts, DeviceError* error) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = topk_experts[i];
    const bool valid = e >= 0 && e < experts;
    if (!valid) record_error(error, kMoeSortExpert, i, e, experts);
    keys[i] = valid ? e : static_cast<int32_t>(experts);
    entries[i] = static_cast<int32_t>(i);
  }
}

// offsets[e] = the first sorted position whose expert is ≥ e, for e in [0, E].
__global__ void sort_offsets_kernel(const int32_t* __restrict__ sorted_keys, int32_t* __restrict__ offsets,
                                    int64_t m, int64_t experts) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e > experts) return;
  int64_t lo = 0, hi = m;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sorted_keys[mid] < e) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  offsets[e] = static_cast<int32_t>(lo);
}

// row_of[slots[s]] = s: the row holding each routing entry.
__global__ void invert_slots_kernel(const int32_t* __restrict__ slots, int32_t* __restrict__ row_of, int64_t m) {
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < m;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    row_of[slots[s]] = static_cast<int32_t>(s);
  }
}

// out[s, :] = x[slots[s] / k, :], one block per row, N elements per access.
template <typename T, int N>
__global__ void permute_kernel(const T* __restrict__ x, const int32_t* __restrict__ slots, T* __restrict__ out,
                               int64_t k, int64_t channels) {
  const int64_t s = blockIdx.x;
  const T* src = x + (slots[s] / k) * channels;
  T* dst = out + s * channels;
  for (int64_t c = threadIdx.x * N; c < channels; c += static_cast<int64_t>(blockDim.x) * N) {
    float v[N];
    load_n(src + c, v);
    store_n(dst + c, v);
  }
}

// Token t's k rows in ascending order (the CPU's row loop) and, for un-permutation, their weights; thread 0 of the
// block fills them, then the block waits.
__device__ void token_rows(const int32_t* row_of, const float* weights, int64_t t, int64_t k, int32_t* rows,
                           float* row_weights) {
  if (threadIdx.x == 0) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = row_of[t * k + j];
      const float w = weights != nullptr ? weights[t * k + j] : 0.0f;
      int64_t i = j;
      for (; i > 0 && rows[i - 1] > r; --i) {
        rows[i] = rows[i - 1];
        row_weights[i] = row_weights[i - 1];
      }
      rows[i] = r;
      row_weights[i] = w;
    }
  }
  __syncthreads();
}

// dx[t, :] = Σ over token t's rows (ascending) of dout[row, :] (fp32 sum from 0, as the CPU adds them).
// out[t, :] = Σ over token t's rows of weight · y[row, :] when Weighted.
template <typename T, int N, bool Weighted>
__global__ void gather_rows_kernel(const T* __restrict__ rows_in, const int32_t* __restrict__ row_of,
                                   const float* __restrict__ weights, T* __restrict__ out, int64_t k,
                                   int64_t channels) {
  __shared__ int32_t rows[kMoeMaxTopk];
  __shared__ float row_weights[kMoeMaxTopk];
  const int64_t t = blockIdx.x;
  token_rows(row_of, Weighted ? weights : nullptr, t, k, rows, row_weights);
  for (int64_t c = threadIdx.x * N; c < channels; c += static_cast<int64_t>(blockDim.x) * N) {
    float acc[N];
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      float v[N];
      load_n(rows_in + static_cast<int64_t>(rows[j]) * channels + c, v);
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] = __fadd_rn(acc[i], Weighted ? __fmul_rn(row_weights[j], v[i]) : v[i]);
    }
    store_n(out + t * channels + c, acc);
  }
}

// Row s: dy[s, :] = w · dout[t, :] and dweights[entry] = Σ_c y[s, c] · dout[t, c] (double, block tree order), with
// entry = slots[s], t = entry / k, w = weights[entry].
template <typename T, int N>
__global__ void unpermute_backward_kernel(const T* __restrict__ y, const int32_t* __restrict__ slots,
                                          const float* __restrict__ weights, const T* __restrict__ dout,
                                          T* __restrict__ dy, float* __restrict__ dweights, int64_t k,
                                          int64_t channels) {
  __shared__ double scratch[kWarpSize];
  const int64_t s = blockIdx.x;
  const int32_t entry = slots[s];
  const float w = weights[entry];
  const T* g = dout + (entry / k) * channels;
  const T* ys = y + s * channels;
  double dot = 0.0;
  for (int64_t c = threadIdx.x * N; c < channels; c += static_cast<int64_t>(blockDim.x) * N) {
    float gv[N], yv[N], out[N];
    load_n(g + c, gv);
    load_n(ys + c, yv);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      out[i] = __fmul_rn(w, gv[i]);
      dot += static_cast<double>(yv[i]) * gv[i];
    }
    store_n(dy + s * channels + c, out);
  }
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) dweights[entry] = static_cast<float>(dot);
}

// Row t of the aux loss: row_terms[t] = Σ_e count_e · p[t, e]; dscores[t, :] = grad_scale · factor · its gradient.
__global__ void aux_loss_kernel(const float* __restrict__ scores, const int32_t* __restrict__ offsets,
                                double* __restrict__ row_terms, float* __restrict__ dscores, int64_t n,
                                int64_t experts, double factor, float grad_scale, bool sigmoid_scores) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (t >= n) return;
  const float* s = scores + t * experts;  // [E]
  double sum = 1.0;
  if (sigmoid_scores) {
    double part = 0.0;
    for (int64_t e = lane; e < experts; e += kWarpSize) part += s[e];
    sum = 1e-20 + warp_sum(part);
  }
  double dot = 0.0;  // Σ_e count_e · p_e
  for (int64_t e = lane; e < experts; e += kWarpSize) {
    dot += static_cast<double>(offsets[e + 1] - offsets[e]) * (s[e] / sum);
  }
  dot = warp_sum(dot);
  if (lane == 0) row_terms[t] = dot;
  if (dscores == nullptr) return;
  for (int64_t e = lane; e < experts; e += kWarpSize) {
    const double count = offsets[e + 1] - offsets[e];
    const double d = sigmoid_scores ? (count - dot) / sum : count;
    dscores[t * experts + e] = static_cast<float>(grad_scale * factor * d);
  }
}

// Row t of the z-loss: row_terms[t] = lse²; dlogits[t, :] += grad_scale · factor · 2 · lse · softmax.
__global__ void z_loss_kernel(const float* __restrict__ logits, double* __restrict__ row_terms,
                              float* __restrict__ dlogits, int64_t n, int64_t experts, double factor,
                              float grad_scale) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (t >= n) return;
  const float* z = logits + t * experts;  // [E]
  float max = -INFINITY;
  for (int64_t e = lane; e < experts; e += kWarpSize) max = fmaxf(max, z[e]);
  max = warp_max(max);
  double sum = 0.0;
  for (int64_t e = lane; e < experts; e += kWarpSize) sum += exp(static_cast<double>(z[e]) - max);
  sum = warp_sum(sum);
  const double lse = max + log(sum);
  if (lane == 0) row_terms[t] = lse * lse;
  if (dlogits == nullptr) return;
  for (int64_t e = lane; e < experts; e += kWarpSize) {
    const double p = exp(static_cast<double>(z[e]) - max) / sum;
    dlogits[t * experts + e] += static_cast<float>(grad_scale * factor * 2.0 * lse * p);
  }
}

// loss[0] = factor · Σ row_terms, one block, fixed tree: the same bits on every run.
__global__ void sum_terms_kernel(const double* __restrict__ row_terms, int64_t n, double factor,
                                 float* __restrict__ loss) {
  __shared__ double scratch[kWarpSize];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += row_terms[i];
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(factor * sum);
}

unsigned router_blocks(int64_t tokens) { return static_cast<unsigned>((tokens + kRouterWarps - 1) / kRouterWarps); }

}  // namespace

void moe_router_forward(const KernelContext& ctx, const MoeRouterShape& shape, const float* logits, const float* bias,
                        float* scores, int32_t* topk_experts, float* topk_weights) {
  if (shape.tokens == 0) return;
  const size_t shared = shape.num_groups > 1 ? kRouterWarps * shape.experts * sizeof(float) : 0;
  router_forward_kernel<<<router_blocks(shape.tokens), kRouterWarps * kWarpSize, shared, ctx.stream>>>(
      logits, bias, scores, topk_experts, topk_weights, shape);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void moe_router_backward(const KernelContext& ctx, const MoeRouterShape& shape, const float* scores,
                         const int32_t* topk_experts, const float* dweights, const float* dscores, float* dlogits) {
  if (shape.tokens == 0) return;
  router_backward_kernel<<<router_blocks(shape.tokens), kRouterWarps * kWarpSize, 0, ctx.stream>>>(
      scores, topk_experts, dweights, dscores, dlogits, shape);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void moe_sort(const KernelContext& ctx, const int32_t* topk_experts, int64_t entries, int64_t experts, int32_t* slots,
              int32_t* offsets) {
  constexpr int kThreads = 256;
  if (entries > 0) {
    const size_t index_bytes = static_cast<size_t>(entries) * sizeof(int32_t);
    DeviceBuffer keys_in(*ctx.allocator, index_bytes);
    DeviceBuffer keys_out(*ctx.allocator, index_bytes);
    DeviceBuffer entries_in(*ctx.allocator, index_bytes);
    sort_keys_kernel<<<grid_for(entries, kThreads), kThreads, 0, ctx.stream>>>(
        topk_experts, keys_in.as<int32_t>(), entries_in.as<int32_t>(), entries, experts, ctx.error);
    PRIMUS_CUDA_CHECK_LAUNCH();
    // Keys lie in [0, E]: sort only the bits that can differ. Radix sorts are stable: entries stay ascending.
    const int end_bit = std::bit_width(static_cast<uint32_t>(experts));
    const int items = static_cast<int>(entries);
    size_t temp_bytes = 0;
    PRIMUS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<int32_t>(),
                                                      keys_out.as<int32_t>(), entries_in.as<int32_t>(), slots, items,
                                                      0, end_bit, ctx.stream));
    DeviceBuffer temp(*ctx.allocator, temp_bytes);
    PRIMUS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in.as<int32_t>(),
                                                      keys_out.as<int32_t>(), entries_in.as<int32_t>(), slots, items,
                                                      0, end_bit, ctx.stream));
    sort_offsets_kernel<<<grid_for(experts + 1, kThreads), kThreads, 0, ctx.stream>>>(keys_out.as<int32_t>(),
                                                                                       offsets, entries, experts);
    PRIMUS_CUDA_CHECK_LAUNCH();
    return;
  }
  PRIMUS_CUDA_CHECK(gpuMemsetAsync(offsets, 0, static_cast<size_t>(experts + 1) * sizeof(int32_t), ctx.stream));
}

template <typename T>
void moe_permute(const KernelContext& ctx, const T* x, const int32_t* slots, T* out, int64_t rows, int64_t k,
                 int64_t channels) {
  if (rows == 0 || channels == 0) return;
  with_width<T>(vector_ok<T>(channels, x, out), [&](auto width) {
    constexpr int N = decltype(width)::value;
    permute_kernel<T, N><<<static_cast<unsigned>(rows), row_threads(channels / N, kRowThreads), 0, ctx.stream>>>(
        x, slots, out, k, channels);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

namespace {

// row_of [N·k] (scratch): the row of each routing entry.
void invert_slots(const KernelContext& ctx, const int32_t* slots, int32_t* row_of, int64_t m) {
  constexpr int kThreads = 256;
  invert_slots_kernel<<<grid_for(m, kThreads), kThreads, 0, ctx.stream>>>(slots, row_of, m);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T, bool Weighted>
void gather_rows(const KernelContext& ctx, const T* rows_in, const int32_t* slots, const float* weights, T* out,
                 int64_t tokens, int64_t k, int64_t channels) {
  if (tokens == 0 || channels == 0) return;
  DeviceBuffer row_of(*ctx.allocator, static_cast<size_t>(tokens * k) * sizeof(int32_t));
  invert_slots(ctx, slots, row_of.as<int32_t>(), tokens * k);
  with_width<T>(vector_ok<T>(channels, rows_in, out), [&](auto width) {
    constexpr int N = decltype(width)::value;
    gather_rows_kernel<T, N, Weighted>
        <<<static_cast<unsigned>(tokens), row_threads(channels / N, kRowThreads), 0, ctx.stream>>>(
            rows_in, row_of.as<int32_t>(), weights, out, k, channels);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void moe_permute_backward(const KernelContext& ctx, const T* dout, const int32_t* slots, T* dx, int64_t tokens,
                          int64_t k, int64_t channels) {
  gather_rows<T, false>(ctx, dout, slots, nullptr, dx, tokens, k, channels);
}

template <typename T>
void moe_unpermute(const KernelContext& ctx, const T* y, const int32_t* slots, const float* weights, T* out,
                   int64_t tokens, int64_t k, int64_t channels) {
  gather_rows<T, true>(ctx, y, slots, weights, out, tokens, k, channels);
}

template <typename T>
void moe_unpermute_backward(const KernelContext& ctx, const T* y, const int32_t* slots, const float* weights,
                            const T* dout, T* dy, float* dweights, int64_t tokens, int64_t k, int64_t channels) {
  const int64_t rows = tokens * k;
  if (rows == 0) return;
  if (channels == 0) {  // every dot product is empty
    PRIMUS_CUDA_CHECK(gpuMemsetAsync(dweights, 0, static_cast<size_t>(rows) * sizeof(float), ctx.stream));
    return;
  }
  with_width<T>(vector_ok<T>(channels, y, dout, dy), [&](auto width) {
    constexpr int N = decltype(width)::value;
    unpermute_backward_kernel<T, N>
        <<<static_cast<unsigned>(rows), row_threads(channels / N, kRowThreads), 0, ctx.stream>>>(
            y, slots, weights, dout, dy, dweights, k, channels);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void moe_aux_loss(const KernelContext& ctx, const float* scores, const int32_t* offsets, int64_t tokens,
                  int64_t experts, int64_t topk, float coeff, bool sigmoid_scores, float grad_scale, float* loss,
                  float* dscores) {
  const double factor =
      static_cast<double>(coeff) * experts / (static_cast<double>(topk) * static_cast<double>(tokens) * tokens);
  DeviceBuffer row_terms(*ctx.allocator, static_cast<size_t>(tokens > 0 ? tokens : 1) * sizeof(double));
  if (tokens > 0) {
    aux_loss_kernel<<<router_blocks(tokens), kRouterWarps * kWarpSize, 0, ctx.stream>>>(
        scores, offsets, row_terms.as<double>(), dscores, tokens, experts, factor, grad_scale, sigmoid_scores);
    PRIMUS_CUDA_CHECK_LAUNCH();
  }
  sum_terms_kernel<<<1, 1024, 0, ctx.stream>>>(row_terms.as<double>(), tokens, factor, loss);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void moe_z_loss(const KernelContext& ctx, const float* logits, int64_t tokens, int64_t experts, float coeff,
                float grad_scale, float* loss, float* dlogits) {
  const double factor = static_cast<double>(coeff) / static_cast<double>(tokens);
  DeviceBuffer row_terms(*ctx.allocator, static_cast<size_t>(tokens > 0 ? tokens : 1) * sizeof(double));
  if (tokens > 0) {
    z_loss_kernel<<<router_blocks(tokens), kRouterWarps * kWarpSize, 0, ctx.stream>>>(
        logits, row_terms.as<double>(), dlogits, tokens, experts, factor, grad_scale);
    PRIMUS_CUDA_CHECK_LAUNCH();
  }
  sum_terms_kernel<<<1, 1024, 0, ctx.stream>>>(row_terms.as<double>(), tokens, factor, loss);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

#define PRIMUS_MOE_ROWS(T)                                                                                          \
  template void moe_permute<T>(const KernelContext&, const T*, const int32_t*, T*, int64_t, int64_t, int64_t);      \
  template void moe_permute_backward<T>(const KernelContext&, const T*, const int32_t*, T*, int64_t, int64_t,      \
                                        int64_t);                                                                   \
  template void moe_unpermute<T>(const KernelContext&, const T*, const int32_t*, const float*, T*, int64_t,         \
                                 int64_t, int64_t);                                                                 \
  template void moe_unpermute_backward<T>(const KernelContext&, const T*, const int32_t*, const float*, const T*,  \
                                          T*, float*, int64_t, int64_t, int64_t);
PRIMUS_MOE_ROWS(float)
PRIMUS_MOE_ROWS(bf16)
#undef PRIMUS_MOE_ROWS

}  // namespace primus::cuda
