// numpy's random_interval (legacy RandomState path).
#include "data/numpy_rng.h"

namespace primus {

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xFFFFFFFFull) {
    while ((value = (next_u32() & mask)) > max) {
    }
  } else {
    while ((value = (next_u64() & mask)) > max) {
    }
  }
  return value;
}

}  // namespace primus
