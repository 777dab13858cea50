// Rotary-embedding angle tables (cos/sin per position and frequency), with Llama 3.1 frequency scaling.
#pragma once

#include "core/tensor.h"

namespace primus {

struct RopeConfig {
  double theta = 10000.0;
  bool use_scaling = false;  // Llama 3.1 "llama3" rope type
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct RopeTable {
  Tensor cos;  // [T, D/2]
  Tensor sin;  // [T, D/2]
};

// inv_freq[i] = theta^(-2i/D), rescaled per Llama 3.1 when use_scaling; angles computed in double.
std::vector<double> rope_inverse_frequencies(int64_t head_dim, const RopeConfig& config);
// On the host; a device copy is the caller's.
RopeTable make_rope_table(int64_t head_dim, int64_t seq_len, const RopeConfig& config);

}  // namespace primus
