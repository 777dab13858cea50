// The mixture-of-experts ops' cases (ops/moe_ops.h) for the harness: the router, the sort into expert order,
// permutation and un-permutation, the aux and z losses, expert capacity (moe_capacity.cu: the same kept entries,
// exactly). Shapes are named after the models they stand for: E = 8,
// k = 2 (Mixtral), E = 128, k = 8 (Qwen3-30B-A3B), sigmoid scores over groups with an expert bias (DeepSeek-V3:
// E = 256, k = 8, 8 groups of which 4); the realistic ones at device sizes only.
//
// Device tolerances: the kernels (src/backend/cuda/kernels/moe.cu) follow the CPU's formulas and orders of
// summation, so the chosen experts and slots must be equal (the harness compares i32 outputs exactly), a permuted
// row is a copy and a token's rows are summed in the CPU's order without fused multiply-adds: 0 (the same bits) for
// permutation in f32. Scores, weights, router gradients and losses are formed in double on both sides and differ
// only in the order of a few double sums: 1e-6. bf16 rows: an f32 result rounded once (5e-3); f32 outputs of a
// bf16 run (dweights) from the same rounded inputs: 1e-6.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "ops/moe_ops.h"
#include "support/op_cases.h"
#include "support/test_support.h"

namespace primus::testing {
namespace {

// ---- router -----------------------------------------------------------------------------------------------------

struct RouterSpec {
  std::string name;
  int64_t experts, topk;
  bool sigmoid = false, normalize = true;
  float scaling = 1.0f;
  int64_t groups = 1, group_topk = 1;
  bool bias = false;
};

MoeRouting routing_of(const RouterSpec& r) {
  return MoeRouting{r.topk, r.sigmoid ? MoeScoreFunction::kSigmoid : MoeScoreFunction::kSoftmax, r.normalize,
                    r.scaling, r.groups, r.group_topk};
}

// One token's routing in double: scores, the selection keys (scores + bias), the chosen experts best first.
struct RoutedRow {
  std::vector<double> scores;
  std::vector<int> chosen;
  std::vector<double> group_scores;  // empty without groups
};

RoutedRow route_row(const RouterSpec& r, const float* z, const float* bias) {
  const int64_t e_count = r.experts;
  RoutedRow row;
  row.scores.resize(static_cast<size_t>(e_count));
  if (r.sigmoid) {
    for (int64_t e = 0; e < e_count; ++e) row.scores[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(z[e])));
  } else {
    const double max = *std::max_element(z, z + e_count);
    double sum = 0.0;
    for (int64_t e = 0; e < e_count; ++e) sum += std::exp(z[e] - max);
    for (int64_t e = 0; e < e_count; ++e) row.scores[e] = std::exp(z[e] - max) / sum;
  }
  std::vector<double> key(row.scores);
  if (bias != nullptr) {
    for (int64_t e = 0; e < e_count; ++e) key[e] += bias[e];
  }
  std::vector<bool> allowed(static_cast<size_t>(e_count), true);
  if (r.groups > 1) {
    const int64_t per_group = e_count / r.groups, best = r.topk / r.group_topk;
    for (int64_t g = 0; g < r.groups; ++g) {
      std::vector<double> members(key.begin() + g * per_group, key.begin() + (g + 1) * per_group);
      std::sort(members.begin(), members.end(), std::greater<double>());
      row.group_scores.push_back(std::accumulate(members.begin(), members.begin() + best, 0.0));
    }
    std::vector<int> order(static_cast<size_t>(r.groups));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row.group_scores[a] > row.group_scores[b]; });
    std::fill(allowed.begin(), allowed.end(), false);
    for (int64_t i = 0; i < r.group_topk; ++i) {
      std::fill(allowed.begin() + order[i] * per_group, allowed.begin() + (order[i] + 1) * per_group, true);
    }
  }
  std::vector<int> order;
  for (int64_t e = 0; e < e_count; ++e) {
    if (allowed[e]) order.push_back(static_cast<int>(e));
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
  row.chosen.assign(order.begin(), order.begin() + r.topk);
  return row;
}

// The smallest gap between two group scores: a finite-difference nudge must not reorder the groups.
double group_margin(const RoutedRow& row) {
  std::vector<double> g(row.group_scores);
  std::sort(g.begin(), g.end());
  double margin = 1e9;
  for (size_t i = 1; i < g.size(); ++i) margin = std::min(margin, g[i] - g[i - 1]);
  return margin;
}

// Logits (and a bias) whose selection keys are far apart compared with a finite-difference step (1e-2 on a logit
// moves a score by at most 2.5e-3), so no nudge changes which experts a token chooses or their order: each row's
// keys are a random ordering of evenly spaced values plus noise below a quarter of the spacing. Softmax scores keep
// the logits' order; for sigmoid scores with a bias the logits are solved from the wanted keys. With groups, rows
// are drawn again (up to 50 times) until their group scores lie 0.02 apart.
std::vector<Input> router_inputs(const RouterSpec& r, int64_t n, Rng& rng) {
  const int64_t e_count = r.experts;
  Tensor logits = Tensor::empty({n, e_count}, DType::kF32);
  Tensor bias = Tensor::empty({e_count}, DType::kF32);
  for (int64_t e = 0; e < e_count; ++e) bias.f32()[e] = r.bias ? static_cast<float>(0.1 * (rng.uniform() - 0.5)) : 0.0f;
  std::vector<int> order(static_cast<size_t>(e_count));
  for (int64_t t = 0; t < n; ++t) {
    float* z = logits.f32() + t * e_count;
    for (int attempt = 0; attempt < 50; ++attempt) {
      std::iota(order.begin(), order.end(), 0);
      for (int64_t i = e_count - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<uint64_t>(i + 1))]);
      for (int64_t e = 0; e < e_count; ++e) {
        const double place = order[e] + 0.5 * (rng.uniform() - 0.5);
        if (!r.sigmoid) {
          z[e] = static_cast<float>(0.1 * place - 1.0);
        } else {
          const double score = 0.1 + 0.8 * (place + 0.5) / e_count - (r.bias ? bias.f32()[e] : 0.0);
          z[e] = static_cast<float>(std::log(score / (1.0 - score)));
        }
      }
      if (r.groups == 1 || group_margin(route_row(r, z, r.bias ? bias.f32() : nullptr)) > 0.02) break;
    }
  }
  std::vector<Input> in{act("logits", logits)};
  if (r.bias) in.push_back(f32("bias", bias));
  return in;
}

OpCase router_case(const RouterSpec& r) {
  OpCase c;
  c.name = "moe_router_" + r.name;
  c.dtypes = {DType::kF32};  // the router is fp32 in every run
  c.make_inputs = [=](int64_t n, Rng& rng) { return router_inputs(r, n, rng); };
  // Outputs: the weights and scores make the loss (the scores' gradient is the aux loss's path); the chosen experts
  // are compared exactly.
  c.loss_outputs = 2;
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const int64_t n = in["logits"].dim(0);
    Tensor scores = env.out_f32({n, r.experts}), weights = env.out_f32({n, r.topk});
    Tensor experts = Tensor::empty({n, r.topk}, DType::kI32, env.device());
    const Tensor bias = r.bias ? in["bias"] : Tensor();
    ops::moe_router_forward(in["logits"], bias, routing_of(r), scores, experts, weights);
    return Tensors{{"weights", weights}, {"scores", scores}, {"experts", experts}};
  };
  c.backward = [=](const Tensors& in, const Tensors& out, const Tensors& dy, OpEnv& env) {
    Tensor dlogits = env.out_f32(in["logits"].shape());
    ops::moe_router_backward(out["scores"], out["experts"], routing_of(r), dy["weights"], dy["scores"], dlogits);
    return Tensors{{"dlogits", dlogits}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    const Tensor& logits = in["logits"];
    const int64_t n = logits.dim(0), e_count = r.experts, k = r.topk;
    std::vector<double> scores(n * e_count), weights(n * k), experts(n * k), dlogits(n * e_count);
    for (int64_t t = 0; t < n; ++t) {
      const RoutedRow row = route_row(r, logits.f32() + t * e_count, r.bias ? in["bias"].f32() : nullptr);
      const std::vector<double>& s = row.scores;
      double sum = 0.0;
      for (const int e : row.chosen) sum += s[e];
      const double divisor = r.normalize ? sum + (r.sigmoid ? 1e-20 : 0.0) : 1.0;
      // w_j = c · s_j / D, D = Σ selected (normalised) or 1; ds = the scores' upstream plus the weights' path.
      std::vector<double> ds(e_count);
      for (int64_t e = 0; e < e_count; ++e) {
        scores[t * e_count + e] = s[e];
        ds[e] = at(dy["scores"], t * e_count + e);
      }
      double dot = 0.0;  // Σ_j dw_j · w_j / c
      for (int64_t j = 0; j < k; ++j) dot += at(dy["weights"], t * k + j) * s[row.chosen[j]] / divisor;
      for (int64_t j = 0; j < k; ++j) {
        const int e = row.chosen[j];
        experts[t * k + j] = e;
        weights[t * k + j] = r.scaling * s[e] / divisor;
        const double dw = at(dy["weights"], t * k + j);
        ds[e] += r.normalize ? r.scaling * (dw - dot) / divisor : r.scaling * dw;
      }
      double softmax_dot = 0.0;
      for (int64_t e = 0; e < e_count; ++e) softmax_dot += ds[e] * s[e];
      for (int64_t e = 0; e < e_count; ++e) {
        dlogits[t * e_count + e] = r.sigmoid ? ds[e] * s[e] * (1.0 - s[e]) : s[e] * (ds[e] - softmax_dot);
      }
    }
    return Tensors{{"weights", from_doubles({n, k}, weights)},
                   {"scores", from_doubles({n, e_count}, scores)},
                   {"experts", from_doubles({n, k}, experts)},
                   {"dlogits", from_doubles({n, e_count}, dlogits)}};
  };
  c.device_tol = {1e-6, 1e-6, 1e-6};
  return c;
}

// ---- routing inputs of the sort and the permutations ------------------------------------------------------------

// Each of n tokens' k distinct experts, drawn from the first E − 1 so that expert E − 1 receives no token (an empty
// group) when E > k.
Tensor random_routing(int64_t n, int64_t experts, int64_t k, Rng& rng) {
  const int64_t pool = experts > k ? experts - 1 : experts;
  Tensor t = Tensor::empty({n, k}, DType::kI32);
  std::vector<int32_t> all(static_cast<size_t>(pool));
  for (int64_t row = 0; row < n; ++row) {
    std::iota(all.begin(), all.end(), 0);
    for (int64_t j = 0; j < k; ++j) {
      std::swap(all[j], all[j + rng.below(static_cast<uint64_t>(pool - j))]);
      t.i32()[row * k + j] = all[j];
    }
  }
  return t;
}

// The slots [N·k] and offsets [E + 1] of a routing, written out: entries in expert order, ascending within one.
std::pair<std::vector<int32_t>, std::vector<int32_t>> reference_sort(const Tensor& topk_experts, int64_t experts) {
  std::vector<int32_t> slots, offsets{0};
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t i = 0; i < topk_experts.numel(); ++i) {
      if (topk_experts.i32()[i] == e) slots.push_back(static_cast<int32_t>(i));
    }
    offsets.push_back(static_cast<int32_t>(slots.size()));
  }
  return {slots, offsets};
}

Tensor i32_tensor(const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::kI32);
  std::copy(values.begin(), values.end(), t.i32());
  return t;
}

Tensor as_f32(const std::vector<int32_t>& values) {
  return from_doubles({static_cast<int64_t>(values.size())}, std::vector<double>(values.begin(), values.end()));
}

OpCase sort_case(int64_t experts, int64_t k) {
  OpCase c;
  c.name = fmt::format("moe_sort_e{}k{}", experts, k);
  c.dtypes = {DType::kF32};  // indices only
  c.make_inputs = [=](int64_t n, Rng& rng) {
    return std::vector<Input>{index("topk_experts", random_routing(n, experts, k, rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor slots = Tensor::empty({in["topk_experts"].numel()}, DType::kI32, env.device());
    Tensor offsets = Tensor::empty({experts + 1}, DType::kI32, env.device());
    ops::moe_sort(in["topk_experts"], slots, offsets);
    return Tensors{{"slots", slots}, {"offsets", offsets}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float) {
    const auto [slots, offsets] = reference_sort(in["topk_experts"], experts);
    return Tensors{{"slots", as_f32(slots)}, {"offsets", as_f32(offsets)}};
  };
  c.device_sizes = {4096, 16384};
  return c;
}

// ---- permutation and un-permutation ------------------------------------------------------------------------------

struct RowsSpec {
  int64_t experts, topk, channels;
};

std::string rows_name(const char* op, const RowsSpec& s) {
  return fmt::format("{}_e{}k{}_c{}", op, s.experts, s.topk, s.channels);
}

// The slots of a random routing of n tokens.
Tensor random_slots(int64_t n, const RowsSpec& s, Rng& rng) {
  return i32_tensor(reference_sort(random_routing(n, s.experts, s.topk, rng), s.experts).first);
}

// row_of[entry] = the row holding it.
std::vector<int64_t> rows_of_entries(const Tensor& slots) {
  std::vector<int64_t> row_of(static_cast<size_t>(slots.numel()));
  for (int64_t r = 0; r < slots.numel(); ++r) row_of[slots.i32()[r]] = r;
  return row_of;
}

OpCase permute_case(const RowsSpec& s) {
  OpCase c;
  c.name = rows_name("moe_permute", s);
  c.make_inputs = [=](int64_t n, Rng& rng) {
    return std::vector<Input>{act("x", random_tensor({n, s.channels}, rng)), index("slots", random_slots(n, s, rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor out = env.out({in["slots"].numel(), s.channels});
    ops::moe_permute(in["x"], in["slots"], s.topk, out);
    return Tensors{{"out", out}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor dx = env.out(in["x"].shape());
    ops::moe_permute_backward(dy["out"], in["slots"], s.topk, dx);
    return Tensors{{"dx", dx}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    const Tensor &x = in["x"], &slots = in["slots"];
    const int64_t n = x.dim(0), m = slots.numel(), ch = s.channels;
    std::vector<double> out(m * ch), dx(n * ch, 0.0);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t t = slots.i32()[r] / s.topk;
      for (int64_t col = 0; col < ch; ++col) {
        out[r * ch + col] = at(x, t * ch + col);
        dx[t * ch + col] += at(dy["out"], r * ch + col);
      }
    }
    return Tensors{{"out", from_doubles({m, ch}, out)}, {"dx", from_doubles({n, ch}, dx)}};
  };
  c.device_tol = {0.0, 5e-3, 0.0};
  return c;
}

// weights_differentiated: the weights are an act input (f32 runs only), so finite differences check dweights too.
OpCase unpermute_case(const RowsSpec& s, bool weights_differentiated = false) {
  OpCase c;
  c.name = rows_name(weights_differentiated ? "moe_unpermute_dweights" : "moe_unpermute", s);
  if (weights_differentiated) c.dtypes = {DType::kF32};
  c.make_inputs = [=](int64_t n, Rng& rng) {
    Tensor weights = Tensor::empty({n, s.topk}, DType::kF32);
    for (int64_t i = 0; i < weights.numel(); ++i) weights.f32()[i] = static_cast<float>(0.1 + rng.uniform());
    return std::vector<Input>{act("y", random_tensor({n * s.topk, s.channels}, rng)),
                              index("slots", random_slots(n, s, rng)),
                              weights_differentiated ? act("weights", weights) : f32("weights", weights)};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor out = env.out({in["weights"].dim(0), s.channels});
    ops::moe_unpermute(in["y"], in["slots"], in["weights"], out);
    return Tensors{{"out", out}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor dy_rows = env.out(in["y"].shape()), dweights = env.out_f32(in["weights"].shape());
    ops::moe_unpermute_backward(in["y"], in["slots"], in["weights"], dy["out"], dy_rows, dweights);
    return Tensors{{"dy", dy_rows}, {"dweights", dweights}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    const Tensor &y = in["y"], &slots = in["slots"], &w = in["weights"];
    const int64_t n = w.dim(0), m = slots.numel(), ch = s.channels;
    std::vector<double> out(n * ch, 0.0), dy_rows(m * ch), dweights(n * s.topk, 0.0);
    const std::vector<int64_t> row_of = rows_of_entries(slots);
    for (int64_t entry = 0; entry < m; ++entry) {
      const int64_t t = entry / s.topk, r = row_of[entry];
      for (int64_t col = 0; col < ch; ++col) {
        out[t * ch + col] += at(w, entry) * at(y, r * ch + col);
        dy_rows[r * ch + col] = at(w, entry) * at(dy["out"], t * ch + col);
        dweights[entry] += at(y, r * ch + col) * at(dy["out"], t * ch + col);
      }
    }
    return Tensors{{"out", from_doubles({n, ch}, out)},
                   {"dy", from_doubles({m, ch}, dy_rows)},
                   {"dweights", from_doubles({n, s.topk}, dweights)}};
  };
  c.device_tol = {1e-6, 5e-3, 1e-6};
  return c;
}

// ---- load-balancing losses ---------------------------------------------------------------------------------------

// Aux loss of scores [N, E]: softmax rows, or sigmoid values in (0, 1) normalised by the op; the per-expert counts of
// a random routing as offsets (constants of the loss).
OpCase aux_loss_case(int64_t experts, int64_t k, bool sigmoid) {
  const float coeff = 0.013f;
  OpCase c;
  c.name = fmt::format("moe_aux_loss_{}_e{}k{}", sigmoid ? "sigmoid" : "softmax", experts, k);
  c.dtypes = {DType::kF32};
  c.scalar_upstream = true;
  c.make_inputs = [=](int64_t n, Rng& rng) {
    Tensor scores = Tensor::empty({n, experts}, DType::kF32);
    for (int64_t t = 0; t < n; ++t) {
      double sum = 0.0;
      for (int64_t e = 0; e < experts; ++e) sum += scores.f32()[t * experts + e] = static_cast<float>(0.05 + rng.uniform());
      if (sigmoid) continue;
      for (int64_t e = 0; e < experts; ++e) scores.f32()[t * experts + e] /= static_cast<float>(sum);
    }
    const auto offsets = reference_sort(random_routing(n, experts, k, rng), experts).second;
    return std::vector<Input>{act("scores", scores), index("offsets", i32_tensor(offsets))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor loss = env.out_f32({1}), none;
    ops::moe_aux_loss(in["scores"], in["offsets"], k, coeff, sigmoid, 1.0f, loss, none);
    return Tensors{{"loss", loss}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors&, OpEnv& env) {
    Tensor loss = env.out_f32({1}), dscores = env.out_f32(in["scores"].shape());
    ops::moe_aux_loss(in["scores"], in["offsets"], k, coeff, sigmoid, env.upstream_scale(), loss, dscores);
    return Tensors{{"dscores", dscores}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float scale) {
    const Tensor &scores = in["scores"], &offsets = in["offsets"];
    const int64_t n = scores.dim(0);
    const double factor = static_cast<double>(coeff) * experts / (static_cast<double>(k) * n * n);
    double loss = 0.0;
    std::vector<double> dscores(n * experts);
    for (int64_t t = 0; t < n; ++t) {
      double sum = sigmoid ? 1e-20 : 1.0;
      for (int64_t e = 0; sigmoid && e < experts; ++e) sum += at(scores, t * experts + e);
      double dot = 0.0;
      for (int64_t e = 0; e < experts; ++e) {
        dot += (offsets.i32()[e + 1] - offsets.i32()[e]) * at(scores, t * experts + e) / sum;
      }
      loss += factor * dot;
      for (int64_t e = 0; e < experts; ++e) {
        const double count = offsets.i32()[e + 1] - offsets.i32()[e];
        dscores[t * experts + e] = scale * factor * (sigmoid ? (count - dot) / sum : count);
      }
    }
    return Tensors{{"loss", from_doubles({1}, {loss})}, {"dscores", from_doubles({n, experts}, dscores)}};
  };
  // The loss is one f32 sum over N rows, so a nudge of one score moves it by ~1/N of a row's term: a wider step keeps
  // that change far above the loss's rounding (the loss is linear in softmax scores, nearly so in sigmoid ones).
  c.fd_eps = 5e-2;
  c.device_tol = {1e-6, 1e-6, 1e-6};
  return c;
}

// The sequence-level aux loss of `sequences` sequences of `size` tokens each: scores as the aux loss's, the router's
// choices a random routing. The reference is Megatron's form written out per sequence: Σ_e count[b, e] / (S k / E) ×
// mean_t p[t, e], averaged over the sequences, times coeff.
OpCase seq_aux_loss_case(int64_t experts, int64_t k, int64_t sequences, bool sigmoid) {
  const float coeff = 0.013f;
  OpCase c;
  c.name = fmt::format("moe_seq_aux_loss_{}_e{}k{}_b{}", sigmoid ? "sigmoid" : "softmax", experts, k, sequences);
  c.dtypes = {DType::kF32};
  c.scalar_upstream = true;
  c.make_inputs = [=](int64_t size, Rng& rng) {
    const int64_t n = size * sequences;
    Tensor scores = Tensor::empty({n, experts}, DType::kF32);
    for (int64_t t = 0; t < n; ++t) {
      double sum = 0.0;
      for (int64_t e = 0; e < experts; ++e) sum += scores.f32()[t * experts + e] = static_cast<float>(0.05 + rng.uniform());
      if (sigmoid) continue;
      for (int64_t e = 0; e < experts; ++e) scores.f32()[t * experts + e] /= static_cast<float>(sum);
    }
    return std::vector<Input>{act("scores", scores), index("topk_experts", random_routing(n, experts, k, rng))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor loss = env.out_f32({1}), none;
    ops::moe_seq_aux_loss(in["scores"], in["topk_experts"], sequences, coeff, sigmoid, 1.0f, loss, none);
    return Tensors{{"loss", loss}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors&, OpEnv& env) {
    Tensor loss = env.out_f32({1}), dscores = env.out_f32(in["scores"].shape());
    ops::moe_seq_aux_loss(in["scores"], in["topk_experts"], sequences, coeff, sigmoid, env.upstream_scale(), loss,
                          dscores);
    return Tensors{{"dscores", dscores}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float scale) {
    const Tensor &scores = in["scores"], &chosen = in["topk_experts"];
    const int64_t n = scores.dim(0), s = n / sequences;
    double loss = 0.0;
    std::vector<double> dscores(n * experts);
    for (int64_t b = 0; b < sequences; ++b) {
      std::vector<double> cost(experts, 0.0), mean_p(experts, 0.0);
      std::vector<std::vector<double>> p(s, std::vector<double>(experts));
      for (int64_t t = 0; t < s; ++t) {
        for (int64_t j = 0; j < k; ++j) cost[chosen.i32()[(b * s + t) * k + j]] += experts / static_cast<double>(s * k);
        double sum = sigmoid ? 1e-20 : 1.0;
        for (int64_t e = 0; sigmoid && e < experts; ++e) sum += at(scores, (b * s + t) * experts + e);
        for (int64_t e = 0; e < experts; ++e) p[t][e] = at(scores, (b * s + t) * experts + e) / sum;
        for (int64_t e = 0; e < experts; ++e) mean_p[e] += p[t][e] / s;
      }
      for (int64_t e = 0; e < experts; ++e) loss += coeff * cost[e] * mean_p[e] / sequences;
      // d/ds of coeff / B · Σ_e cost_e · p_e / S, p = s / Σ s for sigmoid scores.
      for (int64_t t = 0; t < s; ++t) {
        const int64_t row = (b * s + t) * experts;
        double sum = sigmoid ? 1e-20 : 1.0, dot = 0.0;
        for (int64_t e = 0; sigmoid && e < experts; ++e) sum += at(scores, row + e);
        for (int64_t e = 0; e < experts; ++e) dot += cost[e] * p[t][e];
        for (int64_t e = 0; e < experts; ++e) {
          const double d = sigmoid ? (cost[e] - dot) / sum : cost[e];
          dscores[row + e] = scale * coeff * d / (static_cast<double>(s) * sequences);
        }
      }
    }
    return Tensors{{"loss", from_doubles({1}, {loss})}, {"dscores", from_doubles({n, experts}, dscores)}};
  };
  c.fd_eps = 5e-2;  // as the aux loss's
  c.device_tol = {1e-6, 1e-6, 1e-6};  // as the aux loss's; the per-sequence parts summed in double in order
  return c;
}

// ---- expert capacity ----------------------------------------------------------------------------------------------

// moe_capacity over a random routing of n tokens with weights on a coarse grid (ninths of 0 to 1, zeros of either
// sign), so that many entries of one expert tie and the tie rule (the earlier entry) decides. The routing leaves the
// last expert empty; `skewed` sends 7 of 8 tokens' first choice to expert 0, so that expert holds most entries (early
// training) and drops most of them. The reference ranks each expert's entries by (weight descending, entry
// ascending), or by entry alone, and keeps the first `capacity`. The device must give the same i32 outputs.
OpCase capacity_case(int64_t experts, int64_t k, double factor, bool by_position, bool skewed) {
  OpCase c;
  c.name = fmt::format("moe_capacity_{}{}_e{}k{}_f{}", by_position ? "position" : "probs", skewed ? "_skewed" : "",
                       experts, k, static_cast<int>(factor * 100));
  c.dtypes = {DType::kF32};  // indices and f32 weights only
  c.make_inputs = [=](int64_t n, Rng& rng) {
    Tensor weights = Tensor::empty({n, k}, DType::kF32);
    for (int64_t i = 0; i < n * k; ++i) {
      const float w = static_cast<float>(rng.below(9)) / 8.0f;
      weights.f32()[i] = w == 0.0f && rng.below(2) == 0 ? -0.0f : w;
    }
    Tensor chosen = random_routing(n, experts, k, rng);
    for (int64_t t = 0; skewed && t < n; ++t) {
      if (rng.below(8) == 0) continue;
      int32_t* row = chosen.i32() + t * k;
      int32_t* zero = std::find(row, row + k, 0);
      if (zero == row + k) {
        row[0] = 0;
      } else {
        std::swap(*zero, row[0]);
      }
    }
    return std::vector<Input>{index("topk_experts", chosen), f32("topk_weights", weights)};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const int64_t n = in["topk_experts"].dim(0);
    Tensor kept = Tensor::empty({n, k}, DType::kI32, env.device());
    ops::moe_capacity(in["topk_experts"], in["topk_weights"], experts, ops::moe_expert_capacity(n, k, experts, factor),
                      by_position, kept);
    return Tensors{{"kept_experts", kept}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float) {
    const Tensor &chosen = in["topk_experts"], &w = in["topk_weights"];
    const int64_t n = chosen.dim(0), entries = n * k;
    const auto capacity = static_cast<int64_t>(std::ceil(static_cast<double>(n * k) / experts * factor));
    std::vector<std::vector<int64_t>> of_expert(static_cast<size_t>(experts));
    for (int64_t i = 0; i < entries; ++i) of_expert[static_cast<size_t>(chosen.i32()[i])].push_back(i);
    std::vector<double> kept(static_cast<size_t>(entries), static_cast<double>(experts));
    for (std::vector<int64_t>& list : of_expert) {
      // A total order written out (no reliance on a stable sort): by position, or larger weight then earlier.
      std::sort(list.begin(), list.end(), [&](int64_t a, int64_t b) {
        const double wa = by_position ? 0.0 : w.f32()[a], wb = by_position ? 0.0 : w.f32()[b];
        return wa != wb ? wa > wb : a < b;
      });
      for (size_t r = 0; r < list.size() && static_cast<int64_t>(r) < capacity; ++r) {
        kept[static_cast<size_t>(list[r])] = chosen.i32()[list[r]];
      }
    }
    return Tensors{{"kept_experts", from_doubles({n, k}, kept)}};
  };
  return c;
}

// moe_pad_rows (and, as its gradient, moe_unpad_rows): n rows over `experts` local experts, each given a random count
// of at most the padded capacity P = n / experts + 2 (some experts empty, some exactly full), padded to P rows each.
OpCase pad_case(int64_t experts, int64_t channels) {
  OpCase c;
  c.name = fmt::format("moe_pad_rows_e{}_c{}", experts, channels);
  const auto per_expert = [=](int64_t n) { return n / experts + 2; };
  c.make_inputs = [=](int64_t n, Rng& rng) {
    // Counts: random in [0, P], then trimmed or topped up (to full experts first) until they sum to n.
    const int64_t p = per_expert(n);
    std::vector<int64_t> counts(static_cast<size_t>(experts));
    int64_t total = 0;
    for (int64_t& count : counts) total += count = static_cast<int64_t>(rng.below(static_cast<uint64_t>(p + 1)));
    for (int64_t l = 0; total != n; l = (l + 1) % experts) {
      if (total > n && counts[l] > 0) --counts[l], --total;
      if (total < n && counts[l] < p) ++counts[l], ++total;
    }
    std::vector<int32_t> offsets(1, 0);
    for (const int64_t count : counts) offsets.push_back(static_cast<int32_t>(offsets.back() + count));
    return std::vector<Input>{act("rows", random_tensor({n, channels}, rng)), index("offsets", i32_tensor(offsets))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    const int64_t p = per_expert(in["rows"].dim(0));
    Tensor padded = env.out({experts * p, channels});
    ops::moe_pad_rows(in["rows"], in["offsets"], p, padded);
    return Tensors{{"padded", padded}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors& dy, OpEnv& env) {
    Tensor drows = env.out(in["rows"].shape());
    ops::moe_unpad_rows(dy["padded"], in["offsets"], per_expert(in["rows"].dim(0)), drows);
    return Tensors{{"drows", drows}};
  };
  c.reference = [=](const Tensors& in, const Tensors& dy, float) {
    const Tensor &rows = in["rows"], &offsets = in["offsets"];
    const int64_t n = rows.dim(0), p = per_expert(n);
    std::vector<double> padded(experts * p * channels, 0.0), drows(n * channels);
    for (int64_t l = 0; l < experts; ++l) {
      for (int64_t i = offsets.i32()[l]; i < offsets.i32()[l + 1]; ++i) {
        const int64_t r = l * p + (i - offsets.i32()[l]);
        for (int64_t col = 0; col < channels; ++col) {
          padded[r * channels + col] = at(rows, i * channels + col);
          drows[i * channels + col] = at(dy["padded"], r * channels + col);
        }
      }
    }
    return Tensors{{"padded", from_doubles({experts * p, channels}, padded)},
                   {"drows", from_doubles({n, channels}, drows)}};
  };
  c.device_tol = {0.0, 5e-3, 0.0};  // copies: f32 exact; bf16 rows are the f32 rows rounded once
  return c;
}

OpCase z_loss_case(int64_t experts) {
  // Far above Megatron's 1e-3 (the op is linear in it): the gradient, ~coeff/N an element, must stand well above the
  // rounding of the random accumulator it is added to (values ~1), or the reference check measures that rounding.
  const float coeff = 10.0f;
  OpCase c;
  c.name = fmt::format("moe_z_loss_e{}", experts);
  c.dtypes = {DType::kF32};
  c.scalar_upstream = true;
  c.make_inputs = [=](int64_t n, Rng& rng) {
    return std::vector<Input>{act("logits", random_tensor({n, experts}, rng, 2.0f))};
  };
  c.forward = [=](const Tensors& in, OpEnv& env) {
    Tensor loss = env.out_f32({1}), none;
    ops::moe_z_loss(in["logits"], coeff, 1.0f, loss, none);
    return Tensors{{"loss", loss}};
  };
  c.backward = [=](const Tensors& in, const Tensors&, const Tensors&, OpEnv& env) {
    Tensor loss = env.out_f32({1}), dlogits = env.accumulator(in["logits"].shape());
    ops::moe_z_loss(in["logits"], coeff, env.upstream_scale(), loss, dlogits);
    return Tensors{{"dlogits", dlogits}};
  };
  c.reference = [=](const Tensors& in, const Tensors&, float scale) {
    const Tensor& z = in["logits"];
    const int64_t n = z.dim(0);
    const double factor = static_cast<double>(coeff) / n;
    double loss = 0.0;
    std::vector<double> dlogits(n * experts);
    for (int64_t t = 0; t < n; ++t) {
      double sum = 0.0;
      for (int64_t e = 0; e < experts; ++e) sum += std::exp(at(z, t * experts + e));
      const double lse = std::log(sum);
      loss += factor * lse * lse;
      for (int64_t e = 0; e < experts; ++e) {
        dlogits[t * experts + e] = scale * factor * 2.0 * lse * std::exp(at(z, t * experts + e)) / sum;
      }
    }
    return Tensors{{"loss", from_doubles({1}, {loss})}, {"dlogits", from_doubles({n, experts}, dlogits)}};
  };
  c.fd_eps = 5e-2;  // as the aux loss's: one f32 sum over N rows
  c.device_tol = {1e-6, 1e-6, 1e-6};
  return c;
}

// A case swept on devices only, at `sizes`.
OpCase device_only(OpCase c, std::vector<int64_t> sizes) {
  c.sizes = {};
  c.device_sizes = std::move(sizes);
  return c;
}

}  // namespace

std::vector<OpCase> moe_op_cases() {
  std::vector<OpCase> cases;
  // Mixtral; Qwen3-MoE without norm_topk_prob; DeepSeek-V3's sigmoid grouped routing with a bias, scaled.
  const RouterSpec mixtral{.name = "softmax_e8k2", .experts = 8, .topk = 2};
  const RouterSpec unnormalized{.name = "softmax_unnormalized_e8k3", .experts = 8, .topk = 3, .normalize = false};
  const RouterSpec grouped{.name = "sigmoid_grouped_e16k4", .experts = 16, .topk = 4, .sigmoid = true,
                           .scaling = 2.5f, .groups = 4, .group_topk = 2, .bias = true};
  const RouterSpec qwen3{.name = "softmax_e128k8", .experts = 128, .topk = 8};
  const RouterSpec deepseek_v3{.name = "sigmoid_grouped_e256k8", .experts = 256, .topk = 8, .sigmoid = true,
                               .scaling = 2.5f, .groups = 8, .group_topk = 4, .bias = true};
  OpCase mixtral_case = router_case(mixtral);
  mixtral_case.device_sizes = {4096};
  cases.push_back(mixtral_case);
  cases.push_back(router_case(unnormalized));
  cases.push_back(router_case(grouped));
  OpCase qwen3_case = router_case(qwen3);
  qwen3_case.sizes = {1, 31, 33};
  qwen3_case.device_sizes = {4096, 16384};
  cases.push_back(qwen3_case);
  cases.push_back(device_only(router_case(deepseek_v3), {4096}));

  cases.push_back(sort_case(8, 2));
  cases.push_back(sort_case(128, 8));

  // Widths: 40 takes the kernels' 16-byte accesses, 37 and 33 the element-wise path; then the hidden sizes of
  // Qwen3-30B-A3B (2048, 128 experts, top 8) and Mixtral 8x7B (4096, 8 experts, top 2) on devices.
  for (const RowsSpec& s : {RowsSpec{8, 2, 40}, RowsSpec{8, 2, 37}, RowsSpec{16, 4, 33}}) {
    cases.push_back(permute_case(s));
    cases.push_back(unpermute_case(s));
  }
  cases.push_back(unpermute_case(RowsSpec{8, 2, 37}, true));
  cases.push_back(device_only(permute_case(RowsSpec{128, 8, 2048}), {1024}));
  cases.push_back(device_only(unpermute_case(RowsSpec{128, 8, 2048}), {1024}));
  cases.push_back(device_only(permute_case(RowsSpec{8, 2, 4096}), {2048}));
  cases.push_back(device_only(unpermute_case(RowsSpec{8, 2, 4096}), {2048}));

  OpCase aux = aux_loss_case(8, 2, false);
  aux.device_sizes = {4096};
  cases.push_back(aux);
  cases.push_back(aux_loss_case(16, 4, true));
  cases.push_back(device_only(aux_loss_case(128, 8, false), {4096, 16384}));
  OpCase z = z_loss_case(8);
  z.device_sizes = {4096};
  cases.push_back(z);
  cases.push_back(device_only(z_loss_case(128), {16384}));

  // Expert capacity: both policies, balanced and skewed, below and above the mean load; then Mixtral's and
  // Qwen3-30B-A3B's entry counts on devices (8,192 tokens top-2 of 8; 16,384 tokens top-8 of 128).
  for (const bool by_position : {false, true}) {
    for (const bool skewed : {false, true}) cases.push_back(capacity_case(8, 2, 0.5, by_position, skewed));
  }
  cases.push_back(capacity_case(16, 4, 1.25, false, false));
  cases.push_back(capacity_case(16, 4, 1.25, true, true));
  for (const bool by_position : {false, true}) {
    cases.push_back(device_only(capacity_case(8, 2, 1.0, by_position, true), {8192}));
    cases.push_back(device_only(capacity_case(128, 8, 1.0, by_position, false), {4096, 16384}));
    cases.push_back(device_only(capacity_case(128, 8, 1.5, by_position, true), {16384}));
  }
  // Padding to capacity: a few experts at awkward widths; Qwen3-30B-A3B's 128 experts at width 2048 on devices.
  cases.push_back(pad_case(4, 37));
  cases.push_back(pad_case(8, 40));
  cases.push_back(device_only(pad_case(128, 2048), {4096}));
  // The sequence-level aux loss: moe_sort and moe_aux_loss per sequence; Qwen3-30B-A3B's micro-batch of 4 × 4096 on
  // devices.
  cases.push_back(seq_aux_loss_case(8, 2, 3, false));
  cases.push_back(seq_aux_loss_case(16, 4, 2, true));
  cases.push_back(device_only(seq_aux_loss_case(128, 8, 4, false), {4096}));
  return cases;
}

}  // namespace primus::testing
