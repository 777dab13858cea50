// The stream-ordered caching allocator for device memory, registered for DeviceType::kCuda.
//
// Requests are rounded up to a size class (512 B minimum, then four classes per power of two, so at most
// 25% is wasted; above 1 GiB sixty-four, at most 1.6%, in steps of at most 32 MiB) and a freed block goes onto its
// class's free list instead of back to the driver. A later
// request of the same class reuses it at once. When the driver runs out of memory, the cache is returned to
// it and the request retried once; a second failure throws OutOfMemoryError (core/error.h) with the request
// size. Freed memory never goes back to the driver otherwise, so steady-state training steps make no
// cudaMalloc calls.
//
// The invariant: a block is handed out again only when every use by its old owner is ordered before the new
// owner's work or has finished.
//  - Work on the compute stream (every kernel, copy and GEMM of the CUDA backend) is ordered by the stream
//    itself: the new owner's work is queued after the old owner's. This is the fast path, and a block that
//    only the compute stream touched takes it: free list in, free list out, no event; its only extra cost
//    is an emptiness check of the declared uses on free and of the pending list on a free-list miss.
//  - Work on any other stream (collectives on the communication stream) must be declared with
//    record_stream(ptr, bytes, stream) before the tensor is freed, as PyTorch's record_stream. When such a
//    block is freed, an event is recorded on each stream it was declared on, and the block waits on a pending
//    list, not its free list. A request that misses its free list asks those events (a query, the host never
//    blocks) and moves every block whose events are all reached onto its free list; a block still in use is
//    never handed out, and the request takes fresh memory instead.
// Undeclared use on another stream is a bug of the caller: the block may be reused under it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
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
  size_t pending_bytes = 0;        // freed blocks waiting for work on another stream (record_stream)
  int64_t stream_waits = 0;        // frees that recorded events because the block was used on another stream
};

class CachingAllocator : public Allocator {
 public:
  explicit CachingAllocator(Device device) : device_(device) {}
  // Never destroyed (see cuda_backend.cpp): tensors with static lifetime may free after main returns.
  ~CachingAllocator() override = default;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return device_; }

  // Declares that [ptr, ptr + bytes), inside one live block (a tensor or a view of one), is used by work
  // queued on `stream` (a gpuStream_t, not the compute stream): the block's free then waits for that work
  // (see above). Declaring the same range and stream again costs a map lookup and adds nothing.
  void record_stream(const void* ptr, size_t bytes, void* stream);

  CudaMemoryStats stats() const;
  void reset_peak();
  // Called (under the allocator's lock: it must not allocate device memory) each time allocated_bytes reaches a
  // new peak, with the new total and the size class of the request that reached it; nullptr (the default) stops
  // the calls. For diagnostics (PRIMUS_MEMORY_TRACE): where a run's peak is reached.
  using PeakObserver = void (*)(size_t allocated_bytes, size_t request_bytes);
  void set_peak_observer(PeakObserver observer);
  // Returns every cached block (free, or pending once the device is idle) to the driver. Synchronises the device.
  void release_cached();

  // The bytes actually reserved for a request of `bytes` (0 stays 0).
  static size_t size_class(size_t bytes);

 private:
  // A freed block whose last uses on other streams may still run: one event per such stream.
  struct PendingBlock {
    void* ptr = nullptr;
    size_t block = 0;           // size class
    std::vector<void*> events;  // gpuEvent_t, recorded at the free
  };

  void release_cached_locked();
  // Moves every pending block whose events have all been reached onto its free list; never blocks.
  void collect_pending_locked();
  // Frees `ptr` onto the pending list with events on `streams`; on a runtime error the block is kept out of
  // circulation (leaked) rather than risking a reuse while in use, since a free cannot throw.
  void free_after_streams_locked(void* ptr, size_t block, const std::vector<void*>& streams);
  void* take_event_locked();

  Device device_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;  // size class -> blocks ready for reuse
  // Streams that declared use of a range of a live block (record_stream), by the range's start address; a
  // block's entries go when it is freed. An ordered map: a free finds its entries as one run of keys.
  std::map<uintptr_t, std::vector<void*>> stream_uses_;  // range start -> gpuStream_t
  std::vector<PendingBlock> pending_;
  std::vector<void*> event_pool_;  // gpuEvent_t without timing, reached, reusable
  CudaMemoryStats stats_;
  PeakObserver peak_observer_ = nullptr;
};

// Scratch device memory for one op, returned to the allocator at scope exit. Reuse by the next op is
// ordered after this op's kernels by the compute stream (see above); scratch is never used on another stream.
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
