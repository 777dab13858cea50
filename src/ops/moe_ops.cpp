// Mixture-of-experts op entry points: shape, dtype and device checks naming the op and its tensors, then dispatch to
// the backend of the tensors' device (moe_ops.h). The router, sort and losses are f32 (routing stays fp32 in mixed
// precision, as Megatron's); permutation moves rows of the activation dtype (f32, or bf16 on cuda) with f32 weights.
#include "ops/moe_ops.h"

#include <cmath>
#include <initializer_list>

#include "ops/checked_args.h"
#include "ops/ops.h"
#include "ops/profile.h"

namespace primus::ops {

namespace {

#define MOE_CHECK(cond, ...) PRIMUS_CHECK(cond, "[op {}] {}", op, fmt::format(__VA_ARGS__))

// The grouped GEMM's activation dtype: x's, f32 or bf16 (x, w, y, dy and dx share it; dw is always f32).
DType grouped_linear_dtype(const char* op, const Tensor& x) {
  MOE_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16, "x is {} but must be f32 or bf16", x.describe());
  return x.dtype();
}

void check_matrix(const char* op, const char* name, const Tensor& t) {
  MOE_CHECK(t.defined() && t.ndim() == 2, "{} is {} but must be a matrix", name, t.describe());
}

void check_routing(const char* op, const MoeRouting& r, int64_t experts) {
  MOE_CHECK(r.topk >= 1 && r.topk <= experts, "top-k {} of {} experts", r.topk, experts);
  MOE_CHECK(r.num_groups >= 1 && experts % r.num_groups == 0 && r.group_topk >= 1 && r.group_topk <= r.num_groups,
            "{} expert groups (top {}) over {} experts", r.num_groups, r.group_topk, experts);
  MOE_CHECK(r.num_groups == 1 || (r.topk % r.group_topk == 0 && r.topk / r.group_topk <= experts / r.num_groups &&
                                  r.topk <= r.group_topk * (experts / r.num_groups)),
            "top-k {} from {} of {} groups of {} experts", r.topk, r.group_topk, r.num_groups, experts / r.num_groups);
}

}  // namespace

void moe_router_forward(const Tensor& logits, const Tensor& expert_bias, const MoeRouting& routing, Tensor& scores,
                        Tensor& topk_experts, Tensor& topk_weights) {
  const char* op = "moe_router_forward";
  const ProfileScope profile_scope(op);
  check_matrix(op, "logits", logits);
  const int64_t n = logits.dim(0), e = logits.dim(1), k = routing.topk;
  check_routing(op, routing, e);
  Backend& b = checked_backend(op, {{"logits", &logits, DType::kF32, {n, e}},
                                    {"scores", &scores, DType::kF32, {n, e}},
                                    {"topk_experts", &topk_experts, DType::kI32, {n, k}},
                                    {"topk_weights", &topk_weights, DType::kF32, {n, k}}});
  if (expert_bias.defined()) checked_backend(op, {{"logits", &logits, DType::kF32, {n, e}}, {"expert_bias", &expert_bias, DType::kF32, {e}}});
  MoeRouterArgs args;
  args.routing = routing;
  args.logits = &logits;
  args.expert_bias = expert_bias.defined() ? &expert_bias : nullptr;
  args.scores = &scores;
  args.topk_experts = &topk_experts;
  args.topk_weights = &topk_weights;
  b.moe_router_forward(args);
}

void moe_router_backward(const Tensor& scores, const Tensor& topk_experts, const MoeRouting& routing,
                         const Tensor& dweights, const Tensor& dscores, Tensor& dlogits) {
  const char* op = "moe_router_backward";
  const ProfileScope profile_scope(op);
  check_matrix(op, "scores", scores);
  const int64_t n = scores.dim(0), e = scores.dim(1), k = routing.topk;
  check_routing(op, routing, e);
  Backend& b = checked_backend(op, {{"scores", &scores, DType::kF32, {n, e}},
                                    {"topk_experts", &topk_experts, DType::kI32, {n, k}},
                                    {"dweights", &dweights, DType::kF32, {n, k}},
                                    {"dlogits", &dlogits, DType::kF32, {n, e}}});
  if (dscores.defined()) checked_backend(op, {{"scores", &scores, DType::kF32, {n, e}}, {"dscores", &dscores, DType::kF32, {n, e}}});
  MoeRouterArgs args;
  args.routing = routing;
  args.scores = const_cast<Tensor*>(&scores);  // read only in backward
  args.topk_experts = const_cast<Tensor*>(&topk_experts);
  args.dweights = &dweights;
  args.dscores = dscores.defined() ? &dscores : nullptr;
  args.dlogits = &dlogits;
  b.moe_router_backward(args);
}

void moe_sort(const Tensor& topk_experts, Tensor& slots, Tensor& offsets) {
  const char* op = "moe_sort";
  const ProfileScope profile_scope(op);
  check_matrix(op, "topk_experts", topk_experts);
  MOE_CHECK(offsets.defined() && offsets.ndim() == 1 && offsets.numel() >= 2, "offsets is {} but must be [E + 1]",
            offsets.describe());
  Backend& b = checked_backend(op, {{"topk_experts", &topk_experts, DType::kI32, topk_experts.shape()},
                                    {"slots", &slots, DType::kI32, {topk_experts.numel()}},
                                    {"offsets", &offsets, DType::kI32, offsets.shape()}});
  b.moe_sort(MoeSortArgs{&topk_experts, &slots, &offsets});
}

void moe_capacity(const Tensor& topk_experts, const Tensor& topk_weights, int64_t experts, int64_t capacity,
                  bool by_position, Tensor& kept_experts) {
  const char* op = "moe_capacity";
  const ProfileScope profile_scope(op);
  check_matrix(op, "topk_experts", topk_experts);
  MOE_CHECK(experts >= 1 && capacity >= 0, "capacity {} of {} experts", capacity, experts);
  Backend& b = checked_backend(op, {{"topk_experts", &topk_experts, DType::kI32, topk_experts.shape()},
                                    {"topk_weights", &topk_weights, DType::kF32, topk_experts.shape()},
                                    {"kept_experts", &kept_experts, DType::kI32, topk_experts.shape()}});
  MoeCapacityArgs args;
  args.experts = experts;
  args.capacity = capacity;
  args.by_position = by_position;
  args.topk_experts = &topk_experts;
  args.topk_weights = &topk_weights;
  args.kept_experts = &kept_experts;
  b.moe_capacity(args);
}

int64_t moe_expert_capacity(int64_t tokens, int64_t topk, int64_t experts, double factor) {
  // Megatron's get_capacity(tokens·k, E, factor), in the same order of operations.
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens * topk) / static_cast<double>(experts) * factor));
}

namespace {

// The dtype of the token rows an op moves: f32, or bf16 on cuda (mixed precision); the CPU backend is f32 only.
DType rows_dtype(const Tensor& rows) {
  return rows.dtype() == DType::kBF16 && rows.device().type == DeviceType::kCuda ? DType::kBF16 : DType::kF32;
}

}  // namespace

namespace {

// The checks and dispatch shared by moe_pad_rows (in: rows, out: padded) and moe_unpad_rows (the other way).
void pad_or_unpad(const char* op, bool pad, const Tensor& in, const Tensor& offsets, int64_t per_expert, Tensor& out) {
  const ProfileScope profile_scope(op);
  const Tensor& rows = pad ? in : out;
  const Tensor& padded = pad ? out : in;
  check_matrix(op, "rows", rows);
  check_matrix(op, "padded", padded);
  MOE_CHECK(offsets.defined() && offsets.ndim() == 1 && offsets.numel() >= 1, "offsets {} must be [L + 1]",
            offsets.describe());
  const int64_t local = offsets.numel() - 1;
  MOE_CHECK(per_expert >= 0 && padded.dim(0) == local * per_expert && padded.dim(1) == rows.dim(1),
            "padded {} must be [{} experts × {} rows, {}]", padded.describe(), local, per_expert, rows.dim(1));
  const DType act = rows_dtype(rows);
  Backend& b = checked_backend(op, {{"rows", &rows, act, rows.shape()},
                                    {"offsets", &offsets, DType::kI32, offsets.shape()},
                                    {"padded", &padded, act, padded.shape()}});
  MoePadArgs args;
  args.per_expert = per_expert;
  args.offsets = &offsets;
  args.in = &in;
  args.out = &out;
  if (pad) {
    b.moe_pad_rows(args);
  } else {
    b.moe_unpad_rows(args);
  }
}

}  // namespace

void moe_pad_rows(const Tensor& rows, const Tensor& offsets, int64_t per_expert, Tensor& padded) {
  pad_or_unpad("moe_pad_rows", true, rows, offsets, per_expert, padded);
}

void moe_unpad_rows(const Tensor& padded, const Tensor& offsets, int64_t per_expert, Tensor& rows) {
  pad_or_unpad("moe_unpad_rows", false, padded, offsets, per_expert, rows);
}

void moe_permute(const Tensor& x, const Tensor& slots, int64_t topk, Tensor& out) {
  const char* op = "moe_permute";
  const ProfileScope profile_scope(op);
  check_matrix(op, "x", x);
  MOE_CHECK(topk >= 1 && slots.defined() && slots.numel() == x.dim(0) * topk, "slots {} must hold {} × {} entries",
            slots.describe(), x.dim(0), topk);
  const DType act = rows_dtype(x);
  Backend& b = checked_backend(op, {{"x", &x, act, x.shape()},
                                    {"slots", &slots, DType::kI32, {x.dim(0) * topk}},
                                    {"out", &out, act, {x.dim(0) * topk, x.dim(1)}}});
  MoePermuteArgs args;
  args.topk = topk;
  args.slots = &slots;
  args.x = &x;
  args.out = &out;
  b.moe_permute(args);
}

void moe_permute_backward(const Tensor& dout, const Tensor& slots, int64_t topk, Tensor& dx) {
  const char* op = "moe_permute_backward";
  const ProfileScope profile_scope(op);
  check_matrix(op, "dx", dx);
  MOE_CHECK(topk >= 1, "top-k {}", topk);
  const DType act = rows_dtype(dx);
  Backend& b = checked_backend(op, {{"dx", &dx, act, dx.shape()},
                                    {"slots", &slots, DType::kI32, {dx.dim(0) * topk}},
                                    {"dout", &dout, act, {dx.dim(0) * topk, dx.dim(1)}}});
  MoePermuteArgs args;
  args.topk = topk;
  args.slots = &slots;
  args.dout = &dout;
  args.dx = &dx;
  b.moe_permute_backward(args);
}

void moe_unpermute(const Tensor& y, const Tensor& slots, const Tensor& weights, Tensor& out) {
  const char* op = "moe_unpermute";
  const ProfileScope profile_scope(op);
  check_matrix(op, "y", y);
  check_matrix(op, "weights", weights);
  const int64_t n = weights.dim(0), k = weights.dim(1);
  const DType act = rows_dtype(y);
  Backend& b = checked_backend(op, {{"y", &y, act, {n * k, y.dim(1)}},
                                    {"slots", &slots, DType::kI32, {n * k}},
                                    {"weights", &weights, DType::kF32, {n, k}},
                                    {"out", &out, act, {n, y.dim(1)}}});
  MoePermuteArgs args;
  args.topk = k;
  args.slots = &slots;
  args.y = &y;
  args.weights = &weights;
  args.out = &out;
  b.moe_unpermute(args);
}

void moe_unpermute_backward(const Tensor& y, const Tensor& slots, const Tensor& weights, const Tensor& dout, Tensor& dy,
                            Tensor& dweights) {
  const char* op = "moe_unpermute_backward";
  const ProfileScope profile_scope(op);
  check_matrix(op, "y", y);
  check_matrix(op, "weights", weights);
  const int64_t n = weights.dim(0), k = weights.dim(1), c = y.dim(1);
  const DType act = rows_dtype(y);
  Backend& b = checked_backend(op, {{"y", &y, act, {n * k, c}},
                                    {"slots", &slots, DType::kI32, {n * k}},
                                    {"weights", &weights, DType::kF32, {n, k}},
                                    {"dout", &dout, act, {n, c}},
                                    {"dy", &dy, act, {n * k, c}},
                                    {"dweights", &dweights, DType::kF32, {n, k}}});
  MoePermuteArgs args;
  args.topk = k;
  args.slots = &slots;
  args.y = &y;
  args.weights = &weights;
  args.dout = &dout;
  args.dy = &dy;
  args.dweights = &dweights;
  b.moe_unpermute_backward(args);
}

void grouped_linear_forward(const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y) {
  const char* op = "grouped_linear_forward";
  const ProfileScope profile_scope(op);
  check_matrix(op, "x", x);
  MOE_CHECK(w.defined() && w.ndim() == 3, "w is {} but must be [E, out, in]", w.describe());
  const DType act = grouped_linear_dtype(op, x);
  Backend& b = checked_backend(op, {{"x", &x, act, {x.dim(0), w.dim(2)}},
                                    {"w", &w, act, w.shape()},
                                    {"offsets", &offsets, DType::kI32, {w.dim(0) + 1}},
                                    {"y", &y, act, {x.dim(0), w.dim(1)}}});
  GroupedLinearArgs args;
  args.x = &x;
  args.w = &w;
  args.offsets = &offsets;
  args.y = &y;
  b.grouped_linear_forward(args);
}

void grouped_linear_backward(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& dy, Tensor& dx,
                             Tensor& dw) {
  const char* op = "grouped_linear_backward";
  const ProfileScope profile_scope(op);
  check_matrix(op, "x", x);
  MOE_CHECK(w.defined() && w.ndim() == 3, "w is {} but must be [E, out, in]", w.describe());
  const int64_t m = x.dim(0);
  const DType act = grouped_linear_dtype(op, x);
  Backend& b = checked_backend(op, {{"x", &x, act, {m, w.dim(2)}},
                                    {"w", &w, act, w.shape()},
                                    {"offsets", &offsets, DType::kI32, {w.dim(0) + 1}},
                                    {"dy", &dy, act, {m, w.dim(1)}}});
  if (dx.defined()) checked_backend(op, {{"x", &x, act, x.shape()}, {"dx", &dx, act, x.shape()}});
  if (dw.defined()) checked_backend(op, {{"w", &w, act, w.shape()}, {"dw", &dw, DType::kF32, w.shape()}});
  GroupedLinearArgs args;
  args.x = &x;
  args.w = &w;
  args.offsets = &offsets;
  args.dy = &dy;
  args.dx = dx.defined() ? &dx : nullptr;
  args.dw = dw.defined() ? &dw : nullptr;
  b.grouped_linear_backward(args);
}

void moe_aux_loss(const Tensor& scores, const Tensor& offsets, int64_t topk, float coeff, bool sigmoid_scores,
                  float grad_scale, Tensor& loss, Tensor& dscores) {
  const char* op = "moe_aux_loss";
  const ProfileScope profile_scope(op);
  check_matrix(op, "scores", scores);
  MOE_CHECK(topk >= 1 && topk <= scores.dim(1), "top-k {} of {} experts", topk, scores.dim(1));
  Backend& b = checked_backend(op, {{"scores", &scores, DType::kF32, scores.shape()},
                                    {"offsets", &offsets, DType::kI32, {scores.dim(1) + 1}},
                                    {"loss", &loss, DType::kF32, {1}}});
  if (dscores.defined()) {
    checked_backend(op, {{"scores", &scores, DType::kF32, scores.shape()}, {"dscores", &dscores, DType::kF32, scores.shape()}});
  }
  MoeAuxLossArgs args;
  args.topk = topk;
  args.coeff = coeff;
  args.grad_scale = grad_scale;
  args.sigmoid_scores = sigmoid_scores;
  args.scores = &scores;
  args.offsets = &offsets;
  args.loss = &loss;
  args.dscores = dscores.defined() ? &dscores : nullptr;
  b.moe_aux_loss(args);
}

void moe_seq_aux_loss(const Tensor& scores, const Tensor& topk_experts, int64_t sequences, float coeff,
                      bool sigmoid_scores, float grad_scale, Tensor& loss, Tensor& dscores) {
  const char* op = "moe_seq_aux_loss";
  const ProfileScope profile_scope(op);
  check_matrix(op, "scores", scores);
  check_matrix(op, "topk_experts", topk_experts);
  const int64_t n = scores.dim(0), e = scores.dim(1), k = topk_experts.dim(1);
  MOE_CHECK(sequences >= 1 && n % sequences == 0, "{} tokens do not split into {} sequences", n, sequences);
  checked_backend(op, {{"scores", &scores, DType::kF32, {n, e}},
                       {"topk_experts", &topk_experts, DType::kI32, {n, k}},
                       {"loss", &loss, DType::kF32, {1}}});
  if (dscores.defined()) {
    checked_backend(op, {{"scores", &scores, DType::kF32, {n, e}}, {"dscores", &dscores, DType::kF32, {n, e}}});
  }
  const int64_t s = n / sequences;
  const Device device = scores.device();
  Tensor slots = Tensor::empty({s * k}, DType::kI32, device);
  Tensor offsets = Tensor::empty({e + 1}, DType::kI32, device);
  Tensor part = Tensor::empty({1}, DType::kF32, device);
  zero(loss);
  for (int64_t b = 0; b < sequences; ++b) {
    const Tensor chosen = topk_experts.slice_elements(b * s * k, {s, k});
    moe_sort(chosen, slots, offsets);
    const Tensor rows = scores.slice_elements(b * s * e, {s, e});
    Tensor drows = dscores.defined() ? dscores.slice_elements(b * s * e, {s, e}) : Tensor();
    // Each sequence's loss weighs 1 / sequences of the mean.
    moe_aux_loss(rows, offsets, k, coeff / static_cast<float>(sequences), sigmoid_scores, grad_scale, part, drows);
    sum_into(loss, part);
  }
}

void moe_z_loss(const Tensor& logits, float coeff, float grad_scale, Tensor& loss, Tensor& dlogits) {
  const char* op = "moe_z_loss";
  const ProfileScope profile_scope(op);
  check_matrix(op, "logits", logits);
  Backend& b = checked_backend(op, {{"logits", &logits, DType::kF32, logits.shape()}, {"loss", &loss, DType::kF32, {1}}});
  if (dlogits.defined()) {
    checked_backend(op, {{"logits", &logits, DType::kF32, logits.shape()}, {"dlogits", &dlogits, DType::kF32, logits.shape()}});
  }
  MoeAuxLossArgs args;
  args.coeff = coeff;
  args.grad_scale = grad_scale;
  args.logits = &logits;
  args.loss = &loss;
  args.dlogits = dlogits.defined() ? &dlogits : nullptr;
  b.moe_z_loss(args);
}

}  // namespace primus::ops
