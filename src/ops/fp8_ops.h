// fp8 quantisation op entry points (backend/backend.h, Fp8Tiling ... Fp8DequantizeArgs, has the math; core/fp8.h the
// formats; docs/fp8.md the recipes). Shapes, dtypes and devices are checked here with messages naming the op. A
// recipe runs, per tensor a GEMM reads:
//   fp8_amax → fp8_scale → fp8_quantize (codes, and codes_t for the backward GEMMs) ... fp8_dequantize (checks)
// The amax, scale and counts stay on the device: no host sync in a step. The CPU backend is the reference; the CUDA
// kernels (backend/cuda/kernels/fp8.cu) must equal it byte for byte.
#pragma once

#include "backend/backend.h"

namespace primus::ops {

// The tile grid of a matrix [rows, cols] under `tiling`: [ceil(rows / tile rows), ceil(cols / tile cols)], a zero
// tile extent covering the whole dimension ([1, 1] for tensorwise scaling).
Shape fp8_tile_grid(int64_t rows, int64_t cols, Fp8Tiling tiling);

// amax (x's tile grid, or xᵀ's when transposed; f32) = max |x| per tile of x [R, C] (f32 or bf16); NaN where a tile
// holds a NaN. Overwritten, or with accumulate the max of amax's values and the new ones (NaN kept): the delayed
// recipe's max over a step's micro-batches.
void fp8_amax(const Tensor& x, Fp8Tiling tiling, Tensor& amax, bool transposed = false, bool accumulate = false);
// scale and scale_inv (amax's shape, f32) from amax; non_finite [1] i32 += the tiles whose amax was NaN or ±inf
// (Fp8ScaleArgs: what a zero or non-finite amax gives).
void fp8_scale(const Tensor& amax, Fp8Format format, Fp8ScaleOptions options, Tensor& scale, Tensor& scale_inv,
               Tensor& non_finite);
// codes [R, C] u8 = x [R, C] (f32 or bf16) scaled per tile and encoded, saturating.
void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, Fp8Tiling tiling, Tensor& codes);
// The same, and in the same pass codes_t [C, R] u8 = xᵀ quantised with scale_t over xᵀ's tiles (the copy the backward
// GEMMs read; for tensorwise scaling scale_t is scale, for square tiles its transpose).
void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, Fp8Tiling tiling, Tensor& codes,
                  const Tensor& scale_t, Tensor& codes_t);
// y [R, C] f32 = decoded codes [R, C] u8 times scale_inv of their tile.
void fp8_dequantize(const Tensor& codes, const Tensor& scale_inv, Fp8Format format, Fp8Tiling tiling, Tensor& y);

// One fp8 operand of fp8_gemm: codes [rows, K] u8 (K contiguous), their format, tiling and scale_inv over that
// tiling's grid (f32, what fp8_scale wrote).
struct Fp8Operand {
  const Tensor* codes = nullptr;
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Tiling tiling;
  const Tensor* scale_inv = nullptr;
};

struct Fp8GemmOptions {
  bool accumulate = false;         // c += A · Bᵀ (the weight gradient)
  bool fast_accumulation = false;  // tensorwise only (backend.h, Fp8GemmArgs)
};

// c [M, N] (f32 or bf16) = A · Bᵀ, or += with accumulate, A = a [M, K] and B = b [N, K] dequantised (backend.h,
// Fp8GemmArgs). Tilings: both tensorwise {0, 0}, or a {1, 128} with b {128, 128} or {1, 128}. Formats: both of the
// OCP pair or both of the fnuz pair, never e5m2 with e5m2 (no recipe multiplies two gradients; Hopper has no such
// instruction). The CUDA backend also needs M, N, K multiples of 16 and the OCP formats (its errors name them).
void fp8_gemm(const Fp8Operand& a, const Fp8Operand& b, Tensor& c, Fp8GemmOptions options = {});

}  // namespace primus::ops
