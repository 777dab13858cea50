// When the training loop does what besides the step: log, evaluate, save, profile. Megatron's intervals, read
// from TrainingArgs once, so the loop in pretrain.cpp reads as step → evaluate? → log? → save? → stop?.
#pragma once

#include <algorithm>
#include <cstdint>

#include "config/experiment.h"

namespace primus {

class RunSchedule {
 public:
  RunSchedule(const TrainingArgs& t, bool has_validation_data, bool profile_this_rank)
      : t_(t), evaluating_(has_validation_data && t.eval_interval > 0), profiling_(profile_this_rank) {}

  // A metrics record and console line: every log_interval steps and at the last step.
  bool log_at(int64_t step) const { return step % t_.log_interval == 0 || last(step); }
  // Evaluation on the validation split: every eval_interval steps and at the last step.
  bool eval_at(int64_t step) const { return evaluating_ && (step % t_.eval_interval == 0 || last(step)); }
  // A checkpoint every save_interval steps; the last step always saves (after the loop).
  bool save_at(int64_t step) const { return t_.save_interval > 0 && step % t_.save_interval == 0 && !last(step); }
  // Steps traced into the profile: [profile_step_start, profile_step_end) on the ranks of profile_ranks.
  bool profile_at(int64_t step) const {
    return profiling_ && step >= t_.profile_step_start && step < t_.profile_step_end;
  }
  // The trace is written after this step.
  bool profile_ends_after(int64_t step) const { return step + 1 >= t_.profile_step_end; }
  bool last(int64_t step) const { return step == t_.train_iters; }

 private:
  const TrainingArgs& t_;
  bool evaluating_;
  bool profiling_;
};

}  // namespace primus
