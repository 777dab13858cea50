// Memory entries of the CPU backend: copy, cast, fill and zero of host tensors, through the Tensor helpers and
// core/bf16.h; also sum_into (the loss accumulator the CUDA backend keeps on the device).
// A copy that involves another device belongs to that device's backend, so it is refused here.
#include <cstdint>

#include "backend/cpu/cpu_backend.h"
#include "core/bf16.h"
#include "core/rng.h"

namespace primus {

void CpuBackend::copy(Tensor& dst, const Tensor& src) {
  PRIMUS_CHECK(dst.device().is_cpu() && src.device().is_cpu(),
               "[op copy] {} <- {}: the cpu backend copies only between host tensors; use the device's backend",
               dst.describe(), src.describe());
  dst.copy_from(src);
}

// bf16 host tensors exist for conversions (checkpoints, test inputs); no other CPU op reads them.
void CpuBackend::cast(Tensor& dst, const Tensor& src) {
  const size_t n = static_cast<size_t>(src.numel());
  if (dst.dtype() == src.dtype()) {
    dst.copy_from(src);
  } else if (dst.dtype() == DType::kBF16 && src.dtype() == DType::kF32) {
    f32_to_bf16(src.f32(), static_cast<uint16_t*>(dst.data()), n);
  } else if (dst.dtype() == DType::kF32 && src.dtype() == DType::kBF16) {
    bf16_to_f32(static_cast<const uint16_t*>(src.data()), dst.f32(), n);
  } else {
    PRIMUS_CHECK(false, "[op cast] {} <- {}: only f32 <-> bf16", dst.describe(), src.describe());
  }
}

void CpuBackend::sum_into(Tensor& acc, const Tensor& x) {
  const float* px = x.f32();
  double sum = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) sum += px[i];
  acc.f32()[0] = static_cast<float>(static_cast<double>(acc.f32()[0]) + sum);
}

void CpuBackend::fill(Tensor& x, float value) { x.fill(value); }

void CpuBackend::fill_normal(Tensor& x, uint64_t seed, double std, StreamIndex index) {
  float* p = x.f32();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k) p[k] = static_cast<float>(normal_at(seed, index(k)) * std);
}

void CpuBackend::zero(Tensor& x) { x.zero(); }

}  // namespace primus
