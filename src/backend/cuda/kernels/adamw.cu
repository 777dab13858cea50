// AdamW on the GPU: grid-stride with 16-byte accesses where the buffers allow, the same per-element fp32
// arithmetic as the CPU backend (src/backend/cpu/adamw.cpp); the step scalars arrive precomputed on the host.
// The clip factor is applied as the gradient is read and the bf16 compute copy written as the update is: one
// pass over the optimizer state per step.
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

// N consecutive elements per thread and iteration (16-byte accesses when N > 1); n is a multiple of N.
template <int N>
__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, bf16* __restrict__ compute_copy, int64_t n,
                             AdamWScalars s) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    float p[N], g[N], m[N], v[N];
    load_n(param + i, p);
    load_n(grad + i, g);
    load_n(exp_avg + i, m);
    load_n(exp_avg_sq + i, v);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float gk = g[k] * s.grad_scale;
      m[k] = s.beta1 * m[k] + s.one_minus_beta1 * gk;
      v[k] = s.beta2 * v[k] + s.one_minus_beta2 * (gk * gk);
      const float denom = sqrtf(v[k]) / s.bias_correction2_sqrt + s.eps;
      p[k] = p[k] * s.decay - s.step_size * (m[k] / denom);
    }
    store_n(exp_avg + i, m);
    store_n(exp_avg_sq + i, v);
    store_n(param + i, p);
    if (compute_copy == nullptr) continue;
    if constexpr (N == 4) {  // four bf16: one 8-byte store
      const uint2 packed = make_uint2(f32_to_bf16(p[0]) | (static_cast<uint32_t>(f32_to_bf16(p[1])) << 16),
                                      f32_to_bf16(p[2]) | (static_cast<uint32_t>(f32_to_bf16(p[3])) << 16));
      *reinterpret_cast<uint2*>(compute_copy + i) = packed;
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) store(compute_copy + i + k, p[k]);
    }
  }
}

}  // namespace

void adamw_step(const KernelContext& ctx, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                bf16* compute_copy, int64_t n, const AdamWScalars& s) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const bool copy_ok = compute_copy == nullptr || reinterpret_cast<uintptr_t>(compute_copy) % 8 == 0;
  with_width<float>(copy_ok && vector_ok<float>(n, param, grad, exp_avg, exp_avg_sq), [&](auto width) {
    constexpr int N = decltype(width)::value;
    adamw_kernel<N><<<grid_for(n / N, kThreads), kThreads, 0, ctx.stream>>>(param, grad, exp_avg, exp_avg_sq,
                                                                             compute_copy, n, s);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace primus::cuda
