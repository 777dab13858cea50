// Softmax cross-entropy on the CPU, one row per token:
//   lse = max + log Σ exp(logit − max)      (sum in double)
//   loss = lse − logit[target]              (0 for rows whose target is negative: ignored)
//   dlogits = grad_scale · (exp(logit − lse) − onehot(target))   (0 rows when ignored)
// lse is written for every row, ignored or not. Backward reads each logit before writing the same element, so
// dlogits may alias logits (saves a [N, V] buffer for large vocabularies).
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
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
    const float row_lse = static_cast<float>(max + std::log(sum));
    lse[r] = row_lse;
    losses[r] = targets[r] < 0 ? 0.0f : row_lse - row[targets[r]];
  }
}

void CpuBackend::cross_entropy_backward(const CrossEntropyArgs& args) {
  const int64_t vocab = args.logits->dim(-1);
  const int64_t rows = args.targets->numel();
  const float* logits = args.logits->f32();      // [N, V]
  const int32_t* targets = args.targets->i32();  // [N]
  const float* lse = args.lse->f32();            // [N]
  float* dlogits = args.dlogits->f32();          // [N, V], possibly the same memory as logits
  const float scale = args.grad_scale;
  check_targets(targets, rows, vocab, "cross_entropy_backward");
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    float* drow = dlogits + r * vocab;
    const int32_t target = targets[r];
    if (target < 0) {
      std::fill(drow, drow + vocab, 0.0f);
      continue;
    }
    const float row_lse = lse[r];
    const float target_logit = row[target];  // read before the loop may overwrite it through the alias
    for (int64_t v = 0; v < vocab; ++v) drow[v] = scale * std::exp(row[v] - row_lse);
    drow[target] = scale * (std::exp(target_logit - row_lse) - 1.0f);
  }
}

}  // namespace primus
