// The data plan of the Hopper grouped GEMM (backend/cuda/kernels/grouped_gemm_wgmma_plan.h) replayed on the CPU.
// A whole launch runs as the kernel runs it: the schedule's blocks, each k block's TMA boxes cut from the tensors as
// the tensor maps describe them (elements outside a tensor read as zero), placed in a stage at the kernel's box
// offsets, wgrad's rows past the expert zeroed, every wgmma k16 step reading A and B through its descriptor's
// canonical layout (start, LBO, SBO as the plan encodes them), the accumulators mapped to C by the PTX ISA's
// fragment layout and stored under the epilogue's masks. The result must equal the plain product on every element,
// each written once (forward, dgrad) or added once (wgrad), for problems with partial row, column and k tiles, empty
// and one-row experts, and tiles that straddle experts. The 128-byte swizzle is left out: TMA and wgmma apply the
// same permutation to the same addresses, which the plan keeps 1024-byte aligned (checked here).
// Also: the tensor maps obey cuTensorMapEncodeTiled's rules, the descriptor bits, refusal() and parse_choice().
#include "backend/cuda/kernels/grouped_gemm_wgmma_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"

namespace primus {
namespace {

namespace g = cuda::grouped;
namespace wg = cuda::grouped::wgmma;

// A bf16 tensor as TMA sees it: elements in memory, addressed through a map's dims and byte strides.
struct Global {
  const std::vector<double>* data;
  wg::OperandMap map;
  // The element at coordinates (c0, c1, c2), zero outside the tensor (TMA's fill with OOB_FILL_NONE).
  double at(int64_t c0, int64_t c1, int64_t c2) const {
    const int64_t c[3] = {c0, c1, c2};
    for (int d = 0; d < 3; ++d) {
      if (c[d] < 0 || c[d] >= static_cast<int64_t>(map.dims[d])) return 0.0;
    }
    const int64_t index =
        c0 + c1 * static_cast<int64_t>(map.strides_bytes[0] / 2) + c2 * static_cast<int64_t>(map.strides_bytes[1] / 2);
    return (*data)[static_cast<size_t>(index)];
  }
};

// One TMA box into shared memory (element-indexed: byte offset / 2), innermost dimension fastest, as TMA lays a box
// out before the swizzle.
void load_box(const Global& t, const wg::BoxCoord& at, std::vector<double>& shared, int offset_bytes) {
  ASSERT_EQ(offset_bytes % wg::kBoxAlign, 0) << "boxes must start on 1024-byte boundaries for the swizzle";
  const wg::OperandMap& m = t.map;
  int64_t i = offset_bytes / 2;
  for (uint32_t c2 = 0; c2 < m.box[2]; ++c2) {
    for (uint32_t c1 = 0; c1 < m.box[1]; ++c1) {
      for (uint32_t c0 = 0; c0 < m.box[0]; ++c0) {
        shared[static_cast<size_t>(i++)] = t.at(at.c[0] + c0, at.c[1] + c1, at.c[2] + c2);
      }
    }
  }
}

struct Problem {
  wg::Extents e;
  std::vector<int32_t> offsets;
  std::vector<double> x, w, dy;  // [rows, in], [experts, out, in], [rows, out]
};

Problem random_problem(int64_t experts, int64_t in, int64_t out, const std::vector<int32_t>& counts, Rng& rng) {
  Problem p;
  p.offsets.assign(1, 0);
  for (const int32_t c : counts) p.offsets.push_back(p.offsets.back() + c);
  p.e = {p.offsets.back(), experts, in, out};
  const auto fill = [&](std::vector<double>& v, int64_t n) {
    v.resize(static_cast<size_t>(n));
    for (double& x : v) x = rng.normal();
  };
  fill(p.x, p.e.rows * in);
  fill(p.w, experts * out * in);
  fill(p.dy, p.e.rows * out);
  return p;
}

// The PTX ISA's fragment layout of wgmma's fp32 D (m64nNk16), written out: warp w of the warpgroup holds rows
// 16w..16w+15; within a warp, register 4j + h·2 + q of lane l is row l / 4 + 8h, column 8j + 2(l % 4) + q.
void fragment_position(int thread, int reg, int& row, int& col) {
  const int warp = thread / 32, lane = thread % 32, j = reg / 4, h = reg % 4 / 2, q = reg % 2;
  row = 16 * warp + lane / 4 + 8 * h;
  col = 8 * j + 2 * (lane % 4) + q;
}

// C of the replayed launch: y [rows, out], dx [rows, in] or dw [experts, out, in] (dw starts from `initial`).
// written counts the stores of each element.
std::vector<double> replay(wg::Form form, const Problem& p, const std::vector<double>& initial,
                           std::vector<int>& written) {
  const wg::Extents& e = p.e;
  const int32_t* offsets = p.offsets.data();
  const std::vector<double>& a_data = form == wg::Form::kForward ? p.x : p.dy;
  const std::vector<double>& b_data = form == wg::Form::kWgrad ? p.x : p.w;
  const Global a{&a_data, wg::a_map(form, e)}, b{&b_data, wg::b_map(form, e)};
  const int64_t m = e.out, n = form == wg::Form::kForward ? e.out : e.in;
  const int64_t ldc = n;
  std::vector<double> c = initial;
  written.assign(c.size(), 0);

  std::vector<int64_t> starts(static_cast<size_t>(e.experts + 1));
  g::row_tile_starts(offsets, e.experts, e.rows, wg::kBM, starts.data());
  const int64_t blocks = wg::rows_split(form) ? g::rows_split_blocks(e.rows, e.experts, n, wg::kBM, wg::kBN)
                                              : g::inner_split_blocks(e.experts, m, n, wg::kBM, wg::kBN);
  std::vector<double> shared(static_cast<size_t>(wg::kStageBytes / 2));
  std::vector<double> acc(static_cast<size_t>(wg::kConsumers * 64 * wg::kBN));
  const bool ak = wg::a_k_major(form), bk = wg::b_k_major(form);
  for (int64_t block = 0; block < blocks; ++block) {
    g::TileSpan span;
    const bool has =
        wg::rows_split(form)
            ? g::rows_split_tile(block, offsets, starts.data(), e.experts, e.rows, n, wg::kBM, wg::kBN, span)
            : g::inner_split_tile(block, offsets, e.experts, e.rows, m, n, wg::kBM, wg::kBN, span);
    if (!has) continue;
    const int64_t inner = wg::inner_extent(form, span, e);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t kb = 0; kb * wg::kBK < inner; ++kb) {
      std::fill(shared.begin(), shared.end(), std::nan(""));  // anything no box writes would poison the sums
      for (int j = 0; j < wg::a_boxes(form); ++j)
        load_box(a, wg::a_box(form, span, kb, j), shared, j * wg::a_box_bytes(form));
      for (int j = 0; j < wg::b_boxes(form); ++j) {
        load_box(b, wg::b_box(form, span, kb, j), shared, wg::kABytes + j * wg::b_box_bytes(form));
      }
      const int valid = wg::valid_k_rows(inner, kb);
      if (form == wg::Form::kWgrad && valid < wg::kBK) {  // zero_rows_past: rows [valid, kBK) of every box
        const int boxes = wg::a_boxes(form) + wg::b_boxes(form);
        for (int box = 0; box < boxes; ++box) {
          const int base = box < wg::a_boxes(form) ? box * wg::a_box_bytes(form)
                                                   : wg::kABytes + (box - wg::a_boxes(form)) * wg::b_box_bytes(form);
          for (int row = valid; row < wg::kBK; ++row) {
            for (int byte = 0; byte < wg::kLineBytes; byte += 2)
              shared[static_cast<size_t>((base + row * wg::kLineBytes + byte) / 2)] = 0.0;
          }
        }
      }
      for (int consumer = 0; consumer < wg::kConsumers; ++consumer) {
        for (int step = 0; step < wg::kBK / wg::kStep; ++step) {
          const uint32_t da = wg::a_consumer_bytes(consumer) + wg::step_bytes(ak, step);
          const uint32_t db = static_cast<uint32_t>(wg::kABytes) + wg::step_bytes(bk, step);
          // The descriptors the kernel builds must encode these starts and the plan's strides.
          const uint64_t desc_a = wg::smem_descriptor(da, wg::lbo(ak), wg::kSbo);
          EXPECT_EQ(desc_a & 0x3FFF, da >> 4);
          for (int r = 0; r < 64; ++r) {
            double* row = &acc[static_cast<size_t>((consumer * 64 + r) * wg::kBN)];
            for (int k = 0; k < wg::kStep; ++k) {
              const double av = shared[static_cast<size_t>((da + wg::canonical_offset(ak, r, k)) / 2)];
              for (int col = 0; col < wg::kBN; ++col) {
                row[col] += av * shared[static_cast<size_t>((db + wg::canonical_offset(bk, col, k)) / 2)];
              }
            }
          }
        }
      }
    }
    // Epilogue: each consumer thread's register pairs under the masks.
    const int64_t c_base = wg::rows_split(form) ? span.expert_begin * ldc : span.expert * e.out * e.in;
    for (int consumer = 0; consumer < wg::kConsumers; ++consumer) {
      for (int thread = 0; thread < wg::kWarpgroup; ++thread) {
        for (int i = 0; i < wg::kAccumulators; ++i) {
          int fr = 0, fc = 0;
          fragment_position(thread, i, fr, fc);
          EXPECT_EQ(wg::accumulator_row(thread, i), fr);
          EXPECT_EQ(wg::accumulator_col(thread, i), fc);
          const int64_t row = span.row_begin + consumer * 64 + fr, col = span.col_begin + fc;
          if (row >= span.row_end || col >= span.col_end) continue;
          const auto at = static_cast<size_t>(c_base + row * ldc + col);
          const double v = acc[static_cast<size_t>((consumer * 64 + fr) * wg::kBN + fc)];
          c[at] = form == wg::Form::kWgrad ? c[at] + v : v;
          ++written[at];
        }
      }
    }
  }
  return c;
}

// The plain product of each form, in double.
std::vector<double> reference(wg::Form form, const Problem& p, const std::vector<double>& initial) {
  const wg::Extents& e = p.e;
  std::vector<double> c = initial;
  for (int64_t x = 0; x < e.experts; ++x) {
    for (int64_t r = p.offsets[static_cast<size_t>(x)]; r < p.offsets[static_cast<size_t>(x + 1)]; ++r) {
      for (int64_t o = 0; o < e.out; ++o) {
        for (int64_t i = 0; i < e.in; ++i) {
          const double w = p.w[static_cast<size_t>((x * e.out + o) * e.in + i)];
          const double xv = p.x[static_cast<size_t>(r * e.in + i)], dy = p.dy[static_cast<size_t>(r * e.out + o)];
          if (form == wg::Form::kForward) c[static_cast<size_t>(r * e.out + o)] += xv * w;
          if (form == wg::Form::kDgrad) c[static_cast<size_t>(r * e.in + i)] += dy * w;
          if (form == wg::Form::kWgrad) c[static_cast<size_t>((x * e.out + o) * e.in + i)] += dy * xv;
        }
      }
    }
  }
  return c;
}

void check_form(wg::Form form, const Problem& p, Rng& rng, const std::string& what) {
  const wg::Extents& e = p.e;
  const size_t size = static_cast<size_t>(
      form == wg::Form::kWgrad ? e.experts * e.out * e.in : e.rows * (form == wg::Form::kForward ? e.out : e.in));
  std::vector<double> initial(size, 0.0);
  if (form == wg::Form::kWgrad) {
    for (double& v : initial) v = rng.normal();  // dw is added to
  }
  std::vector<int> written;
  const std::vector<double> got = replay(form, p, initial, written);
  const std::vector<double> want = reference(form, p, initial);
  int64_t bad = 0, bad_writes = 0;
  for (size_t i = 0; i < size; ++i) {
    // Forward and dgrad: every element once. wgrad: once where the element's expert has rows, else never.
    int expected_writes = 1;
    if (form == wg::Form::kWgrad) {
      const auto expert = static_cast<int64_t>(i) / (e.out * e.in);
      expected_writes = p.offsets[static_cast<size_t>(expert + 1)] > p.offsets[static_cast<size_t>(expert)] ? 1 : 0;
    }
    if (written[i] != expected_writes) ++bad_writes;
    if (!(std::fabs(got[i] - want[i]) <= 1e-9 * (1.0 + std::fabs(want[i])))) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": elements differing from the plain product";
  EXPECT_EQ(bad_writes, 0) << what << ": elements not written exactly as often as expected";
}

void check_all_forms(int64_t experts, int64_t in, int64_t out, const std::vector<int32_t>& counts, uint64_t seed) {
  Rng rng(seed);
  const Problem p = random_problem(experts, in, out, counts, rng);
  const std::string shape = std::to_string(experts) + " experts, in " + std::to_string(in) + ", out " +
                            std::to_string(out) + ", rows " + std::to_string(p.e.rows);
  check_form(wg::Form::kForward, p, rng, "forward, " + shape);
  check_form(wg::Form::kDgrad, p, rng, "dgrad, " + shape);
  check_form(wg::Form::kWgrad, p, rng, "wgrad, " + shape);
}

// Partial k (136 = 2·64 + 8), n (200 < 256) and m tiles; an empty expert, a one-row one, experts that straddle row
// tiles and k blocks (64 + 1, 130).
TEST(GroupedGemmWgmmaPlan, PartialTilesEmptyAndOneRowExperts) { check_all_forms(5, 136, 200, {65, 1, 0, 130, 47}, 11); }

// Several column tiles (out 264 = 256 + 8, in 320 = 256 + 64) and an expert over two row tiles and a half.
TEST(GroupedGemmWgmmaPlan, SeveralColumnTiles) { check_all_forms(3, 320, 264, {300, 0, 9}, 12); }

// The smallest shapes the kernel takes: in = out = 8, experts of one row, a first expert without rows.
TEST(GroupedGemmWgmmaPlan, TinyShapes) { check_all_forms(4, 8, 8, {0, 1, 1, 64}, 13); }

// Exact multiples of every tile: no edge anywhere (the last expert's k ends at the tensor's end).
TEST(GroupedGemmWgmmaPlan, WholeTiles) { check_all_forms(2, 128, 256, {128, 64}, 14); }

// cuTensorMapEncodeTiled's rules (CUDA driver API, tensor map object management): rank ≤ 5, box dims in [1, 256],
// the inner box at most the 128-byte swizzle span and a multiple of 16 bytes, byte strides multiples of 16 and
// below 2^40, and every box a stage holds adding up to the stage's bytes (the mbarrier's transaction count).
TEST(GroupedGemmWgmmaPlan, TensorMapsFollowTheEncodingRules) {
  const wg::Extents shapes[] = {{131072, 128, 2048, 1536},
                                {131072, 128, 768, 2048},
                                {16384, 8, 4096, 28672},
                                {16384, 8, 14336, 4096},
                                {1, 1, 8, 8}};
  for (const wg::Extents& e : shapes) {
    for (const wg::Form form : {wg::Form::kForward, wg::Form::kDgrad, wg::Form::kWgrad}) {
      int bytes = 0;
      for (const bool is_a : {true, false}) {
        const wg::OperandMap m = is_a ? wg::a_map(form, e) : wg::b_map(form, e);
        EXPECT_TRUE(m.rank == 2 || m.rank == 3);
        EXPECT_EQ(m.box[0] * 2, static_cast<uint32_t>(wg::kLineBytes));
        for (int d = 0; d < 3; ++d) {
          EXPECT_GE(m.box[d], 1u);
          EXPECT_LE(m.box[d], 256u);
          EXPECT_GE(m.dims[d], 1u);
          if (d >= m.rank) {
            EXPECT_EQ(m.box[d], 1u);
          }
        }
        for (int d = 0; d + 1 < m.rank; ++d) {
          EXPECT_EQ(m.strides_bytes[d] % 16, 0u);
          EXPECT_LT(m.strides_bytes[d], uint64_t{1} << 40);
        }
        const int box_bytes = static_cast<int>(m.box[0] * m.box[1] * m.box[2] * 2);
        EXPECT_EQ(box_bytes, is_a ? wg::a_box_bytes(form) : wg::b_box_bytes(form));
        bytes += box_bytes * (is_a ? wg::a_boxes(form) : wg::b_boxes(form));
      }
      EXPECT_EQ(bytes, wg::kStageBytes);
    }
  }
  EXPECT_EQ(wg::kStageBytes % wg::kBoxAlign, 0);
  EXPECT_EQ(wg::kABytes % wg::kBoxAlign, 0);
  EXPECT_LE(wg::kSharedBytes, 227 * 1024);  // sm_90's opt-in shared memory per block
}

// Bit fields of the PTX ISA's matrix descriptor.
TEST(GroupedGemmWgmmaPlan, DescriptorBits) {
  const uint64_t d = wg::smem_descriptor(0x2A400 + 0x60, 8192, 1024);
  EXPECT_EQ(d & 0x3FFF, (0x2A400u + 0x60u) >> 4);
  EXPECT_EQ((d >> 16) & 0x3FFF, 8192u >> 4);
  EXPECT_EQ((d >> 32) & 0x3FFF, 1024u >> 4);
  EXPECT_EQ((d >> 49) & 0x7, 0u);  // base offset: boxes are 1024-byte aligned
  EXPECT_EQ(d >> 62, 1u);          // 128-byte swizzle
  EXPECT_EQ((d >> 14) & 0x3, 0u);
  EXPECT_EQ((d >> 30) & 0x3, 0u);
  EXPECT_EQ((d >> 46) & 0x7, 0u);
  EXPECT_EQ((d >> 52) & 0x3FF, 0u);
}

TEST(GroupedGemmWgmmaPlan, RefusalAndChoice) {
  const wg::Request ok{true, 90, 2048, 1536, true, 227 * 1024};
  EXPECT_EQ(wg::refusal(ok), nullptr);
  wg::Request r = ok;
  r.bf16 = false;
  EXPECT_NE(wg::refusal(r), nullptr);
  r = ok;
  r.compute_capability = 100;  // sm_90a code does not run on Blackwell
  EXPECT_NE(wg::refusal(r), nullptr);
  r = ok;
  r.in = 20;
  EXPECT_NE(wg::refusal(r), nullptr);
  r = ok;
  r.out = 0;
  EXPECT_NE(wg::refusal(r), nullptr);
  r = ok;
  r.pointers_aligned = false;
  EXPECT_NE(wg::refusal(r), nullptr);
  r = ok;
  r.max_shared_bytes = 100 * 1024;
  EXPECT_NE(wg::refusal(r), nullptr);

  wg::Choice c = wg::Choice::kV1;
  EXPECT_TRUE(wg::parse_choice(nullptr, c));
  EXPECT_EQ(c, wg::Choice::kAuto);
  EXPECT_TRUE(wg::parse_choice("auto", c));
  EXPECT_EQ(c, wg::Choice::kAuto);
  EXPECT_TRUE(wg::parse_choice("v1", c));
  EXPECT_EQ(c, wg::Choice::kV1);
  EXPECT_TRUE(wg::parse_choice("wgmma", c));
  EXPECT_EQ(c, wg::Choice::kWgmma);
  EXPECT_FALSE(wg::parse_choice("v2", c));
  EXPECT_FALSE(wg::parse_choice("WGMMA", c));
}

}  // namespace
}  // namespace primus
