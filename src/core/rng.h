// Counter-based random numbers: the whole state is (seed, counter), so it is trivially saved in a
// checkpoint and restored exactly. Streams derived from a seed with a label do not overlap in practice.
#pragma once

#include <cstdint>

namespace primus {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t counter = 0) : seed_(seed), counter_(counter) {}

  // A generator for a named purpose (e.g. "init", "data") that does not share outputs with others.
  static Rng derive(uint64_t seed, uint64_t purpose) { return Rng(mix(seed ^ mix(purpose + 0x9E3779B97F4A7C15ull))); }

  uint64_t next_u64() { return mix(seed_ + mix(++counter_)); }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next_u64() % n; }
  // Standard normal (Box–Muller; one output per two uniforms keeps the counter simple).
  double normal();

  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }

  // splitmix64 finaliser.
  static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }

 private:
  uint64_t seed_;
  uint64_t counter_;
};

}  // namespace primus
