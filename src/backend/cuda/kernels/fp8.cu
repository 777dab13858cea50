// fp8 quantisation on the GPU (backend.h: Fp8*Args; the CPU reference is src/backend/cpu/fp8.cpp). Every value goes
// through core/fp8.h's host/device functions on the same f32 operands as the CPU (x · scale and decode · scale_inv
// are single multiplications, so no fused multiply-add can change them; max_finite / amax and 1 / scale are IEEE
// divisions without fast math), so the codes, amaxes and scales equal the CPU's bit for bit.
//
// First versions, written for correctness: one block per tile for the amax (a max has no order, so the block's tree
// gives the CPU's value), one thread per element elsewhere. The fused, vectorised kernels next to the producing ops
// come with the fp8 GEMMs (issue 15).
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/fp8_kernels.h"

namespace primus::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float max_keeping_nan(float m, float v) { return (v > m || v != v) && m == m ? v : m; }

// A matrix [rows, cols] in tiles of tile_rows × tile_cols, the grid row-major.
struct Grid {
  int64_t rows, cols, tile_rows, tile_cols, grid_cols;
  __device__ int64_t tile_of(int64_t r, int64_t c) const { return (r / tile_rows) * grid_cols + c / tile_cols; }
};

Grid make_grid(Fp8Tiles t) { return Grid{t.rows, t.cols, t.tile_rows, t.tile_cols, (t.cols + t.tile_cols - 1) / t.tile_cols}; }

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
    codes[k] = fp8_encode(v * scale[g.tile_of(i, j)], format, true);
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
  amax_kernel<T><<<static_cast<unsigned>(count), kThreads, 0, ctx.stream>>>(x, make_grid(tiles), transposed,
                                                                           accumulate, amax);
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
  quantize_kernel<T><<<grid_for(tiles.rows * tiles.cols, kThreads), kThreads, 0, ctx.stream>>>(x, make_grid(tiles),
                                                                                          transposed, scale, format,
                                                                                          codes);
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

}  // namespace primus::cuda
