#include "layers/expert_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

namespace {

int64_t total(const std::vector<int64_t>& counts) { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

// out [rows, C] = x's rows in the order `order` gives (out[i] = x[order[i]]); a permutation, so its inverse is the
// backward of the gather. Empty when no rows (a rank whose experts drew no tokens).
Tensor gather_rows(const Tensor& x, const Tensor& order) {
  Tensor out = Tensor::empty({order.numel(), x.dim(1)}, x.dtype(), x.device());
  if (order.numel() > 0) ops::moe_permute(x, order, 1, out);
  return out;
}

// The inverse: out[order[i]] = x[i].
Tensor scatter_rows(const Tensor& x, const Tensor& order) {
  Tensor out = Tensor::empty({order.numel(), x.dim(1)}, x.dtype(), x.device());
  if (order.numel() > 0) ops::moe_permute_backward(x, order, 1, out);
  return out;
}

}  // namespace

Communicator& ExpertParallelGroup::comm() const {
  PRIMUS_CHECK(comm_ != nullptr, "[moe] the expert-parallel group has no communicator");
  return *comm_;
}

Tensor AllToAllTokenDispatcher::exchange(const Tensor& rows, const std::vector<int64_t>& from,
                                         const std::vector<int64_t>& to) const {
  const int64_t c = rows.dim(1), n = total(to);
  std::vector<int64_t> send(from), recv(to);
  for (int64_t& count : send) count *= c;
  for (int64_t& count : recv) count *= c;
  // A rank that sends or receives nothing still joins the collective; its buffers get a row so that no empty
  // allocation reaches the transport.
  const Tensor in = rows.numel() > 0 ? rows : Tensor::empty({1, c}, rows.dtype(), rows.device());
  Tensor out = Tensor::empty({std::max<int64_t>(n, 1), c}, rows.dtype(), rows.device());
  group_.comm().all_to_all_v(in, send, out, recv);
  return n > 0 ? out : Tensor::empty({0, c}, rows.dtype(), rows.device());
}

Tensor AllToAllTokenDispatcher::dispatch(const Tensor& x, const Tensor& topk_experts, int64_t experts,
                                         DispatchState& state) {
  const ops::ProfileScope scope("moe: all-to-all dispatch");
  const int ranks = group_.size();
  PRIMUS_CHECK(experts % ranks == 0, "[moe] {} experts do not split over {} expert-parallel ranks", experts, ranks);
  const int64_t local = group_.local_experts(experts), first = group_.first_expert(experts);
  state.tokens = x.dim(0);
  state.topk = topk_experts.dim(1);
  const int64_t entries = state.tokens * state.topk;
  // 1. This rank's entries in expert order: the rows for rank 0's experts, then rank 1's, ..., then the dropped
  //    entries' (a capacity), which stay here.
  const int64_t buckets = experts + (state.may_drop ? 1 : 0);
  state.slots = Tensor::empty({entries}, DType::kI32, x.device());
  Tensor all_offsets = Tensor::empty({buckets + 1}, DType::kI32, x.device());
  ops::moe_sort(topk_experts, state.slots, all_offsets);
  state.routed_offsets = state.may_drop ? all_offsets.slice_elements(0, {experts + 1}) : all_offsets;
  Tensor sorted = Tensor::empty({entries, x.dim(1)}, x.dtype(), x.device());
  ops::moe_permute(x, state.slots, state.topk, sorted);

  // 2. Every rank's per-expert counts: counts[r·E + e] rows of rank r go to expert e.
  const Tensor host_offsets = ops::to_device(state.routed_offsets, kCpuDevice);
  const auto* off = static_cast<const int32_t*>(host_offsets.data());
  state.kept = off[experts];  // the exchanged counts are the kept entries'
  Tensor mine = Tensor::empty({experts}, DType::kI64);
  auto* mine_counts = static_cast<int64_t*>(mine.data());
  for (int64_t e = 0; e < experts; ++e) mine_counts[e] = off[e + 1] - off[e];
  // Through the communicator's device (a GPU communicator reads device memory), then back to the host for the sizes.
  Communicator& comm = group_.comm();
  const Tensor mine_on_comm = ops::to_device(mine, comm.device());
  Tensor all_on_comm = Tensor::empty({ranks * experts}, DType::kI64, comm.device());
  comm.all_gather(mine_on_comm, all_on_comm);
  const Tensor all = ops::to_device(all_on_comm, kCpuDevice);
  const auto* counts = static_cast<const int64_t*>(all.data());
  const int me = group_.rank();
  auto count = [&](int r, int64_t e) { return counts[r * experts + e]; };

  // 3. Rows to each rank (its experts' rows, contiguous in `sorted`) and from each (its rows of this rank's experts).
  state.send_rows.assign(static_cast<size_t>(ranks), 0);
  state.recv_rows.assign(static_cast<size_t>(ranks), 0);
  for (int r = 0; r < ranks; ++r) {
    for (int64_t l = 0; l < local; ++l) {
      state.send_rows[static_cast<size_t>(r)] += count(me, r * local + l);
      state.recv_rows[static_cast<size_t>(r)] += count(r, first + l);
    }
  }
  const Tensor received = exchange(first_rows(sorted, state.kept), state.send_rows, state.recv_rows);  // [M, C]

  // 4. Expert-contiguous: row i of the result is received row regroup[i]; offsets per local expert.
  const int64_t m = received.dim(0);
  Tensor regroup = Tensor::empty({m}, DType::kI32);
  Tensor offsets = Tensor::empty({local + 1}, DType::kI32);
  auto* order = static_cast<int32_t*>(regroup.data());
  auto* expert_offsets = static_cast<int32_t*>(offsets.data());
  std::vector<int64_t> source_start(static_cast<size_t>(ranks), 0);  // where rank r's rows begin in `received`
  for (int r = 1; r < ranks; ++r) source_start[r] = source_start[r - 1] + state.recv_rows[static_cast<size_t>(r - 1)];
  int64_t at = 0;
  for (int64_t l = 0; l < local; ++l) {
    expert_offsets[l] = static_cast<int32_t>(at);
    for (int r = 0; r < ranks; ++r) {
      int64_t row = source_start[static_cast<size_t>(r)];  // rank r's rows of expert first + l start after its earlier
      for (int64_t j = 0; j < l; ++j) row += count(r, first + j);  // local experts' rows
      for (int64_t n = 0; n < count(r, first + l); ++n) order[at++] = static_cast<int32_t>(row + n);
    }
  }
  expert_offsets[local] = static_cast<int32_t>(at);
  PRIMUS_CHECK(at == m, "[moe] regrouped {} of {} received rows", at, m);
  state.regroup = ops::to_device(regroup, x.device());
  state.offsets = ops::to_device(offsets, x.device());
  return gather_rows(received, state.regroup);
}

Tensor AllToAllTokenDispatcher::combine(const Tensor& expert_out, const Tensor& topk_weights, DispatchState& state) {
  const ops::ProfileScope scope("moe: all-to-all combine");
  const Tensor by_source = scatter_rows(expert_out, state.regroup);
  // [N·k, C] in this rank's expert order, the dropped entries' rows zero
  state.returned = with_zero_rows(exchange(by_source, state.recv_rows, state.send_rows), state.tokens * state.topk);
  Tensor out = Tensor::empty({state.tokens, expert_out.dim(1)}, expert_out.dtype(), expert_out.device());
  ops::moe_unpermute(state.returned, state.slots, topk_weights, out);
  return out;
}

Tensor AllToAllTokenDispatcher::combine_backward(const Tensor& dout, const Tensor&, const Tensor& topk_weights,
                                                 const DispatchState& state, Tensor& dweights) {
  const ops::ProfileScope scope("moe: all-to-all combine backward");
  Tensor dreturned = Tensor::empty(state.returned.shape(), state.returned.dtype(), state.returned.device());
  dweights = Tensor::empty(topk_weights.shape(), DType::kF32, topk_weights.device());
  ops::moe_unpermute_backward(state.returned, state.slots, topk_weights, dout, dreturned, dweights);
  return gather_rows(exchange(first_rows(dreturned, state.kept), state.send_rows, state.recv_rows), state.regroup);
}

Tensor AllToAllTokenDispatcher::dispatch_backward(const Tensor& drows, const DispatchState& state) {
  const ops::ProfileScope scope("moe: all-to-all dispatch backward");
  const Tensor dsorted = with_zero_rows(exchange(scatter_rows(drows, state.regroup), state.recv_rows, state.send_rows),
                                        state.tokens * state.topk);
  Tensor dx = Tensor::empty({state.tokens, drows.dim(1)}, drows.dtype(), drows.device());
  ops::moe_permute_backward(dsorted, state.slots, state.topk, dx);
  return dx;
}

}  // namespace primus
