// Every op through src/ops on the CPU backend against a naive double-precision reference written here, on fresh
// random inputs at awkward sizes (1, 3, 31, 32, 33 rows; head sizes 8 and 16; GQA and plain heads; T = 1, 17).
// Outputs are poisoned with NaN first, so an element a kernel forgets to write fails the comparison.
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

using primus::testing::expect_close;
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

// ---- gemm and linear ------------------------------------------------------------------------------------------

std::vector<double> ref_gemm(const Tensor& a, const Tensor& b, const Tensor& c0, bool ta, bool tb, double alpha,
                             double beta, int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a.f32()[p * m + i] : a.f32()[i * k + p];
        const double bv = tb ? b.f32()[j * k + p] : b.f32()[p * n + j];
        s += av * bv;
      }
      c[i * n + j] = alpha * s + (beta != 0.0 ? beta * c0.f32()[i * n + j] : 0.0);
    }
  }
  return c;
}

// Initialisation: element k is the k-th draw of one sequential Rng stream, whatever the parallel split, at the
// requested scale.
TEST(OpsForward, FillNormalDrawsOneSequentialStream) {
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

TEST(OpsForward, GemmAllTransposesAndBetas) {
  Rng rng(101);
  const int64_t sizes[][3] = {{1, 3, 8}, {31, 33, 16}, {32, 17, 33}, {3, 1, 1}};
  for (const auto& s : sizes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 0.5f}) {
          SCOPED_TRACE(fmt::format("m={} n={} k={} ta={} tb={} beta={}", m, n, k, ta, tb, beta));
          Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, rng);
          Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, rng);
          Tensor c = beta == 0.0f ? poisoned({m, n}) : random_tensor({m, n}, rng);
          const Tensor c0 = copy_of(c);
          GemmArgs args{&a, &b, &c, ta == 1, tb == 1, 0.7f, beta};
          ops::gemm(args);
          expect_near(c, ref_gemm(a, b, c0, ta, tb, 0.7, beta, m, n, k), 1e-5, "c");
        }
      }
    }
  }
}

TEST(OpsForward, GemmEmptyInnerDimension) {
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

TEST(OpsForward, LinearForwardBackwardWithLeadingDims) {
  Rng rng(103);
  const int64_t in = 8, out = 5;
  Tensor x = random_tensor({2, 3, in}, rng);  // [B, T, in]
  Tensor w = random_tensor({out, in}, rng);
  Tensor y = poisoned({2, 3, out});
  ops::linear_forward(x, w, y);
  const Tensor x2 = x.reshape({6, in});
  expect_near(y, ref_gemm(x2, w, y, false, true, 1.0, 0.0, 6, out, in), 1e-5, "y");

  Tensor dy = random_tensor({2, 3, out}, rng);
  Tensor dx = poisoned({2, 3, in});
  Tensor dw = random_tensor({out, in}, rng);  // accumulated into
  const Tensor dw0 = copy_of(dw);
  ops::linear_backward(x, w, dy, dx, dw);
  const Tensor dy2 = dy.reshape({6, out});
  expect_near(dx, ref_gemm(dy2, w, dx, false, false, 1.0, 0.0, 6, in, out), 1e-5, "dx");
  expect_near(dw, ref_gemm(dy2, x2, dw0, true, false, 1.0, 1.0, out, in, 6), 1e-5, "dw");

  // An undefined output is skipped; the other is still produced.
  Tensor none;
  Tensor dx_only = poisoned({2, 3, in});
  ops::linear_backward(x, w, dy, dx_only, none);
  expect_near(dx_only, values(dx), 0.0, "dx alone");
}

// ---- embedding ------------------------------------------------------------------------------------------------

TEST(OpsForward, EmbeddingGatherAndScatterWithRepeatedIds) {
  Rng rng(104);
  for (int64_t n : {1, 3, 33}) {
    for (int64_t channels : {3, 16, 40}) {
      SCOPED_TRACE(fmt::format("n={} c={}", n, channels));
      const int64_t vocab = 7;  // fewer rows than tokens: ids repeat
      Tensor ids = random_ids({n}, vocab, rng);
      Tensor table = random_tensor({vocab, channels}, rng);
      Tensor out = poisoned({n, channels});
      ops::embedding_forward(ids, table, out);
      std::vector<double> want(static_cast<size_t>(n * channels));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < channels; ++c) want[i * channels + c] = table.f32()[ids.i32()[i] * channels + c];
      expect_near(out, want, 0.0, "out");

      Tensor dout = random_tensor({n, channels}, rng);
      Tensor dtable = random_tensor({vocab, channels}, rng);
      std::vector<double> dwant = values(dtable);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < channels; ++c) dwant[ids.i32()[i] * channels + c] += dout.f32()[i * channels + c];
      ops::embedding_backward(ids, dout, dtable);
      expect_near(dtable, dwant, 1e-6, "dtable");
    }
  }
}

TEST(OpsForward, EmbeddingAcceptsBatchShapedIds) {
  Rng rng(105);
  Tensor ids = random_ids({2, 5}, 11, rng);
  Tensor table = random_tensor({11, 8}, rng);
  Tensor out = poisoned({2, 5, 8});
  ops::embedding_forward(ids, table, out);
  EXPECT_EQ(out.f32()[(1 * 5 + 3) * 8 + 2], table.f32()[ids.i32()[8] * 8 + 2]);
}

// ---- rmsnorm --------------------------------------------------------------------------------------------------

TEST(OpsForward, RmsNormForwardBackwardClosedForm) {
  Rng rng(106);
  const double eps = 1e-5;
  for (int64_t rows : {1, 3, 31, 32, 33}) {
    for (int64_t channels : {8, 16, 33}) {
      SCOPED_TRACE(fmt::format("rows={} c={}", rows, channels));
      Tensor x = random_tensor({rows, channels}, rng, 2.0f);
      Tensor w = random_tensor({channels}, rng);
      Tensor y = poisoned({rows, channels});
      Tensor rstd = poisoned({rows});
      ops::rmsnorm_forward(x, w, static_cast<float>(eps), y, rstd);

      Tensor dy = random_tensor({rows, channels}, rng);
      Tensor dx = poisoned({rows, channels});
      Tensor dw = random_tensor({channels}, rng);
      std::vector<double> want_y(rows * channels), want_r(rows), want_dx(rows * channels), want_dw = values(dw);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x.f32() + r * channels;
        const float* dyr = dy.f32() + r * channels;
        double ms = 0.0;
        for (int64_t c = 0; c < channels; ++c) ms += double(xr[c]) * xr[c];
        const double s = 1.0 / std::sqrt(ms / channels + eps);
        want_r[r] = s;
        double dot = 0.0;
        for (int64_t c = 0; c < channels; ++c) {
          want_y[r * channels + c] = w.f32()[c] * xr[c] * s;
          dot += double(dyr[c]) * w.f32()[c] * xr[c] * s;
          want_dw[c] += double(dyr[c]) * xr[c] * s;
        }
        for (int64_t c = 0; c < channels; ++c)
          want_dx[r * channels + c] = s * (double(dyr[c]) * w.f32()[c] - xr[c] * s * dot / channels);
      }
      expect_near(y, want_y, 1e-6, "y");
      expect_near(rstd, want_r, 1e-6, "rstd");
      ops::rmsnorm_backward(dy, x, w, rstd, dx, dw);
      expect_near(dx, want_dx, 1e-5, "dx");
      expect_near(dw, want_dw, 1e-5, "dweight");
    }
  }
}

TEST(OpsForward, RmsNormOverHeadsOfA4dTensor) {
  Rng rng(107);
  Tensor x = random_tensor({2, 3, 4, 8}, rng);  // [B, T, H, D], normalised over D (Qwen3 qk-norm)
  Tensor w = random_tensor({8}, rng);
  Tensor y = poisoned(x.shape());
  Tensor rstd = poisoned({2, 3, 4});
  ops::rmsnorm_forward(x, w, 1e-6f, y, rstd);
  Tensor y2 = poisoned({24, 8});
  Tensor rstd2 = poisoned({24});
  ops::rmsnorm_forward(x.reshape({24, 8}), w, 1e-6f, y2, rstd2);
  expect_near(y, values(y2), 0.0, "same as flat rows");
  expect_near(rstd, values(rstd2), 0.0, "rstd");
}

// ---- rope -----------------------------------------------------------------------------------------------------

TEST(OpsForward, RopeRotatesHalvesAndBackwardInverts) {
  Rng rng(108);
  for (int64_t head_dim : {8, 16}) {
    for (int64_t seq : {1, 17}) {
      SCOPED_TRACE(fmt::format("D={} T={}", head_dim, seq));
      const int64_t batch = 2, heads = 3, half = head_dim / 2;
      Tensor cos = Tensor::empty({seq, half}, DType::kF32);
      Tensor sin = Tensor::empty({seq, half}, DType::kF32);
      for (int64_t t = 0; t < seq; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          const double angle = t * std::pow(10000.0, -2.0 * i / head_dim) + 0.3;
          cos.f32()[t * half + i] = static_cast<float>(std::cos(angle));
          sin.f32()[t * half + i] = static_cast<float>(std::sin(angle));
        }
      }
      Tensor x = random_tensor({batch, seq, heads, head_dim}, rng);
      const Tensor x0 = copy_of(x);
      std::vector<double> want(x.numel());
      for (int64_t v = 0; v < batch * seq * heads; ++v) {
        const int64_t t = (v / heads) % seq;
        for (int64_t i = 0; i < half; ++i) {
          const double a = x0.f32()[v * head_dim + i], b = x0.f32()[v * head_dim + half + i];
          const double c = cos.f32()[t * half + i], s = sin.f32()[t * half + i];
          want[v * head_dim + i] = a * c - b * s;
          want[v * head_dim + half + i] = b * c + a * s;
        }
      }
      ops::rope_forward(x, cos, sin);
      expect_near(x, want, 1e-6, "rotated");
      ops::rope_backward(x, cos, sin);
      expect_near(x, values(x0), 1e-6, "inverse rotation restores x");
    }
  }
}

TEST(OpsForward, RopeAtPerTokenPositions) {
  // Packed documents (reset_position_ids): token (b, t) rotates by table row positions[b, t] of a table with any
  // number of rows P. Positions here are random in [0, P), P > T, so rows beyond T are read too.
  Rng rng(112);
  for (int64_t head_dim : {8, 16}) {
    for (int64_t seq : {1, 17}) {
      SCOPED_TRACE(fmt::format("D={} T={}", head_dim, seq));
      const int64_t batch = 2, heads = 3, half = head_dim / 2, rows = seq + 5;
      const Tensor cos = random_tensor({rows, half}, rng), sin = random_tensor({rows, half}, rng);
      const Tensor positions = random_ids({batch, seq}, rows, rng);
      Tensor x = random_tensor({batch, seq, heads, head_dim}, rng);
      const Tensor x0 = copy_of(x);
      std::vector<double> want(x.numel()), want_back(x.numel());
      for (int64_t v = 0; v < batch * seq * heads; ++v) {
        const int64_t p = positions.i32()[v / heads];
        for (int64_t i = 0; i < half; ++i) {
          const double a = x0.f32()[v * head_dim + i], b = x0.f32()[v * head_dim + half + i];
          const double c = cos.f32()[p * half + i], s = sin.f32()[p * half + i];
          want[v * head_dim + i] = a * c - b * s;
          want[v * head_dim + half + i] = b * c + a * s;
          want_back[v * head_dim + i] = a * c + b * s;
          want_back[v * head_dim + half + i] = b * c - a * s;
        }
      }
      ops::rope_forward(x, cos, sin, positions);
      expect_near(x, want, 1e-6, "rotated");
      x.copy_from(x0);
      ops::rope_backward(x, cos, sin, positions);
      expect_near(x, want_back, 1e-6, "transposed rotation");
    }
  }
}

TEST(OpsForward, RopePositionsCountingUpEqualPlainRope) {
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

// ---- swiglu ---------------------------------------------------------------------------------------------------

TEST(OpsForward, SwiGluForwardBackwardClosedForm) {
  Rng rng(109);
  for (int64_t rows : {1, 31, 33}) {
    SCOPED_TRACE(fmt::format("rows={}", rows));
    const int64_t f = 24;
    Tensor gate_up = random_tensor({rows, 2 * f}, rng, 3.0f);  // per row: gate, then up
    Tensor dout = random_tensor({rows, f}, rng);
    Tensor out = poisoned({rows, f});
    Tensor dgate_up = poisoned({rows, 2 * f});
    ops::swiglu_forward(gate_up, out);
    ops::swiglu_backward(gate_up, dout, dgate_up);
    std::vector<double> want(rows * f), want_grad(rows * 2 * f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < f; ++i) {
        const double g = gate_up.f32()[r * 2 * f + i], u = gate_up.f32()[r * 2 * f + f + i];
        const double d = dout.f32()[r * f + i];
        const double sig = 1.0 / (1.0 + std::exp(-g));
        want[r * f + i] = g * sig * u;
        want_grad[r * 2 * f + i] = d * u * (sig + g * sig * (1.0 - sig));
        want_grad[r * 2 * f + f + i] = d * g * sig;
      }
    }
    expect_near(out, want, 1e-6, "out");
    expect_near(dgate_up, want_grad, 1e-6, "dgate_up");
    ops::swiglu_backward(gate_up, dout, gate_up);  // written over its input, as the MLP does
    expect_near(gate_up, want_grad, 1e-6, "dgate_up in place");
  }
}

// ---- cross-entropy --------------------------------------------------------------------------------------------

TEST(OpsForward, CrossEntropyWithIgnoredRowsAndAliasedGradient) {
  Rng rng(110);
  for (int64_t rows : {1, 3, 33}) {
    for (int64_t vocab : {5, 64}) {
      SCOPED_TRACE(fmt::format("rows={} V={}", rows, vocab));
      Tensor logits = random_tensor({rows, vocab}, rng, 4.0f);
      Tensor targets = random_ids({rows}, vocab, rng);
      if (rows > 1) targets.i32()[1] = -100;
      targets.i32()[rows - 1] = -1;  // a single row that is ignored: loss 0, gradient 0
      Tensor losses = poisoned({rows});
      Tensor lse = poisoned({rows});
      ops::cross_entropy_forward(logits, targets, losses, lse);

      const float scale = 0.25f;
      std::vector<double> want_loss(rows), want_lse(rows), want_d(rows * vocab);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = logits.f32() + r * vocab;
        double max = row[0];
        for (int64_t v = 1; v < vocab; ++v) max = std::max(max, double(row[v]));
        double sum = 0.0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
        want_lse[r] = max + std::log(sum);
        const int32_t t = targets.i32()[r];
        want_loss[r] = t < 0 ? 0.0 : want_lse[r] - row[t];
        for (int64_t v = 0; v < vocab; ++v)
          want_d[r * vocab + v] = t < 0 ? 0.0 : scale * (std::exp(row[v] - want_lse[r]) - (v == t ? 1.0 : 0.0));
      }
      expect_near(losses, want_loss, 1e-6, "losses");
      expect_near(lse, want_lse, 1e-6, "lse");

      Tensor dlogits = poisoned({rows, vocab});
      ops::cross_entropy_backward(logits, targets, lse, scale, dlogits);
      expect_near(dlogits, want_d, 1e-5, "dlogits");
      for (int64_t v = 0; v < vocab; ++v) EXPECT_EQ(dlogits.f32()[(rows - 1) * vocab + v], 0.0f);

      // In place: dlogits is logits itself, and the bits match the separate buffer.
      ops::cross_entropy_backward(logits, targets, lse, scale, logits);
      EXPECT_EQ(std::memcmp(logits.data(), dlogits.data(), dlogits.nbytes()), 0);
    }
  }
}

TEST(OpsForward, CrossEntropyAcceptsBatchShapes) {
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
TEST(OpsForward, VocabParallelCrossEntropyStepsOfOneShard) {
  Rng rng(112);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t cols : {1, 31, 32, 33, 257}) {
      SCOPED_TRACE(fmt::format("rows={} Vl={}", rows, cols));
      const VocabShard shard{5, cols + 12};
      Tensor logits = random_tensor({rows, cols}, rng, 3.0f);
      Tensor targets = random_ids({rows}, shard.total, rng);
      for (int64_t r = 0; r < rows; r += 2) {
        targets.i32()[r] = static_cast<int32_t>(shard.begin + static_cast<int64_t>(rng.below(cols)));
      }
      if (rows > 1) targets.i32()[1] = -100;
      targets.i32()[rows - 1] = -1;

      Tensor max = poisoned({rows});
      ops::row_max(logits, max);
      std::vector<double> want_max(rows);
      for (int64_t r = 0; r < rows; ++r) {
        want_max[r] = *std::max_element(logits.f32() + r * cols, logits.f32() + (r + 1) * cols);
      }
      expect_near(max, want_max, 0.0, "row_max");

      // The group's max: this shard's, or larger where another rank holds a larger logit.
      Tensor group_max = copy_of(max);
      for (int64_t r = 0; r < rows; r += 3) group_max.f32()[r] += 1.5f;
      Tensor sum_exp = poisoned({rows}), target_logit = poisoned({rows});
      ops::cross_entropy_shard_stats(logits, targets, shard, group_max, sum_exp, target_logit);
      std::vector<double> want_sum(rows), want_target(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = logits.f32() + r * cols;
        for (int64_t v = 0; v < cols; ++v) want_sum[r] += std::exp(double(row[v]) - group_max.f32()[r]);
        const int64_t t = targets.i32()[r] - shard.begin;
        want_target[r] = targets.i32()[r] >= 0 && t >= 0 && t < cols ? row[t] : 0.0;
      }
      expect_near(sum_exp, want_sum, 1e-6, "sum_exp");
      expect_near(target_logit, want_target, 0.0, "target_logit");

      // Finish on this shard's statistics as if they were the group's sums.
      Tensor losses = poisoned({rows}), lse = poisoned({rows});
      ops::cross_entropy_finish(group_max, sum_exp, target_logit, targets, losses, lse);
      std::vector<double> want_lse(rows), want_loss(rows);
      for (int64_t r = 0; r < rows; ++r) {
        want_lse[r] = group_max.f32()[r] + std::log(double(sum_exp.f32()[r]));
        want_loss[r] = targets.i32()[r] < 0 ? 0.0 : want_lse[r] - target_logit.f32()[r];
      }
      expect_near(lse, want_lse, 1e-6, "lse");
      expect_near(losses, want_loss, 1e-6, "losses");

      const float scale = 0.25f;
      std::vector<double> want_d(rows * cols);
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t t = targets.i32()[r];
        for (int64_t v = 0; v < cols; ++v) {
          const double onehot = v + shard.begin == t ? 1.0 : 0.0;
          want_d[r * cols + v] = t < 0 ? 0.0 : scale * (std::exp(logits.f32()[r * cols + v] - want_lse[r]) - onehot);
        }
      }
      Tensor dlogits = poisoned({rows, cols});
      ops::cross_entropy_backward(logits, targets, lse, scale, dlogits, shard);
      expect_near(dlogits, want_d, 1e-5, "dlogits");
      ops::cross_entropy_backward(logits, targets, lse, scale, logits, shard);  // in place: the same bits
      EXPECT_EQ(std::memcmp(logits.data(), dlogits.data(), dlogits.nbytes()), 0);
    }
  }
}

// The steps over 1 to 4 simulated ranks (even and uneven splits), reduced as the loss layer's all-reduces would,
// give the unsharded op's losses, lse and dlogits.
TEST(OpsForward, VocabParallelCrossEntropyEqualsUnsharded) {
  Rng rng(113);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t vocab : {12, 257}) {
      Tensor logits = random_tensor({rows, vocab}, rng, 3.0f);
      Tensor targets = random_ids({rows}, vocab, rng);
      for (int64_t r = 2; r < rows; r += 5) targets.i32()[r] = -1;
      const float scale = 1.0f / static_cast<float>(rows);
      Tensor losses = poisoned({rows}), lse = poisoned({rows}), dlogits = poisoned({rows, vocab});
      ops::cross_entropy_forward(logits, targets, losses, lse);
      ops::cross_entropy_backward(logits, targets, lse, scale, dlogits);
      for (int ranks = 1; ranks <= 4; ++ranks) {
        const std::string what = fmt::format("rows={} V={} ranks={}", rows, vocab, ranks);
        const testing::VocabParallelLoss split = testing::vocab_parallel_cross_entropy(logits, targets, ranks, scale);
        expect_close("losses " + what, split.losses, losses, 1e-6);
        expect_close("lse " + what, split.lse, lse, 1e-6);
        expect_close("dlogits " + what, split.dlogits, dlogits, 1e-6);
      }
    }
  }
}

// Rows of the table split over 1 to 4 ranks: the ranks' outputs sum to the unsharded output (every id is held by
// one rank, the others give zeros), and their dtables are the row slices of the unsharded one, bit for bit.
TEST(OpsForward, VocabParallelEmbeddingEqualsUnsharded) {
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
