#include "layers/tensor_parallel.h"

#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

namespace {

Stream compute_stream(const Tensor& x) { return backend_for(x.device()).stream(StreamKind::kCompute); }

}  // namespace

void TensorParallelGroup::sum(Tensor& x) const {
  if (size() == 1) return;
  const ops::ProfileScope scope("tensor parallel: all_reduce");
  comm_->all_reduce(x, ReduceOp::kSum, compute_stream(x));
}

void TensorParallelGroup::max(Tensor& x) const {
  if (size() == 1) return;
  const ops::ProfileScope scope("tensor parallel: all_reduce max");
  comm_->all_reduce(x, ReduceOp::kMax, compute_stream(x));
}

Tensor TensorParallelGroup::gather_columns(const Tensor& x) const {
  if (size() == 1) return x;
  const ops::ProfileScope scope("tensor parallel: all_gather");
  const int64_t n = x.dim(0), c = x.dim(1);
  Tensor gathered = Tensor::empty({size() * n, c}, x.dtype(), x.device());  // rank-major: [size, n, c]
  comm_->all_gather(x, gathered, compute_stream(x));
  Tensor out = Tensor::empty({n, size() * c}, x.dtype(), x.device());
  for (int r = 0; r < size(); ++r) {
    for (int64_t row = 0; row < n; ++row) {  // only for sampling's few rows
      Tensor dst = out.slice_elements(row * size() * c + r * c, {c});
      ops::copy(dst, gathered.slice_elements((r * n + row) * c, {c}));
    }
  }
  return out;
}

Tensor TensorParallelGroup::gather_rows(const Tensor& x) const {
  if (size() == 1) return x;
  const ops::ProfileScope scope("tensor parallel: all_gather rows");
  Shape shape = x.shape();
  shape[0] *= size();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());  // rank-major blocks are the rows in order
  comm_->all_gather(x, out, compute_stream(x));
  return out;
}

Tensor TensorParallelGroup::reduce_scatter_rows(const Tensor& x) const {
  if (size() == 1) return x;
  PRIMUS_CHECK(x.dim(0) % size() == 0, "[tensor parallel] {} rows do not split over {} ranks", x.describe(), size());
  const ops::ProfileScope scope("tensor parallel: reduce_scatter rows");
  Shape shape = x.shape();
  shape[0] /= size();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  comm_->reduce_scatter(x, out, ReduceOp::kSum, compute_stream(x));
  return out;
}

}  // namespace primus
