// version_text from the project version and, in a CUDA build, the versions of the headers it was compiled with.
#include "tools/build_info.h"

#include <fmt/format.h>

#if PRIMUS_WITH_CUDA
#include "backend/cuda/device_info.h"
#include "parallel/nccl/nccl_version.h"
#endif

namespace primus {

std::string version_text() {
#if PRIMUS_WITH_CUDA
  const CudaLibraryVersions cuda = cuda_library_versions();
  return fmt::format("primus-cli {} (built with CUDA {}, cuDNN {}, NCCL {})", PRIMUS_VERSION,
                     format_cuda_version(cuda.runtime_build), format_cudnn_version(cuda.cudnn_build),
                     format_nccl_version(nccl_versions().build));
#else
  return fmt::format("primus-cli {} (built without CUDA)", PRIMUS_VERSION);
#endif
}

}  // namespace primus
