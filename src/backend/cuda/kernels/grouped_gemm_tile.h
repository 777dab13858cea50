// Index arithmetic of the grouped GEMM's tensor-core tile (kernels/grouped_gemm.cu): where each 16-byte chunk of an
// operand goes in shared memory, which shared row each lane hands to ldmatrix, and which element of C each
// accumulator holds. Plain C++ shared by the kernel and tests/ops/grouped_gemm_tile_test.cpp, which replays a whole
// block tile on the CPU with ldmatrix and mma.sync written out from the PTX ISA's fragment layouts.
//
// Block tile kBM × kBN, kBK inner per pipeline stage; 8 warps as 2 (rows) × 4 (columns), each 64 × 32, as 4 × 4
// fragments of m16 × n8 with k16 steps. An operand stage is [rows][kBK + kPad] when K-major (k adjacent in memory)
// or [kBK][rows + kPad] otherwise; the 8 bf16 (16 bytes) of padding per shared row put the 8 rows one ldmatrix
// reads in 8 different bank groups.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PRIMUS_TILE_FN __host__ __device__ constexpr inline
#else
#define PRIMUS_TILE_FN constexpr inline
#endif

namespace primus::cuda::grouped {

inline constexpr int kBM = 128, kBN = 128, kBK = 32, kPad = 8, kThreads = 256;
inline constexpr int kWarpM = 64, kWarpN = 32;                // 2 × 4 warps
inline constexpr int kFragM = kWarpM / 16, kFragN = kWarpN / 8;  // m16 and n8 fragments per warp

// bf16 elements of one stage of an operand tile of `rows` rows (m or n).
PRIMUS_TILE_FN int stage_elems(bool k_major, int rows) { return k_major ? rows * (kBK + kPad) : kBK * (rows + kPad); }

// Chunk `chunk` (of rows · kBK / 8) of a stage: its first element's row (m or n) and k inside the tile, and its
// offset in the stage. Consecutive chunks run along the contiguous dimension, so a warp's copies are coalesced.
struct ChunkPlace {
  int row, k, offset;
};
PRIMUS_TILE_FN ChunkPlace chunk_place(bool k_major, int rows, int chunk) {
  if (k_major) {
    const int row = chunk / (kBK / 8), k = chunk % (kBK / 8) * 8;
    return {row, k, row * (kBK + kPad) + k};
  }
  const int k = chunk / (rows / 8), row = chunk % (rows / 8) * 8;
  return {row, k, k * (rows + kPad) + row};
}

// The warp's first row and column in the block tile.
PRIMUS_TILE_FN int warp_row(int warp) { return warp / (kBN / kWarpN) * kWarpM; }
PRIMUS_TILE_FN int warp_col(int warp) { return warp % (kBN / kWarpN) * kWarpN; }

// The stage offset `lane` hands to ldmatrix.x4 for the A fragment (rows m0..m0+15, k kk..kk+15). The four 8 × 8
// matrices (lanes 8j..8j+7 name the rows of matrix j) are the fragment's registers in order: rows 0–7 × k 0–7,
// rows 8–15 × k 0–7, rows 0–7 × k 8–15, rows 8–15 × k 8–15. K-major: lanes name rows of m (plain ldmatrix);
// otherwise rows of k ([k][m] storage, ldmatrix .trans).
PRIMUS_TILE_FN int a_fragment_offset(bool k_major, int m0, int kk, int lane) {
  const int j = lane / 8, r = lane % 8;
  if (k_major) return (m0 + j % 2 * 8 + r) * (kBK + kPad) + kk + j / 2 * 8;
  return (kk + j / 2 * 8 + r) * (kBM + kPad) + m0 + j % 2 * 8;
}

// The same for two B fragments (columns n0..n0+7 and n0+8..n0+15, k kk..kk+15): matrices n 0–7 × k 0–7 and
// × k 8–15 (the first fragment's two registers), then n 8–15 likewise. K-major: [n][k] storage, plain ldmatrix;
// otherwise [k][n], .trans.
PRIMUS_TILE_FN int b_fragment_offset(bool k_major, int n0, int kk, int lane) {
  const int j = lane / 8, r = lane % 8;
  if (k_major) return (n0 + j / 2 * 8 + r) * (kBK + kPad) + kk + j % 2 * 8;
  return (kk + j % 2 * 8 + r) * (kBN + kPad) + n0 + j / 2 * 8;
}

// Row and first column in the block tile of accumulator pair h (0: registers 0, 1; 1: registers 2, 3) of fragment
// (i, j) of `lane` in `warp`; the pair covers that column and the next (mma.sync's C layout).
PRIMUS_TILE_FN int accumulator_row(int warp, int i, int h, int lane) { return warp_row(warp) + i * 16 + lane / 4 + h * 8; }
PRIMUS_TILE_FN int accumulator_col(int warp, int j, int lane) { return warp_col(warp) + j * 8 + lane % 4 * 2; }

}  // namespace primus::cuda::grouped

#undef PRIMUS_TILE_FN
