// The fp8 GEMM on the CPU, the reference of the cuBLASLt path (backend.h: Fp8GemmArgs). Each operand is dequantised
// exactly: a decoded code has at most 4 significant bits and scale_inv 24, so their product is exact in double (not
// in f32, unless the scale is a power of two). Dot products are accumulated in double, which is exact to well below
// any f32 accumulator's error (products of two dequantised values carry ≤ 58 bits, rounded once to 53), so the
// device result is compared with the exact sum, not with another fp32 summation order. C (plus its old value with
// accumulate) is then rounded once to its dtype: directly from double to f32, and for bf16 through f32 rounded to odd,
// which makes the following f32 → bf16 rounding the correct single rounding of the double.
//
// Any size works; there are no alignment rules. Rows of C are split over OpenMP threads; each element is computed
// by one thread in a fixed order, so the result does not depend on the thread count.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

// codes [rows, cols] decoded times the scale_inv of their tile, in double (exact).
std::vector<double> dequantize_exact(const Tensor& codes, Fp8Format format, Fp8Tiling tiling, const Tensor& scale_inv) {
  const int64_t rows = codes.dim(0), cols = codes.dim(1);
  const int64_t tile_rows = tiling.rows == 0 ? rows : tiling.rows, tile_cols = tiling.cols == 0 ? cols : tiling.cols;
  const int64_t grid_cols = (cols + tile_cols - 1) / tile_cols;
  const auto* c = static_cast<const uint8_t*>(codes.data());
  const float* inv = scale_inv.f32();
  std::vector<double> out(static_cast<size_t>(rows * cols));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double scale = inv[(i / tile_rows) * grid_cols + j / tile_cols];
      out[static_cast<size_t>(i * cols + j)] = static_cast<double>(fp8_decode(c[i * cols + j], format)) * scale;
    }
  }
  return out;
}

// Σ_k a[k] · b[k] in double, four partial sums (a fixed order, independent of threads) so the loop is not bound by
// one addition's latency.
double dot(const double* a, const double* b, int64_t k) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) {
    for (int l = 0; l < 4; ++l) s[l] += a[i + l] * b[i + l];
  }
  for (; i < k; ++i) s[0] += a[i] * b[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// d rounded to f32 toward zero, the last mantissa bit set when that was inexact ("round to odd"): a second rounding
// to any format of at most 22 significand bits (bf16 has 8) then equals rounding d once.
float round_to_odd_f32(double d) {
  float f = static_cast<float>(d);
  if (!std::isfinite(f) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  bits |= 1u;
  std::memcpy(&f, &bits, sizeof(bits));
  return f;
}

}  // namespace

void CpuBackend::fp8_gemm(const Fp8GemmArgs& args) {
  const int64_t m = args.a->dim(0), k = args.a->dim(1), n = args.b->dim(0);
  const std::vector<double> a = dequantize_exact(*args.a, args.a_format, args.a_tiling, *args.a_scale_inv);
  const std::vector<double> b = dequantize_exact(*args.b, args.b_format, args.b_tiling, *args.b_scale_inv);
  Tensor& c = *args.c;
  const bool bf16_out = c.dtype() == DType::kBF16;
  float* c32 = bf16_out ? nullptr : c.f32();
  auto* c16 = bf16_out ? static_cast<uint16_t*>(c.data()) : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = dot(&a[static_cast<size_t>(i * k)], &b[static_cast<size_t>(j * k)], k);
      const int64_t at = i * n + j;
      if (args.accumulate) sum += bf16_out ? static_cast<double>(bf16_to_f32(c16[at])) : static_cast<double>(c32[at]);
      if (bf16_out) {
        c16[at] = f32_to_bf16(round_to_odd_f32(sum));
      } else {
        c32[at] = static_cast<float>(sum);
      }
    }
  }
}

}  // namespace primus
