// Rotary-embedding angle tables (cos/sin per position and frequency), with Llama 3.1 or YaRN frequency scaling.
#pragma once

#include "core/tensor.h"

namespace primus {

// YaRN (Peng et al. 2023; DeepSeek-V2/V3's rope_scaling "yarn", Megatron's yarn_rotary_pos_embedding): with r(i) the
// turns frequency i makes over the original context, r = original_max_position · inv_freq / 2π, frequencies with
// r > beta_fast keep their value, those with r < beta_slow are divided by `factor`, and a linear ramp over the
// index range between blends the two. The tables are multiplied by m(mscale) / m(mscale_all_dim), and attention's
// softmax scale by m(mscale_all_dim)², with m(x) = 0.1 · x · ln(factor) + 1 (1 for factor ≤ 1).
struct YarnConfig {
  bool enabled = false;
  double factor = 40.0;
  int64_t original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.707;
  double mscale_all_dim = 0.707;
};

struct RopeConfig {
  double theta = 10000.0;
  bool use_scaling = false;  // Llama 3.1 "llama3" rope type
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
  YarnConfig yarn;
};

struct RopeTable {
  Tensor cos;  // [T, D/2]
  Tensor sin;  // [T, D/2]
};

// inv_freq[i] = theta^(-2i/D), rescaled per Llama 3.1 when use_scaling or per YaRN when yarn.enabled; in double.
std::vector<double> rope_inverse_frequencies(int64_t head_dim, const RopeConfig& config);
// m(x) of YaRN: 0.1 · x · ln(factor) + 1, or 1 for factor ≤ 1.
double yarn_mscale(double factor, double x);
// The factor YaRN multiplies attention's softmax scale by: m(mscale_all_dim)², or 1 without YaRN.
double yarn_softmax_scale_factor(const RopeConfig& config);
// On the host (angles in double; with YaRN the tables carry its mscale ratio); a device copy is the caller's.
RopeTable make_rope_table(int64_t head_dim, int64_t seq_len, const RopeConfig& config);

}  // namespace primus
