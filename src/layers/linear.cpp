#include "layers/linear.h"

#include "ops/ops.h"

namespace primus {

Tensor Linear::forward(const Tensor& x, LinearSaved* /*saved*/) {
  Tensor y = Tensor::empty({x.dim(0), weight_.dim(0)}, x.dtype(), x.device());
  ops::linear_forward(x, weight_, y);
  return y;
}

void Linear::backward(const Tensor& x, const Tensor& dy, Tensor& dx, LinearSaved* /*saved*/) {
  const bool accumulate = dx.defined();
  if (!accumulate) dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  ops::linear_backward(x, weight_, dy, dx, dweight_, accumulate);
}

}  // namespace primus
