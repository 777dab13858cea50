// Data parallelism for one training step, as Megatron-Core's DDP and distributed optimizer do it: what a
// data-parallel rank adds to a single-device step. The step calls, in order:
//   global_tokens()             the global batch's label count (every rank scales its loss by 1 / it)
//   before_last_backward() + grads_ready hook on the backward that completes the gradients + after_backward()
//   grad_norm()                 the global gradient norm (from full reduced gradients, or from the shards)
//   after_optimizer()           all-gathers the updated weights (distributed optimizer)
// A data-parallel size of 1 goes through the same calls on a one-rank communicator.
#pragma once

#include <memory>
#include <vector>

#include "ops/param_store.h"
#include "parallel/grad_reducer.h"

namespace primus {

struct DataParallelOptions {
  bool distributed_optimizer = false;  // use_distributed_optimizer (or FSDP's optim strategy)
  bool overlap_grad_reduce = false;
  int64_t bucket_size = 40'000'000;    // ddp_bucket_size, parameters
};

class DataParallel {
 public:
  // `params` lives on the dp group's device and outlives this object.
  DataParallel(std::shared_ptr<Communicator> dp, ParamStore& params, DataParallelOptions options);

  Communicator& group() { return *dp_; }
  int rank() const { return dp_->rank(); }
  int size() const { return dp_->size(); }
  bool sharded() const { return options_.distributed_optimizer; }
  // The ranges whose optimizer state this rank keeps: its shards, or everything.
  std::vector<FlatRange> optimizer_ranges() const;
  // This rank's shards of the bucket layout, distributed optimizer or not: the part of a checkpoint it writes
  // (together the ranks write every element once, in parallel).
  std::vector<FlatRange> shard_ranges() const { return reducer_.layout().owned(dp_->rank()); }

  int64_t global_tokens(int64_t local_tokens);
  // Σ over the group of a host value, carried in f32 (NCCL reduces device memory; there is no f64 tensor):
  // 1e-7 relative, far below what a logged loss or the clip factor resolves.
  double sum(double local);
  // loss_sum [1] f32 on the group's device: summed over the group in place.
  void sum_losses(Tensor& loss_sum);
  // True on every rank when `flag` is true on any (a stop signal seen by one rank stops all at one step).
  bool any(bool flag);

  void before_last_backward() { reducer_.start(); }
  GradsReadyFn grads_ready_hook();
  void after_backward() { reducer_.finish(); }

  // The L2 norm of the global batch's gradient, the same on every rank.
  double grad_norm();
  // After AdamW updated this rank's shards of the fp32 weights: every rank gets them all (a no-op unless
  // sharded). The caller refreshes any compute copy of the weights.
  void after_optimizer();

 private:
  std::shared_ptr<Communicator> dp_;
  ParamStore& params_;
  DataParallelOptions options_;
  GradReducer reducer_;
};

}  // namespace primus
