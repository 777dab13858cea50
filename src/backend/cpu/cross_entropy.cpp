// Softmax cross-entropy on the CPU, one row per token:
//   lse = max + log Σ exp(logit − max)      (sum in double)
//   loss = lse − logit[target]              (0 for rows whose target is negative: ignored)
//   dlogits = grad_scale · (exp(logit − lse) − onehot(target))   (0 rows when ignored)
// lse is written for every row, ignored or not. Backward reads each logit before writing the same element, so
// dlogits may alias logits (saves a [N, V] buffer for large vocabularies).
//
// Vocabulary-parallel steps (backend.h): the same formulas with the row's max, Σ exp and target logit split over
// the ranks that hold its columns: row_max and cross_entropy_shard_stats produce one shard's part, the loss layer
// reduces them over its group, cross_entropy_finish forms lse and the loss, and backward with a shard writes this
// shard's columns, the one-hot term only where the target's column lies here. With the shard {0, V} the steps give
// today's lse and losses up to the rounding of Σ exp to f32 between them, and the same dlogits.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

void check_targets(const int32_t* targets, int64_t rows, int64_t vocab, const char* op) {
  for (int64_t r = 0; r < rows; ++r) {
    PRIMUS_CHECK(targets[r] < vocab, "[op {}] target {} at row {} is outside the vocabulary [0, {})", op, targets[r], r,
                 vocab);
  }
}

// The column of a target in a shard's logits, or -1 when it is negative (ignored) or another shard's.
int64_t local_column(int32_t target, VocabShard shard, int64_t columns) {
  const int64_t column = static_cast<int64_t>(target) - shard.begin;
  return target >= 0 && column >= 0 && column < columns ? column : -1;
}

// Σ exp(x − max) over a row, in double.
double sum_exp_of(const float* row, int64_t columns, float max) {
  double sum = 0.0;
  for (int64_t v = 0; v < columns; ++v) sum += std::exp(row[v] - max);
  return sum;
}

}  // namespace

void CpuBackend::cross_entropy_forward(const CrossEntropyArgs& args) {
  const int64_t vocab = args.logits->dim(-1);
  const int64_t rows = args.targets->numel();
  const float* logits = args.logits->f32();      // [N, V]
  const int32_t* targets = args.targets->i32();  // [N]
  float* losses = args.losses->f32();            // [N]
  float* lse = args.lse->f32();                  // [N]
  check_targets(targets, rows, vocab, "cross_entropy_forward");
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    const float max = *std::max_element(row, row + vocab);
    const float row_lse = static_cast<float>(max + std::log(sum_exp_of(row, vocab, max)));
    lse[r] = row_lse;
    losses[r] = targets[r] < 0 ? 0.0f : row_lse - row[targets[r]];
  }
}

void CpuBackend::cross_entropy_backward(const CrossEntropyArgs& args) {
  const int64_t columns = args.logits->dim(-1);
  const int64_t rows = args.targets->numel();
  const VocabShard shard = resolve_shard(args.shard, columns);
  const float* logits = args.logits->f32();      // [N, V]
  const int32_t* targets = args.targets->i32();  // [N]
  const float* lse = args.lse->f32();            // [N]
  float* dlogits = args.dlogits->f32();          // [N, V], possibly the same memory as logits
  const float scale = args.grad_scale;
  check_targets(targets, rows, shard.total, "cross_entropy_backward");
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * columns;
    float* drow = dlogits + r * columns;
    if (targets[r] < 0) {
      std::fill(drow, drow + columns, 0.0f);
      continue;
    }
    const float row_lse = lse[r];
    const int64_t target = local_column(targets[r], shard, columns);  // -1: the one-hot lies in another shard
    // Each element is read before it is written (the alias).
    for (int64_t v = 0; v < columns; ++v) drow[v] = scale * (std::exp(row[v] - row_lse) - (v == target ? 1.0f : 0.0f));
  }
}

void CpuBackend::row_max(const Tensor& x, Tensor& max) {
  const int64_t columns = x.dim(-1);
  const int64_t rows = max.numel();
  const float* in = x.f32();  // [N, C]
  float* out = max.f32();     // [N]
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) out[r] = *std::max_element(in + r * columns, in + (r + 1) * columns);
}

void CpuBackend::cross_entropy_shard_stats(const CrossEntropyArgs& args) {
  const int64_t columns = args.logits->dim(-1);
  const int64_t rows = args.targets->numel();
  const VocabShard shard = resolve_shard(args.shard, columns);
  const float* logits = args.logits->f32();        // [N, Vl]
  const int32_t* targets = args.targets->i32();    // [N]
  const float* max = args.max->f32();              // [N] over the whole vocabulary
  float* sum_exp = args.sum_exp->f32();            // [N]
  float* target_logit = args.target_logit->f32();  // [N]
  check_targets(targets, rows, shard.total, "cross_entropy_shard_stats");
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * columns;
    sum_exp[r] = static_cast<float>(sum_exp_of(row, columns, max[r]));
    const int64_t target = local_column(targets[r], shard, columns);
    target_logit[r] = target < 0 ? 0.0f : row[target];
  }
}

void CpuBackend::cross_entropy_finish(const CrossEntropyArgs& args) {
  const int64_t rows = args.targets->numel();
  const float* max = args.max->f32();                    // [N]
  const float* sum_exp = args.sum_exp->f32();            // [N] over the whole vocabulary
  const float* target_logit = args.target_logit->f32();  // [N] summed over the shards: the target's logit
  const int32_t* targets = args.targets->i32();          // [N]
  float* losses = args.losses->f32();                    // [N]
  float* lse = args.lse->f32();                          // [N]
  for (int64_t r = 0; r < rows; ++r) {
    const float row_lse = static_cast<float>(max[r] + std::log(static_cast<double>(sum_exp[r])));
    lse[r] = row_lse;
    losses[r] = targets[r] < 0 ? 0.0f : row_lse - target_logit[r];
  }
}

}  // namespace primus
