// A Linear whose three GEMMs run on fp8 operands (docs/fp8.md), put in place of a model's Linear module from outside
// (Model::for_each_linear), on the same weight and gradient views:
//   forward  y  = x · Wᵀ     x and W quantised in the forward format
//   dgrad    dx = dy · W     dy in the backward format (e5m2 under hybrid), W through its transposed copy
//   wgrad    dW += dyᵀ · x   the transposed copies of dy and x; the fp32 gradient accumulates as before
// Like Linear it keeps nothing per micro-batch itself. Given the caller's LinearSaved for x, the forward quantises x
// once into both copies and keeps them there: the codes of x for the other modules reading x (q, k and v share
// one input), the codes of xᵀ for the backwards, which then need no x: the layer frees its bf16 x after the forwards
// (drop_unread_input) and hands backward an undefined one. Without it (or for an x it did not quantise) backward
// quantises x again with the same scales as forward (the delayed recipe's scales change only between steps; current
// scaling recomputes the same amax from the same values), with identical codes. W's two copies are quantised once a
// step, at its first forward, and kept for every micro-batch's GEMMs until the optimizer changes the weights
// (Fp8Scaling::weights_generation). The master weights, the gradients and the optimizer stay fp32; the GEMM outputs
// have the activations' dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "layers/fp8_scaling.h"
#include "layers/linear.h"

namespace primus {

class Fp8Linear : public Linear {
 public:
  // Takes over `plain`'s weight and gradient views; `name` is the module's (Hugging Face) name, for the scaling
  // state and errors. `input_name` names x's delayed-scaling state ("{name}.input" when empty): modules reading
  // one input give the same name, so they share its scale and its codes.
  Fp8Linear(const Linear& plain, std::shared_ptr<Fp8Scaling> scaling, const std::string& name,
            const std::string& input_name = "");

  Tensor forward(const Tensor& x, LinearSaved* saved = nullptr) override;
  void backward(const Tensor& x, const Tensor& dy, Tensor& dx, LinearSaved* saved = nullptr) override;
  // False once `saved` holds the codes of x's transpose this module's backward reads.
  bool backward_reads_input(const Tensor& x, const LinearSaved* saved) const override;

 private:
  struct WeightCodes;  // fp8_linear.cpp
  const WeightCodes& weight_codes();

  std::shared_ptr<Fp8Scaling> scaling_;
  std::string name_;
  std::shared_ptr<WeightCodes> weight_codes_;  // this step's, or stale (generation below the scaling's)
  int input_handle_ = -1, weight_handle_ = -1, grad_handle_ = -1;  // delayed recipe: the tensors' handles in scaling_
};

}  // namespace primus
