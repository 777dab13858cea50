// Sample sources: map a global sample index to seq_length + 1 consecutive token ids
// (inputs = sample[:-1], labels = sample[1:]).
//
// A source is a pure function of the index, so a run resumes exactly from the number of samples it has
// consumed, and data-parallel ranks can read disjoint indices of the same source.
//
// Sources that read tokens borrow them through a std::span: the token storage (a TokenCorpus, later a
// memory-mapped indexed dataset) must outlive the source.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace primus {

class SampleSource {
 public:
  virtual ~SampleSource();
  // Writes sample `index` (any index >= 0; indices past one epoch continue into the next) into `out`,
  // which holds seq_length() + 1 ids.
  virtual void read_sample(int64_t index, std::span<int32_t> out) const = 0;
  // Distinct samples before the order repeats or reshuffles; kUnboundedEpoch for generated data.
  virtual int64_t samples_per_epoch() const = 0;
  virtual int64_t seq_length() const = 0;

  static constexpr int64_t kUnboundedEpoch = std::numeric_limits<int64_t>::max();
};

// Non-overlapping windows of the token stream, reshuffled every epoch (for training).
// Window k covers tokens [k·T, k·T + T] (T + 1 tokens; consecutive windows share one boundary token so no
// prediction target is lost), for k < n = (tokens − 1) / T. Sample i is window perm_e[i mod n] with
// e = i / n and perm_e a Fisher–Yates shuffle drawn from Rng::derive(seed, e). Pass a seed meant for
// data only, so the shuffle does not repeat another stream derived from the same training seed.
// The current epoch's permutation is cached, so read_sample is O(1) within an epoch and O(n) when the
// epoch changes; the cache makes read_sample not thread-safe.
class ShuffledWindows final : public SampleSource {
 public:
  // Throws UsageError when the tokens cannot hold one sample; `label` names the data in that message.
  ShuffledWindows(std::span<const int32_t> tokens, int64_t seq_length, uint64_t seed,
                  const std::string& label = "train data");
  void read_sample(int64_t index, std::span<int32_t> out) const override;
  int64_t samples_per_epoch() const override { return num_windows_; }
  int64_t seq_length() const override { return seq_length_; }
  // The window that sample `index` reads (its first token is at window * seq_length).
  int64_t window_of(int64_t index) const;

 private:
  std::span<const int32_t> tokens_;
  int64_t seq_length_;
  uint64_t seed_;
  int64_t num_windows_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> permutation_;  // [num_windows_] window order of cached_epoch_
};

// The same windows in stream order, repeating (for evaluation): sample i is window i mod n.
class SequentialWindows final : public SampleSource {
 public:
  SequentialWindows(std::span<const int32_t> tokens, int64_t seq_length, const std::string& label = "valid data");
  void read_sample(int64_t index, std::span<int32_t> out) const override;
  int64_t samples_per_epoch() const override { return num_windows_; }
  int64_t seq_length() const override { return seq_length_; }

 private:
  std::span<const int32_t> tokens_;
  int64_t seq_length_;
  int64_t num_windows_;
};

// Uniform random ids in [0, vocab_size) (mock_data): sample i is drawn from Rng::derive(seed, i), so any
// sample is reproducible on its own. Never repeats.
class MockTokens final : public SampleSource {
 public:
  MockTokens(int64_t vocab_size, int64_t seq_length, uint64_t seed);
  void read_sample(int64_t index, std::span<int32_t> out) const override;
  int64_t samples_per_epoch() const override { return kUnboundedEpoch; }
  int64_t seq_length() const override { return seq_length_; }

 private:
  int64_t vocab_size_;
  int64_t seq_length_;
  uint64_t seed_;
};

}  // namespace primus
