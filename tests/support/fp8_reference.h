// The host model of fp8 quantisation the op-harness cases compare with (fp8_op_cases.cpp, fp8_gemm_op_cases.cpp):
// per tile amax, scale and the decoded codes times scale_inv, written out with plain loops over core/fp8.h's scalar
// rules (which tests/unit/fp8_format_test.cpp checks against an independent model).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/fp8.h"

namespace primus::testing {

struct Fp8CaseSpec {
  Fp8Format format;
  Fp8Tiling tiling;
  const char* tiling_name;
  Fp8ScaleOptions options;
};

// The whole recipe in loops over core/fp8.h, on the host: per tile amax, scale, then codes decoded times scale_inv.
struct Quantized {
  std::vector<double> y, scale_inv;
};

// fixed_scale > 0: every tile takes that scale instead (the delayed recipe's scales come from earlier steps).
inline Quantized reference_quantize(const Fp8CaseSpec& s, const float* x, int64_t rows, int64_t cols, bool transposed,
                                    float fixed_scale = 0.0f) {
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
    scale[g] = fixed_scale > 0.0f ? fixed_scale
                                  : fp8_scale_from_amax(amax, fp8_info(s.format).max_finite, s.options.margin, 1.0f,
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

}  // namespace primus::testing
