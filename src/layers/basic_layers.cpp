#include "layers/basic_layers.h"

#include "ops/ops.h"

namespace primus {

Tensor Embedding::forward(const Tensor& ids) {
  Tensor out = Tensor::empty({ids.numel(), table.dim(1)}, table.dtype(), table.device());
  ops::embedding_forward(ids, table, out);
  return out;
}

void Embedding::backward(const Tensor& ids, const Tensor& dout) { ops::embedding_backward(ids, dout, dtable); }

Tensor RmsNorm::forward(const Tensor& x, RmsNormSaved& saved) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  saved.x = x;
  saved.rstd = Tensor::empty({x.dim(0)}, DType::kF32, x.device());
  ops::rmsnorm_forward(x, weight, eps, y, saved.rstd);
  return y;
}

Tensor RmsNorm::backward(const Tensor& dy, const RmsNormSaved& saved) {
  Tensor dx = Tensor::empty(saved.x.shape(), dy.dtype(), dy.device());
  ops::rmsnorm_backward(dy, saved.x, weight, saved.rstd, dx, dweight);
  return dx;
}

Tensor LmLoss::forward(const Tensor& hidden, const Tensor& targets, LmLossSaved& saved) {
  const int64_t n = hidden.dim(0);
  saved.hidden = hidden;
  saved.targets = targets;
  saved.logits = Tensor::empty({n, head.dim(0)}, hidden.dtype(), hidden.device());
  saved.lse = Tensor::empty({n}, DType::kF32, hidden.device());
  ops::linear_forward(hidden, head, saved.logits);
  Tensor losses = Tensor::empty({n}, DType::kF32, hidden.device());
  ops::cross_entropy_forward(saved.logits, saved.targets, losses, saved.lse);
  return losses;
}

Tensor LmLoss::backward(float grad_scale, LmLossSaved& saved) {
  Tensor& dlogits = saved.logits;  // overwritten in place: the logits are not needed afterwards
  ops::cross_entropy_backward(saved.logits, saved.targets, saved.lse, grad_scale, dlogits);
  Tensor dhidden = Tensor::empty(saved.hidden.shape(), dlogits.dtype(), dlogits.device());
  ops::linear_backward(saved.hidden, head, dlogits, dhidden, dhead);
  saved.logits = Tensor();
  return dhidden;
}

}  // namespace primus
