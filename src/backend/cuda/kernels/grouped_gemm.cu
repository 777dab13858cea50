// The grouped GEMM of the experts (backend.h, GroupedLinearArgs): one launch covers every expert, and each thread
// block finds its expert and tile from the device-side offsets, so the host never waits to learn the counts.
//
// The three products, with A(m, k) · B(k, n) → C(m, n):
//   forward  y  = x · w[e]ᵀ      A = x  (K-major)   B = w[e] (K-major)  rows of A and C split by expert
//   dgrad    dx = dy · w[e]      A = dy (K-major)   B = w[e] (N-major)  rows of A and C split by expert
//   wgrad    dw[e] += dyᵀ · x    A = dy (M-major)   B = x    (N-major)  the inner dimension split by expert
// "K-major": consecutive k of one row (or column) are adjacent in memory.
//
// Which block computes which tile is grouped_gemm_schedule.h (plain C++, tested on the CPU). Rows split by expert:
// a one-thread kernel first turns the offsets into each expert's first row tile (on the device, queued on the same
// stream), the grid holds ceil(M / BM) + E row tiles (an upper bound of Σ_e ceil(m_e / BM)) times the column tiles,
// a block finds its expert by binary search, and blocks past the real count return. Inner dimension split:
// E × (row tiles × column tiles) blocks, each summing over its expert's rows; an expert without rows leaves its dw
// as it was. Every output element is written by one block, whose sum runs in a fixed order: the results are
// deterministic (no atomics). Offsets outside [0, M] are clamped so no access leaves the tensors.
//
// Three kernels share that schedule:
//  - bf16 on Hopper (sm_90): wgmma with TMA loads, 128 × 256 tiles (v2, kernels/grouped_gemm_wgmma.cu), wherever
//    grouped::wgmma::refusal() takes the product; the environment variable PRIMUS_GROUPED_GEMM overrides the
//    choice: "v1" keeps the two kernels below, "wgmma" insists on v2 (an error naming why where it cannot run),
//    unset or "auto" is the default (docs/perf/grouped-gemm.md);
//  - bf16 on tensor cores (mma.sync m16n8k16, fp32 accumulators, ldmatrix from padded shared memory, a 4-stage
//    cp.async pipeline, 128 × 128 × 32 tiles, 8 warps of 64 × 32) where in and out are multiples of 8 and the
//    pointers 16-byte aligned: every 16-byte chunk of a row then lies wholly inside or outside the matrix;
//  - a plain fp32 kernel (64 × 64 tiles, 4 × 4 outputs a thread, element loads with bounds checks) for f32 runs,
//    which must equal the CPU's fp32 sums to 1e-4, and for bf16 shapes the fast one does not take.
// Tiles go out in groups of 8 row tiles that sweep the columns together, so a group's A panel and each B tile
// are read from DRAM about once and then served from L2.
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/grouped_gemm_schedule.h"
#include "backend/cuda/kernels/grouped_gemm_tile.h"
#include "backend/cuda/kernels/grouped_gemm_wgmma.h"
#include "backend/cuda/kernels/kernels.h"

namespace primus::cuda {
namespace {

// How the experts split the product (see the file comment).
enum class Split { kRows, kInner };

// One grouped product. Row lengths (lda, ldb, ldc) are in elements; the per-expert parts of B (rows split) or C
// (inner split) lie expert_stride elements apart.
template <typename T, typename Out>
struct Problem {
  const T* a;
  const T* b;
  Out* c;
  const int32_t* offsets;      // [experts + 1]
  const int64_t* tile_starts;  // [experts + 1], rows split only: grouped::row_tile_starts for the kernel's BM
  int64_t experts;
  int64_t total_rows;  // M: the offsets are clamped to [0, M]
  int64_t m, n, k;     // the fixed extents; the split one (m for rows, k for inner) comes from the offsets
  int64_t lda, ldb, ldc;
  int64_t expert_stride;
  bool accumulate;  // C += A·B (dw) instead of C = A·B
};

// The tile a block owns, with the expert's operands already offset to it.
template <typename T, typename Out>
struct Tile {
  const T* a;
  const T* b;
  Out* c;
  int64_t m, k;        // the expert's extents (m rows of A and C, k inner)
  int64_t row0, col0;  // the tile's first row and column inside the expert's C
};

// The block's tile (grouped_gemm_schedule.h), or false when it has none.
template <int BM, int BN, Split kSplit, typename T, typename Out>
__device__ bool locate_tile(const Problem<T, Out>& p, Tile<T, Out>& t) {
  grouped::TileSpan span;
  if constexpr (kSplit == Split::kRows) {
    if (!grouped::rows_split_tile(blockIdx.x, p.offsets, p.tile_starts, p.experts, p.total_rows, p.n, BM, BN, span)) {
      return false;
    }
    t.a = p.a + span.expert_begin * p.lda;
    t.b = p.b + span.expert * p.expert_stride;
    t.c = p.c + span.expert_begin * p.ldc;
    t.m = span.expert_end - span.expert_begin;
    t.k = p.k;
  } else {
    if (!grouped::inner_split_tile(blockIdx.x, p.offsets, p.experts, p.total_rows, p.m, p.n, BM, BN, span)) {
      return false;
    }
    t.a = p.a + span.expert_begin * p.lda;
    t.b = p.b + span.expert_begin * p.ldb;
    t.c = p.c + span.expert * p.expert_stride;
    t.m = p.m;
    t.k = span.expert_end - span.expert_begin;
  }
  t.row0 = span.row_begin;
  t.col0 = span.col_begin;
  return true;
}

// Blocks of a launch with BM × BN tiles.
template <Split kSplit, typename T, typename Out>
int64_t blocks_for(const Problem<T, Out>& p, int bm, int bn) {
  if (kSplit == Split::kRows) return grouped::rows_split_blocks(p.total_rows, p.experts, p.n, bm, bn);
  return grouped::inner_split_blocks(p.experts, p.m, p.n, bm, bn);
}

// starts [experts + 1] = grouped::row_tile_starts of the device offsets: one thread, O(E), queued before the GEMM.
__global__ void row_tile_starts_kernel(const int32_t* offsets, int64_t experts, int64_t total_rows, int64_t bm,
                                       int64_t* starts) {
  if (blockIdx.x == 0 && threadIdx.x == 0) grouped::row_tile_starts(offsets, experts, total_rows, bm, starts);
}

// ---- the fp32 kernel (any dtype, any shape) --------------------------------------------------------------------

constexpr int kSimtTile = 64, kSimtK = 16, kSimtThreads = 256;

template <bool kAKMajor, bool kBKMajor, Split kSplit, typename T, typename Out>
__global__ void __launch_bounds__(kSimtThreads) grouped_gemm_simt_kernel(Problem<T, Out> p) {
  Tile<T, Out> t;
  if (!locate_tile<kSimtTile, kSimtTile, kSplit>(p, t)) return;
  __shared__ float sa[kSimtK][kSimtTile];
  __shared__ float sb[kSimtK][kSimtTile];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < t.k; k0 += kSimtK) {
#pragma unroll
    for (int i = 0; i < kSimtK * kSimtTile / kSimtThreads; ++i) {
      const int e = static_cast<int>(threadIdx.x) + i * kSimtThreads;
      // Adjacent threads read adjacent memory: along k for a K-major operand, along m or n otherwise.
      const int ka = kAKMajor ? e % kSimtK : e / kSimtTile, ma = kAKMajor ? e / kSimtK : e % kSimtTile;
      const int64_t gm = t.row0 + ma, gka = k0 + ka;
      sa[ka][ma] = gm < t.m && gka < t.k ? load(t.a + (kAKMajor ? gm * p.lda + gka : gka * p.lda + gm)) : 0.0f;
      const int kb = kBKMajor ? e % kSimtK : e / kSimtTile, nb = kBKMajor ? e / kSimtK : e % kSimtTile;
      const int64_t gn = t.col0 + nb, gkb = k0 + kb;
      sb[kb][nb] = gn < p.n && gkb < t.k ? load(t.b + (kBKMajor ? gn * p.ldb + gkb : gkb * p.ldb + gn)) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kSimtK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = sa[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = sb[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = t.row0 + ty + 16 * i;
    if (row >= t.m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = t.col0 + tx + 16 * j;
      if (col >= p.n) continue;
      Out* c = t.c + row * p.ldc + col;
      store(c, p.accumulate ? load(c) + acc[i][j] : acc[i][j]);
    }
  }
}

// ---- the bf16 tensor-core kernel -------------------------------------------------------------------------------

// Tile sizes, warp layout and index arithmetic: grouped_gemm_tile.h.
using grouped::kBK;
using grouped::kBM;
using grouped::kBN;
using grouped::kFragM;
using grouped::kFragN;
using grouped::kThreads;
constexpr int kStages = 4;

template <bool kAKMajor, bool kBKMajor>
constexpr int tensor_core_shared_bytes() {
  return kStages * (grouped::stage_elems(kAKMajor, kBM) + grouped::stage_elems(kBKMajor, kBN)) * 2;
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared, or 16 zero bytes when !valid (nothing is read then).
__device__ __forceinline__ void copy16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a · b: a 16 × 16 (row), b 16 × 8 (column), fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Queues one stage of an operand tile: `rows` rows (m or n) from `first` of `extent`, kBK inner from k0 of k.
// K-major source: element (r, k) at src[r · ld + k]; otherwise at src[k · ld + r].
template <bool kKMajor, int kRows>
__device__ __forceinline__ void load_stage(bf16* dst, const bf16* src, int64_t ld, int64_t first, int64_t extent,
                                           int64_t k0, int64_t k) {
  constexpr int kChunks = kRows * kBK / 8;
  static_assert(kChunks % kThreads == 0, "every thread queues the same number of chunks");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const grouped::ChunkPlace place = grouped::chunk_place(kKMajor, kRows, static_cast<int>(threadIdx.x) + i * kThreads);
    const int r = place.row, kk = place.k, offset = place.offset;
    const int64_t gr = first + r, gk = k0 + kk;
    const bool valid = gr < extent && gk < k;
    const bf16* from = valid ? src + (kKMajor ? gr * ld + gk : gk * ld + gr) : src;
    copy16(shared_address(dst + offset), from, valid);
  }
}

template <bool kAKMajor, bool kBKMajor, Split kSplit, typename Out>
__global__ void __launch_bounds__(kThreads) grouped_gemm_mma_kernel(Problem<bf16, Out> p) {
  Tile<bf16, Out> t;
  if (!locate_tile<kBM, kBN, kSplit>(p, t)) return;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  constexpr int kAStage = grouped::stage_elems(kAKMajor, kBM), kBStage = grouped::stage_elems(kBKMajor, kBN);
  bf16* sa = reinterpret_cast<bf16*>(shared_bytes);
  bf16* sb = sa + kStages * kAStage;

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int wm = grouped::warp_row(warp), wn = grouped::warp_col(warp);
  float acc[kFragM][kFragN][4] = {};

  const int64_t k_tiles = (t.k + kBK - 1) / kBK;
  auto queue = [&](int stage, int64_t kt) {
    load_stage<kAKMajor, kBM>(sa + stage * kAStage, t.a, p.lda, t.row0, t.m, kt * kBK, t.k);
    load_stage<kBKMajor, kBN>(sb + stage * kBStage, t.b, p.ldb, t.col0, p.n, kt * kBK, t.k);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) queue(s, s);
    copy_commit();
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    copy_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for all, and every warp is done with the stage refilled next
    const int64_t next = kt + kStages - 1;
    if (next < k_tiles) queue(static_cast<int>(next % kStages), next);
    copy_commit();
    const bf16* a = sa + (kt % kStages) * kAStage;
    const bf16* b = sb + (kt % kStages) * kBStage;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[kFragM][4];
#pragma unroll
      for (int i = 0; i < kFragM; ++i) {
        const uint32_t address = shared_address(a + grouped::a_fragment_offset(kAKMajor, wm + i * 16, kk, lane));
        if constexpr (kAKMajor) {
          ldmatrix_x4(af[i], address);
        } else {
          ldmatrix_x4_trans(af[i], address);
        }
      }
      uint32_t bfr[kFragN][2];
#pragma unroll
      for (int j = 0; j < kFragN; j += 2) {
        uint32_t r[4];
        const uint32_t address = shared_address(b + grouped::b_fragment_offset(kBKMajor, wn + j * 8, kk, lane));
        if constexpr (kBKMajor) {
          ldmatrix_x4(r, address);
        } else {
          ldmatrix_x4_trans(r, address);
        }
        bfr[j][0] = r[0];
        bfr[j][1] = r[1];
        bfr[j + 1][0] = r[2];
        bfr[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < kFragM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragN; ++j) mma_bf16(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
      }
    }
  }
  copy_wait<0>();

  // Accumulator pair (i, j, h) of the lane: grouped::accumulator_row / _col. n is a multiple of 8, so a pair of
  // columns is wholly inside or outside.
#pragma unroll
  for (int i = 0; i < kFragM; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = t.row0 + grouped::accumulator_row(warp, i, h, lane);
      if (row >= t.m) continue;
#pragma unroll
      for (int j = 0; j < kFragN; ++j) {
        const int64_t col = t.col0 + grouped::accumulator_col(warp, j, lane);
        if (col >= p.n) continue;
        const float v0 = acc[i][j][h * 2], v1 = acc[i][j][h * 2 + 1];
        Out* c = t.c + row * p.ldc + col;
        if constexpr (sizeof(Out) == 4) {
          float2 old = p.accumulate ? *reinterpret_cast<const float2*>(c) : make_float2(0.0f, 0.0f);
          *reinterpret_cast<float2*>(c) = make_float2(old.x + v0, old.y + v1);
        } else {
          *reinterpret_cast<uint32_t*>(c) =
              static_cast<uint32_t>(f32_to_bf16(v0)) | (static_cast<uint32_t>(f32_to_bf16(v1)) << 16);
        }
      }
    }
  }
}

// ---- launch ----------------------------------------------------------------------------------------------------

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Rows split: the experts' row tile starts for tiles of `bm` rows, computed on the device into `scratch`.
template <Split kSplit, typename T, typename Out>
void prepare_schedule(const KernelContext& ctx, Problem<T, Out>& p, int bm, const DeviceBuffer& scratch) {
  if constexpr (kSplit == Split::kRows) {
    p.tile_starts = scratch.as<int64_t>();
    row_tile_starts_kernel<<<1, 1, 0, ctx.stream>>>(p.offsets, p.experts, p.total_rows, bm, scratch.as<int64_t>());
    PRIMUS_CUDA_CHECK_LAUNCH();
  }
}

template <bool kAKMajor, bool kBKMajor, Split kSplit, typename T, typename Out>
void launch(const KernelContext& ctx, Problem<T, Out> p) {
  if (p.n == 0 || p.experts == 0) return;
  if (kSplit == Split::kRows && p.total_rows == 0) return;
  const DeviceBuffer scratch(*ctx.allocator,
                             kSplit == Split::kRows ? static_cast<size_t>(p.experts + 1) * sizeof(int64_t) : 0);
  if constexpr (std::is_same_v<T, bf16>) {
    constexpr int shared = tensor_core_shared_bytes<kAKMajor, kBKMajor>();
    const bool fits = p.m % 8 == 0 && p.n % 8 == 0 && p.k % 8 == 0 && p.lda % 8 == 0 && p.ldb % 8 == 0 &&
                      p.ldc % 8 == 0 && p.expert_stride % 8 == 0 && aligned16(p.a) && aligned16(p.b) &&
                      aligned16(p.c) && shared <= ctx.max_shared_bytes;
    if (fits) {
      const int64_t blocks = blocks_for<kSplit>(p, kBM, kBN);
      if (blocks == 0) return;
      prepare_schedule<kSplit>(ctx, p, kBM, scratch);
      auto kernel = grouped_gemm_mma_kernel<kAKMajor, kBKMajor, kSplit, Out>;
      static const bool prepared = [&] {  // once per kernel: raise its shared memory limit past 48 KiB
        PRIMUS_CUDA_CHECK(gpuFuncSetAttribute(kernel, gpuFuncAttributeMaxDynamicSharedMemorySize, shared));
        return true;
      }();
      (void)prepared;
      kernel<<<static_cast<unsigned>(blocks), kThreads, shared, ctx.stream>>>(p);
      PRIMUS_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  const int64_t blocks = blocks_for<kSplit>(p, kSimtTile, kSimtTile);
  if (blocks == 0) return;
  prepare_schedule<kSplit>(ctx, p, kSimtTile, scratch);
  grouped_gemm_simt_kernel<kAKMajor, kBKMajor, kSplit><<<static_cast<unsigned>(blocks), kSimtThreads, 0,
                                                         ctx.stream>>>(p);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

// ---- the choice of v2 (wgmma) -----------------------------------------------------------------------------------

// Whether a bf16 product with these operands runs on the wgmma kernel (grouped_gemm_take_wgmma).
bool take_wgmma(const KernelContext& ctx, const GroupedGemmShape& s, std::initializer_list<const void*> operands) {
  bool aligned = true;
  for (const void* p : operands) aligned = aligned && aligned16(p);
  return grouped_gemm_take_wgmma(ctx, s, aligned);
}

template <Split kSplit, typename Out>
void launch_wgmma(const KernelContext& ctx, grouped::wgmma::Form form, const GroupedGemmShape& s,
                  Problem<bf16, Out> p) {
  if (s.rows == 0 || s.experts == 0) return;  // no rows: nothing to write, and every dw stays as it was
  const DeviceBuffer scratch(*ctx.allocator,
                             kSplit == Split::kRows ? static_cast<size_t>(p.experts + 1) * sizeof(int64_t) : 0);
  prepare_schedule<kSplit>(ctx, p, grouped::wgmma::kBM, scratch);
  grouped_gemm_wgmma(ctx, form, s, p.a, p.b, p.c, p.offsets, p.tile_starts);
}

}  // namespace

template <typename T>
void grouped_linear_forward(const KernelContext& ctx, const GroupedGemmShape& s, const T* x, const T* w,
                            const int32_t* offsets, T* y) {
  // m is the rows of one expert (from the offsets); 0 here stands for "any" in the fast path's checks.
  const Problem<T, T> p{x, w, y, offsets, nullptr, s.experts, s.rows, 0, s.out, s.in,
                        s.in, s.in, s.out, s.out * s.in, false};
  if constexpr (std::is_same_v<T, bf16>) {
    if (take_wgmma(ctx, s, {x, w, y})) return launch_wgmma<Split::kRows>(ctx, grouped::wgmma::Form::kForward, s, p);
  }
  launch<true, true, Split::kRows>(ctx, p);
}

template <typename T>
void grouped_linear_backward_data(const KernelContext& ctx, const GroupedGemmShape& s, const T* dy, const T* w,
                                  const int32_t* offsets, T* dx) {
  const Problem<T, T> p{dy, w, dx, offsets, nullptr, s.experts, s.rows, 0, s.in, s.out,
                        s.out, s.in, s.in, s.out * s.in, false};
  if constexpr (std::is_same_v<T, bf16>) {
    if (take_wgmma(ctx, s, {dy, w, dx})) return launch_wgmma<Split::kRows>(ctx, grouped::wgmma::Form::kDgrad, s, p);
  }
  launch<true, false, Split::kRows>(ctx, p);
}

template <typename T>
void grouped_linear_backward_weight(const KernelContext& ctx, const GroupedGemmShape& s, const T* dy, const T* x,
                                    const int32_t* offsets, float* dw) {
  // k is the rows of one expert (from the offsets); 0 here stands for "any" in the fast path's checks.
  const Problem<T, float> p{dy, x, dw, offsets, nullptr, s.experts, s.rows, s.out, s.in, 0,
                            s.out, s.in, s.in, s.out * s.in, true};
  if constexpr (std::is_same_v<T, bf16>) {
    if (take_wgmma(ctx, s, {dy, x, dw})) return launch_wgmma<Split::kInner>(ctx, grouped::wgmma::Form::kWgrad, s, p);
  }
  launch<false, false, Split::kInner>(ctx, p);
}

#define PRIMUS_GROUPED_GEMM(T)                                                                                  \
  template void grouped_linear_forward<T>(const KernelContext&, const GroupedGemmShape&, const T*, const T*,   \
                                          const int32_t*, T*);                                                  \
  template void grouped_linear_backward_data<T>(const KernelContext&, const GroupedGemmShape&, const T*,       \
                                                const T*, const int32_t*, T*);                                  \
  template void grouped_linear_backward_weight<T>(const KernelContext&, const GroupedGemmShape&, const T*,     \
                                                  const T*, const int32_t*, float*);
PRIMUS_GROUPED_GEMM(float)
PRIMUS_GROUPED_GEMM(bf16)
#undef PRIMUS_GROUPED_GEMM

}  // namespace primus::cuda
