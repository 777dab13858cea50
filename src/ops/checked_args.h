// The checks every op entry point of the MoE and fp8 families starts with: each tensor defined, of its dtype and
// shape, all on one device; errors name the op and the tensor. Internal to src/ops.
#pragma once

#include <initializer_list>

#include "backend/backend.h"
#include "core/tensor.h"

namespace primus::ops {

struct CheckedArg {
  const char* name;
  const Tensor* tensor;
  DType dtype;
  Shape shape;
};

// Checks `args` for op `op` and returns the started backend of their device (the first one's).
Backend& checked_backend(const char* op, std::initializer_list<CheckedArg> args);

}  // namespace primus::ops
