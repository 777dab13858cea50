// A sample source of given token lists, for tests that need exact sample contents (packed documents).
#pragma once

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "data/samples.h"

namespace primus::testing {

// Sample i is samples[i mod n]; each holds seq_length + 1 ids.
class FixedSamples final : public SampleSource {
 public:
  explicit FixedSamples(std::vector<std::vector<int32_t>> samples) : samples_(std::move(samples)) {
    PRIMUS_CHECK(!samples_.empty() && samples_[0].size() >= 2, "FixedSamples needs samples of >= 2 ids");
    for (const auto& s : samples_) PRIMUS_CHECK(s.size() == samples_[0].size(), "FixedSamples of unequal lengths");
  }
  void read_sample(int64_t index, std::span<int32_t> out) const override {
    const std::vector<int32_t>& s = samples_[static_cast<size_t>(index) % samples_.size()];
    PRIMUS_CHECK(out.size() == s.size(), "FixedSamples: buffer of {} ids for samples of {}", out.size(), s.size());
    std::copy(s.begin(), s.end(), out.begin());
  }
  int64_t samples_per_epoch() const override { return static_cast<int64_t>(samples_.size()); }
  int64_t seq_length() const override { return static_cast<int64_t>(samples_[0].size()) - 1; }

 private:
  std::vector<std::vector<int32_t>> samples_;
};

}  // namespace primus::testing
