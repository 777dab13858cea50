// The stateful and reduction ops (AdamW, add/scale, sum_squares), bitwise determinism of every CPU kernel run to
// run and across OpenMP thread counts, and the error messages of src/ops on bad arguments.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "support/test_support.h"

namespace primus {
namespace {

using primus::testing::random_ids;
using primus::testing::random_tensor;

Tensor poisoned(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  t.fill(std::numeric_limits<float>::quiet_NaN());
  return t;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  c.copy_from(t);
  return c;
}

Tensor as_tensor(const std::vector<double>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kF32);
  for (size_t i = 0; i < v.size(); ++i) t.f32()[i] = static_cast<float>(v[i]);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(OpsChecks, AdamWMatchesHandWrittenLoopForThreeSteps) {
  Rng rng(301);
  const int64_t n = 1000;
  Tensor param = random_tensor({n}, rng);
  Tensor m = Tensor::zeros({n}, DType::kF32);
  Tensor v = Tensor::zeros({n}, DType::kF32);
  const std::vector<double> p0(param.f32(), param.f32() + n);
  std::vector<double> p_ref = p0, m_ref(n, 0.0), v_ref(n, 0.0);
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int64_t step = 1; step <= 3; ++step) {
    Tensor grad = random_tensor({n}, rng, 0.1f);
    AdamWArgs args;
    args.param = &param;
    args.grad = &grad;
    args.exp_avg = &m;
    args.exp_avg_sq = &v;
    args.lr = static_cast<float>(lr);
    args.beta1 = static_cast<float>(b1);
    args.beta2 = static_cast<float>(b2);
    args.eps = static_cast<float>(eps);
    args.weight_decay = static_cast<float>(wd);
    args.step = step;
    ops::adamw_step(args);
    for (int64_t i = 0; i < n; ++i) {
      const double g = grad.f32()[i];
      p_ref[i] -= lr * wd * p_ref[i];
      m_ref[i] = b1 * m_ref[i] + (1 - b1) * g;
      v_ref[i] = b2 * v_ref[i] + (1 - b2) * g * g;
      const double denom = std::sqrt(v_ref[i]) / std::sqrt(1 - std::pow(b2, step)) + eps;
      p_ref[i] -= lr / (1 - std::pow(b1, step)) * m_ref[i] / denom;
    }
  }
  // fp32 against double: whole-tensor relative errors (m can cancel to near zero element-wise), and for the
  // parameters of the change over three steps, which is small beside the parameters themselves.
  std::vector<double> delta(n), delta_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    delta[i] = param.f32()[i] - p0[i];
    delta_ref[i] = p_ref[i] - p0[i];
  }
  EXPECT_LE(primus::testing::relative_error(as_tensor(delta), as_tensor(delta_ref)), 1e-4);
  EXPECT_LE(primus::testing::relative_error(m, as_tensor(m_ref)), 1e-6);
  EXPECT_LE(primus::testing::relative_error(v, as_tensor(v_ref)), 1e-6);
}

TEST(OpsChecks, AddScaleAndSumSquares) {
  Rng rng(302);
  const int64_t n = 3 * 16384 + 77;  // several fixed chunks and a ragged tail
  Tensor y = random_tensor({n}, rng);
  Tensor x = random_tensor({n}, rng);
  const Tensor y0 = copy_of(y);
  ops::add_inplace(y, x);
  ops::scale_inplace(y, -0.5f);
  double want = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(y.f32()[i], (y0.f32()[i] + x.f32()[i]) * -0.5f) << i;
    want += static_cast<double>(y.f32()[i]) * y.f32()[i];
  }
  EXPECT_NEAR(ops::sum_squares(y), want, 1e-12 * want);
}

// Runs `fn` with the given OpenMP thread count, restoring the previous one.
void with_threads(int threads, const std::function<void()>& fn) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  fn();
  omp_set_num_threads(before);
}

TEST(OpsChecks, SumSquaresIsTheSameWithOneAndTwoThreads) {
  Rng rng(303);
  Tensor x = random_tensor({5 * 16384 + 3}, rng, 10.0f);
  double one = 0.0, two = 0.0;
  with_threads(1, [&] { one = ops::sum_squares(x); });
  with_threads(2, [&] { two = ops::sum_squares(x); });
  EXPECT_EQ(std::memcmp(&one, &two, sizeof(double)), 0) << one << " vs " << two;
}

// Every output of one forward and backward pass of each op, computed on fixed inputs.
std::vector<Tensor> run_all_ops(uint64_t seed) {
  Rng rng(seed);
  std::vector<Tensor> outs;
  // gemm through linear
  Tensor x = random_tensor({33, 40}, rng), w = random_tensor({17, 40}, rng), y = poisoned({33, 17});
  ops::linear_forward(x, w, y);
  Tensor dx = poisoned({33, 40}), dw = Tensor::zeros({17, 40}, DType::kF32);
  ops::linear_backward(x, w, y, dx, dw);
  outs.insert(outs.end(), {y, dx, dw});
  // embedding with many repeats
  Tensor ids = random_ids({200}, 9, rng), table = random_tensor({9, 40}, rng), emb = poisoned({200, 40});
  ops::embedding_forward(ids, table, emb);
  Tensor dtable = Tensor::zeros({9, 40}, DType::kF32);
  ops::embedding_backward(ids, emb, dtable);
  outs.insert(outs.end(), {emb, dtable});
  // rmsnorm
  Tensor nx = random_tensor({65, 33}, rng), nw = random_tensor({33}, rng), ny = poisoned({65, 33});
  Tensor rstd = poisoned({65}), ndx = poisoned({65, 33}), ndw = Tensor::zeros({33}, DType::kF32);
  ops::rmsnorm_forward(nx, nw, 1e-5f, ny, rstd);
  ops::rmsnorm_backward(nx, nx, nw, rstd, ndx, ndw);
  outs.insert(outs.end(), {ny, rstd, ndx, ndw});
  // rope, attention
  Tensor cos = random_tensor({17, 4}, rng), sin = random_tensor({17, 4}, rng);
  Tensor q = random_tensor({2, 17, 6, 8}, rng), k = random_tensor({2, 17, 2, 8}, rng);
  Tensor v = random_tensor({2, 17, 2, 8}, rng);
  ops::rope_forward(q, cos, sin);
  ops::rope_backward(k, cos, sin);
  Tensor out = poisoned(q.shape()), lse = poisoned({2, 6, 17});
  ops::attention_forward(q, k, v, out, lse);
  Tensor dq = poisoned(q.shape()), dk = poisoned(k.shape()), dv = poisoned(k.shape());
  ops::attention_backward(q, k, v, out, lse, q, dq, dk, dv);
  outs.insert(outs.end(), {q, k, out, lse, dq, dk, dv});
  // swiglu
  Tensor gate_up = random_tensor({31, 48}, rng), act = poisoned({31, 24}), dgate_up = poisoned({31, 48});
  ops::swiglu_forward(gate_up, act);
  ops::swiglu_backward(gate_up, act, dgate_up);
  outs.insert(outs.end(), {act, dgate_up});
  // cross-entropy, in place
  Tensor logits = random_tensor({33, 50}, rng), targets = random_ids({33}, 50, rng);
  targets.i32()[4] = -100;
  Tensor losses = poisoned({33}), ce_lse = poisoned({33});
  ops::cross_entropy_forward(logits, targets, losses, ce_lse);
  ops::cross_entropy_backward(logits, targets, ce_lse, 0.03f, logits);
  outs.insert(outs.end(), {losses, ce_lse, logits});
  // vocabulary-parallel cross-entropy and embedding: rank 1 of 2
  const VocabShard shard{25, 50};
  Tensor half = random_tensor({33, 25}, rng), vmax = poisoned({33}), sum_exp = poisoned({33});
  Tensor target_logit = poisoned({33}), vlosses = poisoned({33}), vlse = poisoned({33});
  ops::row_max(half, vmax);
  ops::cross_entropy_shard_stats(half, targets, shard, vmax, sum_exp, target_logit);
  ops::cross_entropy_finish(vmax, sum_exp, target_logit, targets, vlosses, vlse);
  ops::cross_entropy_backward(half, targets, vlse, 0.03f, half, shard);
  Tensor shard_emb = poisoned({200, 40}), shard_dtable = Tensor::zeros({5, 40}, DType::kF32);
  ops::embedding_forward(ids, table.slice_elements(4 * 40, {5, 40}), shard_emb, VocabShard{4, 9});
  ops::embedding_backward(ids, emb, shard_dtable, VocabShard{4, 9});
  outs.insert(outs.end(), {vmax, sum_exp, target_logit, vlosses, vlse, half, shard_emb, shard_dtable});
  // adamw
  Tensor p = random_tensor({1000}, rng), g = random_tensor({1000}, rng), m = random_tensor({1000}, rng, 0.1f);
  Tensor s = random_tensor({1000}, rng, 0.1f);
  for (int64_t i = 0; i < s.numel(); ++i) s.f32()[i] *= s.f32()[i];
  AdamWArgs args{&p, &g, &m, &s, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
  ops::adamw_step(args);
  outs.insert(outs.end(), {p, m, s});
  return outs;
}

TEST(OpsChecks, EveryKernelIsBitwiseDeterministic) {
  const std::vector<Tensor> first = run_all_ops(304);
  const std::vector<Tensor> second = run_all_ops(304);
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(same_bits(first[i], second[i])) << "output " << i;
}

TEST(OpsChecks, KernelsOtherThanGemmDoNotDependOnThreadCount) {
  std::vector<Tensor> one, two;
  with_threads(1, [&] { one = run_all_ops(305); });
  with_threads(2, [&] { two = run_all_ops(305); });
  ASSERT_EQ(one.size(), two.size());
  // Outputs 0..2 come from OpenBLAS, whose blocking may change with the thread count.
  for (size_t i = 3; i < one.size(); ++i) EXPECT_TRUE(same_bits(one[i], two[i])) << "output " << i;
}

// ---- error messages -------------------------------------------------------------------------------------------

// Runs `fn`, expecting a RuntimeError whose message contains every fragment.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const RuntimeError& e) {
    for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(OpsChecks, ShapeMismatchNamesTheOpAndTensors) {
  Rng rng(306);
  Tensor x = random_tensor({4, 7}, rng), w = random_tensor({8}, rng), y = poisoned({4, 7}), rstd = poisoned({4});
  expect_error([&] { ops::rmsnorm_forward(x, w, 1e-5f, y, rstd); },
               {"[op rmsnorm_forward]", "x is [4, 7] f32 cpu but weight is [8] f32 cpu"});
  Tensor w7 = random_tensor({7}, rng), rstd5 = poisoned({5});
  expect_error([&] { ops::rmsnorm_forward(x, w7, 1e-5f, y, rstd5); }, {"[op rmsnorm_forward]", "rstd is [5]"});

  Tensor lw = random_tensor({3, 6}, rng), ly = poisoned({4, 3});
  expect_error([&] { ops::linear_forward(x, lw, ly); }, {"[op linear_forward]", "x is [4, 7] f32 cpu but w is [3, 6]"});

  Tensor a = random_tensor({2, 3}, rng), b = random_tensor({4, 5}, rng), c = poisoned({2, 5});
  expect_error([&] { ops::gemm(GemmArgs{&a, &b, &c}); }, {"[op gemm]", "a is [2, 3] f32 cpu and b is [4, 5]"});
}

TEST(OpsChecks, AttentionRejectsHeadsThatDoNotGroup) {
  Rng rng(307);
  Tensor q = random_tensor({1, 4, 5, 8}, rng), k = random_tensor({1, 4, 2, 8}, rng),
         v = random_tensor({1, 4, 2, 8}, rng);
  Tensor out = poisoned(q.shape()), lse = poisoned({1, 5, 4});
  expect_error([&] { ops::attention_forward(q, k, v, out, lse); },
               {"[op attention_forward]", "Hq must be a multiple of Hkv"});
  Tensor q6 = random_tensor({1, 4, 6, 8}, rng), out6 = poisoned(q6.shape()), bad_lse = poisoned({1, 4, 6});
  expect_error([&] { ops::attention_forward(q6, k, v, out6, bad_lse); },
               {"[op attention_forward]", "lse is [1, 4, 6]"});
  Tensor cos = random_tensor({4, 3}, rng);
  expect_error([&] { ops::rope_forward(q6, cos, cos); }, {"[op rope_forward]", "cos is [4, 3]"});
}

// Multi-head latent attention's shapes: values of their own head size must agree between v, out and dv; head_concat's
// parts must share rows and heads (or b one shared head).
TEST(OpsChecks, ValueHeadSizeAndHeadConcatShapesAreChecked) {
  Rng rng(309);
  Tensor q = random_tensor({1, 4, 2, 8}, rng), k = random_tensor({1, 4, 2, 8}, rng), v = random_tensor({1, 4, 2, 6}, rng);
  Tensor wide_out = poisoned({1, 4, 2, 8}), lse = poisoned({1, 2, 4});
  expect_error([&] { ops::attention_forward(q, k, v, wide_out, lse); },
               {"[op attention_forward]", "v is [1, 4, 2, 6] f32 cpu but out is [1, 4, 2, 8]"});
  Tensor out = poisoned({1, 4, 2, 6}), dq = poisoned(q.shape()), dk = poisoned(k.shape()), bad_dv = poisoned(k.shape());
  ops::attention_forward(q, k, v, out, lse);
  expect_error([&] { ops::attention_backward(q, k, v, out, lse, out, dq, dk, bad_dv); },
               {"[op attention_backward]", "v is [1, 4, 2, 6] f32 cpu but dv is [1, 4, 2, 8]"});
  Tensor a = random_tensor({5, 3, 4}, rng), b = random_tensor({5, 2, 2}, rng), joined = poisoned({5, 3, 6});
  expect_error([&] { ops::head_concat(a, b, joined); }, {"[op head_concat]", "a is [5, 3, 4] f32 cpu but b is"});
  Tensor shared = random_tensor({5, 1, 2}, rng), narrow = poisoned({5, 3, 5});
  expect_error([&] { ops::head_concat(a, shared, narrow); }, {"[op head_concat]", "out is [5, 3, 5]"});
  Tensor da = poisoned(a.shape());
  expect_error([&] { ops::head_concat_backward(joined, da, joined); }, {"[op head_concat_backward]"});
}

TEST(OpsChecks, DtypeAndValueErrors) {
  Rng rng(308);
  Tensor logits = random_tensor({3, 5}, rng), losses = poisoned({3}), lse = poisoned({3});
  Tensor float_targets = random_tensor({3}, rng);
  expect_error([&] { ops::cross_entropy_forward(logits, float_targets, losses, lse); },
               {"[op cross_entropy_forward]", "targets is [3] f32 cpu but must be i32"});
  Tensor targets = random_ids({3}, 5, rng);
  targets.i32()[2] = 5;
  expect_error([&] { ops::cross_entropy_forward(logits, targets, losses, lse); },
               {"[op cross_entropy_forward]", "target 5 at row 2"});

  Tensor ids = random_ids({4}, 6, rng), table = random_tensor({6, 8}, rng), out = poisoned({4, 8});
  ids.i32()[1] = -3;
  expect_error([&] { ops::embedding_forward(ids, table, out); }, {"[op embedding_forward]", "id -3 at position 1"});

  Tensor undefined;
  expect_error([&] { ops::scale_inplace(undefined, 2.0f); }, {"[op scale_inplace]", "x is undefined"});

  Tensor p = random_tensor({4}, rng), g = random_tensor({5}, rng), m = poisoned({4}), s = poisoned({4});
  AdamWArgs args{&p, &g, &m, &s};
  expect_error([&] { ops::adamw_step(args); }, {"[op adamw_step]", "param is [4] f32 cpu but grad is [5]"});
}

TEST(OpsChecks, VocabShardsAndTheirIdsAreChecked) {
  Rng rng(310);
  // Embedding rows [4, 8) of a vocabulary of 10.
  Tensor ids = random_ids({4}, 10, rng), table = random_tensor({4, 8}, rng), out = poisoned({4, 8});
  Tensor dtable = Tensor::zeros({4, 8}, DType::kF32);
  ids.i32()[2] = 10;
  expect_error([&] { ops::embedding_forward(ids, table, out, VocabShard{4, 10}); },
               {"[op embedding_forward]", "id 10 at position 2 is outside the vocabulary [0, 10)"});
  ids.i32()[2] = -1;
  expect_error([&] { ops::embedding_backward(ids, out, dtable, VocabShard{4, 10}); },
               {"[op embedding_backward]", "id -1 at position 2 is outside the vocabulary [0, 10)"});
  for (int64_t i = 0; i < 4; ++i) ids.i32()[i] = static_cast<int32_t>(i);
  ids.i32()[2] = 4;  // unsharded, the table is the whole vocabulary
  expect_error([&] { ops::embedding_forward(ids, table, out); },
               {"[op embedding_forward]", "id 4 at position 2 is outside the table [0, 4)"});
  expect_error([&] { ops::embedding_forward(ids, table, out, VocabShard{8, 10}); },
               {"[op embedding_forward]", "shard rows [8, 12) (4 local rows) must lie in the vocabulary [0, 10)"});
  expect_error([&] { ops::embedding_backward(ids, out, dtable, VocabShard{-1, 10}); },
               {"[op embedding_backward]", "shard rows [-1, 3)"});
  expect_error([&] { ops::embedding_forward(ids, table, out, VocabShard{2, 0}); },
               {"[op embedding_forward]", "shard begin is 2 but total is 0 (unsharded)"});

  // Cross-entropy columns [5, 10) of a vocabulary of 10.
  const VocabShard shard{5, 10};
  Tensor logits = random_tensor({3, 5}, rng), targets = random_ids({3}, 10, rng), max = poisoned({3});
  Tensor sum_exp = poisoned({3}), target_logit = poisoned({3}), dlogits = poisoned({3, 5});
  ops::row_max(logits, max);
  targets.i32()[1] = 10;
  expect_error([&] { ops::cross_entropy_shard_stats(logits, targets, shard, max, sum_exp, target_logit); },
               {"[op cross_entropy_shard_stats]", "target 10 at row 1 is outside the vocabulary [0, 10)"});
  expect_error([&] { ops::cross_entropy_backward(logits, targets, max, 1.0f, dlogits, shard); },
               {"[op cross_entropy_backward]", "target 10 at row 1 is outside the vocabulary [0, 10)"});
  targets.i32()[1] = 7;
  expect_error([&] { ops::cross_entropy_backward(logits, targets, max, 1.0f, dlogits, VocabShard{6, 10}); },
               {"[op cross_entropy_backward]", "shard rows [6, 11) (5 local rows)"});
  Tensor max4 = poisoned({4}), losses = poisoned({3}), lse = poisoned({3});
  expect_error([&] { ops::cross_entropy_shard_stats(logits, targets, shard, max4, sum_exp, target_logit); },
               {"[op cross_entropy_shard_stats]", "logits is [3, 5] f32 cpu but max is [4] f32 cpu"});
  expect_error([&] { ops::cross_entropy_finish(max4, sum_exp, target_logit, targets, losses, lse); },
               {"[op cross_entropy_finish]", "targets is [3] i32 cpu but max is [4] f32 cpu"});
  Tensor no_columns = Tensor::empty({3, 0}, DType::kF32);
  expect_error([&] { ops::row_max(no_columns, max); }, {"[op row_max]", "rows must not be empty"});
  expect_error([&] { ops::row_max(logits, max4); }, {"[op row_max]", "x is [3, 5] f32 cpu but max is [4] f32 cpu"});
}

TEST(OpsChecks, PackedDocumentInputsAreChecked) {
  Rng rng(309);
  Tensor x = random_tensor({2, 4, 3, 8}, rng), cos = random_tensor({6, 4}, rng);
  Tensor positions = Tensor::zeros({2, 4}, DType::kI32);
  positions.i32()[5] = 6;  // one past the table
  expect_error([&] { ops::rope_forward(x, cos, cos, positions); },
               {"[op rope_forward]", "position 6 at token 5 is outside the rope table [0, 6)"});
  positions.i32()[5] = -1;
  expect_error([&] { ops::rope_backward(x, cos, cos, positions); }, {"[op rope_backward]", "position -1 at token 5"});
  Tensor short_positions = Tensor::zeros({2, 3}, DType::kI32);
  expect_error([&] { ops::rope_forward(x, cos, cos, short_positions); },
               {"[op rope_forward]", "positions is [2, 3] i32 cpu"});
  Tensor float_positions = Tensor::zeros({2, 4}, DType::kF32);
  expect_error([&] { ops::rope_forward(x, cos, cos, float_positions); },
               {"[op rope_forward]", "positions is [2, 4] f32 cpu but must be i32"});

  Tensor q = random_tensor({2, 4, 2, 8}, rng), k = random_tensor({2, 4, 1, 8}, rng), v = random_tensor({2, 4, 1, 8}, rng);
  Tensor out = poisoned(q.shape()), lse = poisoned({2, 2, 4});
  Tensor starts = Tensor::zeros({2, 4}, DType::kI32);
  starts.i32()[6] = 3;  // token (1, 2) cannot start its segment after itself
  expect_error([&] { ops::attention_forward(q, k, v, out, lse, starts); },
               {"[op attention_forward]", "segment start 3 of token 6 (position 2) is outside [0, 2]"});
  Tensor dq = poisoned(q.shape()), dk = poisoned(k.shape()), dv = poisoned(v.shape());
  starts.i32()[6] = -2;
  expect_error([&] { ops::attention_backward(q, k, v, out, lse, out, dq, dk, dv, starts); },
               {"[op attention_backward]", "segment start -2 of token 6"});
  Tensor wide = Tensor::zeros({2, 5}, DType::kI32);
  expect_error([&] { ops::attention_forward(q, k, v, out, lse, wide); },
               {"[op attention_forward]", "segment_start is [2, 5] i32 cpu"});
  Tensor float_starts = Tensor::zeros({2, 4}, DType::kF32);
  expect_error([&] { ops::attention_forward(q, k, v, out, lse, float_starts); },
               {"[op attention_forward]", "segment_start is [2, 4] f32 cpu but must be i32"});
}

}  // namespace
}  // namespace primus
