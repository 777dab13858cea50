// Weighted blending of several datasets (Megatron's BlendedDataset), the `data_path` list that names them
// ("prefix" or "w1 prefix1 w2 prefix2 ..."), and build_gpt_data, which turns that list into one SampleSource.
//
// Blending (FORMATS.md §2): weights are normalised; output sample t (x = max(t, 1)) comes from the dataset d
// with the largest w_d·x − count_d (ties: lowest d), as that dataset's sample count_d. With [0.7, 0.3] the
// datasets go 0,1,0,0,1,0,0,1,0,0,... Each dataset is built with ceil(ceil(size·w_d)·1.005) samples so the
// blend never runs past one of them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"
#include "data/samples.h"

namespace primus {

// Normalised copy of `weights`. Throws UsageError for a negative or non-finite weight or a zero sum.
std::vector<double> normalize_weights(std::span<const double> weights);

// Samples to request from each dataset for a blend of `size` samples: ceil(ceil(size·w)·1.005).
std::vector<int64_t> blend_sample_counts(int64_t size, std::span<const double> weights);

// The greedy assignment of each of `size` blended samples: dataset[t] and its sample number there.
struct BlendIndex {
  std::vector<int16_t> dataset;  // [size]
  std::vector<int64_t> sample;   // [size]
};
BlendIndex build_blend_index(std::span<const double> weights, int64_t size);

class BlendedDataset final : public SampleSource {
 public:
  // `weights` (any positive scale) pair with `datasets`, which must share seq_length. Throws UsageError when a
  // dataset has fewer samples than the blend takes from it, or the lists differ in length or are empty.
  BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> datasets, std::vector<double> weights, int64_t size);

  // Sample `index` mod size of the blend.
  void read_sample(int64_t index, std::span<int32_t> out) const override;
  int64_t samples_per_epoch() const override { return size_; }
  int64_t seq_length() const override { return seq_length_; }

  int64_t size() const { return size_; }
  const std::vector<double>& weights() const { return weights_; }
  // Which dataset and which of its samples blended sample `index` is.
  std::pair<int, int64_t> locate(int64_t index) const;

 private:
  std::vector<std::shared_ptr<const SampleSource>> datasets_;
  std::vector<double> weights_;  // normalised
  int64_t size_;
  int64_t seq_length_;
  BlendIndex index_;
};

// One dataset of a data_path list.
struct BlendEntry {
  std::string prefix;
  double weight = 1.0;
};

// A data_path list as Megatron takes it: ["prefix"], ["prefix1", "prefix2", ...] (no weights) or
// ["w1", "prefix1", "w2", "prefix2", ...]. A word "p.idx"/"p.bin" names prefix "p". Without weights every
// weight is 1 here (build_gpt_data then weighs by tokens). Throws UsageError for an empty list, a mix of
// weighted and unweighted entries, or a weight that is not a non-negative number.
std::vector<BlendEntry> parse_data_blend(const std::vector<std::string>& words);
// True when the list names indexed datasets: every prefix of parse_data_blend has both .idx and .bin.
bool names_indexed_datasets(const std::vector<std::string>& words);
// The prefixes of an indexed-dataset list none of whose first `sequences` sequences ends with `eod_id`: data
// preprocessed without --append-eod, whose documents are not EOD-separated. Reads one token per sequence.
std::vector<std::string> datasets_without_eod(const std::vector<std::string>& words, int32_t eod_id,
                                              int64_t sequences = 1000);

// The training, validation or test source for a data_path list: one GPTDataset of `num_samples` for a single
// prefix; otherwise a BlendedDataset of `num_samples` over one GPTDataset per prefix, each asked for
// blend_sample_counts samples. Lists without weights are weighed by each split's token count. The returned
// source owns the datasets it reads.
std::shared_ptr<const SampleSource> build_gpt_data(const std::vector<std::string>& data_path, SplitPart split,
                                                   int64_t num_samples, const GPTDatasetConfig& config);

}  // namespace primus
