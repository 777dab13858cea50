// cuDNN fused attention through the backend C API: descriptor wrappers, the forward and backward operation
// graphs, plan building and execution. See cudnn_attention.h for the contract and docs/perf/attention.md for
// the graph pattern and the version pitfalls worked around here.
//
// Tensors are declared in cuDNN's B, H, S, D order; the [B, T, H, D] memory layout is expressed by strides
// alone, and Kᵀ / Vᵀ are K / V with the last two dims and strides swapped (no copies). Virtual tensors are the
// graph's intermediates (fp32 unless stated); every real tensor has a fixed uid and appears in the variant pack.
#include "backend/cuda/cudnn_attention.h"

#include <cudnn_graph.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace primus {

namespace {

// Uids of the real tensors (by-value scalars included). Virtual tensors get uids from kFirstVirtualUid on.
enum Uid : int64_t {
  kUidQ = 1,
  kUidKt,
  kUidV,
  kUidVt,
  kUidO,
  kUidStats,
  kUidDo,
  kUidDq,
  kUidDk,
  kUidDv,
  kUidSoftmaxSum,
  kUidDqAccum,
  kUidSeqLenQ,
  kUidSeqLenKv,
  kUidScale,
  kUidNegInf,
  kUidOne
};
constexpr int64_t kFirstVirtualUid = 1000;
constexpr int64_t kAlignment = 16;     // bytes; declared on every tensor and checked on every pointer
constexpr size_t kScratchAlign = 256;  // offsets of the sub-buffers inside the scratch buffer

[[noreturn]] void throw_cudnn(cudnnStatus_t status, const std::string& step) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  throw RuntimeError(fmt::format("[cudnn attention] {} failed: {}{}{}", step, cudnnGetErrorString(status),
                                 detail[0] != 0 ? ": " : "", detail));
}

void check(cudnnStatus_t status, const std::string& step) {
  if (status != CUDNN_STATUS_SUCCESS) throw_cudnn(status, step);
}

size_t align_up(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// Owns one backend descriptor. `what` names it in error messages ("matmul Q·Kᵀ", "execution plan", ...).
class Descriptor {
 public:
  Descriptor(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
    check(cudnnBackendCreateDescriptor(type, &desc_), "creating " + what_);
  }
  ~Descriptor() {
    if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);
  }
  Descriptor(Descriptor&& other) noexcept : desc_(other.desc_), what_(std::move(other.what_)) { other.desc_ = nullptr; }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor& operator=(Descriptor&&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }
  const std::string& what() const { return what_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values,
           const char* attribute) {
    check(cudnnBackendSetAttribute(desc_, name, type, count, values), fmt::format("{}: setting {}", what_, attribute));
  }
  void set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value, const char* attribute) {
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, attribute);
  }
  // Returns the status instead of throwing: plan building tries engine configurations until one finalizes.
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(desc_); }
  void finalize() { check(try_finalize(), "finalizing " + what_); }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
  std::string what_;
};

struct Dims4 {
  int64_t v[4];
};

// Builds one operation graph: tensors and operations are kept alive here until the plan is built.
class GraphBuilder {
 public:
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dtype, Dims4 dims, Dims4 strides, bool is_virtual,
                                  const char* name, bool by_value = false) {
    Descriptor& t = add(CUDNN_BACKEND_TENSOR_DESCRIPTOR, fmt::format("tensor {}", name));
    t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "UNIQUE_ID");
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype, "DATA_TYPE");
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.v, "DIMENSIONS");
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.v, "STRIDES");
    t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment, "BYTE_ALIGNMENT");
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "IS_VIRTUAL");
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "IS_BY_VALUE");
    t.finalize();
    return t.get();
  }
  // A virtual intermediate with a fresh uid.
  cudnnBackendDescriptor_t virt(cudnnDataType_t dtype, Dims4 dims, Dims4 strides, const char* name) {
    return tensor(next_virtual_uid_++, dtype, dims, strides, true, name);
  }
  // A [1, 1, 1, 1] fp32 scalar passed by value (a host pointer in the variant pack).
  cudnnBackendDescriptor_t scalar(int64_t uid, const char* name) {
    return tensor(uid, CUDNN_DATA_FLOAT, {{1, 1, 1, 1}}, {{1, 1, 1, 1}}, false, name, true);
  }

  // y = mode(x[, b[, t]]). GEN_INDEX takes `axis`; comparisons compute in BOOLEAN, the rest in `precision`.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, const char* name,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Descriptor& pw = add(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, fmt::format("pointwise descriptor {}", name));
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "MODE");
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, "MATH_PREC");
    if (mode == CUDNN_POINTWISE_GEN_INDEX) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "AXIS");
    pw.finalize();
    Descriptor& op = add(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, fmt::format("pointwise {}", name));
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get(), "PW_DESCRIPTOR");
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "XDESC");
    if (b != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "BDESC");
    if (t != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "TDESC");
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "YDESC");
    op.finalize();
    ops_.push_back(op.get());
  }

  // c = a · b over the last two dims, batched over the first two (b's heads broadcast over a's groups).
  // m/n/k overrides are INT32 [B, 1, 1, 1] sequence-length tensors, or null.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c, const char* name,
              cudnnBackendDescriptor_t m_override = nullptr, cudnnBackendDescriptor_t n_override = nullptr,
              cudnnBackendDescriptor_t k_override = nullptr) {
    Descriptor& mm = add(CUDNN_BACKEND_MATMUL_DESCRIPTOR, fmt::format("matmul descriptor {}", name));
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "COMP_TYPE");
    mm.finalize();
    Descriptor& op = add(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, fmt::format("matmul {}", name));
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "ADESC");
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "BDESC");
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "CDESC");
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get(), "DESC");
    if (m_override != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override, "M_OVERRIDE");
    if (n_override != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override, "N_OVERRIDE");
    if (k_override != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override, "K_OVERRIDE");
    op.finalize();
    ops_.push_back(op.get());
  }

  // y = reduce(x) over the dims where y has extent 1 (or, for heads, over each group of x's heads).
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char* name) {
    Descriptor& red = add(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, fmt::format("reduction descriptor {}", name));
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    red.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "COMP_TYPE");
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "OPERATOR");
    red.finalize();
    Descriptor& op = add(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, fmt::format("reduction {}", name));
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get(), "DESC");
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "XDESC");
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "YDESC");
    op.finalize();
    ops_.push_back(op.get());
  }

  // y = x seen through other dims/strides (a transposed view).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char* name) {
    Descriptor& op = add(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, fmt::format("reshape {}", name));
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "XDESC");
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "YDESC");
    op.finalize();
    ops_.push_back(op.get());
  }

  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }
  // Hands the descriptors over to the plan that must outlive them.
  std::vector<Descriptor> release() { return std::move(keep_); }

 private:
  Descriptor& add(cudnnBackendDescriptorType_t type, std::string what) {
    keep_.emplace_back(type, std::move(what));
    return keep_.back();
  }

  std::vector<Descriptor> keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_uid_ = kFirstVirtualUid;
};

// Strides of the shapes that recur in both graphs, for B, H(q), S, D, Hkv and the values' head size Dv (d_v).
struct Layout {
  int64_t b, hq, hk, s, d, dv;
  Dims4 q_dims() const { return {{b, hq, s, d}}; }
  Dims4 q_strides() const { return {{s * hq * d, d, hq * d, 1}}; }  // [B, T, Hq, D] memory
  Dims4 kv_dims() const { return {{b, hk, s, d}}; }
  Dims4 kv_strides() const { return {{s * hk * d, d, hk * d, 1}}; }  // [B, T, Hkv, D] memory
  Dims4 kvt_dims() const { return {{b, hk, d, s}}; }
  Dims4 kvt_strides() const { return {{s * hk * d, d, 1, hk * d}}; }  // the same memory, transposed view
  Dims4 v_dims() const { return {{b, hk, s, dv}}; }
  Dims4 v_strides() const { return {{s * hk * dv, dv, hk * dv, 1}}; }  // [B, T, Hkv, Dv] memory
  Dims4 vt_dims() const { return {{b, hk, dv, s}}; }
  Dims4 vt_strides() const { return {{s * hk * dv, dv, 1, hk * dv}}; }
  Dims4 o_dims() const { return {{b, hq, s, dv}}; }
  Dims4 o_strides() const { return {{s * hq * dv, dv, hq * dv, 1}}; }  // [B, T, Hq, Dv] memory: O, dO
  Dims4 v_heads_dims() const { return {{b, hq, s, dv}}; }
  Dims4 v_heads_strides() const { return {{hq * s * dv, s * dv, dv, 1}}; }  // [B, Hq, T, Dv]: per-head dV
  Dims4 scores_dims() const { return {{b, hq, s, s}}; }
  Dims4 scores_strides() const { return {{hq * s * s, s * s, s, 1}}; }
  Dims4 scores_t_strides() const { return {{hq * s * s, s * s, 1, s}}; }  // [B, Hq, S_kv, S_q] view of scores
  Dims4 row_dims() const { return {{b, hq, s, 1}}; }
  Dims4 row_strides() const { return {{hq * s, s, 1, 1}}; }  // [B, Hq, T]: stats, softmax_sum
  Dims4 heads_dims() const { return {{b, hq, s, d}}; }
  Dims4 heads_strides() const { return {{hq * s * d, s * d, d, 1}}; }  // [B, Hq, T, D]: dQ_accum, per-head dK/dV
};

// scores → scores with −inf where key > query (top-left aligned causal mask).
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, const Layout& l, cudnnBackendDescriptor_t scores,
                                     cudnnBackendDescriptor_t neg_inf) {
  auto row = g.virt(CUDNN_DATA_INT32, l.scores_dims(), l.scores_strides(), "causal row index");
  auto col = g.virt(CUDNN_DATA_INT32, l.scores_dims(), l.scores_strides(), "causal column index");
  auto keep = g.virt(CUDNN_DATA_BOOLEAN, l.scores_dims(), l.scores_strides(), "causal keep");
  auto masked = g.virt(CUDNN_DATA_FLOAT, l.scores_dims(), l.scores_strides(), "causal masked scores");
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, row, "causal row index", CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, col, "causal column index", CUDNN_DATA_FLOAT, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, "causal row >= column", CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, neg_inf, keep, masked, "causal select");
  return masked;
}

// scores → scores with −inf outside [0, seq_len_q) × [0, seq_len_kv). With full lengths it masks nothing;
// cuDNN 9.14–9.15 backward needs it when T is not a multiple of 128 (docs/perf/attention.md).
cudnnBackendDescriptor_t padding_mask(GraphBuilder& g, const Layout& l, cudnnBackendDescriptor_t scores,
                                      cudnnBackendDescriptor_t neg_inf, cudnnBackendDescriptor_t seq_len_q,
                                      cudnnBackendDescriptor_t seq_len_kv) {
  auto row = g.virt(CUDNN_DATA_INT32, l.scores_dims(), l.scores_strides(), "padding row index");
  auto col = g.virt(CUDNN_DATA_INT32, l.scores_dims(), l.scores_strides(), "padding column index");
  auto row_ok = g.virt(CUDNN_DATA_BOOLEAN, l.scores_dims(), l.scores_strides(), "padding row < seq_len_q");
  auto col_ok = g.virt(CUDNN_DATA_BOOLEAN, l.scores_dims(), l.scores_strides(), "padding column < seq_len_kv");
  auto keep = g.virt(CUDNN_DATA_BOOLEAN, l.scores_dims(), l.scores_strides(), "padding keep");
  auto masked = g.virt(CUDNN_DATA_FLOAT, l.scores_dims(), l.scores_strides(), "padding masked scores");
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, row, "padding row index", CUDNN_DATA_INT32, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, col, "padding column index", CUDNN_DATA_INT32, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, row, seq_len_q, nullptr, row_ok, "padding row < seq_len_q", CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, col, seq_len_kv, nullptr, col_ok, "padding column < seq_len_kv",
              CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, row_ok, col_ok, nullptr, keep, "padding and", CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, neg_inf, keep, masked, "padding select");
  return masked;
}

// Forward: S = scale·Q·Kᵀ, the causal mask (or none: a block of ring attention), softmax with Stats = max + log Σ
// exp, O = P·V (P in bf16). The −inf scalar is declared only where a mask uses it.
void build_forward(GraphBuilder& g, const Layout& l, bool causal) {
  auto q = g.tensor(kUidQ, CUDNN_DATA_BFLOAT16, l.q_dims(), l.q_strides(), false, "Q");
  auto kt = g.tensor(kUidKt, CUDNN_DATA_BFLOAT16, l.kvt_dims(), l.kvt_strides(), false, "K^T");
  auto v = g.tensor(kUidV, CUDNN_DATA_BFLOAT16, l.v_dims(), l.v_strides(), false, "V");
  auto o = g.tensor(kUidO, CUDNN_DATA_BFLOAT16, l.o_dims(), l.o_strides(), false, "O");
  auto stats = g.tensor(kUidStats, CUDNN_DATA_FLOAT, l.row_dims(), l.row_strides(), false, "Stats");
  auto scale = g.scalar(kUidScale, "scale");

  const Dims4 sd = l.scores_dims(), ss = l.scores_strides(), rd = l.row_dims(), rs = l.row_strides();
  auto s = g.virt(CUDNN_DATA_FLOAT, sd, ss, "Q·K^T");
  g.matmul(q, kt, s, "Q·K^T");
  auto scaled = g.virt(CUDNN_DATA_FLOAT, sd, ss, "scaled scores");
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, scaled, "scale");
  auto masked = causal ? causal_mask(g, l, scaled, g.scalar(kUidNegInf, "-inf")) : scaled;

  auto row_max = g.virt(CUDNN_DATA_FLOAT, rd, rs, "row max");
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max, "row max");
  auto shifted = g.virt(CUDNN_DATA_FLOAT, sd, ss, "scores - max");
  g.pointwise(CUDNN_POINTWISE_SUB, masked, row_max, nullptr, shifted, "scores - max");
  auto exps = g.virt(CUDNN_DATA_FLOAT, sd, ss, "exp");
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, exps, "exp");
  auto row_sum = g.virt(CUDNN_DATA_FLOAT, rd, rs, "row sum");
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, row_sum, "row sum");
  auto log_sum = g.virt(CUDNN_DATA_FLOAT, rd, rs, "log row sum");
  g.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, nullptr, log_sum, "log row sum");
  g.pointwise(CUDNN_POINTWISE_ADD, row_max, log_sum, nullptr, stats, "Stats = max + log sum");
  auto p = g.virt(CUDNN_DATA_BFLOAT16, sd, ss, "P");
  g.pointwise(CUDNN_POINTWISE_DIV, exps, row_sum, nullptr, p, "P = exp / sum");
  g.matmul(p, v, o, "P·V");
}

// Backward: softmax_sum = rowsum(dO∘O); P = exp(scale·Q·Kᵀ − Stats) (masked when causal); dV = Pᵀ·dO;
// dS = P∘(dO·Vᵀ − softmax_sum)·scale; dK = dSᵀ·Q; dQ = dS·K through an fp32 accumulator, or written directly when
// deterministic (the accumulator is summed into with atomics, in an order that varies from run to run). With GQA,
// dK and dV are formed per query head and summed over each group.
void build_backward(GraphBuilder& g, const Layout& l, bool padded, bool deterministic, bool causal) {
  auto q = g.tensor(kUidQ, CUDNN_DATA_BFLOAT16, l.q_dims(), l.q_strides(), false, "Q");
  auto kt = g.tensor(kUidKt, CUDNN_DATA_BFLOAT16, l.kvt_dims(), l.kvt_strides(), false, "K^T");
  auto vt = g.tensor(kUidVt, CUDNN_DATA_BFLOAT16, l.vt_dims(), l.vt_strides(), false, "V^T");
  auto o = g.tensor(kUidO, CUDNN_DATA_BFLOAT16, l.o_dims(), l.o_strides(), false, "O");
  auto d_o = g.tensor(kUidDo, CUDNN_DATA_BFLOAT16, l.o_dims(), l.o_strides(), false, "dO");
  auto stats = g.tensor(kUidStats, CUDNN_DATA_FLOAT, l.row_dims(), l.row_strides(), false, "Stats");
  auto softmax_sum = g.tensor(kUidSoftmaxSum, CUDNN_DATA_FLOAT, l.row_dims(), l.row_strides(), false, "softmax_sum");
  auto dq = g.tensor(kUidDq, CUDNN_DATA_BFLOAT16, l.q_dims(), l.q_strides(), false, "dQ");
  auto dk = g.tensor(kUidDk, CUDNN_DATA_BFLOAT16, l.kv_dims(), l.kv_strides(), false, "dK");
  auto dv = g.tensor(kUidDv, CUDNN_DATA_BFLOAT16, l.v_dims(), l.v_strides(), false, "dV");
  auto scale = g.scalar(kUidScale, "scale");
  auto neg_inf = padded || causal ? g.scalar(kUidNegInf, "-inf") : nullptr;
  auto one = g.scalar(kUidOne, "one");
  cudnnBackendDescriptor_t seq_q = nullptr, seq_kv = nullptr;
  if (padded) {
    seq_q = g.tensor(kUidSeqLenQ, CUDNN_DATA_INT32, {{l.b, 1, 1, 1}}, {{1, 1, 1, 1}}, false, "seq_len_q");
    seq_kv = g.tensor(kUidSeqLenKv, CUDNN_DATA_INT32, {{l.b, 1, 1, 1}}, {{1, 1, 1, 1}}, false, "seq_len_kv");
  }
  const Dims4 sd = l.scores_dims(), ss = l.scores_strides(), rd = l.row_dims(), rs = l.row_strides();

  // softmax_sum = Σ_d dO∘O (the "Δ" of the CPU reference), times one as cuDNN's pattern expects.
  auto do_o = g.virt(CUDNN_DATA_FLOAT, l.o_dims(), {{l.hq * l.s * l.dv, l.s * l.dv, l.hq * l.dv, 1}}, "dO*O");
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, o, nullptr, do_o, "dO*O");
  auto delta = g.virt(CUDNN_DATA_FLOAT, rd, rs, "sum dO*O");
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, delta, "sum dO*O");
  g.pointwise(CUDNN_POINTWISE_MUL, delta, one, nullptr, softmax_sum, "softmax_sum");

  // P recomputed from the saved Stats.
  auto s = g.virt(CUDNN_DATA_FLOAT, sd, ss, "Q·K^T");
  g.matmul(q, kt, s, "Q·K^T", seq_q, seq_kv);
  auto scaled = g.virt(CUDNN_DATA_FLOAT, sd, ss, "scaled scores");
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, scaled, "scale");
  if (padded) scaled = padding_mask(g, l, scaled, neg_inf, seq_q, seq_kv);
  auto shifted = g.virt(CUDNN_DATA_FLOAT, sd, ss, "scores - Stats");
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, nullptr, shifted, "scores - Stats");
  auto masked = causal ? causal_mask(g, l, shifted, neg_inf) : shifted;
  auto p = g.virt(CUDNN_DATA_FLOAT, sd, ss, "P");
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, p, "P = exp");

  // dV = Pᵀ·dO (per query head, then summed over the group under GQA).
  const bool gqa = l.hq != l.hk;
  auto pt = g.virt(CUDNN_DATA_BFLOAT16, sd, l.scores_t_strides(), "P^T");
  g.reshape(p, pt, "P^T");
  auto dv_heads = gqa ? g.virt(CUDNN_DATA_BFLOAT16, l.v_heads_dims(), l.v_heads_strides(), "dV per query head") : dv;
  g.matmul(pt, d_o, dv_heads, "P^T·dO", seq_kv, nullptr, seq_q);
  if (gqa) g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_heads, dv, "dV group sum");

  // dS = P∘(dO·Vᵀ − softmax_sum)·scale.
  auto dp = g.virt(CUDNN_DATA_FLOAT, sd, ss, "dO·V^T");
  g.matmul(d_o, vt, dp, "dO·V^T", seq_q, seq_kv);
  auto dp_centered = g.virt(CUDNN_DATA_FLOAT, sd, ss, "dP - softmax_sum");
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, dp_centered, "dP - softmax_sum");
  auto ds_unscaled = g.virt(CUDNN_DATA_FLOAT, sd, ss, "P*(dP - softmax_sum)");
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, p, nullptr, ds_unscaled, "P*(dP - softmax_sum)");
  auto ds = g.virt(CUDNN_DATA_FLOAT, sd, ss, "dS");
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, scale, nullptr, ds, "dS scale");

  // dK = dSᵀ·Q.
  auto dst = g.virt(CUDNN_DATA_BFLOAT16, sd, l.scores_t_strides(), "dS^T");
  g.reshape(ds, dst, "dS^T");
  auto dk_heads = gqa ? g.virt(CUDNN_DATA_BFLOAT16, l.heads_dims(), l.heads_strides(), "dK per query head") : dk;
  g.matmul(dst, q, dk_heads, "dS^T·Q", seq_kv, nullptr, seq_q);
  if (gqa) g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_heads, dk, "dK group sum");

  // dQ = dS·K, accumulated in fp32 and converted (or written at once).
  auto k = g.virt(CUDNN_DATA_BFLOAT16, l.kv_dims(), l.kv_strides(), "K");
  g.reshape(kt, k, "K");
  if (deterministic) {
    g.matmul(ds, k, dq, "dS·K", seq_q, nullptr, seq_kv);
    return;
  }
  auto dq_accum = g.tensor(kUidDqAccum, CUDNN_DATA_FLOAT, l.heads_dims(), l.heads_strides(), false, "dQ_accum");
  g.matmul(ds, k, dq_accum, "dS·K", seq_q, nullptr, seq_kv);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, nullptr, dq, "dQ = dQ_accum");
}

const char* direction_name(bool backward) { return backward ? "backward" : "forward"; }

}  // namespace

struct CudnnAttention::Plan {
  std::vector<Descriptor> keep;  // the graph's tensors, operations, graph and engine config
  std::unique_ptr<Descriptor> plan;
  int64_t workspace_bytes = 0;
  bool padded = false;
  bool uses_neg_inf = false;    // the graph declares the −inf scalar (a mask uses it)
  int32_t* seq_lens = nullptr;  // device [B] = T, the full-length padding mask's lengths (padded plans only)
  size_t seq_lens_bytes = 0;
};

CudnnAttention::CudnnAttention(gpuStream_t stream, Allocator* allocator, bool deterministic)
    : stream_(stream), allocator_(allocator), deterministic_(deterministic) {
  cudnnHandle_t handle = nullptr;
  check(cudnnCreate(&handle), "cudnnCreate");
  handle_ = handle;
  check(cudnnSetStream(handle, stream_), "cudnnSetStream");
}

CudnnAttention::~CudnnAttention() {
  // Never throws: frees are enqueued on the stream and their errors ignored.
  for (auto& [key, plan] : plans_) {
    if (plan->seq_lens != nullptr) {
      try {
        device_free(plan->seq_lens, plan->seq_lens_bytes);
      } catch (const Error&) {
      }
    }
  }
  plans_.clear();
  if (scratch_ != nullptr) {
    try {
      device_free(scratch_, scratch_bytes_);
    } catch (const Error&) {
    }
  }
  cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

void* CudnnAttention::device_alloc(size_t bytes) {
  if (allocator_ != nullptr) return allocator_->allocate(bytes);
  void* ptr = nullptr;
  PRIMUS_CUDA_CHECK(cudaMallocAsync(&ptr, bytes, stream_));
  return ptr;
}

void CudnnAttention::device_free(void* ptr, size_t bytes) {
  if (allocator_ != nullptr) {
    allocator_->deallocate(ptr, bytes);
  } else {
    PRIMUS_CUDA_CHECK(cudaFreeAsync(ptr, stream_));
  }
}

void* CudnnAttention::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_ != nullptr) device_free(scratch_, scratch_bytes_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    scratch_ = device_alloc(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

namespace {

void validate(const AttentionShape& s, bool backward, std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  const char* dir = direction_name(backward);
  if (s.batch < 1 || s.seq < 1 || s.heads < 1 || s.kv_heads < 1 || s.head_dim < 1) {
    throw UsageError(fmt::format("[cudnn attention {}] shape B={} T={} Hq={} Hkv={} D={} has a non-positive extent",
                                 dir, s.batch, s.seq, s.heads, s.kv_heads, s.head_dim));
  }
  if (s.heads % s.kv_heads != 0) {
    throw UsageError(fmt::format("[cudnn attention {}] Hq={} is not a multiple of Hkv={}", dir, s.heads, s.kv_heads));
  }
  for (const int64_t dim : {s.head_dim, s.value_dim()}) {
    if (dim % 8 != 0 || dim > 256) {
      throw UsageError(
          fmt::format("[cudnn attention {}] head size {} (D {}, Dv {}) is unsupported: cuDNN fused "
                      "attention needs multiples of 8 up to 256",
                      dir, dim, s.head_dim, s.value_dim()));
    }
  }
  if (backward && s.seq == 1) {
    throw UsageError(
        fmt::format("[cudnn attention backward] T=1 is unsupported: cuDNN has no backward for "
                    "one-token sequences (use the CUDA backend's own attention kernel)"));
  }
  for (const auto& [name, ptr] : ptrs) {
    PRIMUS_CHECK(ptr != nullptr, "[cudnn attention {}] {} is null", dir, name);
    PRIMUS_CHECK(reinterpret_cast<uintptr_t>(ptr) % kAlignment == 0,
                 "[cudnn attention {}] {} at {} is not {}-byte aligned", dir, name, ptr, kAlignment);
  }
}

}  // namespace

namespace {

// Whether the engine of a configuration says its results vary from run to run (atomics).
bool has_nondeterministic_note(cudnnBackendDescriptor_t config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
  int64_t count = 0;
  cudnnBackendDescriptor_t engine_desc = engine.get();
  check(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                                 &engine_desc),
        "reading an engine configuration's engine");
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  check(cudnnBackendGetAttribute(engine_desc, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 static_cast<int64_t>(notes.size()), &count, notes.data()),
        "reading an engine's numerical notes");
  return std::find(notes.begin(), notes.begin() + count, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) !=
         notes.begin() + count;
}

}  // namespace

CudnnAttention::Plan& CudnnAttention::plan_for(const AttentionShape& shape, bool backward, bool causal) {
  const PlanKey key{backward,    causal,         shape.batch,    shape.seq,
                    shape.heads, shape.kv_heads, shape.head_dim, shape.value_dim()};
  auto found = plans_.find(key);
  if (found != plans_.end()) return *found->second;

  const std::string where =
      fmt::format("{} B={} T={} Hq={} Hkv={} D={} Dv={}{}", direction_name(backward), shape.batch, shape.seq,
                  shape.heads, shape.kv_heads, shape.head_dim, shape.value_dim(), causal ? "" : " unmasked");
  const Layout layout{shape.batch, shape.heads, shape.kv_heads, shape.seq, shape.head_dim, shape.value_dim()};
  auto plan = std::make_unique<Plan>();
  // cuDNN 9.14–9.15 backward may read invalid memory when T is not a multiple of 128 unless a padding mask is
  // present (cudnn-frontend adds one silently); a full-length mask changes no result.
  plan->padded = backward && shape.seq % 128 != 0;
  plan->uses_neg_inf = causal || plan->padded;

  GraphBuilder g;
  if (backward) {
    build_backward(g, layout, plan->padded, deterministic_, causal);
  } else {
    build_forward(g, layout, causal);
  }
  plan->keep = g.release();
  auto& keep = plan->keep;

  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  keep.emplace_back(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph (" + where + ")");
  Descriptor& graph = keep.back();
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(g.ops().size()),
            g.ops().data(), "OPS");
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "HANDLE");
  graph.finalize();
  const cudnnBackendDescriptor_t graph_desc = graph.get();

  // Engine configurations from heuristics mode A, then the fallback list; the first that finalizes wins.
  std::string failures;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics (" + where + ")");
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph_desc, "OPERATION_GRAPH");
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "MODE");
    if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) {
      failures += fmt::format(" heuristics mode {} found no engine;", static_cast<int>(mode));
      continue;
    }
    int64_t count = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                   nullptr),
          "counting engine configurations (" + where + ")");
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, fmt::format("engine configuration {}", i));
      raw.push_back(configs.back().get());
    }
    int64_t returned = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                   &returned, raw.data()),
          "reading engine configurations (" + where + ")");
    for (int64_t i = 0; i < returned && !plan->plan; ++i) {
      if (deterministic_ && has_nondeterministic_note(raw[i])) {
        failures += fmt::format(" config {}: non-deterministic;", i);
        continue;
      }
      auto candidate =
          std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan (" + where + ")");
      candidate->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "HANDLE");
      candidate->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i], "ENGINE_CONFIG");
      const cudnnStatus_t status = candidate->try_finalize();
      if (status == CUDNN_STATUS_SUCCESS) {
        plan->plan = std::move(candidate);
        keep.push_back(std::move(configs[i]));
      } else {
        char detail[256] = {0};
        cudnnGetLastErrorString(detail, sizeof(detail));
        failures += fmt::format(" config {}: {} {};", i, cudnnGetErrorString(status), detail);
      }
    }
    if (plan->plan) break;
  }
  if (!plan->plan) {
    throw RuntimeError(fmt::format("[cudnn attention] no cuDNN engine runs the {} graph:{}", where, failures));
  }
  check(cudnnBackendGetAttribute(plan->plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                 nullptr, &plan->workspace_bytes),
        "reading the workspace size (" + where + ")");

  if (plan->padded) {
    const std::vector<int32_t> lengths(static_cast<size_t>(shape.batch), static_cast<int32_t>(shape.seq));
    plan->seq_lens_bytes = lengths.size() * sizeof(int32_t);
    plan->seq_lens = static_cast<int32_t*>(device_alloc(plan->seq_lens_bytes));
    // Pageable source: the copy is staged before cudaMemcpyAsync returns, so `lengths` may go out of scope.
    PRIMUS_CUDA_CHECK(
        gpuMemcpyAsync(plan->seq_lens, lengths.data(), plan->seq_lens_bytes, gpuMemcpyHostToDevice, stream_));
  }
  return *plans_.emplace(key, std::move(plan)).first->second;
}

namespace {

// One variant pack per call: (uid, pointer) for every real tensor, host pointers for by-value scalars.
using Bindings = std::vector<std::pair<int64_t, void*>>;

void execute(cudnnHandle_t handle, const Descriptor& plan, const Bindings& bindings, void* workspace, const char* dir) {
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (const auto& [uid, ptr] : bindings) {
    uids.push_back(uid);
    ptrs.push_back(ptr);
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, fmt::format("variant pack ({})", dir));
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data(),
           "UNIQUE_IDS");
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()), ptrs.data(),
           "DATA_POINTERS");
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "WORKSPACE");
  pack.finalize();
  check(cudnnBackendExecute(handle, plan.get(), pack.get()), fmt::format("cudnnBackendExecute ({})", dir));
}

}  // namespace

void CudnnAttention::forward(const AttentionShape& shape, const void* q, const void* k, const void* v, void* out,
                             float* lse, float scale, bool causal) {
  validate(shape, false, {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}});
  Plan& plan = plan_for(shape, false, causal);
  void* workspace = plan.workspace_bytes > 0 ? scratch(static_cast<size_t>(plan.workspace_bytes)) : nullptr;
  float neg_inf = -std::numeric_limits<float>::infinity();
  Bindings bindings{{kUidQ, const_cast<void*>(q)},
                    {kUidKt, const_cast<void*>(k)},
                    {kUidV, const_cast<void*>(v)},
                    {kUidO, out},
                    {kUidStats, lse},
                    {kUidScale, &scale}};
  if (plan.uses_neg_inf) bindings.push_back({kUidNegInf, &neg_inf});
  execute(static_cast<cudnnHandle_t>(handle_), *plan.plan, bindings, workspace, "forward");
}

void CudnnAttention::backward(const AttentionShape& shape, const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const float* lse, void* dq, void* dk, void* dv, float scale,
                              bool causal) {
  validate(
      shape, true,
      {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"dout", dout}, {"lse", lse}, {"dq", dq}, {"dk", dk}, {"dv", dv}});
  Plan& plan = plan_for(shape, true, causal);
  // Scratch: [cuDNN workspace | softmax_sum fp32 [B, Hq, T] | dQ_accum fp32 [B, Hq, T, D] unless deterministic].
  const size_t rows = static_cast<size_t>(shape.batch * shape.heads * shape.seq);
  const size_t workspace_bytes = align_up(static_cast<size_t>(plan.workspace_bytes));
  const size_t sum_bytes = align_up(rows * sizeof(float));
  const size_t accum_bytes =
      deterministic_ ? 0 : align_up(rows * static_cast<size_t>(shape.head_dim) * sizeof(float));
  char* base = static_cast<char*>(scratch(workspace_bytes + sum_bytes + accum_bytes));
  void* softmax_sum = base + workspace_bytes;
  void* dq_accum = base + workspace_bytes + sum_bytes;
  float neg_inf = -std::numeric_limits<float>::infinity();
  float one = 1.0f;
  // Kᵀ and Vᵀ are views of k and v (their descriptors carry the transposed strides).
  Bindings bindings{{kUidQ, const_cast<void*>(q)},
                    {kUidKt, const_cast<void*>(k)},
                    {kUidVt, const_cast<void*>(v)},
                    {kUidO, const_cast<void*>(out)},
                    {kUidDo, const_cast<void*>(dout)},
                    {kUidStats, const_cast<float*>(lse)},
                    {kUidDq, dq},
                    {kUidDk, dk},
                    {kUidDv, dv},
                    {kUidScale, &scale},
                    {kUidOne, &one},
                    {kUidSoftmaxSum, softmax_sum}};
  if (plan.uses_neg_inf) bindings.push_back({kUidNegInf, &neg_inf});
  if (!deterministic_) bindings.push_back({kUidDqAccum, dq_accum});
  if (plan.padded) {
    bindings.push_back({kUidSeqLenQ, plan.seq_lens});
    bindings.push_back({kUidSeqLenKv, plan.seq_lens});
  }
  execute(static_cast<cudnnHandle_t>(handle_), *plan.plan, bindings, base, "backward");
}

}  // namespace primus
