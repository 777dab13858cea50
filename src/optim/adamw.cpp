#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"

namespace primus {

AdamW::AdamW(const ParamStore& params, AdamWConfig config, std::vector<FlatRange> owned,
             std::optional<PackedShards> packed)
    : config_(config), numel_(params.numel()), owned_(std::move(owned)), packed_(std::move(packed)) {
  if (owned_.empty()) owned_.push_back({0, numel_});
  int64_t total = 0;
  for (size_t i = 0; i < owned_.size(); ++i) {
    const FlatRange& r = owned_[i];
    PRIMUS_CHECK(r.begin >= 0 && r.end <= numel_ && !r.empty(), "[adamw] owned range [{}, {}) outside [0, {})",
                 r.begin, r.end, numel_);
    if (packed_) {
      PRIMUS_CHECK(packed_->offsets.size() == owned_.size() && packed_->offsets[i] >= 0 &&
                       packed_->offsets[i] + r.size() <= packed_->master.numel() &&
                       packed_->grads.numel() == packed_->master.numel(),
                   "[adamw] packed shards do not hold owned range {} [{}, {})", i, r.begin, r.end);
      moment_offsets_.push_back(packed_->offsets[i]);
    } else {
      moment_offsets_.push_back(total);
      total += r.size();
    }
  }
  if (packed_) total = packed_->master.numel();
  exp_avg_ = ops::zeros({total}, DType::kF32, params.flat_params().device());
  exp_avg_sq_ = ops::zeros({total}, DType::kF32, params.flat_params().device());
}

Tensor AdamW::weights(size_t i) const {
  if (!packed_) return Tensor();
  return packed_->master.slice_elements(moment_offsets_[i], {owned_[i].size()});
}

Tensor AdamW::exp_avg(size_t i) const { return exp_avg_.slice_elements(moment_offsets_[i], {owned_[i].size()}); }
Tensor AdamW::exp_avg_sq(size_t i) const {
  return exp_avg_sq_.slice_elements(moment_offsets_[i], {owned_[i].size()});
}

const Tensor& AdamW::exp_avg() const {
  PRIMUS_CHECK(owns_everything(), "[adamw] the whole moment buffer of a sharded optimizer");
  return exp_avg_;
}

const Tensor& AdamW::exp_avg_sq() const {
  PRIMUS_CHECK(owns_everything(), "[adamw] the whole moment buffer of a sharded optimizer");
  return exp_avg_sq_;
}

void AdamW::step(ParamStore& params, double lr, double grad_scale, Tensor* compute_copy) {
  PRIMUS_CHECK(!packed_ || compute_copy == nullptr, "[adamw] a packed optimizer writes its own compute copy");
  ++steps_taken_;
  for (size_t r = 0; r < owned_.size(); ++r) {
    const FlatRange range = owned_[r];
    update_runs(
        params, range, lr, grad_scale,
        [&](int64_t offset, int64_t n, Tensor& p, Tensor& g, Tensor& m, Tensor& v, Tensor& copy) {
          const int64_t at = moment_offsets_[r] + offset - range.begin;  // in the moments (and packed shards)
          p = packed_ ? packed_->master.slice_elements(at, {n}) : params.flat_params().slice_elements(offset, {n});
          g = packed_ ? packed_->grads.slice_elements(at, {n}) : params.flat_grads().slice_elements(offset, {n});
          m = exp_avg_.slice_elements(at, {n});
          v = exp_avg_sq_.slice_elements(at, {n});
          if (packed_ && packed_->compute_copy.defined()) {
            copy = packed_->compute_copy.slice_elements(at, {n});
          } else if (compute_copy != nullptr) {
            copy = compute_copy->slice_elements(offset, {n});
          }
        });
  }
}

void AdamW::begin_step() {
  PRIMUS_CHECK(owns_everything() && !packed_, "[adamw] an update by pieces needs the whole, unpacked optimizer");
  ++steps_taken_;
}

void AdamW::update(ParamStore& params, FlatRange range, const Tensor& grads, const Tensor& compute, double lr,
                   double grad_scale) {
  PRIMUS_CHECK(owns_everything() && !packed_, "[adamw] an update by pieces needs the whole, unpacked optimizer");
  PRIMUS_CHECK(range.begin >= 0 && range.end <= numel_ && grads.numel() >= range.size() &&
                   (!compute.defined() || compute.numel() >= range.size()),
               "[adamw] piece [{}, {}) with gradients {} and compute copy {}", range.begin, range.end, grads.describe(),
               compute.defined() ? compute.describe() : "none");
  update_runs(params, range, lr, grad_scale,
              [&](int64_t offset, int64_t n, Tensor& p, Tensor& g, Tensor& m, Tensor& v, Tensor& copy) {
                p = params.flat_params().slice_elements(offset, {n});
                g = grads.slice_elements(offset - range.begin, {n});
                m = exp_avg_.slice_elements(offset, {n});
                v = exp_avg_sq_.slice_elements(offset, {n});
                if (compute.defined()) copy = compute.slice_elements(offset - range.begin, {n});
              });
}

void AdamW::update_runs(const ParamStore& params, FlatRange range, double lr, double grad_scale,
                        const ViewsOf& views_of) const {
  const std::vector<ParamSpec>& specs = params.specs();
  // Runs of adjacent tensors with the same weight decay, cut to the range: each is one launch.
  for (size_t first = 0; first < specs.size();) {
    size_t end = first + 1;
    while (end < specs.size() && specs[end].weight_decay == specs[first].weight_decay) ++end;
    const int64_t run_begin = params.offset(first);
    const int64_t run_end = params.offset(end - 1) + shape_numel(specs[end - 1].shape);
    const int64_t offset = std::max(run_begin, range.begin);
    const int64_t n = std::min(run_end, range.end) - offset;
    const bool decay = specs[first].weight_decay;
    first = end;
    if (n <= 0) continue;
    Tensor p, g, m, v, copy;
    views_of(offset, n, p, g, m, v, copy);
    AdamWArgs args;
    args.param = &p;
    args.grad = &g;
    args.exp_avg = &m;
    args.exp_avg_sq = &v;
    args.lr = static_cast<float>(lr);
    args.beta1 = static_cast<float>(config_.beta1);
    args.beta2 = static_cast<float>(config_.beta2);
    args.eps = static_cast<float>(config_.eps);
    args.weight_decay = decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    args.step = steps_taken_;
    args.grad_scale = static_cast<float>(grad_scale);
    args.compute_copy = copy.defined() ? &copy : nullptr;
    ops::adamw_step(args);
  }
}

GradClip clip_for_norm(double norm, double max_norm) {
  GradClip clip;
  clip.norm = norm;
  if (max_norm > 0.0) clip.scale = std::min(1.0, max_norm / (clip.norm + 1e-6));
  return clip;
}

GradClip clip_grad_norm(const ParamStore& params, double max_norm) {
  return clip_for_norm(std::sqrt(ops::sum_squares(params.flat_grads())), max_norm);
}

}  // namespace primus
