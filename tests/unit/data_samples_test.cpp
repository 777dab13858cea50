// Sample sources (shuffled and sequential windows, mock tokens), the batch loader's exact resume, and its
// packed-document masks (Megatron's reset_position_ids, reset_attention_mask, eod_mask_loss).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/loader.h"
#include "data/prefetch_loader.h"
#include "data/samples.h"
#include "support/fixed_samples.h"

namespace primus {
namespace {

// A token stream whose value at position p is unique (p itself), so a sample tells where it came from.
std::vector<int32_t> positions(int64_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return tokens;
}

std::vector<int32_t> read(const SampleSource& source, int64_t index) {
  std::vector<int32_t> out(static_cast<size_t>(source.seq_length() + 1), -7);
  source.read_sample(index, out);
  return out;
}

TEST(ShuffledWindows, EachEpochIsAPermutationOfAllWindows) {
  const int64_t seq = 16;
  std::vector<int32_t> tokens = positions(1000);  // (1000 - 1) / 16 = 62 windows
  ShuffledWindows source(tokens, seq, 42);
  const int64_t n = source.samples_per_epoch();
  ASSERT_EQ(n, 62);
  std::vector<std::vector<int64_t>> orders;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order;
    std::set<int64_t> seen;
    for (int64_t p = 0; p < n; ++p) {
      std::vector<int32_t> s = read(source, epoch * n + p);
      int64_t start = s[0];
      ASSERT_EQ(start % seq, 0) << "window must start at a multiple of seq_length";
      for (int64_t t = 0; t <= seq; ++t) ASSERT_EQ(s[static_cast<size_t>(t)], start + t);
      ASSERT_EQ(source.window_of(epoch * n + p), start / seq);
      seen.insert(start / seq);
      order.push_back(start / seq);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), n - 1);
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]) << "epochs must be reshuffled";
  EXPECT_NE(orders[1], orders[2]);
  std::vector<int64_t> identity(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) identity[static_cast<size_t>(i)] = i;
  EXPECT_NE(orders[0], identity);
}

TEST(ShuffledWindows, DeterministicAcrossInstancesAndRandomAccess) {
  std::vector<int32_t> tokens = positions(5000);
  ShuffledWindows a(tokens, 32, 7), b(tokens, 32, 7), other(tokens, 32, 8);
  const int64_t n = a.samples_per_epoch();
  Rng rng(3);
  int differ = 0;
  // b is read in a random order across epochs, so its cache is rebuilt often; answers must not change.
  for (int i = 0; i < 300; ++i) {
    int64_t index = static_cast<int64_t>(rng.below(static_cast<uint64_t>(5 * n)));
    ASSERT_EQ(read(a, index), read(b, index)) << "index " << index;
    differ += read(a, index) != read(other, index);
  }
  EXPECT_GT(differ, 250) << "different seeds must give different orders";
}

TEST(ShuffledWindows, TooFewTokensNamesTheNeed) {
  std::vector<int32_t> tokens = positions(64);
  EXPECT_NO_THROW(ShuffledWindows(std::span<const int32_t>(tokens).first(65 - 1), 63, 1));
  try {
    ShuffledWindows(tokens, 64, 1, "train split");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("train split"), std::string::npos) << msg;
    EXPECT_NE(msg.find("65 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("64 tokens"), std::string::npos) << msg;
  }
  EXPECT_THROW(ShuffledWindows(std::span<const int32_t>(), 4, 1), UsageError);
  EXPECT_THROW(SequentialWindows(tokens, 0), UsageError);
}

TEST(SequentialWindows, InOrderAndRepeating) {
  std::vector<int32_t> tokens = positions(101);  // exactly 10 windows of 10
  SequentialWindows source(tokens, 10);
  ASSERT_EQ(source.samples_per_epoch(), 10);
  for (int64_t i = 0; i < 25; ++i) {
    std::vector<int32_t> s = read(source, i);
    for (int64_t t = 0; t <= 10; ++t) ASSERT_EQ(s[static_cast<size_t>(t)], (i % 10) * 10 + t);
  }
}

TEST(MockTokens, DeterministicAndWithinVocab) {
  const int64_t vocab = 1000, seq = 64;
  MockTokens a(vocab, seq, 99), b(vocab, seq, 99), c(vocab, seq, 100);
  EXPECT_EQ(a.samples_per_epoch(), SampleSource::kUnboundedEpoch);
  std::set<int32_t> values;
  for (int64_t i : {0, 1, 2, 1000, 123456789}) {
    std::vector<int32_t> s = read(a, i);
    EXPECT_EQ(s, read(b, i));
    EXPECT_NE(s, read(c, i));
    EXPECT_NE(s, read(a, i + 1));
    for (int32_t id : s) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, vocab);
      values.insert(id);
    }
  }
  EXPECT_GT(values.size(), 200u);
  EXPECT_THROW(MockTokens(0, seq, 1), UsageError);
}

// The next `count` batches of a loader, flattened: tokens then labels of each.
std::vector<int32_t> drain(BatchLoader& loader, int count) {
  std::vector<int32_t> all;
  for (int i = 0; i < count; ++i) {
    Batch batch = loader.next();
    all.insert(all.end(), batch.tokens.i32(), batch.tokens.i32() + batch.tokens.numel());
    all.insert(all.end(), batch.labels.i32(), batch.labels.i32() + batch.labels.numel());
  }
  return all;
}

TEST(BatchLoader, LabelsAreInputsShifted) {
  Rng rng(11);
  std::vector<int32_t> tokens(3001);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(257));
  ShuffledWindows source(tokens, 20, 5);
  BatchLoader loader(source, 4, 20, 3);
  Batch batch = loader.next();
  ASSERT_EQ(batch.tokens.shape(), (Shape{4, 20}));
  ASSERT_EQ(batch.labels.shape(), (Shape{4, 20}));
  ASSERT_EQ(batch.tokens.dtype(), DType::kI32);
  EXPECT_EQ(loader.consumed_samples(), 7);
  const int32_t* x = batch.tokens.i32();
  const int32_t* y = batch.labels.i32();
  for (int64_t b = 0; b < 4; ++b) {
    std::vector<int32_t> s = read(source, 3 + b);
    for (int64_t t = 0; t < 20; ++t) {
      ASSERT_EQ(x[b * 20 + t], s[static_cast<size_t>(t)]);
      ASSERT_EQ(y[b * 20 + t], s[static_cast<size_t>(t + 1)]);
      if (t + 1 < 20) {
        ASSERT_EQ(y[b * 20 + t], x[b * 20 + t + 1]);
      }
    }
    // The sample is the stream at window * seq_length.
    int64_t start = source.window_of(3 + b) * 20;
    for (int64_t t = 0; t < 20; ++t) ASSERT_EQ(x[b * 20 + t], tokens[static_cast<size_t>(start + t)]);
  }
}

TEST(BatchLoader, ResumedLoaderYieldsTheSameBatches) {
  Rng rng(12);
  std::vector<int32_t> tokens(2000);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(257));
  ShuffledWindows source(tokens, 16, 21);  // 124 windows: the run crosses epoch boundaries
  const int64_t mb = 6;
  for (int64_t k : {0, 6, 18, 120, 126}) {
    BatchLoader through(source, mb, 16);
    while (through.consumed_samples() < k) through.next();
    ASSERT_EQ(through.consumed_samples(), k);
    BatchLoader resumed(source, mb, 16, k);
    BatchLoader reset(source, mb, 16);
    reset.next();
    reset.set_consumed_samples(k);
    std::vector<int32_t> expect = drain(through, 50);
    EXPECT_EQ(drain(resumed, 50), expect) << "resumed at " << k;
    EXPECT_EQ(drain(reset, 50), expect) << "set_consumed_samples(" << k << ")";
    EXPECT_EQ(resumed.consumed_samples(), k + 50 * mb);
  }
}

TEST(BatchLoader, RejectsBadArguments) {
  MockTokens source(50, 8, 1);
  EXPECT_THROW(BatchLoader(source, 0, 8), UsageError);
  EXPECT_THROW(BatchLoader(source, 2, 8, -1), UsageError);
  EXPECT_THROW(BatchLoader(source, 2, 9), RuntimeError);
  BatchLoader loader(source, 2, 8);
  EXPECT_THROW(loader.set_consumed_samples(-5), UsageError);
}

constexpr int32_t kEod = 9;

std::vector<int32_t> values(const Tensor& t, int64_t row) {
  const int64_t n = t.dim(1);
  return std::vector<int32_t>(t.i32() + row * n, t.i32() + (row + 1) * n);
}

// Row 0 packs three documents (the last cut off), row 1 is one document without an EOD, row 2 has two EODs in
// a row (a document of just its EOD) and ends on an EOD.
testing::FixedSamples packed_samples() {
  return testing::FixedSamples({{4, 5, kEod, 6, 7, 8, kEod, 1, 2},
                                {1, 2, 3, 4, 5, 6, 7, 8, 0},
                                {3, kEod, kEod, 5, 6, 7, 8, kEod, 4}});
}

TEST(BatchLoader, PackedDocumentsGetMegatronsMasks) {
  const testing::FixedSamples source = packed_samples();
  BatchLoader loader(source, 3, 8, 0, PackingOptions{kEod, true, true, true});
  const Batch batch = loader.next();
  constexpr int32_t x = kIgnoreLabel;
  EXPECT_EQ(values(batch.labels, 0), (std::vector<int32_t>{5, kEod, x, 7, 8, kEod, x, 2}));
  EXPECT_EQ(values(batch.position_ids, 0), (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(values(batch.segment_start, 0), (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 3, 7}));
  EXPECT_EQ(values(batch.labels, 1), (std::vector<int32_t>{2, 3, 4, 5, 6, 7, 8, 0}));
  EXPECT_EQ(values(batch.position_ids, 1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(values(batch.segment_start, 1), std::vector<int32_t>(8, 0));
  EXPECT_EQ(values(batch.labels, 2), (std::vector<int32_t>{kEod, x, x, 6, 7, 8, kEod, x}));
  EXPECT_EQ(values(batch.position_ids, 2), (std::vector<int32_t>{0, 1, 0, 0, 1, 2, 3, 4}));
  EXPECT_EQ(values(batch.segment_start, 2), (std::vector<int32_t>{0, 0, 2, 3, 3, 3, 3, 3}));
  EXPECT_EQ(values(batch.tokens, 2), (std::vector<int32_t>{3, kEod, kEod, 5, 6, 7, 8, kEod}));
}

TEST(BatchLoader, EachSwitchAddsOnlyWhatItNeeds) {
  const testing::FixedSamples source = packed_samples();
  const Batch plain = BatchLoader(source, 3, 8).next();
  EXPECT_FALSE(plain.position_ids.defined());
  EXPECT_FALSE(plain.segment_start.defined());
  EXPECT_EQ(values(plain.labels, 0), (std::vector<int32_t>{5, kEod, 6, 7, 8, kEod, 1, 2}));

  const Batch loss_only = BatchLoader(source, 3, 8, 0, PackingOptions{kEod, false, false, true}).next();
  EXPECT_FALSE(loss_only.position_ids.defined());
  EXPECT_FALSE(loss_only.segment_start.defined());
  EXPECT_EQ(values(loss_only.labels, 0), (std::vector<int32_t>{5, kEod, kIgnoreLabel, 7, 8, kEod, kIgnoreLabel, 2}));

  const Batch positions_only = BatchLoader(source, 3, 8, 0, PackingOptions{kEod, true, false, false}).next();
  EXPECT_EQ(values(positions_only.labels, 0), values(plain.labels, 0));
  EXPECT_EQ(values(positions_only.position_ids, 0), (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_FALSE(positions_only.segment_start.defined());

  const Batch mask_only = BatchLoader(source, 3, 8, 0, PackingOptions{kEod, false, true, false}).next();
  EXPECT_FALSE(mask_only.position_ids.defined());
  EXPECT_EQ(values(mask_only.segment_start, 0), (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 3, 7}));
}

TEST(BatchLoader, PackingNeedsAnEodIdAndSurvivesPrefetching) {
  const testing::FixedSamples source = packed_samples();
  EXPECT_THROW(BatchLoader(source, 1, 8, 0, PackingOptions{-1, false, true, false}), UsageError);
  const PackingOptions packing{kEod, true, true, true};
  BatchLoader direct(source, 2, 8, 1, packing);
  PrefetchLoader prefetch(source, 2, 8, 1, 2, packing);
  for (int i = 0; i < 3; ++i) {
    const Batch a = direct.next(), b = prefetch.next();
    for (int64_t row = 0; row < 2; ++row) {
      EXPECT_EQ(values(a.labels, row), values(b.labels, row));
      EXPECT_EQ(values(a.position_ids, row), values(b.position_ids, row));
      EXPECT_EQ(values(a.segment_start, row), values(b.segment_start, row));
    }
  }
}

}  // namespace
}  // namespace primus
