// Softmax cross-entropy on the GPU, one block per row, same formulas as the CPU backend
// (src/backend/cpu/cross_entropy.cpp):
//   lse = max + log Σ exp(logit − max)  (Σ in double, block tree order)    loss = lse − logit[target]
//   dlogits = grad_scale · (exp(logit − lse) − onehot(target))
// Rows with a negative target are ignored (loss 0, gradient 0). A target ≥ V is recorded for the host and
// its row's outputs become NaN. Backward may write over logits (dlogits aliasing logits): every thread reads
// the target logit before a barrier, then each element is read and written by the same thread, so the
// pointers carry no __restrict__.
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kMaxThreads = 512;

template <typename T>
__global__ void cross_entropy_forward_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                                             float* __restrict__ losses, float* __restrict__ lse, int64_t vocab,
                                             DeviceError* error) {
  __shared__ float max_scratch[kWarpSize];
  __shared__ double sum_scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;  // [V]
  float max = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) max = fmaxf(max, load(lr + v));
  max = block_max(max, max_scratch);
  double sum = 0.0;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) sum += expf(load(lr + v) - max);
  sum = block_sum(sum, sum_scratch);
  if (threadIdx.x != 0) return;
  const float row_lse = static_cast<float>(static_cast<double>(max) + log(sum));
  lse[row] = row_lse;
  const int32_t target = targets[row];
  if (target >= vocab) {
    record_error(error, kCrossEntropyForwardTarget, row, target, vocab);
    losses[row] = NAN;
  } else {
    losses[row] = target < 0 ? 0.0f : row_lse - load(lr + target);
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
                           int64_t rows, int64_t vocab) {
  if (rows == 0) return;
  cross_entropy_forward_kernel<T><<<static_cast<unsigned>(rows), row_threads(vocab, kMaxThreads), 0, ctx.stream>>>(
      logits, targets, losses, lse, vocab, ctx.error);
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
                                           int64_t);
template void cross_entropy_backward<float>(const KernelContext&, const float*, const int32_t*, const float*, float,
                                            float*, int64_t, int64_t);
template void cross_entropy_forward<bf16>(const KernelContext&, const bf16*, const int32_t*, float*, float*, int64_t,
                                          int64_t);
template void cross_entropy_backward<bf16>(const KernelContext&, const bf16*, const int32_t*, const float*, float,
                                           bf16*, int64_t, int64_t);

}  // namespace primus::cuda
