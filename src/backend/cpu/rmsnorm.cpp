// RMSNorm on the CPU: y = weight ⊙ x · rstd, rstd = 1/sqrt(mean(x²) + eps), per row.
// Backward, with x̂ = x · rstd and g = dy ⊙ weight:
//   dx = rstd · (g − x̂ · mean(g ⊙ x̂))        (overwritten)
//   dweight += Σ_rows dy ⊙ x̂                  (accumulated)
// Row reductions accumulate in double. dweight is summed per column block over all rows in row order, so it
// does not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

constexpr int64_t kColumnBlock = 16;  // columns of dweight owned by one thread at a time

}  // namespace

void CpuBackend::rmsnorm_forward(const RmsNormArgs& args) {
  const int64_t channels = args.x->dim(-1);
  const int64_t rows = args.x->numel() / std::max<int64_t>(channels, 1);
  const float* x = args.x->f32();            // [N, C]
  const float* weight = args.weight->f32();  // [C]
  float* y = args.y->f32();                  // [N, C]
  float* rstd = args.rstd->f32();            // [N]
  const double eps = args.eps;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * channels;
    float* yr = y + r * channels;
    double sum_sq = 0.0;
    for (int64_t c = 0; c < channels; ++c) sum_sq += static_cast<double>(xr[c]) * xr[c];
    const float s = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(channels) + eps));
    for (int64_t c = 0; c < channels; ++c) yr[c] = (xr[c] * s) * weight[c];
    rstd[r] = s;
  }
}

void CpuBackend::rmsnorm_backward(const RmsNormArgs& args) {
  const int64_t channels = args.x->dim(-1);
  const int64_t rows = args.x->numel() / std::max<int64_t>(channels, 1);
  const float* x = args.x->f32();            // [N, C]
  const float* weight = args.weight->f32();  // [C]
  const float* rstd = args.rstd->f32();      // [N]
  const float* dy = args.dy->f32();          // [N, C]
  if (args.dx != nullptr && args.dx->defined()) {
    float* dx = args.dx->f32();  // [N, C]
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * channels;
      const float* dyr = dy + r * channels;
      float* dxr = dx + r * channels;
      const float s = rstd[r];
      double dot = 0.0;  // Σ g ⊙ x̂
      for (int64_t c = 0; c < channels; ++c) dot += static_cast<double>(dyr[c] * weight[c]) * (xr[c] * s);
      const float mean_dot = static_cast<float>(dot / static_cast<double>(channels));
      for (int64_t c = 0; c < channels; ++c) dxr[c] = s * (dyr[c] * weight[c] - (xr[c] * s) * mean_dot);
    }
  }
  if (args.dweight != nullptr && args.dweight->defined()) {
    float* dweight = args.dweight->f32();  // [C] accumulate
    const int64_t blocks = (channels + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t c0 = block * kColumnBlock;
      const int64_t width = std::min(channels, c0 + kColumnBlock) - c0;
      double acc[kColumnBlock] = {};
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * channels + c0;
        const float* dyr = dy + r * channels + c0;
        const float s = rstd[r];
        for (int64_t c = 0; c < width; ++c) acc[c] += static_cast<double>(dyr[c] * (xr[c] * s));
      }
      for (int64_t c = 0; c < width; ++c) dweight[c0 + c] += static_cast<float>(acc[c]);
    }
  }
}

}  // namespace primus
