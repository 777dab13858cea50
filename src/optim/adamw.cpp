#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"

namespace primus {

AdamW::AdamW(const ParamStore& params, AdamWConfig config)
    : config_(config),
      exp_avg_(ops::zeros({params.numel()}, DType::kF32, params.flat_params().device())),
      exp_avg_sq_(ops::zeros({params.numel()}, DType::kF32, params.flat_params().device())) {}

void AdamW::step(ParamStore& params, double lr, double grad_scale, Tensor* compute_copy) {
  ++steps_taken_;
  const std::vector<ParamSpec>& specs = params.specs();
  for (size_t first = 0; first < specs.size();) {
    // A run of adjacent tensors with the same weight decay is one contiguous range of the flat buffers.
    size_t end = first + 1;
    while (end < specs.size() && specs[end].weight_decay == specs[first].weight_decay) ++end;
    const int64_t offset = params.offset(first);
    const int64_t n = params.offset(end - 1) + shape_numel(specs[end - 1].shape) - offset;
    Tensor p = params.flat_params().slice_elements(offset, {n});
    Tensor g = params.flat_grads().slice_elements(offset, {n});
    Tensor m = exp_avg_.slice_elements(offset, {n});
    Tensor v = exp_avg_sq_.slice_elements(offset, {n});
    Tensor copy = compute_copy != nullptr ? compute_copy->slice_elements(offset, {n}) : Tensor();
    AdamWArgs args;
    args.param = &p;
    args.grad = &g;
    args.exp_avg = &m;
    args.exp_avg_sq = &v;
    args.lr = static_cast<float>(lr);
    args.beta1 = static_cast<float>(config_.beta1);
    args.beta2 = static_cast<float>(config_.beta2);
    args.eps = static_cast<float>(config_.eps);
    args.weight_decay = specs[first].weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    args.step = steps_taken_;
    args.grad_scale = static_cast<float>(grad_scale);
    args.compute_copy = compute_copy != nullptr ? &copy : nullptr;
    ops::adamw_step(args);
    first = end;
  }
}

GradClip clip_grad_norm(const ParamStore& params, double max_norm) {
  GradClip clip;
  clip.norm = std::sqrt(ops::sum_squares(params.flat_grads()));
  if (max_norm > 0.0) clip.scale = std::min(1.0, max_norm / (clip.norm + 1e-6));
  return clip;
}

}  // namespace primus
