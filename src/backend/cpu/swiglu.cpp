// SwiGLU on the CPU: out = silu(gate) ⊙ up, silu(g) = g · σ(g). Backward:
//   dup   = dout ⊙ silu(gate)
//   dgate = dout ⊙ up ⊙ σ(g) · (1 + g · (1 − σ(g)))
// The input is packed per row: the gate (F values) then up (F values); the gradient has the same layout and is
// overwritten (it may be the input itself).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

// 1 / (1 + e^-g): e^-g overflows to inf for very negative g, which correctly gives 0.
inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

void CpuBackend::swiglu_forward(const SwiGluArgs& args) {
  const int64_t f = args.out->dim(-1);
  const int64_t rows = args.out->numel() / std::max<int64_t>(f, 1);
  const float* gate_up = args.gate_up->f32();  // [N, 2F]
  float* out = args.out->f32();                // [N, F]
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * 2 * f;
    const float* up = gate + f;
    for (int64_t i = 0; i < f; ++i) out[r * f + i] = gate[i] * sigmoid(gate[i]) * up[i];
  }
}

void CpuBackend::swiglu_backward(const SwiGluArgs& args) {
  const int64_t f = args.dout->dim(-1);
  const int64_t rows = args.dout->numel() / std::max<int64_t>(f, 1);
  const float* gate_up = args.gate_up->f32();  // [N, 2F]
  const float* dout = args.dout->f32();        // [N, F]
  float* dgate_up = args.dgate_up->f32();      // [N, 2F], possibly gate_up: each pair is read before it is written
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < f; ++i) {
      const float g = gate_up[r * 2 * f + i];
      const float u = gate_up[r * 2 * f + f + i];
      const float sig = sigmoid(g);
      const float d = dout[r * f + i];
      dgate_up[r * 2 * f + f + i] = d * (g * sig);
      dgate_up[r * 2 * f + i] = d * u * sig * (1.0f + g * (1.0f - sig));
    }
  }
}

}  // namespace primus
