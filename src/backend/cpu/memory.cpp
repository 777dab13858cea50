// Memory entries of the CPU backend: copy, fill and zero of host tensors, through the Tensor helpers.
// A copy that involves another device belongs to that device's backend, so it is refused here.
#include "backend/cpu/cpu_backend.h"

namespace primus {

void CpuBackend::copy(Tensor& dst, const Tensor& src) {
  PRIMUS_CHECK(dst.device().is_cpu() && src.device().is_cpu(),
               "[op copy] {} <- {}: the cpu backend copies only between host tensors; use the device's backend",
               dst.describe(), src.describe());
  dst.copy_from(src);
}

void CpuBackend::fill(Tensor& x, float value) { x.fill(value); }

void CpuBackend::zero(Tensor& x) { x.zero(); }

}  // namespace primus
