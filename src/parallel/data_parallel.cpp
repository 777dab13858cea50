#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/profile.h"
#include "parallel/tensor_parallel_grads.h"

namespace primus {

namespace {

// A host value summed (or maxed) over the group through a one-element tensor on the group's device.
template <typename T>
T all_reduce_value(Communicator& group, T value, ReduceOp op) {
  constexpr DType dtype = sizeof(T) == 8 ? DType::kI64 : DType::kF32;
  Tensor host = Tensor::empty({1}, dtype);
  *static_cast<T*>(host.data()) = value;
  Tensor buf = ops::to_device(host, group.device());
  group.all_reduce(buf, op);
  return *static_cast<const T*>(ops::to_device(buf, kCpuDevice).data());
}

// [0, n) without `ranges` (sorted, disjoint).
std::vector<FlatRange> complement(const std::vector<FlatRange>& ranges, int64_t n) {
  std::vector<FlatRange> out;
  int64_t at = 0;
  for (const FlatRange& r : ranges) {
    if (r.begin > at) out.push_back({at, r.begin});
    at = std::max(at, r.end);
  }
  if (at < n) out.push_back({at, n});
  return out;
}

// The parts of `a` inside `b` (each sorted, disjoint), in a's order.
std::vector<FlatRange> intersect(const std::vector<FlatRange>& a, const std::vector<FlatRange>& b) {
  std::vector<FlatRange> out;
  for (const FlatRange& r : a) {
    for (const FlatRange& s : b) {
      const int64_t lo = std::max(r.begin, s.begin), hi = std::min(r.end, s.end);
      if (lo < hi) out.push_back({lo, hi});
    }
  }
  return out;
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<Communicator> dp, ParamStore& params, DataParallelOptions options)
    : dp_(std::move(dp)), control_(dp_->split(0, dp_->rank())), params_(params), options_(std::move(options)) {
  PRIMUS_CHECK(params.flat_grads().device() == dp_->device(),
               "[ddp] gradients on {} but the data-parallel communicator ({}) works on {}",
               params.flat_grads().device().str(), dp_->backend_name(), dp_->device().str());
  const bool experts = !options_.expert_ranges.empty();
  if (experts) {
    PRIMUS_CHECK(options_.expert_dp != nullptr && options_.ep != nullptr &&
                     options_.expert_dp->size() * options_.ep->size() == dp_->size(),
                 "[ddp] expert ranges need the expert-data-parallel and ep groups, together the data-parallel group");
    if (options_.fully_sharded) {
      throw UsageError("[config] expert_model_parallel_size > 1 with FSDP's optim_grads or optim_grads_params is not "
                       "implemented; use use_distributed_optimizer: true");
    }
    expert_dp_ = options_.expert_dp->split(0, options_.expert_dp->rank());
    ep_control_ = options_.ep->split(0, options_.ep->rank());
  }
  if (options_.unit_residency) {
    PRIMUS_CHECK(dp_->size() == 1 && !options_.fully_sharded && !options_.distributed_optimizer && !experts &&
                     (!options_.tp || options_.tp->size() == 1) && (!options_.model || options_.model->size() == 1),
                 "[ddp] step-scoped buffers are for a single rank without model parallelism or sharding");
    residency_ =
        std::make_unique<UnitResidency>(params, options_.units, options_.expert_weights, options_.compute_dtype);
    return;
  }
  if (options_.fully_sharded) {
    fsdp_ = std::make_unique<FullyShardedDataParallel>(*dp_, params, options_.units, options_.compute_dtype,
                                                       *options_.fully_sharded, options_.overlap_param_gather);
    return;
  }
  reducer_ = std::make_unique<GradReducer>(
      *dp_, params.flat_grads(),
      experts ? BucketLayout(params.numel(), options_.bucket_size, dp_->size(), options_.expert_ranges,
                             expert_dp_->size())
              : BucketLayout(params.numel(), options_.bucket_size, dp_->size()),
      options_.distributed_optimizer ? GradReducer::Mode::kReduceScatter : GradReducer::Mode::kAllReduce,
      options_.overlap_grad_reduce, expert_dp_.get());
}

std::vector<FlatRange> DataParallel::optimizer_ranges() const {
  if (fsdp_) return fsdp_->owned();
  if (!sharded()) return {FlatRange{0, params_.numel()}};
  return reducer_->layout().owned(dp_->rank(), expert_dp_ ? expert_dp_->rank() : 0);
}

std::vector<FlatRange> DataParallel::shard_ranges() const {
  if (fsdp_) return fsdp_->owned();
  if (residency_) return {FlatRange{0, params_.numel()}};
  return reducer_->layout().owned(dp_->rank(), expert_dp_ ? expert_dp_->rank() : 0);
}

std::vector<FlatRange> DataParallel::checkpoint_ranges() const {
  return intersect(shard_ranges(), counted_ranges());
}

std::vector<FlatRange> DataParallel::counted_ranges() const {
  std::vector<FlatRange> counted{FlatRange{0, params_.numel()}};
  if (options_.tp && !options_.tp_duplicates.empty()) counted = complement(options_.tp_duplicates, params_.numel());
  if (!options_.copies.empty()) counted = intersect(counted, complement(options_.copies, params_.numel()));
  return counted;
}

void DataParallel::zero_grads() {
  if (fsdp_) {
    fsdp_->begin_step();
  } else if (residency_) {
    residency_->begin_step();
  } else {
    params_.zero_grads();
  }
}

void DataParallel::begin_micro_batch() {
  if (fsdp_) fsdp_->begin_micro_batch();
}

void DataParallel::before_backward(bool last) {
  if (reducer_ && last) reducer_->start();
  if (residency_) residency_->before_step_backward(last);
}

GradsReadyFn DataParallel::grads_ready_hook(bool last) {
  if (!reducer_ || !last) return {};
  return [this](int64_t begin, int64_t end) { reducer_->grads_ready(begin, end); };
}

void DataParallel::after_backward(bool last) {
  if (!last) return;
  if (fsdp_) {
    fsdp_->finish_backward();
  } else if (reducer_) {
    reducer_->finish();
  }
}

int64_t DataParallel::global_tokens(int64_t local_tokens) {
  return all_reduce_value<int64_t>(*control_, local_tokens, ReduceOp::kSum);
}

void DataParallel::sum_losses(Tensor& loss_sum) {
  control_->all_reduce(loss_sum, ReduceOp::kSum);
}

void DataParallel::max_in_place(Tensor& values) {
  if (control_->size() > 1) control_->all_reduce(values, ReduceOp::kMax);
  if (options_.tp && options_.tp->size() > 1) options_.tp->all_reduce(values, ReduceOp::kMax);
}

void DataParallel::wait_for_communication() {
  if (residency_) return;  // nothing runs in the background
  if (reducer_) reducer_->wait_all_gathered();
  comm()->wait_all();
}

ParamUnitHooks* DataParallel::param_hooks() {
  if (fsdp_) return fsdp_.get();
  if (residency_) return residency_.get();
  return options_.overlap_param_gather && sharded() ? this : nullptr;
}

void DataParallel::before_forward(size_t unit) {
  PRIMUS_CHECK(unit < options_.units.size(), "[ddp] unit {} of {}", unit, options_.units.size());
  reducer_->wait_gathered(options_.units[unit]);
}

double DataParallel::sum(double local) {
  return all_reduce_value<float>(*control_, static_cast<float>(local), ReduceOp::kSum);
}

bool DataParallel::any(bool flag) {
  Communicator& group = options_.world && options_.world->size() > dp_->size() ? *options_.world : *control_;
  return all_reduce_value<int64_t>(group, flag ? 1 : 0, ReduceOp::kMax) != 0;
}

double DataParallel::grad_norm() {
  // The ranks holding this replica's other parts: pipeline stages with their tensor-parallel slices, or the slices
  // alone (null: this rank holds the whole model).
  Communicator* parts = options_.model && options_.model->size() > 1 ? options_.model.get()
                        : options_.tp && options_.tp->size() > 1   ? options_.tp.get()
                                                                    : nullptr;
  if (expert_dp_) return std::sqrt(expert_parallel_sum_squares(parts));
  if (residency_) return std::sqrt(residency_->grad_sum_squares());
  double local = 0.0;
  if (parts != nullptr) {
    // Each parameter counted once over the parts: tensor-parallel duplicates and pipeline copies left out.
    local = held_sum_squares(counted_ranges());
  } else if (fsdp_) {
    local = fsdp_->local_grad_sum_squares();
  } else if (!sharded()) {
    return std::sqrt(ops::sum_squares(params_.flat_grads()));  // reduced full gradients: the same on every rank
  } else {
    local = held_sum_squares({FlatRange{0, params_.numel()}});
  }
  if (sharded()) local = sum(local);
  if (parts != nullptr) local = all_reduce_value<float>(*parts, static_cast<float>(local), ReduceOp::kSum);
  return std::sqrt(local);
}

double DataParallel::expert_parallel_sum_squares(Communicator* parts) {
  const int64_t n = params_.numel();
  const std::vector<FlatRange> counted = counted_ranges();
  const double shared = held_sum_squares(intersect(counted, complement(options_.expert_ranges, n)));
  const double experts = held_sum_squares(intersect(counted, options_.expert_ranges));
  double local = 0.0;
  if (sharded()) {
    // Each shared element is held by one rank of the data-parallel group, each expert element by one rank of its
    // expert-data-parallel group; the data-parallel group is all of those groups.
    local = sum(shared + experts);
  } else {
    // Every rank holds the reduced shared gradients; the experts differ over the ep group.
    local = shared + all_reduce_value<float>(*ep_control_, static_cast<float>(experts), ReduceOp::kSum);
  }
  if (parts != nullptr) local = all_reduce_value<float>(*parts, static_cast<float>(local), ReduceOp::kSum);
  return local;
}

std::vector<Tensor> DataParallel::held_grads() const {
  // The pieces this rank holds: everything, its optimizer shards, or FSDP's packed gradient shards.
  PRIMUS_CHECK(residency_ == nullptr, "[ddp] step-scoped gradients are held in pieces, not flat ranges");
  const std::vector<FlatRange> held = optimizer_ranges();
  std::vector<Tensor> grads;
  for (size_t i = 0; i < held.size(); ++i) {
    grads.push_back(fsdp_ ? fsdp_->grad_shards().slice_elements(fsdp_->owned_offsets()[i], {held[i].size()})
                          : params_.flat_grads().slice_elements(held[i].begin, {held[i].size()}));
  }
  return grads;
}

double DataParallel::held_sum_squares(const std::vector<FlatRange>& ranges) const {
  const std::vector<FlatRange> held = optimizer_ranges();
  const std::vector<Tensor> grads = held_grads();
  double total = 0.0;
  for (size_t i = 0; i < held.size(); ++i) {
    for (const FlatRange& r : ranges) {
      const int64_t lo = std::max(r.begin, held[i].begin), hi = std::min(r.end, held[i].end);
      if (lo < hi) total += ops::sum_squares(grads[i].slice_elements(lo - held[i].begin, {hi - lo}));
    }
  }
  return total;
}

void DataParallel::sum_tensor_parallel_grads() {
  if (!options_.tp || options_.tp->size() == 1 || options_.tp_grad_sums.empty()) return;
  primus::sum_tensor_parallel_grads(*options_.tp, options_.tp_grad_sums, optimizer_ranges(), held_grads());
}

void DataParallel::after_optimizer(Tensor compute) {
  if (fsdp_) {
    fsdp_->after_optimizer();
    return;
  }
  if (!sharded()) return;
  reducer_->all_gather_shards(compute, !options_.overlap_param_gather);
}

}  // namespace primus
