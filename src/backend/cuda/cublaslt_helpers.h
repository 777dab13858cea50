// Small helpers of the cuBLASLt GEMMs (cublaslt_gemm.cpp, cublaslt_fp8_gemm.cpp): attribute setters that check
// the status, the largest power-of-two alignment of a pointer (a plan's key: cuBLASLt picks kernels by it) and the
// column-major description of a row-major matrix. Internal to src/backend/cuda.
#pragma once

#include <cublasLt.h>

#include <cstdint>

#include "backend/cuda/gpu_runtime.h"

namespace primus::cublaslt {

inline int64_t alignment_of(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  int64_t alignment = 256;
  while (alignment > 1 && address % static_cast<uintptr_t>(alignment) != 0) alignment /= 2;
  return alignment;
}

template <typename T>
inline void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  PRIMUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

template <typename T>
inline void set_preference(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute,
                           const T& value) {
  PRIMUS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)));
}

// A row-major [rows, cols] matrix with row length ld, described column-major: [cols, rows] with ld.
inline cublasLtMatrixLayout_t row_major_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  PRIMUS_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), ld));
  return layout;
}

}  // namespace primus::cublaslt
