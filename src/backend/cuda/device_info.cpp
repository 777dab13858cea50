// device_info.h through the runtime (gpu_runtime.h) and cuDNN's version query.
#include "backend/cuda/device_info.h"

#include <cudnn_graph.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "backend/cuda/gpu_runtime.h"

namespace primus {

CudaLibraryVersions cuda_library_versions() {
  CudaLibraryVersions v;
  v.runtime_build = CUDART_VERSION;
  v.cudnn_build = CUDNN_VERSION;
  if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) v.runtime = 0;
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
  (void)gpuGetLastError();
  v.cudnn = static_cast<int>(cudnnGetVersion());
  return v;
}

bool cuda_device_info(int index, CudaDeviceInfo* info, std::string* why) {
  auto failed = [&](gpuError_t status, const char* what) {
    (void)gpuGetLastError();
    if (why != nullptr) *why = fmt::format("{} on device {} failed: {}", what, index, gpuGetErrorString(status));
    return false;
  };
  gpuDeviceProp_t props{};
  if (gpuError_t s = gpuGetDeviceProperties(&props, index); s != gpuSuccess) {
    return failed(s, "cudaGetDeviceProperties");
  }
  char bus_id[32] = {};
  if (gpuError_t s = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), index); s != gpuSuccess) {
    return failed(s, "cudaDeviceGetPCIBusId");
  }
  int previous = 0;
  if (gpuError_t s = cudaGetDevice(&previous); s != gpuSuccess) return failed(s, "cudaGetDevice");
  if (gpuError_t s = gpuSetDevice(index); s != gpuSuccess) return failed(s, "cudaSetDevice");
  size_t free_bytes = 0, total_bytes = 0;
  const gpuError_t mem = gpuMemGetInfo(&free_bytes, &total_bytes);
  (void)gpuSetDevice(previous);
  if (mem != gpuSuccess) return failed(mem, "cudaMemGetInfo");
  info->index = index;
  info->name = props.name;
  info->pci_bus_id = bus_id;
  std::transform(info->pci_bus_id.begin(), info->pci_bus_id.end(), info->pci_bus_id.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  info->compute_major = props.major;
  info->compute_minor = props.minor;
  info->multiprocessors = props.multiProcessorCount;
  info->total_bytes = static_cast<int64_t>(total_bytes);
  info->free_bytes = static_cast<int64_t>(free_bytes);
  return true;
}

std::string format_cuda_version(int version) {
  if (version <= 0) return "unknown";
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

std::string format_cudnn_version(int version) {
  if (version <= 0) return "unknown";
  return fmt::format("{}.{}.{}", version / 10000, version % 10000 / 100, version % 100);
}

}  // namespace primus
