#include "checkpoint/checkpoint_snapshot.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"

namespace primus {

CheckpointSnapshot::~CheckpointSnapshot() { unpin(); }

void CheckpointSnapshot::unpin() {
  if (pinned_) ops::unpin_host(pinned_for_, host_.data());
  pinned_ = false;
}

void CheckpointSnapshot::reserve(const std::vector<FlatRange>& ranges, Device device) {
  std::vector<FlatRange> sorted = ranges;
  std::erase_if(sorted, [](const FlatRange& r) { return r.empty(); });
  std::sort(sorted.begin(), sorted.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  int64_t n = 0;
  std::vector<int64_t> starts;
  for (const FlatRange& r : sorted) {
    starts.push_back(n);
    n += r.size();
  }
  ranges_ = std::move(sorted);
  starts_ = std::move(starts);
  if (host_.defined() && row_ == n && (device.is_cpu() || (pinned_ && pinned_for_ == device))) return;
  unpin();
  row_ = n;
  host_ = Tensor::empty({3, std::max<int64_t>(n, 1)}, DType::kF32);
  if (!device.is_cpu()) {
    ops::pin_host(device, host_.data(), host_.nbytes());
    pinned_for_ = device;
    pinned_ = true;
  }
}

void CheckpointSnapshot::take(const std::vector<FlatRange>& ranges, const SavedState& live, Device device) {
  reserve(ranges, device);
  const Tensor flat = host_.reshape({host_.numel()});
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const FlatRange r = ranges_[i];
    for (int row = 0; row < 3; ++row) {
      const std::vector<Tensor> sources =
          row == 0 ? live.weights(r.begin, r.end) : live.moments(row == 2, r.begin, r.end);
      int64_t at = row * row_ + starts_[i];
      for (const Tensor& source : sources) {
        Tensor target = flat.slice_elements(at, {source.numel()});
        ops::copy(target, source);
        at += source.numel();
      }
    }
  }
}

std::vector<Tensor> CheckpointSnapshot::views(int row, int64_t begin, int64_t end) const {
  std::vector<Tensor> out;
  const Tensor flat = host_.reshape({host_.numel()});
  int64_t pos = begin;
  for (size_t i = 0; i < ranges_.size() && pos < end; ++i) {
    const FlatRange r = ranges_[i];
    if (r.end <= pos) continue;
    if (r.begin > pos) break;
    const int64_t stop = std::min(end, r.end);
    out.push_back(flat.slice_elements(row * row_ + starts_[i] + (pos - r.begin), {stop - pos}));
    pos = stop;
  }
  if (pos < end) {
    throw RuntimeError(fmt::format("[checkpoint] the snapshot does not hold flat element {} (asked for [{}, {}))", pos,
                                   begin, end));
  }
  return out;
}

SavedState CheckpointSnapshot::state() const {
  return SavedState{.weights = [this](int64_t begin, int64_t end) { return views(0, begin, end); },
                    .moments = [this](bool second, int64_t begin, int64_t end) {
                      return views(second ? 2 : 1, begin, end);
                    }};
}

}  // namespace primus
