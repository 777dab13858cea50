// The bytes of host tensors (the CPU allocator's), live and at their peak: the CPU engine's counterpart of the CUDA
// caching allocator's statistics, which the trainer logs as mem_peak_gib and the memory plan is checked against.
// Counted as requested (before the allocator's 64-byte rounding), as the memory plan counts them.
#pragma once

#include <cstdint>

namespace primus {

struct HostMemoryStats {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;  // the most live at once since the start or the last reset_host_memory_peak
};

HostMemoryStats host_memory_stats();
// Starts a new peak at what is live now.
void reset_host_memory_peak();

}  // namespace primus
