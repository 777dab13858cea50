#include "parallel/tensor_parallel_grads.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

namespace {

// The views of held_grads that lie in `ranges`, in held order then range order.
std::vector<Tensor> held_parts(const std::vector<FlatRange>& ranges, const std::vector<FlatRange>& held,
                               const std::vector<Tensor>& held_grads) {
  std::vector<Tensor> parts;
  for (size_t i = 0; i < held.size(); ++i) {
    for (const FlatRange& r : ranges) {
      const int64_t lo = std::max(r.begin, held[i].begin), hi = std::min(r.end, held[i].end);
      if (lo < hi) parts.push_back(held_grads[i].slice_elements(lo - held[i].begin, {hi - lo}));
    }
  }
  return parts;
}

int64_t total(const std::vector<Tensor>& parts) {
  int64_t n = 0;
  for (const Tensor& t : parts) n += t.numel();
  return n;
}

}  // namespace

void sum_tensor_parallel_grads(Communicator& tp, const TensorParallelGradSums& sums,
                               const std::vector<FlatRange>& held, const std::vector<Tensor>& held_grads) {
  PRIMUS_CHECK(held.size() == held_grads.size(), "[tensor parallel] {} held ranges, {} gradient buffers", held.size(),
               held_grads.size());
  PRIMUS_CHECK(sums.shared_slots >= 1 && sums.shared_slot >= 0 && sums.shared_slot < sums.shared_slots,
               "[tensor parallel] key/value slot {} of {}", sums.shared_slot, sums.shared_slots);
  if (tp.size() == 1 || sums.empty()) return;
  const std::vector<Tensor> group = held_parts(sums.group, held, held_grads);
  const std::vector<Tensor> shared = held_parts(sums.shared, held, held_grads);
  const int64_t group_n = total(group), slot_n = total(shared);
  const int64_t n = group_n + sums.shared_slots * slot_n;
  if (n == 0) return;  // every rank of the group holds the same ranges: all return here together
  const ops::ProfileScope scope("tensor parallel: sum of partial gradients");
  const Device device = tp.device();
  Tensor packed = slot_n > 0 ? ops::zeros({n}, DType::kF32, device) : Tensor::empty({n}, DType::kF32, device);
  // Pack (or, with `back`, unpack) parts back to back from `at`.
  auto copy_parts = [&](const std::vector<Tensor>& parts, int64_t at, bool back) {
    for (const Tensor& part : parts) {
      Tensor window = packed.slice_elements(at, {part.numel()});
      if (back) {
        Tensor dst = part;
        ops::copy(dst, window);
      } else {
        ops::copy(window, part);
      }
      at += part.numel();
    }
  };
  const int64_t own_slot = group_n + sums.shared_slot * slot_n;
  copy_parts(group, 0, false);
  copy_parts(shared, own_slot, false);
  tp.all_reduce(packed, ReduceOp::kSum, backend_for(device).stream(StreamKind::kCompute));
  copy_parts(group, 0, true);
  copy_parts(shared, own_slot, true);
}

}  // namespace primus
