// Counter-based random numbers: the whole state is (seed, counter), so it is trivially saved in a
// checkpoint and restored exactly. Streams derived from a seed with a label do not overlap in practice.
#pragma once

#include <cmath>
#include <cstdint>

// Functions also compiled into GPU kernels (parameter initialisation draws the same values on every device).
#if defined(__CUDACC__) || defined(__HIPCC__)
#define PRIMUS_HOST_DEVICE __host__ __device__
#else
#define PRIMUS_HOST_DEVICE
#endif

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
  PRIMUS_HOST_DEVICE static constexpr uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }

 private:
  uint64_t seed_;
  uint64_t counter_;
};

// Element k of a normal(0, 1) stream: what Rng(seed, 2k).normal() returns (Box–Muller over the outputs at
// counters 2k + 1 and 2k + 2), as a pure function of (seed, k), so any device and any split of the work draw the
// same values (on a GPU up to its double-precision log and cos, within an ulp or two of the host's).
PRIMUS_HOST_DEVICE inline double uniform_at(uint64_t seed, uint64_t counter) {  // Rng(seed, counter - 1).uniform()
  return static_cast<double>(Rng::mix(seed + Rng::mix(counter)) >> 11) * 0x1.0p-53;
}
PRIMUS_HOST_DEVICE inline double box_muller(double u1, double u2) {
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
PRIMUS_HOST_DEVICE inline double normal_at(uint64_t seed, uint64_t k) {
  return box_muller(uniform_at(seed, 2 * k + 1), uniform_at(seed, 2 * k + 2));
}

// Where element k of a tensor sits in the stream it is drawn from: k itself for a whole tensor; for a slice of a
// larger tensor (a tensor-parallel rank's part), rows of `row` elements that lie `stride` apart in the whole one,
// starting at `first`, so that every layout draws the whole tensor's values.
struct StreamIndex {
  int64_t first = 0;
  int64_t row = 0;  // 0: one contiguous run
  int64_t stride = 0;
  PRIMUS_HOST_DEVICE uint64_t operator()(int64_t k) const {
    return static_cast<uint64_t>(first + (row > 0 ? (k / row) * stride + k % row : k));
  }
};

}  // namespace primus
