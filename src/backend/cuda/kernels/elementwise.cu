// Element-wise helpers on the GPU: y += x, x *= s, fill, cast (f32 <-> bf16), Σ x² for gradient-norm clipping
// and Σ x into a device accumulator (losses). add, scale and cast use 16-byte accesses where the tensors allow
// (common.cuh: with_width).
// The sums are deterministic in two passes: block b sums the fixed chunk [b·kChunk, (b+1)·kChunk) in double
// (each thread a fixed strided subset, then the block tree), and one block adds the chunk sums by the same
// fixed scheme. The result depends only on n, never on scheduling.
#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/kernels/common.cuh"
#include "core/rng.h"

namespace primus::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 1 << 14;
constexpr int kReduceThreads = 1024;

// N elements per thread and iteration (16-byte accesses when N > 1); n is a multiple of N.
template <typename T, int N>
__global__ void add_kernel(T* y, const T* x, int64_t n) {  // y may alias x: same element, same thread
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    float a[N], b[N];
    load_n(y + i, a);
    load_n(x + i, b);
#pragma unroll
    for (int k = 0; k < N; ++k) a[k] += b[k];
    store_n(y + i, a);
  }
}

template <typename T, int N>
__global__ void scale_kernel(T* __restrict__ x, float s, int64_t n) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    float a[N];
    load_n(x + i, a);
#pragma unroll
    for (int k = 0; k < N; ++k) a[k] *= s;
    store_n(x + i, a);
  }
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ x, float value, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store(x + i, value);
  }
}

__global__ void fill_normal_kernel(float* __restrict__ x, uint64_t seed, double std, int64_t n, StreamIndex index) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = static_cast<float>(normal_at(seed, index(i)) * std);
  }
}

template <typename Src, typename Dst, int N>
__global__ void cast_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, int64_t n) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    float a[N];
    load_n(src + i, a);
    store_n(dst + i, a);
  }
}

// partial[b] = Σ over chunk b of x (Square: x²), in double.
template <bool Square, typename T>
__global__ void sum_chunk_kernel(const T* __restrict__ x, int64_t n, double* __restrict__ partial) {
  __shared__ double scratch[kWarpSize];
  const int64_t begin = blockIdx.x * kChunk;
  const int64_t end = min(n, begin + kChunk);
  double sum = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = load(x + i);
    sum += Square ? v * v : v;
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// *result = Σ partial, or with an accumulator: *acc = float(*acc + Σ partial).
__global__ void sum_partials_kernel(const double* __restrict__ partial, int64_t count, double* __restrict__ result,
                                    float* __restrict__ acc) {
  __shared__ double scratch[kWarpSize];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  sum = block_sum(sum, scratch);
  if (threadIdx.x != 0) return;
  if (result != nullptr) *result = sum;
  if (acc != nullptr) *acc = static_cast<float>(static_cast<double>(*acc) + sum);
}

// Queues the two passes over x (n > 0) into result or acc.
template <bool Square, typename T>
void sum_chunks(const KernelContext& ctx, const T* x, int64_t n, double* result, float* acc) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  DeviceBuffer partial(*ctx.allocator, static_cast<size_t>(chunks) * sizeof(double));
  sum_chunk_kernel<Square, T><<<static_cast<unsigned>(chunks), kThreads, 0, ctx.stream>>>(x, n, partial.as<double>());
  PRIMUS_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kReduceThreads, 0, ctx.stream>>>(partial.as<double>(), chunks, result, acc);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void add_inplace(const KernelContext& ctx, T* y, const T* x, int64_t n) {
  if (n == 0) return;
  with_width<T>(vector_ok<T>(n, y, x), [&](auto width) {
    constexpr int N = decltype(width)::value;
    add_kernel<T, N><<<grid_for(n / N, kThreads), kThreads, 0, ctx.stream>>>(y, x, n);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void scale_inplace(const KernelContext& ctx, T* x, float s, int64_t n) {
  if (n == 0) return;
  with_width<T>(vector_ok<T>(n, x), [&](auto width) {
    constexpr int N = decltype(width)::value;
    scale_kernel<T, N><<<grid_for(n / N, kThreads), kThreads, 0, ctx.stream>>>(x, s, n);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void fill(const KernelContext& ctx, T* x, float value, int64_t n) {
  if (n == 0) return;
  fill_kernel<T><<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(x, value, n);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void fill_normal(const KernelContext& ctx, float* x, uint64_t seed, double std, int64_t n, StreamIndex index) {
  if (n == 0) return;
  fill_normal_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(x, seed, std, n, index);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename Src, typename Dst>
void cast(const KernelContext& ctx, const Src* src, Dst* dst, int64_t n) {
  if (n == 0) return;
  // The narrower type sets the width: 8 elements are 16 bytes of bf16 and two 16-byte accesses of float.
  using Narrow = std::conditional_t<(sizeof(Src) < sizeof(Dst)), Src, Dst>;
  with_width<Narrow>(vector_ok<Narrow>(n, src, dst), [&](auto width) {
    constexpr int N = decltype(width)::value;
    cast_kernel<Src, Dst, N><<<grid_for(n / N, kThreads), kThreads, 0, ctx.stream>>>(src, dst, n);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void sum_squares(const KernelContext& ctx, const T* x, int64_t n, double* result) {
  if (n == 0) {
    PRIMUS_CUDA_CHECK(gpuMemsetAsync(result, 0, sizeof(double), ctx.stream));
    return;
  }
  sum_chunks<true>(ctx, x, n, result, nullptr);
}

void sum_into(const KernelContext& ctx, const float* x, int64_t n, float* acc) {
  if (n == 0) return;
  sum_chunks<false>(ctx, x, n, nullptr, acc);
}

template void add_inplace<float>(const KernelContext&, float*, const float*, int64_t);
template void add_inplace<bf16>(const KernelContext&, bf16*, const bf16*, int64_t);
template void scale_inplace<float>(const KernelContext&, float*, float, int64_t);
template void scale_inplace<bf16>(const KernelContext&, bf16*, float, int64_t);
template void fill<float>(const KernelContext&, float*, float, int64_t);
template void fill<bf16>(const KernelContext&, bf16*, float, int64_t);
template void cast<float, bf16>(const KernelContext&, const float*, bf16*, int64_t);
template void cast<bf16, float>(const KernelContext&, const bf16*, float*, int64_t);
template void sum_squares<float>(const KernelContext&, const float*, int64_t, double*);
template void sum_squares<bf16>(const KernelContext&, const bf16*, int64_t, double*);

}  // namespace primus::cuda
