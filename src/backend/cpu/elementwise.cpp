// Element-wise helpers on the CPU: y += x, x *= s, and Σ x² for gradient-norm clipping.
// sum_squares sums fixed chunks of kChunk elements in double, then adds the chunk sums in chunk order, so the
// result depends neither on the thread count nor on scheduling.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

constexpr int64_t kChunk = 1 << 14;

}  // namespace

void CpuBackend::add_inplace(Tensor& y, const Tensor& x) {
  const int64_t n = y.numel();
  float* py = y.f32();
  const float* px = x.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) py[i] += px[i];
}

void CpuBackend::scale_inplace(Tensor& x, float s) {
  const int64_t n = x.numel();
  float* px = x.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) px[i] *= s;
}

double CpuBackend::sum_squares(const Tensor& x) {
  const int64_t n = x.numel();
  const float* px = x.f32();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double sum = 0.0;
    for (int64_t i = c * kChunk; i < end; ++i) sum += static_cast<double>(px[i]) * px[i];
    partial[static_cast<size_t>(c)] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace primus
