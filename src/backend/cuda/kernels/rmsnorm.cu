// RMSNorm on the GPU, same formulas as the CPU backend (src/backend/cpu/rmsnorm.cpp):
//   y = weight ⊙ x · rstd, rstd = 1/sqrt(mean(x²) + eps)            one block per row, mean square in double
//   dx = rstd · (g − x̂ · mean(g ⊙ x̂)), g = dy ⊙ weight, x̂ = x · rstd  one block per row, Σ in double
//   dweight += Σ_rows dy ⊙ x̂  (fp32 for either activation dtype)     deterministic, two passes:
// pass 1 gives each (chunk of kRowsPerChunk rows, column) one thread (grid x: chunks, y: column blocks) that sums its
// rows in order in double into a partial; pass 2 adds a column's partials in chunk order and adds the total to dweight
// once. No atomics, so the result depends only on the shape.
#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kMaxRowThreads = 256;
constexpr int kColumnThreads = 256;
constexpr int64_t kRowsPerChunk = 64;

template <typename T>
__global__ void rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y,
                                       float* __restrict__ rstd, int64_t channels, float eps) {
  __shared__ double scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * channels;  // [C]
  T* yr = y + row * channels;        // [C]
  double sum_sq = 0.0;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    const double v = load(xr + c);
    sum_sq += v * v;
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float s = static_cast<float>(1.0 / sqrt(sum_sq / static_cast<double>(channels) + static_cast<double>(eps)));
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) store(yr + c, (load(xr + c) * s) * load(weight + c));
  if (threadIdx.x == 0) rstd[row] = s;
}

template <typename T>
__global__ void rmsnorm_dx_kernel(const T* __restrict__ x, const T* __restrict__ weight, const float* __restrict__ rstd,
                                  const T* __restrict__ dy, T* __restrict__ dx, int64_t channels) {
  __shared__ double scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * channels;    // [C]
  const T* dyr = dy + row * channels;  // [C]
  T* dxr = dx + row * channels;        // [C]
  const float s = rstd[row];
  double dot = 0.0;  // Σ g ⊙ x̂
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    dot += static_cast<double>(load(dyr + c) * load(weight + c)) * static_cast<double>(load(xr + c) * s);
  }
  dot = block_sum(dot, scratch);
  const float mean_dot = static_cast<float>(dot / static_cast<double>(channels));
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    store(dxr + c, s * (load(dyr + c) * load(weight + c) - (load(xr + c) * s) * mean_dot));
  }
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

// dweight[c] += Σ_chunks partial[chunk, c], chunks in order.
__global__ void rmsnorm_dweight_reduce_kernel(const double* __restrict__ partial, float* __restrict__ dweight,
                                              int64_t chunks, int64_t channels) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  double acc = 0.0;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) acc += partial[chunk * channels + c];
  dweight[c] += static_cast<float>(acc);
}

}  // namespace

template <typename T>
void rmsnorm_forward(const KernelContext& ctx, const T* x, const T* weight, T* y, float* rstd, int64_t rows,
                     int64_t channels, float eps) {
  if (rows == 0) return;
  rmsnorm_forward_kernel<T><<<static_cast<unsigned>(rows), row_threads(channels, kMaxRowThreads), 0, ctx.stream>>>(
      x, weight, y, rstd, channels, eps);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void rmsnorm_backward(const KernelContext& ctx, const T* x, const T* weight, const float* rstd, const T* dy, T* dx,
                      float* dweight, int64_t rows, int64_t channels) {
  if (rows == 0 || channels == 0) return;
  if (dx != nullptr) {
    rmsnorm_dx_kernel<T><<<static_cast<unsigned>(rows), row_threads(channels, kMaxRowThreads), 0, ctx.stream>>>(
        x, weight, rstd, dy, dx, channels);
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
    rmsnorm_dweight_reduce_kernel<<<column_blocks, kColumnThreads, 0, ctx.stream>>>(partial.as<double>(), dweight,
                                                                                    chunks, channels);
    PRIMUS_CUDA_CHECK_LAUNCH();
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
