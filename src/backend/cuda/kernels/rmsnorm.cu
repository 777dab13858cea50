// RMSNorm on the GPU, same formulas as the CPU backend (src/backend/cpu/rmsnorm.cpp):
//   y = weight ⊙ x · rstd, rstd = 1/sqrt(mean(x²) + eps)            one block per row, mean square in double
//   dx = rstd · (g − x̂ · mean(g ⊙ x̂)), g = dy ⊙ weight, x̂ = x · rstd  Σ in double
//   dweight += Σ_rows dy ⊙ x̂  (fp32 for either activation dtype)     deterministic, two passes
// dweight without atomics, so the result depends only on the shape: pass 1 writes, for each chunk of rows and
// each column, the chunk's rows summed in order in double into a partial; pass 2 adds a column's partials in
// a fixed order (common.cuh's spirit: a tree fixed by the shape) and adds the total to dweight once.
// Rows go through 16-byte accesses when the tensors allow (common.cuh: with_width). When a row fits one block
// with every thread owning N columns, the backward is one fused kernel: a block walks a chunk of rows, writes
// dx row by row and keeps its columns' dweight partials in registers (x and dy are read once). Otherwise dx
// takes one block per row and pass 1 reads x and dy again, one thread per (chunk, column).
#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kMaxRowThreads = 256;
constexpr int kMaxFusedThreads = 1024;
constexpr int kColumnThreads = 256;
constexpr int64_t kRowsPerChunk = 64;       // pass 1 of the unfused backward
constexpr int64_t kFusedRowsPerChunk = 16;  // rows per block of the fused backward

// One block per row; each thread handles N consecutive columns at a time.
template <typename T, int N>
__global__ void rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y,
                                       float* __restrict__ rstd, int64_t channels, float eps) {
  __shared__ double scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * channels;  // [C]
  T* yr = y + row * channels;        // [C]
  double sum_sq = 0.0;
  for (int64_t c = threadIdx.x * N; c < channels; c += blockDim.x * N) {
    float v[N];
    load_n(xr + c, v);
#pragma unroll
    for (int k = 0; k < N; ++k) sum_sq += static_cast<double>(v[k]) * v[k];
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float s = static_cast<float>(1.0 / sqrt(sum_sq / static_cast<double>(channels) + static_cast<double>(eps)));
  for (int64_t c = threadIdx.x * N; c < channels; c += blockDim.x * N) {
    float v[N], w[N];
    load_n(xr + c, v);
    load_n(weight + c, w);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = (v[k] * s) * w[k];
    store_n(yr + c, v);
  }
  if (threadIdx.x == 0) rstd[row] = s;
}

// One block per row.
template <typename T, int N>
__global__ void rmsnorm_dx_kernel(const T* __restrict__ x, const T* __restrict__ weight, const float* __restrict__ rstd,
                                  const T* __restrict__ dy, T* __restrict__ dx, int64_t channels) {
  __shared__ double scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * channels;    // [C]
  const T* dyr = dy + row * channels;  // [C]
  T* dxr = dx + row * channels;        // [C]
  const float s = rstd[row];
  double dot = 0.0;  // Σ g ⊙ x̂
  for (int64_t c = threadIdx.x * N; c < channels; c += blockDim.x * N) {
    float xv[N], gv[N], w[N];
    load_n(xr + c, xv);
    load_n(dyr + c, gv);
    load_n(weight + c, w);
#pragma unroll
    for (int k = 0; k < N; ++k) dot += static_cast<double>(gv[k] * w[k]) * static_cast<double>(xv[k] * s);
  }
  dot = block_sum(dot, scratch);
  const float mean_dot = static_cast<float>(dot / static_cast<double>(channels));
  for (int64_t c = threadIdx.x * N; c < channels; c += blockDim.x * N) {
    float xv[N], gv[N], w[N];
    load_n(xr + c, xv);
    load_n(dyr + c, gv);
    load_n(weight + c, w);
#pragma unroll
    for (int k = 0; k < N; ++k) xv[k] = s * (gv[k] * w[k] - (xv[k] * s) * mean_dot);
    store_n(dxr + c, xv);
  }
}

// Fused backward: blockDim.x · N == channels; block b handles rows [b·kFusedRowsPerChunk, ...) in order, writes
// their dx (when dx is not null) and partial[b, c] = Σ_rows dy · x̂ for its thread's N columns c.
template <typename T, int N>
__global__ void rmsnorm_backward_fused_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                              const float* __restrict__ rstd, const T* __restrict__ dy,
                                              T* __restrict__ dx, double* __restrict__ partial, int64_t rows,
                                              int64_t channels) {
  __shared__ double scratch[kWarpSize];
  const int64_t c = threadIdx.x * N;
  const int64_t r0 = blockIdx.x * kFusedRowsPerChunk;
  const int64_t r1 = min(rows, r0 + kFusedRowsPerChunk);
  float w[N];
  load_n(weight + c, w);
  double acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    const float s = rstd[r];
    float xv[N], gv[N];
    load_n(x + r * channels + c, xv);
    load_n(dy + r * channels + c, gv);
    double dot = 0.0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float xhat = xv[k] * s;
      dot += static_cast<double>(gv[k] * w[k]) * static_cast<double>(xhat);
      acc[k] += static_cast<double>(gv[k] * xhat);
      xv[k] = xhat;
    }
    if (dx == nullptr) continue;  // uniform across the block: the barrier in block_sum is safe
    dot = block_sum(dot, scratch);
    const float mean_dot = static_cast<float>(dot / static_cast<double>(channels));
#pragma unroll
    for (int k = 0; k < N; ++k) xv[k] = s * (gv[k] * w[k] - xv[k] * mean_dot);
    store_n(dx + r * channels + c, xv);
  }
  double* out = partial + blockIdx.x * channels + c;
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = acc[k];
}

// partial[chunk, c] = Σ_{rows r of the chunk, in order} dy[r, c] · x[r, c] · rstd[r]   (double)
template <typename T>
__global__ void rmsnorm_dweight_partial_kernel(const T* __restrict__ x, const float* __restrict__ rstd,
                                               const T* __restrict__ dy, double* __restrict__ partial, int64_t rows,
                                               int64_t channels) {
  const int64_t c = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  const int64_t chunk = blockIdx.x;
  const int64_t r0 = chunk * kRowsPerChunk;
  const int64_t r1 = min(rows, r0 + kRowsPerChunk);
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r)
    acc += static_cast<double>(load(dy + r * channels + c) * (load(x + r * channels + c) * rstd[r]));
  partial[chunk * channels + c] = acc;
}

// dweight[c] += Σ_chunks partial[chunk, c] in a fixed order: a block of 32 × kReduceLanes threads takes 32
// columns; lane y sums chunks y, y + kReduceLanes, ... in order, then lane 0 adds the lanes' sums in order.
constexpr int kReduceLanes = 32;
__global__ void rmsnorm_dweight_reduce_kernel(const double* __restrict__ partial, float* __restrict__ dweight,
                                              int64_t chunks, int64_t channels) {
  __shared__ double lane_sums[kReduceLanes][kWarpSize + 1];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kWarpSize) + threadIdx.x;
  double acc = 0.0;
  if (c < channels) {
    for (int64_t chunk = threadIdx.y; chunk < chunks; chunk += kReduceLanes) acc += partial[chunk * channels + c];
  }
  lane_sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= channels) return;
  double total = 0.0;
  for (int lane = 0; lane < kReduceLanes; ++lane) total += lane_sums[lane][threadIdx.x];
  dweight[c] += static_cast<float>(total);
}

void reduce_dweight(const KernelContext& ctx, const double* partial, float* dweight, int64_t chunks,
                    int64_t channels) {
  const unsigned column_blocks = static_cast<unsigned>((channels + kWarpSize - 1) / kWarpSize);
  rmsnorm_dweight_reduce_kernel<<<column_blocks, dim3(kWarpSize, kReduceLanes), 0, ctx.stream>>>(partial, dweight,
                                                                                                 chunks, channels);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void rmsnorm_forward(const KernelContext& ctx, const T* x, const T* weight, T* y, float* rstd, int64_t rows,
                     int64_t channels, float eps) {
  if (rows == 0) return;
  with_width<T>(vector_ok<T>(channels, x, weight, y), [&](auto width) {
    constexpr int N = decltype(width)::value;
    rmsnorm_forward_kernel<T, N>
        <<<static_cast<unsigned>(rows), row_threads(channels / N, kMaxRowThreads), 0, ctx.stream>>>(x, weight, y, rstd,
                                                                                                   channels, eps);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void rmsnorm_backward(const KernelContext& ctx, const T* x, const T* weight, const float* rstd, const T* dy, T* dx,
                      float* dweight, int64_t rows, int64_t channels) {
  if (rows == 0 || channels == 0) return;
  const bool vector = vector_ok<T>(channels, x, weight, dy) && (dx == nullptr || vector_ok<T>(channels, dx));
  const int64_t fused_threads = channels / kVecWidth<T>;
  if (vector && dweight != nullptr && fused_threads % kWarpSize == 0 && fused_threads <= kMaxFusedThreads) {
    constexpr int N = kVecWidth<T>;
    const int64_t chunks = (rows + kFusedRowsPerChunk - 1) / kFusedRowsPerChunk;
    DeviceBuffer partial(*ctx.allocator, static_cast<size_t>(chunks * channels) * sizeof(double));
    rmsnorm_backward_fused_kernel<T, N><<<static_cast<unsigned>(chunks), static_cast<unsigned>(fused_threads), 0,
                                          ctx.stream>>>(x, weight, rstd, dy, dx, partial.as<double>(), rows, channels);
    PRIMUS_CUDA_CHECK_LAUNCH();
    reduce_dweight(ctx, partial.as<double>(), dweight, chunks, channels);
    return;
  }
  if (dx != nullptr) {
    with_width<T>(vector, [&](auto width) {
      constexpr int N = decltype(width)::value;
      rmsnorm_dx_kernel<T, N>
          <<<static_cast<unsigned>(rows), row_threads(channels / N, kMaxRowThreads), 0, ctx.stream>>>(x, weight, rstd,
                                                                                                     dy, dx, channels);
    });
    PRIMUS_CUDA_CHECK_LAUNCH();
  }
  if (dweight != nullptr) {
    const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
    DeviceBuffer partial(*ctx.allocator, static_cast<size_t>(chunks * channels) * sizeof(double));
    const unsigned column_blocks = static_cast<unsigned>((channels + kColumnThreads - 1) / kColumnThreads);
    rmsnorm_dweight_partial_kernel<T>
        <<<dim3(static_cast<unsigned>(chunks), column_blocks), kColumnThreads, 0, ctx.stream>>>(
            x, rstd, dy, partial.as<double>(), rows, channels);
    PRIMUS_CUDA_CHECK_LAUNCH();
    reduce_dweight(ctx, partial.as<double>(), dweight, chunks, channels);
  }
}

template void rmsnorm_forward<float>(const KernelContext&, const float*, const float*, float*, float*, int64_t, int64_t,
                                     float);
template void rmsnorm_backward<float>(const KernelContext&, const float*, const float*, const float*, const float*,
                                      float*, float*, int64_t, int64_t);
template void rmsnorm_forward<bf16>(const KernelContext&, const bf16*, const bf16*, bf16*, float*, int64_t, int64_t,
                                    float);
template void rmsnorm_backward<bf16>(const KernelContext&, const bf16*, const bf16*, const float*, const bf16*, bf16*,
                                     float*, int64_t, int64_t);

}  // namespace primus::cuda
