// The tensor-core tile of the grouped GEMM (backend/cuda/kernels/grouped_gemm_tile.h) replayed on the CPU: operand
// chunks placed in shared memory as load_stage does, ldmatrix (plain and .trans) and mma.sync m16n8k16 written out
// from the PTX ISA's descriptions of their fragments, and the epilogue's accumulator positions; the block tile must
// equal A·B on every element inside the matrix, each written once, for the three operand layouts of the kernel
// (forward: A and B K-major; dgrad: B N-major; wgrad: A M-major, B N-major), on full and partial tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/grouped_gemm_tile.h"
#include "core/rng.h"

namespace primus {
namespace {

namespace g = cuda::grouped;

// A matrix of `rows` × `cols` logical elements stored with one of its dimensions adjacent in memory.
struct Operand {
  std::vector<double> data;
  int64_t ld;
  bool k_major;  // element (r, k) at r·ld + k; else at k·ld + r
  double at(int64_t r, int64_t k) const { return data[static_cast<size_t>(k_major ? r * ld + k : k * ld + r)]; }
};

Operand random_operand(int64_t rows, int64_t k, bool k_major, Rng& rng) {
  Operand o{{}, (k_major ? k : rows) + 8, k_major};  // row length past the extent: strides are honoured
  o.data.resize(static_cast<size_t>(o.ld * (k_major ? rows : k)));
  for (double& v : o.data) v = rng.normal();
  return o;
}

// One stage: every chunk of the tile (all threads' together) at its shared offset, zeros outside the matrix.
std::vector<double> stage(const Operand& op, int rows, int64_t first, int64_t extent, int64_t k0, int64_t k) {
  std::vector<double> s(static_cast<size_t>(g::stage_elems(op.k_major, rows)), std::nan(""));
  for (int chunk = 0; chunk < rows * g::kBK / 8; ++chunk) {
    const g::ChunkPlace p = g::chunk_place(op.k_major, rows, chunk);
    const int64_t gr = first + p.row, gk = k0 + p.k;
    for (int q = 0; q < 8; ++q) {  // the chunk's 8 elements run along the contiguous dimension
      const bool valid = gr < extent && gk < k;
      s[static_cast<size_t>(p.offset + q)] = !valid ? 0.0 : op.k_major ? op.at(gr, gk + q) : op.at(gr + q, gk);
    }
  }
  return s;
}

// ldmatrix .x4 (PTX ISA): lanes 8j..8j+7 give the shared offsets of rows 0..7 of matrix j; lane L receives, per
// matrix, row L/4, elements 2(L%4) and 2(L%4)+1; with .trans, elements (2(L%4), L/4) and (2(L%4)+1, L/4) instead.
struct Fragment {
  double v[32][4][2];
};
template <typename OffsetOf>
Fragment ldmatrix(const std::vector<double>& s, OffsetOf offset_of, bool trans) {
  Fragment f{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int j = 0; j < 4; ++j) {
      for (int q = 0; q < 2; ++q) {
        const int row = trans ? 2 * (lane % 4) + q : lane / 4, col = trans ? lane / 4 : 2 * (lane % 4) + q;
        f.v[lane][j][q] = s[static_cast<size_t>(offset_of(8 * j + row) + col)];
      }
    }
  }
  return f;
}

// mma.sync.m16n8k16 (PTX ISA fragment layouts), g = lane/4, t = lane%4: A registers 0–3 hold (g, 2t..2t+1),
// (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); B registers 0–1 hold (k 2t..2t+1, n g), (k 2t+8.., n g); C holds
// (g, 2t..2t+1) then (g+8, 2t..2t+1). B's two registers are matrices b_first and b_first + 1 of b.
void mma(double (&acc)[32][4], const Fragment& a, const Fragment& b, int b_first) {
  double am[16][16], bm[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int gg = lane / 4, t = lane % 4;
    for (int q = 0; q < 2; ++q) {
      am[gg][2 * t + q] = a.v[lane][0][q];
      am[gg + 8][2 * t + q] = a.v[lane][1][q];
      am[gg][2 * t + 8 + q] = a.v[lane][2][q];
      am[gg + 8][2 * t + 8 + q] = a.v[lane][3][q];
      bm[2 * t + q][gg] = b.v[lane][b_first][q];
      bm[2 * t + 8 + q][gg] = b.v[lane][b_first + 1][q];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int gg = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      for (int q = 0; q < 2; ++q) {
        double sum = 0.0;
        for (int kk = 0; kk < 16; ++kk) sum += am[gg + 8 * h][kk] * bm[kk][2 * t + q];
        acc[lane][2 * h + q] += sum;
      }
    }
  }
}

// The block tile at (row0, col0) of C [m, n] = A [m, k] · B [k, n], as the kernel computes it.
void check_tile(bool a_k_major, bool b_k_major, int64_t m, int64_t n, int64_t k, int64_t row0, int64_t col0,
                Rng& rng) {
  const std::string what = std::string("A ") + (a_k_major ? "K" : "M") + "-major, B " + (b_k_major ? "K" : "N") +
                           "-major, m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) +
                           " at (" + std::to_string(row0) + ", " + std::to_string(col0) + ")";
  const Operand a = random_operand(m, k, a_k_major, rng);
  const Operand b = random_operand(n, k, b_k_major, rng);  // B(k, n) stored as rows of n
  static double acc[8][g::kFragM][g::kFragN][32][4];
  for (auto& w : acc) {
    for (auto& i : w) {
      for (auto& j : i) {
        for (auto& l : j) {
          for (double& v : l) v = 0.0;
        }
      }
    }
  }
  for (int64_t k0 = 0; k0 < k; k0 += g::kBK) {
    const std::vector<double> sa = stage(a, g::kBM, row0, m, k0, k), sb = stage(b, g::kBN, col0, n, k0, k);
    for (int warp = 0; warp < g::kThreads / 32; ++warp) {
      for (int kk = 0; kk < g::kBK; kk += 16) {
        for (int i = 0; i < g::kFragM; ++i) {
          const int m0 = g::warp_row(warp) + i * 16;
          const Fragment af = ldmatrix(sa, [&](int lane) { return g::a_fragment_offset(a_k_major, m0, kk, lane); },
                                       !a_k_major);
          for (int j = 0; j < g::kFragN; j += 2) {
            const int n0 = g::warp_col(warp) + j * 8;
            const Fragment bf = ldmatrix(sb, [&](int lane) { return g::b_fragment_offset(b_k_major, n0, kk, lane); },
                                         !b_k_major);
            mma(acc[warp][i][j], af, bf, 0);
            mma(acc[warp][i][j + 1], af, bf, 2);
          }
        }
      }
    }
  }
  std::vector<int> written(static_cast<size_t>(g::kBM * g::kBN), 0);
  double worst = 0.0;
  for (int warp = 0; warp < g::kThreads / 32; ++warp) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < g::kFragM; ++i) {
        for (int h = 0; h < 2; ++h) {
          for (int j = 0; j < g::kFragN; ++j) {
            for (int q = 0; q < 2; ++q) {
              const int r = g::accumulator_row(warp, i, h, lane), c = g::accumulator_col(warp, j, lane) + q;
              ASSERT_GE(r, 0);
              ASSERT_LT(r, g::kBM);
              ASSERT_GE(c, 0);
              ASSERT_LT(c, g::kBN);
              ++written[static_cast<size_t>(r * g::kBN + c)];
              if (row0 + r >= m || col0 + c >= n) continue;
              double want = 0.0;
              for (int64_t p = 0; p < k; ++p) want += a.at(row0 + r, p) * b.at(col0 + c, p);
              worst = std::max(worst, std::fabs(acc[warp][i][j][lane][2 * h + q] - want));
            }
          }
        }
      }
    }
  }
  for (const int w : written) ASSERT_EQ(w, 1) << what << ": an accumulator position held twice or never";
  EXPECT_LT(worst, 1e-9) << what;
}

TEST(GroupedGemmTile, LdmatrixMmaAndEpilogueGiveTheProduct) {
  Rng rng(2214);
  for (const auto& [a_k, b_k] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, false}}) {
    check_tile(a_k, b_k, 128, 128, 64, 0, 0, rng);    // a full tile, two stages
    check_tile(a_k, b_k, 150, 136, 40, 128, 128, rng);  // 22 rows, 8 columns, the second stage partly filled
    check_tile(a_k, b_k, 300, 200, 8, 128, 0, rng);    // a middle row tile, one partial stage
  }
}

}  // namespace
}  // namespace primus
