// The throwing half of the check macros in gpu_runtime.h, out of line so the macros stay small.
#include <cublasLt.h>

#include "backend/cuda/gpu_runtime.h"
#include "core/error.h"

namespace primus {

void throw_gpu_error(gpuError_t error, const char* statement, const char* file, int line) {
  const std::string message = fmt::format("[cuda] {} failed at {}:{}: {} ({})", statement, file, line,
                                          gpuGetErrorString(error), gpuGetErrorName(error));
  // Out of memory outside the caching allocator (a library workspace): the size is not known here.
  if (error == gpuErrorMemoryAllocation) throw OutOfMemoryError(message, "cuda", 0);
  throw RuntimeError(message);
}

void throw_cublas_error(int status, const char* statement, const char* file, int line) {
  const auto code = static_cast<cublasStatus_t>(status);
  throw RuntimeError(fmt::format("[cublasLt] {} failed at {}:{}: {} ({})", statement, file, line,
                                 cublasLtGetStatusString(code), cublasLtGetStatusName(code)));
}

}  // namespace primus
