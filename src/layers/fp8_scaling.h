// How the fp8 GEMMs of a model's Linear modules are scaled (docs/fp8.md): the recipe, and the delayed recipe's state
// of every tensor it quantises (input, weight and output gradient of each module), kept on the device so that no
// step waits for the host to read an amax.
//
// Delayed scaling keeps, per format, one history buffer [len, n] for its n tensors: row `head` is the step in
// progress, each tensor's column its window (core/fp8_amax_history.h is the host model of one column, and the test
// of this one). A quantisation records its tensor's amax into the step's slot, the max over micro-batches (and over
// a recomputed forward, which sees the same input). end_step() combines the slots over the data-parallel ranks
// (each saw other micro-batches), takes each window's amax (max or most_recent), derives the next step's scales from
// it and moves the window on.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/fp8.h"
#include "core/fp8_amax_history.h"
#include "core/tensor.h"
#include "layers/tensor_parallel.h"

namespace primus {

struct Fp8Recipe {
  enum class Scaling : uint8_t { kTensorwise, kDelayed, kBlockwise };
  Scaling scaling = Scaling::kDelayed;
  Fp8Format forward_format = Fp8Format::kE4M3;   // inputs and weights
  Fp8Format backward_format = Fp8Format::kE4M3;  // output gradients: e5m2 with fp8_format hybrid
  int margin = 0;                                // delayed: scales / 2^margin
  int64_t amax_history_len = 1;                  // delayed
  Fp8AmaxAlgo amax_algo = Fp8AmaxAlgo::kMostRecent;
};

// What a quantised tensor is to its GEMMs: its format and, in the blockwise recipe, its tiles.
enum class Fp8Role : uint8_t { kInput, kWeight, kGradOutput };

// One tensor's delayed-scaling state as a checkpoint stores it: the window with the step in progress first, then the
// finished steps from the newest to the oldest (Fp8AmaxHistory::values' order), and the current scale.
struct Fp8ScalingRecord {
  std::string name;  // "model.layers.0.self_attn.q_proj.input" (.weight, .grad_output)
  std::vector<float> amax_history;
  float scale = 1.0f;
};

class Fp8Scaling {
 public:
  Fp8Scaling(const Fp8Recipe& recipe, Device device);

  const Fp8Recipe& recipe() const { return recipe_; }
  Device device() const { return device_; }
  Fp8Format format(Fp8Role role) const {
    return role == Fp8Role::kGradOutput ? recipe_.backward_format : recipe_.forward_format;
  }

  // Delayed recipe: a new tensor's slot, before the first step (its scale starts at 1 and its window at 0, as
  // Transformer Engine's). Returns its handle; a name added before (an input several modules read) returns the same.
  int add_tensor(const std::string& name, Fp8Role role);
  // The step's scale and 1/scale of tensor `handle` ([1, 1] views, valid until end_step writes the next ones).
  Tensor scale(int handle) const;
  Tensor scale_inv(int handle) const;
  // The step's slot of `handle` ← max(slot, amax of x [R, C]); for an input, nothing while inputs are paused.
  void record_amax(int handle, const Tensor& x);
  // Evaluation's forwards run with the inputs' recording paused: evaluating must not change how the run trains (a
  // run resumed from a checkpoint written after an evaluation would otherwise scale its next step differently). The
  // weights' amaxes are still recorded: their codes made there serve the next training step.
  void pause_input_recording(bool paused) { inputs_paused_ = paused; }

  // Current scaling (tensorwise) under tensor or context parallelism: a tensor's slices or rows lie on the ranks of
  // these groups, so each whole-tensor amax is maxed over them before its scale is formed (a tensor every rank holds
  // whole gives the same max), and every rank scales as one rank holding the whole tensor would.
  void combine_current_amaxes_over(std::vector<TensorParallelGroup> groups) { amax_groups_ = std::move(groups); }
  // x's whole-tensor amax [1, 1], made whole over those groups in place. Collective over them.
  void combine_current_amax(Tensor& amax) const {
    for (const TensorParallelGroup& g : amax_groups_) g.max(amax);
  }

  // The end of an optimizer step: every slot combined by `reduce_max` (an in-place max over the ranks holding parts
  // of the same tensors; null: none), then the next step's scales and the window moved on. Collective when
  // reduce_max is.
  void end_step(const std::function<void(Tensor&)>& reduce_max);
  // Moves on at every end_step (which follows the optimizer's step) and restore: the weights' codes made before
  // are stale (the weights or their scales changed). Any recipe.
  uint64_t weights_generation() const { return weights_generation_; }

  // Tiles whose amax was NaN or ±inf since the last call (a scale kept its previous value, or became 1 under current
  // scaling), then zeroed. Reads the device: call where the step is waited for anyway.
  int64_t take_non_finite();
  // The [1] i32 counter fp8_scale adds to.
  Tensor& non_finite() { return non_finite_; }

  // Checkpoints: every delayed tensor's window and scale, and their restoration, each tensor's record found by name
  // (every tensor needs one and the window lengths must match: RuntimeError naming the first that does not). Records
  // of tensors this state does not hold are refused, unless `others_allowed` (a pipeline stage's among every stage's).
  std::vector<Fp8ScalingRecord> records() const;
  void restore(const std::vector<Fp8ScalingRecord>& records, bool others_allowed = false);
  int64_t tensor_count() const { return static_cast<int64_t>(entries_.size()); }

 private:
  // The tensors of one format: history [len, n], the step's amaxes so far [1, n], scale and scale_inv [1, n].
  // Allocated at the first record or end_step.
  struct Group {
    Fp8Format format = Fp8Format::kE4M3;
    int64_t count = 0;
    Tensor history, step_amax, scale, scale_inv;
  };
  struct Entry {
    std::string name;
    int group = 0;
    int64_t column = 0;
    Fp8Role role = Fp8Role::kInput;
  };
  Group& group_of(int handle);
  const Group& group_of(int handle) const;
  void allocate();

  Fp8Recipe recipe_;
  Device device_;
  std::vector<Group> groups_;  // [0] forward format, [1] backward format
  std::vector<Entry> entries_;
  int64_t head_ = 0;           // the history row of the step in progress
  bool allocated_ = false;
  bool inputs_paused_ = false;
  std::vector<TensorParallelGroup> amax_groups_;
  uint64_t weights_generation_ = 0;
  Tensor non_finite_;          // [1] i32
};

}  // namespace primus
