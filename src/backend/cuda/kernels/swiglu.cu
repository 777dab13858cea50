// SwiGLU on the GPU, element-wise, same formulas as the CPU backend (src/backend/cpu/swiglu.cpp):
//   out = g·σ(g)·up;   dup = dout·g·σ(g);   dgate = dout·up·σ(g)·(1 + g·(1 − σ(g)))
// σ(g) = 1/(1 + e^−g) with the accurate expf (e^−g → inf for very negative g gives σ = 0, as on the CPU).
// The input is packed per row, gate (F values) then up (F values), and so is the gradient, which may be
// written over the input: each thread reads its gate and up values before writing their gradients, so those
// pointers carry no __restrict__.
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// N consecutive columns of one row per thread and iteration (16-byte accesses when N > 1; N divides f).
template <typename T, int N>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t n, int64_t f) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    const T* gate = gate_up + (i / f) * 2 * f + i % f;
    float g[N], u[N];
    load_n(gate, g);
    load_n(gate + f, u);
#pragma unroll
    for (int k = 0; k < N; ++k) u[k] *= g[k] * sigmoid(g[k]);
    store_n(out + i, u);
  }
}

template <typename T, int N>
__global__ void swiglu_backward_kernel(const T* gate_up, const T* __restrict__ dout, T* dgate_up, int64_t n,
                                       int64_t f) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    const int64_t at = (i / f) * 2 * f + i % f;  // the gate's position in the packed row
    float g[N], u[N], d[N];
    load_n(gate_up + at, g);
    load_n(gate_up + at + f, u);
    load_n(dout + i, d);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float sig = sigmoid(g[k]);
      const float dg = d[k] * u[k] * sig * (1.0f + g[k] * (1.0f - sig));
      u[k] = d[k] * (g[k] * sig);  // dup
      g[k] = dg;
    }
    store_n(dgate_up + at, g);
    store_n(dgate_up + at + f, u);
  }
}

}  // namespace

template <typename T>
void swiglu_forward(const KernelContext& ctx, const T* gate_up, T* out, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  if (n == 0) return;
  constexpr int kThreads = 256;
  with_width<T>(vector_ok<T>(f, gate_up, out), [&](auto width) {
    constexpr int N = decltype(width)::value;
    swiglu_forward_kernel<T, N><<<grid_for(n / N, kThreads), kThreads, 0, ctx.stream>>>(gate_up, out, n, f);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_backward(const KernelContext& ctx, const T* gate_up, const T* dout, T* dgate_up, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  if (n == 0) return;
  constexpr int kThreads = 256;
  with_width<T>(vector_ok<T>(f, gate_up, dout, dgate_up), [&](auto width) {
    constexpr int N = decltype(width)::value;
    swiglu_backward_kernel<T, N><<<grid_for(n / N, kThreads), kThreads, 0, ctx.stream>>>(gate_up, dout, dgate_up, n,
                                                                                          f);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template void swiglu_forward<float>(const KernelContext&, const float*, float*, int64_t, int64_t);
template void swiglu_backward<float>(const KernelContext&, const float*, const float*, float*, int64_t, int64_t);
template void swiglu_forward<bf16>(const KernelContext&, const bf16*, bf16*, int64_t, int64_t);
template void swiglu_backward<bf16>(const KernelContext&, const bf16*, const bf16*, bf16*, int64_t, int64_t);

}  // namespace primus::cuda
