// The experts' grouped GEMM on Hopper (v2): the schedule of kernels/grouped_gemm.cu (grouped_gemm_schedule.h: one
// launch, the expert of each block found from the device offsets, no host synchronisation) on wgmma with TMA loads.
// The data plan (boxes, coordinates, descriptors, accumulator layout, which shapes it takes) is plain C++ in
// grouped_gemm_wgmma_plan.h, replayed on the CPU by tests/ops/grouped_gemm_wgmma_plan_test.cpp.
//
// A block computes one 128 × 256 tile of C with 384 threads:
//  - warpgroup 0, the producer, gives up registers (setmaxnreg.dec 40) and one of its threads streams the tile's
//    A and B boxes (cp.async.bulk.tensor, 128-byte swizzle) into a ring of kStages stages of 48 KiB, each guarded by
//    a "full" mbarrier (the TMA's bytes arrived) and an "empty" one (both consumers finished reading it);
//  - warpgroups 1 and 2, the consumers, take the registers (setmaxnreg.inc 232) and each multiplies its 64 rows of
//    the tile by the 256 columns: per stage four wgmma.mma_async m64n256k16 (k 64), fp32 accumulators in registers,
//    one wgmma group kept in flight (a stage is released once the group after it is issued and it is complete).
// Persistent: the grid is at most one block per SM, and block b computes tiles b, b + grid, b + 2·grid, ... of the
// one-tile-a-block numbering (grouped_gemm_schedule.h), so the producer already loads a tile's first stages while
// the consumers are still storing the previous tile, and no block pays a launch and a pipeline fill per tile. The
// ring's stage and phase run on across tiles (one k-block count for the block); the consumers release a tile's last
// stage as soon as its wgmma group is complete, before their epilogue.
// Edges: TMA fills box elements outside a tensor with zeros, so the k, n and m ends of the tensors need nothing.
// Rows split (forward, dgrad): a row tile's last rows may belong to the next expert; they are loaded, multiplied
// and never stored (the epilogue stores only rows of the tile's expert, columns below n). Inner split (wgrad): the
// last k block of an expert holds the next expert's rows; the consumers zero those box rows in shared memory (each
// is one 128-byte line whatever the swizzle), make the writes visible to the async proxy (fence.proxy.async) and
// meet at a named barrier before any wgmma reads the stage. One block owns each output tile and sums its k in a
// fixed order: deterministic. wgrad adds into the fp32 dw with fire-and-forget reductions (red.global.add: the L2
// does the read-modify-write while the consumers move on); each element gets one addition a launch, so the result
// is the same every time (the reduction flushes subnormal fp32 results to zero, a plain add would not).
//
// The sm_90a machine code only: the kernel body is compiled where __CUDA_ARCH_FEAT_SM90_ALL is defined, so the
// compute_90 PTX (for other GPUs' JIT) holds an empty kernel that the host never launches (refusal() wants 9.0).
#include <cstdint>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/grouped_gemm_schedule.h"
#include "backend/cuda/kernels/grouped_gemm_wgmma.h"

namespace primus::cuda {
namespace {

namespace wg = grouped::wgmma;
using wg::Form;

// What a block needs besides the two tensor maps. C is y or dx (bf16, [rows, n]) or dw (fp32, [experts, m, n]).
struct WgmmaProblem {
  void* c;
  const int32_t* offsets;      // [experts + 1]
  const int64_t* tile_starts;  // rows split: grouped::row_tile_starts for kBM
  wg::Extents extents;
  int64_t m, n;  // wgrad: dw[e] is [m, n]; rows split: n columns of C (m comes from the offsets)
  int64_t ldc, expert_stride;
  int64_t tiles;  // tiles of the one-tile-a-block numbering: rows_split_blocks or inner_split_blocks
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers -------------------------------------------------------------------------------------------------

__device__ __forceinline__ void barrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed. A phase lasts one k block's load or compute (µs); a wait
// of 2^34 clocks (~10 s) means a broken pipeline, and trapping fails the launch loudly instead of hanging the GPU.
__device__ __forceinline__ void barrier_wait(uint32_t bar, uint32_t parity) {
  const long long start = clock64();
  uint32_t done = 0;
  while (true) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done != 0) return;
    if (clock64() - start > (1ll << 34)) __trap();
  }
}

// ---- TMA -------------------------------------------------------------------------------------------------------

template <int kRank>
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, const wg::BoxCoord& at) {
  const auto m = reinterpret_cast<uint64_t>(map);
  if constexpr (kRank == 2) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"(m), "r"(at.c[0]), "r"(at.c[1]), "r"(bar)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(dst),
        "l"(m), "r"(at.c[0]), "r"(at.c[1]), "r"(at.c[2]), "r"(bar)
        : "memory");
  }
}

// ---- wgmma -----------------------------------------------------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins the accumulators around the asynchronous wgmma: the compiler may not move or copy them across this point.
__device__ __forceinline__ void pin(float (&d)[wg::kAccumulators]) {
#pragma unroll
  for (int i = 0; i < wg::kAccumulators; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 × 256, fp32) += A (64 × 16) · B (16 × 256), both from shared memory through descriptors. kTransA / kTransB:
// the operand is M- or N-major (wgmma's transpose bits, 16-bit types only).
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[wg::kAccumulators], uint64_t a, uint64_t b) {
  static_assert(wg::kAccumulators == 128, "m64n256 with fp32 accumulators: 128 registers a thread");
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 "
      "}, %128, %129, p, 1, 1, %131, %132;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(1), "n"(kTransA), "n"(kTransB));
}

// wgrad: zero rows [valid, kBK) of every box of the stage (a and b: the stage's A and B); the 256 consumer threads
// share the 16-byte chunks.
__device__ __forceinline__ void zero_rows_past(uint32_t a, uint32_t b, int valid, int consumer_thread) {
  constexpr int kABoxes = wg::a_boxes(Form::kWgrad), kBoxes = kABoxes + wg::b_boxes(Form::kWgrad);
  constexpr int kBoxBytes = wg::a_box_bytes(Form::kWgrad), kChunks = wg::kLineBytes / 16;
  static_assert(wg::a_box_bytes(Form::kWgrad) == wg::b_box_bytes(Form::kWgrad), "one box size");
  const int rows = wg::kBK - valid;
  for (int i = consumer_thread; i < kBoxes * rows * kChunks; i += wg::kConsumers * wg::kWarpgroup) {
    const int line = i / kChunks, box = line / rows, row = valid + line % rows;
    const uint32_t at = (box < kABoxes ? a + box * kBoxBytes : b + (box - kABoxes) * kBoxBytes) +
                        static_cast<uint32_t>(row * wg::kLineBytes + i % kChunks * 16);
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0) : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes → the wgmma's async reads
  asm volatile("bar.sync 1, %0;\n" ::"n"(wg::kConsumers * wg::kWarpgroup) : "memory");
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <Form kForm, typename Out>
__global__ void __launch_bounds__(wg::kThreads, 1)
    grouped_gemm_wgmma_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                              const WgmmaProblem p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace wg;
  // Tile `tile`'s span, or false when it has no work (past the experts' row tiles, or an expert without rows).
  const auto tile_span = [&](int64_t tile, grouped::TileSpan& span) {
    if constexpr (rows_split(kForm)) {
      return grouped::rows_split_tile(tile, p.offsets, p.tile_starts, p.extents.experts, p.extents.rows, p.n, kBM, kBN,
                                      span);
    } else {
      return grouped::inner_split_tile(tile, p.offsets, p.extents.experts, p.extents.rows, p.m, p.n, kBM, kBN, span);
    }
  };
  const auto k_blocks_of = [&](const grouped::TileSpan& span) {
    return (inner_extent(kForm, span, p.extents) + kBK - 1) / kBK;
  };

  // Stages from the first 1024-byte boundary: stage s's A at base + s · kStageBytes, its B kABytes further; then the
  // full barriers, then the empty ones.
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const uint32_t base = (shared_address(shared_bytes) + kBoxAlign - 1) & ~static_cast<uint32_t>(kBoxAlign - 1);
  const uint32_t bars = base + kStages * kStageBytes;
  const auto full = [&](int s) { return bars + 8 * s; };
  const auto empty = [&](int s) { return bars + 8 * (kStages + s); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(full(s), 1);            // the producer's arrive (with the TMA's bytes)
      barrier_init(empty(s), kConsumers);  // one arrive per consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&a_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&b_map)) : "memory");
  }
  __syncthreads();

  // it counts the block's k blocks over all its tiles: stage it % kStages, round it / kStages.
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroup;
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      int64_t it = 0;
      for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
        grouped::TileSpan span;
        if (!tile_span(tile, span)) continue;
        const int64_t k_blocks = k_blocks_of(span);
        for (int64_t kb = 0; kb < k_blocks; ++kb, ++it) {
          const int s = static_cast<int>(it % kStages);
          // Round r waits for the consumers' release of round r − 1; round 0 passes at once (the phase "before"
          // the first, parity 1, counts as completed).
          barrier_wait(empty(s), static_cast<uint32_t>((it / kStages) & 1) ^ 1u);
          barrier_expect_bytes(full(s), kStageBytes);  // whole boxes: zero-filled elements count too
          const uint32_t a = base + static_cast<uint32_t>(s * kStageBytes), b = a + kABytes;
#pragma unroll
          for (int j = 0; j < a_boxes(kForm); ++j) {
            tma_load<2>(a + j * a_box_bytes(kForm), &a_map, full(s), a_box(kForm, span, kb, j));
          }
#pragma unroll
          for (int j = 0; j < b_boxes(kForm); ++j) {
            tma_load<rows_split(kForm) ? 3 : 2>(b + j * b_box_bytes(kForm), &b_map, full(s), b_box(kForm, span, kb, j));
          }
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int consumer = warpgroup - 1, thread = static_cast<int>(threadIdx.x) % kWarpgroup;
  constexpr bool kAKMajor = a_k_major(kForm), kBKMajor = b_k_major(kForm);
  float d[kAccumulators];
  int64_t it = 0;
  for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
    grouped::TileSpan span;
    if (!tile_span(tile, span)) continue;
    const int64_t inner = inner_extent(kForm, span, p.extents), k_blocks = k_blocks_of(span);
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) d[i] = 0.0f;

    for (int64_t kb = 0; kb < k_blocks; ++kb, ++it) {
      const int s = static_cast<int>(it % kStages);
      barrier_wait(full(s), static_cast<uint32_t>((it / kStages) & 1));
      const uint32_t a = base + static_cast<uint32_t>(s * kStageBytes), b = a + kABytes;
      if constexpr (kForm == Form::kWgrad) {
        const int valid = valid_k_rows(inner, kb);
        if (valid < kBK) zero_rows_past(a, b, valid, static_cast<int>(threadIdx.x) - kWarpgroup);
      }
      pin(d);
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kBK / kStep; ++step) {
        const uint64_t da =
            smem_descriptor(a + a_consumer_bytes(consumer) + step_bytes(kAKMajor, step), lbo(kAKMajor), kSbo);
        const uint64_t db = smem_descriptor(b + step_bytes(kBKMajor, step), lbo(kBKMajor), kSbo);
        wgmma_m64n256k16<kAKMajor ? 0 : 1, kBKMajor ? 0 : 1>(d, da, db);
      }
      wgmma_commit();
      pin(d);
      wgmma_wait<1>();  // the previous k block's group is complete: its stage can be refilled
      pin(d);
      if (kb > 0 && thread == 0) barrier_arrive(empty(static_cast<int>((it - 1) % kStages)));
    }
    wgmma_wait<0>();
    pin(d);
    // The tile's last stage is read: the producer may refill it with the next tile's while this one is stored.
    if (k_blocks > 0 && thread == 0) barrier_arrive(empty(static_cast<int>((it - 1) % kStages)));

    // Epilogue straight from the registers: rows of the tile's expert (rows split) or of dw[e], columns below n.
    // n, ldc and the bases are multiples of 8 elements, so a register pair (two adjacent columns) is 4- or 8-byte
    // aligned and wholly inside or outside.
    Out* c = static_cast<Out*>(p.c) + (rows_split(kForm) ? span.expert_begin * p.ldc : span.expert * p.expert_stride);
    const int64_t row0 = span.row_begin + consumer * 64;
#pragma unroll
    for (int i = 0; i < kAccumulators; i += 2) {
      const int64_t row = row0 + accumulator_row(thread, i), col = span.col_begin + accumulator_col(thread, i);
      if (row >= span.row_end || col >= span.col_end) continue;
      Out* at = c + row * p.ldc + col;
      if constexpr (sizeof(Out) == 4) {
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(at), "f"(d[i]), "f"(d[i + 1]) : "memory");
      } else {
        *reinterpret_cast<uint32_t*>(at) =
            static_cast<uint32_t>(f32_to_bf16(d[i])) | (static_cast<uint32_t>(f32_to_bf16(d[i + 1])) << 16);
      }
    }
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ---- host ------------------------------------------------------------------------------------------------------

template <Form kForm, typename Out>
void launch_form(const KernelContext& ctx, const GroupedGemmShape& s, const bf16* a, const bf16* b, Out* c,
                 const int32_t* offsets, const int64_t* tile_starts) {
  const wg::Extents e{s.rows, s.experts, s.in, s.out};
  WgmmaProblem p{c, offsets, tile_starts, e, 0, 0, 0, 0, 0};
  if constexpr (kForm == Form::kForward) {
    p.n = s.out;
    p.ldc = s.out;
  } else if constexpr (kForm == Form::kDgrad) {
    p.n = s.in;
    p.ldc = s.in;
  } else {
    p.m = s.out;
    p.n = s.in;
    p.ldc = s.in;
    p.expert_stride = s.out * s.in;
  }
  p.tiles = wg::rows_split(kForm) ? grouped::rows_split_blocks(s.rows, s.experts, p.n, wg::kBM, wg::kBN)
                                  : grouped::inner_split_blocks(s.experts, p.m, p.n, wg::kBM, wg::kBN);
  if (p.tiles == 0) return;
  const int64_t blocks = grouped_gemm_wgmma_blocks(ctx, p.tiles);
  CUtensorMap a_map{}, b_map{};
  encode_grouped_gemm_maps(kForm, e, a, b, a_map, b_map);
  auto kernel = grouped_gemm_wgmma_kernel<kForm, Out>;
  static const bool prepared = [&] {  // once per kernel: its shared memory is past the default 48 KiB
    PRIMUS_CUDA_CHECK(gpuFuncSetAttribute(kernel, gpuFuncAttributeMaxDynamicSharedMemorySize, wg::kSharedBytes));
    return true;
  }();
  (void)prepared;
  kernel<<<static_cast<unsigned>(blocks), wg::kThreads, wg::kSharedBytes, ctx.stream>>>(a_map, b_map, p);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void grouped_gemm_wgmma(const KernelContext& ctx, grouped::wgmma::Form form, const GroupedGemmShape& s, const bf16* a,
                        const bf16* b, void* c, const int32_t* offsets, const int64_t* tile_starts) {
  switch (form) {
    case Form::kForward:
      launch_form<Form::kForward>(ctx, s, a, b, static_cast<bf16*>(c), offsets, tile_starts);
      return;
    case Form::kDgrad:
      launch_form<Form::kDgrad>(ctx, s, a, b, static_cast<bf16*>(c), offsets, tile_starts);
      return;
    case Form::kWgrad:
      launch_form<Form::kWgrad>(ctx, s, a, b, static_cast<float*>(c), offsets, tile_starts);
      return;
  }
}

}  // namespace primus::cuda
