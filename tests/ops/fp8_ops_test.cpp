// The fp8 quantisation ops beyond what the harness compares (support/fp8_op_cases.cpp): the codes byte for byte
// against core/fp8.h, the transposed copy equal to quantising the transposed matrix, NaN and infinity in an amax
// propagated and counted (never clamped), the scale fallbacks of the two recipes, the error bound of a round trip,
// the delayed recipe's amax window, and the checks' messages.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "core/fp8_amax_history.h"
#include "ops/fp8_ops.h"
#include "ops/ops.h"
#include "support/test_support.h"

namespace primus {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

const Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2, Fp8Format::kE4M3Fnuz, Fp8Format::kE5M2Fnuz};
const Fp8Tiling kTilings[] = {{0, 0}, {1, 128}, {128, 128}, {3, 7}};

Tensor transpose(const Tensor& x) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Tensor t = Tensor::empty({cols, rows}, DType::kF32);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t.f32()[j * rows + i] = x.f32()[i * cols + j];
  }
  return t;
}

struct Quantized {
  Tensor amax, scale, scale_inv, codes;
};

Quantized quantize(const Tensor& x, Fp8Format format, Fp8Tiling tiling, Fp8ScaleOptions options = {}) {
  Quantized q;
  const Shape grid = ops::fp8_tile_grid(x.dim(0), x.dim(1), tiling);
  q.amax = Tensor::empty(grid, DType::kF32);
  q.scale = Tensor::empty(grid, DType::kF32);
  q.scale.fill(1.0f);
  q.scale_inv = Tensor::empty(grid, DType::kF32);
  q.codes = Tensor::empty(x.shape(), DType::kU8);
  Tensor non_finite = Tensor::zeros({1}, DType::kI32);
  ops::fp8_amax(x, tiling, q.amax);
  ops::fp8_scale(q.amax, format, options, q.scale, q.scale_inv, non_finite);
  ops::fp8_quantize(x, q.scale, format, tiling, q.codes);
  return q;
}

const uint8_t* bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.data()); }

TEST(Fp8Ops, CodesEqualTheScalarEncodingPerTile) {
  Rng rng(11);
  Tensor x = testing::random_tensor({133, 300}, rng);
  for (int64_t i = 0; i < 133; ++i) {
    for (int64_t j = 0; j < 300; ++j) x.f32()[i * 300 + j] *= std::ldexp(1.0f, static_cast<int>((i * 7 + j / 50) % 20) - 10);
  }
  for (const Fp8Format format : kFormats) {
    for (const Fp8Tiling tiling : kTilings) {
      const Quantized q = quantize(x, format, tiling);
      const int64_t tr = tiling.rows == 0 ? 133 : tiling.rows, tc = tiling.cols == 0 ? 300 : tiling.cols;
      const int64_t grid_cols = q.amax.dim(1);
      int64_t mismatches = 0;
      for (int64_t i = 0; i < 133; ++i) {
        for (int64_t j = 0; j < 300; ++j) {
          const int64_t t = (i / tr) * grid_cols + j / tc;
          const float v = x.f32()[i * 300 + j];
          if (bytes(q.codes)[i * 300 + j] != fp8_encode(v * q.scale.f32()[t], format, true)) ++mismatches;
          EXPECT_LE(std::fabs(v), q.amax.f32()[t]);
        }
      }
      EXPECT_EQ(mismatches, 0) << fp8_format_name(format) << " tiling " << tiling.rows << "x" << tiling.cols;
      // Each tile's largest element lands on max_finite (up to rounding of the scaled value).
      for (int64_t t = 0; t < q.amax.numel(); ++t) {
        EXPECT_NEAR(q.amax.f32()[t] * q.scale.f32()[t], fp8_info(format).max_finite,
                    fp8_info(format).max_finite * 1e-6);
        EXPECT_EQ(q.scale_inv.f32()[t], 1.0f / q.scale.f32()[t]);
      }
    }
  }
}

TEST(Fp8Ops, TransposedCopyEqualsQuantisingTheTranspose) {
  Rng rng(12);
  Tensor x = testing::random_tensor({257, 130}, rng);
  for (const Fp8Tiling tiling : kTilings) {
    const Tensor xt = transpose(x);
    const Quantized direct = quantize(x, Fp8Format::kE4M3, tiling);
    const Quantized of_transpose = quantize(xt, Fp8Format::kE4M3, tiling);
    Tensor amax_t = Tensor::empty(of_transpose.amax.shape(), DType::kF32);
    ops::fp8_amax(x, tiling, amax_t, true);
    EXPECT_TRUE(testing::same_bits(amax_t, of_transpose.amax)) << tiling.rows << "x" << tiling.cols;
    Tensor codes = Tensor::empty(x.shape(), DType::kU8), codes_t = Tensor::empty(xt.shape(), DType::kU8);
    ops::fp8_quantize(x, direct.scale, Fp8Format::kE4M3, tiling, codes, of_transpose.scale, codes_t);
    EXPECT_TRUE(testing::same_bits(codes, direct.codes)) << tiling.rows << "x" << tiling.cols;
    EXPECT_TRUE(testing::same_bits(codes_t, of_transpose.codes)) << tiling.rows << "x" << tiling.cols;
  }
}

TEST(Fp8Ops, NaNAndInfinityInTheAmaxArePropagatedAndCounted) {
  Rng rng(13);
  Tensor x = testing::random_tensor({4, 256}, rng);
  x.f32()[1 * 256 + 5] = kNaN;    // row 1, first 128-wide tile
  x.f32()[2 * 256 + 200] = -kInf;  // row 2, second tile
  const Fp8Tiling tiling{1, 128};
  Tensor amax = Tensor::empty({4, 2}, DType::kF32);
  ops::fp8_amax(x, tiling, amax);
  EXPECT_TRUE(std::isnan(amax.f32()[2]));
  EXPECT_EQ(amax.f32()[5], kInf);
  Tensor whole = Tensor::empty({1, 1}, DType::kF32);
  ops::fp8_amax(x, {0, 0}, whole);
  EXPECT_TRUE(std::isnan(whole.f32()[0])) << "a NaN anywhere outranks an infinity: the amax is NaN";

  Tensor scale = Tensor::empty({4, 2}, DType::kF32), scale_inv = Tensor::empty({4, 2}, DType::kF32);
  scale.fill(3.0f);
  Tensor non_finite = Tensor::zeros({1}, DType::kI32);
  // Delayed: the previous scale stays where the amax is not finite.
  ops::fp8_scale(amax, Fp8Format::kE4M3, {.keep_previous = true}, scale, scale_inv, non_finite);
  EXPECT_EQ(non_finite.i32()[0], 2);
  EXPECT_EQ(scale.f32()[2], 3.0f);
  EXPECT_EQ(scale.f32()[5], 3.0f);
  EXPECT_EQ(scale.f32()[0], 448.0f / amax.f32()[0]);
  // Current scaling: 1 there; the count accumulates over calls.
  ops::fp8_scale(amax, Fp8Format::kE4M3, {}, scale, scale_inv, non_finite);
  EXPECT_EQ(non_finite.i32()[0], 4);
  EXPECT_EQ(scale.f32()[2], 1.0f);
  EXPECT_EQ(scale_inv.f32()[5], 1.0f);
}

TEST(Fp8Ops, ZeroTileKeepsItsFallbackAndIsNotCounted) {
  Tensor x = Tensor::zeros({2, 128}, DType::kF32);
  x.f32()[0] = 2.0f;
  Tensor amax = Tensor::empty({2, 1}, DType::kF32), scale = Tensor::empty({2, 1}, DType::kF32);
  Tensor scale_inv = Tensor::empty({2, 1}, DType::kF32), non_finite = Tensor::zeros({1}, DType::kI32);
  ops::fp8_amax(x, {1, 128}, amax);
  scale.fill(5.0f);
  ops::fp8_scale(amax, Fp8Format::kE5M2, {.margin = 1, .keep_previous = true}, scale, scale_inv, non_finite);
  EXPECT_EQ(scale.f32()[0], 57344.0f / 2.0f / 2.0f);
  EXPECT_EQ(scale.f32()[1], 5.0f);
  EXPECT_EQ(non_finite.i32()[0], 0);
}

// A round trip is within half a step of each tile's format: 2^-(mantissa bits + 1) relative for values in the normal
// range after scaling, and a quantum of the subnormals (times scale_inv) below it.
TEST(Fp8Ops, RoundTripWithinTheFormatsStep) {
  Rng rng(14);
  const Tensor x = testing::random_tensor({64, 256}, rng);
  for (const Fp8Format format : kFormats) {
    const Fp8FormatInfo info = fp8_info(format);
    const Quantized q = quantize(x, format, {1, 128});
    Tensor y = Tensor::empty(x.shape(), DType::kF32);
    ops::fp8_dequantize(q.codes, q.scale_inv, format, {1, 128}, y);
    const double smallest_normal = std::ldexp(1.0, 1 - info.bias);
    const double subnormal_step = std::ldexp(1.0, 1 - info.bias - info.mantissa_bits);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double inv = q.scale_inv.f32()[i / 128];
      const double scaled = std::fabs(static_cast<double>(x.f32()[i])) / inv;
      const double bound = scaled >= smallest_normal ? std::fabs(x.f32()[i]) * std::ldexp(1.0, -info.mantissa_bits - 1)
                                                     : subnormal_step / 2 * inv;
      ASSERT_LE(std::fabs(y.f32()[i] - x.f32()[i]), bound * (1 + 1e-6)) << fp8_format_name(format) << " element " << i;
    }
  }
}

TEST(Fp8AmaxHistory, MaxOverTheWindowThenRolls) {
  Fp8AmaxHistory h(3, Fp8AmaxAlgo::kMax);
  h.record(1.0f);
  h.record(4.0f);  // a second micro-batch of the same step
  EXPECT_EQ(h.roll(), 4.0f);
  h.record(2.0f);
  EXPECT_EQ(h.roll(), 4.0f);
  h.record(1.5f);
  EXPECT_EQ(h.roll(), 4.0f);  // window: 1.5, 2, 4
  EXPECT_EQ(h.values(), (std::vector<float>{0.0f, 1.5f, 2.0f}));
  h.record(0.5f);
  EXPECT_EQ(h.roll(), 2.0f);  // 4 has dropped out
  h.record(0.25f);
  EXPECT_EQ(h.roll(), 1.5f);
}

TEST(Fp8AmaxHistory, MostRecentAndLengthOne) {
  Fp8AmaxHistory recent(4, Fp8AmaxAlgo::kMostRecent);
  recent.record(8.0f);
  EXPECT_EQ(recent.roll(), 8.0f);
  recent.record(2.0f);
  EXPECT_EQ(recent.roll(), 2.0f);
  Fp8AmaxHistory one(1, Fp8AmaxAlgo::kMax);
  one.record(8.0f);
  EXPECT_EQ(one.roll(), 8.0f);
  one.record(3.0f);
  EXPECT_EQ(one.roll(), 3.0f);
  EXPECT_THROW(Fp8AmaxHistory(0, Fp8AmaxAlgo::kMax), UsageError);
}

TEST(Fp8AmaxHistory, NaNStaysUntilItDropsOut) {
  Fp8AmaxHistory h(2, Fp8AmaxAlgo::kMax);
  h.record(kNaN);
  h.record(5.0f);
  EXPECT_TRUE(std::isnan(h.roll()));
  h.record(1.0f);
  EXPECT_TRUE(std::isnan(h.roll()));  // still in the window
  h.record(1.0f);
  EXPECT_EQ(h.roll(), 1.0f);
}

TEST(Fp8AmaxHistory, RestoresItsWindow) {
  Fp8AmaxHistory h(3, Fp8AmaxAlgo::kMax);
  for (const float a : {3.0f, 1.0f, 2.0f, 0.5f}) {
    h.record(a);
    h.roll();
  }
  h.record(0.25f);
  Fp8AmaxHistory resumed(3, Fp8AmaxAlgo::kMax);
  resumed.restore(h.values());
  EXPECT_EQ(resumed.values(), h.values());
  for (const float a : {0.1f, 0.2f, 0.3f}) {
    EXPECT_EQ(resumed.roll(), h.roll());
    h.record(a);
    resumed.record(a);
  }
  Fp8AmaxHistory other(4, Fp8AmaxAlgo::kMax);
  EXPECT_THROW(other.restore(h.values()), RuntimeError);
}

void expect_op_error(const std::function<void()>& run, const std::string& needle) {
  try {
    run();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Fp8Ops, ChecksNameTheOpAndTensor) {
  Tensor x = Tensor::zeros({4, 256}, DType::kF32);
  Tensor amax = Tensor::empty({4, 1}, DType::kF32);
  expect_op_error([&] { ops::fp8_amax(x, {1, 128}, amax); }, "[op fp8_amax] amax is [4, 1] f32 cpu but must be f32 [4, 2]");
  Tensor scale = Tensor::zeros({4, 2}, DType::kF32);
  Tensor codes = Tensor::empty({4, 256}, DType::kF32);
  expect_op_error([&] { ops::fp8_quantize(x, scale, Fp8Format::kE4M3, {1, 128}, codes); },
                  "[op fp8_quantize] codes is [4, 256] f32 cpu but must be u8 [4, 256]");
  Tensor codes_u8 = Tensor::empty({4, 256}, DType::kU8), codes_t = Tensor::empty({4, 256}, DType::kU8);
  expect_op_error([&] { ops::fp8_quantize(x, scale, Fp8Format::kE4M3, {1, 128}, codes_u8, scale, codes_t); },
                  "[op fp8_quantize] scale_t is [4, 2] f32 cpu but must be f32 [256, 1]");
  Tensor y = Tensor::empty({4, 256}, DType::kF32);
  expect_op_error([&] { ops::fp8_dequantize(codes_u8, scale, Fp8Format::kE4M3, {-1, 128}, y); },
                  "[op fp8_dequantize] tiling -1 x 128 must be non-negative");
  Tensor non_finite = Tensor::zeros({1}, DType::kF32), scale_inv = Tensor::zeros({4, 2}, DType::kF32);
  expect_op_error([&] { ops::fp8_scale(scale, Fp8Format::kE4M3, {}, scale, scale_inv, non_finite); },
                  "[op fp8_scale] non_finite is [1] f32 cpu but must be i32 [1]");
  Tensor empty = Tensor::empty({0, 4}, DType::kF32), amax_e = Tensor::empty({1, 1}, DType::kF32);
  expect_op_error([&] { ops::fp8_amax(empty, {0, 0}, amax_e); }, "[op fp8_amax] x is [0, 4] f32 cpu but must be a non-empty");
}

// bf16 activations: the amax and codes (and the transposed copy) of a bf16 tensor are those of its values in f32.
TEST(Fp8Ops, Bf16InputGivesTheCodesOfItsValuesInF32) {
  Rng rng(16);
  Tensor x = testing::random_tensor({67, 300}, rng);
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] *= std::ldexp(1.0f, static_cast<int>(i % 13) - 6);
  x.f32()[5] = kNaN;
  Tensor xb = Tensor::empty(x.shape(), DType::kBF16);
  ops::cast(xb, x);
  Tensor xr = Tensor::empty(x.shape(), DType::kF32);
  ops::cast(xr, xb);  // the bf16 values, exactly, in f32
  for (const Fp8Format format : kFormats) {
    for (const Fp8Tiling tiling : kTilings) {
      const std::string what = fmt::format("{} tiling {}x{}", fp8_format_name(format), tiling.rows, tiling.cols);
      for (const bool transposed : {false, true}) {
        const Shape grid = transposed ? ops::fp8_tile_grid(300, 67, tiling) : ops::fp8_tile_grid(67, 300, tiling);
        Tensor from_bf16 = Tensor::empty(grid, DType::kF32), from_f32 = Tensor::empty(grid, DType::kF32);
        ops::fp8_amax(xb, tiling, from_bf16, transposed);
        ops::fp8_amax(xr, tiling, from_f32, transposed);
        EXPECT_TRUE(testing::same_bits(from_bf16, from_f32)) << what << " amax, transposed " << transposed;
      }
      const Quantized q = quantize(xr, format, tiling);
      const Quantized qt = quantize(transpose(xr), format, tiling);
      Tensor codes = Tensor::empty(x.shape(), DType::kU8), codes_t = Tensor::empty({300, 67}, DType::kU8);
      ops::fp8_quantize(xb, q.scale, format, tiling, codes, qt.scale, codes_t);
      EXPECT_TRUE(testing::same_bits(codes, q.codes)) << what;
      EXPECT_TRUE(testing::same_bits(codes_t, qt.codes)) << what;
    }
  }
}

TEST(Fp8Ops, AmaxAccumulateKeepsTheLargerAndAnyNaN) {
  Tensor x = Tensor::zeros({1, 512}, DType::kF32);
  x.f32()[0] = 3.0f;      // tile 0: new 3 against old 5
  x.f32()[128] = -7.0f;   // tile 1: new 7 against old 2
  x.f32()[256] = 1.0f;    // tile 2: old NaN stays
  x.f32()[384] = kNaN;    // tile 3: new NaN against old 4
  Tensor amax = Tensor::empty({1, 4}, DType::kF32);
  const float old[] = {5.0f, 2.0f, kNaN, 4.0f};
  std::copy(old, old + 4, amax.f32());
  ops::fp8_amax(x, {1, 128}, amax, false, /*accumulate=*/true);
  EXPECT_EQ(amax.f32()[0], 5.0f);
  EXPECT_EQ(amax.f32()[1], 7.0f);
  EXPECT_TRUE(std::isnan(amax.f32()[2]));
  EXPECT_TRUE(std::isnan(amax.f32()[3]));
  ops::fp8_amax(x, {1, 128}, amax);  // without accumulate: overwritten
  EXPECT_EQ(amax.f32()[0], 3.0f);
  EXPECT_EQ(amax.f32()[2], 1.0f);
}

// One operand of the GEMM tests: quantised, and its dequantised values (what the GEMM must multiply).
struct GemmOperand {
  Quantized q;
  Tensor dequantised;
  Fp8Format format;
  Fp8Tiling tiling;
  ops::Fp8Operand operand() const { return {&q.codes, format, tiling, &q.scale_inv}; }
};

GemmOperand gemm_operand(const Tensor& x, Fp8Format format, Fp8Tiling tiling, Fp8ScaleOptions options = {}) {
  GemmOperand o{quantize(x, format, tiling, options), Tensor::empty(x.shape(), DType::kF32), format, tiling};
  ops::fp8_dequantize(o.q.codes, o.q.scale_inv, format, tiling, o.dequantised);
  return o;
}

// C [M, N] = A [M, K] · B [N, K]ᵀ of f32 matrices, in double.
std::vector<double> product(const Tensor& a, const Tensor& b) {
  const int64_t m = a.dim(0), k = a.dim(1), n = b.dim(0);
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t l = 0; l < k; ++l) sum += static_cast<double>(a.f32()[i * k + l]) * b.f32()[j * k + l];
      c[static_cast<size_t>(i * n + j)] = sum;
    }
  }
  return c;
}

// The fp8 product against the exact product of the unquantised inputs, element by element: each input's
// quantisation error is at most half a step of its format (2^-(mantissa bits + 1) relative in the normal range,
// half a subnormal quantum times scale_inv below it), so |ΣAB − ΣA'B'| ≤ Σ |A| δB + |B| δA + δA δB, plus C's
// rounding to f32.
TEST(Fp8Gemm, WithinTheBoundItsFormatsImply) {
  Rng rng(17);
  const Tensor a = testing::random_tensor({45, 300}, rng), b = testing::random_tensor({37, 300}, rng);
  using Formats = std::pair<Fp8Format, Fp8Format>;
  using Tilings = std::pair<Fp8Tiling, Fp8Tiling>;
  for (const auto& [fa, fb] : {Formats{Fp8Format::kE4M3, Fp8Format::kE4M3}, Formats{Fp8Format::kE5M2, Fp8Format::kE4M3},
                               Formats{Fp8Format::kE4M3Fnuz, Fp8Format::kE5M2Fnuz}}) {
    for (const auto& [ta, tb] : {Tilings{{0, 0}, {0, 0}}, Tilings{{1, 128}, {128, 128}}, Tilings{{1, 128}, {1, 128}}}) {
      const GemmOperand qa = gemm_operand(a, fa, ta), qb = gemm_operand(b, fb, tb);
      Tensor c = Tensor::empty({45, 37}, DType::kF32);
      ops::fp8_gemm(qa.operand(), qb.operand(), c);
      auto error_bound = [](const GemmOperand& o, const Tensor& x, int64_t i) {
        const Fp8FormatInfo info = fp8_info(o.format);
        const double v = std::fabs(static_cast<double>(x.f32()[i]));
        const int64_t cols = x.dim(1), tr = o.tiling.rows == 0 ? x.dim(0) : o.tiling.rows;
        const int64_t tc = o.tiling.cols == 0 ? cols : o.tiling.cols, grid_cols = (cols + tc - 1) / tc;
        const double inv = o.q.scale_inv.f32()[(i / cols) / tr * grid_cols + (i % cols) / tc];
        const double relative = v * std::ldexp(1.0, -info.mantissa_bits - 1);
        const double subnormal = std::ldexp(1.0, 1 - info.bias - info.mantissa_bits) / 2 * inv;
        return std::max(relative, subnormal);
      };
      const std::vector<double> exact = product(a, b);
      const std::string what = fmt::format("{} x {}, tilings {}x{} / {}x{}", fp8_format_name(fa), fp8_format_name(fb),
                                           ta.rows, ta.cols, tb.rows, tb.cols);
      double worst = 0.0;
      for (int64_t i = 0; i < 45; ++i) {
        for (int64_t j = 0; j < 37; ++j) {
          double bound = 0.0;
          for (int64_t l = 0; l < 300; ++l) {
            const double da = error_bound(qa, a, i * 300 + l), db = error_bound(qb, b, j * 300 + l);
            bound += std::fabs(a.f32()[i * 300 + l]) * db + std::fabs(b.f32()[j * 300 + l]) * da + da * db;
          }
          const double got = c.f32()[i * 37 + j], want = exact[static_cast<size_t>(i * 37 + j)];
          const double err = std::fabs(got - want);
          ASSERT_LE(err, bound * (1 + 1e-6) + std::fabs(got) * 1e-7) << what << " at " << i << ", " << j;
          worst = std::max(worst, err / bound);
        }
      }
      EXPECT_GT(worst, 0.0) << what << ": no error at all means nothing was quantised";
    }
  }
}

// The three GEMMs of a training step through the quantised copies fp8_quantize writes: forward y = x·Wᵀ
// (A = x, B = W), data gradient dx = dy·W (A = dy, B = Wᵀ's codes), weight gradient dW += dyᵀ·x (A = dyᵀ's codes,
// B = xᵀ's codes, f32 accumulate), each equal to the product of the dequantised copies (double, C rounded once).
TEST(Fp8Gemm, TheTrainingGemmsFromTheTransposedCopies) {
  Rng rng(18);
  const int64_t tokens = 150, in = 260, out = 140;
  const Tensor x = testing::random_tensor({tokens, in}, rng), w = testing::random_tensor({out, in}, rng);
  const Tensor dy = testing::random_tensor({tokens, out}, rng, 0.01f);
  struct Recipe {
    const char* name;
    Fp8Tiling act, weight;
    Fp8Format grad;
  };
  for (const Recipe& r : {Recipe{"tensorwise hybrid", {0, 0}, {0, 0}, Fp8Format::kE5M2},
                          Recipe{"blockwise", {1, 128}, {128, 128}, Fp8Format::kE4M3}}) {
    // A copy and its transposed copy, both from fp8_quantize's one pass, dequantised.
    auto both = [&](const Tensor& t, Fp8Format format, Fp8Tiling tiling) {
      const Tensor tt = transpose(t);
      GemmOperand direct = gemm_operand(t, format, tiling, {.power_of_two = true});
      GemmOperand of_t = gemm_operand(tt, format, tiling, {.power_of_two = true});
      ops::fp8_quantize(t, direct.q.scale, format, tiling, direct.q.codes, of_t.q.scale, of_t.q.codes);
      ops::fp8_dequantize(of_t.q.codes, of_t.q.scale_inv, format, tiling, of_t.dequantised);
      return std::pair{direct, of_t};
    };
    const auto [qx, qxt] = both(x, Fp8Format::kE4M3, r.act);
    const auto [qw, qwt] = both(w, Fp8Format::kE4M3, r.weight);
    const auto [qdy, qdyt] = both(dy, r.grad, r.act);
    auto check = [&](const char* gemm, const GemmOperand& a, const GemmOperand& b, bool accumulate) {
      Tensor c = Tensor::empty({a.q.codes.dim(0), b.q.codes.dim(0)}, DType::kF32);
      c.fill(0.5f);
      ops::fp8_gemm(a.operand(), b.operand(), c, {.accumulate = accumulate});
      const std::vector<double> want = product(a.dequantised, b.dequantised);
      int64_t mismatches = 0;
      for (int64_t i = 0; i < c.numel(); ++i) {
        if (c.f32()[i] != static_cast<float>(want[static_cast<size_t>(i)] + (accumulate ? 0.5 : 0.0))) ++mismatches;
      }
      // The double sums may differ from the reference's in their last bits, rarely enough to flip an f32 rounding.
      EXPECT_LE(mismatches, c.numel() / 1000) << r.name << ": " << gemm;
    };
    check("forward y = x W^T", qx, qw, false);
    check("data gradient dx = dy W", qdy, qwt, false);
    check("weight gradient dW += dy^T x", qdyt, qxt, true);
  }
}

TEST(Fp8Gemm, ChecksNameTheOpAndArgument) {
  auto codes = [](int64_t r, int64_t c) { return Tensor::zeros({r, c}, DType::kU8); };
  const Tensor a = codes(32, 256), b = codes(48, 256), b_short = codes(48, 128);
  const Tensor one = Tensor::zeros({1, 1}, DType::kF32), a_tiles = Tensor::zeros({32, 2}, DType::kF32);
  const Tensor b_blocks = Tensor::zeros({1, 2}, DType::kF32);
  Tensor c = Tensor::empty({32, 48}, DType::kF32);
  const Fp8Format e4m3 = Fp8Format::kE4M3, e5m2 = Fp8Format::kE5M2;
  const ops::Fp8Operand a_tw{&a, e4m3, {0, 0}, &one}, b_tw{&b, e4m3, {0, 0}, &one};
  expect_op_error([&] { ops::fp8_gemm(a_tw, {&b, e4m3, {128, 128}, &b_blocks}, c); },
                  "[op fp8_gemm] tilings a 0x0 with b 128x128 are not supported");
  expect_op_error([&] { ops::fp8_gemm({&a, e4m3, {128, 128}, &one}, {&b, e4m3, {128, 128}, &b_blocks}, c); },
                  "tilings a 128x128 with b 128x128 are not supported");
  expect_op_error([&] { ops::fp8_gemm({&a, e5m2, {0, 0}, &one}, {&b, e5m2, {0, 0}, &one}, c); },
                  "[op fp8_gemm] formats a e5m2 with b e5m2: two e5m2 operands are not supported");
  expect_op_error([&] { ops::fp8_gemm({&a, Fp8Format::kE4M3Fnuz, {0, 0}, &one}, b_tw, c); },
                  "[op fp8_gemm] formats a e4m3fnuz with b e4m3 mix the OCP and the fnuz pair");
  expect_op_error([&] { ops::fp8_gemm(a_tw, {&b_short, e4m3, {0, 0}, &one}, c); },
                  "[op fp8_gemm] b is [48, 128] u8 cpu but must be [N, K] with a's K = 256");
  expect_op_error([&] { ops::fp8_gemm({&a, e4m3, {1, 128}, &one}, {&b, e4m3, {128, 128}, &b_blocks}, c); },
                  "[op fp8_gemm] a_scale_inv is [1, 1] f32 cpu but must be f32 [32, 2]");
  expect_op_error([&] { ops::fp8_gemm({&a, e4m3, {1, 128}, &a_tiles}, {&b, e4m3, {128, 128}, &one}, c); },
                  "[op fp8_gemm] b_scale_inv is [1, 1] f32 cpu but must be f32 [1, 2]");
  Tensor c_i32 = Tensor::empty({32, 48}, DType::kI32), c_wrong = Tensor::empty({48, 32}, DType::kF32);
  expect_op_error([&] { ops::fp8_gemm(a_tw, b_tw, c_i32); },
                  "[op fp8_gemm] c is [32, 48] i32 cpu but must be f32 or bf16");
  expect_op_error([&] { ops::fp8_gemm(a_tw, b_tw, c_wrong); },
                  "[op fp8_gemm] c is [48, 32] f32 cpu but must be f32 [32, 48]");
  const Tensor a_f32 = Tensor::zeros({32, 256}, DType::kF32);
  expect_op_error([&] { ops::fp8_gemm({&a_f32, e4m3, {0, 0}, &one}, b_tw, c); },
                  "[op fp8_gemm] a is [32, 256] f32 cpu but must be u8 [32, 256]");
  expect_op_error(
      [&] {
        ops::fp8_gemm({&a, e4m3, {1, 128}, &a_tiles}, {&b, e4m3, {128, 128}, &b_blocks}, c,
                      {.fast_accumulation = true});
      },
      "[op fp8_gemm] fast_accumulation is for tensorwise scaling only");
  const Tensor x_i32 = Tensor::zeros({4, 4}, DType::kI32);
  Tensor amax = Tensor::empty({1, 1}, DType::kF32);
  expect_op_error([&] { ops::fp8_amax(x_i32, {0, 0}, amax); },
                  "[op fp8_amax] x is [4, 4] i32 cpu but must be f32 or bf16");
}

}  // namespace
}  // namespace primus
