// The cuBLASLt fp8 GEMM (src/backend/cuda/cublaslt_fp8_gemm.cpp) against the CPU reference (backend/cpu/fp8_gemm.cpp:
// exact dequantisation, double sums) at training sizes 128 to 4096, for each tiling pair and both C dtypes; the
// blockwise path against the tensorwise one on data whose tiles all get the tensor's scale (so the two must agree up
// to summation order: this catches a wrong scale layout, which a random comparison could blur); fast accumulation;
// and the errors for what cuBLASLt cannot take. Operands are quantised on the CPU and copied, so this test does not
// depend on the quantise kernels (fp8_ops_gpu_test checks those). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "ops/fp8_ops.h"
#include "ops/ops.h"
#include "support/test_support.h"

namespace primus {
namespace {

constexpr Device kGpu{DeviceType::kCuda, 0};

class Fp8GemmGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = testing::why_no_gpu();
    if (!why.empty()) GTEST_SKIP() << why;
    ops::start_device(kGpu);
  }
};

struct Operand {
  Tensor codes, scale_inv;  // on the host
  Fp8Format format;
  Fp8Tiling tiling;
};

Operand quantise(const Tensor& x, Fp8Format format, Fp8Tiling tiling, Fp8ScaleOptions options = {}) {
  const Shape grid = ops::fp8_tile_grid(x.dim(0), x.dim(1), tiling);
  Operand o{Tensor::empty(x.shape(), DType::kU8), Tensor::empty(grid, DType::kF32), format, tiling};
  Tensor amax = Tensor::empty(grid, DType::kF32), scale = Tensor::empty(grid, DType::kF32);
  Tensor non_finite = Tensor::zeros({1}, DType::kI32);
  ops::fp8_amax(x, tiling, amax);
  ops::fp8_scale(amax, format, options, scale, o.scale_inv, non_finite);
  ops::fp8_quantize(x, scale, format, tiling, o.codes);
  return o;
}

struct GemmOptions {
  DType c_dtype = DType::kF32;
  bool fast_accumulation = false;
};

// C = A·Bᵀ on `device` (operands copied there), brought back to the host as f32.
Tensor gemm_on(Device device, const Operand& a, const Operand& b, GemmOptions options = {}) {
  const Tensor ac = ops::to_device(a.codes, device), as = ops::to_device(a.scale_inv, device);
  const Tensor bc = ops::to_device(b.codes, device), bs = ops::to_device(b.scale_inv, device);
  Tensor c = Tensor::empty({a.codes.dim(0), b.codes.dim(0)}, options.c_dtype, device);
  ops::fp8_gemm({&ac, a.format, a.tiling, &as}, {&bc, b.format, b.tiling, &bs}, c,
                {.fast_accumulation = options.fast_accumulation});
  Tensor host = ops::to_device(c, kCpuDevice);
  if (host.dtype() == DType::kF32) return host;
  Tensor f = Tensor::empty(host.shape(), DType::kF32);
  ops::cast(f, host);
  return f;
}

// Random values with rows and 128-wide column blocks scaled by powers of two, so tiles need different scales.
Tensor spread(int64_t rows, int64_t cols, Rng& rng) {
  Tensor x = testing::random_tensor({rows, cols}, rng);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b * 128 < cols; ++b) {
      const float s = std::ldexp(1.0f, static_cast<int>(rng.below(9)) - 4);
      for (int64_t c = b * 128; c < std::min(cols, (b + 1) * 128); ++c) x.f32()[r * cols + c] *= s;
    }
  }
  return x;
}

struct TilingPair {
  const char* name;
  Fp8Tiling a, b;
  Fp8Format a_format, b_format;
  Fp8ScaleOptions options;
};

const TilingPair kPairs[] = {
    {"tensorwise e4m3 x e4m3", {0, 0}, {0, 0}, Fp8Format::kE4M3, Fp8Format::kE4M3, {}},
    {"tensorwise e5m2 x e4m3 (hybrid gradients)", {0, 0}, {0, 0}, Fp8Format::kE5M2, Fp8Format::kE4M3, {}},
    {"1x128 x 128x128 (forward, data gradient)",
     {1, 128},
     {128, 128},
     Fp8Format::kE4M3,
     Fp8Format::kE4M3,
     {.power_of_two = true}},
    {"1x128 x 1x128 (weight gradient)", {1, 128}, {1, 128}, Fp8Format::kE4M3, Fp8Format::kE4M3, {}},
};

// M, N, K: square powers of two, K with 3 blocks of 128 (the 128x128 grid padded to 4 columns for cuBLASLt), M and N
// not multiples of 128 (partial blocks), and the 4096 cube.
struct Size {
  int64_t m, n, k;
};
const Size kSizes[] = {{128, 128, 128}, {512, 640, 384}, {1040, 784, 1152}, {4096, 4096, 4096}};

TEST_F(Fp8GemmGpu, MatchesTheCpuReference) {
  Rng rng(19);
  for (const Size& size : kSizes) {
    const Tensor a = spread(size.m, size.k, rng), b = spread(size.n, size.k, rng);
    for (const TilingPair& pair : kPairs) {
      const Operand qa = quantise(a, pair.a_format, pair.a, pair.options);
      const Operand qb = quantise(b, pair.b_format, pair.b, pair.options);
      const std::string what = fmt::format("{} at M={} N={} K={}", pair.name, size.m, size.n, size.k);
      for (const DType c_dtype : {DType::kF32, DType::kBF16}) {
        const Tensor want = gemm_on(kCpuDevice, qa, qb, {.c_dtype = c_dtype});
        const Tensor got = gemm_on(kGpu, qa, qb, {.c_dtype = c_dtype});
        // f32: Hopper's fp8 tensor cores keep about 14 bits of their products' sums inside each MMA (DeepSeek-V3
        // §3.3.2), so f32 C lies ~1e-4 from the exact sums whatever K (an H100 measured 0.97e-4 to 1.34e-4 at K 128
        // to 4096): 5e-4. bf16: a step where a sum crosses a rounding boundary.
        testing::expect_close(what + " " + dtype_name(c_dtype), got, want, c_dtype == DType::kF32 ? 5e-4 : 2e-3);
      }
    }
  }
}

// Every 1x128 tile of A and of B and every 128x128 block of B holds one element of magnitude kPeak, the rest below
// it: each tile's scale equals the tensor's, the codes are the same under every tiling, and the blockwise GEMM must
// equal the tensorwise one up to the order of its f32 sums.
TEST_F(Fp8GemmGpu, BlockwiseEqualsTensorwiseWhenTheScalesAreEqual) {
  constexpr float kPeak = 3.0f;
  Rng rng(20);
  auto peaked = [&](int64_t rows, int64_t cols) {
    Tensor x = testing::random_tensor({rows, cols}, rng);
    for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = std::fmax(std::fmin(x.f32()[i], 2.9f), -2.9f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; c += 128)
        x.f32()[r * cols + c + static_cast<int64_t>(rng.below(128))] = (r % 2 ? -kPeak : kPeak);
    }
    return x;
  };
  const int64_t m = 384, n = 512, k = 640;
  const Tensor a = peaked(m, k), b = peaked(n, k);
  for (const Fp8Tiling b_tiling : {Fp8Tiling{128, 128}, Fp8Tiling{1, 128}}) {
    const Operand ta = quantise(a, Fp8Format::kE4M3, {0, 0}), tb = quantise(b, Fp8Format::kE4M3, {0, 0});
    const Operand ba = quantise(a, Fp8Format::kE4M3, {1, 128}), bb = quantise(b, Fp8Format::kE4M3, b_tiling);
    ASSERT_TRUE(testing::same_bits(ta.codes, ba.codes)) << "the data must give every tile the tensor's scale";
    ASSERT_TRUE(testing::same_bits(tb.codes, bb.codes)) << "the data must give every block the tensor's scale";
    const Tensor tensorwise = gemm_on(kGpu, ta, tb), blockwise = gemm_on(kGpu, ba, bb);
    testing::expect_close(fmt::format("blockwise 1x128 x {}x{} against tensorwise", b_tiling.rows, b_tiling.cols),
                          blockwise, tensorwise, 1e-6);
  }
}

// The delayed recipe keeps every tensor's scale in one row per format (Fp8Scaling), so a GEMM's factor is a view at a
// 4-byte offset; cuBLASLt refused such pointers (CUBLAS_STATUS_NOT_SUPPORTED on the first delayed training run), and
// the same shape then reached it with aligned and unaligned factors in turn.
TEST_F(Fp8GemmGpu, TensorwiseFactorsAtAnyOffsetOfAGroup) {
  Rng rng(22);
  const Tensor a = spread(256, 512, rng), b = spread(384, 512, rng);
  const Operand qa = quantise(a, Fp8Format::kE4M3, {0, 0}), qb = quantise(b, Fp8Format::kE5M2, {0, 0});
  const Tensor want = gemm_on(kCpuDevice, qa, qb);
  const Tensor ac = ops::to_device(qa.codes, kGpu), bc = ops::to_device(qb.codes, kGpu);
  for (int64_t column = 0; column < 5; ++column) {
    Tensor group = Tensor::empty({1, 8}, DType::kF32);  // a group's row of factors, ours at `column`
    for (int64_t i = 0; i < 8; ++i) group.f32()[i] = 1000.0f + static_cast<float>(i);
    group.f32()[column] = qa.scale_inv.f32()[0];
    group.f32()[7 - column] = qb.scale_inv.f32()[0];
    const Tensor on_gpu = ops::to_device(group, kGpu);
    const Tensor as = on_gpu.slice_elements(column, {1, 1}), bs = on_gpu.slice_elements(7 - column, {1, 1});
    Tensor c = Tensor::empty({256, 384}, DType::kF32, kGpu);
    ops::fp8_gemm({&ac, qa.format, qa.tiling, &as}, {&bc, qb.format, qb.tiling, &bs}, c);
    testing::expect_close(fmt::format("factors at columns {} and {}", column, 7 - column),
                          ops::to_device(c, kCpuDevice), want, 5e-4);
  }
}

TEST_F(Fp8GemmGpu, FastAccumulationStaysNearTheReference) {
  Rng rng(21);
  const Tensor a = spread(1024, 2048, rng), b = spread(768, 2048, rng);
  const Operand qa = quantise(a, Fp8Format::kE4M3, {0, 0}), qb = quantise(b, Fp8Format::kE4M3, {0, 0});
  const Tensor want = gemm_on(kCpuDevice, qa, qb);
  const Tensor got = gemm_on(kGpu, qa, qb, {.fast_accumulation = true});
  // No promotion of the partial sums to f32 along K: Hopper's fp8 MMA keeps about 14 significant bits in its
  // accumulator (DeepSeek-V3 measured up to 2% error on single elements at K = 4096), so the bound is loose: 1e-2
  // relative L2, still below e4m3's own quantisation error (2^-4 relative per element).
  testing::expect_close("tensorwise with fast accumulation", got, want, 1e-2);
}

void expect_error(const std::function<void()>& run, const std::string& needle) {
  try {
    run();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(Fp8GemmGpu, RefusesWhatCublasLtCannotTakeNamingIt) {
  Rng rng(22);
  const Operand a = quantise(testing::random_tensor({100, 128}, rng), Fp8Format::kE4M3, {0, 0});
  const Operand b = quantise(testing::random_tensor({64, 128}, rng), Fp8Format::kE4M3, {0, 0});
  expect_error([&] { gemm_on(kGpu, a, b); },
               "[op fp8_gemm] M (a's rows) = 100 is not a multiple of 16: cuBLASLt's fp8 GEMM needs M, N and K");
  const Operand k_odd = quantise(testing::random_tensor({64, 72}, rng), Fp8Format::kE4M3, {0, 0});
  expect_error([&] { gemm_on(kGpu, k_odd, k_odd); }, "K (a's and b's columns) = 72 is not a multiple of 16");
  const Operand fnuz_a = quantise(testing::random_tensor({64, 128}, rng), Fp8Format::kE4M3Fnuz, {0, 0});
  const Operand fnuz_b = quantise(testing::random_tensor({64, 128}, rng), Fp8Format::kE5M2Fnuz, {0, 0});
  expect_error([&] { gemm_on(kGpu, fnuz_a, fnuz_b); },
               "[op fp8_gemm] a is e4m3fnuz: this GPU's fp8 GEMM takes e4m3 / e5m2 (OCP)");
}

}  // namespace
}  // namespace primus
