// Boxes of tensors (checkpoint/tensor_box.h): their strided runs, the per-tensor coverage check the sharded save
// and the catalog run, and the copy of a box's range from pieces of another layout, against a plain element-by-
// element reference over many layouts (tensor-parallel rows or columns, data-parallel flat cuts through rows).
#include "checkpoint/tensor_box.h"

#include <gtest/gtest.h>

#include <random>

namespace primus {
namespace {

// The whole-tensor flat index of element `k` of `box` (row-major over the box): the reference.
int64_t whole_index(const TensorBox& box, const Shape& whole, int64_t k) {
  int64_t index = 0;
  for (size_t d = box.shape.size(); d-- > 0;) {
    const int64_t i = k % box.shape[d];
    k /= box.shape[d];
    int64_t inner = 1;
    for (size_t j = d + 1; j < whole.size(); ++j) inner *= whole[j];
    index += (box.offset[d] + i) * inner;
  }
  return index;
}

std::vector<int64_t> elements_of(const StridedRuns& r) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < r.runs; ++k) {
    for (int64_t u = 0; u < r.run; ++u) out.push_back(r.begin + k * r.stride + u);
  }
  return out;
}

TEST(TensorBox, StridedRunsAreTheBoxsElementsInOrder) {
  const std::vector<std::pair<Shape, TensorBox>> cases = {
      {{8, 6}, {{0, 0}, {8, 6}}},           // whole: one run
      {{8, 6}, {{4, 0}, {4, 6}}},           // rows: one run
      {{8, 6}, {{0, 3}, {8, 3}}},           // columns: a run per row
      {{8, 6}, {{2, 1}, {1, 4}}},           // a piece of one row
      {{5, 3, 4}, {{2, 0, 1}, {2, 3, 1}}},  // 3-D, the middle dimension whole
      {{5, 3, 4}, {{3, 1, 0}, {1, 2, 4}}},  // 3-D, one outer index, trailing dimension whole
      {{7}, {{2}, {3}}},
      {{}, {{}, {}}},  // a scalar
  };
  for (const auto& [whole, box] : cases) {
    ASSERT_EQ(box_flaw(box, whole), "") << box.str();
    const std::vector<int64_t> got = elements_of(strided_runs(box, whole));
    ASSERT_EQ(static_cast<int64_t>(got.size()), box.numel()) << box.str();
    for (int64_t k = 0; k < box.numel(); ++k) EXPECT_EQ(got[k], whole_index(box, whole, k)) << box.str() << " " << k;
  }
}

TEST(TensorBox, FlawsNameTheBox) {
  EXPECT_NE(box_flaw({{0, 4}, {8, 3}}, {8, 6}).find("outside"), std::string::npos);
  EXPECT_NE(box_flaw({{-1, 0}, {2, 6}}, {8, 6}).find("outside"), std::string::npos);
  EXPECT_NE(box_flaw({{0}, {8}}, {8, 6}).find("dimensions"), std::string::npos);
  // A block of rows and columns is equally spaced runs (one per row); a partial middle dimension under a partial
  // outer one is not (the step between runs changes at each outer index).
  EXPECT_EQ(box_flaw({{2, 3}, {4, 3}}, {8, 6}), "");
  EXPECT_NE(box_flaw({{1, 1, 0}, {2, 2, 2}}, {5, 3, 4}).find("equally spaced"), std::string::npos);
}

TensorPiece piece(TensorBox box, int64_t begin, int64_t end, std::string owner) {
  return TensorPiece{std::move(box), begin, end, std::move(owner)};
}

TEST(TensorBox, CoverageIsEveryElementExactlyOnce) {
  const Shape whole{8, 6};
  // tp 2 along columns × dp 2 cutting each box's 24 elements at 10 (inside a row).
  const std::vector<TensorPiece> tiling = {
      piece({{0, 0}, {8, 3}}, 0, 10, "rank 0"), piece({{0, 3}, {8, 3}}, 0, 10, "rank 1"),
      piece({{0, 0}, {8, 3}}, 10, 24, "rank 2"), piece({{0, 3}, {8, 3}}, 10, 24, "rank 3")};
  EXPECT_EQ(coverage_flaw(whole, tiling), "");
  // Old checkpoints: flat ranges of the whole tensor.
  EXPECT_EQ(
      coverage_flaw(whole, {piece(TensorBox::whole(whole), 0, 20, "a"), piece(TensorBox::whole(whole), 20, 48, "b")}),
      "");

  std::vector<TensorPiece> gap = tiling;
  gap[3].begin = 12;
  EXPECT_NE(coverage_flaw(whole, gap).find("elements [10, 12) of box [0:8, 3:6] are in no piece"), std::string::npos)
      << coverage_flaw(whole, gap);
  std::vector<TensorPiece> overlap = tiling;
  overlap[2].begin = 9;
  EXPECT_NE(coverage_flaw(whole, overlap).find("overlaps rank 0's"), std::string::npos)
      << coverage_flaw(whole, overlap);
  // A replicated tensor written by both tensor-parallel ranks: the whole box twice.
  EXPECT_NE(coverage_flaw({6}, {piece({{0}, {6}}, 0, 6, "rank 0"), piece({{0}, {6}}, 0, 6, "rank 1")}).find("overlap"),
            std::string::npos);
  // Boxes that overlap, and a box missing.
  EXPECT_NE(coverage_flaw(whole, {piece({{0, 0}, {8, 4}}, 0, 32, "rank 0"), piece({{0, 3}, {8, 3}}, 0, 24, "rank 1")})
                .find("rank 1's box [0:8, 3:6] overlaps rank 0's box [0:8, 0:4]"),
            std::string::npos);
  EXPECT_NE(coverage_flaw(whole, {piece({{0, 0}, {8, 3}}, 0, 24, "rank 0")}).find("hold 24 of its 48 elements"),
            std::string::npos);
  EXPECT_NE(coverage_flaw(whole, {}).find("hold 0 of its 48"), std::string::npos);
  EXPECT_NE(coverage_flaw(whole, {piece({{0, 0}, {8, 3}}, 0, 25, "rank 0")}).find("outside its box"),
            std::string::npos);
}

// A layout of a [R, C] tensor: `tp` boxes along `dim` (or the whole tensor at tp 1), each cut by `dp` flat cuts
// at random places (so cuts fall inside rows).
std::vector<TensorPiece> layout(const Shape& whole, int tp, int dim, int dp, std::mt19937& rng) {
  std::vector<TensorPiece> pieces;
  for (int t = 0; t < tp; ++t) {
    TensorBox box = TensorBox::whole(whole);
    if (tp > 1) {
      box.shape[dim] = whole[dim] / tp;
      box.offset[dim] = t * box.shape[dim];
    }
    std::vector<int64_t> cuts{0, box.numel()};
    for (int d = 1; d < dp; ++d) cuts.push_back(std::uniform_int_distribution<int64_t>(0, box.numel())(rng));
    std::sort(cuts.begin(), cuts.end());
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      pieces.push_back(piece(box, cuts[c], cuts[c + 1], fmt::format("tp {} dp {}", t, c)));
    }
  }
  return pieces;
}

TEST(TensorBox, CopyReadsAnyRangeOfAnyBoxFromPiecesOfAnotherLayout) {
  std::mt19937 rng(7);
  const Shape whole{12, 10};
  for (int trial = 0; trial < 300; ++trial) {
    const int save_tp = std::vector<int>{1, 2}[trial % 2];
    const int save_dim = (trial / 2) % 2;
    const std::vector<TensorPiece> saved = layout(whole, save_tp, save_dim, 1 + trial % 3, rng);
    ASSERT_EQ(coverage_flaw(whole, saved), "");
    // Each piece holds, at its element k, the whole tensor's index of it.
    std::vector<std::vector<float>> data;
    std::vector<RunSource> sources;
    for (const TensorPiece& p : saved) {
      std::vector<float> values;
      for (int64_t k = p.begin; k < p.end; ++k) values.push_back(static_cast<float>(whole_index(p.box, whole, k)));
      data.push_back(std::move(values));
      sources.push_back(RunSource{strided_runs(p.box, whole), p.begin, p.end});
    }
    const int load_tp = std::vector<int>{1, 2, 5}[trial % 3];
    const int load_dim = (trial / 3) % 2;
    for (const TensorPiece& want : layout(whole, load_tp, load_dim, 2, rng)) {
      std::vector<float> got(static_cast<size_t>(want.end - want.begin), -1.0f);
      const int64_t missing = copy_box_range(strided_runs(want.box, whole), want.begin, want.end, sources,
                                             [&](size_t s, int64_t offset, int64_t count, int64_t at) {
                                               ASSERT_LE(offset + count, static_cast<int64_t>(data[s].size()));
                                               std::copy_n(data[s].begin() + offset, count, got.begin() + at);
                                             });
      ASSERT_EQ(missing, -1);
      for (int64_t k = want.begin; k < want.end; ++k) {
        ASSERT_EQ(got[static_cast<size_t>(k - want.begin)], static_cast<float>(whole_index(want.box, whole, k)))
            << "trial " << trial << ": element " << k << " of " << want.box.str();
      }
    }
  }
}

TEST(TensorBox, CopyNamesTheFirstElementNoPieceHolds) {
  const Shape whole{4, 6};
  const TensorBox left{{0, 0}, {4, 3}};
  // Only the left half: the right half's first element of its second row is missing at element 3 of [0, 12).
  const std::vector<RunSource> sources{{strided_runs(left, whole), 0, 12}};
  int64_t copied = 0;
  const int64_t missing = copy_box_range(strided_runs({{0, 0}, {2, 6}}, whole), 0, 12, sources,
                                         [&](size_t, int64_t, int64_t count, int64_t) { copied += count; });
  EXPECT_EQ(missing, 3);
  EXPECT_EQ(copied, 3);
}

}  // namespace
}  // namespace primus
