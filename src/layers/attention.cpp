#include "layers/attention.h"

#include "ops/ops.h"

namespace primus {

Tensor Attention::forward(const Tensor& x, int64_t batch, const RopeTable& rope, const PackedSequence& packed,
                          AttentionSaved& saved, const ContextParallelGroup* ring) {
  PRIMUS_CHECK(batch >= 1 && x.dim(0) % batch == 0, "[attention] {} rows are not {} sequences", x.dim(0), batch);
  saved.shape = AttentionShape{batch, x.dim(0) / batch, heads, kv_heads, head_dim};
  const auto [B, T, Hq, Hkv, D] = saved.shape;
  saved.input = x;
  Tensor q = q_proj->forward(x, &saved.qkv_input);  // [N, Hq*D]
  Tensor k = k_proj->forward(x, &saved.qkv_input);  // [N, Hkv*D]
  Tensor v = v_proj->forward(x, &saved.qkv_input);  // [N, Hkv*D]
  saved.qkv_input.end_forward();
  if (drop_unread_input(x, saved.qkv_input, {q_proj.get(), k_proj.get(), v_proj.get()})) saved.input = Tensor();
  if (qk_norm) {
    q = q_norm.forward(q.reshape({B * T * Hq, D}), saved.q_norm);
    k = k_norm.forward(k.reshape({B * T * Hkv, D}), saved.k_norm);
  }
  saved.q = q.reshape({B, T, Hq, D});
  saved.k = k.reshape({B, T, Hkv, D});
  saved.v = v.reshape({B, T, Hkv, D});
  ops::rope_forward(saved.q, rope.cos, rope.sin, packed.position_ids);
  ops::rope_forward(saved.k, rope.cos, rope.sin, packed.position_ids);
  saved.out = Tensor::empty({B, T, Hq, D}, x.dtype(), x.device());
  saved.lse = Tensor::empty({B, Hq, T}, DType::kF32, x.device());
  if (ring != nullptr) {
    PRIMUS_CHECK(!packed.segment_start.defined(), "[attention] packed documents have no ring attention");
    ring->attention_forward(saved.q, saved.k, saved.v, saved.out, saved.lse);
  } else {
    ops::attention_forward(saved.q, saved.k, saved.v, saved.out, saved.lse, packed.segment_start);
  }
  Tensor y = o_proj->forward(saved.out.reshape({B * T, Hq * D}), &saved.o_input);
  saved.o_input.end_forward();
  return y;
}

Tensor Attention::backward(const Tensor& dy, const RopeTable& rope, const PackedSequence& packed, AttentionSaved& saved,
                           const ContextParallelGroup* ring) {
  const auto [B, T, Hq, Hkv, D] = saved.shape;
  Tensor dout;
  o_proj->backward(saved.out.reshape({B * T, Hq * D}), dy, dout, &saved.o_input);
  Tensor dq = Tensor::empty({B, T, Hq, D}, dy.dtype(), dy.device());
  Tensor dk = Tensor::empty({B, T, Hkv, D}, dy.dtype(), dy.device());
  Tensor dv = Tensor::empty({B, T, Hkv, D}, dy.dtype(), dy.device());
  if (ring != nullptr) {
    ring->attention_backward(saved.q, saved.k, saved.v, saved.out, saved.lse, dout.reshape({B, T, Hq, D}), dq, dk, dv);
  } else {
    ops::attention_backward(saved.q, saved.k, saved.v, saved.out, saved.lse, dout.reshape({B, T, Hq, D}), dq, dk, dv,
                            packed.segment_start);
  }
  ops::rope_backward(dq, rope.cos, rope.sin, packed.position_ids);
  ops::rope_backward(dk, rope.cos, rope.sin, packed.position_ids);
  Tensor dq_flat = dq.reshape({B * T, Hq * D});
  Tensor dk_flat = dk.reshape({B * T, Hkv * D});
  if (qk_norm) {
    dq_flat = q_norm.backward(dq.reshape({B * T * Hq, D}), saved.q_norm).reshape({B * T, Hq * D});
    dk_flat = k_norm.backward(dk.reshape({B * T * Hkv, D}), saved.k_norm).reshape({B * T, Hkv * D});
  }
  Tensor dx;  // the three projections read the same input: their gradients sum into it
  q_proj->backward(saved.input, dq_flat, dx, &saved.qkv_input);
  k_proj->backward(saved.input, dk_flat, dx, &saved.qkv_input);
  v_proj->backward(saved.input, dv.reshape({B * T, Hkv * D}), dx, &saved.qkv_input);
  saved = AttentionSaved();
  return dx;
}

Tensor SwiGluMlp::forward(const Tensor& x, MlpSaved& saved) {
  saved.input = x;
  saved.gate_up = gate_up_proj->forward(x, &saved.gate_up_input);
  saved.gate_up_input.end_forward();
  if (drop_unread_input(x, saved.gate_up_input, {gate_up_proj.get()})) saved.input = Tensor();
  saved.act = Tensor::empty({x.dim(0), down_proj->in_features()}, x.dtype(), x.device());
  ops::swiglu_forward(saved.gate_up, saved.act);
  // With recompute_act the product is dropped to save memory: so is what down_proj would keep of it.
  Tensor y = down_proj->forward(saved.act, recompute_act ? nullptr : &saved.down_input);
  saved.down_input.end_forward();
  if (recompute_act || drop_unread_input(saved.act, saved.down_input, {down_proj.get()})) saved.act = Tensor();
  return y;
}

Tensor SwiGluMlp::backward(const Tensor& dy, MlpSaved& saved) {
  if (!saved.act.defined() && !saved.down_input.input_dropped) {  // dropped for recompute_act: the same kernel again
    saved.act = Tensor::empty({saved.gate_up.dim(0), down_proj->in_features()}, saved.gate_up.dtype(),
                              saved.gate_up.device());
    ops::swiglu_forward(saved.gate_up, saved.act);
  }
  Tensor dact;
  down_proj->backward(saved.act, dy, dact, &saved.down_input);
  Tensor dgate_up = saved.gate_up;  // the gradient overwrites the pre-activations, which are not needed after
  ops::swiglu_backward(saved.gate_up, dact, dgate_up);
  Tensor dx;
  gate_up_proj->backward(saved.input, dgate_up, dx, &saved.gate_up_input);
  saved = MlpSaved();
  return dx;
}

}  // namespace primus
