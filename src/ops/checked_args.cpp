#include "ops/checked_args.h"

#include "core/error.h"
#include "ops/ops.h"

namespace primus::ops {

Backend& checked_backend(const char* op, std::initializer_list<CheckedArg> args) {
  const CheckedArg& first = *args.begin();
  for (const CheckedArg& arg : args) {
    PRIMUS_CHECK(arg.tensor->defined(), "[op {}] {} is undefined", op, arg.name);
    PRIMUS_CHECK(arg.tensor->dtype() == arg.dtype && arg.tensor->shape() == arg.shape,
                 "[op {}] {} is {} but must be {} {}", op, arg.name, arg.tensor->describe(), dtype_name(arg.dtype),
                 shape_str(arg.shape));
    PRIMUS_CHECK(arg.tensor->device() == first.tensor->device(), "[op {}] {} is {} but {} is {}", op, arg.name,
                 arg.tensor->describe(), first.name, first.tensor->describe());
  }
  start_device(first.tensor->device());
  return backend_for(first.tensor->device());
}

}  // namespace primus::ops
