// Rotary position embedding on the GPU, in place, same arithmetic as the CPU backend (src/backend/cpu/rope.cpp):
// the pair (x[i], x[i + D/2]) of each head vector (Hugging Face's "rotate half"), or interleaved the pair
// (x[2i], x[2i + 1]) (DeepSeek's checkpoint order, multi-head latent attention), rotates by angle[p, i], p = t or
// positions[b, t]; sign −1 applies the inverse rotation (backward). One thread per N pairs, grid-stride.
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

// Each thread rotates N consecutive pairs of one head vector (16-byte accesses when N > 1; N divides half).
template <typename T, int N>
__global__ void rope_kernel(T* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                            const int32_t* __restrict__ positions, int64_t pairs, int64_t seq, int64_t heads,
                            int64_t half, int64_t rows, float sign, DeviceError* error) {
  for (int64_t p = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    const int64_t vector = p / half;  // (b, t, h) flattened
    const int64_t i = p % half;
    const int64_t token = vector / heads;  // b·T + t
    int64_t row = token % seq;
    if (positions != nullptr) {
      row = positions[token];
      if (row < 0 || row >= rows) {
        record_error(error, kRopePosition, token, row, rows);
        continue;
      }
    }
    T* lo = x + vector * 2 * half + i;
    T* hi = lo + half;
    float a[N], b[N], c[N], s[N];
    load_n(lo, a);
    load_n(hi, b);
    load_n(cos + row * half + i, c);
    load_n(sin + row * half + i, s);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float sk = sign * s[k];
      const float rotated_lo = a[k] * c[k] - b[k] * sk;
      b[k] = b[k] * c[k] + a[k] * sk;
      a[k] = rotated_lo;
    }
    store_n(lo, a);
    store_n(hi, b);
  }
}

// Interleaved pairs: each thread rotates N consecutive pairs, the 2N consecutive features x[2i .. 2i + 2N) of one
// head vector (16-byte accesses when N > 1; N divides half).
template <typename T, int N>
__global__ void rope_interleaved_kernel(T* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                                        const int32_t* __restrict__ positions, int64_t pairs, int64_t seq,
                                        int64_t heads, int64_t half, int64_t rows, float sign, DeviceError* error) {
  for (int64_t p = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    const int64_t vector = p / half;  // (b, t, h) flattened
    const int64_t i = p % half;
    const int64_t token = vector / heads;  // b·T + t
    int64_t row = token % seq;
    if (positions != nullptr) {
      row = positions[token];
      if (row < 0 || row >= rows) {
        record_error(error, kRopePosition, token, row, rows);
        continue;
      }
    }
    T* features = x + vector * 2 * half + 2 * i;
    float v[2 * N], c[N], s[N];
    load_n(features, v);
    load_n(cos + row * half + i, c);
    load_n(sin + row * half + i, s);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float a = v[2 * k], b = v[2 * k + 1];
      const float sk = sign * s[k];
      v[2 * k] = a * c[k] - b * sk;
      v[2 * k + 1] = b * c[k] + a * sk;
    }
    store_n(features, v);
  }
}

}  // namespace

template <typename T>
void rope(const KernelContext& ctx, const RopeShape& shape, T* x, const float* cos, const float* sin,
          const int32_t* positions, float sign) {
  const int64_t half = shape.head_dim / 2;
  const int64_t pairs = shape.batch * shape.seq * shape.heads * half;
  if (pairs == 0) return;
  constexpr int kThreads = 256;
  with_width<T>(vector_ok<T>(half, x, cos, sin), [&](auto width) {
    constexpr int N = decltype(width)::value;
    if (shape.interleaved) {
      rope_interleaved_kernel<T, N><<<grid_for(pairs / N, kThreads), kThreads, 0, ctx.stream>>>(
          x, cos, sin, positions, pairs, shape.seq, shape.heads, half, shape.rows, sign, ctx.error);
    } else {
      rope_kernel<T, N><<<grid_for(pairs / N, kThreads), kThreads, 0, ctx.stream>>>(
          x, cos, sin, positions, pairs, shape.seq, shape.heads, half, shape.rows, sign, ctx.error);
    }
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template void rope<float>(const KernelContext&, const RopeShape&, float*, const float*, const float*, const int32_t*,
                          float);
template void rope<bf16>(const KernelContext&, const RopeShape&, bf16*, const float*, const float*, const int32_t*,
                         float);

}  // namespace primus::cuda
