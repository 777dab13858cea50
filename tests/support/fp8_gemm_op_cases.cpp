// The fp8 GEMM's cases (ops::fp8_gemm) for the harness. Each case quantises two fresh random f32 matrices with the
// quantisation ops (amax → scale → quantise, on the run's device: those are bit-exact across backends, so both
// backends multiply the same codes), multiplies them with fp8_gemm and returns C. The reference dequantises with the
// host model (support/fp8_reference.h: decode × scale_inv rounded to f32, as fp8_dequantize does) and multiplies in
// double: the CPU backend, which dequantises exactly, must equal it up to those f32 roundings (a few f32 steps; none
// with power-of-two scales) and C's one rounding (f32: 1e-6; bf16: half a bf16 step, 2^-9 per element). A device
// must equal the CPU up to its fp8 tensor cores' sums (5e-4: they keep about 14 bits inside each MMA, DeepSeek-V3
// §3.3.2; an H100 measured up to 1.34e-4 in fp8_gemm_gpu_test) or, for bf16 C, a bf16 step (2^-8, 4e-3) on the
// elements whose sum lands on the other side of a rounding boundary: at size 32 (2,048 elements) an H100 measured
// 2.1e-3 for blockwise e4m3 × e5m2 accumulating into bf16. How far fp8 lies from the unquantised product is checked
// against the bound the formats imply in tests/ops/fp8_ops_test.cpp.
//
// Shapes for size n: A [n, 2n + 64], B [n + 32, 2n + 64], so every dimension is awkward at the CPU sizes (partial
// 1x128 tiles and 128x128 blocks, K not a multiple of 128) and a multiple of 16 at 32 and the device sizes, the only
// ones cuBLASLt's fp8 GEMM takes (the other sizes skip on a device, saying so). At 128, K = 320 gives 3 K blocks: the
// 128x128 scale grid is padded to 4 columns for cuBLASLt. Rows and 128-wide column blocks are scaled by random
// powers of two so the tiles of one operand need different scales.
#include <cmath>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "ops/fp8_ops.h"
#include "ops/ops.h"
#include "support/fp8_reference.h"
#include "support/op_cases.h"
#include "support/test_support.h"

namespace primus::testing {
namespace {

struct GemmCaseSpec {
  Fp8CaseSpec a, b;
  DType c_dtype;
  bool accumulate;
};

Tensor spread_operand(int64_t rows, int64_t cols, Rng& rng) {
  Tensor x = random_tensor({rows, cols}, rng);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b * 128 < cols; ++b) {
      const float block_scale = std::ldexp(1.0f, static_cast<int>(rng.below(9)) - 4);
      for (int64_t c = b * 128; c < std::min(cols, (b + 1) * 128); ++c) x.f32()[r * cols + c] *= block_scale;
    }
  }
  return x;
}

struct Quantised {
  Tensor codes, scale_inv;
};

// x quantised on its device with s's format, tiling and scale options.
Quantised quantise(const Tensor& x, const Fp8CaseSpec& s) {
  const Device d = x.device();
  const Shape grid = ops::fp8_tile_grid(x.dim(0), x.dim(1), s.tiling);
  Tensor amax = Tensor::empty(grid, DType::kF32, d), scale = Tensor::empty(grid, DType::kF32, d);
  Quantised q{Tensor::empty(x.shape(), DType::kU8, d), Tensor::empty(grid, DType::kF32, d)};
  Tensor non_finite = ops::zeros({1}, DType::kI32, d);
  ops::fp8_amax(x, s.tiling, amax);
  ops::fp8_scale(amax, s.format, s.options, scale, q.scale_inv, non_finite);
  ops::fp8_quantize(x, scale, s.format, s.tiling, q.codes);
  return q;
}

std::string spec_name(const GemmCaseSpec& s) {
  return fmt::format("fp8_gemm_{}_{}_{}_{}_{}{}", s.a.tiling_name, s.b.tiling_name, fp8_format_name(s.a.format),
                     fp8_format_name(s.b.format), dtype_name(s.c_dtype), s.accumulate ? "_accumulate" : "");
}

OpCase gemm_case(const GemmCaseSpec& s, bool on_devices = true) {
  OpCase c;
  c.name = spec_name(s);
  // The inputs are f32 in every run (the quantisation reads them); what differs by case is C's dtype. No dtype, no
  // device test: the fnuz formats are AMD's, which the CUDA backend refuses (fp8_ops_test checks the message).
  c.dtypes = on_devices ? std::vector<DType>{DType::kF32} : std::vector<DType>{};
  c.device_sizes = {128, 256};
  c.device_size_multiple = 16;
  c.device_size_reason = "cuBLASLt's fp8 GEMM needs M, N and K multiples of 16 (the CPU reference takes any size)";
  const bool bf16_out = s.c_dtype == DType::kBF16;
  c.reference_tol = bf16_out ? 4e-3 : 1e-6;
  c.device_tol = {bf16_out ? 4e-3 : 5e-4, 0.0, 0.0};
  c.make_inputs = [](int64_t n, Rng& rng) {
    const int64_t m = n, cols = n + 32, k = 2 * n + 64;
    return std::vector<Input>{f32("a", spread_operand(m, k, rng)), f32("b", spread_operand(cols, k, rng)),
                              f32("c0", random_tensor({m, cols}, rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const Quantised a = quantise(in["a"], s.a), b = quantise(in["b"], s.b);
    const Shape shape{in["a"].dim(0), in["b"].dim(0)};
    Tensor out = env.nan(shape, s.c_dtype);
    if (s.accumulate) ops::cast(out, in["c0"]);
    ops::fp8_gemm({&a.codes, s.a.format, s.a.tiling, &a.scale_inv}, {&b.codes, s.b.format, s.b.tiling, &b.scale_inv},
                  out, {.accumulate = s.accumulate});
    return Tensors{{"c", out}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float) {
    const int64_t m = in["a"].dim(0), k = in["a"].dim(1), n = in["b"].dim(0);
    const std::vector<double> a = reference_quantize(s.a, in["a"].f32(), m, k, false).y;
    const std::vector<double> b = reference_quantize(s.b, in["b"].f32(), n, k, false).y;
    std::vector<double> out(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0;
        for (int64_t l = 0; l < k; ++l) sum += a[static_cast<size_t>(i * k + l)] * b[static_cast<size_t>(j * k + l)];
        if (s.accumulate) {
          const float c0 = in["c0"].f32()[i * n + j];
          sum += bf16_out ? bf16_to_f32(f32_to_bf16(c0)) : c0;  // C held the old values in its dtype
        }
        out[static_cast<size_t>(i * n + j)] = sum;
      }
    }
    return Tensors{{"c", from_doubles({m, n}, out)}};
  };
  return c;
}

}  // namespace

std::vector<OpCase> fp8_gemm_op_cases() {
  const Fp8Tiling tensorwise{0, 0}, rows_1x128{1, 128}, blocks{128, 128};
  const Fp8Format e4m3 = Fp8Format::kE4M3, e5m2 = Fp8Format::kE5M2;
  const Fp8ScaleOptions pow2{.power_of_two = true};
  auto tw = [&](Fp8Format f) { return Fp8CaseSpec{f, tensorwise, "tensorwise", {}}; };
  auto act = [&](Fp8Format f, Fp8ScaleOptions o) { return Fp8CaseSpec{f, rows_1x128, "1x128", o}; };
  auto weight = [&](Fp8Format f, Fp8ScaleOptions o) { return Fp8CaseSpec{f, blocks, "128x128", o}; };
  std::vector<OpCase> cases;
  // Tensorwise: the forward (e4m3 both), the hybrid recipe's data gradient (e5m2 dy with e4m3 W) and weight gradient
  // (f32 dW accumulating e5m2 dyᵀ with e4m3 xᵀ), both C dtypes, accumulate on and off, both mixed format orders.
  cases.push_back(gemm_case({tw(e4m3), tw(e4m3), DType::kF32, false}));
  cases.push_back(gemm_case({tw(e4m3), tw(e4m3), DType::kBF16, false}));
  cases.push_back(gemm_case({tw(e5m2), tw(e4m3), DType::kBF16, false}));
  cases.push_back(gemm_case({tw(e4m3), tw(e5m2), DType::kF32, true}));
  cases.push_back(gemm_case({tw(e5m2), tw(e4m3), DType::kF32, true}));
  cases.push_back(gemm_case({tw(e4m3), tw(e4m3), DType::kBF16, true}));
  // Blockwise (DeepSeek-V3): 1x128 activations with 128x128 weights (forward, data gradient), power-of-two scales
  // (Transformer Engine's default) and plain amax/448 ones; 1x128 with 1x128 for the weight gradient.
  cases.push_back(gemm_case({act(e4m3, pow2), weight(e4m3, pow2), DType::kBF16, false}));
  cases.push_back(gemm_case({act(e4m3, {}), weight(e4m3, {}), DType::kF32, false}));
  cases.push_back(gemm_case({act(e5m2, pow2), weight(e4m3, pow2), DType::kBF16, false}));
  cases.push_back(gemm_case({act(e4m3, pow2), act(e4m3, pow2), DType::kF32, true}));
  cases.push_back(gemm_case({act(e4m3, {}), act(e5m2, {}), DType::kBF16, true}));
  // AMD's pair (MI300X's nanoo_fp8), on the CPU reference only.
  cases.push_back(gemm_case({tw(Fp8Format::kE4M3Fnuz), tw(Fp8Format::kE5M2Fnuz), DType::kF32, false}, false));
  return cases;
}

}  // namespace primus::testing
