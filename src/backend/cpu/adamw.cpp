// AdamW on the CPU with PyTorch's torch.optim.AdamW semantics (decoupled weight decay, bias correction):
//   p ← p · (1 − lr·wd)
//   m ← β1·m + (1 − β1)·g
//   v ← β2·v + (1 − β2)·g²
//   p ← p − lr/(1 − β1^t) · m / (sqrt(v)/sqrt(1 − β2^t) + eps)
// Step-level scalars are computed in double (as PyTorch does in Python) and rounded to fp32 once; the
// per-element update is fp32. The gradient is first multiplied by grad_scale (one fp32 multiply, as a separate
// clipping pass would do). PyTorch's m update is lerp(m, g, 1 − β1), equal up to rounding.
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace primus {

void CpuBackend::adamw_step(const AdamWArgs& args) {
  const int64_t n = args.param->numel();
  float* param = args.param->f32();            // [n]
  const float* grad = args.grad->f32();        // [n]
  float* exp_avg = args.exp_avg->f32();        // [n]
  float* exp_avg_sq = args.exp_avg_sq->f32();  // [n]
  const double lr = args.lr;
  const double step = static_cast<double>(args.step);
  const float decay = static_cast<float>(1.0 - lr * args.weight_decay);
  const float beta1 = args.beta1;
  const float beta2 = args.beta2;
  const float one_minus_beta1 = static_cast<float>(1.0 - args.beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - args.beta2);
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(args.beta1), step)));
  const float bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(args.beta2), step)));
  const float eps = args.eps;
  const float grad_scale = args.grad_scale;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float m = beta1 * exp_avg[i] + one_minus_beta1 * g;
    const float v = beta2 * exp_avg_sq[i] + one_minus_beta2 * (g * g);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    param[i] = param[i] * decay - step_size * (m / denom);
  }
  if (args.compute_copy != nullptr) cast(*args.compute_copy, *args.param);
}

}  // namespace primus
