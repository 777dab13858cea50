// What the op harness (support/op_cases.cpp, op_cases_test) cannot express, on the CPU backend: fill_normal's
// stream, an empty inner dimension, a skipped output, positions that count up equalling plain RoPE bit for bit,
// batch-shaped cross-entropy, and the vocabulary-parallel embedding equal to the unsharded one bit for bit over 1 to
// 4 ranks. Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "support/test_support.h"
#include "support/vocab_shards.h"

namespace primus {
namespace {

using primus::testing::random_ids;
using primus::testing::random_tensor;
using primus::testing::same_bits;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor poisoned(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  t.fill(kNaN);
  return t;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  c.copy_from(t);
  return c;
}

std::vector<double> values(const Tensor& t) { return std::vector<double>(t.f32(), t.f32() + t.numel()); }

// Relative error ||got − want|| / ||want|| of a whole tensor; every element must be finite.
void expect_near(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.f32()[i];
    ASSERT_TRUE(std::isfinite(g)) << what << ": element " << i << " is " << g;
    diff += (g - want[i]) * (g - want[i]);
    ref += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30), tol) << what;
}

// Initialisation: element k is the k-th draw of one sequential Rng stream, whatever the parallel split, at the
// requested scale.
TEST(OpsEdgeCases, FillNormalDrawsOneSequentialStream) {
  const int64_t n = 200'003;
  const uint64_t seed = Rng::derive(41, 3).seed();
  Tensor x = Tensor::empty({n}, DType::kF32);
  x.fill(std::numeric_limits<float>::quiet_NaN());
  ops::fill_normal(x, seed, 0.02);
  Rng sequential(seed);
  double sum = 0.0, sum_sq = 0.0;
  for (int64_t k = 0; k < n; ++k) {
    ASSERT_EQ(x.f32()[k], static_cast<float>(sequential.normal() * 0.02)) << "element " << k;
    sum += x.f32()[k];
    sum_sq += static_cast<double>(x.f32()[k]) * x.f32()[k];
  }
  const double mean = sum / n, stddev = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_LT(std::abs(mean), 5 * 0.02 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(stddev, 0.02, 0.02 * 0.01);
  Tensor bf16 = Tensor::empty({4}, DType::kBF16);
  EXPECT_THROW(ops::fill_normal(bf16, seed, 0.02), Error);
}


TEST(OpsEdgeCases, GemmEmptyInnerDimension) {
  Rng rng(102);
  Tensor a = Tensor::empty({3, 0}, DType::kF32);
  Tensor b = Tensor::empty({0, 4}, DType::kF32);
  Tensor c = poisoned({3, 4});
  ops::gemm(GemmArgs{&a, &b, &c, false, false, 1.0f, 0.0f});
  expect_near(c, std::vector<double>(12, 0.0), 0.0, "beta 0 clears c");
  Tensor d = random_tensor({3, 4}, rng);
  const std::vector<double> want = [&] {
    std::vector<double> w = values(d);
    for (double& x : w) x *= 0.5;
    return w;
  }();
  ops::gemm(GemmArgs{&a, &b, &d, false, false, 1.0f, 0.5f});
  expect_near(d, want, 1e-7, "beta 0.5 scales c");
}

// An undefined output of linear_backward is skipped; the other is still produced, equal to the full backward's.
TEST(OpsEdgeCases, LinearBackwardSkipsAnUndefinedOutput) {
  Rng rng(103);
  const Tensor x = random_tensor({2, 3, 8}, rng), w = random_tensor({5, 8}, rng), dy = random_tensor({2, 3, 5}, rng);
  Tensor dx = poisoned({2, 3, 8}), dw = Tensor::zeros({5, 8}, DType::kF32);
  ops::linear_backward(x, w, dy, dx, dw);
  Tensor none;
  Tensor dx_only = poisoned({2, 3, 8});
  ops::linear_backward(x, w, dy, dx_only, none);
  expect_near(dx_only, values(dx), 0.0, "dx alone");
}

TEST(OpsEdgeCases, RopePositionsCountingUpEqualPlainRope) {
  Rng rng(113);
  const int64_t batch = 2, seq = 9, heads = 2, half = 4;
  const Tensor cos = random_tensor({seq, half}, rng), sin = random_tensor({seq, half}, rng);
  Tensor positions = Tensor::empty({batch, seq}, DType::kI32);
  for (int64_t i = 0; i < batch * seq; ++i) positions.i32()[i] = static_cast<int32_t>(i % seq);
  Tensor x = random_tensor({batch, seq, heads, 2 * half}, rng);
  Tensor y = copy_of(x);
  ops::rope_forward(x, cos, sin);
  ops::rope_forward(y, cos, sin, positions);
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0);
}


TEST(OpsEdgeCases, CrossEntropyAcceptsBatchShapes) {
  Rng rng(111);
  Tensor logits = random_tensor({2, 3, 10}, rng);
  Tensor targets = random_ids({2, 3}, 10, rng);
  Tensor losses = poisoned({2, 3});
  Tensor lse = poisoned({2, 3});
  ops::cross_entropy_forward(logits, targets, losses, lse);
  Tensor flat_losses = poisoned({6});
  Tensor flat_lse = poisoned({6});
  ops::cross_entropy_forward(logits.reshape({6, 10}), targets.reshape({6}), flat_losses, flat_lse);
  expect_near(losses, values(flat_losses), 0.0, "losses");
}

// ---- vocabulary-parallel cross-entropy and embedding (tensor parallelism) --------------------------------------

// One rank's steps against a double reference: the columns [5, 5 + Vl) of a vocabulary of Vl + 12, a group max at
// or above this shard's, and targets held here, held elsewhere and ignored.


// Rows of the table split over 1 to 4 ranks: the ranks' outputs sum to the unsharded output (every id is held by
// one rank, the others give zeros), and their dtables are the row slices of the unsharded one, bit for bit.
TEST(OpsEdgeCases, VocabParallelEmbeddingEqualsUnsharded) {
  Rng rng(114);
  for (int64_t n : {1, 31, 33}) {
    for (int64_t vocab : {7, 257}) {
      const int64_t channels = 20;
      const Tensor ids = random_ids({n}, vocab, rng), table = random_tensor({vocab, channels}, rng);
      const Tensor dout = random_tensor({n, channels}, rng), dtable0 = random_tensor({vocab, channels}, rng);
      Tensor out = poisoned({n, channels}), dtable = copy_of(dtable0);
      ops::embedding_forward(ids, table, out);
      ops::embedding_backward(ids, dout, dtable);
      for (int ranks = 1; ranks <= 4; ++ranks) {
        SCOPED_TRACE(fmt::format("n={} V={} ranks={}", n, vocab, ranks));
        const testing::VocabParallelEmbedding split =
            testing::vocab_parallel_embedding(ids, table, dout, dtable0, ranks);
        EXPECT_TRUE(same_bits(split.out, out)) << "out summed over ranks";
        EXPECT_TRUE(same_bits(split.dtable, dtable)) << "dtable rows";
      }
    }
  }
  // A shard gives zero rows for the ids it does not hold.
  Tensor ids = Tensor::empty({3}, DType::kI32);
  const int32_t id_values[] = {1, 4, 6};
  std::copy_n(id_values, 3, ids.i32());
  const Tensor held = random_tensor({3, 4}, rng);  // vocabulary rows [3, 6) of 7
  Tensor out = poisoned({3, 4});
  ops::embedding_forward(ids, held, out, VocabShard{3, 7});
  const float* row4 = held.f32() + 4;
  expect_near(out, {0, 0, 0, 0, row4[0], row4[1], row4[2], row4[3], 0, 0, 0, 0}, 0.0, "out");
}

}  // namespace
}  // namespace primus
