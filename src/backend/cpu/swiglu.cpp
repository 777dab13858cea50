// SwiGLU on the CPU: out = silu(gate) ⊙ up, silu(g) = g · σ(g). Backward:
//   dup   = dout ⊙ silu(gate)
//   dgate = dout ⊙ up ⊙ σ(g) · (1 + g · (1 − σ(g)))
// Element-wise over any shape; both gradients are overwritten.
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

// 1 / (1 + e^-g): e^-g overflows to inf for very negative g, which correctly gives 0.
inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

void CpuBackend::swiglu_forward(const SwiGluArgs& args) {
  const int64_t n = args.gate->numel();
  const float* gate = args.gate->f32();  // [N, F]
  const float* up = args.up->f32();      // [N, F]
  float* out = args.out->f32();          // [N, F]
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

void CpuBackend::swiglu_backward(const SwiGluArgs& args) {
  const int64_t n = args.gate->numel();
  const float* gate = args.gate->f32();  // [N, F]
  const float* up = args.up->f32();      // [N, F]
  const float* dout = args.dout->f32();  // [N, F]
  float* dgate = args.dgate->f32();      // [N, F]
  float* dup = args.dup->f32();          // [N, F]
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float sig = sigmoid(g);
    const float d = dout[i];
    const float u = up[i];
    dup[i] = d * (g * sig);
    dgate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
  }
}

}  // namespace primus
