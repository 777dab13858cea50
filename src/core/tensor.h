// Tensor: a typed, shaped, contiguous view into reference-counted storage.
// Views (parameter slices of a flat buffer, reshapes) share storage; nothing here copies implicitly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace primus {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3, 4]"

// Owns one allocation from an Allocator. Its memory can be given back and taken again while the Storage (and so
// every view of it) lives on: fully sharded data parallelism frees a unit's gathered weights and gradients between
// uses while the model's modules keep their views. A view of a released storage fails when its data is asked for.
class Storage {
 public:
  // allocate false: created released.
  Storage(size_t bytes, Device device, bool allocate = true);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const;
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool resident() const { return !released_; }
  // Frees the memory (no-op when released); the contents are lost.
  void release();
  // Allocates the memory again (no-op when resident); the contents are undefined.
  void materialize();

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  bool released_ = false;
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised memory; on CPU debug builds it is poisoned with NaN-like bytes.
  static Tensor empty(const Shape& shape, DType dtype, Device device = kCpuDevice);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = kCpuDevice);
  // A tensor whose storage is released from the start (materialize_storage allocates it).
  static Tensor unallocated(const Shape& shape, DType dtype, Device device = kCpuDevice);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : kCpuDevice; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  std::string describe() const;  // "[2, 3] f32 cpu"

  void* data() const;
  // Typed access; checks the dtype (and, for host pointers, that the tensor lives on the CPU).
  float* f32() const;
  int32_t* i32() const;

  // A contiguous sub-range of elements [offset, offset + numel(shape)) with a new shape.
  Tensor slice_elements(int64_t offset, const Shape& shape) const;
  // Same elements, new shape (numel must match).
  Tensor reshape(const Shape& shape) const;
  // Fill every element (f32 only) — used to poison outputs in tests and to reset buffers.
  void fill(float value) const;
  void zero() const;
  // Copy another tensor's bytes into this one (same dtype and numel; CPU only for now).
  void copy_from(const Tensor& other) const;

  // The memory of the whole storage this tensor views (Storage::release/materialize): for owners of buffers
  // whose views are held elsewhere (FSDP's gathered units).
  bool resident() const { return storage_ != nullptr && storage_->resident(); }
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
  void release_storage() const;
  void materialize_storage() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

}  // namespace primus
