// The mixture-of-experts ops on the CPU (ops/moe_ops.h): each forward against a plain loop written from the math in
// backend.h, and each backward against central finite differences of Σ G ⊙ output for a fresh random G, at awkward
// sizes (1, 31, 33 tokens; an expert that receives no token).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "ops/moe_ops.h"
#include "ops/ops.h"
#include "support/test_support.h"

namespace primus {
namespace {

using testing::random_tensor;

// Σ g ⊙ y in double.
double dot(const Tensor& g, const Tensor& y) {
  double s = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(g.f32()[i]) * y.f32()[i];
  return s;
}

// Central differences of `loss` with respect to every element of x (perturbed in place and restored).
Tensor numeric_grad(Tensor& x, const std::function<double()>& loss, float eps) {
  Tensor grad = Tensor::empty(x.shape(), DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float keep = x.f32()[i];
    x.f32()[i] = keep + eps;
    const double up = loss();
    x.f32()[i] = keep - eps;
    const double down = loss();
    x.f32()[i] = keep;
    grad.f32()[i] = static_cast<float>((up - down) / (2.0 * eps));
  }
  return grad;
}

// Router logits whose scores differ by far more than a finite-difference step, so no perturbation changes the
// selection: a random ordering of the experts spaced 0.4 apart, plus noise below 0.1.
Tensor separated_logits(int64_t n, int64_t e, Rng& rng) {
  Tensor logits = Tensor::empty({n, e}, DType::kF32);
  std::vector<int> order(static_cast<size_t>(e));
  for (int64_t t = 0; t < n; ++t) {
    std::iota(order.begin(), order.end(), 0);
    for (int64_t i = e - 1; i > 0; --i) std::swap(order[static_cast<size_t>(i)], order[rng.next_u64() % (i + 1)]);
    for (int64_t i = 0; i < e; ++i) {
      logits.f32()[t * e + i] = 0.4f * static_cast<float>(order[static_cast<size_t>(i)]) - 0.8f +
                                0.05f * static_cast<float>(rng.uniform() - 0.5);
    }
  }
  return logits;
}

struct RouterOut {
  Tensor scores, experts, weights;
};

RouterOut route(const Tensor& logits, const Tensor& bias, const MoeRouting& r) {
  const int64_t n = logits.dim(0), e = logits.dim(1);
  RouterOut out{Tensor::empty({n, e}, DType::kF32), Tensor::empty({n, r.topk}, DType::kI32),
                Tensor::empty({n, r.topk}, DType::kF32)};
  ops::moe_router_forward(logits, bias, r, out.scores, out.experts, out.weights);
  return out;
}

// The router's math written plainly: scores, the chosen experts (by a full sort of the biased scores within the
// allowed groups) and their weights.
void expect_router_matches_reference(const Tensor& logits, const Tensor& bias, const MoeRouting& r) {
  const int64_t n = logits.dim(0), e = logits.dim(1), k = r.topk;
  const RouterOut got = route(logits, bias, r);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> s(static_cast<size_t>(e)), biased(static_cast<size_t>(e));
    double total = 0.0;
    for (int64_t i = 0; i < e; ++i) total += std::exp(static_cast<double>(logits.f32()[t * e + i]));
    for (int64_t i = 0; i < e; ++i) {
      const double z = logits.f32()[t * e + i];
      s[i] = r.score_function == MoeScoreFunction::kSoftmax ? std::exp(z) / total : 1.0 / (1.0 + std::exp(-z));
      biased[i] = s[i] + (bias.defined() ? bias.f32()[i] : 0.0);
      EXPECT_NEAR(got.scores.f32()[t * e + i], s[i], 1e-6);
    }
    std::vector<bool> allowed(static_cast<size_t>(e), true);
    if (r.num_groups > 1) {
      const int64_t per = e / r.num_groups;
      std::vector<std::pair<double, int64_t>> groups;
      for (int64_t g = 0; g < r.num_groups; ++g) {
        std::vector<double> member(biased.begin() + g * per, biased.begin() + (g + 1) * per);
        std::sort(member.rbegin(), member.rend());
        groups.push_back({-std::accumulate(member.begin(), member.begin() + k / r.group_topk, 0.0), g});
      }
      std::sort(groups.begin(), groups.end());
      std::fill(allowed.begin(), allowed.end(), false);
      for (int64_t i = 0; i < r.group_topk; ++i) {
        for (int64_t x = 0; x < per; ++x) allowed[groups[i].second * per + x] = true;
      }
    }
    std::vector<std::pair<double, int64_t>> ranked;
    for (int64_t i = 0; i < e; ++i) {
      if (allowed[i]) ranked.push_back({-biased[i], i});
    }
    std::sort(ranked.begin(), ranked.end());
    double sum = r.score_function == MoeScoreFunction::kSigmoid ? 1e-20 : 0.0;
    for (int64_t j = 0; j < k; ++j) sum += s[ranked[j].second];
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(got.experts.i32()[t * k + j], ranked[j].second) << "token " << t << " choice " << j;
      const double w = s[ranked[j].second] / (r.normalize ? sum : 1.0) * r.scaling_factor;
      EXPECT_NEAR(got.weights.f32()[t * k + j], w, 1e-6 * std::max(1.0, w));
    }
  }
}

// dlogits of Σ G ⊙ weights + Σ H ⊙ scores against finite differences.
void expect_router_gradient(Tensor logits, const Tensor& bias, const MoeRouting& r, Rng& rng) {
  const int64_t n = logits.dim(0), e = logits.dim(1);
  const Tensor g = random_tensor({n, r.topk}, rng), h = random_tensor({n, e}, rng);
  const RouterOut out = route(logits, bias, r);
  Tensor dlogits = Tensor::empty({n, e}, DType::kF32);
  ops::moe_router_backward(out.scores, out.experts, r, g, h, dlogits);
  auto loss = [&] {
    const RouterOut o = route(logits, bias, r);
    EXPECT_TRUE(testing::same_bits(o.experts, out.experts)) << "a finite-difference step changed the selection";
    return dot(g, o.weights) + dot(h, o.scores);
  };
  testing::expect_close("dlogits", dlogits, numeric_grad(logits, loss, 1e-2f), 2e-4, 1e-3);
}

TEST(MoeRouter, SoftmaxTopKRenormalisedAsMixtral) {
  Rng rng(101);
  for (int64_t n : {1, 31, 33}) {
    const Tensor logits = separated_logits(n, 8, rng);
    MoeRouting r{2, MoeScoreFunction::kSoftmax, true, 1.0f, 1, 1};
    expect_router_matches_reference(logits, Tensor(), r);
    expect_router_gradient(logits, Tensor(), r, rng);
  }
}

TEST(MoeRouter, SoftmaxBeforeTopKAsQwen3MoeWithoutNormTopkProb) {
  Rng rng(102);
  const Tensor logits = separated_logits(17, 6, rng);
  MoeRouting r{3, MoeScoreFunction::kSoftmax, false, 1.0f, 1, 1};
  expect_router_matches_reference(logits, Tensor(), r);
  expect_router_gradient(logits, Tensor(), r, rng);
}

TEST(MoeRouter, SigmoidWithBiasGroupsAndScalingAsDeepSeekV3) {
  Rng rng(103);
  const Tensor logits = separated_logits(9, 16, rng);
  // A bias large enough to change which experts win, not what they weigh.
  Tensor bias = random_tensor({16}, rng, 0.3f);
  MoeRouting r{4, MoeScoreFunction::kSigmoid, true, 2.5f, 4, 2};
  expect_router_matches_reference(logits, bias, r);
  expect_router_gradient(logits, bias, r, rng);
  // Every token's experts lie in at most group_topk groups.
  const RouterOut out = route(logits, bias, r);
  for (int64_t t = 0; t < 9; ++t) {
    std::vector<int> groups;
    for (int64_t j = 0; j < 4; ++j) groups.push_back(out.experts.i32()[t * 4 + j] / 4);
    std::sort(groups.begin(), groups.end());
    EXPECT_LE(std::unique(groups.begin(), groups.end()) - groups.begin(), 2);
  }
}

TEST(MoeRouter, BadTopKNamesTheOp) {
  const Tensor logits = Tensor::zeros({2, 4}, DType::kF32);
  MoeRouting r{5, MoeScoreFunction::kSoftmax, true, 1.0f, 1, 1};
  RouterOut out{Tensor::empty({2, 4}, DType::kF32), Tensor::empty({2, 5}, DType::kI32), Tensor::empty({2, 5}, DType::kF32)};
  const std::string message =
      testing::message_of<Error>([&] { ops::moe_router_forward(logits, Tensor(), r, out.scores, out.experts, out.weights); });
  EXPECT_NE(message.find("[op moe_router_forward] top-k 5 of 4 experts"), std::string::npos) << message;
}

// Random routing of n tokens to k distinct experts each (expert `empty` never chosen).
Tensor random_routing(int64_t n, int64_t k, int64_t experts, int64_t empty, Rng& rng) {
  Tensor chosen = Tensor::empty({n, k}, DType::kI32);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> pool;
    for (int32_t e = 0; e < experts; ++e) {
      if (e != empty) pool.push_back(e);
    }
    for (int64_t j = 0; j < k; ++j) {
      const size_t pick = j + rng.next_u64() % (pool.size() - j);
      std::swap(pool[j], pool[pick]);
      chosen.i32()[t * k + j] = pool[j];
    }
  }
  return chosen;
}

struct Sorted {
  Tensor slots, offsets;
};

Sorted sort(const Tensor& chosen, int64_t experts) {
  Sorted s{Tensor::empty({chosen.numel()}, DType::kI32), Tensor::empty({experts + 1}, DType::kI32)};
  ops::moe_sort(chosen, s.slots, s.offsets);
  return s;
}

TEST(MoeSort, ExpertOrderTokensAscendingCountsAsOffsets) {
  Rng rng(104);
  for (int64_t n : {1, 31, 33}) {
    const int64_t k = 2, experts = 5;
    const Tensor chosen = random_routing(n, k, experts, 3, rng);
    const Sorted s = sort(chosen, experts);
    int64_t row = 0;
    for (int32_t e = 0; e < experts; ++e) {
      EXPECT_EQ(s.offsets.i32()[e], row);
      for (int64_t entry = 0; entry < n * k; ++entry) {  // the entries of e, in ascending order
        if (chosen.i32()[entry] == e) {
          EXPECT_EQ(s.slots.i32()[row++], entry);
        }
      }
    }
    EXPECT_EQ(s.offsets.i32()[experts], n * k);
    EXPECT_EQ(s.offsets.i32()[4] - s.offsets.i32()[3], 0);  // expert 3 got no token
  }
}

TEST(MoeSort, ExpertOutOfRangeIsAnError) {
  Tensor chosen = Tensor::zeros({2, 1}, DType::kI32);
  chosen.i32()[1] = 7;
  const std::string message = testing::message_of<Error>([&] { sort(chosen, 4); });
  EXPECT_NE(message.find("names expert 7 of 4"), std::string::npos) << message;
}

// Expert capacity: Megatron's formula ceil(tokens·k / E × factor); an expert out of range names the routing entry, a
// wrong shape the op and the tensor. The sequence-level aux loss needs whole sequences.
TEST(MoeCapacity, MegatronsCapacityAndErrorsNameTheOp) {
  EXPECT_EQ(ops::moe_expert_capacity(24, 2, 4, 0.5), 6);
  EXPECT_EQ(ops::moe_expert_capacity(10, 2, 8, 1.0), 3);  // ceil(2.5)
  EXPECT_EQ(ops::moe_expert_capacity(4096, 8, 128, 1.25), 320);
  Tensor chosen = Tensor::zeros({2, 1}, DType::kI32);
  chosen.i32()[1] = 7;
  Tensor weights = Tensor::empty({2, 1}, DType::kF32);
  weights.fill(0.5f);
  Tensor kept = Tensor::empty({2, 1}, DType::kI32);
  std::string message = testing::message_of<Error>([&] { ops::moe_capacity(chosen, weights, 4, 1, false, kept); });
  EXPECT_NE(message.find("[op moe_capacity] routing entry 1 names expert 7 of 4"), std::string::npos) << message;
  Tensor wide = Tensor::empty({2, 2}, DType::kI32);
  message = testing::message_of<Error>([&] { ops::moe_capacity(chosen, weights, 8, 1, false, wide); });
  EXPECT_NE(message.find("[op moe_capacity] kept_experts is"), std::string::npos) << message;
  const Tensor scores = Tensor::zeros({5, 4}, DType::kF32), topk = Tensor::zeros({5, 1}, DType::kI32);
  Tensor loss = Tensor::empty({1}, DType::kF32), none;
  message = testing::message_of<Error>([&] { ops::moe_seq_aux_loss(scores, topk, 2, 0.1f, false, 1.0f, loss, none); });
  EXPECT_NE(message.find("[op moe_seq_aux_loss] 5 tokens do not split into 2 sequences"), std::string::npos) << message;
}

// Padding to capacity: an expert with more rows than its padded capacity, or a padded tensor of the wrong shape, is
// an error naming the op (and the expert).
TEST(MoePadRows, AnExpertAboveItsCapacityNamesTheOp) {
  Tensor offsets = Tensor::empty({3}, DType::kI32);
  offsets.i32()[0] = 0;
  offsets.i32()[1] = 1;
  offsets.i32()[2] = 4;  // expert 1: 3 rows
  const Tensor rows = Tensor::zeros({4, 5}, DType::kF32);
  Tensor padded = Tensor::empty({4, 5}, DType::kF32);  // P = 2
  std::string message = testing::message_of<Error>([&] { ops::moe_pad_rows(rows, offsets, 2, padded); });
  EXPECT_NE(message.find("[op moe_pad_rows] local expert 1 has 3 rows, above its padded capacity 2"),
            std::string::npos)
      << message;
  Tensor back = Tensor::empty({4, 5}, DType::kF32);
  message = testing::message_of<Error>([&] { ops::moe_unpad_rows(padded, offsets, 2, back); });
  EXPECT_NE(message.find("[op moe_unpad_rows] local expert 1 has 3 rows"), std::string::npos) << message;
  Tensor short_padded = Tensor::empty({5, 5}, DType::kF32);
  message = testing::message_of<Error>([&] { ops::moe_pad_rows(rows, offsets, 3, short_padded); });
  EXPECT_NE(message.find("[op moe_pad_rows] padded"), std::string::npos) << message;
}

// Token rows may be bf16 on cuda only: the f32 CPU backend refuses them naming the op and the tensor.
TEST(MoePermute, Bf16RowsOnTheCpuNameTheOp) {
  const Tensor x = Tensor::zeros({2, 4}, DType::kBF16), slots = Tensor::zeros({4}, DType::kI32);
  Tensor out = Tensor::empty({4, 4}, DType::kBF16);
  const std::string message = testing::message_of<Error>([&] { ops::moe_permute(x, slots, 2, out); });
  EXPECT_NE(message.find("[op moe_permute] x is"), std::string::npos) << message;
  EXPECT_NE(message.find("but must be f32"), std::string::npos) << message;
}

TEST(MoePermute, GatherAndWeightedScatterWithGradients) {
  Rng rng(105);
  for (int64_t n : {1, 31, 33}) {
    const int64_t k = 3, experts = 6, c = 5, m = n * k;
    const Sorted s = sort(random_routing(n, k, experts, 0, rng), experts);
    Tensor x = random_tensor({n, c}, rng);
    Tensor y = random_tensor({m, c}, rng);
    Tensor weights = random_tensor({n, k}, rng);

    Tensor rows = Tensor::empty({m, c}, DType::kF32);
    ops::moe_permute(x, s.slots, k, rows);
    Tensor out = Tensor::empty({n, c}, DType::kF32);
    ops::moe_unpermute(y, s.slots, weights, out);
    Tensor want = Tensor::zeros({n, c}, DType::kF32);
    for (int64_t r = 0; r < m; ++r) {
      const int32_t entry = s.slots.i32()[r];
      for (int64_t i = 0; i < c; ++i) {
        EXPECT_EQ(rows.f32()[r * c + i], x.f32()[(entry / k) * c + i]);
        want.f32()[(entry / k) * c + i] += weights.f32()[entry] * y.f32()[r * c + i];
      }
    }
    testing::expect_close("unpermute", out, want, 1e-6);

    const Tensor g_rows = random_tensor({m, c}, rng), g_out = random_tensor({n, c}, rng);
    Tensor dx = Tensor::empty({n, c}, DType::kF32);
    ops::moe_permute_backward(g_rows, s.slots, k, dx);
    auto permute_loss = [&] {
      ops::moe_permute(x, s.slots, k, rows);
      return dot(g_rows, rows);
    };
    testing::expect_close("permute dx", dx, numeric_grad(x, permute_loss, 1e-2f), 1e-4, 1e-3);

    Tensor dy = Tensor::empty({m, c}, DType::kF32), dweights = Tensor::empty({n, k}, DType::kF32);
    ops::moe_unpermute_backward(y, s.slots, weights, g_out, dy, dweights);
    auto unpermute_loss = [&] {
      ops::moe_unpermute(y, s.slots, weights, out);
      return dot(g_out, out);
    };
    testing::expect_close("unpermute dy", dy, numeric_grad(y, unpermute_loss, 1e-2f), 1e-4, 1e-3);
    testing::expect_close("unpermute dweights", dweights, numeric_grad(weights, unpermute_loss, 1e-2f), 1e-4, 1e-3);
  }
}

TEST(GroupedLinear, OneGemmPerExpertWithGradients) {
  Rng rng(106);
  for (int64_t n : {1, 31, 33}) {
    const int64_t k = 2, experts = 4, in = 7, out_features = 5, m = n * k;
    const Sorted s = sort(random_routing(n, k, experts, 2, rng), experts);  // expert 2: no rows
    Tensor x = random_tensor({m, in}, rng);
    Tensor w = random_tensor({experts, out_features, in}, rng);
    Tensor y = Tensor::empty({m, out_features}, DType::kF32);
    ops::grouped_linear_forward(x, w, s.offsets, y);
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t r = s.offsets.i32()[e]; r < s.offsets.i32()[e + 1]; ++r) {
        for (int64_t o = 0; o < out_features; ++o) {
          double want = 0.0;
          for (int64_t i = 0; i < in; ++i) want += static_cast<double>(x.f32()[r * in + i]) * w.f32()[(e * out_features + o) * in + i];
          EXPECT_NEAR(y.f32()[r * out_features + o], want, 1e-5);
        }
      }
    }
    const Tensor g = random_tensor({m, out_features}, rng);
    Tensor dx = Tensor::empty({m, in}, DType::kF32);
    Tensor dw = Tensor::empty({experts, out_features, in}, DType::kF32);
    ops::fill(dw, 1.0f);  // accumulated into
    ops::grouped_linear_backward(x, w, s.offsets, g, dx, dw);
    auto loss = [&] {
      ops::grouped_linear_forward(x, w, s.offsets, y);
      return dot(g, y);
    };
    testing::expect_close("dx", dx, numeric_grad(x, loss, 1e-2f), 1e-4, 1e-3);
    Tensor want_dw = numeric_grad(w, loss, 1e-2f);
    for (int64_t i = 0; i < want_dw.numel(); ++i) want_dw.f32()[i] += 1.0f;
    testing::expect_close("dw", dw, want_dw, 1e-4, 1e-3);
  }
}

// x, w, y, dy and dx share one dtype, f32 or bf16; dw is always f32. Each violation names the op and the tensor.
TEST(GroupedLinear, DtypesNameTheOpAndTensor) {
  const int64_t m = 4, experts = 2, in = 3, out = 5;
  Tensor offsets = Tensor::empty({experts + 1}, DType::kI32);
  offsets.i32()[0] = 0;
  offsets.i32()[1] = 1;
  offsets.i32()[2] = static_cast<int32_t>(m);
  auto t = [](const Shape& shape, DType dtype) { return Tensor::zeros(shape, dtype); };
  auto forward_error = [&](DType x, DType w, DType y) {
    Tensor out_y = t({m, out}, y);
    return testing::message_of<Error>(
        [&] { ops::grouped_linear_forward(t({m, in}, x), t({experts, out, in}, w), offsets, out_y); });
  };
  auto backward_error = [&](DType dy, DType dx, DType dw) {
    Tensor gx = t({m, in}, dx), gw = t({experts, out, in}, dw);
    return testing::message_of<Error>([&] {
      ops::grouped_linear_backward(t({m, in}, DType::kBF16), t({experts, out, in}, DType::kBF16), offsets,
                                   t({m, out}, dy), gx, gw);
    });
  };
  const std::string bad_x = forward_error(DType::kI32, DType::kI32, DType::kI32);
  EXPECT_NE(bad_x.find("[op grouped_linear_forward] x is"), std::string::npos) << bad_x;
  EXPECT_NE(bad_x.find("must be f32 or bf16"), std::string::npos) << bad_x;
  const std::string mixed_w = forward_error(DType::kBF16, DType::kF32, DType::kBF16);
  EXPECT_NE(mixed_w.find("[op grouped_linear_forward] w is"), std::string::npos) << mixed_w;
  const std::string mixed_y = forward_error(DType::kBF16, DType::kBF16, DType::kF32);
  EXPECT_NE(mixed_y.find("[op grouped_linear_forward] y is"), std::string::npos) << mixed_y;
  const std::string mixed_dy = backward_error(DType::kF32, DType::kBF16, DType::kF32);
  EXPECT_NE(mixed_dy.find("[op grouped_linear_backward] dy is"), std::string::npos) << mixed_dy;
  const std::string mixed_dx = backward_error(DType::kBF16, DType::kF32, DType::kF32);
  EXPECT_NE(mixed_dx.find("[op grouped_linear_backward] dx is"), std::string::npos) << mixed_dx;
  const std::string bf16_dw = backward_error(DType::kBF16, DType::kBF16, DType::kBF16);
  EXPECT_NE(bf16_dw.find("[op grouped_linear_backward] dw is"), std::string::npos) << bf16_dw;
}

TEST(MoeLosses, AuxLossMatchesTheSwitchFormulaWithGradient) {
  Rng rng(107);
  for (const bool sigmoid : {false, true}) {
    const int64_t n = 13, experts = 6, k = 2;
    const Tensor logits = separated_logits(n, experts, rng);
    const RouterOut routed =
        route(logits, Tensor(), MoeRouting{k, sigmoid ? MoeScoreFunction::kSigmoid : MoeScoreFunction::kSoftmax,
                                           true, 1.0f, 1, 1});
    Tensor scores = routed.scores;
    const Sorted s = sort(routed.experts, experts);
    const float coeff = 0.3f, grad_scale = 0.7f;
    Tensor loss = Tensor::empty({1}, DType::kF32), dscores = Tensor::empty({n, experts}, DType::kF32);
    ops::moe_aux_loss(scores, s.offsets, k, coeff, sigmoid, grad_scale, loss, dscores);
    auto reference = [&] {
      double total = 0.0;
      for (int64_t t = 0; t < n; ++t) {
        double row = sigmoid ? 1e-20 : 1.0;
        if (sigmoid) {
          for (int64_t e = 0; e < experts; ++e) row += scores.f32()[t * experts + e];
        }
        for (int64_t e = 0; e < experts; ++e) {
          total += (s.offsets.i32()[e + 1] - s.offsets.i32()[e]) * (scores.f32()[t * experts + e] / row);
        }
      }
      return coeff * experts / (static_cast<double>(k) * n * n) * total;
    };
    EXPECT_NEAR(loss.f32()[0], reference(), 1e-6 * reference());
    Tensor want = numeric_grad(scores, reference, 1e-3f);
    ops::scale_inplace(want, grad_scale);
    testing::expect_close(sigmoid ? "aux dscores (sigmoid)" : "aux dscores (softmax)", dscores, want, 1e-4, 1e-5);
  }
}

TEST(MoeLosses, ZLossMatchesItsFormulaAndAccumulatesItsGradient) {
  Rng rng(108);
  const int64_t n = 31, experts = 5;
  Tensor logits = random_tensor({n, experts}, rng, 2.0f);
  const float coeff = 0.01f, grad_scale = 2.0f;
  Tensor loss = Tensor::empty({1}, DType::kF32), dlogits = Tensor::empty({n, experts}, DType::kF32);
  ops::fill(dlogits, 0.5f);
  ops::moe_z_loss(logits, coeff, grad_scale, loss, dlogits);
  auto reference = [&] {
    double total = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      double sum = 0.0;
      for (int64_t e = 0; e < experts; ++e) sum += std::exp(static_cast<double>(logits.f32()[t * experts + e]));
      total += std::log(sum) * std::log(sum);
    }
    return coeff * total / n;
  };
  EXPECT_NEAR(loss.f32()[0], reference(), 1e-6 * reference());
  Tensor want = numeric_grad(logits, reference, 1e-2f);
  ops::scale_inplace(want, grad_scale);
  for (int64_t i = 0; i < want.numel(); ++i) want.f32()[i] += 0.5f;
  testing::expect_close("z dlogits", dlogits, want, 1e-4, 1e-5);
}

}  // namespace
}  // namespace primus
