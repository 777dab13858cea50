// GEMM on the CPU: C = alpha * op(A) · op(B) + beta * C through OpenBLAS (row-major, contiguous operands).
// OpenBLAS splits C among its threads and sums each element over K in one fixed order, so the result is
// bitwise reproducible for a given thread count.
#include <cblas.h>

#include <limits>

#include "backend/cpu/cpu_backend.h"

namespace primus {

void CpuBackend::gemm(const GemmArgs& args) {
  const Tensor& a = *args.a;  // [M, K] or [K, M] if trans_a
  const Tensor& b = *args.b;  // [K, N] or [N, K] if trans_b
  Tensor& c = *args.c;        // [M, N]
  const int64_t m = c.dim(0);
  const int64_t n = c.dim(1);
  const int64_t k = args.trans_a ? a.dim(0) : a.dim(1);
  const int64_t kMaxDim = std::numeric_limits<blasint>::max();
  PRIMUS_CHECK(m <= kMaxDim && n <= kMaxDim && k <= kMaxDim, "[op gemm] {} x {} x {} exceeds the BLAS index range", m,
               n, k);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS rejects a zero leading dimension; the product is empty, so C = beta * C (beta 0 never reads C).
    if (args.beta == 0.0f) {
      c.zero();
    } else {
      scale_inplace(c, args.beta);
    }
    return;
  }
  const int64_t lda = a.dim(1);  // row length as stored, whether or not A is transposed
  const int64_t ldb = b.dim(1);
  cblas_sgemm(CblasRowMajor, args.trans_a ? CblasTrans : CblasNoTrans, args.trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), args.alpha, a.f32(),
              static_cast<blasint>(lda), b.f32(), static_cast<blasint>(ldb), args.beta, c.f32(),
              static_cast<blasint>(n));
}

}  // namespace primus
