// Expert capacity (token dropping): which routing entries each expert keeps. backend.h (MoeCapacityArgs) states the
// rule and src/backend/cpu/moe.cpp is the reference: per expert, its entries in entry order, stably sorted by
// descending weight (policy probs) or left in entry order (policy position); the first `capacity` are kept.
//
// How: one stable radix sort of every entry by a 64-bit key, the expert in the high 32 bits and (policy probs) the
// weight mapped to an unsigned order that descends with it in the low 32 bits; the values are the entry indices in
// ascending order, so equal keys keep entry order, the CPU's stable_sort tie rule. In the sorted order each expert's
// entries are contiguous, best first, so the entry at sorted position p is kept iff fewer than `capacity` entries of
// its expert precede it, i.e. p < capacity or the entry `capacity` places earlier belongs to another expert. No
// per-expert counts or offsets are formed and nothing is read back to the host.
//
// Why a global radix sort rather than a segmented sort or a per-expert rank: its cost depends only on the entry count
// and the key bits (32 + bit_width(E), five 8-bit passes at E = 128), never on how the entries spread over experts,
// so the skewed routing of early training (one expert holding most of Qwen3-30B-A3B's 131,072 entries) costs what
// balanced routing does. A per-expert rank by comparison is quadratic in the largest expert's entries, and a
// segmented sort needs the counts first and balances its work by segment size.
//
// Padding to capacity (moe_pad_rows / moe_unpad_rows): one block per output row, which finds its expert from the
// offsets on the device (pad: row / P; unpad: a binary search of the L + 1 offsets), so the host never learns the
// counts; an expert above P rows is recorded for the host and its extra rows are not moved (unpad: zero rows).
//
// Weights: -0.0 is folded into +0.0 (the CPU's `>` sees them equal); a NaN weight, which the routers never produce
// and for which the CPU's order is unspecified, sorts after every number.
#include <bit>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWeightBits = 32;  // the low bits of a key: the weight's order

// An unsigned key that ascends as the weight descends.
__device__ __forceinline__ uint32_t descending_weight_key(float w) {
  if (isnan(w)) return 0xFFFFFFFFu;  // after every number
  uint32_t bits = __float_as_uint(w);
  if ((bits & 0x7FFFFFFFu) == 0) bits = 0;  // -0.0 → +0.0 (on the bits: no compiler may fold it away)
  // The usual map of IEEE floats to ascending unsigned order: negative values flip all bits, positive ones the sign.
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
  return ~ascending;
}

// keys[i] = (expert << 32) | weight order (0 by position), entries[i] = i. An expert outside [0, E) is recorded for
// the host and sorted as E (dropped).
__global__ void capacity_keys_kernel(const int32_t* __restrict__ topk_experts, const float* __restrict__ weights,
                                     uint64_t* __restrict__ keys, int32_t* __restrict__ entries, int64_t m,
                                     int64_t experts, bool by_position, DeviceError* error) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = topk_experts[i];
    const bool valid = e >= 0 && e < experts;
    if (!valid) record_error(error, kMoeCapacityExpert, i, e, experts);
    const uint64_t expert = static_cast<uint64_t>(valid ? e : experts);
    keys[i] = (expert << kWeightBits) | (by_position ? 0u : descending_weight_key(weights[i]));
    entries[i] = static_cast<int32_t>(i);
  }
}

// Sorted position p holds entry sorted_entries[p] of expert sorted_keys[p] >> 32: kept (its expert) when fewer than
// `capacity` of that expert's entries precede it, else dropped (E). Each entry has exactly one writer.
__global__ void capacity_keep_kernel(const uint64_t* __restrict__ sorted_keys,
                                     const int32_t* __restrict__ sorted_entries, int32_t* __restrict__ kept, int64_t m,
                                     int64_t experts, int64_t capacity) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < m;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t expert = sorted_keys[p] >> kWeightBits;
    const bool within = expert < static_cast<uint64_t>(experts) &&
                        (p < capacity || (sorted_keys[p - capacity] >> kWeightBits) != expert);
    kept[sorted_entries[p]] = static_cast<int32_t>(within ? expert : static_cast<uint64_t>(experts));
  }
}

// padded row r = l·P + j: row offsets[l] + j of rows when j < n_l, else zero.
template <typename T>
__global__ void pad_rows_kernel(const T* __restrict__ rows, const int32_t* __restrict__ offsets, T* __restrict__ padded,
                                int64_t per_expert, int64_t channels, DeviceError* error) {
  const int64_t r = blockIdx.x, l = r / per_expert, j = r % per_expert;
  const int64_t start = offsets[l], n = offsets[l + 1] - start;
  if (j == 0 && threadIdx.x == 0 && n > per_expert) record_error(error, kMoePadRows, l, n, per_expert + 1);
  T* dst = padded + r * channels;
  if (j < n) {
    const T* src = rows + (start + j) * channels;
    for (int64_t col = threadIdx.x; col < channels; col += blockDim.x) dst[col] = src[col];
  } else {
    for (int64_t col = threadIdx.x; col < channels; col += blockDim.x) dst[col] = T{};
  }
}

// rows row i of expert l (offsets[l] ≤ i < offsets[l + 1]) = padded row l·P + (i − offsets[l]); a row past its
// expert's P (reported by the pad) or past offsets[L] is zero.
template <typename T>
__global__ void unpad_rows_kernel(const T* __restrict__ padded, const int32_t* __restrict__ offsets,
                                  T* __restrict__ rows, int64_t local, int64_t per_expert, int64_t channels) {
  const int64_t i = blockIdx.x;
  int64_t lo = 0, hi = local;  // the last l in [0, L) with offsets[l] ≤ i
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (offsets[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int64_t j = i - offsets[lo];
  const bool inside = i < offsets[local] && j < per_expert;
  T* dst = rows + i * channels;
  const T* src = padded + (lo * per_expert + j) * channels;
  for (int64_t col = threadIdx.x; col < channels; col += blockDim.x) dst[col] = inside ? src[col] : T{};
}

constexpr int kPadThreads = 256;

}  // namespace

template <typename T>
void moe_pad_rows(const KernelContext& ctx, const T* rows, const int32_t* offsets, T* padded, int64_t local,
                  int64_t per_expert, int64_t channels) {
  if (local * per_expert == 0 || channels == 0) return;
  pad_rows_kernel<T><<<static_cast<unsigned>(local * per_expert), row_threads(channels, kPadThreads), 0, ctx.stream>>>(
      rows, offsets, padded, per_expert, channels, ctx.error);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void moe_unpad_rows(const KernelContext& ctx, const T* padded, const int32_t* offsets, T* rows, int64_t rows_count,
                    int64_t local, int64_t per_expert, int64_t channels) {
  if (rows_count == 0 || channels == 0) return;
  unpad_rows_kernel<T><<<static_cast<unsigned>(rows_count), row_threads(channels, kPadThreads), 0, ctx.stream>>>(
      padded, offsets, rows, local, per_expert, channels);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

#define PRIMUS_MOE_PAD(T)                                                                                        \
  template void moe_pad_rows<T>(const KernelContext&, const T*, const int32_t*, T*, int64_t, int64_t, int64_t);  \
  template void moe_unpad_rows<T>(const KernelContext&, const T*, const int32_t*, T*, int64_t, int64_t, int64_t, \
                                  int64_t);
PRIMUS_MOE_PAD(float)
PRIMUS_MOE_PAD(bf16)
#undef PRIMUS_MOE_PAD

void moe_capacity(const KernelContext& ctx, const int32_t* topk_experts, const float* topk_weights, int64_t entries,
                  int64_t experts, int64_t capacity, bool by_position, int32_t* kept_experts) {
  if (entries == 0) return;
  const size_t key_bytes = static_cast<size_t>(entries) * sizeof(uint64_t);
  const size_t index_bytes = static_cast<size_t>(entries) * sizeof(int32_t);
  DeviceBuffer keys_in(*ctx.allocator, key_bytes);
  DeviceBuffer keys_out(*ctx.allocator, key_bytes);
  DeviceBuffer entries_in(*ctx.allocator, index_bytes);
  DeviceBuffer entries_out(*ctx.allocator, index_bytes);
  capacity_keys_kernel<<<grid_for(entries, kThreads), kThreads, 0, ctx.stream>>>(
      topk_experts, topk_weights, keys_in.as<uint64_t>(), entries_in.as<int32_t>(), entries, experts, by_position,
      ctx.error);
  PRIMUS_CUDA_CHECK_LAUNCH();
  // Only the bits that can differ: the expert in [0, E] above, the weight order below (by position: all zero).
  const int begin_bit = by_position ? kWeightBits : 0;
  const int end_bit = kWeightBits + std::bit_width(static_cast<uint64_t>(experts));
  const int items = static_cast<int>(entries);
  size_t temp_bytes = 0;
  PRIMUS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<uint64_t>(),
                                                    keys_out.as<uint64_t>(), entries_in.as<int32_t>(),
                                                    entries_out.as<int32_t>(), items, begin_bit, end_bit, ctx.stream));
  DeviceBuffer temp(*ctx.allocator, temp_bytes);
  PRIMUS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in.as<uint64_t>(),
                                                    keys_out.as<uint64_t>(), entries_in.as<int32_t>(),
                                                    entries_out.as<int32_t>(), items, begin_bit, end_bit, ctx.stream));
  capacity_keep_kernel<<<grid_for(entries, kThreads), kThreads, 0, ctx.stream>>>(
      keys_out.as<uint64_t>(), entries_out.as<int32_t>(), kept_experts, entries, experts, capacity);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace primus::cuda
