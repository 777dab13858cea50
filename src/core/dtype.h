// Element types and devices. A Tensor carries both explicitly; kernels dispatch on them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace primus {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "bf16", ...

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  bool is_cpu() const { return type == DeviceType::kCpu; }
  std::string str() const;  // "cpu", "cuda:0"
};

inline constexpr Device kCpuDevice{};

}  // namespace primus
