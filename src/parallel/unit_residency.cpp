#include "parallel/unit_residency.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

UnitResidency::UnitResidency(ParamStore& params, std::vector<FlatRange> units,
                             const std::vector<FlatRange>& expert_weights, DType compute_dtype)
    : params_(params), units_(std::move(units)), compute_dtype_(compute_dtype) {
  PRIMUS_CHECK(!units_.empty(), "[residency] a model without parameter units");
  const Device device = params.flat_params().device();
  int64_t expected_begin = 0;
  size_t next_expert = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const FlatRange unit = units_[u];
    PRIMUS_CHECK(unit.begin == expected_begin && !unit.empty(),
                 "[residency] units must tile the flat buffers: [{}, {}) after {}", unit.begin, unit.end,
                 expected_begin);
    expected_begin = unit.end;
    // The unit cut at its expert weight ranges: the parts between them are pieces too.
    int64_t at = unit.begin;
    auto add = [&](FlatRange range, bool expert) {
      if (range.empty()) return;
      ranges_.push_back(range);
      Piece piece;
      piece.unit = u;
      piece.expert = expert;
      piece.compute = mixed() ? Tensor::unallocated({range.size()}, compute_dtype_, device)
                              : params.flat_params().slice_elements(range.begin, {range.size()});
      piece.grads = Tensor::unallocated({range.size()}, DType::kF32, device);
      pieces_.push_back(std::move(piece));
    };
    for (; next_expert < expert_weights.size() && expert_weights[next_expert].begin < unit.end; ++next_expert) {
      const FlatRange expert = expert_weights[next_expert];
      PRIMUS_CHECK(expert.begin >= at && expert.end <= unit.end && !expert.empty(),
                   "[residency] expert weights [{}, {}) do not lie in unit {} [{}, {}) after {}", expert.begin,
                   expert.end, u, unit.begin, unit.end, at);
      add({at, expert.begin}, false);
      add(expert, true);
      at = expert.end;
    }
    add({at, unit.end}, false);
  }
  PRIMUS_CHECK(expected_begin == params.numel() && next_expert == expert_weights.size(),
               "[residency] units cover [0, {}) of {} parameters; {} of {} expert ranges placed", expected_begin,
               params.numel(), next_expert, expert_weights.size());
  // The update's order, from the smallest piece (see the header).
  update_order_.resize(pieces_.size());
  std::iota(update_order_.begin(), update_order_.end(), size_t{0});
  std::stable_sort(update_order_.begin(), update_order_.end(),
                   [&](size_t a, size_t b) { return ranges_[a].size() < ranges_[b].size(); });
  // At once, before the optimizer allocates its moments: the flat gradients are never used again.
  params.flat_grads().release_storage();
}

UnitBuffers UnitResidency::take_buffers() {
  PRIMUS_CHECK(!taken_, "[residency] the buffers were taken already");
  taken_ = true;
  UnitBuffers buffers;
  buffers.ranges = ranges_;
  for (const Piece& piece : pieces_) {
    buffers.compute.push_back(piece.compute);
    buffers.grads.push_back(piece.grads);
  }
  return buffers;
}

void UnitResidency::begin_step() {
  PRIMUS_CHECK(taken_, "[residency] a step before take_buffers()");
  // A step that stopped before its update left gradients behind: this one starts from zero.
  for (Piece& piece : pieces_) {
    if (piece.grads.resident()) piece.grads.release_storage();
  }
  in_step_ = true;
  last_backward_ = false;
}

void UnitResidency::before_step_backward(bool last) { last_backward_ = last; }

void UnitResidency::ensure_grads(Piece& piece) {
  if (piece.grads.resident()) return;
  piece.grads.materialize_storage();
  ops::zero(piece.grads);
}

void UnitResidency::ensure_compute(size_t i) {
  Piece& piece = pieces_[i];
  if (piece.compute.resident()) return;
  piece.compute.materialize_storage();
  ops::cast(piece.compute, params_.flat_params().slice_elements(ranges_[i].begin, {ranges_[i].size()}));
}

void UnitResidency::before_forward(size_t unit) {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (pieces_[i].unit != unit) continue;
    ensure_compute(i);
    if (in_step_ && outer(unit)) ensure_grads(pieces_[i]);
  }
}

void UnitResidency::before_backward(size_t unit) {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (pieces_[i].unit != unit) continue;
    ensure_compute(i);
    if (!pieces_[i].expert) ensure_grads(pieces_[i]);
  }
}

void UnitResidency::after_backward(size_t unit) {
  if (!mixed() || !last_backward_) return;
  for (Piece& piece : pieces_) {
    if (piece.unit == unit && piece.compute.resident()) piece.compute.release_storage();
  }
}

size_t UnitResidency::piece_of(const Tensor& view, bool grads) const {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if ((grads ? pieces_[i].grads : pieces_[i].compute).shares_storage(view)) return i;
  }
  PRIMUS_CHECK(false, "[residency] {} {} is not a view of any piece", grads ? "gradient" : "weight", view.describe());
  return 0;
}

void UnitResidency::weights_read(const Tensor& weights) {
  if (!mixed() || !last_backward_) return;
  const size_t i = piece_of(weights, false);
  // Only a piece the weights fill: a larger one holds others, read later.
  if (weights.numel() == ranges_[i].size() && pieces_[i].compute.resident()) pieces_[i].compute.release_storage();
}

void UnitResidency::grads_to_write(const Tensor& grads) { ensure_grads(pieces_[piece_of(grads, true)]); }

double UnitResidency::grad_sum_squares() const {
  double total = 0.0;
  for (const Piece& piece : pieces_) {
    if (piece.grads.resident()) total += ops::sum_squares(piece.grads);
  }
  return total;
}

void UnitResidency::update_pieces(const UpdateFn& update) {
  const ops::ProfileScope scope("residency: update by pieces");
  for (size_t i : update_order_) {
    Piece& piece = pieces_[i];
    ensure_grads(piece);  // no backward wrote it: a zero gradient
    if (mixed() && !piece.compute.resident()) piece.compute.materialize_storage();  // the update writes all of it
    update(ranges_[i], piece.grads, mixed() ? piece.compute : Tensor());
    piece.grads.release_storage();
  }
  in_step_ = false;
  last_backward_ = false;
}

}  // namespace primus
