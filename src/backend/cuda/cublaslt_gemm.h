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
// The fp8 GEMM (run_fp8, cublaslt_fp8_gemm.cpp) shares the handle and workspace and caches its plans the same way.
#pragma once

#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>

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

// How an fp8 operand's dequantisation factors are laid out for cuBLASLt (device memory, f32), for an operand stored
// [R, K] with K contiguous:
//  kTensor       one value;
//  kVec128       one per 1x128 tile, R contiguous: element (r, kb) at kb·R + r (the transpose of our row-major grid);
//  kBlock128x128 one per 128x128 block, K blocks contiguous with the row length rounded up to a multiple of 4:
//                element (rb, kb) at rb·round_up(ceil(K/128), 4) + kb.
// (NVIDIA's cuBLAS documentation, "scaling factors layouts"; VEC128_32F and BLK128x128_32F need cuBLAS ≥ 12.9 and
// Hopper.) CudaBackend::fp8_gemm converts our grids into these (cuda::fp8_scale_layout).
enum class Fp8ScaleLayout : uint8_t { kTensor, kVec128, kBlock128x128 };

// C [M, N] row-major = A·Bᵀ (+ C with accumulate), A [M, K] and B [N, K] fp8 codes, row-major, K contiguous. In
// cuBLASLt's column-major terms this is its only fp8 layout, "TN": its A is our B read transposed, its B our A.
struct RowMajorFp8Gemm {
  const void* a = nullptr;  // [M, K] u8
  const void* b = nullptr;  // [N, K] u8
  void* c = nullptr;        // [M, N]
  int64_t m = 0, n = 0, k = 0;
  bool a_e5m2 = false, b_e5m2 = false;  // else e4m3 (OCP)
  Fp8ScaleLayout a_layout = Fp8ScaleLayout::kTensor, b_layout = Fp8ScaleLayout::kTensor;
  const float* a_scale = nullptr;  // device, in a_layout
  const float* b_scale = nullptr;
  DType c_dtype = DType::kF32;  // f32 or bf16
  bool accumulate = false;
  bool fast_accumulation = false;
};

class CublasLtGemm {
 public:
  CublasLtGemm();
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Queues C = alpha·op(A)·op(B) + beta·C on `stream`. m, n, k > 0. beta = 0 never reads C.
  void run(const RowMajorGemm& g, gpuStream_t stream);
  // Queues the fp8 GEMM on `stream` with the scales read on the device (no host sync). m, n, k multiples of 16 and
  // the pointers 16-byte aligned (the caller checks: its errors name the op). Throws naming the shape when
  // cuBLASLt has no algorithm for it.
  void run_fp8(const RowMajorFp8Gemm& g, gpuStream_t stream);

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
  // m, n, k, formats, scale layouts, c dtype, accumulate, fast accumulation, alignment of a, b, c
  using Fp8Key = std::array<int64_t, 13>;
  const Plan& fp8_plan_for(const RowMajorFp8Gemm& g);
  // A plan's descriptors and heuristic result, or throws `what` with cuBLASLt's status when there is no algorithm.
  void choose_algorithm(Plan& plan, int64_t align_a, int64_t align_b, int64_t align_c, const std::string& what);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
  std::map<Fp8Key, Plan> fp8_plans_;
};

}  // namespace primus
