#include "optim/lr_schedule.h"

#include <cmath>

#include "core/error.h"

namespace primus {

double LrSchedule::at(int64_t step) const {
  if (warmup_iters > 0 && step <= warmup_iters) {
    return max_lr * static_cast<double>(step) / static_cast<double>(warmup_iters);
  }
  if (style == "constant") return max_lr;
  if (step >= decay_iters) return min_lr;
  const double ratio = static_cast<double>(step - warmup_iters) / static_cast<double>(decay_iters - warmup_iters);
  double coeff = 0.0;
  if (style == "linear") {
    coeff = 1.0 - ratio;
  } else if (style == "cosine") {
    coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0);
  } else {
    throw UsageError(fmt::format("lr_decay_style '{}' is not one of constant, linear, cosine", style));
  }
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace primus
