#include "layers/rope_table.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace primus {

std::vector<double> rope_inverse_frequencies(int64_t head_dim, const RopeConfig& config) {
  PRIMUS_CHECK(head_dim % 2 == 0, "RoPE needs an even head dim, got {}", head_dim);
  std::vector<double> inv_freq(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    // HF computes the exponent in float32 (arange(0, D, 2).float() / D); the ratio is exact in float.
    inv_freq[i] = 1.0 / std::pow(config.theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  }
  if (config.yarn.enabled) {
    const YarnConfig& y = config.yarn;
    // The (fractional) index i at which frequency i turns `rotations` times over the original context.
    auto index_of = [&](double rotations) {
      return static_cast<double>(head_dim) *
             std::log(static_cast<double>(y.original_max_position) / (rotations * 2.0 * M_PI)) /
             (2.0 * std::log(config.theta));
    };
    const double low = std::max(std::floor(index_of(y.beta_fast)), 0.0);
    const double high = std::min(std::ceil(index_of(y.beta_slow)), static_cast<double>(head_dim - 1));
    const double span = high == low ? 0.001 : high - low;  // a step, not a division by zero
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      // 0 below `low` (fast: kept), 1 above `high` (slow: interpolated).
      const double ramp = std::clamp((static_cast<double>(i) - low) / span, 0.0, 1.0);
      inv_freq[i] = ramp * inv_freq[i] / y.factor + (1.0 - ramp) * inv_freq[i];
    }
    return inv_freq;
  }
  if (!config.use_scaling) return inv_freq;
  // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
  const double orig = static_cast<double>(config.original_max_position);
  const double low_freq_wavelen = orig / config.low_freq_factor;
  const double high_freq_wavelen = orig / config.high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen > low_freq_wavelen) {
      f = f / config.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (orig / wavelen - config.low_freq_factor) / (config.high_freq_factor - config.low_freq_factor);
      f = (1.0 - smooth) * f / config.factor + smooth * f;
    }
  }
  return inv_freq;
}

double yarn_mscale(double factor, double x) { return factor <= 1.0 ? 1.0 : 0.1 * x * std::log(factor) + 1.0; }

double yarn_softmax_scale_factor(const RopeConfig& config) {
  if (!config.yarn.enabled) return 1.0;
  const double m = yarn_mscale(config.yarn.factor, config.yarn.mscale_all_dim);
  return m * m;
}

RopeTable make_rope_table(int64_t head_dim, int64_t seq_len, const RopeConfig& config) {
  std::vector<double> inv_freq = rope_inverse_frequencies(head_dim, config);
  const double magnitude = config.yarn.enabled ? yarn_mscale(config.yarn.factor, config.yarn.mscale) /
                                                     yarn_mscale(config.yarn.factor, config.yarn.mscale_all_dim)
                                               : 1.0;
  const int64_t half = head_dim / 2;
  RopeTable table{Tensor::empty({seq_len, half}, DType::kF32), Tensor::empty({seq_len, half}, DType::kF32)};
  for (int64_t t = 0; t < seq_len; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * inv_freq[i];
      table.cos.f32()[t * half + i] = static_cast<float>(magnitude * std::cos(angle));
      table.sin.f32()[t * half + i] = static_cast<float>(magnitude * std::sin(angle));
    }
  }
  return table;
}

}  // namespace primus
