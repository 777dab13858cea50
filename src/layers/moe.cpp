#include "layers/moe.h"

#include "ops/ops.h"

namespace primus {

Tensor LocalTokenDispatcher::dispatch(const Tensor& x, const Tensor& topk_experts, int64_t experts,
                                      DispatchState& state) {
  state.tokens = x.dim(0);
  state.topk = topk_experts.dim(1);
  const int64_t rows = state.tokens * state.topk;
  state.slots = Tensor::empty({rows}, DType::kI32, x.device());
  state.offsets = Tensor::empty({experts + 1}, DType::kI32, x.device());
  ops::moe_sort(topk_experts, state.slots, state.offsets);
  state.routed_offsets = state.offsets;  // every expert is local
  Tensor out = Tensor::empty({rows, x.dim(1)}, x.dtype(), x.device());
  ops::moe_permute(x, state.slots, state.topk, out);
  return out;
}

Tensor LocalTokenDispatcher::combine(const Tensor& expert_out, const Tensor& topk_weights, DispatchState& state) {
  Tensor out = Tensor::empty({state.tokens, expert_out.dim(1)}, expert_out.dtype(), expert_out.device());
  ops::moe_unpermute(expert_out, state.slots, topk_weights, out);
  return out;
}

Tensor LocalTokenDispatcher::combine_backward(const Tensor& dout, const Tensor& expert_out, const Tensor& topk_weights,
                                              const DispatchState& state, Tensor& dweights) {
  Tensor dy = Tensor::empty(expert_out.shape(), expert_out.dtype(), expert_out.device());
  dweights = Tensor::empty(topk_weights.shape(), DType::kF32, topk_weights.device());
  ops::moe_unpermute_backward(expert_out, state.slots, topk_weights, dout, dy, dweights);
  return dy;
}

Tensor LocalTokenDispatcher::dispatch_backward(const Tensor& drows, const DispatchState& state) {
  Tensor dx = Tensor::empty({state.tokens, drows.dim(1)}, drows.dtype(), drows.device());
  ops::moe_permute_backward(drows, state.slots, state.topk, dx);
  return dx;
}

Tensor MoeLayer::forward(const Tensor& x, float aux_grad_scale, MoeSaved& saved) {
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
  saved.rows = dispatcher->dispatch(x, saved.topk_experts, e, saved.dispatch);  // [M, C]
  const Tensor& offsets = saved.dispatch.offsets;
  // The balancing loss counts this rank's routing entries per expert (all E of them, wherever they are computed).
  if (balancing.aux_loss_coeff > 0.0f) {
    saved.aux_loss = Tensor::empty({1}, DType::kF32, device);
    saved.dscores_aux = Tensor::empty({n, e}, DType::kF32, device);
    ops::moe_aux_loss(saved.scores, saved.dispatch.routed_offsets, k, balancing.aux_loss_coeff,
                      routing.score_function == MoeScoreFunction::kSigmoid, aux_grad_scale, saved.aux_loss,
                      saved.dscores_aux);
  }
  if (balancing.z_loss_coeff > 0.0f) {
    saved.z_loss = Tensor::empty({1}, DType::kF32, device);
    saved.dlogits_z = ops::zeros({n, e}, DType::kF32, device);
    ops::moe_z_loss(saved.logits, balancing.z_loss_coeff, aux_grad_scale, saved.z_loss, saved.dlogits_z);
  }
  const int64_t rows = saved.rows.dim(0);
  saved.gate_up = Tensor::empty({rows, 2 * f}, x.dtype(), device);
  ops::grouped_linear_forward(saved.rows, gate_up_weight, offsets, saved.gate_up);
  saved.act = Tensor::empty({rows, f}, x.dtype(), device);
  ops::swiglu_forward(saved.gate_up, saved.act);
  saved.expert_out = Tensor::empty({rows, c}, x.dtype(), device);
  ops::grouped_linear_forward(saved.act, down_weight, offsets, saved.expert_out);
  Tensor y = dispatcher->combine(saved.expert_out, saved.topk_weights, saved.dispatch);
  if (shared_expert != nullptr) ops::add_inplace(y, shared_expert->forward(x, saved.shared));
  return y;
}

Tensor MoeLayer::backward(const Tensor& dy, MoeSaved& saved) {
  const Tensor& offsets = saved.dispatch.offsets;
  Tensor dweights;
  const Tensor dexpert_out =
      dispatcher->combine_backward(dy, saved.expert_out, saved.topk_weights, saved.dispatch, dweights);
  Tensor dact = Tensor::empty(saved.act.shape(), saved.act.dtype(), saved.act.device());
  ops::grouped_linear_backward(saved.act, down_weight, offsets, dexpert_out, dact, down_grad);
  Tensor dgate_up = saved.gate_up;  // the pre-activations are not needed after this
  ops::swiglu_backward(saved.gate_up, dact, dgate_up);
  Tensor drows = Tensor::empty(saved.rows.shape(), saved.rows.dtype(), saved.rows.device());
  ops::grouped_linear_backward(saved.rows, gate_up_weight, offsets, dgate_up, drows, gate_up_grad);
  Tensor dx = dispatcher->dispatch_backward(drows, saved.dispatch);
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
  tally.offsets.push_back(saved.dispatch.routed_offsets);  // every expert's, also under expert parallelism
  if (saved.aux_loss.defined()) tally.aux_losses.push_back(saved.aux_loss);
  if (saved.z_loss.defined()) tally.z_losses.push_back(saved.z_loss);
}

}  // namespace primus
