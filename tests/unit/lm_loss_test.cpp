// The chunked output layer with loss (LmLoss) against the same ops applied to the whole logits at once: the
// losses, the gradient w.r.t. the hidden states and the accumulated head gradient, whatever the chunking.
#include <gtest/gtest.h>

#include "layers/basic_layers.h"
#include "ops/ops.h"
#include "support/test_support.h"

namespace primus {
namespace {

constexpr int64_t kRows = 13, kChannels = 16, kVocab = 37;
constexpr float kGradScale = 1.0f / 11.0f;

struct Case {
  Tensor hidden, targets, head, dhead_start;
};

Case fresh_case(uint64_t seed) {
  Rng rng(seed);
  Case c{testing::random_tensor({kRows, kChannels}, rng), testing::random_ids({kRows}, kVocab, rng),
         testing::random_tensor({kVocab, kChannels}, rng, 0.5f), testing::random_tensor({kVocab, kChannels}, rng)};
  c.targets.i32()[2] = -1;  // ignored positions
  c.targets.i32()[9] = -1;
  return c;
}

// The spec: full logits, cross-entropy forward and backward, then both products.
struct Expected {
  Tensor losses, dhidden, dhead;
};
Expected whole_logits(const Case& c) {
  Tensor logits = Tensor::empty({kRows, kVocab}, DType::kF32);
  ops::linear_forward(c.hidden, c.head, logits);
  Expected e{Tensor::empty({kRows}, DType::kF32), Tensor::empty({kRows, kChannels}, DType::kF32),
             Tensor::empty({kVocab, kChannels}, DType::kF32)};
  Tensor lse = Tensor::empty({kRows}, DType::kF32);
  ops::cross_entropy_forward(logits, c.targets, e.losses, lse);
  ops::cross_entropy_backward(logits, c.targets, lse, kGradScale, logits);
  e.dhead.copy_from(c.dhead_start);
  ops::linear_backward(c.hidden, c.head, logits, e.dhidden, e.dhead);
  return e;
}

TEST(LmLoss, ChunkedTrainingEqualsWholeLogits) {
  const Case c = fresh_case(41);
  const Expected expected = whole_logits(c);
  // 1 row per chunk, 3 rows (a partial last chunk), and everything at once.
  for (int64_t rows_per_chunk : {int64_t{1}, int64_t{3}, kRows}) {
    LmLoss loss{c.head, Tensor::empty({kVocab, kChannels}, DType::kF32), {}, {}};
    loss.dhead.copy_from(c.dhead_start);
    loss.max_logits_bytes = rows_per_chunk * kVocab * static_cast<int64_t>(sizeof(float));
    LmLossSaved saved;
    const Tensor losses = loss.forward_with_grad(c.hidden, c.targets, kGradScale, saved);
    const Tensor dhidden = loss.backward(saved);
    EXPECT_FALSE(saved.dhidden.defined()) << "backward releases the saved gradient";
    EXPECT_LT(testing::relative_error(losses, expected.losses), 1e-6) << rows_per_chunk;
    EXPECT_EQ(losses.f32()[2], 0.0f);
    EXPECT_LT(testing::relative_error(dhidden, expected.dhidden), 1e-6) << rows_per_chunk;
    EXPECT_LT(testing::relative_error(loss.dhead, expected.dhead), 1e-6) << rows_per_chunk;
  }
}

TEST(LmLoss, EvaluationLossesEqualTrainingLosses) {
  const Case c = fresh_case(42);
  LmLoss loss{c.head, Tensor::empty({kVocab, kChannels}, DType::kF32), {}, {}};
  loss.dhead.copy_from(c.dhead_start);
  loss.max_logits_bytes = 4 * kVocab * static_cast<int64_t>(sizeof(float));
  const Tensor eval_losses = loss.forward(c.hidden, c.targets);
  EXPECT_LT(testing::relative_error(loss.dhead, c.dhead_start), 1e-12) << "evaluation leaves the head gradient alone";
  EXPECT_LT(testing::relative_error(eval_losses, whole_logits(c).losses), 1e-6);
}

TEST(LmLoss, LogitsOfRows) {
  const Case c = fresh_case(43);
  LmLoss loss{c.head, Tensor(), {}, {}};
  const Tensor row = c.hidden.slice_elements(5 * kChannels, {1, kChannels});
  Tensor expected = Tensor::empty({1, kVocab}, DType::kF32);
  for (int64_t v = 0; v < kVocab; ++v) {
    double dot = 0.0;
    for (int64_t k = 0; k < kChannels; ++k) dot += double{row.f32()[k]} * c.head.f32()[v * kChannels + k];
    expected.f32()[v] = static_cast<float>(dot);
  }
  EXPECT_LT(testing::relative_error(loss.logits(row), expected), 1e-6);
}

}  // namespace
}  // namespace primus
