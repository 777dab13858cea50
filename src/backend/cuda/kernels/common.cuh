// Device helpers shared by the kernels: element loads/stores in fp32, deterministic warp and block
// reductions, grid sizing, and recording a data error for the host.
//
// The reductions combine values in a tree fixed by the block size, never by scheduling, so a kernel that
// launches with a fixed block size for a given shape gives the same bits on every run.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/kernels/kernels.h"
#include "core/bf16.h"

namespace primus::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// Storage type <-> fp32 compute type. bf16 widens exactly and narrows to nearest even (core/bf16.h).
__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ float load(const bf16* p) { return __uint_as_float(static_cast<uint32_t>(p->bits) << 16); }
__device__ __forceinline__ void store(bf16* p, float v) { p->bits = f32_to_bf16(v); }

// N consecutive elements at once, as 16-byte accesses when N·sizeof(T) is a multiple of 16 (p must then be
// 16-byte aligned: launchers check with vector_ok), else one element at a time (N = 1).
template <int N, typename T>
__device__ __forceinline__ void load_n(const T* p, float (&v)[N]) {
  if constexpr (N * sizeof(T) % 16 == 0) {
    constexpr int kPerChunk = 16 / sizeof(T);
#pragma unroll
    for (int c = 0; c < N / kPerChunk; ++c) {
      const uint4 raw = reinterpret_cast<const uint4*>(p)[c];
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (sizeof(T) == 4) {
          v[c * kPerChunk + k] = __uint_as_float(w[k]);
        } else {  // two bf16 per word, the lower address in the low half
          v[c * kPerChunk + 2 * k] = __uint_as_float(w[k] << 16);
          v[c * kPerChunk + 2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = load(p + i);
  }
}

template <int N, typename T>
__device__ __forceinline__ void store_n(T* p, const float (&v)[N]) {
  if constexpr (N * sizeof(T) % 16 == 0) {
    constexpr int kPerChunk = 16 / sizeof(T);
#pragma unroll
    for (int c = 0; c < N / kPerChunk; ++c) {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (sizeof(T) == 4) {
          w[k] = __float_as_uint(v[c * kPerChunk + k]);
        } else {
          w[k] = static_cast<uint32_t>(f32_to_bf16(v[c * kPerChunk + 2 * k])) |
                 (static_cast<uint32_t>(f32_to_bf16(v[c * kPerChunk + 2 * k + 1])) << 16);
        }
      }
      reinterpret_cast<uint4*>(p)[c] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) store(p + i, v[i]);
  }
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32 (≤ 1024); scratch holds
// 32 values in shared memory. Ends with a barrier, so the scratch can be reused right away.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = lane < warps ? scratch[lane] : T(0);
  total = warp_sum(total);  // every warp reduces the same values in the same order
  __syncthreads();
  return total;
}

__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : -INFINITY;
  total = warp_max(total);
  __syncthreads();
  return total;
}

// Keeps the first error since the last report; later ones are dropped.
__device__ inline void record_error(DeviceError* error, int code, long long position, long long value,
                                    long long limit) {
  if (atomicCAS(&error->code, kNoError, -1) == kNoError) {
    error->position = position;
    error->value = value;
    error->limit = limit;
    __threadfence();
    atomicExch(&error->code, code);
  }
}

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, capped so the grid stays legal.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = 1 << 16;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Elements of T per 16-byte access: 8 bf16 or 4 float.
template <typename T>
inline constexpr int kVecWidth = static_cast<int>(16 / sizeof(T));

// Whether n elements of T at each pointer can go through 16-byte accesses: n a multiple of kVecWidth<T> and
// every pointer 16-byte aligned (views into the flat parameter buffers need not be).
template <typename T, typename... P>
bool vector_ok(int64_t n, const P*... pointers) {
  return n % kVecWidth<T> == 0 && ((reinterpret_cast<uintptr_t>(pointers) % 16 == 0) && ...);
}

// Calls launch(std::integral_constant<int, W>{}) with W = kVecWidth<T> when `vector` holds, else W = 1: one
// kernel template serves aligned tensors with 16-byte accesses and any other tensor element by element.
template <typename T, typename F>
void with_width(bool vector, F&& launch) {
  if (vector) {
    launch(std::integral_constant<int, kVecWidth<T>>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

// A block size for a row of `width` elements: a multiple of 32 between 32 and max_threads.
inline int row_threads(int64_t width, int max_threads) {
  int64_t threads = (width + kWarpSize - 1) / kWarpSize * kWarpSize;
  if (threads > max_threads) threads = max_threads;
  if (threads < kWarpSize) threads = kWarpSize;
  return static_cast<int>(threads);
}

}  // namespace primus::cuda
