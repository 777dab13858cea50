// What the CUDA runtime says about the GPUs and the libraries of this process, for `primus-cli preflight` and
// `primus-cli --version`: device properties, free memory, the driver's, runtime's and cuDNN's versions (those the
// build was compiled against and those loaded now). Plain C++ (no CUDA headers); every query that can fail
// returns its reason instead of throwing, so a machine without a driver is described, not crashed on.
#pragma once

#include <cstdint>
#include <string>

namespace primus {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;        // "NVIDIA H200"
  std::string pci_bus_id;  // "0000:3b:00.0" (lower case), the key of /proc/driver/nvidia/gpus/
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;  // cudaMemGetInfo on that device (this process's own allocations count as used)
};

// Versions as CUDA encodes them: 13000 = 13.0 (runtime, driver); cuDNN 91900 = 9.19.0. 0: unknown.
struct CudaLibraryVersions {
  int runtime_build = 0;  // CUDART_VERSION of the headers the build used
  int runtime = 0;        // cudaRuntimeGetVersion
  int driver = 0;         // cudaDriverGetVersion: the newest CUDA the installed driver supports; 0 without a driver
  int cudnn_build = 0;    // CUDNN_VERSION of the headers
  int cudnn = 0;          // cudnnGetVersion of the library loaded
};

CudaLibraryVersions cuda_library_versions();
// Properties and free memory of device `index`; false with *why set when the runtime fails (no throw).
bool cuda_device_info(int index, CudaDeviceInfo* info, std::string* why);
// "13.0" from 13000; "9.19.0" from cuDNN's 91900.
std::string format_cuda_version(int version);
std::string format_cudnn_version(int version);

}  // namespace primus
