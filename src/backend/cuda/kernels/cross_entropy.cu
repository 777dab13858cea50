// Softmax cross-entropy on the GPU, one block per row, same formulas as the CPU backend
// (src/backend/cpu/cross_entropy.cpp):
//   lse = max + log Σ exp(logit − max)  (Σ in double, block tree order)    loss = lse − logit[target]
//   dlogits = grad_scale · (exp(logit − lse) − onehot(target))
// Rows with a negative target are ignored (loss 0, gradient 0). A target ≥ V is recorded for the host and
// its row's outputs become NaN. Backward may write over logits (dlogits aliasing logits): every thread reads
// the target logit before a barrier, then each element is read and written by the same thread, so the
// pointers carry no __restrict__. cross_entropy_forward with dlogits does both in one launch (the loss layer
// forms the gradient as soon as the logits exist): one read of the row for the statistics, one to write the
// gradient.
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kMaxThreads = 512;

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
    const float fill = target < 0 ? 0.0f : NAN;
    for (int64_t v = threadIdx.x * N; v < vocab; v += blockDim.x * N) {
      float x[N];
      load_n(lr + v, x);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float p = expf(x[k] - row_lse);
        x[k] = !counted ? fill : (v + k == target ? scale * (p - 1.0f) : scale * p);
      }
      store_n(dr + v, x);
    }
  }
}

template <typename T>
__global__ void cross_entropy_backward_kernel(const T* logits, const int32_t* __restrict__ targets,
                                              const float* __restrict__ lse, float scale, T* dlogits, int64_t vocab,
                                              DeviceError* error) {
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;  // [V]
  T* dr = dlogits + row * vocab;       // [V], possibly the same memory as lr
  const int32_t target = targets[row];
  if (target < 0 || target >= vocab) {
    if (target >= vocab && threadIdx.x == 0) record_error(error, kCrossEntropyBackwardTarget, row, target, vocab);
    const float value = target < 0 ? 0.0f : NAN;
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) store(dr + v, value);
    return;
  }
  const float row_lse = lse[row];
  const float target_logit = load(lr + target);
  __syncthreads();  // the target logit is read by every thread before any thread overwrites it
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float p = expf(load(lr + v) - row_lse);
    store(dr + v, v == target ? scale * (expf(target_logit - row_lse) - 1.0f) : scale * p);
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
                            float grad_scale, T* dlogits, int64_t rows, int64_t vocab) {
  if (rows == 0) return;
  cross_entropy_backward_kernel<T><<<static_cast<unsigned>(rows), row_threads(vocab, kMaxThreads), 0, ctx.stream>>>(
      logits, targets, lse, grad_scale, dlogits, vocab, ctx.error);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template void cross_entropy_forward<float>(const KernelContext&, const float*, const int32_t*, float*, float*, int64_t,
                                           int64_t, float, float*);
template void cross_entropy_backward<float>(const KernelContext&, const float*, const int32_t*, const float*, float,
                                            float*, int64_t, int64_t);
template void cross_entropy_forward<bf16>(const KernelContext&, const bf16*, const int32_t*, float*, float*, int64_t,
                                          int64_t, float, bf16*);
template void cross_entropy_backward<bf16>(const KernelContext&, const bf16*, const int32_t*, const float*, float,
                                           bf16*, int64_t, int64_t);

}  // namespace primus::cuda
