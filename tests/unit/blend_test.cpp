// Weighted blending: Megatron's greedy order, proportions, per-dataset sample counts, the data_path list,
// and build_gpt_data over real indexed datasets.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "data/blended_dataset.h"
#include "data/indexed_dataset.h"
#include "support/test_support.h"

namespace primus {
namespace {

// A source whose sample k is [tag, k, k, ...], so a blend's reads show where they came from.
class TaggedSource final : public SampleSource {
 public:
  TaggedSource(int32_t tag, int64_t size, int64_t seq_length) : tag_(tag), size_(size), seq_length_(seq_length) {}
  void read_sample(int64_t index, std::span<int32_t> out) const override {
    std::fill(out.begin(), out.end(), static_cast<int32_t>(index));
    out[0] = tag_;
  }
  int64_t samples_per_epoch() const override { return size_; }
  int64_t seq_length() const override { return seq_length_; }

 private:
  int32_t tag_;
  int64_t size_;
  int64_t seq_length_;
};

TEST(Blend, GreedyOrderMatchesMegatronsExample) {
  std::vector<double> weights = {0.7, 0.3};
  BlendIndex index = build_blend_index(weights, 10);
  EXPECT_EQ(index.dataset, (std::vector<int16_t>{0, 1, 0, 0, 1, 0, 0, 1, 0, 0}));
  EXPECT_EQ(index.sample, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
  // Ties go to the lowest index.
  std::vector<double> equal = {0.5, 0.5};
  EXPECT_EQ(build_blend_index(equal, 4).dataset, (std::vector<int16_t>{0, 1, 0, 1}));
}

TEST(Blend, ProportionsAreWithinOnePercentOver10000Samples) {
  Rng rng(31);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<double> raw(2 + rng.below(4));
    for (double& w : raw) w = 0.05 + rng.uniform();
    std::vector<double> weights = normalize_weights(raw);
    BlendIndex index = build_blend_index(weights, 10000);
    std::vector<int64_t> counts(weights.size(), 0);
    for (int16_t d : index.dataset) ++counts[static_cast<size_t>(d)];
    for (size_t d = 0; d < weights.size(); ++d) {
      EXPECT_NEAR(static_cast<double>(counts[d]) / 10000.0, weights[d], 0.01) << "dataset " << d;
    }
  }
}

TEST(Blend, SampleCountsHaveMegatronsMargin) {
  std::vector<double> weights = {0.3, 0.7};
  // ceil(ceil(1000 × 0.3) × 1.005) = ceil(301.5) = 302; ceil(ceil(700.0000001) × 1.005) = 704 or 705.
  std::vector<int64_t> counts = blend_sample_counts(1000, weights);
  EXPECT_EQ(counts[0], 302);
  EXPECT_EQ(counts[1], static_cast<int64_t>(std::ceil(std::ceil(1000 * 0.7) * 1.005)));
  std::vector<double> unnormalized = {3.0, 7.0};
  EXPECT_EQ(blend_sample_counts(1000, unnormalized), counts);
  std::vector<double> negative = {1.0, -1.0};
  EXPECT_THROW(normalize_weights(negative), UsageError);
}

TEST(BlendedDataset, ReadsEachSampleFromItsDataset) {
  std::vector<std::shared_ptr<const SampleSource>> sources = {std::make_shared<TaggedSource>(100, 800, 4),
                                                              std::make_shared<TaggedSource>(200, 800, 4)};
  BlendedDataset blend(sources, {7.0, 3.0}, 1000);
  std::vector<int32_t> out(5);
  std::vector<int64_t> next = {0, 0};
  for (int64_t k = 0; k < 1000; ++k) {
    blend.read_sample(k, out);
    int d = out[0] == 100 ? 0 : 1;
    ASSERT_TRUE(out[0] == 100 || out[0] == 200);
    EXPECT_EQ(out[1], next[static_cast<size_t>(d)]++) << "each dataset is read in order";
    EXPECT_EQ(blend.locate(k), (std::pair<int, int64_t>{d, out[1]}));
  }
  blend.read_sample(1003, out);  // wraps
  EXPECT_EQ(blend.locate(1003), blend.locate(3));
  // A dataset too small for its share is refused up front.
  std::vector<std::shared_ptr<const SampleSource>> small = {std::make_shared<TaggedSource>(1, 100, 4),
                                                            std::make_shared<TaggedSource>(2, 800, 4)};
  EXPECT_THROW(BlendedDataset(small, {7.0, 3.0}, 1000), UsageError);
}

TEST(DataBlend, ParsesMegatronDataPathLists) {
  auto one = parse_data_blend({"data/a_text_document"});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].prefix, "data/a_text_document");
  auto weighted = parse_data_blend({"0.3", "a.idx", "0.7", "b"});
  ASSERT_EQ(weighted.size(), 2u);
  EXPECT_EQ(weighted[0].prefix, "a");
  EXPECT_DOUBLE_EQ(weighted[0].weight, 0.3);
  EXPECT_EQ(weighted[1].prefix, "b");
  EXPECT_DOUBLE_EQ(weighted[1].weight, 0.7);
  auto plain = parse_data_blend({"a", "b", "c"});
  EXPECT_EQ(plain.size(), 3u);
  EXPECT_THROW(parse_data_blend({}), UsageError);
  EXPECT_THROW(parse_data_blend({"0.3", "a", "0.7"}), UsageError);
  EXPECT_THROW(parse_data_blend({"0.3", "a", "b", "c"}), UsageError);
  EXPECT_THROW(parse_data_blend({"0.3", "0.4"}), UsageError);
  EXPECT_THROW(parse_data_blend({"a", "0.5"}), UsageError);
  EXPECT_THROW(parse_data_blend({"-1", "a", "2", "b"}), UsageError);
}

std::string write_tagged_dataset(const std::string& prefix, int32_t tag, int64_t documents, Rng& rng) {
  IndexedDatasetWriter writer(prefix, TokenDType::kU16);
  for (int64_t d = 0; d < documents; ++d) {
    std::vector<int32_t> tokens(5 + rng.below(40), tag);  // every token names the dataset
    writer.add_document(tokens);
  }
  writer.finish();
  return prefix;
}

TEST(BuildGptData, BlendsIndexedDatasetsByTheirWeights) {
  std::string dir = testing::temp_dir("blend-build");
  Rng rng(8);
  std::string a = write_tagged_dataset(dir + "/a_text_document", 11, 400, rng);
  std::string b = write_tagged_dataset(dir + "/b_text_document", 22, 100, rng);
  EXPECT_TRUE(names_indexed_datasets({"0.3", a, "0.7", b + ".idx"}));
  EXPECT_FALSE(names_indexed_datasets({"0.3", a, "0.7", dir + "/missing"}));
  EXPECT_FALSE(names_indexed_datasets({dir + "/corpus.txt"}));

  GPTDatasetConfig config;
  config.seq_length = 16;
  auto blend = build_gpt_data({"0.3", a, "0.7", b}, kSplitTrain, 2000, config);
  EXPECT_EQ(blend->seq_length(), 16);
  EXPECT_EQ(blend->samples_per_epoch(), 2000);
  std::vector<int32_t> out(17);
  int64_t from_b = 0;
  for (int64_t k = 0; k < 2000; ++k) {
    blend->read_sample(k, out);
    ASSERT_TRUE(std::all_of(out.begin(), out.end(), [&](int32_t t) { return t == out[0]; })) << "sample " << k;
    from_b += out[0] == 22;
  }
  EXPECT_NEAR(static_cast<double>(from_b) / 2000.0, 0.7, 0.01);  // b is small, so it repeats epochs

  auto single = build_gpt_data({a}, kSplitValid, 50, config);
  EXPECT_EQ(dynamic_cast<const GPTDataset*>(single.get())->size() >= 50, true);

  // Without weights each dataset weighs by its split's tokens.
  auto unweighted = build_gpt_data({a, b}, kSplitTrain, 1000, config);
  const auto* mix = dynamic_cast<const BlendedDataset*>(unweighted.get());
  ASSERT_NE(mix, nullptr);
  EXPECT_GT(mix->weights()[0], 0.7);
  EXPECT_THROW(build_gpt_data({dir + "/missing"}, kSplitTrain, 10, config), UsageError);
}

}  // namespace
}  // namespace primus
