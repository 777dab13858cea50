// Window-based and generated sample sources.
#include "data/samples.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace primus {

namespace {

void check_seq_length(int64_t seq_length) {
  if (seq_length < 1) throw UsageError(fmt::format("seq_length must be >= 1, got {}", seq_length));
}

// Windows of seq_length + 1 tokens starting every seq_length tokens.
int64_t count_windows(std::span<const int32_t> tokens, int64_t seq_length, const std::string& label) {
  check_seq_length(seq_length);
  int64_t n = tokens.empty() ? 0 : (static_cast<int64_t>(tokens.size()) - 1) / seq_length;
  if (n == 0) {
    throw UsageError(fmt::format("{}: {} tokens cannot hold one sample of seq_length {} (needs at least {} tokens)",
                                 label, tokens.size(), seq_length, seq_length + 1));
  }
  return n;
}

void check_read(const SampleSource& source, int64_t index, std::span<int32_t> out) {
  PRIMUS_CHECK(index >= 0, "sample index {} is negative", index);
  PRIMUS_CHECK(static_cast<int64_t>(out.size()) == source.seq_length() + 1,
               "sample buffer holds {} ids, expected seq_length + 1 = {}", out.size(), source.seq_length() + 1);
}

void copy_window(std::span<const int32_t> tokens, int64_t window, int64_t seq_length, std::span<int32_t> out) {
  auto first = tokens.begin() + window * seq_length;
  std::copy(first, first + seq_length + 1, out.begin());
}

}  // namespace

SampleSource::~SampleSource() = default;

ShuffledWindows::ShuffledWindows(std::span<const int32_t> tokens, int64_t seq_length, uint64_t seed,
                                 const std::string& label)
    : tokens_(tokens), seq_length_(seq_length), seed_(seed), num_windows_(count_windows(tokens, seq_length, label)) {}

int64_t ShuffledWindows::window_of(int64_t index) const {
  PRIMUS_CHECK(index >= 0, "sample index {} is negative", index);
  int64_t epoch = index / num_windows_;
  if (epoch != cached_epoch_) {
    permutation_.resize(static_cast<size_t>(num_windows_));
    std::iota(permutation_.begin(), permutation_.end(), int64_t{0});
    Rng rng = Rng::derive(seed_, static_cast<uint64_t>(epoch));
    for (int64_t i = num_windows_ - 1; i > 0; --i) {
      int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
      std::swap(permutation_[i], permutation_[j]);
    }
    cached_epoch_ = epoch;
  }
  return permutation_[static_cast<size_t>(index % num_windows_)];
}

void ShuffledWindows::read_sample(int64_t index, std::span<int32_t> out) const {
  check_read(*this, index, out);
  copy_window(tokens_, window_of(index), seq_length_, out);
}

SequentialWindows::SequentialWindows(std::span<const int32_t> tokens, int64_t seq_length, const std::string& label)
    : tokens_(tokens), seq_length_(seq_length), num_windows_(count_windows(tokens, seq_length, label)) {}

void SequentialWindows::read_sample(int64_t index, std::span<int32_t> out) const {
  check_read(*this, index, out);
  copy_window(tokens_, index % num_windows_, seq_length_, out);
}

MockTokens::MockTokens(int64_t vocab_size, int64_t seq_length, uint64_t seed)
    : vocab_size_(vocab_size), seq_length_(seq_length), seed_(seed) {
  check_seq_length(seq_length);
  if (vocab_size < 1 || vocab_size > std::numeric_limits<int32_t>::max()) {
    throw UsageError(fmt::format("mock data: vocab_size must be in [1, 2^31), got {}", vocab_size));
  }
}

void MockTokens::read_sample(int64_t index, std::span<int32_t> out) const {
  check_read(*this, index, out);
  Rng rng = Rng::derive(seed_, static_cast<uint64_t>(index));
  for (int32_t& id : out) id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_size_)));
}

}  // namespace primus
