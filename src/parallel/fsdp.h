// Fully sharded data parallelism as Megatron-FSDP's optim_grads (ZeRO-2) and optim_grads_params (ZeRO-3)
// strategies and PyTorch's FSDP2 do it, over a model's parameter units (Model::param_units: the embedding, each
// block, the final norm with the output layer).
//
// Each unit of n elements is cut into dp shards of s = ceil(n / dp); rank r owns shard r (the last shards may
// reach past the unit's end into zero padding). Per rank, packed one unit after another ([Σ s] each):
//   master    fp32 weights of its shards, which the optimizer updates (AdamW with PackedShards)
//   grads     the reduced fp32 gradients of its shards
//   compute   its shards in the compute dtype, what the weight all-gathers send (in fp32: master itself)
// and per unit, buffers of dp × s elements that the model's modules view (UnitBuffers):
//   weights   the gathered unit in the compute dtype
//   gradient  the unit's gradient of one micro-batch
// After each micro-batch's backward of a unit its gradient is reduce-scattered into the rank's gradient shard (the
// shard of the earlier micro-batches is first added to the rank's own part, so the sum is one collective), on the
// communication stream while backward goes on, and the gradient buffer is freed. ZeRO-2 keeps every unit's
// weights gathered and all-gathers them after each optimizer step (with overlap_param_gather during the next
// forward: each unit is waited for just before its use). ZeRO-3 frees a block's weights after its forward and
// after its backward and gathers them just before use, prefetching the next block's (in forward order, then in
// backward order) while the current one computes. The embedding and the final norm with the output layer (the
// first and last unit) stay gathered with their gradients through the step: the output layer (tied or not)
// writes its gradient in the loss's forward.
//
// take_weights() takes the weights from the ParamStore's flat buffers and frees those: load or initialise first.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/param_store.h"
#include "parallel/comm_stream.h"
#include "ops/communicator.h"

namespace primus {

class FullyShardedDataParallel final : public ParamUnitHooks {
 public:
  enum class Strategy { kOptimGrads, kOptimGradsParams };

  // `params` (on the group's device) must outlive this object; units tile [0, params.numel()) in forward order.
  FullyShardedDataParallel(Communicator& dp, ParamStore& params, std::vector<FlatRange> units, DType compute_dtype,
                           Strategy strategy, bool overlap_param_gather);

  Strategy strategy() const { return strategy_; }
  // This rank's part of each unit (cut at the unit's end; empty parts left out), in unit order, and where each
  // starts in the packed shard buffers: the optimizer's ranges and PackedShards offsets.
  const std::vector<FlatRange>& owned() const { return owned_; }
  const std::vector<int64_t>& owned_offsets() const { return owned_offsets_; }
  const Tensor& master_shards() const { return master_; }
  const Tensor& grad_shards() const { return grad_shards_; }
  // Undefined in fp32 (the master shards are the compute shards).
  const Tensor& compute_shards() const { return compute_shards_; }

  // Once, after the flat weights were initialised or loaded: copies this rank's shards, gathers the units the
  // strategy keeps, frees the ParamStore's flat buffers. Returns what the model's modules must view (bind_units).
  UnitBuffers take_weights();

  // The step: begin_step(), then per micro-batch begin_micro_batch() before its forward; the hooks reduce each
  // unit's gradient as backward finishes it; finish_backward() after the last backward waits for every reduction.
  void begin_step();
  void begin_micro_batch();
  void finish_backward();
  // Σ g² over this rank's gradient shards.
  double local_grad_sum_squares() const;
  // After the optimizer updated the shards: the gathers of the units the strategy keeps (waited for at once, or
  // unit by unit in the next forward with overlap_param_gather).
  void after_optimizer();

  // Where its collectives run.
  CommStream& comm() { return comm_; }

  void before_forward(size_t unit) override;
  void after_forward(size_t unit) override;
  void before_backward(size_t unit) override;
  void after_backward(size_t unit) override;

 private:
  struct Unit {
    FlatRange range;
    int64_t shard = 0;   // s = ceil(n / dp)
    int64_t packed = 0;  // where this unit's shard starts in the packed buffers
    Tensor weights;      // [dp × s] compute dtype
    Tensor grads;        // [dp × s] f32
    bool gathering = false;         // a gather into weights is launched or done since the last release
    CommStream::Ticket gathered;    // that gather
    CommStream::Ticket reduced;     // the last reduce-scatter of its gradient
    bool has_grad = false;          // its gradient shard holds this step's micro-batches so far
    bool grads_live = false;        // materialized and zeroed for the backward under way
  };

  bool outer(size_t u) const { return u == 0 || u + 1 == units_.size(); }
  bool keeps_weights(size_t u) const { return strategy_ == Strategy::kOptimGrads || outer(u); }
  // Shard u of the packed buffers: [s].
  Tensor shard_of(const Tensor& packed, size_t u) const;
  void launch_gather(size_t u);
  void ensure_gathered(size_t u);
  void prefetch(size_t u);
  void release_weights(size_t u);

  Communicator& dp_;
  ParamStore& params_;
  DType compute_dtype_;
  Strategy strategy_;
  bool overlap_param_gather_;
  CommStream comm_;
  std::vector<Unit> units_;
  std::vector<FlatRange> owned_;
  std::vector<int64_t> owned_offsets_;
  Tensor master_;          // [Σ s] f32
  Tensor grad_shards_;     // [Σ s] f32
  Tensor compute_shards_;  // [Σ s] compute dtype (bf16 only)
  bool taken_ = false;
};

}  // namespace primus
