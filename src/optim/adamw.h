// AdamW over a flat ParamStore: fp32 moments in two buffers laid out like the parameters, decoupled
// weight decay on the tensors whose spec asks for it, and global-norm gradient clipping.
//
// Sharded (the distributed optimizer, ZeRO-1): the optimizer owns only some ranges of the flat buffers (its
// data-parallel rank's shards, parallel/grad_reducer.h) and keeps moments for those alone, back to back in
// the order of the ranges. Unsharded it owns [0, numel). Fully sharded (parallel/fsdp.h): the weights and
// gradients of the owned ranges live in packed shard buffers instead of the ParamStore (PackedShards).
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "ops/param_store.h"

namespace primus {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// The fp32 master weights and gradients of an optimizer's owned ranges kept outside the ParamStore (fully
// sharded data parallelism): owned range i starts at offsets[i] of `master` and `grads`, and of `compute_copy`
// (the weights in the compute dtype, rewritten by each step; undefined in fp32). The moments use the same offsets.
struct PackedShards {
  std::vector<int64_t> offsets;
  Tensor master;        // [n] f32
  Tensor grads;         // [n] f32
  Tensor compute_copy;  // [n] bf16, or undefined
};

class AdamW {
 public:
  // owned: disjoint ranges of the flat buffers this optimizer updates; empty: the whole buffer. packed: where their
  // weights and gradients live when not in `params`' flat buffers.
  AdamW(const ParamStore& params, AdamWConfig config, std::vector<FlatRange> owned = {},
        std::optional<PackedShards> packed = std::nullopt);

  // One update of the owned ranges with learning rate `lr`, gradients multiplied by grad_scale as they are
  // read (the clip factor); increments the step count used for bias correction. compute_copy (optional,
  // bf16 [numel]) receives the updated weights rounded. Adjacent tensors with the same weight decay share
  // one launch. With packed shards, `params` gives only the layout and compute_copy must be null.
  void step(ParamStore& params, double lr, double grad_scale = 1.0, Tensor* compute_copy = nullptr);
  // The same step for gradients and a compute copy held in pieces instead of flat buffers (a single rank's
  // step-scoped buffers, parallel/unit_residency.h), unsharded and unpacked only: begin_step(), then update() of
  // every piece once. `grads` and `compute` (undefined in fp32) hold the range's elements from their start.
  void begin_step();
  void update(ParamStore& params, FlatRange range, const Tensor& grads, const Tensor& compute, double lr,
              double grad_scale = 1.0);

  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t n) { steps_taken_ = n; }
  const std::vector<FlatRange>& owned() const { return owned_; }
  bool owns_everything() const { return owned_.size() == 1 && owned_[0].begin == 0 && owned_[0].end == numel_; }
  // The moments of owned range i: [owned()[i].size()] f32 views.
  Tensor exp_avg(size_t i) const;
  Tensor exp_avg_sq(size_t i) const;
  // With packed shards: the fp32 weights of owned range i ([owned()[i].size()] view); else undefined (the
  // weights are the ParamStore's).
  bool holds_weights() const { return packed_.has_value(); }
  Tensor weights(size_t i) const;
  // Unsharded only: the whole [numel] moment buffers.
  const Tensor& exp_avg() const;
  const Tensor& exp_avg_sq() const;

 private:
  // Sets the parameter, gradient, moment and compute-copy views (copy left undefined for none) of n elements from
  // flat offset `offset`.
  using ViewsOf =
      std::function<void(int64_t offset, int64_t n, Tensor& p, Tensor& g, Tensor& m, Tensor& v, Tensor& copy)>;
  // One launch per run of adjacent tensors with the same weight decay, cut to `range`.
  void update_runs(const ParamStore& params, FlatRange range, double lr, double grad_scale,
                   const ViewsOf& views_of) const;

  AdamWConfig config_;
  int64_t numel_ = 0;
  std::vector<FlatRange> owned_;
  std::vector<int64_t> moment_offsets_;  // where owned range i starts in the moment buffers
  std::optional<PackedShards> packed_;
  int64_t steps_taken_ = 0;
  Tensor exp_avg_;
  Tensor exp_avg_sq_;
};

// Global-norm clipping as torch.nn.utils.clip_grad_norm_ does it: the L2 norm of all gradients and the factor
// max_norm / (norm + 1e-6) when max_norm > 0 and that is below 1, else 1. The factor goes to AdamW::step,
// which applies it as it reads the gradients (the gradients themselves are left unscaled).
struct GradClip {
  double norm = 0.0;
  double scale = 1.0;
};
GradClip clip_grad_norm(const ParamStore& params, double max_norm);
// The same factor for a norm computed elsewhere (data parallelism's global norm over sharded gradients).
GradClip clip_for_norm(double norm, double max_norm);

}  // namespace primus
