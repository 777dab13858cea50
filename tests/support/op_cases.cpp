// Every op's test case: shapes from the size, inputs, forward and backward through src/ops, and the math written
// out in double as the reference (op_harness.h says how the harness sweeps and checks them).
//
// Device tolerances (relative L2 error of a whole tensor against the CPU; measured values in
// docs/perf/train-h200.md and the former per-op GPU tests):
//  - f32 1e-5: the same formulas in fp32 on both sides (fused multiply-adds, expf vs glibc exp);
//    1e-4 for GEMMs and attention, whose sums run in another blocked order.
//  - bf16 5e-3: an fp32 result rounded once to bf16 (≤ 2^-8 of each element); 1e-2 for attention, where cuDNN rounds
//    P and dS to bf16 before their matmuls.
//  - exact (0) for the embedding: a row copy, and gradients summed in token order on every device.
#include "support/op_cases.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ops/moe_ops.h"
#include "ops/ops.h"
#include "support/test_support.h"
#include "support/vocab_shards.h"

namespace primus::testing {
namespace {

// Targets in [0, vocab) with ignored rows (−100 and −1, the two spellings in use); row 0 always counts, so the
// loss is never empty.
Tensor targets_with_ignored(int64_t rows, int64_t vocab, Rng& rng) {
  Tensor targets = random_ids({rows}, vocab, rng);
  for (int64_t r = 1; r < rows; r += 5) targets.i32()[r] = -100;
  if (rows > 2) targets.i32()[rows - 1] = -1;
  return targets;
}

// cos and sin [rows, half] of the angles p · 10000^(−2i/D) + 0.3: a real rotation table, as layers/rope builds one.
std::pair<Tensor, Tensor> rope_tables(int64_t rows, int64_t half) {
  Tensor cos = Tensor::empty({rows, half}, DType::kF32), sin = Tensor::empty({rows, half}, DType::kF32);
  for (int64_t p = 0; p < rows; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * std::pow(10000.0, -static_cast<double>(i) / half) + 0.3;
      cos.f32()[p * half + i] = static_cast<float>(std::cos(angle));
      sin.f32()[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return {cos, sin};
}

// ---- gemm and linear -------------------------------------------------------------------------------------------

// C = alpha op(A) op(B) + beta C in double; op(X)[i, j] reads X transposed when its flag is set.
std::vector<double> reference_gemm(const Tensor& a, const Tensor& b, const Tensor* c0, bool ta, bool tb, double alpha,
                                   double beta, int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += at(a, ta ? p * m + i : i * k + p) * at(b, tb ? j * k + p : p * n + j);
      c[i * n + j] = alpha * s + (c0 != nullptr ? beta * at(*c0, i * n + j) : 0.0);
    }
  }
  return c;
}

// gemm with both transposes; with beta ≠ 0 C starts as an f32 input (on a bf16 run: bf16 A·B accumulated into an
// f32 C, as weight gradients are), with beta 0 C is an output of the run's dtype, NaN before.
OpCase gemm_case(bool ta, bool tb, float beta) {
  const float alpha = 0.7f;
  const int64_t n_cols = 19, inner = 37;
  OpCase c;
  c.name = fmt::format("gemm_{}{}{}", ta ? "t" : "n", tb ? "t" : "n", beta == 0.0f ? "" : "_beta");
  c.make_inputs = [=](int64_t m, Rng& rng) {
    std::vector<Input> in{act("a", random_tensor(ta ? Shape{inner, m} : Shape{m, inner}, rng)),
                          act("b", random_tensor(tb ? Shape{n_cols, inner} : Shape{inner, n_cols}, rng))};
    if (beta != 0.0f) in.push_back(f32("c0", random_tensor({m, n_cols}, rng)));
    return in;
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const int64_t m = in["a"].dim(ta ? 1 : 0);
    Tensor out = beta != 0.0f ? env.copy(in["c0"]) : env.out({m, n_cols});
    ops::gemm(GemmArgs{&in["a"], &in["b"], &out, ta, tb, alpha, beta});
    return Tensors{{"c", out}};
  };
  // dop(A) = alpha · dC · op(B)ᵀ and dop(B) = alpha · op(A)ᵀ · dC, transposed back where A or B is stored so.
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    // dC in the operands' dtype (C is f32 where beta ≠ 0, and a GEMM's A and B share one dtype).
    const Tensor &a = in["a"], &b = in["b"], r = env.act_tensor(dy["c"]);
    Tensor da = env.out(a.shape()), db = env.out(b.shape());
    if (ta) {
      ops::gemm(GemmArgs{&b, &r, &da, tb, true, alpha, 0.0f});
    } else {
      ops::gemm(GemmArgs{&r, &b, &da, false, !tb, alpha, 0.0f});
    }
    if (tb) {
      ops::gemm(GemmArgs{&r, &a, &db, true, ta, alpha, 0.0f});
    } else {
      ops::gemm(GemmArgs{&a, &r, &db, !ta, false, alpha, 0.0f});
    }
    return Tensors{{"da", da}, {"db", db}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float) {
    const int64_t m = in["a"].dim(ta ? 1 : 0);
    const Tensor* c0 = beta != 0.0f ? &in["c0"] : nullptr;
    return Tensors{{"c", from_doubles({m, n_cols}, reference_gemm(in["a"], in["b"], c0, ta, tb, alpha, beta, m,
                                                                     n_cols, inner))}};
  };
  c.device_tol = {1e-4, 5e-3, 1e-4};
  return c;
}

// y [1, n, out] = x [1, n, in] · wᵀ (leading dimensions flattened); dw accumulated.
OpCase linear_case() {
  const int64_t in_features = 37, out_features = 20;
  OpCase c;
  c.name = "linear";
  c.make_inputs = [=](int64_t n, Rng& rng) {
    return std::vector<Input>{act("x", random_tensor({1, n, in_features}, rng)),
                              act("w", random_tensor({out_features, in_features}, rng))};
  };
  // y_f32: the same product written as f32 from bf16 operands on a bf16 run (the output layer's fp32 logits).
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor y = env.out({1, in["x"].dim(1), out_features}), y_f32 = env.out_f32(y.shape());
    ops::linear_forward(in["x"], in["w"], y);
    ops::linear_forward(in["x"], in["w"], y_f32);
    return Tensors{{"y", y}, {"y_f32", y_f32}};
  };
  c.backward = [](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor dx = env.out(in["x"].shape()), dw = env.accumulator(in["w"].shape());
    ops::linear_backward(in["x"], in["w"], dy["y"], dx, dw);
    return Tensors{{"dx", dx}, {"dw", dw}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    const int64_t n = in["x"].dim(1);
    const Tensor x = in["x"].reshape({n, in_features}), r = dy["y"].reshape({n, out_features});
    const std::vector<double> y = reference_gemm(x, in["w"], nullptr, false, true, 1, 0, n, out_features, in_features);
    return Tensors{
        {"y", from_doubles({1, n, out_features}, y)},
        {"y_f32", from_doubles({1, n, out_features}, y)},
        {"dx", from_doubles(x.shape(), reference_gemm(r, in["w"], nullptr, false, false, 1, 0, n, in_features,
                                                      out_features))},
        {"dw", from_doubles(in["w"].shape(),
                            reference_gemm(r, x, nullptr, true, false, 1, 0, out_features, in_features, n))}};
  };
  c.device_tol = {1e-4, 5e-3, 1e-4};
  return c;
}

// ---- grouped linear (the experts' GEMMs) ----------------------------------------------------------------------

// The experts of a grouped_linear size: how many, the in and out features, and whether one expert takes far more
// rows than the rest (skewed routing).
struct ExpertShape {
  int64_t experts, in, out;
  bool skewed = false;
};

// Offsets [E + 1] splitting `rows` among the experts: expert 1 gets one row and the middle expert none (where there
// are enough experts), the others random shares (expert 0 eight times the others' when skewed); so row tiles
// straddle experts, and empty and one-row experts occur at every size.
Tensor random_offsets(int64_t rows, const ExpertShape& shape, Rng& rng) {
  const int64_t experts = shape.experts, empty = experts > 2 ? experts / 2 : -1;
  std::vector<int64_t> count(static_cast<size_t>(experts), 0);
  int64_t left = rows;
  if (experts > 1 && left > 0) {
    count[1] = 1;
    --left;
  }
  std::vector<double> weight(static_cast<size_t>(experts), 0.0);
  double total = 0.0;
  int64_t last = -1;
  for (int64_t e = 0; e < experts; ++e) {
    if ((experts > 1 && e == 1) || e == empty) continue;
    weight[static_cast<size_t>(e)] = (shape.skewed && e == 0 ? 8.0 : 1.0) * (0.5 + rng.uniform());
    total += weight[static_cast<size_t>(e)];
    last = e;
  }
  if (last < 0) last = experts - 1;  // two experts or one: the rest goes to the last
  int64_t given = 0;
  for (int64_t e = 0; e < experts; ++e) {
    if (total == 0.0 || weight[static_cast<size_t>(e)] == 0.0) continue;
    const auto share = static_cast<int64_t>(static_cast<double>(left) * weight[static_cast<size_t>(e)] / total);
    count[static_cast<size_t>(e)] += share;
    given += share;
  }
  count[static_cast<size_t>(last)] += left - given;
  Tensor offsets = Tensor::empty({experts + 1}, DType::kI32);
  offsets.i32()[0] = 0;
  for (int64_t e = 0; e < experts; ++e) {
    offsets.i32()[e + 1] = offsets.i32()[e] + static_cast<int32_t>(count[static_cast<size_t>(e)]);
  }
  return offsets;
}

// y [M, out] = x[r] · w[e]ᵀ for the rows r of each expert e (offsets); dx overwritten, dw accumulated. `shape_of`
// gives the experts for a size (the rows, M).
OpCase grouped_linear_case(const std::string& name, std::function<ExpertShape(int64_t)> shape_of) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](int64_t m, Rng& rng) {
    const ExpertShape s = shape_of(m);
    return std::vector<Input>{act("x", random_tensor({m, s.in}, rng)),
                              act("w", random_tensor({s.experts, s.out, s.in}, rng)),
                              index("offsets", random_offsets(m, s, rng))};
  };
  c.forward = [](const Tensors& in, OpEnv& env) {
    Tensor y = env.out({in["x"].dim(0), in["w"].dim(1)});
    ops::grouped_linear_forward(in["x"], in["w"], in["offsets"], y);
    return Tensors{{"y", y}};
  };
  c.backward = [](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor dx = env.out(in["x"].shape()), dw = env.accumulator(in["w"].shape());
    ops::grouped_linear_backward(in["x"], in["w"], in["offsets"], dy["y"], dx, dw);
    return Tensors{{"dx", dx}, {"dw", dw}};
  };
  c.reference = [](const Tensors& in, const Tensors& dy, float) {
    const Tensor &x = in["x"], &w = in["w"], &offsets = in["offsets"], &r = dy["y"];
    const int64_t m = x.dim(0), experts = w.dim(0), out = w.dim(1), nin = w.dim(2);
    std::vector<double> y(static_cast<size_t>(m * out), 0.0), dx(static_cast<size_t>(m * nin), 0.0),
        dw(static_cast<size_t>(w.numel()), 0.0);
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t row = offsets.i32()[e]; row < offsets.i32()[e + 1]; ++row) {
        for (int64_t o = 0; o < out; ++o) {
          const int64_t wo = (e * out + o) * nin;
          double sum = 0.0;
          for (int64_t i = 0; i < nin; ++i) {
            sum += at(x, row * nin + i) * at(w, wo + i);
            dx[static_cast<size_t>(row * nin + i)] += at(r, row * out + o) * at(w, wo + i);
            dw[static_cast<size_t>(wo + i)] += at(r, row * out + o) * at(x, row * nin + i);
          }
          y[static_cast<size_t>(row * out + o)] = sum;
        }
      }
    }
    return Tensors{{"y", from_doubles({m, out}, y)},
                   {"dx", from_doubles(x.shape(), dx)},
                   {"dw", from_doubles(w.shape(), dw)}};
  };
  c.device_tol = {1e-4, 5e-3, 1e-4};
  return c;
}

// ---- embedding -------------------------------------------------------------------------------------------------

// out = rows of table, an id held by the shard [begin, begin + V) reading row id − begin and any other a zero row;
// dtable rows get the dout rows of their ids.
Tensors reference_embedding(const Tensor& ids, const Tensor& table, const Tensor& dout, int64_t begin) {
  const int64_t n = ids.numel(), rows = table.dim(0), width = table.dim(1);
  std::vector<double> out(static_cast<size_t>(n * width), 0.0), dtable(static_cast<size_t>(table.numel()), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = ids.i32()[i] - begin;
    if (row < 0 || row >= rows) continue;
    for (int64_t c = 0; c < width; ++c) {
      out[i * width + c] = at(table, row * width + c);
      dtable[row * width + c] += at(dout, i * width + c);
    }
  }
  Shape out_shape = ids.shape();
  out_shape.push_back(width);
  return Tensors{{"out", from_doubles(out_shape, out)}, {"dtable", from_doubles(table.shape(), dtable)}};
}

// Ids [1, n] (batch-shaped) over a table of 7 rows, so ids repeat; with a shard, the table holds rows [3, 8) of 11.
OpCase embedding_case(bool sharded) {
  const int64_t width = 40, rows = sharded ? 5 : 7;
  const VocabShard shard = sharded ? VocabShard{3, 11} : VocabShard{};
  OpCase c;
  c.name = sharded ? "embedding_vocab_shard" : "embedding";
  c.make_inputs = [=](int64_t n, Rng& rng) {
    return std::vector<Input>{index("ids", random_ids({1, n}, sharded ? shard.total : rows, rng)),
                              act("table", random_tensor({rows, width}, rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor out = env.out({1, in["ids"].dim(1), width});
    ops::embedding_forward(in["ids"], in["table"], out, shard);
    return Tensors{{"out", out}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor dtable = env.accumulator(in["table"].shape());
    ops::embedding_backward(in["ids"], dy["out"], dtable, shard);
    return Tensors{{"dtable", dtable}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    return reference_embedding(in["ids"], in["table"], dy["out"], shard.begin);
  };
  c.reference_tol = 1e-6;  // out exactly; dtable less its random start, an f32 subtraction
  c.device_tol = {0.0, 0.0, 0.0};
  return c;
}

// The table's 13 rows split unevenly over `ranks` ranks (support/vocab_shards.h): the ranks' outputs summed and their
// dtable rows stacked equal the unsharded op's.
OpCase embedding_vocab_parallel_case(int ranks) {
  const int64_t width = 40, vocab = 13;
  OpCase c;
  c.name = fmt::format("embedding_vocab_parallel_x{}", ranks);
  c.make_inputs = [=](int64_t n, Rng& rng) {
    return std::vector<Input>{index("ids", random_ids({n}, vocab, rng)), act("table", random_tensor({vocab, width}, rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const Tensor dout = ops::zeros({in["ids"].numel(), width}, env.act(), env.device());
    const Tensor dtable0 = ops::zeros({vocab, width}, DType::kF32, env.device());
    return Tensors{{"out", vocab_parallel_embedding(in["ids"], in["table"], dout, dtable0, ranks).out}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor dtable = env.accumulator({vocab, width});
    const Tensor stacked = vocab_parallel_embedding(in["ids"], in["table"], env.act_tensor(dy["out"]), dtable, ranks).dtable;
    ops::copy(dtable, ops::to_device(stacked, env.device()));
    return Tensors{{"dtable", dtable}};
  };
  c.reference = [](const Tensors& in, const Tensors& dy, float) {
    return reference_embedding(in["ids"], in["table"], dy["out"], 0);
  };
  c.reference_tol = 1e-6;
  c.device_tol = {0.0, 0.0, 0.0};
  return c;
}

// ---- rmsnorm ---------------------------------------------------------------------------------------------------

// x [1, n, 2, 40] normalised over the last dimension (Qwen3's q/k norm over heads), or three wide rows x [3, 2000 + n]
// (a model's width, awkward by the size); eps 1e-5.
OpCase rmsnorm_case(bool wide) {
  const double eps = 1e-5;
  OpCase c;
  c.name = wide ? "rmsnorm_wide" : "rmsnorm";
  c.make_inputs = [=](int64_t n, Rng& rng) {
    const int64_t width = wide ? 2000 + n : 40;
    return std::vector<Input>{act("x", random_tensor(wide ? Shape{3, width} : Shape{1, n, 2, width}, rng, 2.0f)),
                              act("w", random_tensor({width}, rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const Tensor& x = in["x"];
    Tensor y = env.out(x.shape());
    Shape stats = x.shape();
    stats.pop_back();
    Tensor rstd = env.out_f32(stats);
    ops::rmsnorm_forward(x, in["w"], static_cast<float>(eps), y, rstd);
    return Tensors{{"y", y}, {"rstd", rstd}};
  };
  c.backward = [](const Tensors& in, const Tensors& out, const Tensors& dy, OpEnv& env) {
    Tensor dx = env.out(in["x"].shape()), dw = env.accumulator(in["w"].shape());
    ops::rmsnorm_backward(dy["y"], in["x"], in["w"], out["rstd"], dx, dw);
    return Tensors{{"dx", dx}, {"dw", dw}};
  };
  // y = w x s with s = 1/sqrt(mean(x²) + eps); dx = s (dy w − x s (Σ dy w x s) / C); dw = Σ_rows dy x s.
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    const Tensor &x = in["x"], &w = in["w"], &r = dy["y"];
    const int64_t width = w.numel(), rows = x.numel() / width;
    std::vector<double> y(x.numel()), rstd(rows), dx(x.numel()), dw(width, 0.0);
    for (int64_t row = 0; row < rows; ++row) {
      double ms = 0.0;
      for (int64_t i = 0; i < width; ++i) ms += at(x, row * width + i) * at(x, row * width + i);
      const double s = 1.0 / std::sqrt(ms / width + eps);
      rstd[row] = s;
      double dot = 0.0;
      for (int64_t i = 0; i < width; ++i) {
        const double xv = at(x, row * width + i), rv = at(r, row * width + i);
        y[row * width + i] = at(w, i) * xv * s;
        dot += rv * at(w, i) * xv * s;
        dw[i] += rv * xv * s;
      }
      for (int64_t i = 0; i < width; ++i) {
        dx[row * width + i] = s * (at(r, row * width + i) * at(w, i) - at(x, row * width + i) * s * dot / width);
      }
    }
    Shape stats = x.shape();
    stats.pop_back();
    return Tensors{{"y", from_doubles(x.shape(), y)},
                   {"rstd", from_doubles(stats, rstd)},
                   {"dx", from_doubles(x.shape(), dx)},
                   {"dw", from_doubles(w.shape(), dw)}};
  };
  c.fd_eps = 5e-3;
  return c;
}

// ---- rope ------------------------------------------------------------------------------------------------------

// Pair (i, i + D/2) of token (b, t) rotates by row p of the tables (p = t, or positions[b, t]); the backward by the
// inverse rotation.
// Interleaved: the pair (2i, 2i + 1) instead.
Tensors reference_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor* positions,
                       const Tensor& dy, bool interleaved = false) {
  const int64_t seq = x.dim(1), heads = x.dim(2), dim = x.dim(3), half = dim / 2;
  std::vector<double> y(x.numel()), dx(x.numel());
  for (int64_t v = 0; v < x.numel() / dim; ++v) {
    const int64_t token = v / heads;  // b · T + t
    const int64_t p = positions != nullptr ? positions->i32()[token] : token % seq;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t first = v * dim + (interleaved ? 2 * i : i), second = interleaved ? first + 1 : first + half;
      const double c = at(cos, p * half + i), s = at(sin, p * half + i);
      const double a = at(x, first), b = at(x, second);
      const double da = at(dy, first), db = at(dy, second);
      y[first] = a * c - b * s;
      y[second] = b * c + a * s;
      dx[first] = da * c + db * s;
      dx[second] = db * c - da * s;
    }
  }
  return Tensors{{"y", from_doubles(x.shape(), y)}, {"dx", from_doubles(x.shape(), dx)}};
}

// x [B, n, H, D] rotated by the table rows of its positions t, or with `positions` by rows positions[b, t] drawn at
// random from a table of n + 5 rows (packed documents: rows repeat, and rows past T are read).
// interleaved: adjacent pairs (multi-head latent attention).
OpCase rope_case(const std::string& name, int64_t batch, int64_t heads, int64_t dim, bool positions,
                 bool interleaved = false) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](int64_t n, Rng& rng) {
    const int64_t rows = positions ? n + 5 : n;
    auto [cos, sin] = rope_tables(rows, dim / 2);
    std::vector<Input> in{act("x", random_tensor({batch, n, heads, dim}, rng)), f32("cos", cos), f32("sin", sin)};
    if (positions) in.push_back(index("positions", random_ids({batch, n}, rows, rng)));
    return in;
  };
  auto positions_of = [=](const Tensors& in) { return positions ? in["positions"] : Tensor(); };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor y = env.copy(in["x"]);
    ops::rope_forward(y, in["cos"], in["sin"], positions_of(in), interleaved);
    return Tensors{{"y", y}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor dx = env.copy(dy["y"]);
    ops::rope_backward(dx, in["cos"], in["sin"], positions_of(in), interleaved);
    return Tensors{{"dx", dx}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    return reference_rope(in["x"], in["cos"], in["sin"], positions ? &in["positions"] : nullptr, dy["y"],
                          interleaved);
  };
  c.reference_tol = 1e-6;
  c.device_sizes = {1000};
  return c;
}

// ---- head_concat -----------------------------------------------------------------------------------------------

// out [n, H, Da + Db] joins a [n, H, Da] and b [n, Hb, Db] per head (b shared by the heads when Hb = 1); the backward
// splits, summing b's gradient over the heads sharing it.
OpCase head_concat_case(const std::string& name, int64_t heads, int64_t b_heads, int64_t da, int64_t db) {
  OpCase c;
  c.name = name;
  c.device_sizes = {1000};
  c.make_inputs = [=](int64_t n, Rng& rng) {
    return std::vector<Input>{act("a", random_tensor({n, heads, da}, rng)),
                              act("b", random_tensor({n, b_heads, db}, rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor out = env.out({in["a"].dim(0), heads, da + db});
    ops::head_concat(in["a"], in["b"], out);
    return Tensors{{"out", out}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor d_a = env.out(in["a"].shape()), dbt = env.out(in["b"].shape());
    ops::head_concat_backward(dy["out"], d_a, dbt);
    return Tensors{{"da", d_a}, {"db", dbt}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    const int64_t n = in["a"].dim(0), w = da + db;
    std::vector<double> out(static_cast<size_t>(n * heads * w)), ga(in["a"].numel()), gb(in["b"].numel(), 0.0);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t hb = b_heads == 1 ? 0 : h;
        for (int64_t i = 0; i < w; ++i) {
          const int64_t o = (r * heads + h) * w + i;
          if (i < da) {
            out[o] = at(in["a"], (r * heads + h) * da + i);
            ga[(r * heads + h) * da + i] = at(dy["out"], o);
          } else {
            out[o] = at(in["b"], (r * b_heads + hb) * db + i - da);
            gb[(r * b_heads + hb) * db + i - da] += at(dy["out"], o);
          }
        }
      }
    }
    return Tensors{{"out", from_doubles({n, heads, w}, out)},
                   {"da", from_doubles(in["a"].shape(), ga)},
                   {"db", from_doubles(in["b"].shape(), gb)}};
  };
  return c;
}

// ---- attention -------------------------------------------------------------------------------------------------

// A key/value block of the reference: which of its keys j query t of row b sees.
struct KeyBlock {
  const Tensor* k;
  const Tensor* v;
  std::function<bool(int64_t b, int64_t t, int64_t j)> visible;
};

// Softmax attention of q [B, T, Hq, D] over the visible keys of every block together, in double, row by row; the
// textbook softmax gradient. Gradients dk, dv per block, named "dk", "dv" (one block) or "dk0", "dv0", "dk1", ...
Tensors reference_attention(const Tensor& q, const std::vector<KeyBlock>& blocks, const Tensor& dout) {
  const int64_t batch = q.dim(0), seq = q.dim(1), hq = q.dim(2), dim = q.dim(3);
  const int64_t hkv = blocks[0].k->dim(2), keys = blocks[0].k->dim(1), vdim = blocks[0].v->dim(3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  // Offset of row (b, t, h) of x, whose rows have `width` features.
  auto row = [&](const Tensor& x, int64_t b, int64_t t, int64_t h, int64_t width) {
    return ((b * x.dim(1) + t) * x.dim(2) + h) * width;
  };
  const Shape out_shape{batch, seq, hq, vdim};
  std::vector<double> out(shape_numel(out_shape), 0.0), dq(q.numel(), 0.0), lse(batch * hq * seq);
  std::vector<std::vector<double>> dk(blocks.size(), std::vector<double>(blocks[0].k->numel(), 0.0));
  std::vector<std::vector<double>> dv(blocks.size(), std::vector<double>(blocks[0].v->numel(), 0.0));
  const int64_t n_keys = static_cast<int64_t>(blocks.size()) * keys;
  std::vector<double> s(n_keys), p(n_keys), dp(n_keys);
  std::vector<char> seen(n_keys);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kvh = h / (hq / hkv);
      for (int64_t t = 0; t < seq; ++t) {
        const int64_t qrow = row(q, b, t, h, dim), orow = row(q, b, t, h, vdim);
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t key = 0; key < n_keys; ++key) {
          const KeyBlock& block = blocks[key / keys];
          const int64_t j = key % keys;
          seen[key] = block.visible(b, t, j);
          if (!seen[key]) continue;
          s[key] = 0.0;
          for (int64_t i = 0; i < dim; ++i) s[key] += at(q, qrow + i) * at(*block.k, row(*block.k, b, j, kvh, dim) + i);
          s[key] *= scale;
          max = std::max(max, s[key]);
        }
        double sum = 0.0;
        for (int64_t key = 0; key < n_keys; ++key) sum += seen[key] ? std::exp(s[key] - max) : 0.0;
        lse[(b * hq + h) * seq + t] = max + std::log(sum);
        double delta = 0.0;
        for (int64_t key = 0; key < n_keys; ++key) {
          if (!seen[key]) continue;
          const KeyBlock& block = blocks[key / keys];
          const int64_t vrow = row(*block.v, b, key % keys, kvh, vdim);
          p[key] = std::exp(s[key] - max) / sum;
          dp[key] = 0.0;
          for (int64_t i = 0; i < vdim; ++i) {
            out[orow + i] += p[key] * at(*block.v, vrow + i);
            dp[key] += at(dout, orow + i) * at(*block.v, vrow + i);
          }
          delta += p[key] * dp[key];
        }
        for (int64_t key = 0; key < n_keys; ++key) {
          if (!seen[key]) continue;
          const KeyBlock& block = blocks[key / keys];
          const int64_t krow = row(*block.k, b, key % keys, kvh, dim), which = key / keys;
          const int64_t vrow = row(*block.v, b, key % keys, kvh, vdim);
          const double ds = p[key] * (dp[key] - delta);
          for (int64_t i = 0; i < dim; ++i) {
            dq[qrow + i] += scale * ds * at(*block.k, krow + i);
            dk[which][krow + i] += scale * ds * at(q, qrow + i);
          }
          for (int64_t i = 0; i < vdim; ++i) dv[which][vrow + i] += p[key] * at(dout, orow + i);
        }
      }
    }
  }
  Tensors r{{"out", from_doubles(out_shape, out)},
            {"lse", from_doubles({batch, hq, seq}, lse)},
            {"dq", from_doubles(q.shape(), dq)}};
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string suffix = blocks.size() == 1 ? "" : std::to_string(i);
    r.add("dk" + suffix, from_doubles(blocks[i].k->shape(), dk[i]));
    r.add("dv" + suffix, from_doubles(blocks[i].v->shape(), dv[i]));
  }
  return r;
}

// Documents of random length packed into each row (a token starts a new one with probability 1/4, so one-token
// documents occur); row 0 is one document throughout. [B, T] i32: the first position of each token's document.
Tensor random_segments(int64_t batch, int64_t seq, Rng& rng) {
  Tensor starts = Tensor::empty({batch, seq}, DType::kI32);
  for (int64_t b = 0; b < batch; ++b) {
    int32_t start = 0;
    for (int64_t t = 0; t < seq; ++t) {
      if (b > 0 && t > 0 && rng.below(4) == 0) start = static_cast<int32_t>(t);
      starts.i32()[b * seq + t] = start;
    }
  }
  return starts;
}

struct AttentionShape {
  int64_t batch, q_heads, kv_heads, dim;
  int64_t v_dim = 0;  // the value head size; 0: dim (multi-head latent attention's differs)
};

enum class AttentionKind { kCausal, kSegments, kCausalBlock, kUnmaskedBlock };

// lse (f32) of a bf16 run: 1e-4, the native kernels' sums of bf16 products in another order.
Tolerance attention_tolerance() { return {1e-4, 1e-2, 1e-4}; }

// Attention over a sequence of n tokens: ops::attention_forward/backward (causal, or with segment starts), or a
// block of ring attention (attention_block_forward/backward with its own out and lse).
// q and k drawn at `qk_scale`: 30 makes scores of hundreds, where a softmax without its max subtracted overflows.
OpCase attention_case(const std::string& name, AttentionShape shape, AttentionKind kind, float qk_scale = 1.0f) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](int64_t n, Rng& rng) {
    std::vector<Input> in{act("q", random_tensor({shape.batch, n, shape.q_heads, shape.dim}, rng, qk_scale)),
                          act("k", random_tensor({shape.batch, n, shape.kv_heads, shape.dim}, rng, qk_scale)),
                          act("v", random_tensor({shape.batch, n, shape.kv_heads, shape.v_dim > 0 ? shape.v_dim
                                                                                                   : shape.dim},
                                                 rng))};
    if (kind == AttentionKind::kSegments) in.push_back(index("segment_start", random_segments(shape.batch, n, rng)));
    return in;
  };
  const bool block = kind == AttentionKind::kCausalBlock || kind == AttentionKind::kUnmaskedBlock;
  const AttentionMask mask = kind == AttentionKind::kUnmaskedBlock ? AttentionMask::kNone : AttentionMask::kCausal;
  auto starts = [=](const Tensors& in) { return kind == AttentionKind::kSegments ? in["segment_start"] : Tensor(); };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const Tensor& q = in["q"];
    Tensor out = env.out({q.dim(0), q.dim(1), q.dim(2), in["v"].dim(3)}),
           lse = env.out_f32({q.dim(0), q.dim(2), q.dim(1)});
    if (block) {
      ops::attention_block_forward(q, in["k"], in["v"], mask, out, lse);
    } else {
      ops::attention_forward(q, in["k"], in["v"], out, lse, starts(in));
    }
    return Tensors{{"out", out}, {"lse", lse}};
  };
  c.backward = [=](const Tensors& in, const Tensors& out, const Tensors& dy, OpEnv& env) {
    Tensor dq = env.out(in["q"].shape()), dk = env.out(in["k"].shape()), dv = env.out(in["v"].shape());
    if (block) {
      ops::attention_block_backward(in["q"], in["k"], in["v"], mask, out["out"], out["lse"], dy["out"], dq, dk, dv);
    } else {
      ops::attention_backward(in["q"], in["k"], in["v"], out["out"], out["lse"], dy["out"], dq, dk, dv, starts(in));
    }
    return Tensors{{"dq", dq}, {"dk", dk}, {"dv", dv}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    const Tensor segment_start = starts(in);
    const int64_t seq = in["q"].dim(1);
    auto visible = [=](int64_t b, int64_t t, int64_t j) {
      if (mask == AttentionMask::kNone) return true;
      const int64_t first = segment_start.defined() ? segment_start.i32()[b * seq + t] : 0;
      return first <= j && j <= t;
    };
    return reference_attention(in["q"], {KeyBlock{&in["k"], &in["v"], visible}}, dy["out"]);
  };
  c.floors = {{"dq", 1.0}, {"dk", 1.0}};  // zero in exact arithmetic where a query sees one key (T = 1)
  c.device_tol = attention_tolerance();
  return c;
}

// Ring attention's composition: the queries against an unmasked key/value block and a causal one, merged
// (attention_merge); each block's backward from the merged out and lse gives its part of the gradients, dq summed.
OpCase attention_blocks_merged_case(const std::string& name, AttentionShape shape) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](int64_t n, Rng& rng) {
    const Shape kv{shape.batch, n, shape.kv_heads, shape.dim};
    return std::vector<Input>{act("q", random_tensor({shape.batch, n, shape.q_heads, shape.dim}, rng)),
                              act("k0", random_tensor(kv, rng)), act("v0", random_tensor(kv, rng)),
                              act("k1", random_tensor(kv, rng)), act("v1", random_tensor(kv, rng))};
  };
  c.forward = [](const Tensors& in, OpEnv& env) {
    const Tensor& q = in["q"];
    const Shape lse_shape{q.dim(0), q.dim(2), q.dim(1)};
    Tensor out = env.out(q.shape()), lse = env.out_f32(lse_shape);
    Tensor block = env.out(q.shape()), block_lse = env.out_f32(lse_shape);
    ops::attention_block_forward(q, in["k0"], in["v0"], AttentionMask::kNone, out, lse);
    ops::attention_block_forward(q, in["k1"], in["v1"], AttentionMask::kCausal, block, block_lse);
    ops::attention_merge(out, lse, block, block_lse);
    return Tensors{{"out", out}, {"lse", lse}};
  };
  c.backward = [](const Tensors& in, const Tensors& out, const Tensors& dy, OpEnv& env) {
    const Tensor& q = in["q"];
    Tensor dq = env.out(q.shape()), dq1 = env.out(q.shape());
    Tensor dk0 = env.out(in["k0"].shape()), dv0 = env.out(in["k0"].shape());
    Tensor dk1 = env.out(in["k0"].shape()), dv1 = env.out(in["k0"].shape());
    ops::attention_block_backward(q, in["k0"], in["v0"], AttentionMask::kNone, out["out"], out["lse"], dy["out"], dq,
                                  dk0, dv0);
    ops::attention_block_backward(q, in["k1"], in["v1"], AttentionMask::kCausal, out["out"], out["lse"], dy["out"],
                                  dq1, dk1, dv1);
    ops::add_inplace(dq, dq1);
    return Tensors{{"dq", dq}, {"dk0", dk0}, {"dv0", dv0}, {"dk1", dk1}, {"dv1", dv1}};
  };
  c.reference = [](const Tensors& in, const Tensors& dy, float) {
    auto all = [](int64_t, int64_t, int64_t) { return true; };
    auto causal = [](int64_t, int64_t t, int64_t j) { return j <= t; };
    return reference_attention(in["q"], {KeyBlock{&in["k0"], &in["v0"], all}, KeyBlock{&in["k1"], &in["v1"], causal}},
                               dy["out"]);
  };
  c.device_tol = attention_tolerance();
  return c;
}

// ---- swiglu ----------------------------------------------------------------------------------------------------

// gate_up [n, 2F] (per row the gate, then the up projection), F = n + 24; with in_place the gradient is written
// over a copy of gate_up, as the MLP does.
OpCase swiglu_case(bool in_place) {
  OpCase c;
  c.name = in_place ? "swiglu_in_place" : "swiglu";
  c.make_inputs = [](int64_t n, Rng& rng) {
    return std::vector<Input>{act("gate_up", random_tensor({n, 2 * (n + 24)}, rng, 3.0f))};
  };
  c.forward = [](const Tensors& in, OpEnv& env) {
    const Tensor& gate_up = in["gate_up"];
    Tensor out = env.out({gate_up.dim(0), gate_up.dim(1) / 2});
    ops::swiglu_forward(gate_up, out);
    return Tensors{{"out", out}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor grad = in_place ? env.copy(in["gate_up"]) : env.out(in["gate_up"].shape());
    ops::swiglu_backward(in_place ? grad : in["gate_up"], dy["out"], grad);
    return Tensors{{"dgate_up", grad}};
  };
  // out = silu(g) u; d/dg = dout u (σ + g σ (1 − σ)), d/du = dout silu(g).
  c.reference = [](const Tensors& in, const Tensors& dy, float) {
    const Tensor &gate_up = in["gate_up"], &r = dy["out"];
    const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
    std::vector<double> out(rows * f), grad(rows * 2 * f);
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t i = 0; i < f; ++i) {
        const double g = at(gate_up, row * 2 * f + i), u = at(gate_up, row * 2 * f + f + i), d = at(r, row * f + i);
        const double sig = 1.0 / (1.0 + std::exp(-g));
        out[row * f + i] = g * sig * u;
        grad[row * 2 * f + i] = d * u * (sig + g * sig * (1.0 - sig));
        grad[row * 2 * f + f + i] = d * g * sig;
      }
    }
    return Tensors{{"out", from_doubles({rows, f}, out)}, {"dgate_up", from_doubles(gate_up.shape(), grad)}};
  };
  c.reference_tol = 1e-6;
  return c;
}

// ---- elementwise -----------------------------------------------------------------------------------------------

OpCase add_case() {
  OpCase c;
  c.name = "add_inplace";
  c.make_inputs = [](int64_t n, Rng& rng) {
    return std::vector<Input>{act("y0", random_tensor({n, 129}, rng)), act("x", random_tensor({n, 129}, rng))};
  };
  c.forward = [](const Tensors& in, OpEnv& env) {
    Tensor y = env.copy(in["y0"]);
    ops::add_inplace(y, in["x"]);
    return Tensors{{"y", y}};
  };
  c.backward = [](const Tensors&, const Tensors&, const Tensors& dy, OpEnv& env) {
    return Tensors{{"dy0", env.copy(dy["y"])}, {"dx", env.copy(dy["y"])}};
  };
  c.reference = [](const Tensors& in, const Tensors&, float) {
    std::vector<double> y(in["x"].numel());
    for (int64_t i = 0; i < in["x"].numel(); ++i) y[i] = at(in["y0"], i) + at(in["x"], i);
    return Tensors{{"y", from_doubles(in["x"].shape(), y)}};
  };
  c.reference_tol = 1e-7;
  c.device_sizes = {127, 7753};  // 16383 and 1000137 elements: several blocks, and a vector tail
  return c;
}

// scale_inplace: f32 (gradients, clipping), and bf16 activations on devices (multi-head latent attention's YaRN
// factor on its queries).
OpCase scale_case() {
  const float factor = -0.37f;
  OpCase c;
  c.name = "scale_inplace";
  c.make_inputs = [](int64_t n, Rng& rng) { return std::vector<Input>{act("x", random_tensor({n, 129}, rng))}; };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor y = env.copy(in["x"]);
    ops::scale_inplace(y, factor);
    return Tensors{{"y", y}};
  };
  c.backward = [=](const Tensors&, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor dx = env.copy(dy["y"]);
    ops::scale_inplace(dx, factor);
    return Tensors{{"dx", dx}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    std::vector<double> y(in["x"].numel()), dx(y.size());
    for (int64_t i = 0; i < in["x"].numel(); ++i) {
      y[i] = factor * at(in["x"], i);
      dx[i] = factor * at(dy["y"], i);
    }
    return Tensors{{"y", from_doubles(in["x"].shape(), y)}, {"dx", from_doubles(in["x"].shape(), dx)}};
  };
  c.reference_tol = 1e-7;
  c.device_sizes = {127, 7753};
  return c;
}

// ---- cross-entropy ---------------------------------------------------------------------------------------------

// losses, lse and, for L = scale · Σ losses, dlogits = scale (softmax − onehot) (zero rows for ignored targets), of
// logits [N, V] against targets in [0, V).
Tensors reference_cross_entropy(const Tensor& logits, const Tensor& targets, double scale) {
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  std::vector<double> losses(rows), lse(rows), d(rows * vocab);
  for (int64_t r = 0; r < rows; ++r) {
    double max = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (int64_t v = 0; v < vocab; ++v) max = std::max(max, at(logits, r * vocab + v));
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(at(logits, r * vocab + v) - max);
    lse[r] = max + std::log(sum);
    const int32_t t = targets.i32()[r];
    losses[r] = t < 0 ? 0.0 : lse[r] - at(logits, r * vocab + t);
    for (int64_t v = 0; v < vocab; ++v) {
      d[r * vocab + v] = t < 0 ? 0.0 : scale * (std::exp(at(logits, r * vocab + v) - lse[r]) - (v == t ? 1.0 : 0.0));
    }
  }
  return Tensors{{"losses", from_doubles({rows}, losses)},
                 {"lse", from_doubles({rows}, lse)},
                 {"dlogits", from_doubles(logits.shape(), d)}};
}

enum class CrossEntropyKind { kSeparate, kInPlace, kFused, kVocabParallel };

// Softmax cross-entropy of logits [n, V] (V from the size) with ignored rows; the loss weight is one scalar, the
// backward's grad_scale. kInPlace writes dlogits over a copy of the logits (the loss layer's way), kFused runs
// cross_entropy_forward_backward, kVocabParallel the vocabulary-parallel steps over `ranks` uneven shards.
OpCase cross_entropy_case(const std::string& name, CrossEntropyKind kind, std::function<Shape(int64_t)> shape,
                          int ranks = 1) {
  OpCase c;
  c.name = name;
  c.scalar_upstream = true;
  c.make_inputs = [=](int64_t n, Rng& rng) {
    const Shape s = shape(n);
    return std::vector<Input>{act("logits", random_tensor(s, rng, 3.0f)),
                              index("targets", targets_with_ignored(s[0], s[1], rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const Tensor &logits = in["logits"], &targets = in["targets"];
    if (kind == CrossEntropyKind::kVocabParallel) {
      const VocabParallelLoss loss = vocab_parallel_cross_entropy(logits, targets, ranks, env.upstream_scale());
      return Tensors{{"losses", loss.losses}, {"lse", loss.lse}};
    }
    Tensor losses = env.out_f32({logits.dim(0)}), lse = env.out_f32({logits.dim(0)});
    if (kind == CrossEntropyKind::kFused) {
      Tensor scratch = env.copy(logits);
      ops::cross_entropy_forward_backward(scratch, targets, losses, lse, env.upstream_scale(), scratch);
    } else {
      ops::cross_entropy_forward(logits, targets, losses, lse);
    }
    return Tensors{{"losses", losses}, {"lse", lse}};
  };
  c.backward = [=](const Tensors& in, const Tensors& out, const Tensors&, OpEnv& env) {
    const Tensor &logits = in["logits"], &targets = in["targets"];
    const float scale = env.upstream_scale();
    switch (kind) {
      case CrossEntropyKind::kSeparate: {
        Tensor dlogits = env.out(logits.shape());
        ops::cross_entropy_backward(logits, targets, out["lse"], scale, dlogits);
        return Tensors{{"dlogits", dlogits}};
      }
      case CrossEntropyKind::kInPlace: {
        Tensor dlogits = env.copy(logits);
        ops::cross_entropy_backward(dlogits, targets, out["lse"], scale, dlogits);
        return Tensors{{"dlogits", dlogits}};
      }
      case CrossEntropyKind::kFused: {
        Tensor dlogits = env.copy(logits);
        Tensor losses = env.out_f32({logits.dim(0)}), lse = env.out_f32({logits.dim(0)});
        ops::cross_entropy_forward_backward(dlogits, targets, losses, lse, scale, dlogits);
        return Tensors{{"dlogits", dlogits}};
      }
      case CrossEntropyKind::kVocabParallel:
        break;
    }
    // The ranks' columns side by side come back as host f32: in the run's dtype again (exact), so a bf16 run is
    // held to bf16's tolerance.
    return Tensors{{"dlogits", env.act_tensor(vocab_parallel_cross_entropy(logits, targets, ranks, scale).dlogits)}};
  };
  c.reference = [](const Tensors& in, const Tensors&, float scale) {
    return reference_cross_entropy(in["logits"], in["targets"], scale);
  };
  c.reference_tol = 1e-6;
  // Gradients of about scale/V against a loss held in fp32 per row: a larger step keeps the rounding of the loss
  // (~1e-6 of it) well below the differences; the truncation error (step² of the logits' curvature) stays < 1e-3.
  c.fd_eps = 5e-2;
  return c;
}

// The vocabulary-parallel steps one at a time, on one shard: columns [7, 7 + n) of a vocabulary of n + 20, targets
// held here (every other row), held elsewhere and ignored, and a group max at or above this shard's row max.
struct ShardInputs {
  VocabShard shard;
  Tensor logits, targets;
};
ShardInputs shard_inputs(int64_t n, Rng& rng) {
  const int64_t rows = 7;
  ShardInputs s{VocabShard{7, n + 20}, random_tensor({rows, n}, rng, 3.0f), Tensor()};
  s.targets = random_ids({rows}, s.shard.total, rng);
  for (int64_t r = 0; r < rows; r += 2) {
    s.targets.i32()[r] = static_cast<int32_t>(s.shard.begin + static_cast<int64_t>(rng.below(n)));
  }
  s.targets.i32()[3] = -1;
  return s;
}

// max of every row of x [7, n]: exact on every device.
OpCase row_max_case() {
  OpCase c;
  c.name = "row_max";
  c.make_inputs = [](int64_t n, Rng& rng) { return std::vector<Input>{act("x", random_tensor({7, n}, rng, 3.0f))}; };
  c.forward = [](const Tensors& in, OpEnv& env) {
    Tensor max = env.out_f32({in["x"].dim(0)});
    ops::row_max(in["x"], max);
    return Tensors{{"max", max}};
  };
  c.reference = [](const Tensors& in, const Tensors&, float) {
    const Tensor& x = in["x"];
    std::vector<double> max(x.dim(0));
    for (int64_t r = 0; r < x.dim(0); ++r) max[r] = *std::max_element(x.f32() + r * x.dim(1), x.f32() + (r + 1) * x.dim(1));
    return Tensors{{"max", from_doubles({x.dim(0)}, max)}};
  };
  c.reference_tol = 0.0;
  c.device_tol = {0.0, 0.0, 0.0};
  return c;
}

OpCase shard_stats_case() {
  OpCase c;
  c.name = "cross_entropy_shard_stats";
  c.make_inputs = [](int64_t n, Rng& rng) {
    ShardInputs s = shard_inputs(n, rng);
    Tensor max = Tensor::empty({s.logits.dim(0)}, DType::kF32);
    for (int64_t r = 0; r < max.numel(); ++r) {
      max.f32()[r] = *std::max_element(s.logits.f32() + r * n, s.logits.f32() + (r + 1) * n) + (r % 3 == 0 ? 1.5f : 0.0f);
    }
    return std::vector<Input>{act("logits", s.logits), index("targets", s.targets), f32("max", max)};
  };
  c.forward = [](const Tensors& in, OpEnv& env) {
    const int64_t n = in["logits"].dim(1), rows = in["logits"].dim(0);
    Tensor sum_exp = env.out_f32({rows}), target_logit = env.out_f32({rows});
    ops::cross_entropy_shard_stats(in["logits"], in["targets"], VocabShard{7, n + 20}, in["max"], sum_exp, target_logit);
    return Tensors{{"sum_exp", sum_exp}, {"target_logit", target_logit}};
  };
  c.reference = [](const Tensors& in, const Tensors&, float) {
    const Tensor &logits = in["logits"], &targets = in["targets"];
    const int64_t rows = logits.dim(0), n = logits.dim(1);
    std::vector<double> sum(rows, 0.0), target(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t v = 0; v < n; ++v) sum[r] += std::exp(at(logits, r * n + v) - at(in["max"], r));
      const int64_t t = targets.i32()[r] - 7;
      if (targets.i32()[r] >= 0 && t >= 0 && t < n) target[r] = at(logits, r * n + t);
    }
    return Tensors{{"sum_exp", from_doubles({rows}, sum)}, {"target_logit", from_doubles({rows}, target)}};
  };
  c.reference_tol = 1e-6;
  c.sizes = {1, 31, 32, 33, 257};
  c.device_sizes = {4096};
  return c;
}

// lse = max + log(sum_exp), losses = lse − target_logit (0 for an ignored row), over n rows.
OpCase finish_case() {
  OpCase c;
  c.name = "cross_entropy_finish";
  c.dtypes = {DType::kF32};  // every tensor is f32 or i32: a bf16 run would repeat the f32 one
  c.make_inputs = [](int64_t n, Rng& rng) {
    Tensor sum_exp = Tensor::empty({n}, DType::kF32);
    for (int64_t i = 0; i < n; ++i) sum_exp.f32()[i] = static_cast<float>(1.0 + 30.0 * rng.uniform());
    return std::vector<Input>{f32("max", random_tensor({n}, rng, 3.0f)), f32("sum_exp", sum_exp),
                              f32("target_logit", random_tensor({n}, rng, 3.0f)),
                              index("targets", targets_with_ignored(n, 50, rng))};
  };
  c.forward = [](const Tensors& in, OpEnv& env) {
    const int64_t n = in["max"].numel();
    Tensor losses = env.out_f32({n}), lse = env.out_f32({n});
    ops::cross_entropy_finish(in["max"], in["sum_exp"], in["target_logit"], in["targets"], losses, lse);
    return Tensors{{"losses", losses}, {"lse", lse}};
  };
  c.reference = [](const Tensors& in, const Tensors&, float) {
    const int64_t n = in["max"].numel();
    std::vector<double> losses(n), lse(n);
    for (int64_t i = 0; i < n; ++i) {
      lse[i] = at(in["max"], i) + std::log(at(in["sum_exp"], i));
      losses[i] = in["targets"].i32()[i] < 0 ? 0.0 : lse[i] - at(in["target_logit"], i);
    }
    return Tensors{{"losses", from_doubles({n}, losses)}, {"lse", from_doubles({n}, lse)}};
  };
  c.reference_tol = 1e-6;
  return c;
}

// cross_entropy_backward of one shard's columns from a given lse: the one-hot term only where this shard holds the
// target's column.
OpCase sharded_backward_case() {
  const float scale = 0.25f;
  OpCase c;
  c.name = "cross_entropy_backward_shard";
  c.make_inputs = [](int64_t n, Rng& rng) {
    ShardInputs s = shard_inputs(n, rng);
    Tensor lse = Tensor::empty({s.logits.dim(0)}, DType::kF32);
    for (int64_t r = 0; r < lse.numel(); ++r) {
      double sum = 0.0;  // this shard's share of the row's probability mass is below 1: others hold the rest
      for (int64_t v = 0; v < n; ++v) sum += std::exp(at(s.logits, r * n + v));
      lse.f32()[r] = static_cast<float>(std::log(sum) + 0.5 + rng.uniform());
    }
    return std::vector<Input>{act("logits", s.logits), index("targets", s.targets), f32("lse", lse)};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const int64_t n = in["logits"].dim(1);
    Tensor dlogits = env.out(in["logits"].shape());
    ops::cross_entropy_backward(in["logits"], in["targets"], in["lse"], scale, dlogits, VocabShard{7, n + 20});
    Tensor in_place = env.copy(in["logits"]);
    ops::cross_entropy_backward(in_place, in["targets"], in["lse"], scale, in_place, VocabShard{7, n + 20});
    return Tensors{{"dlogits", dlogits}, {"dlogits_in_place", in_place}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float) {
    const Tensor &logits = in["logits"], &targets = in["targets"];
    const int64_t rows = logits.dim(0), n = logits.dim(1);
    std::vector<double> d(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t t = targets.i32()[r];
      for (int64_t v = 0; v < n; ++v) {
        const double onehot = v + 7 == t ? 1.0 : 0.0;
        d[r * n + v] = t < 0 ? 0.0 : scale * (std::exp(at(logits, r * n + v) - at(in["lse"], r)) - onehot);
      }
    }
    return Tensors{{"dlogits", from_doubles(logits.shape(), d)}, {"dlogits_in_place", from_doubles(logits.shape(), d)}};
  };
  c.reference_tol = 1e-6;
  c.sizes = {1, 31, 32, 33, 257};
  c.device_sizes = {4096};
  // Vl = 1: an exact 0 against an ulp of p; compare absolutely at the scale of the gradient.
  c.floors = {{"dlogits", scale}, {"dlogits_in_place", scale}};
  return c;
}

std::vector<OpCase> build_cases() {
  // A case swept on devices only, at the given sizes (real shapes, too large for finite differences on the CPU).
  auto device_only = [](OpCase c, std::vector<int64_t> sizes) {
    c.sizes = {};
    c.device_sizes = std::move(sizes);
    return c;
  };
  std::vector<OpCase> cases;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      cases.push_back(gemm_case(ta, tb, 0.0f));
      cases.push_back(gemm_case(ta, tb, 0.5f));
    }
  }
  cases.push_back(linear_case());
  // Features that are no multiples of 8: the general kernel on every device dtype.
  OpCase general = grouped_linear_case("grouped_linear", [](int64_t rows) {
    return ExpertShape{rows > 200 ? 16 : 5, 37, 20};
  });
  general.device_sizes = {1000};
  cases.push_back(general);
  // Multiples of 8 but not of the 32-, 64-, 128- and 256-wide tiles: bf16 takes a tensor-core kernel (v2, wgmma
  // with TMA, on sm_90: partial row, column and k tiles; v1, mma.sync, elsewhere or with PRIMUS_GROUPED_GEMM=v1). On
  // devices also the two shapes of the performance section scaled down: Mixtral's 8 experts of ~2048 rows (4096 →
  // 28672 as 128 → 896, skewed) and Qwen3-30B-A3B's 128 experts of ~64 rows (2048 → 1536 as 256 → 192).
  OpCase aligned = grouped_linear_case("grouped_linear_aligned", [](int64_t rows) {
    if (rows == 16384) return ExpertShape{8, 128, 896, true};
    if (rows == 8192) return ExpertShape{128, 256, 192};
    if (rows == 1000) return ExpertShape{5, 136, 200};
    return ExpertShape{5, 40, 24};
  });
  aligned.device_sizes = {1000, 8192, 16384};
  cases.push_back(aligned);
  cases.push_back(embedding_case(false));
  cases.push_back(embedding_case(true));
  cases.push_back(embedding_vocab_parallel_case(3));
  cases.push_back(embedding_vocab_parallel_case(4));
  cases.push_back(rmsnorm_case(false));
  cases.push_back(rmsnorm_case(true));
  cases.push_back(rope_case("rope", 2, 3, 16, false));
  cases.push_back(rope_case("rope_d128", 1, 2, 128, false));
  cases.push_back(rope_case("rope_positions", 2, 3, 16, true));
  cases.push_back(rope_case("rope_interleaved", 2, 3, 8, false, true));
  cases.push_back(rope_case("rope_interleaved_positions", 2, 1, 6, true, true));
  cases.push_back(head_concat_case("head_concat", 3, 3, 5, 7));
  cases.push_back(head_concat_case("head_concat_shared", 4, 1, 6, 3));
  // DeepSeek-V2-Lite's: the queries' 128 features without RoPE and 64 with over 16 heads, and the key's one RoPE head
  // shared by them; devices only.
  cases.push_back(device_only(head_concat_case("head_concat_deepseek_q", 16, 16, 128, 64), {1, 1000}));
  cases.push_back(device_only(head_concat_case("head_concat_deepseek_k", 16, 1, 128, 64), {1, 1000}));
  cases.push_back(device_only(rope_case("rope_interleaved_d64", 2, 16, 64, false, true), {1, 130}));
  cases.push_back(device_only(rope_case("rope_interleaved_d64_positions", 2, 1, 64, true, true), {1, 130}));
  cases.push_back(attention_case("attention_gqa", {2, 4, 2, 16}, AttentionKind::kCausal));
  cases.push_back(attention_case("attention_mha_d64", {1, 2, 2, 64}, AttentionKind::kCausal));
  cases.push_back(attention_case("attention_d12", {1, 4, 4, 12}, AttentionKind::kCausal));
  cases.push_back(attention_case("attention_segments", {3, 4, 2, 8}, AttentionKind::kSegments));
  {
    // Multi-head latent attention's shapes: keys of 12 features (8 without RoPE, 4 with), values of 6, and the same
    // with packed documents (the native kernels in bf16 too: 12 and 6 are no multiples of 8).
    for (auto [name, kind] : {std::pair{"attention_value_dim", AttentionKind::kCausal},
                              std::pair{"attention_value_dim_segments", AttentionKind::kSegments}}) {
      cases.push_back(attention_case(name, {2, 3, 3, 12, 6}, kind));
    }
  }
  cases.push_back(attention_case("attention_block_causal", {2, 4, 2, 8}, AttentionKind::kCausalBlock));
  cases.push_back(attention_case("attention_block_unmasked", {2, 4, 2, 8}, AttentionKind::kUnmaskedBlock));
  {
    OpCase large = attention_case("attention_large_scores", {1, 2, 2, 16}, AttentionKind::kCausal, 30.0f);
    large.finite_differences = false;  // a saturated softmax: steps of 1e-2 jump between near-one-hot rows
    // dq and dk carry the scores' fp32 rounding times |k|, |q| ~ 30 (an ill-conditioned input, not a wrong
    // kernel): the point here is that nothing overflows, so out, lse and dv are held to the reference; dq and dk
    // of ordinary inputs are, in the other attention cases.
    large.reference = [full = large.reference](const Tensors& in, const Tensors& dy, float scale) {
      const Tensors all = full(in, dy, scale);
      return Tensors{{"out", all["out"]}, {"lse", all["lse"]}, {"dv", all["dv"]}};
    };
    large.reference_tol = 1e-4;  // scores of ~300 rounded to fp32 move each p by ~300 · 2^-24 ≈ 2e-5
    // On devices in f32 only, with the same conditioning allowance for dq and dk (bf16 inputs at this scale would
    // test cuDNN's rounding of a saturated P, not overflow).
    large.dtypes = {DType::kF32};
    large.device_tol.f32 = 1e-3;
    cases.push_back(large);
  }
  cases.push_back(attention_blocks_merged_case("attention_blocks_merged", {1, 4, 2, 8}));
  cases.push_back(attention_blocks_merged_case("attention_blocks_merged_d12", {2, 4, 4, 12}));
  // Devices only, at real head sizes and lengths (cuDNN's graphs in bf16, its padded backward at T ≡ 64 mod 128),
  // and the llama3.2-1B head layout (32 query heads over 8 kv heads, D 128).
  cases.push_back(device_only(attention_blocks_merged_case("attention_blocks_merged_d64", {2, 8, 2, 64}),
                              {17, 128, 130, 704}));
  cases.push_back(
      device_only(attention_blocks_merged_case("attention_blocks_merged_1b_heads", {1, 32, 8, 128}), {1024}));
  cases.push_back(device_only(attention_case("attention_gqa_d128", {2, 8, 2, 128}, AttentionKind::kCausal), {17, 130}));
  cases.push_back(
      device_only(attention_case("attention_llama_1b_heads", {1, 32, 8, 128}, AttentionKind::kCausal), {17, 130, 1000}));
  // Multi-head latent attention at real head sizes, devices only: keys of 24 and values of 16 (multiples of 8, so bf16
  // runs on cuDNN's graphs with separate d_qk and d_v), and DeepSeek-V2-Lite's 16 heads of 128 + 64 and values of
  // 128, at T ≡ 2 (mod 128) for cuDNN's padded backward and at 704 ≡ 64 (mod 128).
  cases.push_back(device_only(attention_case("attention_value_dim_d24", {2, 3, 3, 24, 16}, AttentionKind::kCausal),
                              {2, 31, 33, 129}));
  cases.push_back(
      device_only(attention_case("attention_value_dim_deepseek_heads", {1, 16, 16, 192, 128}, AttentionKind::kCausal),
                  {17, 130, 704}));
  cases.push_back(device_only(
      attention_case("attention_segments_1b_heads", {2, 32, 8, 128}, AttentionKind::kSegments), {130, 1000}));
  cases.push_back(swiglu_case(false));
  cases.push_back(swiglu_case(true));
  cases.push_back(add_case());
  cases.push_back(scale_case());
  auto rows_and_vocab = [](int64_t n) { return Shape{n, 3 * n + 2}; };
  cases.push_back(cross_entropy_case("cross_entropy", CrossEntropyKind::kSeparate, rows_and_vocab));
  cases.push_back(cross_entropy_case("cross_entropy_in_place", CrossEntropyKind::kInPlace, rows_and_vocab));
  cases.push_back(cross_entropy_case("cross_entropy_fused", CrossEntropyKind::kFused, rows_and_vocab));
  // GPT-2's vocabulary and its neighbours: widths past one thread block, not multiples of 16 bytes.
  OpCase wide = cross_entropy_case("cross_entropy_wide", CrossEntropyKind::kSeparate,
                                   [](int64_t n) { return Shape{3, 50224 + n}; });
  wide.finite_differences = false;
  cases.push_back(wide);
  for (const int ranks : {3, 4}) {
    cases.push_back(cross_entropy_case(fmt::format("cross_entropy_vocab_parallel_x{}", ranks),
                                       CrossEntropyKind::kVocabParallel, [](int64_t n) { return Shape{n, 2 * n + 7}; },
                                       ranks));
  }
  cases.push_back(row_max_case());
  cases.push_back(shard_stats_case());
  cases.push_back(finish_case());
  cases.push_back(sharded_backward_case());
  for (OpCase& moe : moe_op_cases()) cases.push_back(std::move(moe));
  for (OpCase& fp8 : fp8_op_cases()) cases.push_back(std::move(fp8));
  return cases;
}

}  // namespace

const std::vector<OpCase>& all_op_cases() {
  static const std::vector<OpCase> cases = build_cases();
  return cases;
}

}  // namespace primus::testing
