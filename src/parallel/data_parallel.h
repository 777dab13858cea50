// Data parallelism for one training step, as Megatron-Core's DDP, distributed optimizer and Megatron-FSDP do it:
// what a data-parallel rank adds to a single-device step. The step calls, in order:
//   global_tokens()             the global batch's label count (every rank scales its loss by 1 / it)
//   zero_grads()
//   per micro-batch: begin_micro_batch() before its forward; around its backward before_backward(last) with the
//   grads_ready hook, and after_backward(last)
//   sum_tensor_parallel_grads() the model's partial gradients summed over the tensor-parallel group (a no-op without)
//   grad_norm()                 the global gradient norm (from full reduced gradients, or from the shards)
//   after_optimizer()           all-gathers the updated weights (distributed optimizer, FSDP)
// Fully sharded strategies (parallel/fsdp.h) also need take_weights() once the weights are loaded, and the model
// calls their unit hooks. A data-parallel size of 1 goes through the same calls on a one-rank communicator.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "ops/param_store.h"
#include "parallel/fsdp.h"
#include "parallel/grad_reducer.h"
#include "parallel/unit_residency.h"

namespace primus {

struct DataParallelOptions {
  bool distributed_optimizer = false;  // use_distributed_optimizer (or FSDP's optim strategy)
  bool overlap_grad_reduce = false;
  int64_t bucket_size = 40'000'000;    // ddp_bucket_size, parameters
  // use_megatron_fsdp with optim_grads or optim_grads_params: sharded by parameter unit instead of buckets.
  std::optional<FullyShardedDataParallel::Strategy> fully_sharded;
  bool overlap_param_gather = false;   // gathers after the step overlap the next forward (sharded only)
  std::vector<FlatRange> units;        // the model's parameter units (FSDP, overlap_param_gather, unit_residency)
  DType compute_dtype = DType::kF32;   // FSDP: the dtype of the gathered weights; unit_residency: of the copy
  // A single rank without model parallelism or sharding: gradients and the compute copy held only while the step
  // needs them (parallel/unit_residency.h), the experts' weights (Model::expert_weight_ranges) as pieces of their own.
  bool unit_residency = false;
  std::vector<FlatRange> expert_weights;
  // Tensor parallelism: the group whose ranks hold the other slices of this replica (null: none). The gradient
  // norm sums over it too, leaving out `tp_duplicates`: the ranges this rank holds that another rank of the group
  // holds too and counts (parameters every rank holds whole, on all but the group's first rank; replicated
  // key/value slices, on all but their replica 0). `tp_grad_sums`: the model's partial gradients, summed over the
  // group once per step (sum_tensor_parallel_grads).
  std::shared_ptr<Communicator> tp;
  std::vector<FlatRange> tp_duplicates;
  TensorParallelGradSums tp_grad_sums;
  // Pipeline parallelism: the ranks holding this replica's other parts, tp × pp (null: tp alone); the gradient norm
  // sums over it. `copies`: ranges of this rank's buffer whose parameters another stage holds too and owns (the last
  // stage's copy of a tied embedding): left out of the norm and out of checkpoints.
  std::shared_ptr<Communicator> model;
  std::vector<FlatRange> copies;
  // The whole job, when it is more than this group (model parallelism): any() decides over it, so that every rank
  // stops, saves or refuses a save at the same step.
  std::shared_ptr<Communicator> world;
  // Expert parallelism: the ranges of this rank's experts (Model::expert_ranges; empty: none), whose gradients are
  // summed, and whose optimizer state is sharded, over `expert_dp` (the ranks holding the same experts) instead of
  // the data-parallel group; `ep` (the ranks holding the other experts) sums their part of the gradient norm.
  std::vector<FlatRange> expert_ranges;
  std::shared_ptr<Communicator> expert_dp;
  std::shared_ptr<Communicator> ep;
};

class DataParallel final : public ParamUnitHooks {
 public:
  // `params` lives on the dp group's device and outlives this object.
  DataParallel(std::shared_ptr<Communicator> dp, ParamStore& params, DataParallelOptions options);

  Communicator& group() { return *dp_; }
  int rank() const { return dp_->rank(); }
  int size() const { return dp_->size(); }
  // The optimizer state is sharded (distributed optimizer or FSDP).
  bool sharded() const { return options_.distributed_optimizer || fsdp_ != nullptr; }
  // The fully sharded strategies, or null.
  FullyShardedDataParallel* fsdp() { return fsdp_.get(); }
  // A single rank's step-scoped buffers (unit_residency), or null. The step's update then goes by its pieces.
  UnitResidency* residency() { return residency_.get(); }
  // The ranges whose optimizer state this rank keeps: its shards, or everything.
  std::vector<FlatRange> optimizer_ranges() const;
  // This rank's shards (of the bucket layout, distributed optimizer or not, or of FSDP's units): the part of a
  // checkpoint it writes (together the ranks write every element once, in parallel).
  std::vector<FlatRange> shard_ranges() const;
  // What this rank writes into a checkpoint: its shards, less tp_duplicates and copies, so that every element of
  // every tensor is written once over the job.
  std::vector<FlatRange> checkpoint_ranges() const;
  // The whole job (the world of DataParallelOptions, or the group itself when there is none): a checkpoint is
  // saved by all of it.
  Communicator& job() { return options_.world ? *options_.world : *dp_; }

  int64_t global_tokens(int64_t local_tokens);
  // Σ over the group of a host value, carried in f32 (NCCL reduces device memory; there is no f64 tensor):
  // 1e-7 relative, far below what a logged loss or the clip factor resolves.
  double sum(double local);
  // loss_sum [1] f32 on the group's device: summed over the group in place.
  void sum_losses(Tensor& loss_sum);
  // A small f32 tensor on the group's device: the element-wise max in place over the group and, under tensor
  // parallelism, the tensor-parallel group too: every rank holding rows or slices of the same layers' tensors (fp8's
  // amaxes). Nothing at one rank.
  void max_in_place(Tensor& values);
  // True on every rank (of the job) when `flag` is true on any (a stop signal seen by one rank stops all at one
  // step).
  bool any(bool flag);
  // Before the caller's own collectives on group() (a checkpoint's): every collective launched here is done.
  void wait_for_communication();

  // Before the step's first forward: gradients (or FSDP's gradient shards) start from zero.
  void zero_grads();
  void begin_micro_batch();
  // `last`: the backward that completes the step's gradients (buckets reduce only then; FSDP reduces every one).
  // (Not the unit hook of the same name below, which the model calls with a unit index.)
  void before_backward(bool last);
  // The hook for that backward (empty when the reduction does not follow gradient ranges).
  GradsReadyFn grads_ready_hook(bool last);
  void after_backward(bool last);

  // After the last backward of a step: the gradients the model leaves partial per tensor-parallel rank
  // (tp_grad_sums) summed over the tensor-parallel group, in the part of the gradients this rank holds; one
  // collective. Before grad_norm().
  void sum_tensor_parallel_grads();
  // The L2 norm of the global batch's gradient, the same on every rank.
  double grad_norm();
  // After AdamW updated this rank's shards: every rank gets them all (a no-op unless sharded). The distributed
  // optimizer gathers `compute` (the weights the model reads: its bf16 copy, which AdamW wrote for this rank's
  // shards, or in fp32 the flat weights themselves); the fp32 master weights of other ranks' shards are then
  // stale on this rank, and only its own are saved. With overlap_param_gather the gathers finish as the next
  // forward reaches each unit (the hooks below).
  void after_optimizer(Tensor compute);
  // The hooks the model must call (set_param_hooks): FSDP's, or the distributed optimizer's waits for the
  // overlapped gathers; null when none are needed.
  ParamUnitHooks* param_hooks();

  void before_forward(size_t unit) override;
  void after_forward(size_t) override {}
  void before_backward(size_t unit) override { before_forward(unit); }
  void after_backward(size_t) override {}

 private:
  // The ranges this rank counts in the gradient norm and writes into checkpoints (of its shards): all but
  // tp_duplicates and the pipeline's copies.
  std::vector<FlatRange> counted_ranges() const;
  // The global Σ g² under expert parallelism: the shared parameters counted once, every rank's experts once.
  double expert_parallel_sum_squares(Communicator* parts);
  // Σ g² over the parts of `ranges` (of the flat buffer) whose reduced gradient this rank holds.
  double held_sum_squares(const std::vector<FlatRange>& ranges) const;
  // The reduced gradients of optimizer_ranges()' ranges, in order: views of the flat buffer or FSDP's shards.
  std::vector<Tensor> held_grads() const;
  // The queue of the group's background collectives, which the caller's own collectives follow.
  CommStream* comm() const { return fsdp_ ? &fsdp_->comm() : &reducer_->comm(); }

  std::shared_ptr<Communicator> dp_;
  // The same ranks for the step's scalar collectives (token count, losses, norm, stop flag): apart from the bulk
  // gradient and weight collectives queued on dp_, so they need not wait behind them (NCCL runs one
  // communicator's collectives in issue order) and, on CPU ranks, run on the caller's thread while dp_'s run on
  // the communication thread (Gloo takes one thread per communicator).
  std::unique_ptr<Communicator> control_;
  // Expert parallelism (else null): the expert-data-parallel group for the bulk gradient and weight collectives, and
  // the ep group for the gradient norm, each this object's own (DataParallel's collectives run on its threads).
  std::unique_ptr<Communicator> expert_dp_;
  std::unique_ptr<Communicator> ep_control_;
  ParamStore& params_;
  DataParallelOptions options_;
  std::unique_ptr<GradReducer> reducer_;            // buckets: DDP and the distributed optimizer
  std::unique_ptr<FullyShardedDataParallel> fsdp_;  // or units
  std::unique_ptr<UnitResidency> residency_;        // or a single rank's step-scoped buffers
};

}  // namespace primus
