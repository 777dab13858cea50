#include "layers/mla.h"

#include "ops/ops.h"

namespace primus {

namespace {

Tensor empty_like_shape(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, like.dtype(), like.device());
}

}  // namespace

Tensor MlaAttention::forward(const Tensor& x, int64_t batch, const RopeTable& rope, const PackedSequence& packed,
                             MlaSaved& saved) {
  PRIMUS_CHECK(batch >= 1 && x.dim(0) % batch == 0, "[mla] {} rows are not {} sequences", x.dim(0), batch);
  const int64_t N = x.dim(0), B = batch, T = N / batch, H = heads, Dn = nope_dim, Dr = rope_dim, Dv = v_dim;
  const int64_t R = kv_b_proj->in_features();
  saved.batch = batch;
  saved.input = x;
  // Queries: [N, H, Dn + Dr], split into the part without RoPE and the RoPE part.
  Tensor q;
  if (q_a_proj != nullptr) {
    saved.q_compressed = q_a_norm.forward(q_a_proj->forward(x), saved.q_a_norm);
    q = q_b_proj->forward(saved.q_compressed);
  } else {
    q = q_proj->forward(x);
  }
  Tensor q_nope = empty_like_shape({N, H, Dn}, x), q_pe = empty_like_shape({N, H, Dr}, x);
  ops::head_concat_backward(q.reshape({N, H, Dn + Dr}), q_nope, q_pe);
  Tensor q_pe_heads = q_pe.reshape({B, T, H, Dr});
  ops::rope_forward(q_pe_heads, rope.cos, rope.sin, packed.position_ids, true);
  // The compressed key/value [N, R] and the RoPE key [N, Dr] every head shares.
  Tensor kv_a = kv_a_proj_with_mqa->forward(x);  // [N, R + Dr]
  Tensor compressed = empty_like_shape({N, 1, R}, x), k_pe = empty_like_shape({N, 1, Dr}, x);
  ops::head_concat_backward(kv_a.reshape({N, 1, R + Dr}), compressed, k_pe);
  Tensor k_pe_heads = k_pe.reshape({B, T, 1, Dr});
  ops::rope_forward(k_pe_heads, rope.cos, rope.sin, packed.position_ids, true);
  saved.kv_compressed = kv_a_norm.forward(compressed.reshape({N, R}), saved.kv_a_norm);
  Tensor kv = kv_b_proj->forward(saved.kv_compressed);  // [N, H·(Dn + Dv)]
  Tensor k_nope = empty_like_shape({N, H, Dn}, x);
  saved.v = empty_like_shape({B, T, H, Dv}, x);
  Tensor v_rows = saved.v.reshape({N, H, Dv});
  ops::head_concat_backward(kv.reshape({N, H, Dn + Dv}), k_nope, v_rows);
  saved.q = empty_like_shape({B, T, H, Dn + Dr}, x);
  saved.k = empty_like_shape({B, T, H, Dn + Dr}, x);
  Tensor q_rows = saved.q.reshape({N, H, Dn + Dr}), k_rows = saved.k.reshape({N, H, Dn + Dr});
  ops::head_concat(q_nope, q_pe, q_rows);
  ops::head_concat(k_nope, k_pe, k_rows);
  if (query_scale != 1.0f) ops::scale_inplace(saved.q, query_scale);
  saved.out = empty_like_shape({B, T, H, Dv}, x);
  saved.lse = Tensor::empty({B, H, T}, DType::kF32, x.device());
  ops::attention_forward(saved.q, saved.k, saved.v, saved.out, saved.lse, packed.segment_start);
  return o_proj->forward(saved.out.reshape({N, H * Dv}));
}

Tensor MlaAttention::backward(const Tensor& dy, const RopeTable& rope, const PackedSequence& packed, MlaSaved& saved) {
  const int64_t B = saved.batch, N = dy.dim(0), T = N / B, H = heads, Dn = nope_dim, Dr = rope_dim, Dv = v_dim;
  const int64_t R = kv_b_proj->in_features();
  Tensor dout;
  o_proj->backward(saved.out.reshape({N, H * Dv}), dy, dout);
  Tensor dq = empty_like_shape({B, T, H, Dn + Dr}, dy), dk = empty_like_shape({B, T, H, Dn + Dr}, dy);
  Tensor dv = empty_like_shape({B, T, H, Dv}, dy);
  ops::attention_backward(saved.q, saved.k, saved.v, saved.out, saved.lse, dout.reshape({B, T, H, Dv}), dq, dk, dv,
                          packed.segment_start);
  if (query_scale != 1.0f) ops::scale_inplace(dq, query_scale);
  // Queries: split, undo RoPE on the RoPE part, join again as the projection wrote them.
  Tensor dq_nope = empty_like_shape({N, H, Dn}, dy), dq_pe = empty_like_shape({N, H, Dr}, dy);
  ops::head_concat_backward(dq.reshape({N, H, Dn + Dr}), dq_nope, dq_pe);
  Tensor dq_pe_heads = dq_pe.reshape({B, T, H, Dr});
  ops::rope_backward(dq_pe_heads, rope.cos, rope.sin, packed.position_ids, true);
  Tensor dq_proj = empty_like_shape({N, H, Dn + Dr}, dy);
  ops::head_concat(dq_nope, dq_pe, dq_proj);
  // Keys: the shared RoPE key's gradient sums over the heads.
  Tensor dk_nope = empty_like_shape({N, H, Dn}, dy), dk_pe = empty_like_shape({N, 1, Dr}, dy);
  ops::head_concat_backward(dk.reshape({N, H, Dn + Dr}), dk_nope, dk_pe);
  Tensor dk_pe_heads = dk_pe.reshape({B, T, 1, Dr});
  ops::rope_backward(dk_pe_heads, rope.cos, rope.sin, packed.position_ids, true);
  Tensor dkv = empty_like_shape({N, H, Dn + Dv}, dy);
  ops::head_concat(dk_nope, dv.reshape({N, H, Dv}), dkv);
  Tensor dcompressed;
  kv_b_proj->backward(saved.kv_compressed, dkv.reshape({N, H * (Dn + Dv)}), dcompressed);
  Tensor dc = kv_a_norm.backward(dcompressed, saved.kv_a_norm);  // [N, R]
  Tensor dkv_a = empty_like_shape({N, 1, R + Dr}, dy);
  ops::head_concat(dc.reshape({N, 1, R}), dk_pe, dkv_a);
  Tensor dx;  // every projection of x adds its input gradient here
  kv_a_proj_with_mqa->backward(saved.input, dkv_a.reshape({N, R + Dr}), dx);
  const Tensor dq_flat = dq_proj.reshape({N, H * (Dn + Dr)});
  if (q_a_proj != nullptr) {
    Tensor dq_compressed;
    q_b_proj->backward(saved.q_compressed, dq_flat, dq_compressed);
    q_a_proj->backward(saved.input, q_a_norm.backward(dq_compressed, saved.q_a_norm), dx);
  } else {
    q_proj->backward(saved.input, dq_flat, dx);
  }
  saved = MlaSaved();
  return dx;
}

}  // namespace primus
