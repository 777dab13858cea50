// The stream-ordered caching allocator for device memory, registered for DeviceType::kCuda.
//
// Requests are rounded up to a size class (512 B minimum, then four classes per power of two, so at most
// 25% is wasted) and a freed block goes onto its class's free list instead of back to the driver. A later
// request of the same class reuses it at once. That is safe without events because every kernel and copy of
// the CUDA backend runs on one stream: work that uses the new owner is queued after all work of the old
// one. (A second stream will need an event recorded on free.) When the driver runs out of memory, the cache
// is returned to it and the request retried once; a second failure throws OutOfMemoryError (core/error.h)
// with the request size. Freed memory never goes back to the driver otherwise, so steady-state training
// steps make no cudaMalloc calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"

namespace primus {

struct CudaMemoryStats {
  size_t allocated_bytes = 0;       // held by live tensors and scratch buffers (size-class bytes)
  size_t peak_allocated_bytes = 0;  // maximum of allocated_bytes since start or reset_peak()
  size_t reserved_bytes = 0;        // obtained from the driver: allocated plus cached
  size_t peak_reserved_bytes = 0;
  int64_t driver_allocations = 0;  // cudaMalloc calls that succeeded
  int64_t cache_hits = 0;          // requests served from a free list
};

class CachingAllocator : public Allocator {
 public:
  explicit CachingAllocator(Device device) : device_(device) {}
  // Never destroyed (see cuda_backend.cpp): tensors with static lifetime may free after main returns.
  ~CachingAllocator() override = default;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return device_; }

  CudaMemoryStats stats() const;
  void reset_peak();
  // Returns every cached (free) block to the driver. Synchronises the device.
  void release_cached();

  // The bytes actually reserved for a request of `bytes` (0 stays 0).
  static size_t size_class(size_t bytes);

 private:
  void release_cached_locked();

  Device device_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;  // size class -> blocks ready for reuse
  CudaMemoryStats stats_;
};

// Scratch device memory for one op, returned to the allocator at scope exit. Reuse by the next op is
// ordered after this op's kernels by the single stream (see above).
class DeviceBuffer {
 public:
  DeviceBuffer(Allocator& allocator, size_t bytes)
      : allocator_(&allocator), bytes_(bytes), ptr_(allocator.allocate(bytes)) {}
  ~DeviceBuffer() { allocator_->deallocate(ptr_, bytes_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  Allocator* allocator_;
  size_t bytes_;
  void* ptr_;
};

}  // namespace primus
