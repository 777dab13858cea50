// Rotary position embedding on the GPU, Hugging Face "rotate half" layout, in place, same arithmetic as the
// CPU backend (src/backend/cpu/rope.cpp): the pair (x[i], x[i + D/2]) of each head vector rotates by
// angle[t, i]; sign −1 applies the inverse rotation (backward). One thread per N pairs, grid-stride.
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

// Each thread rotates N consecutive pairs of one head vector (16-byte accesses when N > 1; N divides half).
template <typename T, int N>
__global__ void rope_kernel(T* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                            int64_t pairs, int64_t seq, int64_t heads, int64_t half, float sign) {
  for (int64_t p = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    const int64_t vector = p / half;  // (b, t, h) flattened
    const int64_t i = p % half;
    const int64_t t = (vector / heads) % seq;
    T* lo = x + vector * 2 * half + i;
    T* hi = lo + half;
    float a[N], b[N], c[N], s[N];
    load_n(lo, a);
    load_n(hi, b);
    load_n(cos + t * half + i, c);
    load_n(sin + t * half + i, s);
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

}  // namespace

template <typename T>
void rope(const KernelContext& ctx, T* x, const float* cos, const float* sin, int64_t batch, int64_t seq, int64_t heads,
          int64_t head_dim, float sign) {
  const int64_t half = head_dim / 2;
  const int64_t pairs = batch * seq * heads * half;
  if (pairs == 0) return;
  constexpr int kThreads = 256;
  with_width<T>(vector_ok<T>(half, x, cos, sin), [&](auto width) {
    constexpr int N = decltype(width)::value;
    rope_kernel<T, N><<<grid_for(pairs / N, kThreads), kThreads, 0, ctx.stream>>>(x, cos, sin, pairs, seq, heads,
                                                                                  half, sign);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template void rope<float>(const KernelContext&, float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                          float);
template void rope<bf16>(const KernelContext&, bf16*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                         float);

}  // namespace primus::cuda
