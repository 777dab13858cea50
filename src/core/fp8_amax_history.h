// The delayed-scaling recipe's amax history of one tensor (Megatron's fp8_amax_history_len and
// fp8_amax_compute_algo, Transformer Engine's DelayedScaling): a window of the last `length` steps' amaxes. The step in
// progress records into its slot (the max over its micro-batches); at the end of the step roll() gives the amax the
// next step's scale comes from (the max over the window, or the step just finished with most_recent) and moves the
// window on: the oldest step drops out and the new step's slot starts at 0. A NaN recorded stays in the window (and
// in what roll gives) until it drops out, so the caller sees and reports it; it is never clamped away.
// Host state; a device copy for kernels reading it follows with the fp8 GEMMs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace primus {

enum class Fp8AmaxAlgo : uint8_t { kMax, kMostRecent };

class Fp8AmaxHistory {
 public:
  // length ≥ 1 (Megatron's fp8_amax_history_len); throws UsageError otherwise.
  Fp8AmaxHistory(int64_t length, Fp8AmaxAlgo algo);
  // The step in progress: its slot ← max(slot, amax); a NaN sticks.
  void record(float amax);
  // The amax for the next step's scale, then the window moves on one step.
  float roll();
  // The window, the step in progress first, then the finished steps from the newest to the oldest (checkpoints).
  std::vector<float> values() const;
  // Sets the window from values() of a history of the same length (resuming); throws RuntimeError otherwise.
  void restore(const std::vector<float>& values);
  int64_t length() const { return static_cast<int64_t>(ring_.size()); }

 private:
  Fp8AmaxAlgo algo_;
  std::vector<float> ring_;  // [length]; ring_[head_] is the step in progress, ring_[head_ - k] k steps back
  size_t head_ = 0;
};

}  // namespace primus
