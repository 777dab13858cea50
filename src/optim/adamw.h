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

  // One update with learning rate `lr`; increments the step count used for bias correction.
  void step(ParamStore& params, double lr);

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

// L2 norm of all gradients, then (when max_norm > 0) scales them by max_norm / (norm + 1e-6) if that is
// below 1, as torch.nn.utils.clip_grad_norm_ does. Returns the norm before clipping.
double clip_grad_norm(ParamStore& params, double max_norm);

}  // namespace primus
