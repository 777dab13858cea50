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
#include "support/fp8_reference.h"
#include "support/op_cases.h"
#include "support/test_support.h"

namespace primus::testing {
namespace {

constexpr int64_t kCols = 300;

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

// x's values rounded to bf16 (as the CUDA engine's activations are), kept in an f32 tensor.
Tensor rounded_to_bf16(const Tensor& x) {
  Tensor r = Tensor::empty(x.shape(), DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) r.f32()[i] = bf16_to_f32(f32_to_bf16(x.f32()[i]));
  return r;
}

// bf16_input: the op reads x as bf16 (the values rounded first); the reference quantises those values as f32, so the
// bf16 path must give the same bits as the f32 one (tolerance 0).
OpCase quantize_case(const Fp8CaseSpec& s, bool bf16_input = false) {
  OpCase c;
  c.name = fmt::format("fp8_quantize_{}_{}{}{}", fp8_format_name(s.format), s.tiling_name,
                       s.options.margin > 0 ? fmt::format("_margin{}", s.options.margin) : "",
                       bf16_input ? "_bf16_input" : "");
  c.dtypes = {DType::kF32};
  c.reference_tol = 0.0;
  c.device_tol = {0.0, 0.0, 0.0};
  c.make_inputs = [](int64_t n, Rng& rng) { return std::vector<Input>{f32("x", spread_rows(n, rng))}; };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const int64_t rows = in["x"].dim(0), cols = in["x"].dim(1);
    const Device d = env.device();
    Tensor x = in["x"];
    if (bf16_input) {
      x = Tensor::empty({rows, cols}, DType::kBF16, d);
      ops::cast(x, in["x"]);
    }
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
    const Tensor x = bf16_input ? rounded_to_bf16(in["x"]) : in["x"];
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

// The delayed recipe's max over micro-batches: amax of x1, then accumulate=true with x2 (and over the transposes)
// must give the per-tile max of the two; exact (tolerance 0).
OpCase amax_accumulate_case(Fp8Tiling tiling, const char* tiling_name) {
  OpCase c;
  c.name = fmt::format("fp8_amax_accumulate_{}", tiling_name);
  c.dtypes = {DType::kF32};
  c.reference_tol = 0.0;
  c.device_tol = {0.0, 0.0, 0.0};
  c.make_inputs = [](int64_t n, Rng& rng) {
    return std::vector<Input>{f32("x1", spread_rows(n, rng)), f32("x2", spread_rows(n, rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const int64_t rows = in["x1"].dim(0), cols = in["x1"].dim(1);
    Tensor amax = env.out_f32(ops::fp8_tile_grid(rows, cols, tiling));
    Tensor amax_t = env.out_f32(ops::fp8_tile_grid(cols, rows, tiling));
    ops::fp8_amax(in["x1"], tiling, amax);
    ops::fp8_amax(in["x2"], tiling, amax, false, /*accumulate=*/true);
    ops::fp8_amax(in["x1"], tiling, amax_t, true);
    ops::fp8_amax(in["x2"], tiling, amax_t, true, /*accumulate=*/true);
    return Tensors{{"amax", amax}, {"amax_t", amax_t}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float) {
    const int64_t rows = in["x1"].dim(0), cols = in["x1"].dim(1);
    auto tile_max = [&](bool transposed) {
      const int64_t m = transposed ? cols : rows, n = transposed ? rows : cols;
      const int64_t tr = tiling.rows == 0 ? m : tiling.rows, tc = tiling.cols == 0 ? n : tiling.cols;
      const int64_t grid_cols = (n + tc - 1) / tc;
      std::vector<double> amax(static_cast<size_t>((m + tr - 1) / tr * grid_cols), 0.0);
      for (const char* name : {"x1", "x2"}) {
        const float* x = in[name].f32();
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double& a = amax[static_cast<size_t>((i / tr) * grid_cols + j / tc)];
            a = std::max(a, static_cast<double>(std::fabs(transposed ? x[j * cols + i] : x[i * cols + j])));
          }
        }
      }
      return amax;
    };
    return Tensors{{"amax", from_doubles(ops::fp8_tile_grid(rows, cols, tiling), tile_max(false))},
                   {"amax_t", from_doubles(ops::fp8_tile_grid(cols, rows, tiling), tile_max(true))}};
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
  // bf16 activations (the CUDA engine's): the same codes as quantising their values in f32.
  cases.push_back(quantize_case({Fp8Format::kE4M3, tensorwise, "tensorwise", {}}, true));
  cases.push_back(quantize_case({Fp8Format::kE5M2, activations, "1x128", {.power_of_two = true}}, true));
  cases.push_back(quantize_case({Fp8Format::kE4M3, weights, "128x128", {.power_of_two = true}}, true));
  cases.push_back(amax_accumulate_case(tensorwise, "tensorwise"));
  cases.push_back(amax_accumulate_case(activations, "1x128"));
  cases.push_back(amax_accumulate_case(weights, "128x128"));
  cases.push_back(amax_accumulate_case({3, 7}, "3x7"));
  for (OpCase& gemm : fp8_gemm_op_cases()) cases.push_back(std::move(gemm));
  return cases;
}

}  // namespace primus::testing
