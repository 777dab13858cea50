// Properties of causal attention on the CPU backend that the op harness (support/op_cases.cpp: the attention cases
// against a naive reference and finite differences) does not state: query 0 copies its value, and confined to
// segments (packed documents: segment_start) each segment equals the attention of that segment alone, bit for bit.
// Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "support/test_support.h"

namespace primus {
namespace {

using primus::testing::random_tensor;

Tensor poisoned(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  t.fill(std::numeric_limits<float>::quiet_NaN());
  return t;
}

TEST(OpsAttention, FirstPositionCopiesItsValue) {
  // Causality: query 0 sees only key 0, so out[0] = v[0] exactly up to rounding of p = 1.
  Rng rng(202);
  Tensor q = random_tensor({1, 5, 2, 8}, rng, 3.0f);
  Tensor k = random_tensor({1, 5, 2, 8}, rng, 3.0f);
  Tensor v = random_tensor({1, 5, 2, 8}, rng);
  Tensor out = poisoned(q.shape());
  Tensor lse = poisoned({1, 2, 5});
  ops::attention_forward(q, k, v, out, lse);
  for (int64_t i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(out.f32()[i], v.f32()[i]);
}

// ---- segments (packed documents) -------------------------------------------------------------------------------

// Random documents per row: each token starts a new document with probability 1/4 (so one-token documents and
// long ones both occur), row 0 is one document throughout. [B, T] i32: the first position of each token's document.
Tensor random_segments(int64_t batch, int64_t seq, Rng& rng) {
  Tensor starts = Tensor::empty({batch, seq}, DType::kI32);
  for (int64_t b = 0; b < batch; ++b) {
    int32_t start = 0;
    for (int64_t t = 0; t < seq; ++t) {
      if (b > 0 && t > 0 && rng.below(4) == 0) start = static_cast<int32_t>(t);
      starts.i32()[b * seq + t] = start;
    }
  }
  return starts;
}

// Positions [begin, end) of sequence row b of a [B, T, H, D] tensor, as a new [1, end − begin, H, D] tensor.
Tensor rows_of(const Tensor& x, int64_t b, int64_t begin, int64_t end) {
  const int64_t row = x.dim(2) * x.dim(3);
  Tensor part = Tensor::empty({1, end - begin, x.dim(2), x.dim(3)}, DType::kF32);
  std::copy_n(x.f32() + (b * x.dim(1) + begin) * row, (end - begin) * row, part.f32());
  return part;
}

// lse [B, H, T] positions [begin, end) of row b, as [1, H, end − begin].
Tensor lse_of(const Tensor& lse, int64_t b, int64_t begin, int64_t end) {
  const int64_t heads = lse.dim(1), seq = lse.dim(2);
  Tensor part = Tensor::empty({1, heads, end - begin}, DType::kF32);
  for (int64_t h = 0; h < heads; ++h) {
    std::copy_n(lse.f32() + (b * heads + h) * seq + begin, end - begin, part.f32() + h * (end - begin));
  }
  return part;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << what;
}

TEST(OpsAttention, EachSegmentEqualsItsAttentionAlone) {
  // The reason for segments: a document packed with others gets exactly the attention it gets alone. The CPU
  // kernel sums every score, softmax and gradient over the segment's keys in the same order either way, so the
  // bits are equal.
  Rng rng(205);
  const int64_t batch = 2, seq = 23, hq = 4, hkv = 2, d = 16;
  const Tensor starts = random_segments(batch, seq, rng);
  Tensor q = random_tensor({batch, seq, hq, d}, rng), k = random_tensor({batch, seq, hkv, d}, rng);
  Tensor v = random_tensor({batch, seq, hkv, d}, rng), dout = random_tensor({batch, seq, hq, d}, rng);
  Tensor out = poisoned(q.shape()), lse = poisoned({batch, hq, seq});
  ops::attention_forward(q, k, v, out, lse, starts);
  Tensor dq = poisoned(q.shape()), dk = poisoned(k.shape()), dv = poisoned(k.shape());
  ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, starts);
  int64_t segments = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t begin = 0; begin < seq;) {
      int64_t end = begin + 1;
      while (end < seq && starts.i32()[b * seq + end] == begin) ++end;
      SCOPED_TRACE(fmt::format("row {} segment [{}, {})", b, begin, end));
      const Tensor sq = rows_of(q, b, begin, end), sk = rows_of(k, b, begin, end), sv = rows_of(v, b, begin, end);
      const Tensor sdout = rows_of(dout, b, begin, end);
      Tensor sout = poisoned(sq.shape()), slse = poisoned({1, hq, end - begin});
      ops::attention_forward(sq, sk, sv, sout, slse);
      Tensor sdq = poisoned(sq.shape()), sdk = poisoned(sk.shape()), sdv = poisoned(sk.shape());
      ops::attention_backward(sq, sk, sv, sout, slse, sdout, sdq, sdk, sdv);
      expect_same_bits(rows_of(out, b, begin, end), sout, "out");
      expect_same_bits(lse_of(lse, b, begin, end), slse, "lse");
      expect_same_bits(rows_of(dq, b, begin, end), sdq, "dq");
      expect_same_bits(rows_of(dk, b, begin, end), sdk, "dk");
      expect_same_bits(rows_of(dv, b, begin, end), sdv, "dv");
      ++segments;
      begin = end;
    }
  }
  EXPECT_GT(segments, 4);  // the layout really packs several documents
}

TEST(OpsAttention, SegmentStartingAtEveryTokenCopiesValues) {
  // Every token its own document: each query sees only its own key, so out = v (p = 1) and dk = dq = 0.
  Rng rng(206);
  const int64_t seq = 6;
  Tensor starts = Tensor::empty({1, seq}, DType::kI32);
  for (int64_t t = 0; t < seq; ++t) starts.i32()[t] = static_cast<int32_t>(t);
  Tensor q = random_tensor({1, seq, 2, 8}, rng, 3.0f), k = random_tensor({1, seq, 2, 8}, rng, 3.0f);
  Tensor v = random_tensor({1, seq, 2, 8}, rng);
  Tensor out = poisoned(q.shape()), lse = poisoned({1, 2, seq});
  ops::attention_forward(q, k, v, out, lse, starts);
  for (int64_t i = 0; i < out.numel(); ++i) EXPECT_FLOAT_EQ(out.f32()[i], v.f32()[i]) << i;
}

}  // namespace
}  // namespace primus
