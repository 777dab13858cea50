// The Hopper (sm_90a) grouped GEMM: wgmma with TMA loads (kernels/grouped_gemm_wgmma.cu, its host side in
// grouped_gemm_wgmma_host.cpp). grouped_gemm.cu chooses it over the mma.sync kernel through
// grouped_gemm_take_wgmma. NVIDIA-only by nature (wgmma, TMA, the driver's tensor maps): a HIP build leaves these
// files out and has grouped_gemm_take_wgmma answer false, keeping v1.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: the driver is reached through the runtime's entry points)

#include <cstdint>

#include "backend/cuda/kernels/grouped_gemm_wgmma_plan.h"
#include "backend/cuda/kernels/kernels.h"

namespace primus::cuda {

// Whether a bf16 product of shape s (operands 16-byte aligned or not) goes to the wgmma kernel. The environment
// variable PRIMUS_GROUPED_GEMM decides first (grouped::wgmma::parse_choice): "v1" never, "wgmma" always (UsageError
// naming why where refusal() refuses), unset or "auto" where refusal() accepts. Any other value: UsageError.
bool grouped_gemm_take_wgmma(const KernelContext& ctx, const GroupedGemmShape& s, bool operands_aligned);

// The two TMA descriptors of a product (grouped::wgmma::a_map and b_map over a and b, 128-byte swizzle, zero fill).
void encode_grouped_gemm_maps(grouped::wgmma::Form form, const grouped::wgmma::Extents& e, const bf16* a, const bf16* b,
                              CUtensorMap& a_map, CUtensorMap& b_map);

// The persistent kernel's grid for `tiles` tiles: one block per SM (ctx.multiprocessors; its shared memory admits one)
// or fewer. PRIMUS_GROUPED_GEMM_BLOCKS=N caps it at N, so tests can make each block run many tiles; a value that is
// not a positive integer is a UsageError naming the variable.
int64_t grouped_gemm_wgmma_blocks(const KernelContext& ctx, int64_t tiles);

// One grouped product (kernels.h, GroupedGemmShape) of the form `form`: a is x (forward) or dy, b is w or x (wgrad),
// c is y, dx (bf16) or dw (fp32, added to). tile_starts: rows split, grouped::row_tile_starts of the offsets for
// grouped::wgmma::kBM rows, already queued on ctx.stream; unused by wgrad. The caller has checked
// grouped_gemm_take_wgmma.
void grouped_gemm_wgmma(const KernelContext& ctx, grouped::wgmma::Form form, const GroupedGemmShape& s, const bf16* a,
                        const bf16* b, void* c, const int32_t* offsets, const int64_t* tile_starts);

}  // namespace primus::cuda
