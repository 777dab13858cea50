// Grouped-query attention on the GPU: the simple, exact O(T²) formulation, one block per query row (forward, dq) or
// per key row (dk, dv), with that row's scores in shared memory; and the merge of partial results (ring attention).
// Same formulas and, per output element, the same summation order as the CPU backend
// (src/backend/cpu/attention.cpp), over the keys j in [s0(t), e(t)] of query t, s0(t) = 0 or segment_start[b, t]
// (packed documents), e(t) = t (causal) or T − 1 (no mask: a key/value block wholly before the queries):
//   s[j] = (q[t] · k[j]) / sqrt(D);  p = softmax(s);  out[t] = Σ_j p[j] v[j];  lse[t] = log Σ_j exp(s[j])
//   Δ[t] = dout[t] · out[t] (double);  ds[t, j] = p[t, j] (dout[t] · v[j] − Δ[t])
//   dq[t] = Σ_j ds[t, j] k[j] / sqrt(D);  dk[j] = Σ_{h in group} Σ_{t: j ≤ e(t), s0(t) ≤ j} ds[t, j] q[t] / sqrt(D);
//   dv[j] = Σ_{h in group} Σ_{t: j ≤ e(t), s0(t) ≤ j} p[t, j] dout[t]
// With segments the dk/dv kernel still walks every t ≥ j and adds exact zeros for queries of other segments,
// which keeps the CPU's order of the non-zero terms; the work stays O(T²) whatever the documents' lengths.
// Backward runs two kernels: per query row it recomputes p from lse, writes dq and Δ; then per key row and
// kv head it recomputes p and ds for every later query of the group's heads, in head then position order, and
// sums dk and dv in registers. Every output element is written by one thread: no atomics, deterministic.
// Values (and so out, dout, dv) may have a head size Dv other than the queries' and keys' D (multi-head latent
// attention: 192 and 128); the scale stays 1/sqrt(D).
// Shared memory holds a row of T scores (two in backward), which bounds T by the device's per-block limit;
// the flash-attention kernels that replace these lift it. The CUDA backend runs bf16 attention through cuDNN
// (cudnn_attention.h) and keeps these for fp32 and for what cuDNN does not take (backward at T = 1, head
// sizes that are not multiples of 8, misaligned tensors, segments); with bf16 they read and write bf16, math in
// fp32.
#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kSlots = 4;  // head-dim elements per thread in the dk/dv kernel
static_assert(kThreads * kSlots >= kAttentionMaxHeadDim);
constexpr int64_t kDefaultSharedBytes = 48 * 1024;

struct Strides {
  int64_t seq, q_heads, kv_heads, head_dim, v_dim, group;
  int64_t score_slots;  // floats per row of scores in shared memory (T padded, see kernels.h)
  bool causal;          // else every key of the block
  // One past the last key query t attends to, and the first query that attends to key j.
  __device__ int64_t key_end(int64_t t) const { return causal ? t + 1 : seq; }
  __device__ int64_t first_query(int64_t j) const { return causal ? j : 0; }
  __device__ int64_t q_row(int64_t b, int64_t t, int64_t h) const { return ((b * seq + t) * q_heads + h) * head_dim; }
  __device__ int64_t kv_row(int64_t b, int64_t t, int64_t h) const { return ((b * seq + t) * kv_heads + h) * head_dim; }
  // Rows of v, dv [B, T, Hkv, Dv] and of out, dout [B, T, Hq, Dv].
  __device__ int64_t v_row(int64_t b, int64_t t, int64_t h) const { return ((b * seq + t) * kv_heads + h) * v_dim; }
  __device__ int64_t o_row(int64_t b, int64_t t, int64_t h) const { return ((b * seq + t) * q_heads + h) * v_dim; }
  __device__ int64_t stat(int64_t b, int64_t h, int64_t t) const { return (b * q_heads + h) * seq + t; }
};

Strides strides_of(const AttentionShape& s, bool causal) {
  return Strides{
      s.seq, s.q_heads, s.kv_heads, s.head_dim, s.value_dim(), s.q_heads / s.kv_heads, attention_score_slots(s.seq),
      causal};
}

// The first key query (b, t) attends to: 0, or its segment start, which must lie in [0, t]. An invalid start is
// treated as t (the row sees only itself, nothing is read out of bounds); the forward and dq kernels record it.
__device__ __forceinline__ int64_t first_key(const int32_t* segment_start, int64_t b, int64_t t, int64_t seq) {
  if (segment_start == nullptr) return 0;
  const int64_t s0 = segment_start[b * seq + t];
  return s0 >= 0 && s0 <= t ? s0 : t;
}

__device__ __forceinline__ void check_first_key(const int32_t* segment_start, int64_t b, int64_t t, int64_t seq,
                                                DeviceError* error) {
  if (segment_start == nullptr || threadIdx.x != 0 || blockIdx.y != 0) return;
  const int64_t s0 = segment_start[b * seq + t];
  if (s0 < 0 || s0 > t) record_error(error, kAttentionSegmentStart, b * seq + t, s0, t + 1);
}

// Dot product of a shared-memory row with a global row, summed over i in order 0..D−1.
template <typename T>
__device__ __forceinline__ float dot_row(const float* a, const T* b, int64_t head_dim) {
  float acc = 0.0f;
  for (int64_t i = 0; i < head_dim; ++i) acc += a[i] * load(b + i);
  return acc;
}

// Block (t, h, b): out[b, t, h, :] and lse[b, h, t]. Shared: q row [D], then p [e + 1 − s0] (of score_slots),
// p[r] belonging to key s0 + r.
template <typename T>
__global__ void attention_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                         T* __restrict__ out, float* __restrict__ lse,
                                         const int32_t* __restrict__ segment_start, DeviceError* error, Strides d,
                                         float scale) {
  extern __shared__ float smem[];
  __shared__ float max_scratch[kWarpSize];
  __shared__ double sum_scratch[kWarpSize];
  const int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t kvh = h / d.group;
  check_first_key(segment_start, b, t, d.seq, error);
  const int64_t s0 = first_key(segment_start, b, t, d.seq);
  const int64_t count = d.key_end(t) - s0;
  float* q_row = smem;           // [D]
  float* p = smem + d.head_dim;  // [e + 1 − s0]
  const int64_t q_off = d.q_row(b, t, h);
  for (int64_t i = threadIdx.x; i < d.head_dim; i += blockDim.x) q_row[i] = load(q + q_off + i);
  __syncthreads();
  float max = -INFINITY;
  for (int64_t r = threadIdx.x; r < count; r += blockDim.x) {
    const float s = dot_row(q_row, k + d.kv_row(b, s0 + r, kvh), d.head_dim) * scale;
    p[r] = s;
    max = fmaxf(max, s);
  }
  max = block_max(max, max_scratch);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const float e = expf(p[j] - max);
    p[j] = e;
    sum += e;
  }
  sum = block_sum(sum, sum_scratch);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) p[j] *= inv;
  __syncthreads();
  const T* v_head = v + d.v_row(b, s0, kvh);
  const int64_t v_stride = d.kv_heads * d.v_dim;
  const int64_t o_off = d.o_row(b, t, h);
  for (int64_t i = threadIdx.x; i < d.v_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < count; ++j) acc += p[j] * load(v_head + j * v_stride + i);
    store(out + o_off + i, acc);
  }
  if (threadIdx.x == 0) lse[d.stat(b, h, t)] = static_cast<float>(static_cast<double>(max) + log(sum));
}

// Block (t, h, b): dq[b, t, h, :] and Δ[b, h, t]. Shared: q row [D], dout row [Dv], ds [e + 1 − s0] (of
// score_slots), ds[r] belonging to key s0 + r.
template <typename T>
__global__ void attention_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                    const T* __restrict__ out, const float* __restrict__ lse,
                                    const T* __restrict__ dout, T* __restrict__ dq, float* __restrict__ delta,
                                    const int32_t* __restrict__ segment_start, DeviceError* error, Strides d,
                                    float scale) {
  extern __shared__ float smem[];
  __shared__ double sum_scratch[kWarpSize];
  const int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t kvh = h / d.group;
  check_first_key(segment_start, b, t, d.seq, error);
  const int64_t s0 = first_key(segment_start, b, t, d.seq);
  const int64_t count = d.key_end(t) - s0;
  float* q_row = smem;                      // [D]
  float* do_row = smem + d.head_dim;        // [Dv]
  float* ds = smem + d.head_dim + d.v_dim;  // [e + 1 − s0]
  const int64_t off = d.q_row(b, t, h), o_off = d.o_row(b, t, h);
  for (int64_t i = threadIdx.x; i < d.head_dim; i += blockDim.x) q_row[i] = load(q + off + i);
  double dot = 0.0;  // Δ = dout[t] · out[t]
  for (int64_t i = threadIdx.x; i < d.v_dim; i += blockDim.x) {
    const float g = load(dout + o_off + i);
    do_row[i] = g;
    dot += static_cast<double>(g) * load(out + o_off + i);
  }
  dot = block_sum(dot, sum_scratch);  // its barriers also publish q_row and do_row
  const float delta_t = static_cast<float>(dot);
  const float row_lse = lse[d.stat(b, h, t)];
  for (int64_t r = threadIdx.x; r < count; r += blockDim.x) {
    const float p = expf(dot_row(q_row, k + d.kv_row(b, s0 + r, kvh), d.head_dim) * scale - row_lse);
    const float dp = dot_row(do_row, v + d.v_row(b, s0 + r, kvh), d.v_dim);
    ds[r] = p * (dp - delta_t);
  }
  __syncthreads();
  const T* k_head = k + d.kv_row(b, s0, kvh);
  const int64_t k_stride = d.kv_heads * d.head_dim;
  for (int64_t i = threadIdx.x; i < d.head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < count; ++j) acc += ds[j] * load(k_head + j * k_stride + i);
    store(dq + off + i, acc * scale);
  }
  if (threadIdx.x == 0) delta[d.stat(b, h, t)] = delta_t;
}

// Block (j, kv head, b): dk and dv of key row j. Shared: k row [D], v row [Dv], p [T − t0], ds [T − t0] (each of
// score_slots) for the queries t0.. that see key j (t0 = j causal, 0 without a mask); p[r] and ds[r] belong to
// query t0 + r, and are 0 when that query's segment starts after j.
template <typename T>
__global__ void attention_dkv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                     const float* __restrict__ lse, const float* __restrict__ delta,
                                     const T* __restrict__ dout, T* __restrict__ dk, T* __restrict__ dv,
                                     const int32_t* __restrict__ segment_start, Strides d, float scale) {
  extern __shared__ float smem[];
  const int64_t j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int64_t t0 = d.first_query(j);
  const int64_t count = d.seq - t0;  // queries t = t0 .. T−1 see key j
  float* k_row = smem;               // [D]
  float* v_row = smem + d.head_dim;  // [Dv]
  float* p = smem + d.head_dim + d.v_dim;  // [T − t0]
  float* ds = p + d.score_slots;           // [T − t0], already scaled by 1/sqrt(D)
  const int64_t kv_off = d.kv_row(b, j, kvh), v_off = d.v_row(b, j, kvh);
  for (int64_t i = threadIdx.x; i < d.head_dim; i += blockDim.x) k_row[i] = load(k + kv_off + i);
  for (int64_t i = threadIdx.x; i < d.v_dim; i += blockDim.x) v_row[i] = load(v + v_off + i);
  const int64_t width = d.head_dim > d.v_dim ? d.head_dim : d.v_dim;  // the slots cover both rows
  float dk_acc[kSlots] = {};
  float dv_acc[kSlots] = {};
  const int64_t q_stride = d.q_heads * d.head_dim, o_stride = d.q_heads * d.v_dim;
  for (int64_t h = kvh * d.group; h < (kvh + 1) * d.group; ++h) {
    __syncthreads();  // k_row/v_row written, or the previous head's p and ds consumed
    for (int64_t r = threadIdx.x; r < count; r += blockDim.x) {
      const int64_t t = t0 + r;
      if (first_key(segment_start, b, t, d.seq) > j) {  // another document: no attention, no gradient
        p[r] = 0.0f;
        ds[r] = 0.0f;
        continue;
      }
      const float pt = expf(dot_row(k_row, q + d.q_row(b, t, h), d.head_dim) * scale - lse[d.stat(b, h, t)]);
      const float dp = dot_row(v_row, dout + d.o_row(b, t, h), d.v_dim);
      p[r] = pt;
      ds[r] = pt * (dp - delta[d.stat(b, h, t)]) * scale;
    }
    __syncthreads();
    const T* q_head = q + d.q_row(b, t0, h);
    const T* do_head = dout + d.o_row(b, t0, h);
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int64_t i = threadIdx.x + slot * static_cast<int64_t>(blockDim.x);
      if (i >= width) break;
      if (i < d.head_dim) {
        for (int64_t r = 0; r < count; ++r) dk_acc[slot] += ds[r] * load(q_head + r * q_stride + i);
      }
      if (i < d.v_dim) {
        for (int64_t r = 0; r < count; ++r) dv_acc[slot] += p[r] * load(do_head + r * o_stride + i);
      }
    }
  }
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) {
    const int64_t i = threadIdx.x + slot * static_cast<int64_t>(blockDim.x);
    if (i >= width) break;
    if (i < d.head_dim) store(dk + kv_off + i, dk_acc[slot]);
    if (i < d.v_dim) store(dv + v_off + i, dv_acc[slot]);
  }
}

// One warp per row (b, t, h) of out [B, T, H, D]: the row's merge weights from lse [B, H, T] (in double, as the CPU
// reference), then its D elements, lane by lane. Every lane reads the row's old lse before lane 0 replaces it.
template <typename T>
__global__ void attention_merge_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ block_out,
                                       const float* __restrict__ block_lse, int64_t rows, int64_t seq, int64_t heads,
                                       int64_t head_dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  if (row >= rows) return;
  const int64_t b = row / (seq * heads), t = row / heads % seq, h = row % heads;
  const int64_t stat = (b * heads + h) * seq + t;
  const float a = lse[stat], c = block_lse[stat];
  if (c == -INFINITY) return;  // nothing new (also when both are −inf)
  T* o = out + row * head_dim;
  const T* ob = block_out + row * head_dim;
  if (a == -INFINITY) {  // nothing so far: the block's row as it is
    for (int64_t i = lane; i < head_dim; i += kWarpSize) o[i] = ob[i];
    if (lane == 0) lse[stat] = c;
    return;
  }
  const double m = fmax(static_cast<double>(a), static_cast<double>(c));
  const double merged = m + log(exp(a - m) + exp(c - m));
  const float wa = static_cast<float>(exp(a - merged)), wc = static_cast<float>(exp(c - merged));
  for (int64_t i = lane; i < head_dim; i += kWarpSize) store(o + i, wa * load(o + i) + wc * load(ob + i));
  __syncwarp();
  if (lane == 0) lse[stat] = static_cast<float>(merged);
}

// Raises a kernel's dynamic shared memory limit above the 48 KiB default when a launch needs more (the
// backend has checked the device's opt-in limit).
template <typename Kernel>
void prepare_shared(Kernel kernel, int64_t bytes) {
  if (bytes > kDefaultSharedBytes) {
    PRIMUS_CUDA_CHECK(gpuFuncSetAttribute(kernel, gpuFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

}  // namespace

template <typename T>
void attention_forward(const KernelContext& ctx, const AttentionShape& shape, const T* q, const T* k, const T* v,
                       T* out, float* lse, const int32_t* segment_start, bool causal) {
  if (shape.batch == 0 || shape.seq == 0 || shape.q_heads == 0) return;
  const int64_t shared = (shape.head_dim + attention_score_slots(shape.seq)) * static_cast<int64_t>(sizeof(float));
  prepare_shared(attention_forward_kernel<T>, shared);  // the q row and the scores: Dv takes no shared memory
  const dim3 grid(static_cast<unsigned>(shape.seq), static_cast<unsigned>(shape.q_heads),
                  static_cast<unsigned>(shape.batch));
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.head_dim));
  attention_forward_kernel<T><<<grid, kThreads, shared, ctx.stream>>>(q, k, v, out, lse, segment_start, ctx.error,
                                                                      strides_of(shape, causal), scale);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_backward(const KernelContext& ctx, const AttentionShape& shape, const T* q, const T* k, const T* v,
                        const T* out, const float* lse, const T* dout, T* dq, T* dk, T* dv,
                        const int32_t* segment_start, bool causal) {
  if (shape.batch == 0 || shape.seq == 0 || shape.q_heads == 0) return;
  const Strides d = strides_of(shape, causal);
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.head_dim));
  DeviceBuffer delta(*ctx.allocator, static_cast<size_t>(shape.batch * shape.q_heads * shape.seq) * sizeof(float));

  const int64_t dq_shared =
      (shape.head_dim + shape.value_dim() + attention_score_slots(shape.seq)) * static_cast<int64_t>(sizeof(float));
  prepare_shared(attention_dq_kernel<T>, dq_shared);
  const dim3 q_grid(static_cast<unsigned>(shape.seq), static_cast<unsigned>(shape.q_heads),
                    static_cast<unsigned>(shape.batch));
  attention_dq_kernel<T><<<q_grid, kThreads, dq_shared, ctx.stream>>>(q, k, v, out, lse, dout, dq, delta.as<float>(),
                                                                       segment_start, ctx.error, d, scale);
  PRIMUS_CUDA_CHECK_LAUNCH();

  const int64_t dkv_shared = attention_shared_bytes(shape);
  prepare_shared(attention_dkv_kernel<T>, dkv_shared);
  const dim3 kv_grid(static_cast<unsigned>(shape.seq), static_cast<unsigned>(shape.kv_heads),
                     static_cast<unsigned>(shape.batch));
  attention_dkv_kernel<T><<<kv_grid, kThreads, dkv_shared, ctx.stream>>>(q, k, v, lse, delta.as<float>(), dout, dk,
                                                                          dv, segment_start, d, scale);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_merge(const KernelContext& ctx, const AttentionShape& shape, T* out, float* lse, const T* block_out,
                     const float* block_lse) {
  const int64_t rows = shape.batch * shape.seq * shape.q_heads;
  if (rows == 0) return;
  constexpr int kRowsPerBlock = kThreads / kWarpSize;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  attention_merge_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(
      out, lse, block_out, block_lse, rows, shape.seq, shape.q_heads, shape.head_dim);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template void attention_forward<float>(const KernelContext&, const AttentionShape&, const float*, const float*,
                                       const float*, float*, float*, const int32_t*, bool);
template void attention_backward<float>(const KernelContext&, const AttentionShape&, const float*, const float*,
                                        const float*, const float*, const float*, const float*, float*, float*, float*,
                                        const int32_t*, bool);
template void attention_forward<bf16>(const KernelContext&, const AttentionShape&, const bf16*, const bf16*,
                                      const bf16*, bf16*, float*, const int32_t*, bool);
template void attention_backward<bf16>(const KernelContext&, const AttentionShape&, const bf16*, const bf16*,
                                       const bf16*, const bf16*, const float*, const bf16*, bf16*, bf16*, bf16*,
                                       const int32_t*, bool);
template void attention_merge<float>(const KernelContext&, const AttentionShape&, float*, float*, const float*,
                                     const float*);
template void attention_merge<bf16>(const KernelContext&, const AttentionShape&, bf16*, float*, const bf16*,
                                    const float*);

}  // namespace primus::cuda
