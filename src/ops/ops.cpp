// Op entry points: validate every tensor (defined, dtype, one device, shapes) with messages that start with
// "[op NAME]" and name the tensors as ops.h does, flatten leading dimensions to the [N, C] views the backend
// expects, then dispatch to the backend of the tensors' device. The CPU backend is registered on first use, and
// so is the CUDA backend in builds with it (PRIMUS_WITH_CUDA).
//
// Mixed precision: an op's activation dtype ("act") is taken from its first activation tensor — bf16 when that
// is bf16 on a CUDA device, f32 otherwise — and every other activation must match it; statistics and gradients
// of parameters are f32 whatever act is (backend/backend.h).
#include "ops/ops.h"

#include <cmath>
#include <deque>
#include <initializer_list>

#include "backend/cpu/cpu_backend.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "ops/profile.h"

namespace primus::ops {

namespace {

// PRIMUS_CHECK with the message prefixed by "[op NAME]"; needs a local `op` naming the entry point.
#define OP_CHECK(cond, ...) PRIMUS_CHECK(cond, "[op {}] {}", op, fmt::format(__VA_ARGS__))
// Two tensors that must agree: the message shows both as named in the source.
#define OP_CHECK_PAIR(cond, a, b) OP_CHECK(cond, "{} is {} but {} is {}", #a, (a).describe(), #b, (b).describe())

struct Arg {
  const char* name;
  const Tensor* tensor;
  DType dtype = DType::kF32;
};

Backend& backend(Device device) {
  static const bool cpu_registered = [] {
    register_backend(DeviceType::kCpu, &cpu_backend());
    return true;
  }();
  (void)cpu_registered;
#if PRIMUS_WITH_CUDA
  if (device.type == DeviceType::kCuda) start_cuda_backend(device.index);
#endif
  return backend_for(device);
}

// The activation dtype of an op whose first activation is t: bf16 only on CUDA (the CPU backend is the fp32
// reference), so a bf16 host tensor then fails check_args as "must be f32".
DType act_dtype(const Tensor& t) {
  return t.dtype() == DType::kBF16 && t.device().type == DeviceType::kCuda ? DType::kBF16 : DType::kF32;
}

// Every tensor defined, of its dtype, and on the device of the first; returns that device.
Device check_args(const char* op, std::initializer_list<Arg> args) {
  const Arg& first = *args.begin();
  for (const Arg& arg : args) {
    OP_CHECK(arg.tensor->defined(), "{} is undefined", arg.name);
    OP_CHECK(arg.tensor->dtype() == arg.dtype, "{} is {} but must be {}{}", arg.name, arg.tensor->describe(),
             dtype_name(arg.dtype),
             arg.tensor->dtype() == DType::kBF16 && arg.tensor->device().is_cpu()
                 ? " (the cpu backend is f32 only; bf16 runs on cuda)"
                 : "");
    OP_CHECK(arg.tensor->device() == first.tensor->device(), "{} is {} but {} is {}", arg.name, arg.tensor->describe(),
             first.name, first.tensor->describe());
  }
  return first.tensor->device();
}

void check_min_rank(const char* op, const char* name, const Tensor& t, int rank, const char* layout) {
  OP_CHECK(t.ndim() >= rank, "{} is {} but must be {}", name, t.describe(), layout);
}

void check_rank(const char* op, const char* name, const Tensor& t, int rank, const char* layout) {
  OP_CHECK(t.ndim() == rank, "{} is {} but must be {}", name, t.describe(), layout);
}

Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 1); }

Shape with_last(Shape shape, int64_t last) {
  shape.push_back(last);
  return shape;
}

int64_t rows_of(const Tensor& t) { return shape_numel(leading(t)); }

// [..., C] viewed as [N, C].
Tensor rows_view(const Tensor& t) { return t.reshape({rows_of(t), t.dim(-1)}); }

// A per-row tensor (rstd, targets, losses) of a [..., C] tensor: shaped like its leading dims, or flat [N].
bool per_row(const Tensor& t, const Tensor& rows) {
  return t.shape() == leading(rows) || t.shape() == Shape{rows_of(rows)};
}

// The output of a row-wise op: x's leading dims (or flat [N]) followed by `last`.
bool row_output(const Tensor& t, const Shape& lead, int64_t last) {
  return t.shape() == with_last(lead, last) || t.shape() == Shape{shape_numel(lead), last};
}

// A vocabulary shard whose local part has `rows` rows (table rows, logits columns), checked, with total 0 spelt
// out as the whole (unsharded) vocabulary.
VocabShard check_shard(const char* op, VocabShard shard, int64_t rows) {
  if (shard.total == 0) {
    OP_CHECK(shard.begin == 0, "shard begin is {} but total is 0 (unsharded), where begin must be 0", shard.begin);
    return VocabShard{0, rows};
  }
  OP_CHECK(shard.begin >= 0 && shard.total > 0 && rows <= shard.total && shard.begin <= shard.total - rows,
           "shard rows [{}, {}) ({} local rows) must lie in the vocabulary [0, {})", shard.begin, shard.begin + rows,
           rows, shard.total);
  return shard;
}

// The dtype a gemm output must have: the operands' act, or f32 from bf16 operands (fp32 gradients, logits).
DType c_dtype(DType act, const Tensor& c) {
  return act == DType::kBF16 && c.dtype() == DType::kF32 ? DType::kF32 : act;
}

void dispatch_gemm(Device device, const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, float beta) {
  GemmArgs args;
  args.a = &a;
  args.b = &b;
  args.c = &c;
  args.trans_a = trans_a;
  args.trans_b = trans_b;
  args.beta = beta;
  backend(device).gemm(args);
}

}  // namespace

void gemm(const GemmArgs& args) {
  const char* op = "gemm";
  const ProfileScope profile_scope(op);
  OP_CHECK(args.a != nullptr && args.b != nullptr && args.c != nullptr, "a, b and c must all be given");
  const Tensor& a = *args.a;
  const Tensor& b = *args.b;
  const Tensor& c = *args.c;
  const DType act = act_dtype(a);
  const Device device = check_args(op, {{"a", &a, act}, {"b", &b, act}, {"c", &c, c_dtype(act, c)}});
  check_rank(op, "a", a, 2, "[M, K] or [K, M]");
  check_rank(op, "b", b, 2, "[K, N] or [N, K]");
  check_rank(op, "c", c, 2, "[M, N]");
  const int64_t m = args.trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = args.trans_a ? a.dim(0) : a.dim(1);
  const int64_t k_b = args.trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = args.trans_b ? b.dim(0) : b.dim(1);
  OP_CHECK(k == k_b && c.dim(0) == m && c.dim(1) == n, "a is {}{} and b is {}{} but c is {}", a.describe(),
           args.trans_a ? " (transposed)" : "", b.describe(), args.trans_b ? " (transposed)" : "", c.describe());
  backend(device).gemm(args);
}

void linear_forward(const Tensor& x, const Tensor& w, Tensor& y) {
  const char* op = "linear_forward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(x);
  const Device device = check_args(op, {{"x", &x, act}, {"w", &w, act}, {"y", &y, c_dtype(act, y)}});
  check_min_rank(op, "x", x, 2, "[..., in]");
  check_rank(op, "w", w, 2, "[out, in]");
  OP_CHECK_PAIR(x.dim(-1) == w.dim(1), x, w);
  OP_CHECK_PAIR(y.shape() == with_last(leading(x), w.dim(0)), x, y);
  Tensor x2 = rows_view(x);  // [N, in]
  Tensor y2 = rows_view(y);  // [N, out]
  dispatch_gemm(device, x2, w, y2, false, true, 0.0f);
}

void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw, bool accumulate_dx) {
  const char* op = "linear_backward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(x);
  const Device device = check_args(op, {{"x", &x, act}, {"w", &w, act}, {"dy", &dy, act}});
  check_min_rank(op, "x", x, 2, "[..., in]");
  check_rank(op, "w", w, 2, "[out, in]");
  OP_CHECK_PAIR(x.dim(-1) == w.dim(1), x, w);
  OP_CHECK_PAIR(dy.shape() == with_last(leading(x), w.dim(0)), x, dy);
  const Tensor x2 = rows_view(x);    // [N, in]
  const Tensor dy2 = rows_view(dy);  // [N, out]
  if (dx.defined()) {
    check_args(op, {{"x", &x, act}, {"dx", &dx, act}});
    OP_CHECK_PAIR(dx.shape() == x.shape(), x, dx);
    Tensor dx2 = rows_view(dx);
    dispatch_gemm(device, dy2, w, dx2, false, false, accumulate_dx ? 1.0f : 0.0f);
  }
  if (dw.defined()) {
    check_args(op, {{"w", &w, act}, {"dw", &dw}});
    OP_CHECK_PAIR(dw.shape() == w.shape(), w, dw);
    dispatch_gemm(device, dy2, x2, dw, true, false, 1.0f);
  }
}

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, VocabShard shard) {
  const char* op = "embedding_forward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(table);
  const Device device = check_args(op, {{"ids", &ids, DType::kI32}, {"table", &table, act}, {"out", &out, act}});
  check_min_rank(op, "ids", ids, 1, "[N] or [B, T]");
  check_rank(op, "table", table, 2, "[V, C]");
  OP_CHECK(row_output(out, ids.shape(), table.dim(1)), "ids is {} and table is {} but out is {}", ids.describe(),
           table.describe(), out.describe());
  const Tensor ids1 = ids.reshape({ids.numel()});
  Tensor out2 = out.reshape({ids.numel(), table.dim(1)});
  EmbeddingArgs args;
  args.ids = &ids1;
  args.table = &table;
  args.out = &out2;
  args.shard = check_shard(op, shard, table.dim(0));
  backend(device).embedding_forward(args);
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, VocabShard shard) {
  const char* op = "embedding_backward";
  const ProfileScope profile_scope(op);
  const Device device =
      check_args(op, {{"ids", &ids, DType::kI32}, {"dout", &dout, act_dtype(dout)}, {"dtable", &dtable}});
  check_min_rank(op, "ids", ids, 1, "[N] or [B, T]");
  check_rank(op, "dtable", dtable, 2, "[V, C]");
  OP_CHECK(row_output(dout, ids.shape(), dtable.dim(1)), "ids is {} and dtable is {} but dout is {}", ids.describe(),
           dtable.describe(), dout.describe());
  const Tensor ids1 = ids.reshape({ids.numel()});
  const Tensor dout2 = dout.reshape({ids.numel(), dtable.dim(1)});
  EmbeddingArgs args;
  args.ids = &ids1;
  args.dout = &dout2;
  args.dtable = &dtable;
  args.shard = check_shard(op, shard, dtable.dim(0));
  backend(device).embedding_backward(args);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(x);
  const Device device = check_args(op, {{"x", &x, act}, {"weight", &weight, act}, {"y", &y, act}, {"rstd", &rstd}});
  check_min_rank(op, "x", x, 2, "[..., C]");
  OP_CHECK_PAIR(weight.shape() == Shape{x.dim(-1)}, x, weight);
  OP_CHECK_PAIR(y.shape() == x.shape(), x, y);
  OP_CHECK_PAIR(per_row(rstd, x), x, rstd);
  OP_CHECK(eps >= 0.0f, "eps is {} but must be >= 0", eps);
  const Tensor x2 = rows_view(x);
  Tensor y2 = rows_view(y);
  Tensor rstd1 = rstd.reshape({x2.dim(0)});
  RmsNormArgs args;
  args.x = &x2;
  args.weight = &weight;
  args.eps = eps;
  args.y = &y2;
  args.rstd = &rstd1;
  backend(device).rmsnorm_forward(args);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight) {
  const char* op = "rmsnorm_backward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(x);
  const Device device = check_args(op, {{"x", &x, act}, {"dy", &dy, act}, {"weight", &weight, act}, {"rstd", &rstd}});
  check_min_rank(op, "x", x, 2, "[..., C]");
  OP_CHECK_PAIR(weight.shape() == Shape{x.dim(-1)}, x, weight);
  OP_CHECK_PAIR(dy.shape() == x.shape(), x, dy);
  OP_CHECK_PAIR(per_row(rstd, x), x, rstd);
  const Tensor x2 = rows_view(x);
  const Tensor dy2 = rows_view(dy);
  const Tensor rstd1 = rstd.reshape({x2.dim(0)});
  Tensor dx2;
  if (dx.defined()) {
    check_args(op, {{"x", &x, act}, {"dx", &dx, act}});
    OP_CHECK_PAIR(dx.shape() == x.shape(), x, dx);
    dx2 = rows_view(dx);
  }
  if (dweight.defined()) {
    check_args(op, {{"x", &x, act}, {"dweight", &dweight}});
    OP_CHECK_PAIR(dweight.shape() == weight.shape(), weight, dweight);
  }
  RmsNormArgs args;
  args.x = &x2;
  args.weight = &weight;
  args.rstd = const_cast<Tensor*>(&rstd1);  // read only in backward; the field is shared with forward
  args.dy = &dy2;
  args.dx = dx.defined() ? &dx2 : nullptr;
  args.dweight = dweight.defined() ? &dweight : nullptr;
  backend(device).rmsnorm_backward(args);
}

namespace {

void check_rope(const char* op, const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions) {
  check_rank(op, "x", x, 4, "[B, T, H, D]");
  OP_CHECK(x.dim(3) > 0 && x.dim(3) % 2 == 0, "x is {} but the head size D must be even", x.describe());
  if (positions.defined()) {  // any table length P: the positions pick its rows (the backend checks their range)
    OP_CHECK_PAIR((positions.shape() == Shape{x.dim(0), x.dim(1)}), x, positions);
    OP_CHECK_PAIR(cos.ndim() == 2 && cos.dim(0) > 0 && cos.dim(1) == x.dim(3) / 2, x, cos);
  } else {
    OP_CHECK_PAIR((cos.shape() == Shape{x.dim(1), x.dim(3) / 2}), x, cos);
  }
  OP_CHECK_PAIR(sin.shape() == cos.shape(), cos, sin);
}

// check_args for rope: x (act), the f32 tables and, when given, the i32 positions, all on one device.
Device check_rope_args(const char* op, const char* x_name, const Tensor& x, const Tensor& cos, const Tensor& sin,
                       const Tensor& positions) {
  if (!positions.defined()) return check_args(op, {{x_name, &x, act_dtype(x)}, {"cos", &cos}, {"sin", &sin}});
  return check_args(op,
                    {{x_name, &x, act_dtype(x)}, {"cos", &cos}, {"sin", &sin}, {"positions", &positions, DType::kI32}});
}

}  // namespace

void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions, bool interleaved) {
  const char* op = "rope_forward";
  const ProfileScope profile_scope(op);
  const Device device = check_rope_args(op, "x", x, cos, sin, positions);
  check_rope(op, x, cos, sin, positions);
  RopeArgs args{&x, &cos, &sin, positions.defined() ? &positions : nullptr, interleaved};
  backend(device).rope_forward(args);
}

void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin, const Tensor& positions, bool interleaved) {
  const char* op = "rope_backward";
  const ProfileScope profile_scope(op);
  const Device device = check_rope_args(op, "dx", dx, cos, sin, positions);
  check_rope(op, dx, cos, sin, positions);
  RopeArgs args{&dx, &cos, &sin, positions.defined() ? &positions : nullptr, interleaved};
  backend(device).rope_backward(args);
}

namespace {

// a [N, H, Da], b [N, Hb, Db] (Hb = H or 1) and their concatenation [N, H, Da + Db].
void check_head_concat(const char* op, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_rank(op, "a", a, 3, "[N, H, Da]");
  check_rank(op, "b", b, 3, "[N, Hb, Db]");
  check_rank(op, "out", out, 3, "[N, H, Da + Db]");
  OP_CHECK_PAIR(b.dim(0) == a.dim(0) && (b.dim(1) == a.dim(1) || b.dim(1) == 1), a, b);
  OP_CHECK_PAIR((out.shape() == Shape{a.dim(0), a.dim(1), a.dim(2) + b.dim(2)}), a, out);
}

}  // namespace

void head_concat(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "head_concat";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(a);
  const Device device = check_args(op, {{"a", &a, act}, {"b", &b, act}, {"out", &out, act}});
  check_head_concat(op, a, b, out);
  OP_CHECK(!out.shares_storage(a) && !out.shares_storage(b), "out must not share memory with a or b");
  HeadConcatArgs args;
  args.a = &a;
  args.b = &b;
  args.out = &out;
  backend(device).head_concat(args);
}

void head_concat_backward(const Tensor& dout, Tensor& da, Tensor& db) {
  const char* op = "head_concat_backward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(dout);
  const Device device = check_args(op, {{"dout", &dout, act}, {"da", &da, act}, {"db", &db, act}});
  check_head_concat(op, da, db, dout);
  OP_CHECK(!dout.shares_storage(da) && !dout.shares_storage(db) && !da.shares_storage(db),
           "dout, da and db must not share memory");
  HeadConcatArgs args;
  args.dout = &dout;
  args.da = &da;
  args.db = &db;
  backend(device).head_concat_backward(args);
}

namespace {

void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse) {
  check_rank(op, "q", q, 4, "[B, T, Hq, D]");
  check_rank(op, "k", k, 4, "[B, T, Hkv, D]");
  OP_CHECK(q.dim(3) > 0, "q is {} but the head size D must be positive", q.describe());
  OP_CHECK_PAIR(k.dim(0) == q.dim(0) && k.dim(1) == q.dim(1) && k.dim(3) == q.dim(3), q, k);
  OP_CHECK(k.dim(2) > 0 && q.dim(2) % k.dim(2) == 0, "q is {} but k is {}: Hq must be a multiple of Hkv", q.describe(),
           k.describe());
  // The value head size Dv may differ from the query/key head size D (multi-head latent attention: 192 and 128).
  OP_CHECK_PAIR(v.ndim() == 4 && v.dim(0) == k.dim(0) && v.dim(1) == k.dim(1) && v.dim(2) == k.dim(2) && v.dim(3) > 0,
                k, v);
  OP_CHECK_PAIR((out.shape() == Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)}), v, out);
  OP_CHECK_PAIR((lse.shape() == Shape{q.dim(0), q.dim(2), q.dim(1)}), q, lse);
}

// The optional segment starts: [B, T] i32 on q's device (the backend checks each lies in [0, t]).
const Tensor* check_segment_start(const char* op, const Tensor& q, const Tensor& segment_start) {
  if (!segment_start.defined()) return nullptr;
  OP_CHECK(segment_start.dtype() == DType::kI32, "segment_start is {} but must be i32", segment_start.describe());
  OP_CHECK(segment_start.device() == q.device(), "segment_start is {} but q is {}", segment_start.describe(),
           q.describe());
  OP_CHECK_PAIR((segment_start.shape() == Shape{q.dim(0), q.dim(1)}), q, segment_start);
  return &segment_start;
}

}  // namespace

namespace {

void run_attention_forward(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                           const Tensor& segment_start, AttentionMask mask) {
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(q);
  const Device device =
      check_args(op, {{"q", &q, act}, {"k", &k, act}, {"v", &v, act}, {"out", &out, act}, {"lse", &lse}});
  check_attention(op, q, k, v, out, lse);
  AttentionArgs args;
  args.q = &q;
  args.k = &k;
  args.v = &v;
  args.out = &out;
  args.lse = &lse;
  args.segment_start = check_segment_start(op, q, segment_start);
  args.mask = mask;
  backend(device).attention_forward(args);
}

void run_attention_backward(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                            const Tensor& segment_start, AttentionMask mask) {
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(q);
  const Device device = check_args(op, {{"q", &q, act},
                                        {"k", &k, act},
                                        {"v", &v, act},
                                        {"out", &out, act},
                                        {"lse", &lse},
                                        {"dout", &dout, act},
                                        {"dq", &dq, act},
                                        {"dk", &dk, act},
                                        {"dv", &dv, act}});
  check_attention(op, q, k, v, out, lse);
  OP_CHECK_PAIR(dout.shape() == out.shape(), out, dout);
  OP_CHECK_PAIR(dq.shape() == q.shape(), q, dq);
  OP_CHECK_PAIR(dk.shape() == k.shape(), k, dk);
  OP_CHECK_PAIR(dv.shape() == v.shape(), v, dv);
  AttentionArgs args;
  args.q = &q;
  args.k = &k;
  args.v = &v;
  // Read only in backward; the field is shared with forward, which writes it.
  args.out = const_cast<Tensor*>(&out);
  args.lse = const_cast<Tensor*>(&lse);
  args.dout = &dout;
  args.dq = &dq;
  args.dk = &dk;
  args.dv = &dv;
  args.segment_start = check_segment_start(op, q, segment_start);
  args.mask = mask;
  backend(device).attention_backward(args);
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const Tensor& segment_start) {
  run_attention_forward("attention_forward", q, k, v, out, lse, segment_start, AttentionMask::kCausal);
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& segment_start) {
  run_attention_backward("attention_backward", q, k, v, out, lse, dout, dq, dk, dv, segment_start,
                         AttentionMask::kCausal);
}

void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask, Tensor& out,
                             Tensor& lse) {
  run_attention_forward("attention_block_forward", q, k, v, out, lse, Tensor(), mask);
}

void attention_block_backward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionMask mask, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  run_attention_backward("attention_block_backward", q, k, v, out, lse, dout, dq, dk, dv, Tensor(), mask);
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse) {
  const char* op = "attention_merge";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(out);
  const Device device =
      check_args(op, {{"out", &out, act}, {"lse", &lse}, {"block_out", &block_out, act}, {"block_lse", &block_lse}});
  check_rank(op, "out", out, 4, "[B, T, Hq, D]");
  OP_CHECK_PAIR(block_out.shape() == out.shape(), out, block_out);
  OP_CHECK_PAIR((lse.shape() == Shape{out.dim(0), out.dim(2), out.dim(1)}), out, lse);
  OP_CHECK_PAIR(block_lse.shape() == lse.shape(), lse, block_lse);
  OP_CHECK(!out.shares_storage(block_out) && !lse.shares_storage(block_lse),
           "block_out and block_lse must not share memory with out and lse");
  backend(device).attention_merge(AttentionMergeArgs{&out, &lse, &block_out, &block_lse});
}

namespace {

// gate_up [..., 2F] against a [..., F] tensor: the same rows, half the width.
bool packed_pair(const Tensor& gate_up, const Tensor& half) {
  if (gate_up.ndim() < 1 || half.ndim() != gate_up.ndim() || gate_up.dim(-1) != 2 * half.dim(-1)) return false;
  for (int i = 0; i + 1 < gate_up.ndim(); ++i) {
    if (gate_up.dim(i) != half.dim(i)) return false;
  }
  return true;
}

}  // namespace

void swiglu_forward(const Tensor& gate_up, Tensor& out) {
  const char* op = "swiglu_forward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(gate_up);
  const Device device = check_args(op, {{"gate_up", &gate_up, act}, {"out", &out, act}});
  OP_CHECK(packed_pair(gate_up, out), "gate_up {} must be out {} with the last dimension doubled (gate | up)",
           gate_up.describe(), out.describe());
  SwiGluArgs args;
  args.gate_up = &gate_up;
  args.out = &out;
  backend(device).swiglu_forward(args);
}

void swiglu_backward(const Tensor& gate_up, const Tensor& dout, Tensor& dgate_up) {
  const char* op = "swiglu_backward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(gate_up);
  const Device device =
      check_args(op, {{"gate_up", &gate_up, act}, {"dout", &dout, act}, {"dgate_up", &dgate_up, act}});
  OP_CHECK(packed_pair(gate_up, dout), "gate_up {} must be dout {} with the last dimension doubled (gate | up)",
           gate_up.describe(), dout.describe());
  OP_CHECK_PAIR(dgate_up.shape() == gate_up.shape(), gate_up, dgate_up);
  SwiGluArgs args;
  args.gate_up = &gate_up;
  args.dout = &dout;
  args.dgate_up = &dgate_up;
  backend(device).swiglu_backward(args);
}

namespace {

// The shape checks the cross-entropy ops share (dtypes and devices are the caller's check_args) and the [N, V] /
// [N] views the backend takes. args() points into this object, which therefore stays where it was made.
class CrossEntropyViews {
 public:
  // logits [..., V], targets per row of it, and the shard that holds logits' V columns.
  CrossEntropyViews(const char* op, const Tensor& logits, const Tensor& targets, VocabShard shard = {})
      : op_(op), logits_(logits) {
    check_min_rank(op, "logits", logits, 2, "[..., V]");
    args_.logits = keep(rows_view(logits));
    args_.targets = row("targets", targets);
    args_.shard = check_shard(op, shard, logits.dim(-1));
  }

  // A per-row tensor `name` of logits (its leading dims, or flat [N]) as an [N] view.
  Tensor* row(const char* name, const Tensor& t) {
    const char* op = op_;
    OP_CHECK(per_row(t, logits_), "logits is {} but {} is {}", logits_.describe(), name, t.describe());
    return keep(t.reshape({rows_of(logits_)}));
  }

  void set_dlogits(const Tensor& dlogits, float grad_scale) {
    const char* op = op_;
    const Tensor& logits = logits_;
    OP_CHECK_PAIR(dlogits.shape() == logits.shape(), logits, dlogits);
    OP_CHECK(std::isfinite(grad_scale), "grad_scale is {} but must be finite", grad_scale);
    args_.dlogits = keep(rows_view(dlogits));
    args_.grad_scale = grad_scale;
  }

  CrossEntropyArgs& args() { return args_; }

 private:
  Tensor* keep(Tensor view) { return &views_.emplace_back(std::move(view)); }

  const char* op_;
  const Tensor& logits_;
  std::deque<Tensor> views_;  // stable addresses for args_
  CrossEntropyArgs args_;
};

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse) {
  const char* op = "cross_entropy_forward";
  const ProfileScope profile_scope(op);
  const Device device = check_args(
      op,
      {{"logits", &logits, act_dtype(logits)}, {"targets", &targets, DType::kI32}, {"losses", &losses}, {"lse", &lse}});
  CrossEntropyViews views(op, logits, targets);
  views.args().losses = views.row("losses", losses);
  views.args().lse = views.row("lse", lse);
  backend(device).cross_entropy_forward(views.args());
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, float grad_scale,
                            Tensor& dlogits, VocabShard shard) {
  const char* op = "cross_entropy_backward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(logits);
  const Device device = check_args(
      op, {{"logits", &logits, act}, {"targets", &targets, DType::kI32}, {"lse", &lse}, {"dlogits", &dlogits, act}});
  CrossEntropyViews views(op, logits, targets, shard);
  views.args().lse = views.row("lse", lse);
  views.set_dlogits(dlogits, grad_scale);
  backend(device).cross_entropy_backward(views.args());
}

void cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse,
                                    float grad_scale, Tensor& dlogits) {
  const char* op = "cross_entropy_forward_backward";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(logits);
  const Device device = check_args(op, {{"logits", &logits, act},
                                        {"targets", &targets, DType::kI32},
                                        {"losses", &losses},
                                        {"lse", &lse},
                                        {"dlogits", &dlogits, act}});
  CrossEntropyViews views(op, logits, targets);
  views.args().losses = views.row("losses", losses);
  views.args().lse = views.row("lse", lse);
  views.set_dlogits(dlogits, grad_scale);
  backend(device).cross_entropy_forward_backward(views.args());
}

void row_max(const Tensor& x, Tensor& max) {
  const char* op = "row_max";
  const ProfileScope profile_scope(op);
  const Device device = check_args(op, {{"x", &x, act_dtype(x)}, {"max", &max}});
  check_min_rank(op, "x", x, 2, "[..., C]");
  OP_CHECK(x.dim(-1) > 0, "x is {} but its rows must not be empty", x.describe());
  OP_CHECK_PAIR(per_row(max, x), x, max);
  const Tensor x2 = rows_view(x);
  Tensor max1 = max.reshape({x2.dim(0)});
  backend(device).row_max(x2, max1);
}

void cross_entropy_shard_stats(const Tensor& logits, const Tensor& targets, VocabShard shard, const Tensor& max,
                               Tensor& sum_exp, Tensor& target_logit) {
  const char* op = "cross_entropy_shard_stats";
  const ProfileScope profile_scope(op);
  const Device device = check_args(op, {{"logits", &logits, act_dtype(logits)},
                                        {"targets", &targets, DType::kI32},
                                        {"max", &max},
                                        {"sum_exp", &sum_exp},
                                        {"target_logit", &target_logit}});
  CrossEntropyViews views(op, logits, targets, shard);
  views.args().max = views.row("max", max);
  views.args().sum_exp = views.row("sum_exp", sum_exp);
  views.args().target_logit = views.row("target_logit", target_logit);
  backend(device).cross_entropy_shard_stats(views.args());
}

void cross_entropy_finish(const Tensor& max, const Tensor& sum_exp, const Tensor& target_logit, const Tensor& targets,
                          Tensor& losses, Tensor& lse) {
  const char* op = "cross_entropy_finish";
  const ProfileScope profile_scope(op);
  const Device device = check_args(op, {{"targets", &targets, DType::kI32},
                                        {"max", &max},
                                        {"sum_exp", &sum_exp},
                                        {"target_logit", &target_logit},
                                        {"losses", &losses},
                                        {"lse", &lse}});
  // Every tensor has targets' shape, or is flat [N].
  const int64_t rows = targets.numel();
  auto flat = [&](const char* name, const Tensor& t) {
    OP_CHECK(t.shape() == targets.shape() || t.shape() == Shape{rows}, "targets is {} but {} is {}", targets.describe(),
             name, t.describe());
    return t.reshape({rows});
  };
  const Tensor targets1 = targets.reshape({rows});
  const Tensor max1 = flat("max", max);
  Tensor sum_exp1 = flat("sum_exp", sum_exp);
  Tensor target_logit1 = flat("target_logit", target_logit);
  Tensor losses1 = flat("losses", losses);
  Tensor lse1 = flat("lse", lse);
  CrossEntropyArgs args;
  args.targets = &targets1;
  args.max = &max1;
  args.sum_exp = &sum_exp1;
  args.target_logit = &target_logit1;
  args.losses = &losses1;
  args.lse = &lse1;
  backend(device).cross_entropy_finish(args);
}

void adamw_step(const AdamWArgs& args) {
  const char* op = "adamw_step";
  const ProfileScope profile_scope(op);
  OP_CHECK(args.param != nullptr && args.grad != nullptr && args.exp_avg != nullptr && args.exp_avg_sq != nullptr,
           "param, grad, exp_avg and exp_avg_sq must all be given");
  const Tensor& param = *args.param;
  const Tensor& grad = *args.grad;
  const Tensor& exp_avg = *args.exp_avg;
  const Tensor& exp_avg_sq = *args.exp_avg_sq;
  const Device device =
      check_args(op, {{"param", &param}, {"grad", &grad}, {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}});
  OP_CHECK_PAIR(grad.numel() == param.numel(), param, grad);
  OP_CHECK_PAIR(exp_avg.numel() == param.numel(), param, exp_avg);
  OP_CHECK_PAIR(exp_avg_sq.numel() == param.numel(), param, exp_avg_sq);
  OP_CHECK(args.step >= 1, "step is {} but must be >= 1 (bias correction counts from 1)", args.step);
  OP_CHECK(args.beta1 >= 0.0f && args.beta1 < 1.0f && args.beta2 >= 0.0f && args.beta2 < 1.0f,
           "betas are ({}, {}) but must lie in [0, 1)", args.beta1, args.beta2);
  OP_CHECK(args.lr >= 0.0f && args.eps >= 0.0f && args.weight_decay >= 0.0f,
           "lr {}, eps {} and weight_decay {} must be >= 0", args.lr, args.eps, args.weight_decay);
  OP_CHECK(std::isfinite(args.grad_scale) && args.grad_scale >= 0.0f, "grad_scale is {} but must be finite and >= 0",
           args.grad_scale);
  if (args.compute_copy != nullptr) {
    const Tensor& copy = *args.compute_copy;
    OP_CHECK(copy.defined() && copy.dtype() == DType::kBF16 && copy.device() == device && copy.numel() == param.numel(),
             "compute_copy {} must be bf16 on {} with param's {} elements", copy.describe(), device.str(),
             param.numel());
  }
  backend(device).adamw_step(args);
}

void add_inplace(Tensor& y, const Tensor& x) {
  const char* op = "add_inplace";
  const ProfileScope profile_scope(op);
  const DType act = act_dtype(y);
  const Device device = check_args(op, {{"y", &y, act}, {"x", &x, act}});
  OP_CHECK_PAIR(x.shape() == y.shape(), y, x);
  backend(device).add_inplace(y, x);
}

void scale_inplace(Tensor& x, float s) {
  const char* op = "scale_inplace";
  const ProfileScope profile_scope(op);
  const Device device = check_args(op, {{"x", &x, act_dtype(x)}});  // bf16 too: YaRN's query factor in MLA
  backend(device).scale_inplace(x, s);
}

double sum_squares(const Tensor& x) {
  const char* op = "sum_squares";
  const ProfileScope profile_scope(op);
  const Device device = check_args(op, {{"x", &x}});
  return backend(device).sum_squares(x);
}

void sum_into(Tensor& acc, const Tensor& x) {
  const char* op = "sum_into";
  const ProfileScope profile_scope(op);
  const Device device = check_args(op, {{"acc", &acc}, {"x", &x}});
  OP_CHECK(acc.numel() == 1, "acc is {} but must hold one element", acc.describe());
  backend(device).sum_into(acc, x);
}

void copy(Tensor& dst, const Tensor& src) {
  const char* op = "copy";
  const ProfileScope profile_scope(op);
  OP_CHECK(dst.defined() && src.defined(), "dst is {} and src is {}", dst.describe(), src.describe());
  OP_CHECK_PAIR(dst.dtype() == src.dtype() && dst.numel() == src.numel(), dst, src);
  // A transfer between the host and a device is the device backend's work.
  backend(dst.device().is_cpu() ? src.device() : dst.device()).copy(dst, src);
}

void cast(Tensor& dst, const Tensor& src) {
  const char* op = "cast";
  const ProfileScope profile_scope(op);
  OP_CHECK(dst.defined() && src.defined(), "dst is {} and src is {}", dst.describe(), src.describe());
  OP_CHECK(dst.dtype() == DType::kF32 || dst.dtype() == DType::kBF16, "dst is {} but must be f32 or bf16",
           dst.describe());
  OP_CHECK(src.dtype() == DType::kF32 || src.dtype() == DType::kBF16, "src is {} but must be f32 or bf16",
           src.describe());
  OP_CHECK_PAIR(dst.device() == src.device() && dst.numel() == src.numel(), dst, src);
  backend(dst.device()).cast(dst, src);
}

Tensor to_device(const Tensor& src, Device device) {
  Tensor dst = Tensor::empty(src.shape(), src.dtype(), device);
  copy(dst, src);
  return dst;
}

void fill(Tensor& x, float value) {
  const char* op = "fill";
  const ProfileScope profile_scope(op);
  const Device device = check_args(op, {{"x", &x}});
  backend(device).fill(x, value);
}

void fill_normal(Tensor& x, uint64_t seed, double std, StreamIndex index) {
  const char* op = "fill_normal";
  const ProfileScope profile_scope(op);
  const Device device = check_args(op, {{"x", &x}});  // f32 only
  backend(device).fill_normal(x, seed, std, index);
}

void zero(Tensor& x) {
  const char* op = "zero";
  const ProfileScope profile_scope(op);
  OP_CHECK(x.defined(), "x is undefined");
  backend(x.device()).zero(x);
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  zero(t);
  return t;
}

void synchronize(Device device) { backend(device).synchronize(); }
void pin_host(Device device, void* ptr, size_t bytes) { backend(device).pin_host(ptr, bytes); }
void unpin_host(Device device, void* ptr) { backend(device).unpin_host(ptr); }
void set_deterministic(Device device, bool deterministic) { backend(device).set_deterministic(deterministic); }

void start_device(Device device) { backend(device); }

}  // namespace primus::ops
