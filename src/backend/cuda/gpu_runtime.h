// The thin portability layer over the GPU runtime. Code in src/backend/cuda names the runtime only through
// these aliases (gpuStream_t, gpuMemcpyAsync, ...), so a HIP build for AMD Instinct can map them to hip*
// by swapping this header. Also the check macros: every runtime and cuBLASLt call goes through one, and a
// failure throws RuntimeError naming the statement, file, line and the runtime's error string.
#pragma once

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdint>

namespace primus {

using gpuError_t = cudaError_t;
using gpuStream_t = cudaStream_t;
using gpuEvent_t = cudaEvent_t;
using gpuDeviceProp_t = cudaDeviceProp;

inline constexpr gpuError_t gpuSuccess = cudaSuccess;

}  // namespace primus

#define gpuGetErrorString cudaGetErrorString
#define gpuGetErrorName cudaGetErrorName
#define gpuGetLastError cudaGetLastError
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuSetDevice cudaSetDevice
#define gpuMalloc cudaMalloc
#define gpuMemGetInfo cudaMemGetInfo
#define gpuFree cudaFree
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuHostRegister cudaHostRegister
#define gpuHostRegisterDefault cudaHostRegisterDefault
#define gpuHostUnregister cudaHostUnregister
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamCreateWithPriority cudaStreamCreateWithPriority
#define gpuDeviceGetStreamPriorityRange cudaDeviceGetStreamPriorityRange
#define gpuStreamWaitEvent cudaStreamWaitEvent
#define gpuStreamQuery cudaStreamQuery
#define gpuLaunchHostFunc cudaLaunchHostFunc
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuEventCreate cudaEventCreate
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventQuery cudaEventQuery
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuEventDestroy cudaEventDestroy
#define gpuFuncSetAttribute cudaFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define gpuErrorMemoryAllocation cudaErrorMemoryAllocation
#define gpuErrorNotReady cudaErrorNotReady
// The fp8 element types of the vendor BLAS. NVIDIA (Hopper, Blackwell) has the OCP pair e4m3 / e5m2; a HIP build
// for MI300X maps these to its fnuz pair (hipblaslt's HIP_R_8F_E4M3_FNUZ / _E5M2_FNUZ) and sets kGpuFp8IsFnuz, so
// the backend asks for the formats the recipe quantised to (docs/fp8.md, AMD configurations).
#define GPU_R_8F_E4M3 CUDA_R_8F_E4M3
#define GPU_R_8F_E5M2 CUDA_R_8F_E5M2
namespace primus {
inline constexpr bool kGpuFp8IsFnuz = false;
}  // namespace primus
// Named ranges for the vendor's timeline profiler (NVTX for Nsight Systems; roctx on AMD).
#define gpuRangePush nvtxRangePushA
#define gpuRangePop nvtxRangePop

namespace primus {

[[noreturn]] void throw_gpu_error(gpuError_t error, const char* statement, const char* file, int line);
// status is a cublasStatus_t; taken as int so this header need not include cuBLASLt.
[[noreturn]] void throw_cublas_error(int status, const char* statement, const char* file, int line);

}  // namespace primus

// Runs a runtime call; on failure throws RuntimeError("[cuda] <statement> failed at file:line: <error>").
#define PRIMUS_CUDA_CHECK(stmt)                                                  \
  do {                                                                           \
    const ::primus::gpuError_t primus_cuda_status_ = (stmt);                     \
    if (primus_cuda_status_ != ::primus::gpuSuccess) {                           \
      ::primus::throw_gpu_error(primus_cuda_status_, #stmt, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

// After a kernel launch: reports launch-configuration errors (asynchronous faults surface at the next sync).
#define PRIMUS_CUDA_CHECK_LAUNCH() PRIMUS_CUDA_CHECK(gpuGetLastError())

// Runs a cuBLASLt call; on failure throws RuntimeError naming the statement, place and cuBLAS status.
#define PRIMUS_CUBLAS_CHECK(stmt)                                                     \
  do {                                                                                \
    const int primus_cublas_status_ = static_cast<int>(stmt);                         \
    if (primus_cublas_status_ != 0) {                                                 \
      ::primus::throw_cublas_error(primus_cublas_status_, #stmt, __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)
