#include "layers/attention.h"

#include "ops/ops.h"

namespace primus {

namespace {

Tensor linear(const Tensor& x, const Tensor& w) {
  Tensor y = Tensor::empty({x.dim(0), w.dim(0)}, x.dtype(), x.device());
  ops::linear_forward(x, w, y);
  return y;
}

// dw += dyᵀ · x, and dy · w goes into dx_sum: assigned when dx_sum is undefined, accumulated by the GEMM
// otherwise (a layer input that feeds several projections sums their gradients).
void linear_grad(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dw, Tensor& dx_sum) {
  const bool accumulate = dx_sum.defined();
  if (!accumulate) dx_sum = Tensor::empty(x.shape(), x.dtype(), x.device());
  ops::linear_backward(x, w, dy, dx_sum, dw, accumulate);
}

}  // namespace

Tensor Attention::forward(const Tensor& x, const RopeTable& rope, const PackedSequence& packed, AttentionSaved& saved) {
  const auto [B, T, Hq, Hkv, D] = shape;
  saved.input = x;
  Tensor q = linear(x, wq);  // [N, Hq*D]
  Tensor k = linear(x, wk);  // [N, Hkv*D]
  Tensor v = linear(x, wv);  // [N, Hkv*D]
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
  ops::attention_forward(saved.q, saved.k, saved.v, saved.out, saved.lse, packed.segment_start);
  return linear(saved.out.reshape({B * T, Hq * D}), wo);
}

Tensor Attention::backward(const Tensor& dy, const RopeTable& rope, const PackedSequence& packed,
                           AttentionSaved& saved) {
  const auto [B, T, Hq, Hkv, D] = shape;
  Tensor dout;
  linear_grad(saved.out.reshape({B * T, Hq * D}), wo, dy, dwo, dout);
  Tensor dq = Tensor::empty({B, T, Hq, D}, dy.dtype(), dy.device());
  Tensor dk = Tensor::empty({B, T, Hkv, D}, dy.dtype(), dy.device());
  Tensor dv = Tensor::empty({B, T, Hkv, D}, dy.dtype(), dy.device());
  ops::attention_backward(saved.q, saved.k, saved.v, saved.out, saved.lse, dout.reshape({B, T, Hq, D}), dq, dk, dv,
                          packed.segment_start);
  ops::rope_backward(dq, rope.cos, rope.sin, packed.position_ids);
  ops::rope_backward(dk, rope.cos, rope.sin, packed.position_ids);
  Tensor dq_flat = dq.reshape({B * T, Hq * D});
  Tensor dk_flat = dk.reshape({B * T, Hkv * D});
  if (qk_norm) {
    dq_flat = q_norm.backward(dq.reshape({B * T * Hq, D}), saved.q_norm).reshape({B * T, Hq * D});
    dk_flat = k_norm.backward(dk.reshape({B * T * Hkv, D}), saved.k_norm).reshape({B * T, Hkv * D});
  }
  Tensor dx;
  linear_grad(saved.input, wq, dq_flat, dwq, dx);
  linear_grad(saved.input, wk, dk_flat, dwk, dx);
  linear_grad(saved.input, wv, dv.reshape({B * T, Hkv * D}), dwv, dx);
  saved = AttentionSaved();
  return dx;
}

Tensor SwiGluMlp::forward(const Tensor& x, MlpSaved& saved) {
  saved.input = x;
  saved.gate_up = linear(x, w_gate_up);
  saved.act = Tensor::empty({x.dim(0), w_down.dim(1)}, x.dtype(), x.device());
  ops::swiglu_forward(saved.gate_up, saved.act);
  Tensor y = linear(saved.act, w_down);
  if (recompute_act) saved.act = Tensor();
  return y;
}

Tensor SwiGluMlp::backward(const Tensor& dy, MlpSaved& saved) {
  if (!saved.act.defined()) {  // dropped after forward (recompute_act): the same kernel on the same inputs
    saved.act = Tensor::empty({saved.gate_up.dim(0), w_down.dim(1)}, saved.gate_up.dtype(), saved.gate_up.device());
    ops::swiglu_forward(saved.gate_up, saved.act);
  }
  Tensor dact;
  linear_grad(saved.act, w_down, dy, dw_down, dact);
  Tensor dgate_up = saved.gate_up;  // the gradient overwrites the pre-activations, which are not needed after
  ops::swiglu_backward(saved.gate_up, dact, dgate_up);
  Tensor dx;
  linear_grad(saved.input, w_gate_up, dgate_up, dw_gate_up, dx);
  saved = MlpSaved();
  return dx;
}

}  // namespace primus
