// Launchers of the fp8 quantisation kernels (fp8.cu; backend.h's Fp8*Args, core/fp8.h's rules): x in f32 or bf16,
// scales f32, u8 codes, bit-exact with the CPU reference; and the scale-layout kernel of the fp8 GEMM. Kept out of
// kernels.h so the other kernel files do not see core/fp8.h.
#pragma once

#include "backend/cuda/kernels/kernels.h"
#include "core/fp8.h"

namespace primus::cuda {

// A matrix [rows, cols] cut into tiles of tile_rows × tile_cols (both resolved: no 0 for "all").
struct Fp8Tiles {
  int64_t rows, cols, tile_rows, tile_cols;
};

// amax [tiles] = max |x| per tile of x [rows, cols], or of xᵀ when transposed (tiles then describes xᵀ); with
// accumulate the max of that and amax's values. T: float or bf16 (read as f32, exactly).
template <typename T>
void fp8_amax(const KernelContext& ctx, const T* x, Fp8Tiles tiles, bool transposed, bool accumulate, float* amax,
              int64_t count);
// scale, scale_inv [n] from amax [n] (fp8_scale_from_amax); *non_finite (device) += the non-finite amaxes.
void fp8_scale(const KernelContext& ctx, const float* amax, int64_t n, Fp8Format format, int margin, bool power_of_two,
               bool keep_previous, float* scale, float* scale_inv, int32_t* non_finite);
// codes [rows, cols] of x under `tiles`; with transposed, codes [cols, rows] of xᵀ (tiles then describes xᵀ).
template <typename T>
void fp8_quantize(const KernelContext& ctx, const T* x, Fp8Tiles tiles, bool transposed, Fp8Format format,
                  const float* scale, uint8_t* codes);
// Both at once, reading x once: codes [rows, cols] of x under `tiles` (scale) and codes_t [cols, rows] of xᵀ under
// tiles_t (scale_t).
template <typename T>
void fp8_quantize_pair(const KernelContext& ctx, const T* x, Fp8Tiles tiles, Fp8Tiles tiles_t, Fp8Format format,
                       const float* scale, const float* scale_t, uint8_t* codes, uint8_t* codes_t);
// y [rows, cols] = decoded codes times scale_inv of their tile.
void fp8_dequantize(const KernelContext& ctx, const uint8_t* codes, Fp8Tiles tiles, Fp8Format format,
                    const float* scale_inv, float* y);

// The scale grid [rows, cols] (row-major f32, as fp8_scale writes it) in the layout cuBLASLt's block-scaled fp8 GEMM
// reads (cublaslt_gemm.h, Fp8ScaleLayout): transposed, out [cols, rows] (1x128 tiles), or each row padded to
// padded_cols with zeros (128x128 blocks).
void fp8_scale_layout(const KernelContext& ctx, const float* grid, int64_t rows, int64_t cols, bool transpose,
                      int64_t padded_cols, float* out);

}  // namespace primus::cuda
