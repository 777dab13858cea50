// Softmax cross-entropy on the GPU, one block per row, same formulas as the CPU backend
// (src/backend/cpu/cross_entropy.cpp):
//   lse = max + log Σ exp(logit − max)  (Σ in double, block tree order)    loss = lse − logit[target]
//   dlogits = grad_scale · (exp(logit − lse) − onehot(target))
// Rows with a negative target are ignored (loss 0, gradient 0). A target ≥ V is recorded for the host and
// its row's outputs become NaN. Backward may write over logits (dlogits aliasing logits): each element is read
// and written by the same thread, so the pointers carry no __restrict__. cross_entropy_forward with dlogits does
// both in one launch (the loss layer forms the gradient as soon as the logits exist): one read of the row for the
// statistics, one to write the gradient.
//
// Vocabulary-parallel steps (backend.h): row_max and cross_entropy_shard_stats read one shard's columns (one block
// per row, like the forward), cross_entropy_finish is element-wise over rows, and backward takes the shard: the
// one-hot term only where the target's column lies in [begin, begin + V), targets checked against the total.
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kMaxThreads = 512;

// The gradient of one row, N consecutive elements per thread and access: dr = scale · (exp(lr − lse) − onehot) with
// the one-hot at `column` (none when it lies outside [0, V): ignored here, or another shard's). Each element is
// read and then written by the same thread, so dr may be lr.
template <typename T, int N>
__device__ void write_row_gradient(const T* lr, T* dr, int64_t vocab, float row_lse, float scale, int64_t column) {
  for (int64_t v = threadIdx.x * N; v < vocab; v += blockDim.x * N) {
    float x[N];
    load_n(lr + v, x);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float p = expf(x[k] - row_lse);
      x[k] = v + k == column ? scale * (p - 1.0f) : scale * p;
    }
    store_n(dr + v, x);
  }
}

// Every element of a row set to value (0 for an ignored row, NaN for a bad target).
template <typename T, int N>
__device__ void fill_row(T* dr, int64_t vocab, float value) {
  float x[N];
#pragma unroll
  for (int k = 0; k < N; ++k) x[k] = value;
  for (int64_t v = threadIdx.x * N; v < vocab; v += blockDim.x * N) store_n(dr + v, x);
}

// One block per row, N consecutive logits per thread and access. The row is read once for max and Σ exp
// together (online: a thread rescales its sum when its running max grows), the per-thread (max, sum) pairs
// are combined over the block, and with Grad the row is read a second time to write the gradient over
// dlogits (which may be the logits: the target logit is read before the first barrier, and every other
// element is read and written by the same thread).
template <typename T, int N, bool Grad>
__global__ void cross_entropy_row_kernel(const T* logits, const int32_t* __restrict__ targets,
                                         float* __restrict__ losses, float* __restrict__ lse, float scale,
                                         T* dlogits, int64_t vocab, DeviceError* error) {
  __shared__ float max_scratch[kWarpSize];
  __shared__ double sum_scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;  // [V]
  const int32_t target = targets[row];
  const bool counted = target >= 0 && target < vocab;
  const float target_logit = counted && threadIdx.x == 0 ? load(lr + target) : 0.0f;
  float max = -INFINITY;
  double sum = 0.0;  // Σ exp(logit − max) over this thread's elements
  for (int64_t v = threadIdx.x * N; v < vocab; v += blockDim.x * N) {
    float x[N];
    load_n(lr + v, x);
    float pack_max = x[0];
#pragma unroll
    for (int k = 1; k < N; ++k) pack_max = fmaxf(pack_max, x[k]);
    if (pack_max > max) {
      sum *= static_cast<double>(expf(max - pack_max));  // exp(-inf) = 0 on the first pack
      max = pack_max;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) sum += static_cast<double>(expf(x[k] - max));
  }
  const float row_max = block_max(max, max_scratch);
  const double thread_sum = max == -INFINITY ? 0.0 : sum * static_cast<double>(expf(max - row_max));
  const double row_sum = block_sum(thread_sum, sum_scratch);
  const float row_lse = static_cast<float>(static_cast<double>(row_max) + log(row_sum));
  if (threadIdx.x == 0) {
    lse[row] = row_lse;
    if (target >= vocab) {
      record_error(error, Grad ? kCrossEntropyBackwardTarget : kCrossEntropyForwardTarget, row, target, vocab);
      losses[row] = NAN;
    } else {
      losses[row] = target < 0 ? 0.0f : row_lse - target_logit;
    }
  }
  if constexpr (Grad) {
    T* dr = dlogits + row * vocab;  // [V]
    if (counted) {
      write_row_gradient<T, N>(lr, dr, vocab, row_lse, scale, target);
    } else {
      fill_row<T, N>(dr, vocab, target < 0 ? 0.0f : NAN);
    }
  }
}

// One block per row, N consecutive elements per thread and access, as in the row kernel. The logits hold the
// columns [begin, begin + V) of a vocabulary of `total` (unsharded: 0 and V).
template <typename T, int N>
__global__ void cross_entropy_backward_kernel(const T* logits, const int32_t* __restrict__ targets,
                                              const float* __restrict__ lse, float scale, T* dlogits, int64_t vocab,
                                              int64_t begin, int64_t total, DeviceError* error) {
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;  // [V]
  T* dr = dlogits + row * vocab;       // [V], possibly the same memory as lr
  const int32_t target = targets[row];
  if (target < 0 || target >= total) {
    if (target >= total && threadIdx.x == 0) record_error(error, kCrossEntropyBackwardTarget, row, target, total);
    fill_row<T, N>(dr, vocab, target < 0 ? 0.0f : NAN);
    return;
  }
  write_row_gradient<T, N>(lr, dr, vocab, lse[row], scale, static_cast<int64_t>(target) - begin);
}

template <typename T, int N>
__global__ void row_max_kernel(const T* __restrict__ x, float* __restrict__ max, int64_t columns) {
  __shared__ float scratch[kWarpSize];
  const T* xr = x + blockIdx.x * columns;  // [C]
  float m = -INFINITY;
  for (int64_t v = threadIdx.x * N; v < columns; v += blockDim.x * N) {
    float e[N];
    load_n(xr + v, e);
#pragma unroll
    for (int k = 0; k < N; ++k) m = fmaxf(m, e[k]);
  }
  m = block_max(m, scratch);
  if (threadIdx.x == 0) max[blockIdx.x] = m;
}

// Σ exp(logit − max) over one shard's columns (max: the group's), in double in the block's fixed tree, and the
// target's logit where this shard holds it. A target ≥ total is recorded; its row's outputs become NaN.
template <typename T, int N>
__global__ void cross_entropy_shard_stats_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                                                 const float* __restrict__ max, float* __restrict__ sum_exp,
                                                 float* __restrict__ target_logit, int64_t vocab, int64_t begin,
                                                 int64_t total, DeviceError* error) {
  __shared__ double scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;  // [V]
  const float row_max = max[row];
  double sum = 0.0;
  for (int64_t v = threadIdx.x * N; v < vocab; v += blockDim.x * N) {
    float x[N];
    load_n(lr + v, x);
#pragma unroll
    for (int k = 0; k < N; ++k) sum += static_cast<double>(expf(x[k] - row_max));
  }
  const double row_sum = block_sum(sum, scratch);
  if (threadIdx.x != 0) return;
  const int32_t target = targets[row];
  if (target >= total) {
    record_error(error, kCrossEntropyShardStatsTarget, row, target, total);
    sum_exp[row] = NAN;
    target_logit[row] = NAN;
    return;
  }
  const int64_t column = static_cast<int64_t>(target) - begin;
  sum_exp[row] = static_cast<float>(row_sum);
  target_logit[row] = target >= 0 && column >= 0 && column < vocab ? load(lr + column) : 0.0f;
}

__global__ void cross_entropy_finish_kernel(const float* __restrict__ max, const float* __restrict__ sum_exp,
                                            const float* __restrict__ target_logit, const int32_t* __restrict__ targets,
                                            float* __restrict__ losses, float* __restrict__ lse, int64_t rows) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float row_lse = static_cast<float>(static_cast<double>(max[r]) + log(static_cast<double>(sum_exp[r])));
    lse[r] = row_lse;
    losses[r] = targets[r] < 0 ? 0.0f : row_lse - target_logit[r];
  }
}

}  // namespace

template <typename T>
void cross_entropy_forward(const KernelContext& ctx, const T* logits, const int32_t* targets, float* losses, float* lse,
                           int64_t rows, int64_t vocab, float grad_scale, T* dlogits) {
  if (rows == 0) return;
  const bool vector = vector_ok<T>(vocab, logits) && (dlogits == nullptr || vector_ok<T>(vocab, dlogits));
  with_width<T>(vector, [&](auto width) {
    constexpr int N = decltype(width)::value;
    const unsigned blocks = static_cast<unsigned>(rows);
    const int threads = row_threads(vocab / N, kMaxThreads);
    if (dlogits == nullptr) {
      cross_entropy_row_kernel<T, N, false><<<blocks, threads, 0, ctx.stream>>>(logits, targets, losses, lse, 0.0f,
                                                                                nullptr, vocab, ctx.error);
    } else {
      cross_entropy_row_kernel<T, N, true><<<blocks, threads, 0, ctx.stream>>>(logits, targets, losses, lse,
                                                                               grad_scale, dlogits, vocab, ctx.error);
    }
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void cross_entropy_backward(const KernelContext& ctx, const T* logits, const int32_t* targets, const float* lse,
                            float grad_scale, T* dlogits, int64_t rows, int64_t vocab, int64_t vocab_begin,
                            int64_t vocab_total) {
  if (rows == 0) return;
  with_width<T>(vector_ok<T>(vocab, logits, dlogits), [&](auto width) {
    constexpr int N = decltype(width)::value;
    const int threads = row_threads(vocab / N, kMaxThreads);
    cross_entropy_backward_kernel<T, N><<<static_cast<unsigned>(rows), threads, 0, ctx.stream>>>(
        logits, targets, lse, grad_scale, dlogits, vocab, vocab_begin, vocab_total, ctx.error);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void row_max(const KernelContext& ctx, const T* x, float* max, int64_t rows, int64_t columns) {
  if (rows == 0) return;
  with_width<T>(vector_ok<T>(columns, x), [&](auto width) {
    constexpr int N = decltype(width)::value;
    const int threads = row_threads(columns / N, kMaxThreads);
    row_max_kernel<T, N><<<static_cast<unsigned>(rows), threads, 0, ctx.stream>>>(x, max, columns);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void cross_entropy_shard_stats(const KernelContext& ctx, const T* logits, const int32_t* targets, const float* max,
                               float* sum_exp, float* target_logit, int64_t rows, int64_t vocab, int64_t vocab_begin,
                               int64_t vocab_total) {
  if (rows == 0) return;
  with_width<T>(vector_ok<T>(vocab, logits), [&](auto width) {
    constexpr int N = decltype(width)::value;
    const int threads = row_threads(vocab / N, kMaxThreads);
    cross_entropy_shard_stats_kernel<T, N><<<static_cast<unsigned>(rows), threads, 0, ctx.stream>>>(
        logits, targets, max, sum_exp, target_logit, vocab, vocab_begin, vocab_total, ctx.error);
  });
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void cross_entropy_finish(const KernelContext& ctx, const float* max, const float* sum_exp, const float* target_logit,
                          const int32_t* targets, float* losses, float* lse, int64_t rows) {
  if (rows == 0) return;
  constexpr int kThreads = 256;
  cross_entropy_finish_kernel<<<grid_for(rows, kThreads), kThreads, 0, ctx.stream>>>(max, sum_exp, target_logit,
                                                                                     targets, losses, lse, rows);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template void cross_entropy_forward<float>(const KernelContext&, const float*, const int32_t*, float*, float*, int64_t,
                                           int64_t, float, float*);
template void cross_entropy_backward<float>(const KernelContext&, const float*, const int32_t*, const float*, float,
                                            float*, int64_t, int64_t, int64_t, int64_t);
template void cross_entropy_forward<bf16>(const KernelContext&, const bf16*, const int32_t*, float*, float*, int64_t,
                                          int64_t, float, bf16*);
template void cross_entropy_backward<bf16>(const KernelContext&, const bf16*, const int32_t*, const float*, float,
                                           bf16*, int64_t, int64_t, int64_t, int64_t);
template void row_max<float>(const KernelContext&, const float*, float*, int64_t, int64_t);
template void row_max<bf16>(const KernelContext&, const bf16*, float*, int64_t, int64_t);
template void cross_entropy_shard_stats<float>(const KernelContext&, const float*, const int32_t*, const float*, float*,
                                               float*, int64_t, int64_t, int64_t, int64_t);
template void cross_entropy_shard_stats<bf16>(const KernelContext&, const bf16*, const int32_t*, const float*, float*,
                                              float*, int64_t, int64_t, int64_t, int64_t);

}  // namespace primus::cuda
