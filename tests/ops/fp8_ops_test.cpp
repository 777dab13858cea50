// The fp8 quantisation ops beyond what the harness compares (support/fp8_op_cases.cpp): the codes byte for byte
// against core/fp8.h, the transposed copy equal to quantising the transposed matrix, NaN and infinity in an amax
// propagated and counted (never clamped), the scale fallbacks of the two recipes, the error bound of a round trip,
// the delayed recipe's amax window, and the checks' messages.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
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

}  // namespace
}  // namespace primus
