#include "parallel/fsdp.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

FullyShardedDataParallel::FullyShardedDataParallel(Communicator& dp, ParamStore& params, std::vector<FlatRange> units,
                                                   DType compute_dtype, Strategy strategy, bool overlap_param_gather)
    : dp_(dp),
      params_(params),
      compute_dtype_(compute_dtype),
      strategy_(strategy),
      overlap_param_gather_(overlap_param_gather),
      comm_(dp.device()) {
  PRIMUS_CHECK(units.size() >= 2, "[fsdp] {} parameter units; the first and last are kept whole, so at least 2",
               units.size());
  PRIMUS_CHECK(params.flat_params().device() == dp.device(), "[fsdp] parameters on {} but the group works on {}",
               params.flat_params().device().str(), dp.device().str());
  const int d = dp.size();
  const int r = dp.rank();
  const Device device = dp.device();
  int64_t packed = 0;
  int64_t expected_begin = 0;
  for (const FlatRange& range : units) {
    PRIMUS_CHECK(range.begin == expected_begin && !range.empty(), "[fsdp] units must tile the flat buffer: [{}, {}) "
                 "after {}", range.begin, range.end, expected_begin);
    expected_begin = range.end;
    Unit unit;
    unit.range = range;
    unit.shard = (range.size() + d - 1) / d;
    unit.packed = packed;
    const FlatRange mine{std::min(range.end, range.begin + r * unit.shard),
                         std::min(range.end, range.begin + (r + 1) * unit.shard)};
    if (!mine.empty()) {
      owned_.push_back(mine);
      owned_offsets_.push_back(packed);
    }
    packed += unit.shard;
    units_.push_back(std::move(unit));
  }
  PRIMUS_CHECK(expected_begin == params.numel(), "[fsdp] units cover [0, {}) of {} parameters", expected_begin,
               params.numel());
  master_ = ops::zeros({packed}, DType::kF32, device);
  grad_shards_ = ops::zeros({packed}, DType::kF32, device);
  if (compute_dtype_ != DType::kF32) compute_shards_ = ops::zeros({packed}, compute_dtype_, device);
  // Allocated as they are gathered or written (take_weights, the hooks); the flat gradients are never used.
  for (Unit& unit : units_) {
    unit.weights = Tensor::unallocated({d * unit.shard}, compute_dtype_, device);
    unit.grads = Tensor::unallocated({d * unit.shard}, DType::kF32, device);
  }
  params.flat_grads().release_storage();
}

Tensor FullyShardedDataParallel::shard_of(const Tensor& packed, size_t u) const {
  return packed.slice_elements(units_[u].packed, {units_[u].shard});
}

UnitBuffers FullyShardedDataParallel::take_weights() {
  PRIMUS_CHECK(!taken_, "[fsdp] the weights were taken already");
  taken_ = true;
  const Tensor& flat = params_.flat_params();
  for (size_t i = 0; i < owned_.size(); ++i) {
    Tensor dst = master_.slice_elements(owned_offsets_[i], {owned_[i].size()});
    ops::copy(dst, flat.slice_elements(owned_[i].begin, {owned_[i].size()}));
  }
  if (compute_shards_.defined()) ops::cast(compute_shards_, master_);
  UnitBuffers buffers;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (keeps_weights(u)) {  // the unit's weights straight from the flat buffer: no collective needed yet
      unit.weights.materialize_storage();
      Tensor head = unit.weights.slice_elements(0, {unit.range.size()});
      ops::cast(head, flat.slice_elements(unit.range.begin, {unit.range.size()}));
      unit.gathering = true;
    }
    if (outer(u)) {
      unit.grads.materialize_storage();
      ops::zero(unit.grads);
    }
    buffers.ranges.push_back(unit.range);
    buffers.compute.push_back(unit.weights);
    buffers.grads.push_back(unit.grads);
  }
  ops::synchronize(dp_.device());  // the copies out of the flat buffers are done before they are freed
  params_.flat_params().release_storage();
  return buffers;
}

void FullyShardedDataParallel::begin_step() {
  PRIMUS_CHECK(taken_, "[fsdp] a step before take_weights()");
  for (Unit& unit : units_) unit.has_grad = false;
}

void FullyShardedDataParallel::begin_micro_batch() {
  // The kept units' gradients are written from the loss's forward on: zero them once their last reduction is done.
  for (size_t u : {size_t{0}, units_.size() - 1}) {
    comm_.wait(units_[u].reduced);
    ops::zero(units_[u].grads);
  }
}

void FullyShardedDataParallel::finish_backward() {
  const ops::ProfileScope scope("fsdp: wait for gradient reduce-scatter");
  comm_.wait_all();
}

double FullyShardedDataParallel::local_grad_sum_squares() const { return ops::sum_squares(grad_shards_); }

void FullyShardedDataParallel::after_optimizer() {
  const ops::ProfileScope scope("fsdp: all_gather weights");
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!keeps_weights(u)) continue;
    units_[u].gathering = false;
    launch_gather(u);
  }
  if (!overlap_param_gather_) comm_.wait_all();
}

void FullyShardedDataParallel::launch_gather(size_t u) {
  Unit& unit = units_[u];
  comm_.reclaim(unit.weights);
  unit.weights.materialize_storage();
  const Tensor source = shard_of(compute_shards_.defined() ? compute_shards_ : master_, u);
  Tensor out = unit.weights;
  unit.gathered = comm_.launch(fmt::format("all_gather unit {} ({} elements)", u, unit.range.size()),
                               [this, source, out](Stream stream) mutable { dp_.all_gather(source, out, stream); });
  unit.gathering = true;
}

void FullyShardedDataParallel::ensure_gathered(size_t u) {
  if (!units_[u].gathering) launch_gather(u);
  comm_.wait(units_[u].gathered);
}

void FullyShardedDataParallel::prefetch(size_t u) {
  if (u < units_.size() && !units_[u].gathering) launch_gather(u);
}

void FullyShardedDataParallel::release_weights(size_t u) {
  if (keeps_weights(u)) return;
  units_[u].weights.release_storage();
  units_[u].gathering = false;
}

void FullyShardedDataParallel::before_forward(size_t u) {
  ensure_gathered(u);
  if (strategy_ == Strategy::kOptimGradsParams) prefetch(u + 1);
}

void FullyShardedDataParallel::after_forward(size_t u) { release_weights(u); }

void FullyShardedDataParallel::before_backward(size_t u) {
  ensure_gathered(u);
  if (strategy_ == Strategy::kOptimGradsParams && u >= 1) prefetch(u - 1);
  Unit& unit = units_[u];
  if (outer(u) || unit.grads_live) return;
  comm_.reclaim(unit.grads);
  unit.grads.materialize_storage();
  ops::zero(unit.grads);
  unit.grads_live = true;
}

void FullyShardedDataParallel::after_backward(size_t u) {
  Unit& unit = units_[u];
  PRIMUS_CHECK(outer(u) || unit.grads_live, "[fsdp] gradients of unit {} finished without a backward", u);
  Tensor shard = shard_of(grad_shards_, u);
  if (unit.has_grad) {  // earlier micro-batches: added to this rank's part, so one reduce-scatter sums them all
    comm_.wait(unit.reduced);
    Tensor own = unit.grads.slice_elements(dp_.rank() * unit.shard, {unit.shard});
    ops::add_inplace(own, shard);
  }
  Tensor grads = unit.grads;
  unit.reduced = comm_.launch(fmt::format("reduce_scatter unit {} ({} elements)", u, unit.range.size()),
                              [this, grads, shard](Stream stream) mutable {
                                dp_.reduce_scatter(grads, shard, ReduceOp::kSum, stream);
                              });
  unit.has_grad = true;
  if (!outer(u)) {
    comm_.release_after_use(unit.grads);
    unit.grads_live = false;
  }
  release_weights(u);
}

}  // namespace primus
