// The CUDA fp8 quantisation kernels (src/backend/cuda/kernels/fp8.cu) against the CPU reference, byte for byte: tile
// amaxes (a NaN and an infinity among them), scales with their fallbacks and the non-finite count, the codes and the
// transposed copy for each format and tiling at awkward shapes, and dequantisation. The op harness's fp8_quantize_*
// cases check the same chain through dequantised values (op_cases_gpu_test); this one compares the u8 codes
// themselves. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/fp8.h"
#include "ops/fp8_ops.h"
#include "ops/ops.h"
#include "support/test_support.h"

namespace primus {
namespace {

constexpr Device kGpu{DeviceType::kCuda, 0};

class Fp8Gpu : public testing::GpuTest {};

// amax → scale → quantise (with the transposed copy) → dequantise on `device`, every result brought to the host.
struct Chain {
  Tensor amax, amax_t, scale, scale_inv, scale_t, codes, codes_t, y, non_finite;
};

Chain run(const Tensor& host_x, Fp8Format format, Fp8Tiling tiling, Fp8ScaleOptions options, Device device,
          bool bf16_input) {
  Tensor x = ops::to_device(host_x, device);
  if (bf16_input) {  // the CUDA engine's activations; both sides quantise the same rounded values
    Tensor rounded = Tensor::empty(x.shape(), DType::kBF16, device);
    ops::cast(rounded, x);
    x = rounded;
  }
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const Shape grid = ops::fp8_tile_grid(rows, cols, tiling), grid_t = ops::fp8_tile_grid(cols, rows, tiling);
  Tensor amax = Tensor::empty(grid, DType::kF32, device), amax_t = Tensor::empty(grid_t, DType::kF32, device);
  Tensor scale = ops::zeros(grid, DType::kF32, device), scale_t = ops::zeros(grid_t, DType::kF32, device);
  ops::fill(scale, 2.0f);  // the previous scale of a delayed recipe
  ops::fill(scale_t, 2.0f);
  Tensor scale_inv = Tensor::empty(grid, DType::kF32, device), scale_inv_t = Tensor::empty(grid_t, DType::kF32, device);
  Tensor non_finite = ops::zeros({1}, DType::kI32, device);
  Tensor codes = Tensor::empty({rows, cols}, DType::kU8, device),
         codes_t = Tensor::empty({cols, rows}, DType::kU8, device);
  Tensor y = Tensor::empty({rows, cols}, DType::kF32, device);
  ops::fp8_amax(x, tiling, amax);
  ops::fp8_amax(x, tiling, amax_t, true);
  ops::fp8_scale(amax, format, options, scale, scale_inv, non_finite);
  ops::fp8_scale(amax_t, format, options, scale_t, scale_inv_t, non_finite);
  ops::fp8_quantize(x, scale, format, tiling, codes, scale_t, codes_t);
  ops::fp8_dequantize(codes, scale_inv, format, tiling, y);
  auto host = [](const Tensor& t) { return ops::to_device(t, kCpuDevice); };
  return {host(amax),  host(amax_t),  host(scale), host(scale_inv), host(scale_t),
          host(codes), host(codes_t), host(y),     host(non_finite)};
}

// Equal bits, or both NaN: a NaN code decodes to one NaN on both sides, but NaN × scale_inv is the GPU's canonical
// NaN and the x86 input NaN.
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.f32()[i], y = b.f32()[i];
    if (std::isnan(x) && std::isnan(y)) continue;
    if (std::memcmp(&x, &y, sizeof(float)) != 0) return false;
  }
  return true;
}

// Awkward shapes for the general kernels, and shapes that take each fast path of kernels/fp8.cu: rows of multiples of
// 8 (vector codes), whole and partial 64×64 tiles for the codes of x and xᵀ in one pass (rows not a multiple of 4
// among them), 1×128 tiles of x and of xᵀ with a partial last tile, a whole-tensor amax over many blocks with a tail.
TEST_F(Fp8Gpu, EveryStepEqualsTheCpuByteForByte) {
  Rng rng(15);
  for (const Shape& shape : {Shape{1, 1}, Shape{31, 129}, Shape{257, 300}, Shape{128, 128}, Shape{1000, 256},
                             Shape{37, 24}, Shape{2048, 1032}, Shape{5, 8}}) {
    Tensor x = testing::random_tensor(shape, rng);
    for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] *= std::ldexp(1.0f, static_cast<int>(rng.below(30)) - 15);
    if (x.numel() > 200) {
      x.f32()[7] = std::numeric_limits<float>::quiet_NaN();
      x.f32()[x.numel() - 3] = -std::numeric_limits<float>::infinity();
    }
    for (const Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2, Fp8Format::kE4M3Fnuz, Fp8Format::kE5M2Fnuz}) {
      for (const Fp8Tiling tiling : {Fp8Tiling{0, 0}, Fp8Tiling{1, 128}, Fp8Tiling{128, 128}, Fp8Tiling{3, 7}}) {
        for (const Fp8ScaleOptions options : {Fp8ScaleOptions{}, Fp8ScaleOptions{.margin = 2, .keep_previous = true},
                                              Fp8ScaleOptions{.power_of_two = true}}) {
          for (const bool bf16_input : {false, true}) {
            const Chain cpu = run(x, format, tiling, options, kCpuDevice, bf16_input);
            const Chain gpu = run(x, format, tiling, options, kGpu, bf16_input);
            const std::string what =
                fmt::format("{} {}{} tiling {}x{} margin {} pow2 {} keep {}", shape_str(shape), fp8_format_name(format),
                            bf16_input ? " bf16 input" : "", tiling.rows, tiling.cols, options.margin,
                            options.power_of_two, options.keep_previous);
            EXPECT_TRUE(testing::same_bits(gpu.amax, cpu.amax)) << what << ": amax";
            EXPECT_TRUE(testing::same_bits(gpu.amax_t, cpu.amax_t)) << what << ": amax of the transpose";
            EXPECT_TRUE(testing::same_bits(gpu.scale, cpu.scale)) << what << ": scale";
            EXPECT_TRUE(testing::same_bits(gpu.scale_inv, cpu.scale_inv)) << what << ": scale_inv";
            EXPECT_TRUE(testing::same_bits(gpu.scale_t, cpu.scale_t)) << what << ": scale of the transpose";
            EXPECT_TRUE(testing::same_bits(gpu.codes, cpu.codes)) << what << ": codes";
            EXPECT_TRUE(testing::same_bits(gpu.codes_t, cpu.codes_t)) << what << ": transposed codes";
            EXPECT_TRUE(same_values(gpu.y, cpu.y)) << what << ": dequantised";
            EXPECT_EQ(gpu.non_finite.i32()[0], cpu.non_finite.i32()[0]) << what << ": non-finite amaxes";
            if (x.numel() > 200) {
              EXPECT_GT(cpu.non_finite.i32()[0], 0) << what;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace primus
