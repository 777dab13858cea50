#include "train/step_monitor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

namespace primus {

SlowStepMonitor::SlowStepMonitor(int64_t rank, size_t window, double factor)
    : rank_(rank), window_(std::max<size_t>(window, 1)), factor_(factor) {}

bool SlowStepMonitor::add(int64_t step, double ms) {
  bool slow = false;
  if (recent_.size() == window_) {
    std::vector<double> sorted(recent_.begin(), recent_.end());
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
    const double median = sorted[sorted.size() / 2];
    if (ms > factor_ * median) {
      spdlog::warn("rank {}: iteration {} took {:.1f} ms, {:.1f}x the median {:.1f} ms of the previous {} iterations",
                   rank_, step, ms, ms / median, median, window_);
      slow = true;
    }
    recent_.pop_front();
  }
  recent_.push_back(ms);
  return slow;
}

}  // namespace primus
