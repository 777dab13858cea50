// Size classes, free lists and the out-of-memory retry of the caching allocator (see caching_allocator.h).
#include "backend/cuda/caching_allocator.h"

#include <algorithm>
#include <bit>

#include "backend/cuda/gpu_runtime.h"
#include "core/error.h"

namespace primus {

namespace {

constexpr size_t kMinBlockBytes = 512;  // also the alignment every block starts with (cudaMalloc gives 256+)
constexpr size_t kGiB = size_t{1} << 30;

double gib(size_t bytes) { return static_cast<double>(bytes) / static_cast<double>(kGiB); }

}  // namespace

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes == 0) return 0;
  if (bytes <= kMinBlockBytes) return kMinBlockBytes;
  // bytes lies in (2^e, 2^(e+1)]; round up to a multiple of 2^(e-2): four classes per power of two.
  const size_t top = std::bit_floor(bytes - 1);  // 2^e
  const size_t step = top / 4;
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t block = size_class(bytes);
  if (block == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  auto it = free_blocks_.find(block);
  if (it != free_blocks_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    ++stats_.cache_hits;
  } else {
    gpuError_t status = gpuMalloc(&ptr, block);
    if (status == gpuErrorMemoryAllocation) {
      (void)gpuGetLastError();  // clear the recorded error before retrying
      release_cached_locked();
      status = gpuMalloc(&ptr, block);
    }
    if (status != gpuSuccess) {
      (void)gpuGetLastError();
      const bool out_of_memory = status == gpuErrorMemoryAllocation;
      const std::string message = fmt::format(
          "[cuda] {} on {}: {} bytes ({:.3f} GiB) requested; {:.3f} GiB held by tensors, {:.3f} GiB reserved, peak "
          "{:.3f} GiB: {}",
          out_of_memory ? "out of device memory" : "device allocation failed", device_.str(), bytes, gib(bytes),
          gib(stats_.allocated_bytes), gib(stats_.reserved_bytes), gib(stats_.peak_allocated_bytes),
          gpuGetErrorString(status));
      if (out_of_memory) throw OutOfMemoryError(message, device_.str(), bytes);
      throw RuntimeError(message);
    }
    ++stats_.driver_allocations;
    stats_.reserved_bytes += block;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  }
  stats_.allocated_bytes += block;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  const size_t block = size_class(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  free_blocks_[block].push_back(ptr);
  stats_.allocated_bytes -= block;
}

CudaMemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  // cudaFree waits for the device, so blocks still read by queued kernels are not pulled from under them.
  PRIMUS_CUDA_CHECK(gpuDeviceSynchronize());
  for (auto& [block, ptrs] : free_blocks_) {
    for (void* ptr : ptrs) PRIMUS_CUDA_CHECK(gpuFree(ptr));
    stats_.reserved_bytes -= block * ptrs.size();
    ptrs.clear();
  }
}

}  // namespace primus
