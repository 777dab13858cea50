// Learning-rate schedule as in Megatron-LM: linear warmup to `lr`, then constant, linear or cosine
// decay to `min_lr` at `decay_iters`, and `min_lr` after that.
#pragma once

#include <cstdint>
#include <string>

namespace primus {

struct LrSchedule {
  double max_lr = 0.0;
  double min_lr = 0.0;
  int64_t warmup_iters = 0;
  int64_t decay_iters = 0;
  std::string style = "cosine";  // constant | linear | cosine

  // Learning rate used by the update of 1-based iteration `step`. Warmup is max_lr·step/warmup, so the
  // first step already moves (Megatron's first step uses lr 0 when warming up; we do not waste it).
  double at(int64_t step) const;
};

}  // namespace primus
