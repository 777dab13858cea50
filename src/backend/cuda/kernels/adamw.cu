// AdamW on the GPU: one thread per element, grid-stride, same per-element fp32 arithmetic as the CPU backend
// (src/backend/cpu/adamw.cpp); the step scalars arrive precomputed on the host.
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, int64_t n, AdamWScalars s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float m = s.beta1 * exp_avg[i] + s.one_minus_beta1 * g;
    const float v = s.beta2 * exp_avg_sq[i] + s.one_minus_beta2 * (g * g);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
    param[i] = param[i] * s.decay - s.step_size * (m / denom);
  }
}

}  // namespace

void adamw_step(const KernelContext& ctx, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWScalars& s) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(param, grad, exp_avg, exp_avg_sq, n, s);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace primus::cuda
