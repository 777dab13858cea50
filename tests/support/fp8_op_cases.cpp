// The fp8 quantisation ops' cases (ops/fp8_ops.h) for the harness: amax → scale → quantise (with the transposed copy)
// → dequantise, per format and tiling (tensorwise, the blockwise recipe's 1×128 activation tiles and 128×128 weight
// blocks). The harness compares float outputs, so a case returns the dequantised values of both copies (exact: each
// is a decoded code times a scale_inv) and the scale_inv tiles; the codes themselves are compared byte for byte in
// tests/ops/fp8_ops_test.cpp. The reference applies core/fp8.h's scalar rules element by element with plain loops
// (core/fp8.h is itself checked against an independent model in tests/unit/fp8_format_test.cpp): tolerance 0.
//
// Rows are scaled by powers of two from 2^-12 to 2^12 so the tiles of one tensor need different scales, and a few
// elements are pushed far past the rest (outliers: the amax that sets a tile's scale). Columns: 300 (two full
// 128-wide tiles and a partial one). Device: the CUDA kernels (kernels/fp8.cu) call the same core/fp8.h functions on
// the same f32 values, so every output must have the CPU's bits (device tolerance 0).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/fp8.h"
#include "ops/fp8_ops.h"
#include "ops/ops.h"
#include "support/op_cases.h"
#include "support/test_support.h"

namespace primus::testing {
namespace {

constexpr int64_t kCols = 300;

struct Fp8CaseSpec {
  Fp8Format format;
  Fp8Tiling tiling;
  const char* tiling_name;
  Fp8ScaleOptions options;
};

Tensor spread_rows(int64_t rows, Rng& rng) {
  Tensor x = random_tensor({rows, kCols}, rng);
  float* p = x.f32();
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, static_cast<int>(rng.below(25)) - 12);
    for (int64_t c = 0; c < kCols; ++c) p[r * kCols + c] *= row_scale;
  }
  for (int k = 0; k < 3; ++k) p[rng.below(static_cast<uint64_t>(rows * kCols))] *= 40.0f;
  return x;
}

// The whole recipe in loops over core/fp8.h, on the host: per tile amax, scale, then codes decoded times scale_inv.
struct Quantized {
  std::vector<double> y, scale_inv;
};

Quantized reference_quantize(const Fp8CaseSpec& s, const float* x, int64_t rows, int64_t cols, bool transposed) {
  // The matrix quantised: x, or xᵀ read from x.
  const int64_t m = transposed ? cols : rows, n = transposed ? rows : cols;
  auto at = [&](int64_t i, int64_t j) { return transposed ? x[j * cols + i] : x[i * cols + j]; };
  const int64_t tr = s.tiling.rows == 0 ? m : s.tiling.rows, tc = s.tiling.cols == 0 ? n : s.tiling.cols;
  const int64_t grid_rows = (m + tr - 1) / tr, grid_cols = (n + tc - 1) / tc;
  std::vector<float> scale(static_cast<size_t>(grid_rows * grid_cols));
  Quantized q;
  for (int64_t g = 0; g < grid_rows * grid_cols; ++g) {
    const int64_t i0 = (g / grid_cols) * tr, j0 = (g % grid_cols) * tc;
    float amax = 0.0f;
    for (int64_t i = i0; i < std::min(m, i0 + tr); ++i) {
      for (int64_t j = j0; j < std::min(n, j0 + tc); ++j) amax = std::max(amax, std::fabs(at(i, j)));
    }
    scale[g] = fp8_scale_from_amax(amax, fp8_info(s.format).max_finite, s.options.margin, 1.0f,
                                   s.options.power_of_two)
                   .scale;
    q.scale_inv.push_back(1.0f / scale[g]);
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float sc = scale[(i / tr) * grid_cols + j / tc];
      const float inv = 1.0f / sc;
      q.y.push_back(fp8_decode(fp8_encode(at(i, j) * sc, s.format, true), s.format) * inv);
    }
  }
  return q;
}

OpCase quantize_case(const Fp8CaseSpec& s) {
  OpCase c;
  c.name = fmt::format("fp8_quantize_{}_{}{}", fp8_format_name(s.format), s.tiling_name,
                       s.options.margin > 0 ? fmt::format("_margin{}", s.options.margin) : "");
  c.dtypes = {DType::kF32};
  c.reference_tol = 0.0;
  c.device_tol = {0.0, 0.0, 0.0};
  c.make_inputs = [](int64_t n, Rng& rng) { return std::vector<Input>{f32("x", spread_rows(n, rng))}; };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const Tensor& x = in["x"];
    const int64_t rows = x.dim(0), cols = x.dim(1);
    const Device d = env.device();
    Tensor amax = Tensor::empty(ops::fp8_tile_grid(rows, cols, s.tiling), DType::kF32, d);
    Tensor amax_t = Tensor::empty(ops::fp8_tile_grid(cols, rows, s.tiling), DType::kF32, d);
    ops::fp8_amax(x, s.tiling, amax);
    ops::fp8_amax(x, s.tiling, amax_t, true);
    Tensor scale = env.out_f32(amax.shape()), scale_inv = env.out_f32(amax.shape());
    Tensor scale_t = env.out_f32(amax_t.shape()), scale_inv_t = env.out_f32(amax_t.shape());
    Tensor non_finite = ops::zeros({1}, DType::kI32, d);
    ops::fp8_scale(amax, s.format, s.options, scale, scale_inv, non_finite);
    ops::fp8_scale(amax_t, s.format, s.options, scale_t, scale_inv_t, non_finite);
    Tensor codes = Tensor::empty({rows, cols}, DType::kU8, d), codes_t = Tensor::empty({cols, rows}, DType::kU8, d);
    ops::fp8_quantize(x, scale, s.format, s.tiling, codes, scale_t, codes_t);
    Tensor y = env.out_f32({rows, cols}), yt = env.out_f32({cols, rows});
    ops::fp8_dequantize(codes, scale_inv, s.format, s.tiling, y);
    ops::fp8_dequantize(codes_t, scale_inv_t, s.format, s.tiling, yt);
    return Tensors{{"y", y}, {"yt", yt}, {"scale_inv", scale_inv}, {"scale_inv_t", scale_inv_t}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float) {
    const Tensor& x = in["x"];
    const int64_t rows = x.dim(0), cols = x.dim(1);
    const Quantized q = reference_quantize(s, x.f32(), rows, cols, false);
    const Quantized qt = reference_quantize(s, x.f32(), rows, cols, true);
    return Tensors{{"y", from_doubles({rows, cols}, q.y)},
                   {"yt", from_doubles({cols, rows}, qt.y)},
                   {"scale_inv", from_doubles(ops::fp8_tile_grid(rows, cols, s.tiling), q.scale_inv)},
                   {"scale_inv_t", from_doubles(ops::fp8_tile_grid(cols, rows, s.tiling), qt.scale_inv)}};
  };
  return c;
}

}  // namespace

std::vector<OpCase> fp8_op_cases() {
  std::vector<OpCase> cases;
  const Fp8Tiling tensorwise{0, 0}, activations{1, 128}, weights{128, 128};
  for (const Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2, Fp8Format::kE4M3Fnuz, Fp8Format::kE5M2Fnuz}) {
    cases.push_back(quantize_case({format, tensorwise, "tensorwise", {}}));
  }
  // Transformer Engine's block scaling keeps power-of-two scales; DeepSeek-V3's are plain amax / 448.
  cases.push_back(quantize_case({Fp8Format::kE4M3, activations, "1x128", {.power_of_two = true}}));
  cases.push_back(quantize_case({Fp8Format::kE4M3, weights, "128x128", {.power_of_two = true}}));
  cases.push_back(quantize_case({Fp8Format::kE4M3, activations, "1x128_plain", {}}));
  cases.push_back(quantize_case({Fp8Format::kE5M2, activations, "1x128", {.power_of_two = true}}));
  cases.push_back(quantize_case({Fp8Format::kE4M3, tensorwise, "tensorwise", {.margin = 2}}));
  return cases;
}

}  // namespace primus::testing
