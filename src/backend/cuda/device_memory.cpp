// cuda_memory_info through the portability layer (gpu_runtime.h).
#include "backend/cuda/device_memory.h"

#include <cstddef>

#include "backend/cuda/gpu_runtime.h"
#include "core/error.h"

namespace primus {

GpuMemoryInfo cuda_memory_info(int device_index) {
  PRIMUS_CUDA_CHECK(gpuSetDevice(device_index));
  size_t free_bytes = 0, total_bytes = 0;
  PRIMUS_CUDA_CHECK(gpuMemGetInfo(&free_bytes, &total_bytes));
  return GpuMemoryInfo{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

}  // namespace primus
