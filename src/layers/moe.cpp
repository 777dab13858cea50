#include "layers/moe.h"

#include "ops/ops.h"

namespace primus {

Tensor first_rows(const Tensor& t, int64_t rows) {
  return rows == t.dim(0) ? t : t.slice_elements(0, {rows, t.dim(1)});
}

Tensor with_zero_rows(const Tensor& rows, int64_t total) {
  if (rows.dim(0) == total) return rows;
  Tensor out = ops::zeros({total, rows.dim(1)}, rows.dtype(), rows.device());
  if (rows.dim(0) > 0) {
    Tensor head = first_rows(out, rows.dim(0));
    ops::copy(head, rows);
  }
  return out;
}

namespace {

// moe_sort of `topk_experts` into state.slots, over E + 1 buckets when entries may be dropped (the last one holding
// the dropped): returns the offsets of all buckets, host-readable for the kept count.
Tensor sort_entries(const Tensor& topk_experts, int64_t experts, DispatchState& state) {
  const int64_t buckets = experts + (state.may_drop ? 1 : 0);
  state.slots = Tensor::empty({topk_experts.numel()}, DType::kI32, topk_experts.device());
  Tensor offsets = Tensor::empty({buckets + 1}, DType::kI32, topk_experts.device());
  ops::moe_sort(topk_experts, state.slots, offsets);
  state.routed_offsets = state.may_drop ? offsets.slice_elements(0, {experts + 1}) : offsets;
  state.kept = topk_experts.numel();
  // Reads the kept count back: the dispatched rows' shape depends on it. On a device this is one wait per MoE layer
  // and micro-batch, with a capacity only (the dropless path never waits).
  if (state.may_drop) {
    const Tensor host = ops::to_device(offsets, kCpuDevice);
    state.kept = host.i32()[experts];
  }
  return offsets;
}

}  // namespace

Tensor LocalTokenDispatcher::dispatch(const Tensor& x, const Tensor& topk_experts, int64_t experts,
                                      DispatchState& state) {
  state.tokens = x.dim(0);
  state.topk = topk_experts.dim(1);
  const int64_t rows = state.tokens * state.topk;
  sort_entries(topk_experts, experts, state);
  state.offsets = state.routed_offsets;  // every expert is local
  Tensor out = Tensor::empty({rows, x.dim(1)}, x.dtype(), x.device());
  ops::moe_permute(x, state.slots, state.topk, out);
  return first_rows(out, state.kept);  // the dropped entries' rows sort last; no expert computes them
}

Tensor LocalTokenDispatcher::combine(const Tensor& expert_out, const Tensor& topk_weights, DispatchState& state) {
  Tensor out = Tensor::empty({state.tokens, expert_out.dim(1)}, expert_out.dtype(), expert_out.device());
  state.returned = with_zero_rows(expert_out, state.tokens * state.topk);
  ops::moe_unpermute(state.returned, state.slots, topk_weights, out);
  return out;
}

Tensor LocalTokenDispatcher::combine_backward(const Tensor& dout, const Tensor&, const Tensor& topk_weights,
                                              const DispatchState& state, Tensor& dweights) {
  Tensor dy = Tensor::empty(state.returned.shape(), state.returned.dtype(), state.returned.device());
  dweights = Tensor::empty(topk_weights.shape(), DType::kF32, topk_weights.device());
  ops::moe_unpermute_backward(state.returned, state.slots, topk_weights, dout, dy, dweights);
  return first_rows(dy, state.kept);
}

Tensor LocalTokenDispatcher::dispatch_backward(const Tensor& drows, const DispatchState& state) {
  Tensor dx = Tensor::empty({state.tokens, drows.dim(1)}, drows.dtype(), drows.device());
  ops::moe_permute_backward(with_zero_rows(drows, state.tokens * state.topk), state.slots, state.topk, dx);
  return dx;
}

namespace {

// Padding to capacity: each local expert's rows [offsets[l], offsets[l + 1]) of rows [M, C] at rows [l·P, l·P + n)
// of [E_local·P, C], the rest zero rows (to_padded), and back (from_padded). The offsets stay on the device.
Tensor to_padded(const Tensor& rows, const Tensor& offsets, int64_t per_expert) {
  Tensor out = Tensor::empty({(offsets.numel() - 1) * per_expert, rows.dim(1)}, rows.dtype(), rows.device());
  ops::moe_pad_rows(rows, offsets, per_expert, out);
  return out;
}

Tensor from_padded(const Tensor& padded, const Tensor& offsets, int64_t per_expert, int64_t rows) {
  Tensor out = Tensor::empty({rows, padded.dim(1)}, padded.dtype(), padded.device());
  ops::moe_unpad_rows(padded, offsets, per_expert, out);
  return out;
}

}  // namespace

Tensor MoeLayer::forward(const Tensor& x, int64_t sequences, float aux_grad_scale, MoeSaved& saved) {
  const int64_t n = x.dim(0), e = experts(), k = routing.topk, f = down_weight.dim(2), c = x.dim(1);
  const Device device = x.device();
  saved.input = x;
  // Router logits [N, E] in f32 in every run (Megatron keeps the router in fp32): from bf16 activations and the bf16
  // weight copy the GEMM accumulates in fp32 and writes f32, so the logits are never rounded to bf16.
  saved.logits = Tensor::empty({n, e}, DType::kF32, device);
  ops::linear_forward(x, gate->weight(), saved.logits);
  saved.scores = Tensor::empty({n, e}, DType::kF32, device);
  saved.topk_experts = Tensor::empty({n, k}, DType::kI32, device);
  saved.topk_weights = Tensor::empty({n, k}, DType::kF32, device);
  ops::moe_router_forward(saved.logits, expert_bias, routing, saved.scores, saved.topk_experts, saved.topk_weights);
  // With a capacity, the entries past it are dropped before dispatch (under expert parallelism: before the
  // all-to-all, over this rank's tokens, as Megatron's alltoall dispatcher drops).
  const bool drops = capacity.factor > 0.0;
  Tensor dispatched = saved.topk_experts;
  int64_t per_expert = 0;
  if (drops) {
    per_expert = ops::moe_expert_capacity(n, k, e, capacity.factor);
    dispatched = Tensor::empty({n, k}, DType::kI32, device);
    ops::moe_capacity(saved.topk_experts, saved.topk_weights, e, per_expert, capacity.by_position, dispatched);
    saved.dispatch.may_drop = true;
  }
  saved.rows = dispatcher->dispatch(x, dispatched, e, saved.dispatch);  // [M, C]
  if (drops) {  // the router's choices, for the balancing loss and the metrics
    Tensor slots = Tensor::empty({n * k}, DType::kI32, device);
    saved.choice_offsets = Tensor::empty({e + 1}, DType::kI32, device);
    ops::moe_sort(saved.topk_experts, slots, saved.choice_offsets);
  } else {
    saved.choice_offsets = saved.dispatch.routed_offsets;
  }
  // The balancing loss counts this rank's routing entries per expert (all E of them, wherever they are computed).
  if (balancing.aux_loss_coeff > 0.0f) {
    const bool sigmoid = routing.score_function == MoeScoreFunction::kSigmoid;
    saved.aux_loss = Tensor::empty({1}, DType::kF32, device);
    saved.dscores_aux = Tensor::empty({n, e}, DType::kF32, device);
    if (balancing.per_sequence) {
      ops::moe_seq_aux_loss(saved.scores, saved.topk_experts, sequences, balancing.aux_loss_coeff, sigmoid,
                            aux_grad_scale, saved.aux_loss, saved.dscores_aux);
    } else {
      ops::moe_aux_loss(saved.scores, saved.choice_offsets, k, balancing.aux_loss_coeff, sigmoid, aux_grad_scale,
                        saved.aux_loss, saved.dscores_aux);
    }
  }
  if (balancing.z_loss_coeff > 0.0f) {
    saved.z_loss = Tensor::empty({1}, DType::kF32, device);
    saved.dlogits_z = ops::zeros({n, e}, DType::kF32, device);
    ops::moe_z_loss(saved.logits, balancing.z_loss_coeff, aux_grad_scale, saved.z_loss, saved.dlogits_z);
  }
  Tensor offsets = saved.dispatch.offsets;
  if (drops && capacity.pad) {  // every local expert computes the same number of rows, the padding zero rows
    // The per-rank capacity times the ranks that send to each local expert (moe_pad_rows reports an expert above it).
    const int64_t local = offsets.numel() - 1;
    saved.padded_rows = per_expert * dispatcher->source_ranks();
    saved.unpadded_rows = saved.rows.dim(0);
    Tensor padded = Tensor::empty({local + 1}, DType::kI32);
    for (int64_t l = 0; l <= local; ++l) padded.i32()[l] = static_cast<int32_t>(l * saved.padded_rows);
    saved.padded_offsets = ops::to_device(padded, device);
    offsets = saved.padded_offsets;
    saved.rows = to_padded(saved.rows, saved.dispatch.offsets, saved.padded_rows);
  }
  const int64_t rows = saved.rows.dim(0);
  saved.gate_up = Tensor::empty({rows, 2 * f}, x.dtype(), device);
  ops::grouped_linear_forward(saved.rows, gate_up_weight, offsets, saved.gate_up);
  saved.act = Tensor::empty({rows, f}, x.dtype(), device);
  ops::swiglu_forward(saved.gate_up, saved.act);
  saved.expert_out = Tensor::empty({rows, c}, x.dtype(), device);
  ops::grouped_linear_forward(saved.act, down_weight, offsets, saved.expert_out);
  saved.combined = saved.padded_offsets.defined()
                       ? from_padded(saved.expert_out, saved.dispatch.offsets, saved.padded_rows, saved.unpadded_rows)
                       : saved.expert_out;
  Tensor y = dispatcher->combine(saved.combined, saved.topk_weights, saved.dispatch);
  if (shared_expert != nullptr) ops::add_inplace(y, shared_expert->forward(x, saved.shared));
  return y;
}

Tensor MoeLayer::backward(const Tensor& dy, MoeSaved& saved, ParamUnitHooks* hooks) {
  const bool padded = saved.padded_offsets.defined();
  const Tensor& offsets = padded ? saved.padded_offsets : saved.dispatch.offsets;
  const int64_t rows_each = saved.padded_rows;
  Tensor dweights;
  Tensor dexpert_out =
      dispatcher->combine_backward(dy, saved.combined, saved.topk_weights, saved.dispatch, dweights);
  saved.combined = Tensor();
  if (padded) dexpert_out = to_padded(dexpert_out, saved.dispatch.offsets, rows_each);  // padding: no gradient
  // The experts' data gradients first, then their weight gradients, gate/up's before down's: a holder of step-scoped
  // buffers (the hooks) then frees each weight's compute copy before any of their gradients comes, and the largest
  // inputs (gate/up's) are gone before the last gradient (down's) comes.
  Tensor none;
  Tensor dact = Tensor::empty(saved.act.shape(), saved.act.dtype(), saved.act.device());
  ops::grouped_linear_backward(saved.act, down_weight, offsets, dexpert_out, dact, none);
  if (hooks != nullptr) hooks->weights_read(down_weight);
  Tensor dgate_up = saved.gate_up;  // the pre-activations are not needed after this
  ops::swiglu_backward(saved.gate_up, dact, dgate_up);
  dact = Tensor();
  Tensor drows = Tensor::empty(saved.rows.shape(), saved.rows.dtype(), saved.rows.device());
  ops::grouped_linear_backward(saved.rows, gate_up_weight, offsets, dgate_up, drows, none);
  if (hooks != nullptr) hooks->weights_read(gate_up_weight);
  if (padded) drows = from_padded(drows, saved.dispatch.offsets, rows_each, saved.unpadded_rows);
  Tensor dx = dispatcher->dispatch_backward(drows, saved.dispatch);
  drows = Tensor();
  if (hooks != nullptr) hooks->grads_to_write(gate_up_grad);
  ops::grouped_linear_backward(saved.rows, gate_up_weight, offsets, dgate_up, none, gate_up_grad);
  dgate_up = Tensor();
  saved.gate_up = Tensor();
  saved.rows = Tensor();
  if (hooks != nullptr) hooks->grads_to_write(down_grad);
  ops::grouped_linear_backward(saved.act, down_weight, offsets, dexpert_out, none, down_grad);
  dexpert_out = Tensor();
  saved.act = Tensor();
  Tensor dlogits = Tensor::empty(saved.logits.shape(), DType::kF32, saved.logits.device());
  ops::moe_router_backward(saved.scores, saved.topk_experts, routing, dweights, saved.dscores_aux, dlogits);
  if (saved.dlogits_z.defined()) ops::add_inplace(dlogits, saved.dlogits_z);
  // The gate's GEMMs take operands of one dtype: in mixed precision dlogits meets x and the weight copy in bf16 (the
  // weight gradient still accumulates in fp32).
  Tensor dlogits_act = dlogits;
  if (saved.input.dtype() != DType::kF32) {
    dlogits_act = Tensor::empty(dlogits.shape(), saved.input.dtype(), dlogits.device());
    ops::cast(dlogits_act, dlogits);
  }
  gate->backward(saved.input, dlogits_act, dx);  // dx defined: the router's part accumulates into it
  if (shared_expert != nullptr) ops::add_inplace(dx, shared_expert->backward(dy, saved.shared));
  saved = MoeSaved();
  return dx;
}

void MoeLayer::record_routing(const MoeSaved& saved) {
  tally.offsets.push_back(saved.choice_offsets);  // every expert's, also under expert parallelism
  if (saved.dispatch.may_drop) tally.kept_offsets.push_back(saved.dispatch.routed_offsets);
  if (saved.aux_loss.defined()) tally.aux_losses.push_back(saved.aux_loss);
  if (saved.z_loss.defined()) tally.z_losses.push_back(saved.z_loss);
}

}  // namespace primus
