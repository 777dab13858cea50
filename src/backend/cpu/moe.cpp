// Mixture of experts on the CPU: the router (scores, top-k selection, weights and their gradient), the sort of
// routing entries into expert order, token permutation and un-permutation, the per-expert GEMMs and the
// load-balancing losses. backend.h (MoeRouting ... MoeAuxLossArgs) states the math.
//
// Numerics: softmax denominators, normalisation sums and loss sums in double; gathers and scatter-adds in the fixed
// order of the routing entries, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace primus {

namespace {

// The experts token `row` may choose from: all, or those of the group_topk best groups.
std::vector<bool> allowed_experts(const MoeRouting& r, const float* biased, int64_t experts) {
  std::vector<bool> allowed(static_cast<size_t>(experts), true);
  if (r.num_groups <= 1) return allowed;
  const int64_t per_group = experts / r.num_groups, best_of_group = r.topk / r.group_topk;
  std::vector<double> group_score(static_cast<size_t>(r.num_groups));
  std::vector<float> sorted(static_cast<size_t>(per_group));
  for (int64_t g = 0; g < r.num_groups; ++g) {
    std::copy(biased + g * per_group, biased + (g + 1) * per_group, sorted.begin());
    std::partial_sort(sorted.begin(), sorted.begin() + best_of_group, sorted.end(), std::greater<float>());
    group_score[static_cast<size_t>(g)] = std::accumulate(sorted.begin(), sorted.begin() + best_of_group, 0.0);
  }
  std::vector<int64_t> groups(static_cast<size_t>(r.num_groups));
  std::iota(groups.begin(), groups.end(), 0);
  std::stable_sort(groups.begin(), groups.end(), [&](int64_t a, int64_t b) {
    return group_score[static_cast<size_t>(a)] > group_score[static_cast<size_t>(b)];
  });
  std::fill(allowed.begin(), allowed.end(), false);
  for (int64_t i = 0; i < r.group_topk; ++i) {
    const int64_t g = groups[static_cast<size_t>(i)];
    std::fill(allowed.begin() + g * per_group, allowed.begin() + (g + 1) * per_group, true);
  }
  return allowed;
}

// Σ of the selected scores (the normalisation divisor), with sigmoid's guard against an all-zero row.
double selected_sum(const MoeRouting& r, const float* scores, const int32_t* chosen) {
  double sum = 0.0;
  for (int64_t j = 0; j < r.topk; ++j) sum += scores[chosen[j]];
  return r.score_function == MoeScoreFunction::kSigmoid ? sum + 1e-20 : sum;
}

}  // namespace

void CpuBackend::moe_router_forward(const MoeRouterArgs& args) {
  const MoeRouting& r = args.routing;
  const int64_t n = args.logits->dim(0), experts = args.logits->dim(1), k = r.topk;
  const float* logits = args.logits->f32();
  const float* bias = args.expert_bias != nullptr ? args.expert_bias->f32() : nullptr;
  float* scores = args.scores->f32();
  int32_t* chosen_all = args.topk_experts->i32();
  float* weights = args.topk_weights->f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* z = logits + t * experts;
    float* s = scores + t * experts;
    if (r.score_function == MoeScoreFunction::kSoftmax) {
      const float max = *std::max_element(z, z + experts);
      double sum = 0.0;
      for (int64_t e = 0; e < experts; ++e) sum += std::exp(static_cast<double>(z[e]) - max);
      for (int64_t e = 0; e < experts; ++e) s[e] = static_cast<float>(std::exp(static_cast<double>(z[e]) - max) / sum);
    } else {
      for (int64_t e = 0; e < experts; ++e) s[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(z[e]))));
    }
    std::vector<float> biased(s, s + experts);
    if (bias != nullptr) {
      for (int64_t e = 0; e < experts; ++e) biased[static_cast<size_t>(e)] += bias[e];
    }
    const std::vector<bool> allowed = allowed_experts(r, biased.data(), experts);
    std::vector<int32_t> order;
    for (int64_t e = 0; e < experts; ++e) {
      if (allowed[static_cast<size_t>(e)]) order.push_back(static_cast<int32_t>(e));
    }
    // Largest first; ties to the lower index (stable over ascending indices).
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return biased[static_cast<size_t>(a)] > biased[static_cast<size_t>(b)]; });
    int32_t* chosen = chosen_all + t * k;
    std::copy(order.begin(), order.begin() + k, chosen);
    const double divisor = r.normalize ? selected_sum(r, s, chosen) : 1.0;
    for (int64_t j = 0; j < k; ++j) {
      weights[t * k + j] = static_cast<float>(s[chosen[j]] / divisor * r.scaling_factor);
    }
  }
}

void CpuBackend::moe_router_backward(const MoeRouterArgs& args) {
  const MoeRouting& r = args.routing;
  const int64_t n = args.scores->dim(0), experts = args.scores->dim(1), k = r.topk;
  const float* scores = args.scores->f32();
  const int32_t* chosen_all = args.topk_experts->i32();
  const float* dweights = args.dweights->f32();
  const float* extra = args.dscores != nullptr ? args.dscores->f32() : nullptr;
  float* dlogits = args.dlogits->f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* s = scores + t * experts;
    const int32_t* chosen = chosen_all + t * k;
    const float* dw = dweights + t * k;
    // ds: the gradient of the scores. w_j = c · s_j / S (S = Σ selected, or 1): ds_j = c (dw_j − Σ_i dw_i w_i / c) / S.
    std::vector<double> ds(static_cast<size_t>(experts), 0.0);
    if (extra != nullptr) {
      for (int64_t e = 0; e < experts; ++e) ds[static_cast<size_t>(e)] = extra[t * experts + e];
    }
    if (r.normalize) {
      const double sum = selected_sum(r, s, chosen);
      double dot = 0.0;  // Σ_i dw_i · s_i / S
      for (int64_t j = 0; j < k; ++j) dot += static_cast<double>(dw[j]) * s[chosen[j]] / sum;
      for (int64_t j = 0; j < k; ++j) {
        ds[static_cast<size_t>(chosen[j])] += r.scaling_factor * (dw[j] - dot) / sum;
      }
    } else {
      for (int64_t j = 0; j < k; ++j) ds[static_cast<size_t>(chosen[j])] += static_cast<double>(r.scaling_factor) * dw[j];
    }
    float* dz = dlogits + t * experts;
    if (r.score_function == MoeScoreFunction::kSoftmax) {
      double dot = 0.0;
      for (int64_t e = 0; e < experts; ++e) dot += ds[static_cast<size_t>(e)] * s[e];
      for (int64_t e = 0; e < experts; ++e) dz[e] = static_cast<float>(s[e] * (ds[static_cast<size_t>(e)] - dot));
    } else {
      for (int64_t e = 0; e < experts; ++e) {
        dz[e] = static_cast<float>(ds[static_cast<size_t>(e)] * s[e] * (1.0 - s[e]));
      }
    }
  }
}

void CpuBackend::moe_sort(const MoeSortArgs& args) {
  const int64_t entries = args.topk_experts->numel(), experts = args.offsets->numel() - 1;
  const int32_t* chosen = args.topk_experts->i32();
  int32_t* offsets = args.offsets->i32();
  int32_t* slots = args.slots->i32();
  std::fill(offsets, offsets + experts + 1, 0);
  for (int64_t i = 0; i < entries; ++i) {
    PRIMUS_CHECK(chosen[i] >= 0 && chosen[i] < experts, "[op moe_sort] routing entry {} names expert {} of {}", i,
                 chosen[i], experts);
    ++offsets[chosen[i] + 1];
  }
  for (int64_t e = 0; e < experts; ++e) offsets[e + 1] += offsets[e];
  // A counting sort: entries in ascending order, so tokens stay ascending within each expert.
  std::vector<int32_t> next(offsets, offsets + experts);
  for (int64_t i = 0; i < entries; ++i) slots[next[static_cast<size_t>(chosen[i])]++] = static_cast<int32_t>(i);
}

void CpuBackend::moe_capacity(const MoeCapacityArgs& args) {
  const int64_t entries = args.topk_experts->numel(), experts = args.experts;
  const int32_t* chosen = args.topk_experts->i32();
  const float* weights = args.topk_weights->f32();
  int32_t* kept = args.kept_experts->i32();
  // Each expert's entries in entry order (tokens ascending: a token chooses an expert once).
  std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(experts));
  for (int64_t i = 0; i < entries; ++i) {
    PRIMUS_CHECK(chosen[i] >= 0 && chosen[i] < experts, "[op moe_capacity] routing entry {} names expert {} of {}", i,
                 chosen[i], experts);
    by_expert[static_cast<size_t>(chosen[i])].push_back(static_cast<int32_t>(i));
    kept[i] = static_cast<int32_t>(experts);  // dropped unless kept below
  }
  for (std::vector<int32_t>& list : by_expert) {
    if (!args.by_position) {  // largest weight first; a stable sort leaves ties in entry order
      std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) { return weights[a] > weights[b]; });
    }
    const size_t keep = std::min(list.size(), static_cast<size_t>(args.capacity));
    for (size_t j = 0; j < keep; ++j) kept[list[j]] = chosen[list[j]];
  }
}

namespace {

// Expert l's row count, checked against the padded capacity P and the M rows.
int64_t padded_expert_rows(const char* op, const int32_t* offsets, int64_t l, int64_t per_expert, int64_t rows) {
  const int64_t n = offsets[l + 1] - offsets[l];
  PRIMUS_CHECK(offsets[l] >= 0 && n >= 0 && offsets[l + 1] <= rows,
               "[op {}] offsets [{}, {}] of local expert {} are not ascending within the {} rows", op, offsets[l],
               offsets[l + 1], l, rows);
  PRIMUS_CHECK(n <= per_expert, "[op {}] local expert {} has {} rows, above its padded capacity {}", op, l, n,
               per_expert);
  return n;
}

}  // namespace

void CpuBackend::moe_pad_rows(const MoePadArgs& args) {
  const int64_t local = args.offsets->numel() - 1, c = args.in->dim(1), p = args.per_expert;
  const int32_t* offsets = args.offsets->i32();
  const float* rows = args.in->f32();
  float* padded = args.out->f32();
  for (int64_t l = 0; l < local; ++l) {
    const int64_t n = padded_expert_rows("moe_pad_rows", offsets, l, p, args.in->dim(0));
    std::copy(rows + offsets[l] * c, rows + (offsets[l] + n) * c, padded + l * p * c);
    std::fill(padded + (l * p + n) * c, padded + (l + 1) * p * c, 0.0f);
  }
}

void CpuBackend::moe_unpad_rows(const MoePadArgs& args) {
  const int64_t local = args.offsets->numel() - 1, c = args.in->dim(1), p = args.per_expert;
  const int32_t* offsets = args.offsets->i32();
  const float* padded = args.in->f32();
  float* rows = args.out->f32();
  for (int64_t l = 0; l < local; ++l) {
    const int64_t n = padded_expert_rows("moe_unpad_rows", offsets, l, p, args.out->dim(0));
    std::copy(padded + l * p * c, padded + (l * p + n) * c, rows + offsets[l] * c);
  }
}

void CpuBackend::moe_permute(const MoePermuteArgs& args) {
  const int64_t rows = args.slots->numel(), c = args.x->dim(1), k = args.topk;
  const int32_t* slots = args.slots->i32();
  const float* x = args.x->f32();
  float* out = args.out->f32();
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < rows; ++s) std::copy(x + (slots[s] / k) * c, x + (slots[s] / k + 1) * c, out + s * c);
}

void CpuBackend::moe_permute_backward(const MoePermuteArgs& args) {
  const int64_t rows = args.slots->numel(), c = args.dx->dim(1), k = args.topk;
  const int32_t* slots = args.slots->i32();
  const float* dout = args.dout->f32();
  float* dx = args.dx->f32();
  std::fill(dx, dx + args.dx->numel(), 0.0f);
  // Rows in order (one fixed summation order); columns split over threads.
#pragma omp parallel for schedule(static)
  for (int64_t col = 0; col < c; ++col) {
    for (int64_t s = 0; s < rows; ++s) dx[(slots[s] / k) * c + col] += dout[s * c + col];
  }
}

void CpuBackend::moe_unpermute(const MoePermuteArgs& args) {
  const int64_t rows = args.slots->numel(), c = args.out->dim(1), k = args.topk;
  const int32_t* slots = args.slots->i32();
  const float* y = args.y->f32();
  const float* weights = args.weights->f32();
  float* out = args.out->f32();
  std::fill(out, out + args.out->numel(), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t col = 0; col < c; ++col) {
    for (int64_t s = 0; s < rows; ++s) out[(slots[s] / k) * c + col] += weights[slots[s]] * y[s * c + col];
  }
}

void CpuBackend::moe_unpermute_backward(const MoePermuteArgs& args) {
  const int64_t rows = args.slots->numel(), c = args.y->dim(1), k = args.topk;
  const int32_t* slots = args.slots->i32();
  const float* y = args.y->f32();
  const float* weights = args.weights->f32();
  const float* dout = args.dout->f32();
  float* dy = args.dy->f32();
  float* dweights = args.dweights->f32();
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < rows; ++s) {
    const float* g = dout + (slots[s] / k) * c;
    const float w = weights[slots[s]];
    double dot = 0.0;
    for (int64_t col = 0; col < c; ++col) {
      dy[s * c + col] = w * g[col];
      dot += static_cast<double>(y[s * c + col]) * g[col];
    }
    dweights[slots[s]] = static_cast<float>(dot);
  }
}

namespace {

// Expert e's rows [begin, end) of a [M, cols] tensor as a [end − begin, cols] view.
Tensor rows_of(const Tensor& t, int64_t begin, int64_t end) {
  return t.slice_elements(begin * t.dim(1), {end - begin, t.dim(1)});
}

}  // namespace

void CpuBackend::grouped_linear_forward(const GroupedLinearArgs& args) {
  const int64_t experts = args.w->dim(0), out = args.w->dim(1), in = args.w->dim(2);
  const int32_t* offsets = args.offsets->i32();
  for (int64_t e = 0; e < experts; ++e) {
    if (offsets[e + 1] == offsets[e]) continue;
    const Tensor x = rows_of(*args.x, offsets[e], offsets[e + 1]);
    const Tensor w = args.w->slice_elements(e * out * in, {out, in});
    Tensor y = rows_of(*args.y, offsets[e], offsets[e + 1]);
    gemm(GemmArgs{&x, &w, &y, false, true, 1.0f, 0.0f});
  }
}

void CpuBackend::grouped_linear_backward(const GroupedLinearArgs& args) {
  const int64_t experts = args.w->dim(0), out = args.w->dim(1), in = args.w->dim(2);
  const int32_t* offsets = args.offsets->i32();
  for (int64_t e = 0; e < experts; ++e) {
    if (offsets[e + 1] == offsets[e]) continue;
    const Tensor dy = rows_of(*args.dy, offsets[e], offsets[e + 1]);
    if (args.dx != nullptr) {
      const Tensor w = args.w->slice_elements(e * out * in, {out, in});
      Tensor dx = rows_of(*args.dx, offsets[e], offsets[e + 1]);
      gemm(GemmArgs{&dy, &w, &dx, false, false, 1.0f, 0.0f});
    }
    if (args.dw != nullptr) {
      const Tensor x = rows_of(*args.x, offsets[e], offsets[e + 1]);
      Tensor dw = args.dw->slice_elements(e * out * in, {out, in});
      gemm(GemmArgs{&dy, &x, &dw, true, false, 1.0f, 1.0f});
    }
  }
}

void CpuBackend::moe_aux_loss(const MoeAuxLossArgs& args) {
  const int64_t n = args.scores->dim(0), experts = args.scores->dim(1);
  const float* scores = args.scores->f32();
  const int32_t* offsets = args.offsets->i32();
  const double factor =
      static_cast<double>(args.coeff) * experts / (static_cast<double>(args.topk) * static_cast<double>(n) * n);
  std::vector<double> count(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) count[static_cast<size_t>(e)] = offsets[e + 1] - offsets[e];
  std::vector<double> row_loss(static_cast<size_t>(n));
  float* dscores = args.dscores != nullptr ? args.dscores->f32() : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* s = scores + t * experts;
    double sum = 1.0;
    if (args.sigmoid_scores) {
      sum = 1e-20;
      for (int64_t e = 0; e < experts; ++e) sum += s[e];
    }
    double dot = 0.0;  // Σ_e count_e · p_e: the row's loss term, and the normalisation's gradient
    for (int64_t e = 0; e < experts; ++e) dot += count[static_cast<size_t>(e)] * (s[e] / sum);
    row_loss[static_cast<size_t>(t)] = dot;
    if (dscores == nullptr) continue;
    for (int64_t e = 0; e < experts; ++e) {
      // p = s / Σ s (sigmoid): dL/ds_e = (count_e − Σ_i count_i p_i) / Σ s; softmax scores: count_e.
      const double d = args.sigmoid_scores ? (count[static_cast<size_t>(e)] - dot) / sum : count[static_cast<size_t>(e)];
      dscores[t * experts + e] = static_cast<float>(args.grad_scale * factor * d);
    }
  }
  args.loss->f32()[0] = static_cast<float>(factor * std::accumulate(row_loss.begin(), row_loss.end(), 0.0));
}

void CpuBackend::moe_z_loss(const MoeAuxLossArgs& args) {
  const int64_t n = args.logits->dim(0), experts = args.logits->dim(1);
  const float* logits = args.logits->f32();
  float* dlogits = args.dlogits != nullptr ? args.dlogits->f32() : nullptr;
  const double factor = static_cast<double>(args.coeff) / static_cast<double>(n);
  std::vector<double> squares(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* z = logits + t * experts;
    const float max = *std::max_element(z, z + experts);
    double sum = 0.0;
    for (int64_t e = 0; e < experts; ++e) sum += std::exp(static_cast<double>(z[e]) - max);
    const double lse = max + std::log(sum);
    squares[static_cast<size_t>(t)] = lse * lse;
    if (dlogits == nullptr) continue;
    // d(lse²)/dz_e = 2 · lse · softmax(z)_e
    for (int64_t e = 0; e < experts; ++e) {
      const double p = std::exp(static_cast<double>(z[e]) - max) / sum;
      dlogits[t * experts + e] += static_cast<float>(args.grad_scale * factor * 2.0 * lse * p);
    }
  }
  args.loss->f32()[0] = static_cast<float>(factor * std::accumulate(squares.begin(), squares.end(), 0.0));
}

}  // namespace primus
