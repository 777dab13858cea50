// A host copy of what a rank saves, taken between two steps so that a background thread can write it while
// training changes the originals (async_save): the fp32 weights and both AdamW moments of the rank's ranges.
// The host buffer is page-locked when the state lives on a GPU, so the copy runs at the bus's speed, and it is
// kept for the next save (pinning gigabytes takes seconds, paid once).
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"

namespace primus {

class CheckpointSnapshot {
 public:
  CheckpointSnapshot() = default;
  ~CheckpointSnapshot();
  CheckpointSnapshot(const CheckpointSnapshot&) = delete;
  CheckpointSnapshot& operator=(const CheckpointSnapshot&) = delete;

  // Allocates (and pins for `device`) the host buffer for `ranges` ahead of the first take().
  void reserve(const std::vector<FlatRange>& ranges, Device device);
  // Copies the state of `ranges` from wherever it lives; returns once the copy is complete. The state's device
  // work must be done or queued on its compute stream (the copy waits for it).
  void take(const std::vector<FlatRange>& ranges, const SavedState& live, Device device);
  // Views into the host copy, valid until the next take(). Asking for elements outside the ranges throws.
  SavedState state() const;
  int64_t bytes() const { return static_cast<int64_t>(host_.nbytes()); }

 private:
  // Host views of elements [begin, end) of row `row` (0 weights, 1 exp_avg, 2 exp_avg_sq).
  std::vector<Tensor> views(int row, int64_t begin, int64_t end) const;
  void unpin();

  Tensor host_;                      // [3, n] f32: each row the rank's ranges concatenated in flat order
  std::vector<FlatRange> ranges_;    // sorted by begin
  std::vector<int64_t> starts_;      // where each range starts within a row
  int64_t row_ = 0;                  // n
  Device pinned_for_ = kCpuDevice;
  bool pinned_ = false;
};

}  // namespace primus
