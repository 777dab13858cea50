// fp8 quantisation on the GPU (backend.h: Fp8*Args; the CPU reference is src/backend/cpu/fp8.cpp). Every value goes
// through core/fp8.h's host/device functions on the same f32 operands as the CPU (x · scale and decode · scale_inv
// are single multiplications, so no fused multiply-add can change them; max_finite / amax and 1 / scale are IEEE
// divisions without fast math), so the codes, amaxes and scales equal the CPU's bit for bit.
//
// The training shapes take bandwidth-bound kernels: the whole-tensor amax over many blocks (combined by an integer
// max, see amax_whole_kernel), the 1×128 tiles' amax a warp per tile (of x) or a column per thread (of xᵀ), and the
// codes of x and xᵀ written by one pass over 64×64 tiles through shared memory. A max has no order and each code
// depends on its element alone, so they give the same bits as the general kernels (one block per tile, one thread per
// element), which take every other shape.
#include <cuda_fp8.h>

#include <algorithm>
#include <bit>
#include <type_traits>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/fp8_kernels.h"

namespace primus::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float max_keeping_nan(float m, float v) { return (v > m || v != v) && m == m ? v : m; }

// A matrix [rows, cols] in tiles of tile_rows × tile_cols, the grid row-major. tile_of runs once or twice per element
// in the quantise kernels, where 64-bit divisions (~70 instructions each) would cost more than the encode: a matrix
// of one tile (tensorwise scaling) needs none, and power-of-two tiles (1 and 128, every recipe's) take shifts. The
// branches depend only on the kernel's arguments, so every thread of a warp takes the same one.
struct Grid {
  int64_t rows, cols, tile_rows, tile_cols, grid_cols;
  bool single;                  // one tile covers the matrix
  int row_shift, column_shift;  // log2 of the tile extents, or -1 when not a power of two
  __device__ int64_t tile_of(int64_t r, int64_t c) const {
    if (single) return 0;
    const int64_t tile_row = row_shift >= 0 ? r >> row_shift : r / tile_rows;
    const int64_t tile_column = column_shift >= 0 ? c >> column_shift : c / tile_cols;
    return tile_row * grid_cols + tile_column;
  }
};

int log2_if_power_of_two(int64_t n) {
  const auto u = static_cast<uint64_t>(n);
  return n > 0 && std::has_single_bit(u) ? std::countr_zero(u) : -1;
}

Grid make_grid(Fp8Tiles t) {
  return Grid{t.rows,
              t.cols,
              t.tile_rows,
              t.tile_cols,
              (t.cols + t.tile_cols - 1) / t.tile_cols,
              t.tile_rows >= t.rows && t.tile_cols >= t.cols,
              log2_if_power_of_two(t.tile_rows),
              log2_if_power_of_two(t.tile_cols)};
}

// fp8_encode with saturation (core/fp8.h), through the conversion instruction where the GPU has one (sm_89 and
// newer: cvt.rn.satfinite, round to nearest even, overflow and ±inf to ±max_finite, as fp8_encode). Only NaN's code
// differs (the instruction writes one NaN pattern), so NaN keeps the reference's. Other formats and GPUs take the
// reference function itself.
__device__ __forceinline__ uint8_t encode_saturating(float v, Fp8Format format) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (format == Fp8Format::kE4M3 || format == Fp8Format::kE5M2) {
    if (v != v) return fp8_nan_code(format, static_cast<uint8_t>((__float_as_uint(v) >> 24) & 0x80u));
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
  }
#endif
  return fp8_encode(v, format, true);
}

// Block t: amax[t] over tile t of x [rows, cols] (or of xᵀ when transposed: element (i, j) is x[j, i]); with
// accumulate the max of that and amax[t]'s value (a NaN in either kept). T: float or bf16, read as f32 (exact).
template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, Grid g, bool transposed, bool accumulate,
                            float* __restrict__ amax) {
  __shared__ float scratch[kThreads];
  const int64_t t = blockIdx.x;
  const int64_t r0 = (t / g.grid_cols) * g.tile_rows, c0 = (t % g.grid_cols) * g.tile_cols;
  const int64_t h = min(g.tile_rows, g.rows - r0), w = min(g.tile_cols, g.cols - c0);
  float m = 0.0f;
  for (int64_t k = threadIdx.x; k < h * w; k += blockDim.x) {
    const int64_t i = r0 + k / w, j = c0 + k % w;
    const float v = load(transposed ? x + j * g.rows + i : x + i * g.cols + j);
    m = max_keeping_nan(m, fabsf(v));
  }
  scratch[threadIdx.x] = m;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) scratch[threadIdx.x] = max_keeping_nan(scratch[threadIdx.x], scratch[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float tile = accumulate ? max_keeping_nan(amax[t], scratch[0]) : scratch[0];
    amax[t] = tile != tile ? __int_as_float(0x7FC00000) : tile;
  }
}

__global__ void scale_kernel(const float* __restrict__ amax, int64_t n, float max_finite, int margin, bool power_of_two,
                             bool keep_previous, float* __restrict__ scale, float* __restrict__ scale_inv,
                             int32_t* __restrict__ non_finite) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float fallback = keep_previous ? scale[t] : 1.0f;
    const Fp8Scale s = fp8_scale_from_amax(amax[t], max_finite, margin, fallback, power_of_two);
    scale[t] = s.scale;
    scale_inv[t] = 1.0f / s.scale;
    if (s.state == Fp8AmaxState::kNonFinite) atomicAdd(non_finite, 1);  // an integer count: any order
  }
}

// codes of x [rows, cols], or with transposed codes [cols, rows] of xᵀ (g is then xᵀ's grid).
template <typename T>
__global__ void quantize_kernel(const T* __restrict__ x, Grid g, bool transposed, const float* __restrict__ scale,
                                Fp8Format format, uint8_t* __restrict__ codes) {
  const int64_t n = g.rows * g.cols;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / g.cols, j = k % g.cols;
    const float v = load(transposed ? x + j * g.rows + i : x + k);
    codes[k] = encode_saturating(v * scale[g.tile_of(i, j)], format);
  }
}

__global__ void dequantize_kernel(const uint8_t* __restrict__ codes, Grid g, const float* __restrict__ scale_inv,
                                  Fp8Format format, float* __restrict__ y) {
  const int64_t n = g.rows * g.cols;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[k] = fp8_decode(codes[k], format) * scale_inv[g.tile_of(k / g.cols, k % g.cols)];
  }
}

// The dequantisation factors of a grid [rows, cols] (row-major) in cuBLASLt's layout: transposed (out[c·rows + r]) or
// with rows padded to padded_cols (zeros in the padding, which cuBLASLt does not read).
__global__ void scale_layout_kernel(const float* __restrict__ grid, int64_t rows, int64_t cols, bool transpose,
                                    int64_t padded_cols, float* __restrict__ out) {
  const int64_t n = transpose ? rows * cols : rows * padded_cols;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (transpose) {
      const int64_t c = k / rows, r = k % rows;
      out[k] = grid[r * cols + c];
    } else {
      const int64_t r = k / padded_cols, c = k % padded_cols;
      out[k] = c < cols ? grid[r * cols + c] : 0.0f;
    }
  }
}

// Whole-tensor amax over a grid of blocks. The blocks combine with an unsigned atomicMax on the f32 bit patterns:
// for non-negative floats their order is the order of the values, and the one NaN pattern stored (0x7FC00000) lies
// above +inf's (0x7F800000), so a NaN anywhere wins as in max_keeping_nan. *amax_bits starts at the previous amax
// (accumulate: non-negative or that NaN, as this op writes them) or at +0.
constexpr uint32_t kCanonicalNan = 0x7FC00000u;

template <typename T, int W>
__global__ void amax_whole_kernel(const T* __restrict__ x, int64_t n, uint32_t* __restrict__ amax_bits) {
  __shared__ float warp_max[kThreads / kWarpSize];
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n / W; k += stride) {
    float v[W];
    load_n<W>(x + k * W, v);
#pragma unroll
    for (int i = 0; i < W; ++i) m = max_keeping_nan(m, fabsf(v[i]));
  }
  for (int64_t k = n / W * W + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n; k += stride) {
    m = max_keeping_nan(m, fabsf(load(x + k)));
  }
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    m = max_keeping_nan(m, __shfl_xor_sync(kFullMask, m, offset));
  }
  if (threadIdx.x % kWarpSize == 0) warp_max[threadIdx.x / kWarpSize] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / kWarpSize; ++w) m = max_keeping_nan(m, warp_max[w]);
    atomicMax(amax_bits, m != m ? kCanonicalNan : __float_as_uint(m));
  }
}

// 1×128-style tiles of x (tile_rows 1): a warp per tile, each lane a stretch of tile_cols / 32 elements.
template <typename T>
__global__ void amax_row_tiles_kernel(const T* __restrict__ x, Grid g, bool accumulate, float* __restrict__ amax) {
  const int64_t tiles = g.rows * g.grid_cols;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  const int lane = threadIdx.x % kWarpSize;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; t < tiles;
       t += warps) {
    const int64_t r = t / g.grid_cols, c0 = (t % g.grid_cols) * g.tile_cols;
    const int64_t w = min(g.tile_cols, g.cols - c0);
    const T* row = x + r * g.cols + c0;
    float m = 0.0f;
    for (int64_t j = lane; j < w; j += kWarpSize) m = max_keeping_nan(m, fabsf(load(row + j)));
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
      m = max_keeping_nan(m, __shfl_xor_sync(kFullMask, m, offset));
    }
    if (lane == 0) {
      const float tile = accumulate ? max_keeping_nan(amax[t], m) : m;
      amax[t] = tile != tile ? __uint_as_float(kCanonicalNan) : tile;
    }
  }
}

// 1×128-style tiles of xᵀ (tile_rows 1 of xᵀ: a stretch of tile_cols rows of one column of x): a thread per column
// of x, walking down its stretch, so a warp reads consecutive columns of each row. g is xᵀ's grid.
template <typename T>
__global__ void amax_column_tiles_kernel(const T* __restrict__ x, Grid g, bool accumulate, float* __restrict__ amax) {
  const int64_t column = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // a row of xᵀ
  if (column >= g.rows) return;
  const int64_t r0 = blockIdx.y * g.tile_cols, h = min(g.tile_cols, g.cols - r0);  // rows of x
  float m = 0.0f;
  for (int64_t i = 0; i < h; ++i) m = max_keeping_nan(m, fabsf(load(x + (r0 + i) * g.rows + column)));
  const int64_t t = column * g.grid_cols + blockIdx.y;
  const float tile = accumulate ? max_keeping_nan(amax[t], m) : m;
  amax[t] = tile != tile ? __uint_as_float(kCanonicalNan) : tile;
}

// Codes of x [rows, cols] (grid g) and of xᵀ (grid gt) in one pass: a block loads a 64×64 tile of x, W consecutive
// elements a thread (W = 8: one 16-byte load of bf16, two of f32, where the rows allow; else 4 read one by one), writes
// x's codes row by row and xᵀ's through shared memory, W (plain) and 4 (transposed) bytes at a time where the tile is
// whole and the rows are multiples of 4 (`vector`).
// At 64 registers a thread only 4 blocks fitted an SM and the pass ran latency-bound at half occupancy (ncu, H100:
// 1.45 TB/s); 6 blocks cap it at 40 registers, which ptxas meets without spilling (1.68 TB/s).
constexpr int kPairTile = 64;

template <typename T, int W>
__global__ void __launch_bounds__(kThreads, 6)
    quantize_pair_kernel(const T* __restrict__ x, Grid g, Grid gt, const float* __restrict__ scale,
                         const float* __restrict__ scale_t, Fp8Format format, bool vector, uint8_t* __restrict__ codes,
                         uint8_t* __restrict__ codes_t) {
  constexpr int kThreadsPerRow = kPairTile / W, kRowsPerPass = kThreads / kThreadsPerRow;
  __shared__ uint8_t transposed[kPairTile][kPairTile + 4];
  // Row tiles along x (2³¹ − 1 of them), column tiles along y (65,535: 4 M columns).
  const int64_t r0 = blockIdx.x * static_cast<int64_t>(kPairTile), c0 = blockIdx.y * static_cast<int64_t>(kPairTile);
  const int tx = threadIdx.x % kThreadsPerRow, ty = threadIdx.x / kThreadsPerRow;
  // One scale each for x and xᵀ (tensorwise and delayed scaling): read once, not twice an element. Elements past the
  // last column then encode the zeros they were loaded as, into bytes nothing stores.
  const bool uniform = g.single && gt.single;
  const float s_whole = uniform ? scale[0] : 0.0f, s_t_whole = uniform ? scale_t[0] : 0.0f;
  const bool same_scales = s_whole == s_t_whole;
  for (int k = 0; k < kPairTile / kRowsPerPass; ++k) {
    const int lr = ty + kRowsPerPass * k, lc = W * tx;
    const int64_t i = r0 + lr;
    if (i >= g.rows) continue;
    const bool whole = c0 + lc + W <= g.cols;
    float v[W];
    if (W == 8 && whole) {
      load_n<W>(x + i * g.cols + c0 + lc, v);
    } else {
      for (int e = 0; e < W; ++e) v[e] = c0 + lc + e < g.cols ? load(x + i * g.cols + c0 + lc + e) : 0.0f;
    }
    uint8_t plain[W];
    if (uniform) {
#pragma unroll
      for (int e = 0; e < W; ++e) {
        plain[e] = encode_saturating(v[e] * s_whole, format);
        transposed[lc + e][lr] = same_scales ? plain[e] : encode_saturating(v[e] * s_t_whole, format);
      }
    } else {
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const int64_t j = c0 + lc + e;
        if (j < g.cols) {
          const float s = scale[g.tile_of(i, j)], s_t = scale_t[gt.tile_of(j, i)];
          plain[e] = encode_saturating(v[e] * s, format);
          transposed[lc + e][lr] = s_t == s ? plain[e] : encode_saturating(v[e] * s_t, format);
        }
      }
    }
    if (vector && whole) {
      uint32_t word[W / 4] = {};
#pragma unroll
      for (int e = 0; e < W; ++e) word[e / 4] |= static_cast<uint32_t>(plain[e]) << (8 * (e % 4));
      uint8_t* out = codes + i * g.cols + c0 + lc;
      if constexpr (W == 8) {
        *reinterpret_cast<uint2*>(out) = make_uint2(word[0], word[1]);
      } else {
        *reinterpret_cast<uint32_t*>(out) = word[0];
      }
    } else {
      for (int e = 0; e < W && c0 + lc + e < g.cols; ++e) codes[i * g.cols + c0 + lc + e] = plain[e];
    }
  }
  __syncthreads();
  const int tx4 = threadIdx.x % 16, ty4 = threadIdx.x / 16;  // 16 × 16 threads, 4 bytes each
  for (int k = 0; k < kPairTile / 16; ++k) {
    const int lj = ty4 + 16 * k, li = 4 * tx4;  // a row of xᵀ (column of x), four of its columns
    const int64_t j = c0 + lj;
    if (j >= g.cols) continue;
    const uint8_t* b = transposed[lj] + li;
    if (vector && r0 + li + 4 <= g.rows) {
      *reinterpret_cast<uint32_t*>(codes_t + j * g.rows + r0 + li) =
          b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
    } else {
      for (int e = 0; e < 4 && r0 + li + e < g.rows; ++e) codes_t[j * g.rows + r0 + li + e] = b[e];
    }
  }
}

// Codes of x, 8 consecutive elements a thread (16-byte loads of bf16, 8-byte stores) when the rows are multiples of 8
// and every tile's columns too, so the 8 elements share a scale.
constexpr int kQuantizeWidth = 8;

template <typename T>
__global__ void quantize_vector_kernel(const T* __restrict__ x, Grid g, const float* __restrict__ scale,
                                       Fp8Format format, uint8_t* __restrict__ codes) {
  const int64_t n = g.rows * g.cols / kQuantizeWidth;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = k * kQuantizeWidth;
    float v[kQuantizeWidth];
    load_n<kQuantizeWidth>(x + first, v);
    const float s = scale[g.tile_of(first / g.cols, first % g.cols)];
    uint32_t word[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < kQuantizeWidth; ++e) {
      word[e / 4] |= static_cast<uint32_t>(encode_saturating(v[e] * s, format)) << (8 * (e % 4));
    }
    *reinterpret_cast<uint2*>(codes + first) = make_uint2(word[0], word[1]);
  }
}

}  // namespace

void fp8_scale_layout(const KernelContext& ctx, const float* grid, int64_t rows, int64_t cols, bool transpose,
                      int64_t padded_cols, float* out) {
  const int64_t n = transpose ? rows * cols : rows * padded_cols;
  scale_layout_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(grid, rows, cols, transpose, padded_cols,
                                                                         out);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void fp8_amax(const KernelContext& ctx, const T* x, Fp8Tiles tiles, bool transposed, bool accumulate, float* amax,
              int64_t count) {
  const Grid g = make_grid(tiles);
  const int64_t n = tiles.rows * tiles.cols;
  if (count == 1 && n > 0) {  // the whole tensor: x or xᵀ alike
    if (!accumulate) PRIMUS_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), ctx.stream));
    const unsigned blocks = std::min<unsigned>(grid_for(n / kVecWidth<T> + 1, kThreads), 1024);
    with_width<T>(vector_ok<T>(n, x), [&](auto width) {
      amax_whole_kernel<T, decltype(width)::value>
          <<<blocks, kThreads, 0, ctx.stream>>>(x, n, reinterpret_cast<uint32_t*>(amax));
    });
  } else if (tiles.tile_rows == 1 && !transposed) {
    const unsigned blocks = grid_for(count * kWarpSize, kThreads);
    amax_row_tiles_kernel<T><<<blocks, kThreads, 0, ctx.stream>>>(x, g, accumulate, amax);
  } else if (tiles.tile_rows == 1 && g.grid_cols <= 65535) {
    const dim3 blocks(static_cast<unsigned>((tiles.rows + kThreads - 1) / kThreads), static_cast<unsigned>(g.grid_cols));
    amax_column_tiles_kernel<T><<<blocks, kThreads, 0, ctx.stream>>>(x, g, accumulate, amax);
  } else {
    amax_kernel<T><<<static_cast<unsigned>(count), kThreads, 0, ctx.stream>>>(x, g, transposed, accumulate, amax);
  }
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void fp8_scale(const KernelContext& ctx, const float* amax, int64_t n, Fp8Format format, int margin, bool power_of_two,
               bool keep_previous, float* scale, float* scale_inv, int32_t* non_finite) {
  scale_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(amax, n, fp8_info(format).max_finite, margin,
                                                                   power_of_two, keep_previous, scale, scale_inv,
                                                                   non_finite);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void fp8_quantize(const KernelContext& ctx, const T* x, Fp8Tiles tiles, bool transposed, Fp8Format format,
                  const float* scale, uint8_t* codes) {
  const int64_t n = tiles.rows * tiles.cols;
  const bool vector = !transposed && tiles.cols % kQuantizeWidth == 0 && tiles.tile_cols % kQuantizeWidth == 0 &&
                      reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(codes) % 8 == 0;
  if (vector) {
    quantize_vector_kernel<T><<<grid_for(n / kQuantizeWidth, kThreads), kThreads, 0, ctx.stream>>>(
        x, make_grid(tiles), scale, format, codes);
  } else {
    quantize_kernel<T><<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(x, make_grid(tiles), transposed, scale,
                                                                          format, codes);
  }
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void fp8_quantize_pair(const KernelContext& ctx, const T* x, Fp8Tiles tiles, Fp8Tiles tiles_t, Fp8Format format,
                       const float* scale, const float* scale_t, uint8_t* codes, uint8_t* codes_t) {
  if (tiles.rows == 0 || tiles.cols == 0) return;
  const dim3 blocks(static_cast<unsigned>((tiles.rows + kPairTile - 1) / kPairTile),
                    static_cast<unsigned>((tiles.cols + kPairTile - 1) / kPairTile));
  const bool vector = tiles.rows % 4 == 0 && tiles.cols % 4 == 0 && reinterpret_cast<uintptr_t>(codes) % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(codes_t) % 4 == 0;
  // Eight columns a thread where the rows are multiples of 8 and x and the codes aligned for 16- and 8-byte accesses.
  const bool wide = vector && tiles.cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(codes) % 8 == 0;
  auto launch = [&](auto width) {
    quantize_pair_kernel<T, decltype(width)::value><<<blocks, kThreads, 0, ctx.stream>>>(
        x, make_grid(tiles), make_grid(tiles_t), scale, scale_t, format, vector, codes, codes_t);
  };
  if (wide) {
    launch(std::integral_constant<int, 8>{});
  } else {
    launch(std::integral_constant<int, 4>{});
  }
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void fp8_dequantize(const KernelContext& ctx, const uint8_t* codes, Fp8Tiles tiles, Fp8Format format,
                    const float* scale_inv, float* y) {
  dequantize_kernel<<<grid_for(tiles.rows * tiles.cols, kThreads), kThreads, 0, ctx.stream>>>(codes, make_grid(tiles),
                                                                                             scale_inv, format, y);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template void fp8_amax<float>(const KernelContext&, const float*, Fp8Tiles, bool, bool, float*, int64_t);
template void fp8_amax<bf16>(const KernelContext&, const bf16*, Fp8Tiles, bool, bool, float*, int64_t);
template void fp8_quantize<float>(const KernelContext&, const float*, Fp8Tiles, bool, Fp8Format, const float*,
                                  uint8_t*);
template void fp8_quantize<bf16>(const KernelContext&, const bf16*, Fp8Tiles, bool, Fp8Format, const float*, uint8_t*);
template void fp8_quantize_pair<float>(const KernelContext&, const float*, Fp8Tiles, Fp8Tiles, Fp8Format, const float*,
                                       const float*, uint8_t*, uint8_t*);
template void fp8_quantize_pair<bf16>(const KernelContext&, const bf16*, Fp8Tiles, Fp8Tiles, Fp8Format, const float*,
                                      const float*, uint8_t*, uint8_t*);

}  // namespace primus::cuda
