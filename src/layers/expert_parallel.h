// Expert parallelism inside the MoE layer: the ep group a layer's experts are split over, and the token dispatcher
// that carries each routed row to the rank holding its expert and back (Megatron's alltoall dispatcher).
//
// Rank p of an ep group of P holds experts [p · E/P, (p + 1) · E/P) of every MoE layer (whole experts; the router
// and everything else stay replicated). Forward of one MoE layer on each rank, all ranks together:
//   1. sort this rank's N·k routing entries by expert (moe_sort, moe_permute): rows for rank 0's experts first;
//   2. all_gather the per-expert counts [E] of every rank, so each knows what it sends and receives;
//   3. all_to_all_v the rows: rank p receives, from each rank in turn, that rank's rows of p's experts;
//   4. regroup them expert-contiguous (expert 0's rows from rank 0, 1, ..., then expert 1's), so the grouped GEMMs
//      see offsets [E/P + 1] as they do on one rank.
// combine reverses 4 and 3 and sums each token's k weighted outputs (moe_unpermute); both backwards move the
// gradients the same ways. The rows of one expert are ordered by source rank, then by the source's own order, so
// each expert's GEMM sums its rows in a fixed order. Host synchronisation for the counts is inherent (the all-to-all
// sizes), once per dispatch. With an expert capacity the layer drops before dispatch: the dropped entries sort after
// every expert's, stay on their rank (the counts exchanged are the kept ones) and come back as zero rows.
#pragma once

#include <memory>

#include "layers/moe.h"
#include "ops/communicator.h"

namespace primus {

// The ranks one MoE layer's experts are split over; default: one rank, every expert local.
class ExpertParallelGroup {
 public:
  ExpertParallelGroup() = default;
  explicit ExpertParallelGroup(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}

  int size() const { return comm_ ? comm_->size() : 1; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  Communicator& comm() const;
  // Of `experts` (divisible by size()): how many this rank holds, and the first of them.
  int64_t local_experts(int64_t experts) const { return experts / size(); }
  int64_t first_expert(int64_t experts) const { return rank() * local_experts(experts); }

 private:
  std::shared_ptr<Communicator> comm_;
};

// Every rank of the group calls each method together, for the same layer, in the same order (forward, and backward,
// of the same micro-batches).
class AllToAllTokenDispatcher final : public TokenDispatcher {
 public:
  explicit AllToAllTokenDispatcher(ExpertParallelGroup group) : group_(std::move(group)) {}

  Tensor dispatch(const Tensor& x, const Tensor& topk_experts, int64_t experts, DispatchState& state) override;
  Tensor combine(const Tensor& expert_out, const Tensor& topk_weights, DispatchState& state) override;
  Tensor combine_backward(const Tensor& dout, const Tensor& expert_out, const Tensor& topk_weights,
                          const DispatchState& state, Tensor& dweights) override;
  Tensor dispatch_backward(const Tensor& drows, const DispatchState& state) override;
  int64_t source_ranks() const override { return group_.size(); }

 private:
  // rows [Σ from, C] → [Σ to, C] over the group: from[j] rows to rank j, to[i] rows from rank i.
  Tensor exchange(const Tensor& rows, const std::vector<int64_t>& from, const std::vector<int64_t>& to) const;

  ExpertParallelGroup group_;
};

}  // namespace primus
