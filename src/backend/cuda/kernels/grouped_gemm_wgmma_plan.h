// The data plan of the grouped GEMM's Hopper kernel (kernels/grouped_gemm_wgmma.cu): which shapes it takes, the
// tensor maps the TMA loads go through, the coordinates of every box a block loads, where each operand lies in
// shared memory, the wgmma shared-memory descriptors, and which output element each accumulator register holds.
// Plain C++ shared by the kernel, its host launcher and tests/ops/grouped_gemm_wgmma_plan_test.cpp, which replays
// whole launches on the CPU (TMA boxes with their zero fill, the descriptors' canonical layouts, the epilogue's
// masks) and compares them with the plain product.
//
// Block tile kBM × kBN, kBK inner per pipeline stage; one producer warpgroup (TMA) and kConsumers consumer
// warpgroups, consumer c owning rows [64c, 64c + 64) of the tile with wgmma m64 n256 k16.
// Every box row is 128 bytes (64 bf16) and every box is loaded with the 128-byte swizzle, so
//  - a K-major operand (A of forward and dgrad, B of forward) is one box [rows][64 k]: row r at byte 128 r;
//  - an M- or N-major operand (A of wgrad, B of dgrad and wgrad) is boxes [64 k][64 m or n]: box j holds m or n
//    [64 j, 64 j + 64), k row r at byte 8192 j + 128 r.
// The swizzle permutes the 16-byte chunks inside each 128-byte row by the address bits 7–9; TMA writes and wgmma
// reads apply the same permutation to the same absolute addresses, so it is invisible to this plan as long as every
// box starts on a 1024-byte boundary (kBoxAlign) and the descriptors' base-offset field stays 0.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cuda/kernels/grouped_gemm_schedule.h"

#if defined(__CUDACC__)
#define PRIMUS_WGMMA_FN __host__ __device__ constexpr inline
#else
#define PRIMUS_WGMMA_FN constexpr inline
#endif

namespace primus::cuda::grouped::wgmma {

inline constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4;
inline constexpr int kConsumers = kBM / 64;                     // warpgroups of m64
inline constexpr int kWarpgroup = 128;                          // threads
inline constexpr int kThreads = kWarpgroup * (1 + kConsumers);  // the producer warpgroup first
inline constexpr int kLineBytes = 128;                          // one swizzled box row: 64 bf16
inline constexpr int kMnBox = 64;                               // m or n of one M- or N-major box
inline constexpr int kBoxAlign = 1024;                          // the 128-byte swizzle repeats every 8 rows
inline constexpr int kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
inline constexpr int kStep = 16;                             // k of one wgmma
inline constexpr int kAccumulators = 64 * kBN / kWarpgroup;  // fp32 registers per consumer thread
inline constexpr int kSharedBytes = kStages * kStageBytes + 2 * kStages * 8 + kBoxAlign;  // + barriers, alignment

// The three products, A(m, k) · B(k, n) → C(m, n) (kernels/grouped_gemm.cu's file comment).
enum class Form : int { kForward, kDgrad, kWgrad };

PRIMUS_WGMMA_FN bool a_k_major(Form f) { return f != Form::kWgrad; }
PRIMUS_WGMMA_FN bool b_k_major(Form f) { return f == Form::kForward; }
PRIMUS_WGMMA_FN bool rows_split(Form f) { return f != Form::kWgrad; }
PRIMUS_WGMMA_FN int a_boxes(Form f) { return a_k_major(f) ? 1 : kBM / kMnBox; }
PRIMUS_WGMMA_FN int b_boxes(Form f) { return b_k_major(f) ? 1 : kBN / kMnBox; }
PRIMUS_WGMMA_FN int a_box_bytes(Form f) { return kABytes / a_boxes(f); }
PRIMUS_WGMMA_FN int b_box_bytes(Form f) { return kBBytes / b_boxes(f); }

// The problem as the maps see it: x, dx [rows, in], y, dy [rows, out], w [experts, out, in] (bf16).
struct Extents {
  int64_t rows, experts, in, out;
};

// What cuTensorMapEncodeTiled is given for one operand: dims and box innermost first, in elements; the byte
// strides of dims 1 and 2 (dim 0 is contiguous).
struct OperandMap {
  int rank;
  uint64_t dims[3];
  uint64_t strides_bytes[2];
  uint32_t box[3];
};

// A: x (forward) or dy (dgrad), rows of k; dy as [rows][out] read m-major (wgrad).
PRIMUS_WGMMA_FN OperandMap a_map(Form f, const Extents& e) {
  const auto rows = static_cast<uint64_t>(e.rows), in = static_cast<uint64_t>(e.in), out = static_cast<uint64_t>(e.out);
  if (f == Form::kForward) return {2, {in, rows, 1}, {in * 2, 0}, {kBK, kBM, 1}};
  if (f == Form::kDgrad) return {2, {out, rows, 1}, {out * 2, 0}, {kBK, kBM, 1}};
  return {2, {out, rows, 1}, {out * 2, 0}, {kMnBox, kBK, 1}};
}

// B: w as [experts][out][in] (3-D, so a box never reads past one expert's weight: the edges fill with zeros), or x
// as [rows][in] (wgrad).
PRIMUS_WGMMA_FN OperandMap b_map(Form f, const Extents& e) {
  const auto rows = static_cast<uint64_t>(e.rows), in = static_cast<uint64_t>(e.in), out = static_cast<uint64_t>(e.out),
             experts = static_cast<uint64_t>(e.experts);
  if (f == Form::kForward) return {3, {in, out, experts}, {in * 2, out * in * 2}, {kBK, kBN, 1}};
  if (f == Form::kDgrad) return {3, {in, out, experts}, {in * 2, out * in * 2}, {kMnBox, kBK, 1}};
  return {2, {in, rows, 1}, {in * 2, 0}, {kMnBox, kBK, 1}};
}

// A box's coordinates, innermost first (TMA's order), in elements.
struct BoxCoord {
  int32_t c[3];
};

// Box j of A for k block kb of the block's tile (span from grouped_gemm_schedule.h with kBM × kBN).
PRIMUS_WGMMA_FN BoxCoord a_box(Form f, const TileSpan& t, int64_t kb, int j) {
  const int64_t k = kb * kBK;
  if (f != Form::kWgrad) return {{static_cast<int32_t>(k), static_cast<int32_t>(t.expert_begin + t.row_begin), 0}};
  return {{static_cast<int32_t>(t.row_begin + j * kMnBox), static_cast<int32_t>(t.expert_begin + k), 0}};
}

PRIMUS_WGMMA_FN BoxCoord b_box(Form f, const TileSpan& t, int64_t kb, int j) {
  const int64_t k = kb * kBK;
  if (f == Form::kForward) {
    return {{static_cast<int32_t>(k), static_cast<int32_t>(t.col_begin), static_cast<int32_t>(t.expert)}};
  }
  if (f == Form::kDgrad) {
    return {{static_cast<int32_t>(t.col_begin + j * kMnBox), static_cast<int32_t>(k), static_cast<int32_t>(t.expert)}};
  }
  return {{static_cast<int32_t>(t.col_begin + j * kMnBox), static_cast<int32_t>(t.expert_begin + k), 0}};
}

// The inner extent of the block's product: in (forward), out (dgrad), the expert's rows (wgrad).
PRIMUS_WGMMA_FN int64_t inner_extent(Form f, const TileSpan& t, const Extents& e) {
  if (f == Form::kForward) return e.in;
  if (f == Form::kDgrad) return e.out;
  return t.expert_end - t.expert_begin;
}

// wgrad: k rows of block kb that belong to the expert; rows [valid, kBK) of its boxes hold the next expert's rows
// (or TMA's zero fill past the tensor) and are zeroed in shared memory before any wgmma reads them. The other forms
// need no such step: their k edge is a tensor edge, which TMA fills with zeros.
PRIMUS_WGMMA_FN int valid_k_rows(int64_t inner, int64_t kb) {
  const int64_t left = inner - kb * kBK;
  return left >= kBK ? kBK : static_cast<int>(left);
}

// ---- wgmma shared-memory descriptors (PTX ISA, "Matrix Descriptor Format") -------------------------------------
// bits 0–13 start address >> 4, 16–29 leading-dimension byte offset >> 4, 32–45 stride-dimension byte offset >> 4,
// 49–51 base offset (0: boxes are 1024-byte aligned), 62–63 swizzle (1 = 128-byte).
PRIMUS_WGMMA_FN uint64_t smem_descriptor(uint32_t address, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((address & 0x3FFFFu) >> 4) | static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16 |
         static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32 | uint64_t{1} << 62;
}

// Canonical 128-byte-swizzle layouts (before the swizzle), for an m64 (A) or n256 (B) × k16 operand:
//  K-major:  element (r, k) at start + (r / 8)·SBO + (r % 8)·128 + 2k: 8-row groups SBO = 1024 apart; the leading
//            offset is unused (k16 stays inside one 128-byte row); a k16 step moves the start by 32 bytes.
//  MN-major: element (r, k) at start + (r / 64)·LBO + 2(r % 64) + (k / 8)·SBO + (k % 8)·128: 64-wide m/n chunks
//            LBO = 8192 apart (one box each), 8-k groups SBO = 1024 apart; a k16 step moves the start by 2048.
inline constexpr uint32_t kSbo = 8 * kLineBytes;
PRIMUS_WGMMA_FN uint32_t lbo(bool k_major) { return k_major ? 16u : static_cast<uint32_t>(kMnBox * kLineBytes); }
PRIMUS_WGMMA_FN uint32_t step_bytes(bool k_major, int step) {
  return static_cast<uint32_t>(k_major ? step * kStep * 2 : step * kStep * kLineBytes);
}
// Consumer c's rows start 64 rows (K-major) or one 64-wide box (M-major) into the A stage: 8192 bytes either way.
PRIMUS_WGMMA_FN uint32_t a_consumer_bytes(int consumer) { return static_cast<uint32_t>(consumer * 64 * kLineBytes); }

// Byte offset, from the descriptor's start, of element (r, k) of its operand: the layouts above, which the
// kernel's boxes must match (the CPU test replays the product through this).
PRIMUS_WGMMA_FN uint32_t canonical_offset(bool k_major, int r, int k) {
  if (k_major) return static_cast<uint32_t>(r / 8 * kSbo + r % 8 * kLineBytes + 2 * k);
  return static_cast<uint32_t>(r / kMnBox * lbo(false) + 2 * (r % kMnBox) + k / 8 * kSbo + k % 8 * kLineBytes);
}

// ---- the accumulators (PTX ISA, wgmma D fragments of m64nNk16 with fp32) ---------------------------------------
// Register i of thread t of a consumer warpgroup holds row 16·(t / 32) + (t % 32) / 4 + 8·((i / 2) % 2) and column
// 8·(i / 4) + 2·(t % 4) + i % 2 of the consumer's 64 × kBN part; registers 2j and 2j + 1 are adjacent columns.
PRIMUS_WGMMA_FN int accumulator_row(int thread, int i) { return thread / 32 * 16 + thread % 32 / 4 + i / 2 % 2 * 8; }
PRIMUS_WGMMA_FN int accumulator_col(int thread, int i) { return i / 4 * 8 + thread % 4 * 2 + i % 2; }

// ---- which launches take it ------------------------------------------------------------------------------------

// What decides whether the kernel can run a product.
struct Request {
  bool bf16;
  int compute_capability;  // major · 10 + minor
  int64_t in, out;
  bool pointers_aligned;  // every operand 16-byte aligned (TMA's global address rule)
  int64_t max_shared_bytes;
};

// nullptr when the kernel takes the request, else why not. TMA needs 16-byte multiples for the row strides
// (in, out multiples of 8 bf16) and 16-byte aligned bases; the kernel's sm_90a code needs compute capability 9.0.
inline const char* refusal(const Request& r) {
  if (!r.bf16) return "not bf16";
  if (r.compute_capability != 90) return "not an sm_90 device";
  if (r.in <= 0 || r.out <= 0 || r.in % 8 != 0 || r.out % 8 != 0) return "in and out are not positive multiples of 8";
  if (!r.pointers_aligned) return "an operand is not 16-byte aligned";
  if (r.max_shared_bytes < kSharedBytes) return "the device has too little shared memory per block";
  return nullptr;
}

// PRIMUS_GROUPED_GEMM: unset, empty or "auto": wgmma where refusal() is nullptr, v1 elsewhere; "v1": always v1;
// "wgmma": the wgmma kernel or an error naming why not. false for any other value.
enum class Choice { kAuto, kV1, kWgmma };
inline bool parse_choice(const char* value, Choice& choice) {
  const auto same = [](const char* a, const char* b) { return std::strcmp(a, b) == 0; };
  if (value == nullptr || same(value, "") || same(value, "auto")) {
    choice = Choice::kAuto;
  } else if (same(value, "v1")) {
    choice = Choice::kV1;
  } else if (same(value, "wgmma")) {
    choice = Choice::kWgmma;
  } else {
    return false;
  }
  return true;
}

}  // namespace primus::cuda::grouped::wgmma

#undef PRIMUS_WGMMA_FN
