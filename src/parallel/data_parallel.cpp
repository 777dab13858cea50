#include "parallel/data_parallel.h"

#include <cmath>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/profile.h"

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

}  // namespace

DataParallel::DataParallel(std::shared_ptr<Communicator> dp, ParamStore& params, DataParallelOptions options)
    : dp_(std::move(dp)),
      params_(params),
      options_(options),
      reducer_(*dp_, params.flat_grads(), BucketLayout(params.numel(), options.bucket_size, dp_->size()),
               options.distributed_optimizer ? GradReducer::Mode::kReduceScatter : GradReducer::Mode::kAllReduce,
               options.overlap_grad_reduce) {
  PRIMUS_CHECK(params.flat_grads().device() == dp_->device(),
               "[ddp] gradients on {} but the data-parallel communicator ({}) works on {}",
               params.flat_grads().device().str(), dp_->backend_name(), dp_->device().str());
}

std::vector<FlatRange> DataParallel::optimizer_ranges() const {
  if (!sharded()) return {FlatRange{0, params_.numel()}};
  return reducer_.layout().owned(dp_->rank());
}

int64_t DataParallel::global_tokens(int64_t local_tokens) {
  return all_reduce_value<int64_t>(*dp_, local_tokens, ReduceOp::kSum);
}

void DataParallel::sum_losses(Tensor& loss_sum) { dp_->all_reduce(loss_sum, ReduceOp::kSum); }

double DataParallel::sum(double local) {
  return all_reduce_value<float>(*dp_, static_cast<float>(local), ReduceOp::kSum);
}

bool DataParallel::any(bool flag) { return all_reduce_value<int64_t>(*dp_, flag ? 1 : 0, ReduceOp::kMax) != 0; }

GradsReadyFn DataParallel::grads_ready_hook() {
  return [this](int64_t begin, int64_t end) { reducer_.grads_ready(begin, end); };
}

double DataParallel::grad_norm() {
  const Tensor grads = params_.flat_grads();
  // Reduced full gradients are identical on every rank, so the local norm is the global one.
  if (!sharded()) return std::sqrt(ops::sum_squares(grads));
  double local = 0.0;
  for (const FlatRange& r : optimizer_ranges()) local += ops::sum_squares(grads.slice_elements(r.begin, {r.size()}));
  return std::sqrt(sum(local));
}

void DataParallel::after_optimizer() {
  if (!sharded()) return;
  Tensor flat = params_.flat_params();
  reducer_.all_gather_shards(flat);
}

}  // namespace primus
