// Tensor parallelism over the vocabulary, simulated in one process: the vocabulary V is split over `ranks` shards,
// each shard's ops run on its columns of the logits or its rows of the embedding table, and the group's
// reductions (the max and the sums of the loss layer's all-reduces, the sum of the embedding outputs) are done here
// on the host, in rank order. The CPU tests, the finite-difference test and the GPU tests of the
// vocabulary-parallel ops compare the results with the unsharded ops.
#pragma once

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/ops.h"
#include "support/test_support.h"

namespace primus::testing {

// Rank r's first vocabulary row; uneven splits (V not a multiple of ranks) are allowed, the ops do not need padding.
inline int64_t shard_begin(int64_t vocab, int ranks, int r) { return vocab * r / ranks; }

inline VocabShard vocab_shard(int64_t vocab, int ranks, int r) { return {shard_begin(vocab, ranks, r), vocab}; }

// Columns [begin, end) of t [N, V] (any dtype) as a new [N, end − begin] tensor on t's device.
inline Tensor columns(const Tensor& t, int64_t begin, int64_t end) {
  const Tensor h = ops::to_device(t, kCpuDevice);
  const int64_t rows = h.dim(0), width = end - begin;
  const size_t element = dtype_size(h.dtype());
  Tensor part = Tensor::empty({rows, width}, h.dtype());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(part.data()) + r * width * element,
                static_cast<const char*>(h.data()) + (r * h.dim(1) + begin) * element, width * element);
  }
  return ops::to_device(part, t.device());
}

// Rows [begin, end) of t [V, C] as a new tensor on t's device.
inline Tensor table_rows(const Tensor& t, int64_t begin, int64_t end) {
  return ops::to_device(t.slice_elements(begin * t.dim(1), {end - begin, t.dim(1)}), t.device());
}

// Every byte 0xFF (NaN in f32 and bf16) on `device`: outputs start poisoned, so an element an op forgets to write
// fails the comparisons.
inline Tensor nan_tensor(const Shape& shape, DType dtype, Device device) {
  Tensor h = Tensor::empty(shape, dtype);
  std::memset(h.data(), 0xFF, h.nbytes());
  return ops::to_device(h, device);
}

struct VocabParallelLoss {
  Tensor losses, lse;  // [N] f32 on the host
  Tensor dlogits;      // [N, V] f32 on the host: the ranks' columns side by side
};

// Cross-entropy of logits [N, V] (f32, or bf16 on a GPU) with targets [N] (on logits' device) through the
// vocabulary-parallel ops over `ranks` shards: row_max, the group max, cross_entropy_shard_stats, the group sums
// (f32, rank order), cross_entropy_finish, then each rank's cross_entropy_backward written over its own logits, as
// the loss layer does.
inline VocabParallelLoss vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int ranks,
                                                      float grad_scale) {
  const Device device = logits.device();
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  std::vector<Tensor> local(ranks);
  Tensor max = Tensor::empty({n}, DType::kF32);
  max.fill(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < ranks; ++r) {
    local[r] = columns(logits, shard_begin(vocab, ranks, r), shard_begin(vocab, ranks, r + 1));
    Tensor local_max = nan_tensor({n}, DType::kF32, device);
    ops::row_max(local[r], local_max);
    const Tensor h = ops::to_device(local_max, kCpuDevice);
    for (int64_t i = 0; i < n; ++i) max.f32()[i] = std::max(max.f32()[i], h.f32()[i]);
  }
  const Tensor group_max = ops::to_device(max, device);
  Tensor sum_exp = Tensor::zeros({n}, DType::kF32), target_logit = Tensor::zeros({n}, DType::kF32);
  for (int r = 0; r < ranks; ++r) {
    Tensor part_sum = nan_tensor({n}, DType::kF32, device), part_target = nan_tensor({n}, DType::kF32, device);
    ops::cross_entropy_shard_stats(local[r], targets, vocab_shard(vocab, ranks, r), group_max, part_sum, part_target);
    const Tensor hs = ops::to_device(part_sum, kCpuDevice), ht = ops::to_device(part_target, kCpuDevice);
    for (int64_t i = 0; i < n; ++i) {
      sum_exp.f32()[i] += hs.f32()[i];
      target_logit.f32()[i] += ht.f32()[i];
    }
  }
  Tensor losses = nan_tensor({n}, DType::kF32, device), lse = nan_tensor({n}, DType::kF32, device);
  ops::cross_entropy_finish(group_max, ops::to_device(sum_exp, device), ops::to_device(target_logit, device), targets,
                            losses, lse);
  VocabParallelLoss result{host_f32(losses), host_f32(lse), nan_tensor({n, vocab}, DType::kF32, kCpuDevice)};
  for (int r = 0; r < ranks; ++r) {
    ops::cross_entropy_backward(local[r], targets, lse, grad_scale, local[r], vocab_shard(vocab, ranks, r));
    const Tensor d = host_f32(local[r]);
    const int64_t begin = shard_begin(vocab, ranks, r), width = d.dim(1);
    for (int64_t i = 0; i < n; ++i) std::copy_n(d.f32() + i * width, width, result.dlogits.f32() + i * vocab + begin);
  }
  return result;
}

struct VocabParallelEmbedding {
  Tensor out;     // [N, C] f32 on the host: the ranks' outputs summed (the layer's all-reduce)
  Tensor dtable;  // [V, C] f32 on the host: the ranks' gradient rows stacked
};

// Embedding of ids [N] (on table's device) in table [V, C] split by rows over `ranks` shards: each rank's forward
// on its rows, and its backward of dout [N, C] accumulated into its rows of dtable0 [V, C] f32 (not changed).
inline VocabParallelEmbedding vocab_parallel_embedding(const Tensor& ids, const Tensor& table, const Tensor& dout,
                                                       const Tensor& dtable0, int ranks) {
  const Device device = table.device();
  const int64_t n = ids.numel(), vocab = table.dim(0), channels = table.dim(1);
  VocabParallelEmbedding result{Tensor::zeros({n, channels}, DType::kF32),
                                nan_tensor({vocab, channels}, DType::kF32, kCpuDevice)};
  for (int r = 0; r < ranks; ++r) {
    const int64_t begin = shard_begin(vocab, ranks, r), end = shard_begin(vocab, ranks, r + 1);
    const VocabShard shard = vocab_shard(vocab, ranks, r);
    Tensor out = nan_tensor({n, channels}, table.dtype(), device);
    ops::embedding_forward(ids, table_rows(table, begin, end), out, shard);
    const Tensor h = host_f32(out);
    for (int64_t i = 0; i < n * channels; ++i) result.out.f32()[i] += h.f32()[i];
    Tensor dtable = table_rows(dtable0, begin, end);
    ops::embedding_backward(ids, dout, dtable, shard);
    const Tensor hd = ops::to_device(dtable, kCpuDevice);
    std::copy_n(hd.f32(), hd.numel(), result.dtable.f32() + begin * channels);
  }
  return result;
}

}  // namespace primus::testing
