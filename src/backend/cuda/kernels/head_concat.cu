// Per-head concatenation along the feature dimension on the GPU, same results as the CPU backend
// (src/backend/cpu/head_concat.cpp; backend.h, HeadConcatArgs): multi-head latent attention joins its queries and
// keys from a part without RoPE and a RoPE part, and splits the kv up-projection into keys and values.
//   forward:  out[n, h, :] = (a[n, h, :], b[n, g(h), :]), g(h) = h, or 0 when b has one head shared by every head
//   backward: da[n, h, :] = dout[n, h, :Da]; db[n, g, :] = Σ over the heads h with g(h) = g of dout[n, h, Da:]
// Copies are exact; the shared head's sum runs over h in order 0..H−1 in fp32 from 0, the CPU's order, so f32
// gives the CPU's bits and bf16 rounds that sum once. One thread per output element, grid-stride: these are copies
// of a few MB a layer, bound by memory, not worth tiling.
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kThreads = 256;

// Element e of out [N, H, Da + Db]: from a or from b.
template <typename T>
__global__ void head_concat_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                   HeadConcatShape s) {
  const int64_t width = s.a_dim + s.b_dim;
  const int64_t total = s.rows * s.heads * width;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % width;
    const int64_t vector = e / width;  // n·H + h
    if (i < s.a_dim) {
      out[e] = a[vector * s.a_dim + i];
    } else {
      const int64_t n = vector / s.heads, h = vector % s.heads;
      const int64_t g = s.b_heads == 1 ? 0 : h;
      out[e] = b[(n * s.b_heads + g) * s.b_dim + (i - s.a_dim)];
    }
  }
}

// da: element e of da [N, H, Da], copied from dout.
template <typename T>
__global__ void head_split_a_kernel(const T* __restrict__ dout, T* __restrict__ da, HeadConcatShape s) {
  const int64_t width = s.a_dim + s.b_dim;
  const int64_t total = s.rows * s.heads * s.a_dim;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t vector = e / s.a_dim, i = e % s.a_dim;
    da[e] = dout[vector * width + i];
  }
}

// db: element e of db [N, Hb, Db]: a copy (Hb = H) or the sum over every head in head order (Hb = 1).
template <typename T>
__global__ void head_split_b_kernel(const T* __restrict__ dout, T* __restrict__ db, HeadConcatShape s) {
  const int64_t width = s.a_dim + s.b_dim;
  const int64_t total = s.rows * s.b_heads * s.b_dim;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t vector = e / s.b_dim, i = e % s.b_dim;  // vector: n·Hb + g
    if (s.b_heads != 1) {
      db[e] = dout[vector * width + s.a_dim + i];
      continue;
    }
    const T* column = dout + vector * s.heads * width + s.a_dim + i;  // vector = n: dout[n, 0, Da + i]
    float sum = 0.0f;
    for (int64_t h = 0; h < s.heads; ++h) sum += load(column + h * width);
    store(db + e, sum);
  }
}

}  // namespace

template <typename T>
void head_concat(const KernelContext& ctx, const HeadConcatShape& shape, const T* a, const T* b, T* out) {
  const int64_t total = shape.rows * shape.heads * (shape.a_dim + shape.b_dim);
  if (total == 0) return;
  head_concat_kernel<T><<<grid_for(total, kThreads), kThreads, 0, ctx.stream>>>(a, b, out, shape);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void head_concat_backward(const KernelContext& ctx, const HeadConcatShape& shape, const T* dout, T* da, T* db) {
  const int64_t a_total = shape.rows * shape.heads * shape.a_dim;
  const int64_t b_total = shape.rows * shape.b_heads * shape.b_dim;
  if (a_total > 0) {
    head_split_a_kernel<T><<<grid_for(a_total, kThreads), kThreads, 0, ctx.stream>>>(dout, da, shape);
    PRIMUS_CUDA_CHECK_LAUNCH();
  }
  if (b_total > 0) {
    head_split_b_kernel<T><<<grid_for(b_total, kThreads), kThreads, 0, ctx.stream>>>(dout, db, shape);
    PRIMUS_CUDA_CHECK_LAUNCH();
  }
}

template void head_concat<float>(const KernelContext&, const HeadConcatShape&, const float*, const float*, float*);
template void head_concat<bf16>(const KernelContext&, const HeadConcatShape&, const bf16*, const bf16*, bf16*);
template void head_concat_backward<float>(const KernelContext&, const HeadConcatShape&, const float*, float*, float*);
template void head_concat_backward<bf16>(const KernelContext&, const HeadConcatShape&, const bf16*, bf16*, bf16*);

}  // namespace primus::cuda
