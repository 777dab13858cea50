// Which tile of which expert a block of the grouped GEMM computes (kernels/grouped_gemm.cu). Plain C++ that runs on
// the host and the device alike, so tests/ops/grouped_gemm_schedule_test.cpp checks on the CPU, against a brute-force
// enumeration, that a launch covers every output tile exactly once for any offsets.
//
// The experts split the product one of two ways:
//  - rows (forward, dgrad): expert e owns rows [offsets[e], offsets[e+1]) of A and C. Its rows make
//    ceil(m_e / BM) row tiles; the experts' row tiles are numbered end to end (tile_starts), and a grid of
//    row_tiles_bound × column tiles blocks covers them, since Σ_e ceil(m_e / BM) ≤ ceil(M / BM) + E. A block finds
//    its expert by binary search in tile_starts; blocks past the last tile have none.
//  - inner (wgrad): expert e owns the rows [offsets[e], offsets[e+1]) of the inner dimension and its own C (dw[e]);
//    E × row tiles × column tiles blocks, the blocks of an expert without rows have nothing to do.
// Within either, blocks go out in groups of kGroupRows row tiles that sweep all column tiles before the next group,
// so the group's rows of A and each tile of B are read from DRAM about once and then from L2.
// Offsets are clamped to [0, M]: offsets that are not ascending give empty experts, never an access outside A or C.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PRIMUS_SCHEDULE_FN __host__ __device__ inline
#else
#define PRIMUS_SCHEDULE_FN inline
#endif

namespace primus::cuda::grouped {

inline constexpr int64_t kGroupRows = 8;

// A block's share of the product: rows [row_begin, row_end) of C inside the expert's rows (rows split) or of dw[e]
// (inner split), columns [col_begin, col_end); for the inner split, inner rows [inner_begin, inner_end) of A and B.
struct TileSpan {
  int64_t expert = -1;
  int64_t row_begin = 0, row_end = 0;      // relative to the expert's first row (rows split) or to dw[e]
  int64_t col_begin = 0, col_end = 0;
  int64_t expert_begin = 0, expert_end = 0;  // offsets[e], offsets[e+1] (clamped): rows of A and C, or inner rows
};

PRIMUS_SCHEDULE_FN int64_t clamped_offset(const int32_t* offsets, int64_t e, int64_t total_rows) {
  const int64_t v = offsets[e];
  return v < 0 ? 0 : (v > total_rows ? total_rows : v);
}

PRIMUS_SCHEDULE_FN int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows split: an upper bound of the experts' row tiles, Σ_e ceil(m_e / bm) ≤ ceil(M / bm) + E.
PRIMUS_SCHEDULE_FN int64_t row_tiles_bound(int64_t total_rows, int64_t experts, int64_t bm) {
  return ceil_div(total_rows, bm) + experts;
}

// Rows split: starts[e] = Σ_{e' < e} ceil(m_e' / bm), for e in [0, E]; starts[E] is the number of row tiles.
PRIMUS_SCHEDULE_FN void row_tile_starts(const int32_t* offsets, int64_t experts, int64_t total_rows, int64_t bm,
                                        int64_t* starts) {
  int64_t sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    starts[e] = sum;
    const int64_t rows = clamped_offset(offsets, e + 1, total_rows) - clamped_offset(offsets, e, total_rows);
    if (rows > 0) sum += ceil_div(rows, bm);
  }
  starts[experts] = sum;
}

// Rows split: the expert that owns global row tile tm (starts[e] ≤ tm < starts[e + 1]), or −1 when tm ≥ starts[E].
// The last e with starts[e] ≤ tm: experts without tiles share their start with the next one and are passed over.
PRIMUS_SCHEDULE_FN int64_t expert_of_row_tile(const int64_t* starts, int64_t experts, int64_t tm) {
  if (tm < 0 || tm >= starts[experts]) return -1;
  int64_t lo = 0, hi = experts - 1;  // starts[lo] ≤ tm holds (starts[0] = 0); find the largest such index
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (starts[mid] <= tm) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Block `local` of tiles_m × tiles_n tiles in the grouped order: its row tile tm and column tile tn.
PRIMUS_SCHEDULE_FN void grouped_order(int64_t local, int64_t tiles_m, int64_t tiles_n, int64_t& tm, int64_t& tn) {
  const int64_t per_group = kGroupRows * tiles_n;
  const int64_t first = local / per_group * kGroupRows;
  const int64_t height = tiles_m - first < kGroupRows ? tiles_m - first : kGroupRows;
  const int64_t within = local % per_group;
  tm = first + within % height;
  tn = within / height;
}

// Blocks of a launch: rows split, row_tiles_bound × column tiles; inner split, E × row tiles × column tiles.
PRIMUS_SCHEDULE_FN int64_t rows_split_blocks(int64_t total_rows, int64_t experts, int64_t n, int64_t bm, int64_t bn) {
  return row_tiles_bound(total_rows, experts, bm) * ceil_div(n, bn);
}
PRIMUS_SCHEDULE_FN int64_t inner_split_blocks(int64_t experts, int64_t m, int64_t n, int64_t bm, int64_t bn) {
  return experts * ceil_div(m, bm) * ceil_div(n, bn);
}

// Rows split: block `block` of a launch of rows_split_blocks(...) blocks over C [M, n]; false when it has no tile.
PRIMUS_SCHEDULE_FN bool rows_split_tile(int64_t block, const int32_t* offsets, const int64_t* starts, int64_t experts,
                                        int64_t total_rows, int64_t n, int64_t bm, int64_t bn, TileSpan& span) {
  const int64_t tiles_n = ceil_div(n, bn);
  if (tiles_n == 0) return false;
  int64_t tm = 0, tn = 0;
  grouped_order(block, row_tiles_bound(total_rows, experts, bm), tiles_n, tm, tn);
  const int64_t e = expert_of_row_tile(starts, experts, tm);
  if (e < 0) return false;
  span.expert = e;
  span.expert_begin = clamped_offset(offsets, e, total_rows);
  span.expert_end = clamped_offset(offsets, e + 1, total_rows);
  span.row_begin = (tm - starts[e]) * bm;
  const int64_t rows = span.expert_end - span.expert_begin;
  span.row_end = span.row_begin + bm < rows ? span.row_begin + bm : rows;
  span.col_begin = tn * bn;
  span.col_end = span.col_begin + bn < n ? span.col_begin + bn : n;
  return span.row_begin < span.row_end;
}

// Inner split: block `block` of inner_split_blocks(...) blocks over dw [E, m, n]; false when its expert has no rows.
PRIMUS_SCHEDULE_FN bool inner_split_tile(int64_t block, const int32_t* offsets, int64_t experts, int64_t total_rows,
                                         int64_t m, int64_t n, int64_t bm, int64_t bn, TileSpan& span) {
  const int64_t tiles_m = ceil_div(m, bm), tiles_n = ceil_div(n, bn);
  if (tiles_m == 0 || tiles_n == 0) return false;
  const int64_t per_expert = tiles_m * tiles_n;
  const int64_t e = block / per_expert;
  if (e >= experts) return false;
  int64_t tm = 0, tn = 0;
  grouped_order(block % per_expert, tiles_m, tiles_n, tm, tn);
  span.expert = e;
  span.expert_begin = clamped_offset(offsets, e, total_rows);
  span.expert_end = clamped_offset(offsets, e + 1, total_rows);
  span.row_begin = tm * bm;
  span.row_end = span.row_begin + bm < m ? span.row_begin + bm : m;
  span.col_begin = tn * bn;
  span.col_end = span.col_begin + bn < n ? span.col_begin + bn : n;
  return span.expert_end > span.expert_begin;  // an expert without rows keeps its dw
}

}  // namespace primus::cuda::grouped

#undef PRIMUS_SCHEDULE_FN
