// Notices steps that take much longer than usual (an input pipeline that stalls, a throttling GPU, and once
// there are several ranks, a straggler) and says so in the log, naming the rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace primus {

class SlowStepMonitor {
 public:
  explicit SlowStepMonitor(int64_t rank, size_t window = 20, double factor = 2.0);

  // Records a step's wall time. When a full window of earlier steps exists and `ms` exceeds factor × their
  // median, logs a warning and returns true.
  bool add(int64_t step, double ms);

 private:
  int64_t rank_;
  size_t window_;
  double factor_;
  std::deque<double> recent_;
};

}  // namespace primus
