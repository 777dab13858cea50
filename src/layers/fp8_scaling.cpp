#include "layers/fp8_scaling.h"

#include <map>

#include "core/error.h"
#include "ops/fp8_ops.h"
#include "ops/ops.h"

namespace primus {

Fp8Scaling::Fp8Scaling(const Fp8Recipe& recipe, Device device) : recipe_(recipe), device_(device) {
  PRIMUS_CHECK(recipe.amax_history_len >= 1, "[fp8] amax history length {} < 1", recipe.amax_history_len);
  groups_.resize(2);
  groups_[0].format = recipe.forward_format;
  groups_[1].format = recipe.backward_format;
  non_finite_ = ops::zeros({1}, DType::kI32, device);
}

int Fp8Scaling::add_tensor(const std::string& name, Fp8Role role) {
  PRIMUS_CHECK(recipe_.scaling == Fp8Recipe::Scaling::kDelayed, "[fp8] {}: only the delayed recipe keeps state", name);
  PRIMUS_CHECK(!allocated_, "[fp8] {} added after the first step", name);
  const int group = role == Fp8Role::kGradOutput ? 1 : 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].name != name) continue;
    PRIMUS_CHECK(entries_[i].group == group, "[fp8] {} added again in another format", name);
    return static_cast<int>(i);
  }
  entries_.push_back(Entry{name, group, groups_[group].count++, role});
  return static_cast<int>(entries_.size()) - 1;
}

void Fp8Scaling::allocate() {
  if (allocated_) return;
  allocated_ = true;
  for (Group& g : groups_) {
    if (g.count == 0) continue;
    g.history = ops::zeros({recipe_.amax_history_len, g.count}, DType::kF32, device_);
    g.step_amax = ops::zeros({1, g.count}, DType::kF32, device_);
    g.scale = Tensor::empty({1, g.count}, DType::kF32, device_);
    ops::fill(g.scale, 1.0f);
    g.scale_inv = Tensor::empty({1, g.count}, DType::kF32, device_);
    ops::fill(g.scale_inv, 1.0f);
  }
}

Fp8Scaling::Group& Fp8Scaling::group_of(int handle) {
  PRIMUS_CHECK(handle >= 0 && handle < static_cast<int>(entries_.size()), "[fp8] no tensor {}", handle);
  allocate();
  return groups_[entries_[handle].group];
}

const Fp8Scaling::Group& Fp8Scaling::group_of(int handle) const {
  PRIMUS_CHECK(handle >= 0 && handle < static_cast<int>(entries_.size()) && allocated_,
               "[fp8] no tensor {} (or no step yet)", handle);
  return groups_[entries_[handle].group];
}

Tensor Fp8Scaling::scale(int handle) const {
  return group_of(handle).scale.slice_elements(entries_[handle].column, {1, 1});
}

Tensor Fp8Scaling::scale_inv(int handle) const {
  return group_of(handle).scale_inv.slice_elements(entries_[handle].column, {1, 1});
}

void Fp8Scaling::record_amax(int handle, const Tensor& x) {
  if (inputs_paused_ && entries_[handle].role == Fp8Role::kInput) return;
  Group& g = group_of(handle);
  Tensor slot = g.step_amax.slice_elements(entries_[handle].column, {1, 1});
  ops::fp8_amax(x, Fp8Tiling{}, slot, /*transposed=*/false, /*accumulate=*/true);
}

void Fp8Scaling::end_step(const std::function<void(Tensor&)>& reduce_max) {
  ++weights_generation_;
  if (recipe_.scaling != Fp8Recipe::Scaling::kDelayed || entries_.empty()) return;
  allocate();
  for (Group& g : groups_) {
    if (g.count == 0) continue;
    // The step's slot, row `head_` of the history: each tensor's max over its micro-batches.
    Tensor slot_row = g.history.slice_elements(head_ * g.count, {1, g.count});
    ops::copy(slot_row, g.step_amax);
    if (reduce_max) reduce_max(slot_row);
    Tensor window_amax = slot_row;
    if (recipe_.amax_algo == Fp8AmaxAlgo::kMax) {
      window_amax = Tensor::empty({1, g.count}, DType::kF32, device_);
      ops::fp8_amax(g.history, Fp8Tiling{.rows = 0, .cols = 1}, window_amax);  // per column, over every step kept
    }
    ops::fp8_scale(window_amax, g.format,
                   Fp8ScaleOptions{.margin = recipe_.margin, .power_of_two = false, .keep_previous = true}, g.scale,
                   g.scale_inv, non_finite_);
    ops::zero(g.step_amax);
  }
  head_ = (head_ + 1) % recipe_.amax_history_len;  // the oldest step's row becomes the new step's
  for (Group& g : groups_) {
    if (g.count == 0) continue;
    Tensor slot = g.history.slice_elements(head_ * g.count, {1, g.count});
    ops::zero(slot);
  }
}

int64_t Fp8Scaling::take_non_finite() {
  const Tensor host = ops::to_device(non_finite_, kCpuDevice);
  const int64_t count = host.i32()[0];
  if (count != 0) ops::zero(non_finite_);
  return count;
}

std::vector<Fp8ScalingRecord> Fp8Scaling::records() const {
  std::vector<Fp8ScalingRecord> out;
  if (entries_.empty()) return out;
  std::vector<Tensor> history(groups_.size()), scale(groups_.size());
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (groups_[k].count == 0 || !allocated_) continue;
    history[k] = ops::to_device(groups_[k].history, kCpuDevice);
    scale[k] = ops::to_device(groups_[k].scale, kCpuDevice);
  }
  const int64_t len = recipe_.amax_history_len;
  for (const Entry& e : entries_) {
    Fp8ScalingRecord r{.name = e.name, .amax_history = std::vector<float>(static_cast<size_t>(len), 0.0f)};
    if (allocated_) {
      const int64_t n = groups_[e.group].count;
      for (int64_t k = 0; k < len; ++k) {
        r.amax_history[static_cast<size_t>(k)] = history[e.group].f32()[((head_ - k + len) % len) * n + e.column];
      }
      r.scale = scale[e.group].f32()[e.column];
    }
    out.push_back(std::move(r));
  }
  return out;
}

void Fp8Scaling::restore(const std::vector<Fp8ScalingRecord>& records, bool others_allowed) {
  ++weights_generation_;
  if (!others_allowed && records.size() != entries_.size()) {
    throw RuntimeError(fmt::format("[fp8] the checkpoint holds the scaling state of {} tensors, the model quantises {}",
                                   records.size(), entries_.size()));
  }
  std::map<std::string, const Fp8ScalingRecord*> by_name;
  for (const Fp8ScalingRecord& r : records) by_name[r.name] = &r;
  allocate();
  const int64_t len = recipe_.amax_history_len;
  std::vector<Tensor> history(groups_.size()), scale(groups_.size()), scale_inv(groups_.size());
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (groups_[k].count == 0) continue;
    history[k] = Tensor::zeros(groups_[k].history.shape(), DType::kF32);
    scale[k] = Tensor::zeros(groups_[k].scale.shape(), DType::kF32);
    scale_inv[k] = Tensor::zeros(groups_[k].scale.shape(), DType::kF32);
  }
  for (const Entry& e : entries_) {
    const auto found = by_name.find(e.name);
    if (found == by_name.end()) {
      throw RuntimeError(fmt::format("[fp8] the checkpoint holds no scaling state for {} (another model?)", e.name));
    }
    const Fp8ScalingRecord& r = *found->second;
    if (static_cast<int64_t>(r.amax_history.size()) != len) {
      throw RuntimeError(fmt::format("[fp8] {}: the checkpoint's amax history holds {} steps but fp8_amax_history_len "
                                     "is {}; resume with the checkpoint's length",
                                     r.name, r.amax_history.size(), len));
    }
    const int64_t n = groups_[e.group].count;
    for (int64_t k = 0; k < len; ++k) {  // the step in progress in row 0, k steps back in row -k
      history[e.group].f32()[((len - k) % len) * n + e.column] = r.amax_history[static_cast<size_t>(k)];
    }
    scale[e.group].f32()[e.column] = r.scale;
    scale_inv[e.group].f32()[e.column] = 1.0f / r.scale;  // as fp8_scale forms it
  }
  head_ = 0;
  for (size_t k = 0; k < groups_.size(); ++k) {
    if (groups_[k].count == 0) continue;
    ops::copy(groups_[k].history, ops::to_device(history[k], device_));
    ops::copy(groups_[k].scale, ops::to_device(scale[k], device_));
    ops::copy(groups_[k].scale_inv, ops::to_device(scale_inv[k], device_));
    ops::zero(groups_[k].step_amax);
  }
}

}  // namespace primus
