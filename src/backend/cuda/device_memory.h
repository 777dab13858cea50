// Free and total memory of a CUDA device as the driver reports them, for the trainer's memory table. Plain
// C++ (no CUDA headers), so src/train includes it in CUDA builds.
#pragma once

#include <cstdint>

namespace primus {

struct GpuMemoryInfo {
  int64_t free_bytes = 0;   // not yet handed out by the driver (this process's cache counts as used)
  int64_t total_bytes = 0;  // the device's memory as the driver sees it
};

// For device `device_index` (made current on the calling thread). Throws RuntimeError when the runtime fails.
GpuMemoryInfo cuda_memory_info(int device_index);

}  // namespace primus
