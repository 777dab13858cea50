// numpy's legacy RandomState as far as Megatron's dataset indices use it: MT19937 seeded from an integer and
// RandomState.shuffle of a 1-D array, reproduced draw for draw so our sample order equals Megatron's.
//
// Facts pinned by tests against numpy itself (tests/unit/gpt_dataset_test.cpp):
// - RandomState(seed) with an integer seed in [0, 2^32) seeds MT19937 with init_genrand(seed) (the array
//   path init_by_array is only taken for array seeds), which is exactly std::mt19937(seed).
// - shuffle walks i = n-1 down to 1, swapping x[i] with x[j], j = random_interval(i): mask = i with every bit
//   below its highest set bit set; draw 32-bit outputs (64-bit ones, high word first, when i >= 2^32)
//   and keep the first that, masked, is <= i.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace primus {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  uint32_t next_u32() { return static_cast<uint32_t>(mt_()); }
  uint64_t next_u64() {
    uint64_t high = next_u32();
    return high << 32 | next_u32();
  }

  // Uniform integer in [0, max] by masked rejection, as numpy's random_interval.
  uint64_t random_interval(uint64_t max);

  // In-place Fisher–Yates shuffle with numpy's draw order.
  template <typename T>
  void shuffle(std::span<T> values) {
    for (size_t i = values.size() > 0 ? values.size() - 1 : 0; i > 0; --i) {
      size_t j = static_cast<size_t>(random_interval(i));
      std::swap(values[i], values[j]);
    }
  }

 private:
  std::mt19937 mt_;
};

}  // namespace primus
