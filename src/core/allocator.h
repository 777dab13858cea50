// Allocator interface. Each device type has one registered allocator; the CPU one is built in,
// a device backend (CUDA, later HIP) registers its caching allocator when it starts.
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace primus {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
};

// Returns the allocator for a device; throws if none is registered (e.g. CUDA not built).
Allocator& allocator_for(Device device);
void register_allocator(DeviceType type, Allocator* allocator);

}  // namespace primus
