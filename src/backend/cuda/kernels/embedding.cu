// Token embedding on the GPU.
// Forward: one block per token copies its table row (f32 or bf16, bits unchanged). An id outside [0, total) is
// recorded for the host and its output row becomes NaN, so nothing outside the table is read.
// Backward (dtable += scatter of dout, deterministic): a stable radix sort of (row, token) pairs groups the
// tokens of each row in token order; then one block per run of equal rows adds that run's dout rows to the
// table row, in token order, starting from the row's current value. Every table row is written by one block
// and summed in the same order as the CPU backend, so the result is bitwise reproducible and equal to the
// CPU's. Ids that are invalid or not held here are sorted to a sentinel key (the table's row count) and
// skipped. dtable is fp32 for either dout dtype (a bf16 dout widens exactly, so the sums equal the CPU's on the
// same rounded values).
// Vocabulary shards (tensor parallelism): the table holds rows [begin, begin + rows) of a vocabulary of `total`;
// an id held here uses row id − begin, another valid id gives a zero output row and no gradient. Unsharded is
// begin 0, total = rows.
#include <bit>
#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/kernels/common.cuh"

namespace primus::cuda {

namespace {

constexpr int kMaxThreads = 256;

// The table row of an id in [0, total): id − begin when this shard holds it, else -1.
__device__ __forceinline__ int64_t held_row(int32_t id, int64_t rows, int64_t begin) {
  const int64_t row = static_cast<int64_t>(id) - begin;
  return row >= 0 && row < rows ? row : -1;
}

template <typename T>
__global__ void embedding_forward_kernel(const int32_t* __restrict__ ids, const T* __restrict__ table,
                                         T* __restrict__ out, int64_t rows, int64_t channels, int64_t begin,
                                         int64_t total, int error_code, DeviceError* error) {
  const int64_t token = blockIdx.x;
  const int32_t id = ids[token];
  T* dst = out + token * channels;  // [C]
  if (id < 0 || id >= total) {
    if (threadIdx.x == 0) record_error(error, error_code, token, id, total);
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) store(dst + c, NAN);
    return;
  }
  const int64_t row = held_row(id, rows, begin);
  if (row < 0) {  // another shard's id
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) store(dst + c, 0.0f);
    return;
  }
  const T* src = table + row * channels;  // [C]
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) dst[c] = src[c];
}

// keys[i] = the table row of ids[i] (rows for an invalid id or one not held here), tokens[i] = i.
__global__ void embedding_keys_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ keys,
                                      int32_t* __restrict__ tokens, int64_t n, int64_t rows, int64_t begin,
                                      int64_t total, int error_code, DeviceError* error) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t id = ids[i];
    const bool valid = id >= 0 && id < total;
    if (!valid) record_error(error, error_code, i, id, total);
    const int64_t row = valid ? held_row(id, rows, begin) : -1;
    keys[i] = static_cast<int32_t>(row < 0 ? rows : row);
    tokens[i] = static_cast<int32_t>(i);
  }
}

// Block i handles the run of equal keys that starts at sorted position i (other blocks exit at once).
template <typename T>
__global__ void embedding_backward_kernel(const int32_t* __restrict__ keys, const int32_t* __restrict__ tokens,
                                          const T* __restrict__ dout, float* __restrict__ dtable, int64_t n,
                                          int64_t rows, int64_t channels) {
  const int64_t start = blockIdx.x;
  const int32_t key = keys[start];
  if (key == rows || (start > 0 && keys[start - 1] == key)) return;
  float* dst = dtable + static_cast<int64_t>(key) * channels;  // [C]
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    float acc = load(dst + c);
    for (int64_t j = start; j < n && keys[j] == key; ++j)
      acc += load(dout + static_cast<int64_t>(tokens[j]) * channels + c);
    store(dst + c, acc);
  }
}

// The code of a bad id: the unsharded table, or the vocabulary a shard is part of (the host's wording differs).
int id_error_code(int64_t rows, int64_t begin, int64_t total, bool forward) {
  const bool sharded = begin != 0 || total != rows;
  if (forward) return sharded ? kEmbeddingForwardVocabId : kEmbeddingForwardId;
  return sharded ? kEmbeddingBackwardVocabId : kEmbeddingBackwardId;
}

}  // namespace

template <typename T>
void embedding_forward(const KernelContext& ctx, const int32_t* ids, const T* table, T* out, int64_t n, int64_t rows,
                       int64_t channels, int64_t vocab_begin, int64_t vocab_total) {
  if (n == 0 || channels == 0) return;
  embedding_forward_kernel<T><<<static_cast<unsigned>(n), row_threads(channels, kMaxThreads), 0, ctx.stream>>>(
      ids, table, out, rows, channels, vocab_begin, vocab_total, id_error_code(rows, vocab_begin, vocab_total, true),
      ctx.error);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void embedding_backward(const KernelContext& ctx, const int32_t* ids, const T* dout, float* dtable, int64_t n,
                        int64_t rows, int64_t channels, int64_t vocab_begin, int64_t vocab_total) {
  if (n == 0 || channels == 0) return;
  const int items = static_cast<int>(n);
  const size_t index_bytes = static_cast<size_t>(n) * sizeof(int32_t);
  DeviceBuffer keys_in(*ctx.allocator, index_bytes);
  DeviceBuffer keys_out(*ctx.allocator, index_bytes);
  DeviceBuffer tokens_in(*ctx.allocator, index_bytes);
  DeviceBuffer tokens_out(*ctx.allocator, index_bytes);
  constexpr int kThreads = 256;
  embedding_keys_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
      ids, keys_in.as<int32_t>(), tokens_in.as<int32_t>(), n, rows, vocab_begin, vocab_total,
      id_error_code(rows, vocab_begin, vocab_total, false), ctx.error);
  PRIMUS_CUDA_CHECK_LAUNCH();

  // Keys lie in [0, rows]: sort only the bits that can differ.
  const int end_bit = std::bit_width(static_cast<uint32_t>(rows));
  size_t temp_bytes = 0;
  PRIMUS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<int32_t>(), keys_out.as<int32_t>(),
                                                    tokens_in.as<int32_t>(), tokens_out.as<int32_t>(), items, 0,
                                                    end_bit, ctx.stream));
  DeviceBuffer temp(*ctx.allocator, temp_bytes);
  PRIMUS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in.as<int32_t>(),
                                                    keys_out.as<int32_t>(), tokens_in.as<int32_t>(),
                                                    tokens_out.as<int32_t>(), items, 0, end_bit, ctx.stream));

  embedding_backward_kernel<T><<<static_cast<unsigned>(n), row_threads(channels, kMaxThreads), 0, ctx.stream>>>(
      keys_out.as<int32_t>(), tokens_out.as<int32_t>(), dout, dtable, n, rows, channels);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template void embedding_forward<float>(const KernelContext&, const int32_t*, const float*, float*, int64_t, int64_t,
                                       int64_t, int64_t, int64_t);
template void embedding_forward<bf16>(const KernelContext&, const int32_t*, const bf16*, bf16*, int64_t, int64_t,
                                      int64_t, int64_t, int64_t);
template void embedding_backward<float>(const KernelContext&, const int32_t*, const float*, float*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t);
template void embedding_backward<bf16>(const KernelContext&, const int32_t*, const bf16*, float*, int64_t, int64_t,
                                       int64_t, int64_t, int64_t);

}  // namespace primus::cuda
