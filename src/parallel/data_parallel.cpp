#include "parallel/data_parallel.h"

#include <cmath>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

namespace {

// A host value summed (or maxed) over the group through a one-element tensor on the group's device, in order
// with the collectives queued on `comm` (FSDP's, when there is one).
template <typename T>
T all_reduce_value(Communicator& group, CommStream* comm, T value, ReduceOp op) {
  constexpr DType dtype = sizeof(T) == 8 ? DType::kI64 : DType::kF32;
  Tensor host = Tensor::empty({1}, dtype);
  *static_cast<T*>(host.data()) = value;
  Tensor buf = ops::to_device(host, group.device());
  if (comm != nullptr) {
    comm->run_in_order([&] { group.all_reduce(buf, op); });
  } else {
    group.all_reduce(buf, op);
  }
  return *static_cast<const T*>(ops::to_device(buf, kCpuDevice).data());
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<Communicator> dp, ParamStore& params, DataParallelOptions options)
    : dp_(std::move(dp)), params_(params), options_(std::move(options)) {
  PRIMUS_CHECK(params.flat_grads().device() == dp_->device(),
               "[ddp] gradients on {} but the data-parallel communicator ({}) works on {}",
               params.flat_grads().device().str(), dp_->backend_name(), dp_->device().str());
  if (options_.fully_sharded) {
    fsdp_ = std::make_unique<FullyShardedDataParallel>(*dp_, params, options_.units, options_.compute_dtype,
                                                       *options_.fully_sharded, options_.overlap_param_gather);
    return;
  }
  reducer_ = std::make_unique<GradReducer>(
      *dp_, params.flat_grads(), BucketLayout(params.numel(), options_.bucket_size, dp_->size()),
      options_.distributed_optimizer ? GradReducer::Mode::kReduceScatter : GradReducer::Mode::kAllReduce,
      options_.overlap_grad_reduce);
}

std::vector<FlatRange> DataParallel::optimizer_ranges() const {
  if (fsdp_) return fsdp_->owned();
  if (!sharded()) return {FlatRange{0, params_.numel()}};
  return reducer_->layout().owned(dp_->rank());
}

std::vector<FlatRange> DataParallel::shard_ranges() const {
  if (fsdp_) return fsdp_->owned();
  return reducer_->layout().owned(dp_->rank());
}

void DataParallel::zero_grads() {
  if (fsdp_) {
    fsdp_->begin_step();
  } else {
    params_.zero_grads();
  }
}

void DataParallel::begin_micro_batch() {
  if (fsdp_) fsdp_->begin_micro_batch();
}

void DataParallel::before_backward(bool last) {
  if (reducer_ && last) reducer_->start();
}

GradsReadyFn DataParallel::grads_ready_hook(bool last) {
  if (!reducer_ || !last) return {};
  return [this](int64_t begin, int64_t end) { reducer_->grads_ready(begin, end); };
}

void DataParallel::after_backward(bool last) {
  if (!last) return;
  if (fsdp_) {
    fsdp_->finish_backward();
  } else {
    reducer_->finish();
  }
}

int64_t DataParallel::global_tokens(int64_t local_tokens) {
  return all_reduce_value<int64_t>(*dp_, comm(), local_tokens, ReduceOp::kSum);
}

void DataParallel::sum_losses(Tensor& loss_sum) {
  if (comm() != nullptr) {
    comm()->run_in_order([&] { dp_->all_reduce(loss_sum, ReduceOp::kSum); });
  } else {
    dp_->all_reduce(loss_sum, ReduceOp::kSum);
  }
}

void DataParallel::wait_for_communication() {
  if (comm() != nullptr) comm()->wait_all();
}

double DataParallel::sum(double local) {
  return all_reduce_value<float>(*dp_, comm(), static_cast<float>(local), ReduceOp::kSum);
}

bool DataParallel::any(bool flag) { return all_reduce_value<int64_t>(*dp_, comm(), flag ? 1 : 0, ReduceOp::kMax) != 0; }

double DataParallel::grad_norm() {
  if (fsdp_) return std::sqrt(sum(fsdp_->local_grad_sum_squares()));
  const Tensor grads = params_.flat_grads();
  // Reduced full gradients are identical on every rank, so the local norm is the global one.
  if (!sharded()) return std::sqrt(ops::sum_squares(grads));
  double local = 0.0;
  for (const FlatRange& r : optimizer_ranges()) local += ops::sum_squares(grads.slice_elements(r.begin, {r.size()}));
  return std::sqrt(sum(local));
}

void DataParallel::after_optimizer() {
  if (fsdp_) {
    fsdp_->after_optimizer();
    return;
  }
  if (!sharded()) return;
  Tensor flat = params_.flat_params();
  reducer_->all_gather_shards(flat);
}

}  // namespace primus
