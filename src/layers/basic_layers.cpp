#include "layers/basic_layers.h"

#include <algorithm>

#include "ops/ops.h"

namespace primus {

Tensor Embedding::forward(const Tensor& ids) {
  Tensor out = Tensor::empty({ids.numel(), table.dim(1)}, table.dtype(), table.device());
  ops::embedding_forward(ids, table, out, vocab);
  tp.sum(out);
  return out;
}

void Embedding::backward(const Tensor& ids, const Tensor& dout) { ops::embedding_backward(ids, dout, dtable, vocab); }

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

namespace {

// Rows per logits chunk: as many as fit the budget, a multiple of 64 when there is room (GEMM tiles).
int64_t logits_chunk_rows(int64_t max_bytes, int64_t rows, int64_t vocab, DType dtype) {
  int64_t chunk = max_bytes / std::max<int64_t>(1, vocab * static_cast<int64_t>(dtype_size(dtype)));
  if (chunk >= 64) chunk = chunk / 64 * 64;
  return std::clamp<int64_t>(chunk, 1, std::max<int64_t>(rows, 1));
}

// Calls each(r0, r1) for consecutive row ranges of at most `chunk` rows covering [0, rows).
template <typename F>
void for_each_chunk(int64_t rows, int64_t chunk, F&& each) {
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) each(r0, std::min(rows, r0 + chunk));
}

Tensor rows_of(const Tensor& t, int64_t r0, int64_t r1) {
  if (t.ndim() == 1) return t.slice_elements(r0, {r1 - r0});
  return t.slice_elements(r0 * t.dim(1), {r1 - r0, t.dim(1)});
}

}  // namespace

Tensor LmLoss::forward_with_grad(const Tensor& hidden, const Tensor& targets, float grad_scale,
                                 LmLossSaved& saved) {
  const int64_t n = hidden.dim(0), columns = head.dim(0);
  const int64_t chunk = logits_chunk_rows(max_logits_bytes, n, columns, hidden.dtype());
  Tensor losses = Tensor::empty({n}, DType::kF32, hidden.device());
  Tensor lse = Tensor::empty({n}, DType::kF32, hidden.device());
  Tensor logits_buffer = Tensor::empty({chunk, columns}, hidden.dtype(), hidden.device());
  saved.dhidden = Tensor::empty(hidden.shape(), hidden.dtype(), hidden.device());
  for_each_chunk(n, chunk, [&](int64_t r0, int64_t r1) {
    const Tensor h = rows_of(hidden, r0, r1);
    const Tensor t = rows_of(targets, r0, r1);
    Tensor chunk_lse = rows_of(lse, r0, r1);
    Tensor chunk_losses = rows_of(losses, r0, r1);
    Tensor chunk_dhidden = rows_of(saved.dhidden, r0, r1);
    Tensor logits = rows_of(logits_buffer, 0, r1 - r0);
    ops::linear_forward(h, head, logits);
    if (tp.size() == 1) {
      ops::cross_entropy_forward_backward(logits, t, chunk_losses, chunk_lse, grad_scale, logits);  // dlogits in place
    } else {
      losses_of_chunk(logits, t, chunk_losses, chunk_lse);
      ops::cross_entropy_backward(logits, t, chunk_lse, grad_scale, logits, vocab);
    }
    ops::linear_backward(h, head, logits, chunk_dhidden, dhead);
  });
  if (!dhidden_partial) tp.sum(saved.dhidden);  // each rank's vocabulary columns give part of it
  return losses;
}

void LmLoss::losses_of_chunk(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse) const {
  if (tp.size() == 1) {
    ops::cross_entropy_forward(logits, targets, losses, lse);
    return;
  }
  const int64_t n = logits.dim(0);
  Tensor max = Tensor::empty({n}, DType::kF32, logits.device());
  ops::row_max(logits, max);
  tp.max(max);
  // Σ exp(logit − max) over this rank's columns and the target's logit where this rank holds it: one reduction.
  Tensor stats = Tensor::empty({2, n}, DType::kF32, logits.device());
  Tensor sum_exp = stats.slice_elements(0, {n});
  Tensor target_logit = stats.slice_elements(n, {n});
  ops::cross_entropy_shard_stats(logits, targets, vocab, max, sum_exp, target_logit);
  tp.sum(stats);
  ops::cross_entropy_finish(max, sum_exp, target_logit, targets, losses, lse);
}

Tensor LmLoss::forward(const Tensor& hidden, const Tensor& targets) const {
  const int64_t n = hidden.dim(0), columns = head.dim(0);
  const int64_t chunk = logits_chunk_rows(max_logits_bytes, n, columns, hidden.dtype());
  Tensor losses = Tensor::empty({n}, DType::kF32, hidden.device());
  Tensor lse = Tensor::empty({n}, DType::kF32, hidden.device());
  Tensor logits_buffer = Tensor::empty({chunk, columns}, hidden.dtype(), hidden.device());
  for_each_chunk(n, chunk, [&](int64_t r0, int64_t r1) {
    Tensor chunk_lse = rows_of(lse, r0, r1);
    Tensor chunk_losses = rows_of(losses, r0, r1);
    Tensor logits = rows_of(logits_buffer, 0, r1 - r0);
    ops::linear_forward(rows_of(hidden, r0, r1), head, logits);
    losses_of_chunk(logits, rows_of(targets, r0, r1), chunk_losses, chunk_lse);
  });
  return losses;
}

Tensor LmLoss::backward(LmLossSaved& saved) const {
  Tensor dhidden = saved.dhidden;
  saved.dhidden = Tensor();
  return dhidden;
}

Tensor LmLoss::logits(const Tensor& hidden) const {
  Tensor out = Tensor::empty({hidden.dim(0), head.dim(0)}, hidden.dtype(), hidden.device());
  ops::linear_forward(hidden, head, out);
  return out;
}

}  // namespace primus
