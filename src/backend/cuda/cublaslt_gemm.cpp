// Plans and launches of the cuBLASLt GEMM (see cublaslt_gemm.h for the row-major mapping).
#include "backend/cuda/cublaslt_gemm.h"

#include <algorithm>

#include "backend/cuda/cublaslt_helpers.h"
#include "core/error.h"

namespace primus {

using cublaslt::alignment_of;
using cublaslt::row_major_layout;
using cublaslt::set_attribute;
using cublaslt::set_preference;

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS recommends for Hopper

cudaDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      throw RuntimeError(fmt::format("[op gemm] dtype {} is not supported on cuda yet", dtype_name(dtype)));
  }
}

}  // namespace

CublasLtGemm::CublasLtGemm() {
  PRIMUS_CUBLAS_CHECK(cublasLtCreate(&handle_));
  PRIMUS_CUDA_CHECK(gpuMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
}

CublasLtGemm::~CublasLtGemm() {
  // Teardown errors (e.g. the driver already unloading at exit) are ignored: nothing can be done about them.
  auto destroy = [](Plan& plan) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
  };
  for (auto& [key, plan] : plans_) destroy(plan);
  for (auto& [key, plan] : fp8_plans_) destroy(plan);
  gpuFree(workspace_);
  cublasLtDestroy(handle_);
}

const CublasLtGemm::Plan& CublasLtGemm::plan_for(const RowMajorGemm& g) {
  const Key key{g.m,
                g.n,
                g.k,
                g.lda,
                g.ldb,
                g.trans_a,
                g.trans_b,
                alignment_of(g.a),
                alignment_of(g.b),
                alignment_of(g.c),
                static_cast<int64_t>(g.ab_dtype),
                static_cast<int64_t>(g.c_dtype)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  const cudaDataType_t type = data_type(g.ab_dtype);
  const cudaDataType_t c_type = data_type(g.c_dtype);
  Plan plan;
  PRIMUS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Swapped operands: cuBLASLt's A is our B with our B's flag, its B is our A with our A's flag.
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  plan.a = g.trans_b ? row_major_layout(type, g.n, g.k, g.ldb) : row_major_layout(type, g.k, g.n, g.ldb);
  plan.b = g.trans_a ? row_major_layout(type, g.k, g.m, g.lda) : row_major_layout(type, g.m, g.k, g.lda);
  plan.c = row_major_layout(c_type, g.m, g.n, g.n);

  choose_algorithm(plan, key[8], key[7], key[9],
                   fmt::format("[op gemm] cuBLASLt has no algorithm for M={} N={} K={} trans_a={} trans_b={} lda={} "
                               "ldb={} {} -> {}",
                               g.m, g.n, g.k, g.trans_a, g.trans_b, g.lda, g.ldb, dtype_name(g.ab_dtype),
                               dtype_name(g.c_dtype)));
  return plans_.emplace(key, plan).first->second;
}

void CublasLtGemm::choose_algorithm(Plan& plan, int64_t align_a, int64_t align_b, int64_t align_c,
                                    const std::string& what) {
  cublasLtMatmulPreference_t pref = nullptr;
  PRIMUS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  set_preference(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes_);
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(align_a));
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(align_b));
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(align_c));
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
    throw RuntimeError(fmt::format("{}: {}", what, cublasLtGetStatusString(status)));
  }
  plan.algo = result.algo;
}

void CublasLtGemm::run(const RowMajorGemm& g, gpuStream_t stream) {
  const Plan& plan = plan_for(g);
  PRIMUS_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &g.alpha, g.b, plan.a, g.a, plan.b, &g.beta, g.c, plan.c, g.c,
                                     plan.c, &plan.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace primus
