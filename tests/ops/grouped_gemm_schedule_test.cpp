// The grouped GEMM's tile schedule (backend/cuda/kernels/grouped_gemm_schedule.h), the same functions the CUDA
// kernels call per block, checked on the CPU against a brute-force enumeration: every launch's blocks together
// cover every output tile exactly once, inside its expert and the matrix, for random offsets with empty and one-row
// experts, row counts that are no multiples of the tile, more experts than rows, and offsets that are not ascending
// (clamped: empty experts, never an access outside the tensors).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/grouped_gemm_schedule.h"
#include "core/rng.h"

namespace primus {
namespace {

namespace g = cuda::grouped;

// Offsets [E + 1] over `rows`: random counts, expert 1 one row and the middle expert none where E allows.
std::vector<int32_t> random_offsets(int64_t rows, int64_t experts, Rng& rng) {
  std::vector<int64_t> count(static_cast<size_t>(experts), 0);
  int64_t left = rows;
  if (experts > 1 && left > 0) {
    count[1] = 1;
    --left;
  }
  while (left > 0) {
    const auto e = static_cast<int64_t>(rng.below(static_cast<uint64_t>(experts)));
    if (experts > 2 && e == experts / 2) continue;
    const int64_t take = std::min<int64_t>(left, 1 + static_cast<int64_t>(rng.below(300)));
    count[static_cast<size_t>(e)] += take;
    left -= take;
  }
  std::vector<int32_t> offsets(static_cast<size_t>(experts + 1), 0);
  for (int64_t e = 0; e < experts; ++e) {
    offsets[static_cast<size_t>(e + 1)] = offsets[static_cast<size_t>(e)] + static_cast<int32_t>(count[static_cast<size_t>(e)]);
  }
  return offsets;
}

struct Layout {
  int64_t rows, experts, n, bm, bn;
};

// Rows split: every (row, column tile) of C [rows, n] is covered by exactly one block, and that block's expert owns
// the row; no block reaches past its expert's rows or the columns.
void check_rows_split(const Layout& l, const std::vector<int32_t>& offsets, const std::string& what) {
  std::vector<int64_t> starts(static_cast<size_t>(l.experts + 1));
  g::row_tile_starts(offsets.data(), l.experts, l.rows, l.bm, starts.data());
  EXPECT_LE(starts[static_cast<size_t>(l.experts)], g::row_tiles_bound(l.rows, l.experts, l.bm)) << what;
  const int64_t tiles_n = (l.n + l.bn - 1) / l.bn;
  std::vector<int> covered(static_cast<size_t>(l.rows * tiles_n), 0);
  const int64_t blocks = g::rows_split_blocks(l.rows, l.experts, l.n, l.bm, l.bn);
  for (int64_t b = 0; b < blocks; ++b) {
    g::TileSpan s;
    if (!g::rows_split_tile(b, offsets.data(), starts.data(), l.experts, l.rows, l.n, l.bm, l.bn, s)) continue;
    ASSERT_GE(s.expert, 0) << what;
    ASSERT_LT(s.expert, l.experts) << what;
    EXPECT_EQ(s.expert_begin, offsets[static_cast<size_t>(s.expert)]) << what;
    EXPECT_EQ(s.expert_end, offsets[static_cast<size_t>(s.expert + 1)]) << what;
    ASSERT_LT(s.row_begin, s.row_end) << what << " block " << b;
    ASSERT_LE(s.row_end - s.row_begin, l.bm) << what;
    ASSERT_LE(s.expert_begin + s.row_end, s.expert_end) << what << " block " << b << " leaves its expert";
    ASSERT_EQ(s.row_begin % l.bm, 0) << what;
    ASSERT_EQ(s.col_begin % l.bn, 0) << what;
    ASSERT_LT(s.col_begin, s.col_end) << what;
    ASSERT_LE(s.col_end, l.n) << what;
    for (int64_t r = s.expert_begin + s.row_begin; r < s.expert_begin + s.row_end; ++r) {
      ++covered[static_cast<size_t>(r * tiles_n + s.col_begin / l.bn)];
    }
  }
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t t = 0; t < tiles_n; ++t) {
      ASSERT_EQ(covered[static_cast<size_t>(r * tiles_n + t)], 1) << what << ": row " << r << " column tile " << t;
    }
  }
}

// Inner split: for each expert with rows, every (row tile, column tile) of dw[e] [m, n] once; none for an expert
// without rows (its dw stays as it was).
void check_inner_split(const Layout& l, int64_t m, const std::vector<int32_t>& offsets, const std::string& what) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, int> covered;
  const int64_t blocks = g::inner_split_blocks(l.experts, m, l.n, l.bm, l.bn);
  for (int64_t b = 0; b < blocks; ++b) {
    g::TileSpan s;
    if (!g::inner_split_tile(b, offsets.data(), l.experts, l.rows, m, l.n, l.bm, l.bn, s)) continue;
    ASSERT_GE(s.expert, 0) << what;
    ASSERT_LT(s.expert, l.experts) << what;
    ASSERT_LT(s.expert_begin, s.expert_end) << what << " block " << b << ": an expert without rows";
    ASSERT_LE(s.expert_end, l.rows) << what;
    ASSERT_LT(s.row_begin, s.row_end) << what;
    ASSERT_LE(s.row_end, m) << what;
    ASSERT_LT(s.col_begin, s.col_end) << what;
    ASSERT_LE(s.col_end, l.n) << what;
    ++covered[{s.expert, s.row_begin, s.col_begin}];
  }
  for (int64_t e = 0; e < l.experts; ++e) {
    const bool has_rows = offsets[static_cast<size_t>(e + 1)] > offsets[static_cast<size_t>(e)];
    for (int64_t r = 0; r < m; r += l.bm) {
      for (int64_t c = 0; c < l.n; c += l.bn) {
        const auto it = covered.find({e, r, c});
        const int count = it == covered.end() ? 0 : it->second;
        ASSERT_EQ(count, has_rows ? 1 : 0) << what << ": expert " << e << " tile (" << r << ", " << c << ")";
      }
    }
  }
}

TEST(GroupedGemmSchedule, EveryTileOnceForRandomOffsets) {
  Rng rng(1401);
  // rows, experts, columns, and both kernels' tiles (128 × 128 tensor cores, 64 × 64 fp32).
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 1, 1},     {1, 5, 20},    {31, 5, 37},    {129, 5, 200},   {1000, 16, 136},
      {2048, 8, 896}, {8192, 128, 192}, {300, 400, 24}, {16384, 8, 130}, {5, 3, 128}};
  for (const auto& [rows, experts, n] : shapes) {
    for (const auto& [bm, bn] : std::vector<std::pair<int64_t, int64_t>>{{128, 128}, {64, 64}}) {
      for (int draw = 0; draw < 3; ++draw) {
        const Layout l{rows, experts, n, bm, bn};
        const std::vector<int32_t> offsets = random_offsets(rows, experts, rng);
        const std::string what = "rows " + std::to_string(rows) + " experts " + std::to_string(experts) + " n " +
                                 std::to_string(n) + " tile " + std::to_string(bm) + " draw " + std::to_string(draw);
        check_rows_split(l, offsets, what);
        check_inner_split(l, 72, offsets, what + " (inner)");
      }
    }
  }
}

TEST(GroupedGemmSchedule, TileStartsAndExpertLookup) {
  // Experts of 0, 1, 128, 129, 0, 300 rows over tiles of 128: 0, 1, 1, 2, 0, 3 tiles.
  const std::vector<int32_t> offsets = {0, 0, 1, 129, 258, 258, 558};
  std::vector<int64_t> starts(7);
  g::row_tile_starts(offsets.data(), 6, 558, 128, starts.data());
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 0, 1, 2, 4, 4, 7}));
  const std::vector<int64_t> owner = {1, 2, 3, 3, 5, 5, 5};
  for (int64_t tm = 0; tm < 7; ++tm) EXPECT_EQ(g::expert_of_row_tile(starts.data(), 6, tm), owner[tm]) << tm;
  EXPECT_EQ(g::expert_of_row_tile(starts.data(), 6, 7), -1);
  EXPECT_EQ(g::expert_of_row_tile(starts.data(), 6, 1000), -1);
  EXPECT_LE(starts[6], g::row_tiles_bound(558, 6, 128));
}

TEST(GroupedGemmSchedule, OffsetsOutsideTheRowsAreClampedNeverReadPast) {
  // Not ascending, negative and past M: every expert's span stays inside [0, M] and the tiles inside it.
  const std::vector<int32_t> offsets = {0, 50, 20, -7, 400, 90};
  const Layout l{90, 5, 40, 64, 64};
  std::vector<int64_t> starts(6);
  g::row_tile_starts(offsets.data(), l.experts, l.rows, l.bm, starts.data());
  EXPECT_LE(starts[5], g::row_tiles_bound(l.rows, l.experts, l.bm));
  for (int64_t b = 0; b < g::rows_split_blocks(l.rows, l.experts, l.n, l.bm, l.bn); ++b) {
    g::TileSpan s;
    if (!g::rows_split_tile(b, offsets.data(), starts.data(), l.experts, l.rows, l.n, l.bm, l.bn, s)) continue;
    EXPECT_GE(s.expert_begin, 0);
    EXPECT_LE(s.expert_begin + s.row_end, l.rows);
    EXPECT_LE(s.expert_begin + s.row_end, s.expert_end);
  }
  for (int64_t b = 0; b < g::inner_split_blocks(l.experts, 72, l.n, l.bm, l.bn); ++b) {
    g::TileSpan s;
    if (!g::inner_split_tile(b, offsets.data(), l.experts, l.rows, 72, l.n, l.bm, l.bn, s)) continue;
    EXPECT_GE(s.expert_begin, 0);
    EXPECT_LE(s.expert_end, l.rows);
    EXPECT_LT(s.expert_begin, s.expert_end);
  }
}

TEST(GroupedGemmSchedule, GroupedOrderIsAPermutationOfTheTiles) {
  for (const auto& [tiles_m, tiles_n] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 3}, {8, 5}, {17, 12}, {1152, 12}}) {
    std::vector<int> seen(static_cast<size_t>(tiles_m * tiles_n), 0);
    for (int64_t local = 0; local < tiles_m * tiles_n; ++local) {
      int64_t tm = -1, tn = -1;
      g::grouped_order(local, tiles_m, tiles_n, tm, tn);
      ASSERT_GE(tm, 0);
      ASSERT_LT(tm, tiles_m);
      ASSERT_GE(tn, 0);
      ASSERT_LT(tn, tiles_n);
      ++seen[static_cast<size_t>(tm * tiles_n + tn)];
    }
    for (const int s : seen) ASSERT_EQ(s, 1) << tiles_m << " × " << tiles_n;
  }
}

}  // namespace
}  // namespace primus
