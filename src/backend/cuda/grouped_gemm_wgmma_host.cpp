// Host side of the Hopper grouped GEMM (kernels/grouped_gemm_wgmma.h): whether a product takes it, and its TMA
// descriptors, built per call from grouped::wgmma::a_map / b_map (a few µs on the host, no device work).
// cuTensorMapEncodeTiled is a driver function; it is looked up once through the runtime
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda directly.
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/kernels/grouped_gemm_wgmma.h"
#include "core/error.h"

namespace primus::cuda {
namespace {

namespace wg = grouped::wgmma;

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    PRIMUS_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    PRIMUS_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
                 "[op grouped_gemm] the CUDA driver has no cuTensorMapEncodeTiled (query status {})",
                 static_cast<int>(found));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

void encode_map(const wg::OperandMap& m, const bf16* base, const char* operand, CUtensorMap& map) {
  cuuint64_t dims[3] = {m.dims[0], m.dims[1], m.dims[2]};
  cuuint64_t strides[2] = {m.strides_bytes[0], m.strides_bytes[1]};
  cuuint32_t box[3] = {m.box[0], m.box[1], m.box[2]};
  cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(m.rank),
      const_cast<void*>(static_cast<const void*>(base)), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // NONE: elements outside the tensor read as zeros
  PRIMUS_CHECK(result == CUDA_SUCCESS,
               "[op grouped_gemm] cuTensorMapEncodeTiled failed (CUresult {}) for operand {}: dims [{}, {}, {}], "
               "box [{}, {}, {}]",
               static_cast<int>(result), operand, m.dims[0], m.dims[1], m.dims[2], m.box[0], m.box[1], m.box[2]);
}

}  // namespace

bool grouped_gemm_take_wgmma(const KernelContext& ctx, const GroupedGemmShape& s, bool operands_aligned) {
  const char* value = std::getenv("PRIMUS_GROUPED_GEMM");
  wg::Choice choice = wg::Choice::kAuto;
  if (!wg::parse_choice(value, choice)) {
    throw UsageError(fmt::format("PRIMUS_GROUPED_GEMM={}: expected v1, wgmma or auto (or unset)", value));
  }
  if (choice == wg::Choice::kV1) return false;
  const char* why = wg::refusal({true, ctx.compute_capability, s.in, s.out, operands_aligned, ctx.max_shared_bytes});
  if (why == nullptr) return true;
  if (choice == wg::Choice::kWgmma) {
    throw UsageError(
        fmt::format("PRIMUS_GROUPED_GEMM=wgmma: the wgmma grouped GEMM cannot run {} experts of "
                    "[out {}, in {}] over {} rows: {}",
                    s.experts, s.out, s.in, s.rows, why));
  }
  return false;
}

int64_t grouped_gemm_wgmma_blocks(const KernelContext& ctx, int64_t tiles) {
  int64_t blocks = ctx.multiprocessors > 0 ? std::min<int64_t>(tiles, ctx.multiprocessors) : tiles;
  if (const char* value = std::getenv("PRIMUS_GROUPED_GEMM_BLOCKS"); value != nullptr && *value != '\0') {
    char* end = nullptr;
    const long long cap = std::strtoll(value, &end, 10);
    if (*end != '\0' || cap <= 0) {
      throw UsageError(fmt::format("PRIMUS_GROUPED_GEMM_BLOCKS={}: expected a positive number of blocks", value));
    }
    blocks = std::min<int64_t>(blocks, cap);
  }
  return blocks;
}

void encode_grouped_gemm_maps(wg::Form form, const wg::Extents& e, const bf16* a, const bf16* b, CUtensorMap& a_map,
                              CUtensorMap& b_map) {
  encode_map(wg::a_map(form, e), a, "A", a_map);
  encode_map(wg::b_map(form, e), b, "B", b_map);
}

}  // namespace primus::cuda
