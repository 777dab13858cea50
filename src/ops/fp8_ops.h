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

// amax (x's tile grid, or xᵀ's when transposed; f32, overwritten) = max |x| per tile of x [R, C] (f32); NaN where a
// tile holds a NaN.
void fp8_amax(const Tensor& x, Fp8Tiling tiling, Tensor& amax, bool transposed = false);
// scale and scale_inv (amax's shape, f32) from amax; non_finite [1] i32 += the tiles whose amax was NaN or ±inf
// (Fp8ScaleArgs: what a zero or non-finite amax gives).
void fp8_scale(const Tensor& amax, Fp8Format format, Fp8ScaleOptions options, Tensor& scale, Tensor& scale_inv,
               Tensor& non_finite);
// codes [R, C] u8 = x [R, C] (f32) scaled per tile and encoded, saturating.
void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, Fp8Tiling tiling, Tensor& codes);
// The same, and in the same pass codes_t [C, R] u8 = xᵀ quantised with scale_t over xᵀ's tiles (the copy the backward
// GEMMs read; for tensorwise scaling scale_t is scale, for square tiles its transpose).
void fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, Fp8Tiling tiling, Tensor& codes,
                  const Tensor& scale_t, Tensor& codes_t);
// y [R, C] f32 = decoded codes [R, C] u8 times scale_inv of their tile.
void fp8_dequantize(const Tensor& codes, const Tensor& scale_inv, Fp8Format format, Fp8Tiling tiling, Tensor& y);

}  // namespace primus::ops
