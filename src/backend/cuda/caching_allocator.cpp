// Size classes, free lists, the pending list of blocks used on other streams and the out-of-memory retry of
// the caching allocator (see caching_allocator.h for the invariant).
#include "backend/cuda/caching_allocator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>

#include "backend/cuda/gpu_runtime.h"
#include "core/error.h"

namespace primus {

namespace {

constexpr size_t kMinBlockBytes = 512;  // also the alignment every block starts with (cudaMalloc gives 256+)
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;

double gib(size_t bytes) { return static_cast<double>(bytes) / static_cast<double>(kGiB); }

}  // namespace

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes == 0) return 0;
  if (bytes <= kMinBlockBytes) return kMinBlockBytes;
  // bytes lies in (2^e, 2^(e+1)]; round up to a multiple of 2^(e-2): four classes per power of two, or of 2^(e-6)
  // above 1 GiB. Such large blocks are mostly the training state's flat buffers (fp32 master weights, gradients,
  // AdamW moments, the bf16 copy), allocated once at sizes the model dictates, where a quarter of a power of two
  // wasted up to 25% (1.8 GiB on the llama3.2 1B config, 6.3 GiB on the Mixtral layer shape); 64 classes waste at
  // most 1.6% and still let a block serve requests whose size varies a little from step to step.
  // Above 2 GiB the step stops growing at 32 MiB: blocks that large are allocated once, not reused at varying sizes,
  // and a 64th of 16 GiB (the moments of a 6 B-parameter model) would waste a quarter of a GiB each.
  const size_t top = std::bit_floor(bytes - 1);  // 2^e
  const size_t step = top > kGiB / 2 ? std::min<size_t>(top / 64, 32 * kMiB) : top / 4;
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t block = size_class(bytes);
  if (block == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  auto it = free_blocks_.find(block);
  // Blocks freed while in use on another stream become reusable only when their events are reached; asking
  // costs a query per event, so only a request that would otherwise go to the driver asks.
  if ((it == free_blocks_.end() || it->second.empty()) && !pending_.empty()) {
    collect_pending_locked();
    it = free_blocks_.find(block);
  }
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
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) {
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    if (peak_observer_ != nullptr) peak_observer_(stats_.allocated_bytes, block);
  }
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  const size_t block = size_class(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.allocated_bytes -= block;
  if (!stream_uses_.empty()) {
    // Declared uses lie inside their live block, and live blocks do not overlap: the entries starting in
    // [ptr, ptr + block) are exactly this block's.
    const auto begin = reinterpret_cast<uintptr_t>(ptr);
    auto first = stream_uses_.lower_bound(begin);
    auto last = first;
    std::vector<void*> streams;
    for (; last != stream_uses_.end() && last->first < begin + block; ++last) {
      for (void* s : last->second) {
        if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
      }
    }
    if (first != last) {
      stream_uses_.erase(first, last);
      free_after_streams_locked(ptr, block, streams);
      return;
    }
  }
  free_blocks_[block].push_back(ptr);
}

void CachingAllocator::record_stream(const void* ptr, size_t bytes, void* stream) {
  if (ptr == nullptr || bytes == 0 || stream == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Only the start matters: a view lies inside its block, and the free looks up starts inside the block.
  std::vector<void*>& streams = stream_uses_[reinterpret_cast<uintptr_t>(ptr)];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
}

void* CachingAllocator::take_event_locked() {
  if (!event_pool_.empty()) {
    void* event = event_pool_.back();
    event_pool_.pop_back();
    return event;
  }
  gpuEvent_t event = nullptr;
  PRIMUS_CUDA_CHECK(gpuEventCreateWithFlags(&event, gpuEventDisableTiming));
  return event;
}

void CachingAllocator::free_after_streams_locked(void* ptr, size_t block, const std::vector<void*>& streams) {
  PendingBlock pending{ptr, block, {}};
  try {
    for (void* stream : streams) {
      void* event = take_event_locked();
      pending.events.push_back(event);
      PRIMUS_CUDA_CHECK(gpuEventRecord(static_cast<gpuEvent_t>(event), static_cast<gpuStream_t>(stream)));
    }
  } catch (const std::exception& e) {
    // A free runs in a destructor and cannot throw; without its events the block could be handed out while
    // the other stream still uses it, so it is dropped instead (the sticky runtime error surfaces at the
    // next checked call anyway).
    // Its events are dropped too: one may be recorded, and a later record of a pooled event would move it.
    spdlog::error("[cuda] a freed block of {} bytes stays out of the cache (still reserved): {}", block, e.what());
    return;
  }
  ++stats_.stream_waits;
  stats_.pending_bytes += block;
  pending_.push_back(std::move(pending));
}

void CachingAllocator::collect_pending_locked() {
  auto reached = [](void* event) {
    const gpuError_t status = gpuEventQuery(static_cast<gpuEvent_t>(event));
    if (status == gpuSuccess) return true;
    // Not-ready is no failure, but clear it anyway so no later launch check can read it as its own error.
    (void)gpuGetLastError();
    if (status == gpuErrorNotReady) return false;
    throw_gpu_error(status, "gpuEventQuery(event of a block freed after use on another stream)", __FILE__, __LINE__);
  };
  // Still pending first, reached from `ready` on.
  auto ready = std::partition(pending_.begin(), pending_.end(), [&](const PendingBlock& p) {
    return !std::all_of(p.events.begin(), p.events.end(), reached);
  });
  for (auto it = ready; it != pending_.end(); ++it) {
    free_blocks_[it->block].push_back(it->ptr);
    stats_.pending_bytes -= it->block;
    event_pool_.insert(event_pool_.end(), it->events.begin(), it->events.end());
  }
  pending_.erase(ready, pending_.end());
}

CudaMemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::set_peak_observer(PeakObserver observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_observer_ = observer;
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
  // With the device idle every pending block's events are reached.
  collect_pending_locked();
  for (auto& [block, ptrs] : free_blocks_) {
    for (void* ptr : ptrs) PRIMUS_CUDA_CHECK(gpuFree(ptr));
    stats_.reserved_bytes -= block * ptrs.size();
    ptrs.clear();
  }
}

}  // namespace primus
