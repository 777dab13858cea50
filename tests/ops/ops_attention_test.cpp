// Causal grouped-query attention through src/ops on the CPU backend against a naive double-precision reference
// (full softmax per row, gradients from the closed form), for GQA (Hq=6, Hkv=2) and plain heads, T = 1 and 17,
// head sizes 8 and 16; also confined to segments (packed documents: segment_start), where each segment must
// equal the attention of that segment alone. Outputs are poisoned with NaN first.
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

// ||got − want|| / max(||want||, floor) ≤ tol; the floor covers gradients that are exactly zero in exact
// arithmetic (dq, dk at T = 1, where the softmax over one key is constant).
void expect_near(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what,
                 double floor = 1e-30) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.f32()[i];
    ASSERT_TRUE(std::isfinite(g)) << what << ": element " << i << " is " << g;
    diff += (g - want[i]) * (g - want[i]);
    ref += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(diff) / std::max(std::sqrt(ref), floor), tol) << what;
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Row by row in double: p = softmax(q·kᵀ/sqrt(D)) over first ≤ j ≤ t, then the textbook softmax gradient.
// first = segment_start[b, t] when given ([B, T] i32), else 0.
Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                    const Tensor& segment_start = Tensor()) {
  const int64_t batch = q.dim(0), seq = q.dim(1), hq = q.dim(2), hkv = k.dim(2), d = q.dim(3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto qi = [&](const Tensor& x, int64_t b, int64_t t, int64_t h, int64_t i) {
    return static_cast<double>(x.f32()[((b * seq + t) * x.dim(2) + h) * d + i]);
  };
  Reference r;
  r.out.assign(q.numel(), 0.0);
  r.dq.assign(q.numel(), 0.0);
  r.dk.assign(k.numel(), 0.0);
  r.dv.assign(k.numel(), 0.0);
  r.lse.assign(batch * hq * seq, 0.0);
  std::vector<double> s(seq), p(seq), dp(seq);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kvh = h / (hq / hkv);
      for (int64_t t = 0; t < seq; ++t) {
        const int64_t first = segment_start.defined() ? segment_start.i32()[b * seq + t] : 0;
        double max = -1e300;
        for (int64_t j = first; j <= t; ++j) {
          s[j] = 0.0;
          for (int64_t i = 0; i < d; ++i) s[j] += qi(q, b, t, h, i) * qi(k, b, j, kvh, i);
          s[j] *= scale;
          max = std::max(max, s[j]);
        }
        double sum = 0.0;
        for (int64_t j = first; j <= t; ++j) sum += std::exp(s[j] - max);
        r.lse[(b * hq + h) * seq + t] = max + std::log(sum);
        const int64_t orow = ((b * seq + t) * hq + h) * d;
        double delta = 0.0;
        for (int64_t j = first; j <= t; ++j) {
          p[j] = std::exp(s[j] - max) / sum;
          dp[j] = 0.0;
          for (int64_t i = 0; i < d; ++i) {
            r.out[orow + i] += p[j] * qi(v, b, j, kvh, i);
            dp[j] += qi(dout, b, t, h, i) * qi(v, b, j, kvh, i);
          }
          delta += p[j] * dp[j];
        }
        for (int64_t j = first; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - delta);
          const int64_t krow = ((b * seq + j) * hkv + kvh) * d;
          for (int64_t i = 0; i < d; ++i) {
            r.dq[orow + i] += scale * ds * qi(k, b, j, kvh, i);
            r.dk[krow + i] += scale * ds * qi(q, b, t, h, i);
            r.dv[krow + i] += p[j] * qi(dout, b, t, h, i);
          }
        }
      }
    }
  }
  return r;
}

TEST(OpsAttention, ForwardAndBackwardMatchNaiveReference) {
  Rng rng(201);
  const int64_t heads[][2] = {{6, 2}, {3, 3}, {4, 1}};
  for (const auto& hh : heads) {
    for (int64_t seq : {1, 17}) {
      for (int64_t d : {8, 16}) {
        const int64_t batch = 2, hq = hh[0], hkv = hh[1];
        SCOPED_TRACE(fmt::format("Hq={} Hkv={} T={} D={}", hq, hkv, seq, d));
        Tensor q = random_tensor({batch, seq, hq, d}, rng);
        Tensor k = random_tensor({batch, seq, hkv, d}, rng);
        Tensor v = random_tensor({batch, seq, hkv, d}, rng);
        Tensor dout = random_tensor({batch, seq, hq, d}, rng);
        Tensor out = poisoned(q.shape());
        Tensor lse = poisoned({batch, hq, seq});
        ops::attention_forward(q, k, v, out, lse);
        const Reference want = reference(q, k, v, dout);
        expect_near(out, want.out, 1e-5, "out");
        expect_near(lse, want.lse, 1e-6, "lse");

        Tensor dq = poisoned(q.shape());
        Tensor dk = poisoned(k.shape());
        Tensor dv = poisoned(k.shape());
        ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv);
        expect_near(dq, want.dq, 1e-5, "dq", 1.0);
        expect_near(dk, want.dk, 1e-5, "dk", 1.0);
        expect_near(dv, want.dv, 1e-5, "dv");
      }
    }
  }
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

TEST(OpsAttention, LargeScoresStayFinite) {
  Rng rng(203);
  Tensor q = random_tensor({1, 9, 2, 16}, rng, 30.0f);
  Tensor k = random_tensor({1, 9, 2, 16}, rng, 30.0f);
  Tensor v = random_tensor({1, 9, 2, 16}, rng);
  Tensor dout = random_tensor({1, 9, 2, 16}, rng);
  Tensor out = poisoned(q.shape());
  Tensor lse = poisoned({1, 2, 9});
  ops::attention_forward(q, k, v, out, lse);
  Tensor dq = poisoned(q.shape()), dk = poisoned(k.shape()), dv = poisoned(v.shape());
  ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv);
  const Reference want = reference(q, k, v, dout);
  expect_near(out, want.out, 1e-5, "out");
  expect_near(dv, want.dv, 1e-5, "dv");
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

TEST(OpsAttention, SegmentsMatchNaiveReference) {
  Rng rng(204);
  const int64_t heads[][2] = {{6, 2}, {3, 3}};
  for (const auto& hh : heads) {
    for (int64_t seq : {1, 17, 40}) {
      const int64_t batch = 3, hq = hh[0], hkv = hh[1], d = 8;
      SCOPED_TRACE(fmt::format("Hq={} Hkv={} T={}", hq, hkv, seq));
      const Tensor starts = random_segments(batch, seq, rng);
      Tensor q = random_tensor({batch, seq, hq, d}, rng);
      Tensor k = random_tensor({batch, seq, hkv, d}, rng);
      Tensor v = random_tensor({batch, seq, hkv, d}, rng);
      Tensor dout = random_tensor({batch, seq, hq, d}, rng);
      Tensor out = poisoned(q.shape()), lse = poisoned({batch, hq, seq});
      ops::attention_forward(q, k, v, out, lse, starts);
      const Reference want = reference(q, k, v, dout, starts);
      expect_near(out, want.out, 1e-5, "out");
      expect_near(lse, want.lse, 1e-6, "lse");
      Tensor dq = poisoned(q.shape()), dk = poisoned(k.shape()), dv = poisoned(k.shape());
      ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, starts);
      expect_near(dq, want.dq, 1e-5, "dq", 1.0);
      expect_near(dk, want.dk, 1e-5, "dk", 1.0);
      expect_near(dv, want.dv, 1e-5, "dv");
    }
  }
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
