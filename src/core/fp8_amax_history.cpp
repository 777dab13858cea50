// The delayed recipe's amax window (fp8_amax_history.h).
#include "core/fp8_amax_history.h"


#include "core/error.h"

namespace primus {

namespace {

float max_keeping_nan(float m, float v) { return (v > m || v != v) && m == m ? v : m; }

}  // namespace

Fp8AmaxHistory::Fp8AmaxHistory(int64_t length, Fp8AmaxAlgo algo) : algo_(algo) {
  if (length < 1) throw UsageError(fmt::format("fp8_amax_history_len is {} but must be at least 1", length));
  ring_.assign(static_cast<size_t>(length), 0.0f);
}

void Fp8AmaxHistory::record(float amax) { ring_[head_] = max_keeping_nan(ring_[head_], amax); }

float Fp8AmaxHistory::roll() {
  float amax = ring_[head_];
  if (algo_ == Fp8AmaxAlgo::kMax) {
    for (const float v : ring_) amax = max_keeping_nan(amax, v);
  }
  head_ = (head_ + 1) % ring_.size();  // the oldest slot becomes the new step's
  ring_[head_] = 0.0f;
  return amax;
}

std::vector<float> Fp8AmaxHistory::values() const {
  std::vector<float> out;
  const size_t n = ring_.size();
  for (size_t k = 0; k < n; ++k) out.push_back(ring_[(head_ + n - k) % n]);
  return out;
}

void Fp8AmaxHistory::restore(const std::vector<float>& values) {
  if (values.size() != ring_.size()) {
    throw RuntimeError(fmt::format("[fp8] an amax history of {} steps cannot restore {} values (fp8_amax_history_len "
                                   "changed since the checkpoint?)",
                                   ring_.size(), values.size()));
  }
  head_ = 0;
  const size_t n = ring_.size();
  for (size_t k = 0; k < n; ++k) ring_[(n - k) % n] = values[k];
}

}  // namespace primus
