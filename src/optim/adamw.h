// AdamW over a flat ParamStore: fp32 moments in two buffers laid out like the parameters, decoupled
// weight decay on the tensors whose spec asks for it, and global-norm gradient clipping.
#pragma once

#include "ops/param_store.h"

namespace primus {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

class AdamW {
 public:
  AdamW(const ParamStore& params, AdamWConfig config);

  // One update with learning rate `lr`, gradients multiplied by grad_scale as they are read (the clip factor);
  // increments the step count used for bias correction. compute_copy (optional, bf16 [numel]) receives the
  // updated weights rounded. Adjacent tensors with the same weight decay share one launch.
  void step(ParamStore& params, double lr, double grad_scale = 1.0, Tensor* compute_copy = nullptr);

  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t n) { steps_taken_ = n; }
  const Tensor& exp_avg() const { return exp_avg_; }        // [numel] f32
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }  // [numel] f32

 private:
  AdamWConfig config_;
  int64_t steps_taken_ = 0;
  Tensor exp_avg_;
  Tensor exp_avg_sq_;
};

// Global-norm clipping as torch.nn.utils.clip_grad_norm_ does it: the L2 norm of all gradients and the factor
// max_norm / (norm + 1e-6) when max_norm > 0 and that is below 1, else 1. The factor goes to AdamW::step,
// which applies it as it reads the gradients (the gradients themselves are left unscaled).
struct GradClip {
  double norm = 0.0;
  double scale = 1.0;
};
GradClip clip_grad_norm(const ParamStore& params, double max_norm);

}  // namespace primus
