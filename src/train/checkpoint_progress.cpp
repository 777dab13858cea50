// One ProgressBar per checkpoint phase, created when the phase's first report arrives and finished with its
// last (done == total).
#include "train/checkpoint_progress.h"

#include <memory>
#include <string>

namespace primus {

namespace {

struct PhaseBars {
  ProgressOutput output;
  std::string phase;
  std::unique_ptr<ProgressBar> bar;
};

}  // namespace

CheckpointProgressFn checkpoint_progress_bars(ProgressOutput output) {
  if (output.stream == nullptr) return {};
  auto state = std::make_shared<PhaseBars>();
  state->output = std::move(output);
  return [state](const CheckpointProgress& progress) {
    if (!state->bar || state->phase != progress.phase) {
      state->phase = progress.phase;
      state->bar = std::make_unique<ProgressBar>(ProgressSpec{.label = "checkpoint " + state->phase,
                                                              .total = progress.total_bytes,
                                                              .unit = ProgressUnit::kBytes,
                                                              .show_after_s = 0.5,
                                                              .keep = false},
                                                 state->output);
    }
    state->bar->update(progress.done_bytes);
    if (progress.done_bytes >= progress.total_bytes) {
      state->bar->finish();
      state->bar.reset();
    }
  };
}

}  // namespace primus
