// The CPU backend singleton. The kernels live in one file per op family beside this one.
#include "backend/cpu/cpu_backend.h"

namespace primus {

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace primus
