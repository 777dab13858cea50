// The collectives tensor parallelism inserts into a model's forward and backward (Megatron's mappings between
// parallel regions), over the tensor-parallel group the parallel code hands the model. The model calls them
// unconditionally: with one rank (no group) each is nothing, so single-device code has no branch for them.
//
//   - sum: the output of a row-parallel projection (o_proj, down_proj: each rank multiplies its slice of the
//     inner dimension, the partial products add up), the input gradient of column-parallel projections
//     (q/k/v, gate/up: each rank's heads or columns give part of it), the rows of a vocabulary-parallel
//     embedding (zero outside the rank's vocabulary slice), the per-row statistics of a vocabulary-parallel
//     cross-entropy;
//   - max: the row maxima of that cross-entropy;
//   - gather_columns: logits of a vocabulary-parallel output layer, for sampling;
//   - sequence parallelism (Megatron's sequence_parallel) keeps the hidden state between the tensor-parallel
//     regions as rank r's r-th of its rows: gather_rows before the column-parallel projections (and the output
//     layer), reduce_scatter_rows after the row-parallel ones and the embedding, in place of `sum`. Each is the
//     other's backward: the gradient of gathered rows is reduce-scattered, that of scattered sums gathered.
// On a GPU each collective is queued on the compute stream (it joins the computation's order, no host wait).
#pragma once

#include <memory>

#include "core/tensor.h"
#include "ops/communicator.h"

namespace primus {

class TensorParallelGroup {
 public:
  TensorParallelGroup() = default;
  explicit TensorParallelGroup(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}

  int size() const { return comm_ ? comm_->size() : 1; }
  int rank() const { return comm_ ? comm_->rank() : 0; }

  void sum(Tensor& x) const;
  void max(Tensor& x) const;
  // [n, c] on each rank -> [n, size · c], rank r's columns at [r·c, (r+1)·c).
  Tensor gather_columns(const Tensor& x) const;
  // [n, c] on each rank -> [size · n, c], rank r's rows at [r·n, (r+1)·n).
  Tensor gather_rows(const Tensor& x) const;
  // [n, c] partial sums on each rank, n divisible by size -> [n / size, c]: rank r's n/size rows of the sum.
  Tensor reduce_scatter_rows(const Tensor& x) const;

 private:
  std::shared_ptr<Communicator> comm_;
};

}  // namespace primus
