#include "optim/adamw.h"

#include <cmath>

#include "ops/ops.h"

namespace primus {

AdamW::AdamW(const ParamStore& params, AdamWConfig config)
    : config_(config),
      exp_avg_(ops::zeros({params.numel()}, DType::kF32, params.flat_params().device())),
      exp_avg_sq_(ops::zeros({params.numel()}, DType::kF32, params.flat_params().device())) {}

void AdamW::step(ParamStore& params, double lr) {
  ++steps_taken_;
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    const int64_t n = shape_numel(spec.shape);
    Tensor p = params.param(i).reshape({n});
    Tensor g = params.grad(i).reshape({n});
    Tensor m = exp_avg_.slice_elements(params.offset(i), {n});
    Tensor v = exp_avg_sq_.slice_elements(params.offset(i), {n});
    AdamWArgs args;
    args.param = &p;
    args.grad = &g;
    args.exp_avg = &m;
    args.exp_avg_sq = &v;
    args.lr = static_cast<float>(lr);
    args.beta1 = static_cast<float>(config_.beta1);
    args.beta2 = static_cast<float>(config_.beta2);
    args.eps = static_cast<float>(config_.eps);
    args.weight_decay = spec.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    args.step = steps_taken_;
    ops::adamw_step(args);
  }
}

double clip_grad_norm(ParamStore& params, double max_norm) {
  const double norm = std::sqrt(ops::sum_squares(params.flat_grads()));
  if (max_norm > 0.0) {
    const double coeff = max_norm / (norm + 1e-6);
    if (coeff < 1.0) {
      Tensor grads = params.flat_grads();
      ops::scale_inplace(grads, static_cast<float>(coeff));
    }
  }
  return norm;
}

}  // namespace primus
