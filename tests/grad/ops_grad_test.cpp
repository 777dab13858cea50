// Finite-difference checks of every op's backward on the CPU backend. For an op with output `out` we take the
// scalar L = Σ out ⊙ R (R random, fixed), nudge each input element by ±h, evaluate the fp32 op, accumulate L in
// double, and compare the central difference (L+ − L−) / 2h with the analytic gradient from the backward op:
// ||analytic − numeric|| / ||numeric|| must stay below kTolerance. Shapes are tiny so every element is probed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <functional>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "support/test_support.h"
#include "support/vocab_shards.h"

namespace primus {
namespace {

using primus::testing::random_ids;
using primus::testing::random_tensor;

constexpr double kTolerance = 1e-2;
constexpr float kStep = 1e-2f;

// Σ out ⊙ r in double.
double dot(const Tensor& out, const Tensor& r) {
  double s = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) s += static_cast<double>(out.f32()[i]) * r.f32()[i];
  return s;
}

// Central differences of `loss` with respect to every element of `x`, which is nudged in place and restored.
std::vector<double> numeric_grad(const Tensor& x, const std::function<double()>& loss, float h = kStep) {
  std::vector<double> g(static_cast<size_t>(x.numel()));
  float* p = x.f32();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float saved = p[i];
    p[i] = saved + h;
    const double plus = loss();
    p[i] = saved - h;
    const double minus = loss();
    p[i] = saved;
    // Divide by the step actually taken after fp32 rounding of saved ± h.
    const double taken = static_cast<double>(saved + h) - static_cast<double>(saved - h);
    g[i] = (plus - minus) / taken;
  }
  return g;
}

void expect_grad(const Tensor& analytic, const std::vector<double>& numeric, const std::string& what) {
  ASSERT_EQ(analytic.numel(), static_cast<int64_t>(numeric.size())) << what;
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < analytic.numel(); ++i) {
    const double a = analytic.f32()[i];
    ASSERT_TRUE(std::isfinite(a)) << what << ": element " << i;
    diff += (a - numeric[i]) * (a - numeric[i]);
    ref += numeric[i] * numeric[i];
  }
  ASSERT_GT(ref, 0.0) << what << ": the numeric gradient is zero, the check would be vacuous";
  EXPECT_LE(std::sqrt(diff / ref), kTolerance) << what;
}

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype()); }

TEST(OpsGrad, GemmAllTransposeCombinations) {
  Rng rng(401);
  const int64_t m = 3, n = 4, k = 5;
  const float alpha = 1.3f;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE(fmt::format("trans_a={} trans_b={}", ta, tb));
      Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, rng);
      Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, rng);
      Tensor r = random_tensor({m, n}, rng);
      Tensor c = Tensor::empty({m, n}, DType::kF32);
      auto loss = [&] {
        ops::gemm(GemmArgs{&a, &b, &c, ta == 1, tb == 1, alpha, 0.0f});
        return dot(c, r);
      };
      // dop(A) = alpha · R · op(B)ᵀ and dop(B) = alpha · op(A)ᵀ · R, transposed back when A or B is stored so.
      Tensor da = empty_like(a), db = empty_like(b);
      if (ta) {
        ops::gemm(GemmArgs{&b, &r, &da, tb == 1, true, alpha, 0.0f});
      } else {
        ops::gemm(GemmArgs{&r, &b, &da, false, tb == 0, alpha, 0.0f});
      }
      if (tb) {
        ops::gemm(GemmArgs{&r, &a, &db, true, ta == 1, alpha, 0.0f});
      } else {
        ops::gemm(GemmArgs{&a, &r, &db, ta == 0, false, alpha, 0.0f});
      }
      expect_grad(da, numeric_grad(a, loss), "da");
      expect_grad(db, numeric_grad(b, loss), "db");
    }
  }
}

TEST(OpsGrad, Linear) {
  Rng rng(402);
  Tensor x = random_tensor({2, 3, 4}, rng), w = random_tensor({5, 4}, rng), r = random_tensor({2, 3, 5}, rng);
  Tensor y = Tensor::empty({2, 3, 5}, DType::kF32);
  auto loss = [&] {
    ops::linear_forward(x, w, y);
    return dot(y, r);
  };
  Tensor dx = empty_like(x), dw = Tensor::zeros(w.shape(), DType::kF32);
  ops::linear_backward(x, w, r, dx, dw);
  expect_grad(dx, numeric_grad(x, loss), "dx");
  expect_grad(dw, numeric_grad(w, loss), "dw");
}

TEST(OpsGrad, EmbeddingWithRepeatedIds) {
  Rng rng(403);
  Tensor ids = random_ids({9}, 4, rng);  // 9 tokens over 4 rows: repeats are certain
  ids.i32()[0] = ids.i32()[5];
  Tensor table = random_tensor({4, 3}, rng), r = random_tensor({9, 3}, rng);
  Tensor out = Tensor::empty({9, 3}, DType::kF32);
  auto loss = [&] {
    ops::embedding_forward(ids, table, out);
    return dot(out, r);
  };
  Tensor dtable = Tensor::zeros(table.shape(), DType::kF32);
  ops::embedding_backward(ids, r, dtable);
  expect_grad(dtable, numeric_grad(table, loss), "dtable");
}

TEST(OpsGrad, RmsNorm) {
  Rng rng(404);
  Tensor x = random_tensor({3, 7}, rng), w = random_tensor({7}, rng), r = random_tensor({3, 7}, rng);
  Tensor y = Tensor::empty({3, 7}, DType::kF32), rstd = Tensor::empty({3}, DType::kF32);
  auto loss = [&] {
    ops::rmsnorm_forward(x, w, 1e-5f, y, rstd);
    return dot(y, r);
  };
  loss();
  Tensor dx = empty_like(x), dw = Tensor::zeros(w.shape(), DType::kF32);
  ops::rmsnorm_backward(r, x, w, rstd, dx, dw);
  expect_grad(dx, numeric_grad(x, loss, 1e-3f), "dx");
  expect_grad(dw, numeric_grad(w, loss), "dweight");
}

TEST(OpsGrad, RopeBackwardIsTheInverseRotation) {
  Rng rng(405);
  const int64_t seq = 3, half = 2;
  Tensor x = random_tensor({2, seq, 2, 2 * half}, rng), r = random_tensor(x.shape(), rng);
  Tensor cos = Tensor::empty({seq, half}, DType::kF32), sin = Tensor::empty({seq, half}, DType::kF32);
  for (int64_t i = 0; i < seq * half; ++i) {
    cos.f32()[i] = static_cast<float>(std::cos(0.7 * i + 0.2));
    sin.f32()[i] = static_cast<float>(std::sin(0.7 * i + 0.2));
  }
  Tensor y = empty_like(x);
  auto loss = [&] {
    y.copy_from(x);
    ops::rope_forward(y, cos, sin);
    return dot(y, r);
  };
  Tensor dx = empty_like(r);
  dx.copy_from(r);
  ops::rope_backward(dx, cos, sin);
  expect_grad(dx, numeric_grad(x, loss), "dx");
}

TEST(OpsGrad, AttentionWithGroupedAndPlainHeads) {
  Rng rng(406);
  const int64_t heads[][2] = {{4, 2}, {2, 2}};
  for (const auto& hh : heads) {
    const int64_t batch = 2, seq = 4, hq = hh[0], hkv = hh[1], d = 4;
    SCOPED_TRACE(fmt::format("Hq={} Hkv={}", hq, hkv));
    Tensor q = random_tensor({batch, seq, hq, d}, rng), k = random_tensor({batch, seq, hkv, d}, rng);
    Tensor v = random_tensor({batch, seq, hkv, d}, rng), r = random_tensor(q.shape(), rng);
    Tensor out = empty_like(q), lse = Tensor::empty({batch, hq, seq}, DType::kF32);
    auto loss = [&] {
      ops::attention_forward(q, k, v, out, lse);
      return dot(out, r);
    };
    loss();
    Tensor dq = empty_like(q), dk = empty_like(k), dv = empty_like(v);
    ops::attention_backward(q, k, v, out, lse, r, dq, dk, dv);
    expect_grad(dq, numeric_grad(q, loss), "dq");
    expect_grad(dk, numeric_grad(k, loss), "dk");
    expect_grad(dv, numeric_grad(v, loss), "dv");
  }
}

TEST(OpsGrad, RopeAtPerTokenPositions) {
  // Packed documents: positions restart (0 1 2 0 1 / 0 1 2 3 4), so one table row serves several tokens.
  Rng rng(409);
  const int64_t seq = 5, half = 2;
  Tensor x = random_tensor({2, seq, 2, 2 * half}, rng), r = random_tensor(x.shape(), rng);
  Tensor cos = Tensor::empty({seq, half}, DType::kF32), sin = Tensor::empty({seq, half}, DType::kF32);
  for (int64_t i = 0; i < seq * half; ++i) {
    cos.f32()[i] = static_cast<float>(std::cos(0.9 * i + 0.1));
    sin.f32()[i] = static_cast<float>(std::sin(0.9 * i + 0.1));
  }
  Tensor positions = Tensor::empty({2, seq}, DType::kI32);
  const int32_t restart[] = {0, 1, 2, 0, 1, 0, 1, 2, 3, 4};
  std::copy(std::begin(restart), std::end(restart), positions.i32());
  Tensor y = empty_like(x);
  auto loss = [&] {
    y.copy_from(x);
    ops::rope_forward(y, cos, sin, positions);
    return dot(y, r);
  };
  Tensor dx = empty_like(r);
  dx.copy_from(r);
  ops::rope_backward(dx, cos, sin, positions);
  expect_grad(dx, numeric_grad(x, loss), "dx");
}

TEST(OpsGrad, AttentionConfinedToSegments) {
  // Row 0: documents [0, 2) [2, 5) [5, 6); row 1: [0, 1) [1, 6). Keys of other documents get no gradient.
  Rng rng(410);
  const int64_t batch = 2, seq = 6, hq = 4, hkv = 2, d = 4;
  Tensor starts = Tensor::empty({batch, seq}, DType::kI32);
  const int32_t layout[] = {0, 0, 2, 2, 2, 5, 0, 1, 1, 1, 1, 1};
  std::copy(std::begin(layout), std::end(layout), starts.i32());
  Tensor q = random_tensor({batch, seq, hq, d}, rng), k = random_tensor({batch, seq, hkv, d}, rng);
  Tensor v = random_tensor({batch, seq, hkv, d}, rng), r = random_tensor(q.shape(), rng);
  Tensor out = empty_like(q), lse = Tensor::empty({batch, hq, seq}, DType::kF32);
  auto loss = [&] {
    ops::attention_forward(q, k, v, out, lse, starts);
    return dot(out, r);
  };
  loss();
  Tensor dq = empty_like(q), dk = empty_like(k), dv = empty_like(v);
  ops::attention_backward(q, k, v, out, lse, r, dq, dk, dv, starts);
  expect_grad(dq, numeric_grad(q, loss), "dq");
  expect_grad(dk, numeric_grad(k, loss), "dk");
  expect_grad(dv, numeric_grad(v, loss), "dv");
}

TEST(OpsGrad, UnmaskedAttentionBlock) {
  Rng rng(411);
  const int64_t batch = 2, seq = 3, hq = 4, hkv = 2, d = 4;
  Tensor q = random_tensor({batch, seq, hq, d}, rng), k = random_tensor({batch, seq, hkv, d}, rng);
  Tensor v = random_tensor({batch, seq, hkv, d}, rng), r = random_tensor(q.shape(), rng);
  Tensor out = empty_like(q), lse = Tensor::empty({batch, hq, seq}, DType::kF32);
  auto loss = [&] {
    ops::attention_block_forward(q, k, v, AttentionMask::kNone, out, lse);
    return dot(out, r);
  };
  loss();
  Tensor dq = empty_like(q), dk = empty_like(k), dv = empty_like(v);
  ops::attention_block_backward(q, k, v, AttentionMask::kNone, out, lse, r, dq, dk, dv);
  expect_grad(dq, numeric_grad(q, loss), "dq");
  expect_grad(dk, numeric_grad(k, loss), "dk");
  expect_grad(dv, numeric_grad(v, loss), "dv");
}

// Ring attention's backward: the queries against two key/value blocks (one unmasked, one causal) merged into one
// result; each block's backward from the merged out and lse gives that block's part of the gradient, dq summed.
TEST(OpsGrad, AttentionBlocksThroughTheirMerge) {
  Rng rng(412);
  const int64_t batch = 1, seq = 3, hq = 2, hkv = 1, d = 4;
  Tensor q = random_tensor({batch, seq, hq, d}, rng), r = random_tensor(q.shape(), rng);
  Tensor ka = random_tensor({batch, seq, hkv, d}, rng), va = random_tensor(ka.shape(), rng);
  Tensor kb = random_tensor(ka.shape(), rng), vb = random_tensor(ka.shape(), rng);
  Tensor out = empty_like(q), lse = Tensor::empty({batch, hq, seq}, DType::kF32);
  Tensor block = empty_like(q), block_lse = Tensor::empty(lse.shape(), DType::kF32);
  auto loss = [&] {
    ops::attention_block_forward(q, ka, va, AttentionMask::kNone, out, lse);
    ops::attention_block_forward(q, kb, vb, AttentionMask::kCausal, block, block_lse);
    ops::attention_merge(out, lse, block, block_lse);
    return dot(out, r);
  };
  loss();
  Tensor dq = empty_like(q), dqb = empty_like(q);
  Tensor dka = empty_like(ka), dva = empty_like(ka), dkb = empty_like(ka), dvb = empty_like(ka);
  ops::attention_block_backward(q, ka, va, AttentionMask::kNone, out, lse, r, dq, dka, dva);
  ops::attention_block_backward(q, kb, vb, AttentionMask::kCausal, out, lse, r, dqb, dkb, dvb);
  ops::add_inplace(dq, dqb);
  expect_grad(dq, numeric_grad(q, loss), "dq");
  expect_grad(dka, numeric_grad(ka, loss), "dk of the unmasked block");
  expect_grad(dva, numeric_grad(va, loss), "dv of the unmasked block");
  expect_grad(dkb, numeric_grad(kb, loss), "dk of the causal block");
  expect_grad(dvb, numeric_grad(vb, loss), "dv of the causal block");
}

TEST(OpsGrad, SwiGlu) {
  Rng rng(407);
  Tensor gate_up = random_tensor({3, 10}, rng, 2.0f), r = random_tensor({3, 5}, rng);
  Tensor out = empty_like(r);
  auto loss = [&] {
    ops::swiglu_forward(gate_up, out);
    return dot(out, r);
  };
  Tensor dgate_up = empty_like(gate_up);
  ops::swiglu_backward(gate_up, r, dgate_up);
  expect_grad(dgate_up, numeric_grad(gate_up, loss), "dgate_up");
}

TEST(OpsGrad, CrossEntropyWithAnIgnoredRow) {
  Rng rng(408);
  const int64_t rows = 4, vocab = 6;
  const float scale = 0.37f;  // L = scale · Σ losses, as a trainer's 1/num_tokens
  Tensor logits = random_tensor({rows, vocab}, rng, 2.0f), targets = random_ids({rows}, vocab, rng);
  targets.i32()[2] = -100;
  Tensor losses = Tensor::empty({rows}, DType::kF32), lse = Tensor::empty({rows}, DType::kF32);
  auto loss = [&] {
    ops::cross_entropy_forward(logits, targets, losses, lse);
    double s = 0.0;
    for (int64_t i = 0; i < rows; ++i) s += scale * static_cast<double>(losses.f32()[i]);
    return s;
  };
  loss();
  Tensor dlogits = empty_like(logits);
  ops::cross_entropy_backward(logits, targets, lse, scale, dlogits);
  expect_grad(dlogits, numeric_grad(logits, loss), "dlogits");
  for (int64_t v = 0; v < vocab; ++v) EXPECT_EQ(dlogits.f32()[2 * vocab + v], 0.0f) << "ignored row";
}

// The loss split over three vocabulary shards (uneven: 2, 3 and 3 columns of 8) through the vocabulary-parallel ops,
// reduced as the loss layer would: its gradient, the ranks' dlogits side by side, against central differences of
// the whole logits. Targets fall in every shard, one row is ignored.
TEST(OpsGrad, CrossEntropySplitOverThreeVocabularyShards) {
  Rng rng(409);
  const int64_t rows = 5, vocab = 8;
  const int ranks = 3;
  const float scale = 0.37f;
  Tensor logits = random_tensor({rows, vocab}, rng, 2.0f);
  Tensor targets = Tensor::empty({rows}, DType::kI32);
  const int32_t target_values[rows] = {0, 4, -100, 7, 3};
  std::copy(std::begin(target_values), std::end(target_values), targets.i32());
  auto loss = [&] {
    const Tensor losses = testing::vocab_parallel_cross_entropy(logits, targets, ranks, scale).losses;
    double s = 0.0;
    for (int64_t i = 0; i < rows; ++i) s += scale * static_cast<double>(losses.f32()[i]);
    return s;
  };
  const Tensor dlogits = testing::vocab_parallel_cross_entropy(logits, targets, ranks, scale).dlogits;
  expect_grad(dlogits, numeric_grad(logits, loss), "dlogits over three shards");
  for (int64_t v = 0; v < vocab; ++v) EXPECT_EQ(dlogits.f32()[2 * vocab + v], 0.0f) << "ignored row";
}

}  // namespace
}  // namespace primus
