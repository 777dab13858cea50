// GEMM through cuBLASLt for row-major operands. cuBLASLt is column-major, and a row-major [R, C] matrix read
// column-major is its transpose [C, R]; so C = op(A)·op(B) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ by handing
// cuBLASLt the operands swapped (B first), with the same transpose flags and leading dimensions equal to the
// stored row lengths. No data is moved.
//
// Operands: A and B share a dtype (f32 or bf16); C is that dtype or f32 (bf16 A·B into an fp32 C: weight
// gradients, fp32 logits). Every combination uses CUBLAS_COMPUTE_32F with fp32 alpha/beta: true fp32 products
// and sums for fp32 (no TF32), fp32 accumulation of bf16 products, C rounded once. One workspace is allocated
// at start. A plan (descriptors plus the heuristic's first algorithm) is cached per shape, dtypes, transpose
// flags, leading dimensions and operand alignment, so repeated calls make no heuristic query and run the same
// algorithm: cuBLASLt's algorithms reduce in a fixed order (no atomics), so results are bitwise reproducible.
#pragma once

#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <map>

#include "backend/cuda/gpu_runtime.h"
#include "core/dtype.h"

namespace primus {

struct RowMajorGemm {
  const void* a = nullptr;  // [M, K] or [K, M] if trans_a, row length lda
  const void* b = nullptr;  // [K, N] or [N, K] if trans_b, row length ldb
  void* c = nullptr;        // [M, N], row length N
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  DType ab_dtype = DType::kF32;  // A and B
  DType c_dtype = DType::kF32;
};

class CublasLtGemm {
 public:
  CublasLtGemm();
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Queues C = alpha·op(A)·op(B) + beta·C on `stream`. m, n, k > 0. beta = 0 never reads C.
  void run(const RowMajorGemm& g, gpuStream_t stream);

 private:
  // m, n, k, lda, ldb, trans_a, trans_b, alignment of a, b, c (bytes, ≤ 256), dtype of a and b, dtype of c
  using Key = std::array<int64_t, 12>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr;  // cuBLASLt's A: our B
    cublasLtMatrixLayout_t b = nullptr;  // cuBLASLt's B: our A
    cublasLtMatrixLayout_t c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan_for(const RowMajorGemm& g);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
};

}  // namespace primus
