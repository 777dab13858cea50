// Plans and launches of the cuBLASLt fp8 GEMM (cublaslt_gemm.h: RowMajorFp8Gemm, Fp8ScaleLayout). cuBLASLt's fp8
// rules on Hopper: operands "TN" only (its A transposed, its B not: both K-contiguous, which our row-major A [M, K]
// and B [N, K] are once swapped), e4m3 × e4m3, e4m3 × e5m2 or e5m2 × e4m3 (never e5m2 × e5m2), f32 compute and
// scale type, D bf16 or f32 with C of D's type, dimensions multiples of 16 and 16-byte aligned pointers. The
// dequantisation factors are read from device pointers (A/B_SCALE_POINTER), one f32 value for tensorwise scaling or,
// with A/B_SCALE_MODE = VEC128_32F / BLK128x128_32F (cuBLAS ≥ 12.9), a tensor per 1x128 tile or 128x128 block; so no
// amax or scale ever comes back to the host. Block scaling has no fast-accumulation kernels.
#include <cublasLt.h>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cublaslt_helpers.h"
#include "core/error.h"

namespace primus {

namespace {

cublasLtMatmulMatrixScale_t scale_mode(Fp8ScaleLayout layout) {
  switch (layout) {
    case Fp8ScaleLayout::kTensor:
      return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case Fp8ScaleLayout::kVec128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8ScaleLayout::kBlock128x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

const char* layout_name(Fp8ScaleLayout layout) {
  switch (layout) {
    case Fp8ScaleLayout::kTensor:
      return "tensorwise";
    case Fp8ScaleLayout::kVec128:
      return "1x128";
    case Fp8ScaleLayout::kBlock128x128:
      return "128x128";
  }
  return "?";
}

}  // namespace

const CublasLtGemm::Plan& CublasLtGemm::fp8_plan_for(const RowMajorFp8Gemm& g) {
  const Fp8Key key{g.m,
                   g.n,
                   g.k,
                   g.a_e5m2,
                   g.b_e5m2,
                   static_cast<int64_t>(g.a_layout),
                   static_cast<int64_t>(g.b_layout),
                   static_cast<int64_t>(g.c_dtype),
                   g.accumulate,
                   g.fast_accumulation,
                   cublaslt::alignment_of(g.a),
                   cublaslt::alignment_of(g.b),
                   cublaslt::alignment_of(g.c)};
  auto it = fp8_plans_.find(key);
  if (it != fp8_plans_.end()) return it->second;

  const cudaDataType_t a_type = g.a_e5m2 ? GPU_R_8F_E5M2 : GPU_R_8F_E4M3;
  const cudaDataType_t b_type = g.b_e5m2 ? GPU_R_8F_E5M2 : GPU_R_8F_E4M3;
  const cudaDataType_t c_type = g.c_dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  Plan plan;
  PRIMUS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is our B [N, K] read transposed, its B our A [M, K]: D (column-major [N, M]) is our C [M, N].
  cublaslt::set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  cublaslt::set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  cublaslt::set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, static_cast<int32_t>(scale_mode(g.b_layout)));
  cublaslt::set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, static_cast<int32_t>(scale_mode(g.a_layout)));
  cublaslt::set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(g.fast_accumulation ? 1 : 0));
  // The heuristic needs the scale pointers set to pick a scaled kernel; run_fp8 sets each call's own.
  cublaslt::set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.b_scale));
  cublaslt::set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.a_scale));
  plan.a = cublaslt::row_major_layout(b_type, g.n, g.k, g.k);
  plan.b = cublaslt::row_major_layout(a_type, g.m, g.k, g.k);
  plan.c = cublaslt::row_major_layout(c_type, g.m, g.n, g.n);
  choose_algorithm(plan, key[11], key[10], key[12],
                   fmt::format("[op fp8_gemm] cuBLASLt has no algorithm for M={} N={} K={} a {} {} b {} {} -> {}{}{}",
                               g.m, g.n, g.k, g.a_e5m2 ? "e5m2" : "e4m3", layout_name(g.a_layout),
                               g.b_e5m2 ? "e5m2" : "e4m3", layout_name(g.b_layout), dtype_name(g.c_dtype),
                               g.accumulate ? " accumulate" : "", g.fast_accumulation ? " fast accumulation" : ""));
  return fp8_plans_.emplace(key, plan).first->second;
}

void CublasLtGemm::run_fp8(const RowMajorFp8Gemm& g, gpuStream_t stream) {
  const Plan& plan = fp8_plan_for(g);
  // The scale pointers are per call (the plan is per shape); setting them is host-side bookkeeping that
  // cublasLtMatmul reads when it queues the kernel.
  cublaslt::set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.b_scale));
  cublaslt::set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.a_scale));
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  PRIMUS_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, g.b, plan.a, g.a, plan.b, &beta, g.c, plan.c, g.c,
                                     plan.c, &plan.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace primus
