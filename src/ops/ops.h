// Op entry points: check shapes, dtypes and devices with messages that name the op, then dispatch
// to the backend that owns the tensors. Layers call only these, never a backend directly.
//
// Dtypes (backend/backend.h has the whole contract): everything is f32 on the CPU. On a CUDA device the
// activations of an op (x, y, q, logits, dx, ...) and the weights it reads may instead all be bf16 (mixed
// precision; the first tensor decides), while per-row statistics (rstd, lse, losses), parameter gradients
// (dw, dweight, dtable), AdamW state and sum_squares stay f32 (scale_inplace takes either).
#pragma once

#include "backend/backend.h"

namespace primus::ops {

// y[N,out] = x[N,in] · w[out,in]ᵀ  (PyTorch/HF Linear layout). y has x's dtype, or f32 from bf16 x and w.
void linear_forward(const Tensor& x, const Tensor& w, Tensor& y);
// dx[N,in] = dy · w (overwritten, or added to with accumulate_dx: an input feeding several projections);
// dw[out,in] += dyᵀ · x (accumulated). Either output may be undefined (skipped).
void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                     bool accumulate_dx = false);
void gemm(const GemmArgs& args);

// out [..., C] = table rows of ids [...] (i32); dtable [V, C] += dout scattered back (f32, accumulated). With a
// vocabulary shard (tensor parallelism: table holds rows [shard.begin, shard.begin + V) of shard.total) an id
// held here reads row id − shard.begin, any other id a zero row, and only held ids accumulate gradient; every id
// must lie in [0, shard.total) (bad ids are errors, reported at the next synchronize on a device).
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, VocabShard shard = {});
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, VocabShard shard = {});

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight);

// x, dx [B, T, H, D] in place. Token (b, t) rotates by row t of cos, sin [T, D/2], or with positions [B, T] i32
// by row positions[b, t] of cos, sin [P, D/2] (packed documents, reset_position_ids); each position in [0, P).
// interleaved: rotate adjacent pairs (x[2i], x[2i+1]) instead of halves (RopeArgs).
void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions = Tensor(),
                  bool interleaved = false);
void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin, const Tensor& positions = Tensor(),
                   bool interleaved = false);

// out [N, H, Da + Db] = per head (a [N, H, Da], b [N, Hb, Db]) with Hb = H, or 1: b's one head shared by every head
// (HeadConcatArgs). The backward splits dout into da and db (overwritten), summing over the heads sharing b; it also
// serves as the forward of a split (and head_concat as its backward).
void head_concat(const Tensor& a, const Tensor& b, Tensor& out);
void head_concat_backward(const Tensor& dout, Tensor& da, Tensor& db);

// Causal attention (backend.h); v, out, dout and dv may have a head size Dv other than q's and k's D.
// segment_start [B, T] i32, optional: query t attends to keys j in
// [segment_start[b, t], t] only (packed documents, reset_attention_mask); pass the same to forward and backward.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const Tensor& segment_start = Tensor());
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& segment_start = Tensor());

// Ring attention's pieces (backend.h: AttentionMask, AttentionArgs, AttentionMergeArgs). A query block against a
// key/value block of the same length T, causal within the blocks or unmasked: out and the log-sum-exp lse per
// (row, head), shapes as attention_forward's.
void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask, Tensor& out,
                             Tensor& lse);
// dq, dk, dv (overwritten) of the block from dout and the out and lse of the whole attention the block is part of
// (merged over all its blocks): the block's exact contributions, which sum over the blocks to the whole's gradients.
// With the block's own out and lse it is the block's gradient.
void attention_block_backward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);
// out [B, T, Hq, D] (act) and lse [B, Hq, T] (f32) ← their merge with a further block's attention of the same queries:
// lse' = log(exp lse + exp block_lse), out' = exp(lse − lse') out + exp(block_lse − lse') block_out.
void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse);

// gate_up [..., 2F]: per row the gate then the up projection; out, dout [..., F]; dgate_up may be gate_up.
void swiglu_forward(const Tensor& gate_up, Tensor& out);
void swiglu_backward(const Tensor& gate_up, const Tensor& dout, Tensor& dgate_up);

// logits [..., V] (act), targets [...] i32 (negative: ignored), losses and lse [...] f32.
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse);
// dlogits (may be logits itself) = grad_scale · (softmax − onehot(target)), zero rows where the target is negative.
// With a vocabulary shard, logits and dlogits are the columns [shard.begin, shard.begin + V) of shard.total: the
// one-hot term is added only where the target's column is held here, and lse comes from cross_entropy_finish.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, float grad_scale,
                            Tensor& dlogits, VocabShard shard = {});

// cross_entropy_forward then cross_entropy_backward in one op (dlogits may alias logits), fused where the backend can.
void cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse,
                                    float grad_scale, Tensor& dlogits);

// Vocabulary-parallel cross-entropy (Megatron's vocab_parallel_cross_entropy) in steps, the loss layer
// reducing over the tensor-parallel group between them (backend.h, CrossEntropyArgs):
//   row_max(logits, max)                                   all-reduce max with MAX
//   cross_entropy_shard_stats(logits, targets, shard, max, sum_exp, target_logit)
//                                                          all-reduce sum_exp and target_logit with SUM
//   cross_entropy_finish(max, sum_exp, target_logit, targets, losses, lse)
//   cross_entropy_backward(logits, targets, lse, grad_scale, dlogits, shard)
// With one rank (shard {0, V}) this equals cross_entropy_forward and cross_entropy_backward.
// max[...] = the largest element of each row of x [..., C] (act, C ≥ 1); max f32.
void row_max(const Tensor& x, Tensor& max);
// sum_exp = Σ over this shard's columns of exp(logit − max), max the row max over the whole vocabulary;
// target_logit = the target's logit where this shard holds its column, else 0 (also for negative targets).
// sum_exp is formed for every row, so finish gives every row an lse as cross_entropy_forward does. All [...] f32
// beside logits [..., V] (act); targets must lie below shard.total.
void cross_entropy_shard_stats(const Tensor& logits, const Tensor& targets, VocabShard shard, const Tensor& max,
                               Tensor& sum_exp, Tensor& target_logit);
// lse = max + log(sum_exp); losses = lse − target_logit (0 where the target is negative). All [...] f32.
void cross_entropy_finish(const Tensor& max, const Tensor& sum_exp, const Tensor& target_logit, const Tensor& targets,
                          Tensor& losses, Tensor& lse);

void adamw_step(const AdamWArgs& args);
void add_inplace(Tensor& y, const Tensor& x);
void scale_inplace(Tensor& x, float s);
double sum_squares(const Tensor& x);
// acc[0] += Σ x; acc [1] f32, x f32. Queued on the device without waiting (losses summed over micro-batches).
void sum_into(Tensor& acc, const Tensor& x);

// Starts the backend of `device` (and registers its allocator) when it is not running yet, so tensors can be
// allocated there. Ops do this themselves; call it before allocating on a device ahead of any op.
void start_device(Device device);

// Memory: any dtype for copy/zero; copies go between the host and a device either way.
void copy(Tensor& dst, const Tensor& src);
// dst ← src converted between f32 and bf16 (round to nearest even), same element count, one device (the host
// included): the bf16 compute copy of the master weights, fp32 views of bf16 results.
void cast(Tensor& dst, const Tensor& src);
Tensor to_device(const Tensor& src, Device device);  // a new tensor on `device` holding src's data
void fill(Tensor& x, float value);                   // f32 only
void fill_normal(Tensor& x, uint64_t seed, double std, StreamIndex index = {});  // f32: x[k] = float(normal_at(seed, index(k)) · std)
void zero(Tensor& x);
Tensor zeros(const Shape& shape, DType dtype, Device device);
// Waits for the device's queued work (and reports errors kernels found in the data).
void synchronize(Device device);
// Page-locks (and unlocks) host memory for fast copies to and from `device` (Backend::pin_host).
void pin_host(Device device, void* ptr, size_t bytes);
void unpin_host(Device device, void* ptr);
// Deterministic mode for every later op on `device` (Backend::set_deterministic).
void set_deterministic(Device device, bool deterministic);

}  // namespace primus::ops
