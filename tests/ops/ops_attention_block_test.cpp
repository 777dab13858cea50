// Ring attention's ops on the CPU backend: a query block against a key/value block (causal or unmasked) with its
// log-sum-exp, the merge of partial results through their log-sum-exps, and the backward of a block from the merged
// output and log-sum-exp (each op alone: the attention_block_* cases of support/op_cases.cpp). Checked here against
// the whole causal attention that the blocks of a sequence split in two (as the load-balanced split of context
// parallelism cuts it) make up: merged forward blocks must give the whole's out and lse, and the blocks' gradient
// contributions must sum to the whole's dq, dk and dv. GQA (Hq 6, Hkv 2) and plain heads; outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "support/test_support.h"

namespace primus {
namespace {

using primus::testing::random_tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

Tensor poisoned(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  t.fill(kNaN);
  return t;
}

// max |got − want| / max(max |want|, floor) over all elements (every element finite). A floor makes the check
// absolute for values that are zero in exact arithmetic (dq, dk of a block of one key: its softmax is constant).
double relative_error(const Tensor& got, const std::vector<double>& want, double floor = 1e-30) {
  double worst = 0.0, scale = floor;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.f32()[i];
    if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::abs(g - want[static_cast<size_t>(i)]));
    scale = std::max(scale, std::abs(want[static_cast<size_t>(i)]));
  }
  return worst / scale;
}

std::vector<double> values(const Tensor& t) { return std::vector<double>(t.f32(), t.f32() + t.numel()); }

// Positions [begin, begin + len) of a [B, T, H, D] tensor: [B, len, H, D] (a copy).
Tensor seq_part(const Tensor& x, int64_t begin, int64_t len) {
  const int64_t B = x.dim(0), T = x.dim(1), row = x.dim(2) * x.dim(3);
  Tensor part = Tensor::empty({B, len, x.dim(2), x.dim(3)}, DType::kF32);
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(x.f32() + (b * T + begin) * row, len * row, part.f32() + b * len * row);
  }
  return part;
}

// Positions [begin, begin + len) of an lse [B, H, T]: [B, H, len].
Tensor lse_part(const Tensor& lse, int64_t begin, int64_t len) {
  const int64_t B = lse.dim(0), H = lse.dim(1), T = lse.dim(2);
  Tensor part = Tensor::empty({B, H, len}, DType::kF32);
  for (int64_t bh = 0; bh < B * H; ++bh) std::copy_n(lse.f32() + bh * T + begin, len, part.f32() + bh * len);
  return part;
}

// The two halves of a [B, 2C, H, D] tensor (or lse [B, H, 2C]) side by side again: the whole's layout.
Tensor join(const Tensor& first, const Tensor& second, bool stats) {
  const Tensor& a = first;
  Tensor whole;
  if (stats) {
    const int64_t BH = a.dim(0) * a.dim(1), C = a.dim(2);
    whole = Tensor::empty({a.dim(0), a.dim(1), 2 * C}, DType::kF32);
    for (int64_t i = 0; i < BH; ++i) {
      std::copy_n(a.f32() + i * C, C, whole.f32() + i * 2 * C);
      std::copy_n(second.f32() + i * C, C, whole.f32() + i * 2 * C + C);
    }
    return whole;
  }
  const int64_t B = a.dim(0), C = a.dim(1), row = a.dim(2) * a.dim(3);
  whole = Tensor::empty({B, 2 * C, a.dim(2), a.dim(3)}, DType::kF32);
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(a.f32() + b * C * row, C * row, whole.f32() + b * 2 * C * row);
    std::copy_n(second.f32() + b * C * row, C * row, whole.f32() + (b * 2 * C + C) * row);
  }
  return whole;
}

Tensor sum(const Tensor& a, const Tensor& b) {
  Tensor s = Tensor::empty(a.shape(), DType::kF32);
  for (int64_t i = 0; i < a.numel(); ++i) s.f32()[i] = a.f32()[i] + b.f32()[i];
  return s;
}

struct Heads {
  int64_t hq, hkv;
};

// The causal attention of a sequence of 2C tokens from blocks of C, as the load-balanced split cuts it (the first
// half against itself, causal; the second half against the first, unmasked, then against itself, causal), merged in
// either order; and the backward of each block from the merged out and lse, summed.
TEST(OpsAttentionBlock, BlocksOfASequenceMergeIntoTheWholeAttention) {
  Rng rng(902);
  for (const Heads heads : {Heads{6, 2}, Heads{4, 4}}) {
    for (const int64_t C : {1, 7, 16}) {
      for (const bool unmasked_first : {true, false}) {
        SCOPED_TRACE(fmt::format("Hq={} Hkv={} C={} unmasked block merged {}", heads.hq, heads.hkv, C,
                                 unmasked_first ? "first" : "second"));
        const int64_t B = 2, D = 16, T = 2 * C;
        Tensor q = random_tensor({B, T, heads.hq, D}, rng), k = random_tensor({B, T, heads.hkv, D}, rng);
        Tensor v = random_tensor(k.shape(), rng), dout = random_tensor(q.shape(), rng);
        Tensor whole_out = poisoned(q.shape()), whole_lse = poisoned({B, heads.hq, T});
        ops::attention_forward(q, k, v, whole_out, whole_lse);
        Tensor whole_dq = poisoned(q.shape()), whole_dk = poisoned(k.shape()), whole_dv = poisoned(k.shape());
        ops::attention_backward(q, k, v, whole_out, whole_lse, dout, whole_dq, whole_dk, whole_dv);

        const Tensor q0 = seq_part(q, 0, C), q1 = seq_part(q, C, C), k0 = seq_part(k, 0, C), k1 = seq_part(k, C, C);
        const Tensor v0 = seq_part(v, 0, C), v1 = seq_part(v, C, C);
        Tensor out0 = poisoned(q0.shape()), lse0 = poisoned({B, heads.hq, C});
        ops::attention_block_forward(q0, k0, v0, AttentionMask::kCausal, out0, lse0);
        Tensor out1 = poisoned(q1.shape()), lse1 = poisoned({B, heads.hq, C});
        Tensor later = poisoned(q1.shape()), later_lse = poisoned({B, heads.hq, C});
        if (unmasked_first) {
          ops::attention_block_forward(q1, k0, v0, AttentionMask::kNone, out1, lse1);
          ops::attention_block_forward(q1, k1, v1, AttentionMask::kCausal, later, later_lse);
        } else {
          ops::attention_block_forward(q1, k1, v1, AttentionMask::kCausal, out1, lse1);
          ops::attention_block_forward(q1, k0, v0, AttentionMask::kNone, later, later_lse);
        }
        ops::attention_merge(out1, lse1, later, later_lse);
        EXPECT_LE(relative_error(join(out0, out1, false), values(whole_out)), 1e-6) << "out";
        EXPECT_LE(relative_error(join(lse0, lse1, true), values(whole_lse)), 1e-6) << "lse";

        // Each block's contributions from the whole's out and lse.
        const Tensor o0 = seq_part(whole_out, 0, C), o1 = seq_part(whole_out, C, C);
        const Tensor l0 = lse_part(whole_lse, 0, C), l1 = lse_part(whole_lse, C, C);
        const Tensor g0 = seq_part(dout, 0, C), g1 = seq_part(dout, C, C);
        auto block = [&](const Tensor& qb, const Tensor& kb, const Tensor& vb, AttentionMask mask, const Tensor& ob,
                         const Tensor& lb, const Tensor& gb) {
          std::vector<Tensor> grads{poisoned(qb.shape()), poisoned(kb.shape()), poisoned(kb.shape())};
          ops::attention_block_backward(qb, kb, vb, mask, ob, lb, gb, grads[0], grads[1], grads[2]);
          return grads;
        };
        const std::vector<Tensor> a = block(q0, k0, v0, AttentionMask::kCausal, o0, l0, g0);  // dq0, dk0, dv0
        const std::vector<Tensor> b = block(q1, k0, v0, AttentionMask::kNone, o1, l1, g1);    // dq1, dk0, dv0
        const std::vector<Tensor> c = block(q1, k1, v1, AttentionMask::kCausal, o1, l1, g1);  // dq1, dk1, dv1
        const double floor = C == 1 ? 1.0 : 1e-30;  // the first query sees one key: its dq and that key's dk are 0
        EXPECT_LE(relative_error(join(a[0], sum(b[0], c[0]), false), values(whole_dq), floor), 1e-5) << "dq";
        EXPECT_LE(relative_error(join(sum(a[1], b[1]), c[1], false), values(whole_dk), floor), 1e-5) << "dk";
        EXPECT_LE(relative_error(join(sum(a[2], b[2]), c[2], false), values(whole_dv)), 1e-5) << "dv";
      }
    }
  }
}

TEST(OpsAttentionBlock, MergeFollowsTheLogSumExpFormula) {
  Rng rng(903);
  const int64_t B = 2, T = 3, H = 2, D = 5;
  Tensor out = random_tensor({B, T, H, D}, rng), block = random_tensor(out.shape(), rng);
  Tensor lse = random_tensor({B, H, T}, rng, 4.0f), block_lse = random_tensor(lse.shape(), rng, 4.0f);
  std::vector<double> want_out(out.numel()), want_lse(lse.numel());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t stat = (b * H + h) * T + t, row = ((b * T + t) * H + h) * D;
        const double a = lse.f32()[stat], c = block_lse.f32()[stat];
        const double merged = std::log(std::exp(a) + std::exp(c));
        want_lse[stat] = merged;
        for (int64_t i = 0; i < D; ++i) {
          want_out[row + i] = std::exp(a - merged) * out.f32()[row + i] + std::exp(c - merged) * block.f32()[row + i];
        }
      }
    }
  }
  ops::attention_merge(out, lse, block, block_lse);
  EXPECT_LE(relative_error(out, want_out), 1e-6);
  EXPECT_LE(relative_error(lse, want_lse), 1e-6);
}

// A row that has seen no key (lse −inf: out may hold anything) takes the block's row; a block that saw none changes
// nothing; both empty stays empty.
TEST(OpsAttentionBlock, MergeOfAnEmptySideTakesTheOther) {
  const int64_t D = 3;
  Tensor out = Tensor::empty({1, 3, 1, D}, DType::kF32), block = Tensor::empty(out.shape(), DType::kF32);
  Tensor lse = Tensor::empty({1, 1, 3}, DType::kF32), block_lse = Tensor::empty(lse.shape(), DType::kF32);
  const float out_rows[] = {kNaN, kNaN, kNaN, 1, 2, 3, 7, 7, 7};
  const float block_rows[] = {4, 5, 6, kNaN, kNaN, kNaN, 8, 8, 8};
  std::copy(std::begin(out_rows), std::end(out_rows), out.f32());
  std::copy(std::begin(block_rows), std::end(block_rows), block.f32());
  const float lses[] = {kNegInf, 0.5f, kNegInf}, block_lses[] = {-1.5f, kNegInf, kNegInf};
  std::copy(std::begin(lses), std::end(lses), lse.f32());
  std::copy(std::begin(block_lses), std::end(block_lses), block_lse.f32());
  ops::attention_merge(out, lse, block, block_lse);
  const float want[] = {4, 5, 6, 1, 2, 3, 7, 7, 7};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(out.f32()[i], want[i]) << "element " << i;
  EXPECT_EQ(lse.f32()[0], -1.5f);
  EXPECT_EQ(lse.f32()[1], 0.5f);
  EXPECT_EQ(lse.f32()[2], kNegInf);
}

TEST(OpsAttentionBlock, ShapeErrorsNameTheOp) {
  Tensor q = Tensor::zeros({1, 4, 2, 8}, DType::kF32), k = Tensor::zeros({1, 3, 2, 8}, DType::kF32);
  Tensor out = Tensor::zeros(q.shape(), DType::kF32), lse = Tensor::zeros({1, 2, 4}, DType::kF32);
  const std::string lengths =
      testing::message_of<Error>([&] { ops::attention_block_forward(q, k, k, AttentionMask::kNone, out, lse); });
  EXPECT_NE(lengths.find("[op attention_block_forward] q is"), std::string::npos) << lengths;
  Tensor short_lse = Tensor::zeros({1, 2, 3}, DType::kF32);
  Tensor other = Tensor::zeros(q.shape(), DType::kF32);
  const std::string stats = testing::message_of<Error>([&] { ops::attention_merge(out, short_lse, other, short_lse); });
  EXPECT_NE(stats.find("[op attention_merge]"), std::string::npos) << stats;
}

}  // namespace
}  // namespace primus
