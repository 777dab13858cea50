#include "core/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "core/host_memory.h"

namespace primus {

namespace {

std::atomic<int64_t> g_host_live{0};
std::atomic<int64_t> g_host_peak{0};

class CpuAllocator : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    // 64-byte alignment for SIMD; aligned_alloc needs a size that is a multiple of the alignment.
    size_t rounded = (bytes + 63) / 64 * 64;
    void* ptr = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (ptr == nullptr) throw RuntimeError(fmt::format("out of host memory allocating {} bytes", bytes));
    const int64_t live = g_host_live.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    int64_t peak = g_host_peak.load();
    while (live > peak && !g_host_peak.compare_exchange_weak(peak, live)) {
    }
    return ptr;
  }
  void deallocate(void* ptr, size_t bytes) override {
    g_host_live.fetch_sub(static_cast<int64_t>(bytes));
    std::free(ptr);
  }
  Device device() const override { return kCpuDevice; }
};

CpuAllocator g_cpu_allocator;
Allocator* g_allocators[2] = {&g_cpu_allocator, nullptr};

}  // namespace

HostMemoryStats host_memory_stats() { return {g_host_live.load(), g_host_peak.load()}; }

void reset_host_memory_peak() { g_host_peak.store(g_host_live.load()); }

Allocator& allocator_for(Device device) {
  Allocator* allocator = g_allocators[static_cast<int>(device.type)];
  if (allocator == nullptr) throw RuntimeError(fmt::format("no allocator for device {} (backend not built or not started)", device.str()));
  return *allocator;
}

void register_allocator(DeviceType type, Allocator* allocator) { g_allocators[static_cast<int>(type)] = allocator; }

int64_t shape_numel(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Storage::Storage(size_t bytes, Device device, bool allocate)
    : bytes_(bytes), device_(device), allocator_(&allocator_for(device)), released_(!allocate) {
  if (allocate) data_ = allocator_->allocate(bytes);
}

Storage::~Storage() { release(); }

void* Storage::data() const {
  PRIMUS_CHECK(!released_, "access to a released storage of {} bytes on {} (a sharded unit used before it "
               "was gathered)", bytes_, device_.str());
  return data_;
}

void Storage::release() {
  if (released_) return;
  allocator_->deallocate(data_, bytes_);
  data_ = nullptr;
  released_ = true;
}

void Storage::materialize() {
  if (!released_) return;
  data_ = allocator_->allocate(bytes_);
  released_ = false;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) PRIMUS_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
#ifndef NDEBUG
  if (device.is_cpu()) std::memset(t.storage_->data(), 0xFF, t.nbytes());  // NaN for floats: catches reads of unset memory
#endif
  return t;
}

Tensor Tensor::unallocated(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) PRIMUS_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device, /*allocate=*/false);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  int k = i < 0 ? i + n : i;
  PRIMUS_CHECK(k >= 0 && k < n, "dim {} out of range for tensor {}", i, describe());
  return shape_[k];
}

std::string Tensor::describe() const {
  return fmt::format("{} {} {}", shape_str(shape_), dtype_name(dtype_), device().str());
}

void Tensor::release_storage() const {
  PRIMUS_CHECK(defined(), "release of an undefined tensor");
  storage_->release();
}

void Tensor::materialize_storage() const {
  PRIMUS_CHECK(defined(), "materialize of an undefined tensor");
  storage_->materialize();
}

void* Tensor::data() const {
  PRIMUS_CHECK(defined(), "access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

float* Tensor::f32() const {
  PRIMUS_CHECK(dtype_ == DType::kF32, "expected f32 tensor, got {}", describe());
  return static_cast<float*>(data());
}

int32_t* Tensor::i32() const {
  PRIMUS_CHECK(dtype_ == DType::kI32, "expected i32 tensor, got {}", describe());
  return static_cast<int32_t*>(data());
}

Tensor Tensor::slice_elements(int64_t offset, const Shape& shape) const {
  PRIMUS_CHECK(offset >= 0 && offset + shape_numel(shape) <= numel(), "slice [{}, +{}) outside tensor {}", offset,
               shape_numel(shape), describe());
  Tensor t = *this;
  t.offset_bytes_ += static_cast<size_t>(offset) * dtype_size(dtype_);
  t.shape_ = shape;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  PRIMUS_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", describe(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

void Tensor::fill(float value) const {
  PRIMUS_CHECK(device().is_cpu(), "fill on {} needs the backend", describe());
  float* p = f32();
  std::fill(p, p + numel(), value);
}

void Tensor::zero() const {
  PRIMUS_CHECK(device().is_cpu(), "zero on {} needs the backend", describe());
  std::memset(data(), 0, nbytes());
}

void Tensor::copy_from(const Tensor& other) const {
  PRIMUS_CHECK(dtype_ == other.dtype_ && numel() == other.numel(), "copy {} <- {}", describe(), other.describe());
  PRIMUS_CHECK(device().is_cpu() && other.device().is_cpu(), "copy between devices needs the backend");
  std::memcpy(data(), other.data(), nbytes());
}

}  // namespace primus
