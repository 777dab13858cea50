#include "layers/linear.h"

#include "ops/ops.h"

namespace primus {

Tensor Linear::forward(const Tensor& x, LinearSaved* /*saved*/) {
  Tensor y = Tensor::empty({x.dim(0), weight_.dim(0)}, x.dtype(), x.device());
  ops::linear_forward(x, weight_, y);
  return y;
}

void Linear::backward(const Tensor& x, const Tensor& dy, Tensor& dx, LinearSaved* /*saved*/) {
  PRIMUS_CHECK(x.defined(), "[linear] backward of a [{}, {}] weight without its input", weight_.dim(0), weight_.dim(1));
  const bool accumulate = dx.defined();
  if (!accumulate) dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  ops::linear_backward(x, weight_, dy, dx, dweight_, accumulate);
}

bool Linear::backward_reads_input(const Tensor& /*x*/, const LinearSaved* /*saved*/) const { return true; }

bool drop_unread_input(const Tensor& x, LinearSaved& saved, std::initializer_list<const Linear*> readers) {
  for (const Linear* reader : readers) {
    if (reader->backward_reads_input(x, &saved)) return false;
  }
  saved.input_dropped = true;
  if (saved.for_backward) saved.for_backward->forget_input();
  return true;
}

}  // namespace primus
