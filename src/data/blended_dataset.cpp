// Greedy weighted blending and the data_path list -> SampleSource builder.
#include "data/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace primus {

std::vector<double> normalize_weights(std::span<const double> weights) {
  double sum = 0.0;
  for (double w : weights) {
    if (!std::isfinite(w) || w < 0.0) throw UsageError(fmt::format("data blend: weight {} is not >= 0", w));
    sum += w;
  }
  if (!(sum > 0.0)) throw UsageError("data blend: weights sum to 0");
  std::vector<double> normalized(weights.begin(), weights.end());
  for (double& w : normalized) w /= sum;
  return normalized;
}

std::vector<int64_t> blend_sample_counts(int64_t size, std::span<const double> weights) {
  std::vector<double> normalized = normalize_weights(weights);
  std::vector<int64_t> counts;
  for (double w : normalized) {
    double wanted = std::ceil(static_cast<double>(size) * w);
    counts.push_back(static_cast<int64_t>(std::ceil(wanted * 1.005)));
  }
  return counts;
}

BlendIndex build_blend_index(std::span<const double> weights, int64_t size) {
  PRIMUS_CHECK(!weights.empty() && weights.size() <= static_cast<size_t>(std::numeric_limits<int16_t>::max()),
               "blend of {} datasets", weights.size());
  BlendIndex index;
  index.dataset.resize(static_cast<size_t>(size));
  index.sample.resize(static_cast<size_t>(size));
  std::vector<int64_t> counts(weights.size(), 0);
  for (int64_t t = 0; t < size; ++t) {
    double x = std::max(static_cast<double>(t), 1.0);
    size_t best = 0;
    double best_error = weights[0] * x - static_cast<double>(counts[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      double error = weights[d] * x - static_cast<double>(counts[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    index.dataset[static_cast<size_t>(t)] = static_cast<int16_t>(best);
    index.sample[static_cast<size_t>(t)] = counts[best]++;
  }
  return index;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> datasets, std::vector<double> weights,
                               int64_t size)
    : datasets_(std::move(datasets)), size_(size) {
  if (datasets_.empty() || datasets_.size() != weights.size()) {
    throw UsageError(fmt::format("data blend: {} datasets and {} weights", datasets_.size(), weights.size()));
  }
  if (size < 1) throw UsageError(fmt::format("data blend: size must be >= 1, got {}", size));
  weights_ = normalize_weights(weights);
  seq_length_ = datasets_[0]->seq_length();
  for (const auto& dataset : datasets_) {
    PRIMUS_CHECK(dataset != nullptr && dataset->seq_length() == seq_length_,
                 "data blend: datasets differ in seq_length");
  }
  index_ = build_blend_index(weights_, size_);
  std::vector<int64_t> taken(datasets_.size(), 0);
  for (size_t t = 0; t < index_.dataset.size(); ++t) {
    int64_t& n = taken[static_cast<size_t>(index_.dataset[t])];
    n = std::max(n, index_.sample[t] + 1);
  }
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (taken[d] > datasets_[d]->samples_per_epoch()) {
      throw UsageError(fmt::format("data blend: dataset {} (weight {:.4f}) has {} samples, the blend takes {}", d,
                                   weights_[d], datasets_[d]->samples_per_epoch(), taken[d]));
    }
  }
}

std::pair<int, int64_t> BlendedDataset::locate(int64_t index) const {
  PRIMUS_CHECK(index >= 0, "sample index {} is negative", index);
  size_t t = static_cast<size_t>(index % size_);
  return {index_.dataset[t], index_.sample[t]};
}

void BlendedDataset::read_sample(int64_t index, std::span<int32_t> out) const {
  auto [dataset, sample] = locate(index);
  datasets_[static_cast<size_t>(dataset)]->read_sample(sample, out);
}

namespace {

bool parse_weight(const std::string& word, double& weight) {
  if (word.empty()) return false;
  char* stop = nullptr;
  weight = std::strtod(word.c_str(), &stop);
  return *stop == '\0';
}

}  // namespace

std::vector<BlendEntry> parse_data_blend(const std::vector<std::string>& words) {
  if (words.empty()) throw UsageError("data_path: the list is empty");
  std::vector<BlendEntry> entries;
  double weight = 0.0;
  bool weighted = words.size() > 1 && parse_weight(words[0], weight);
  if (!weighted) {
    for (const std::string& word : words) {
      if (parse_weight(word, weight)) {
        throw UsageError(
            fmt::format("data_path: '{}' looks like a weight, but the list does not start with one "
                        "(give 'w1 prefix1 w2 prefix2 ...' or only prefixes)",
                        word));
      }
      entries.push_back({strip_indexed_suffix(word), 1.0});
    }
    return entries;
  }
  if (words.size() % 2 != 0) {
    throw UsageError(fmt::format("data_path: a weighted list needs weight/prefix pairs, got {} words", words.size()));
  }
  for (size_t i = 0; i < words.size(); i += 2) {
    if (!parse_weight(words[i], weight) || !std::isfinite(weight) || weight < 0.0) {
      throw UsageError(fmt::format("data_path: entry {} ('{}') should be a weight >= 0", i, words[i]));
    }
    double ignored = 0.0;
    if (parse_weight(words[i + 1], ignored)) {
      throw UsageError(fmt::format("data_path: entry {} ('{}') should be a dataset prefix", i + 1, words[i + 1]));
    }
    entries.push_back({strip_indexed_suffix(words[i + 1]), weight});
  }
  return entries;
}

std::vector<std::string> datasets_without_eod(const std::vector<std::string>& words, int32_t eod_id,
                                              int64_t sequences) {
  std::vector<std::string> missing;
  for (const BlendEntry& entry : parse_data_blend(words)) {
    const IndexedDataset data(entry.prefix);
    bool found = false;
    int32_t last = 0;
    for (int64_t s = 0; s < std::min(sequences, data.num_sequences()) && !found; ++s) {
      const int32_t length = data.sequence_length(s);
      if (length == 0) continue;
      data.read(s, length - 1, std::span<int32_t>(&last, 1));
      found = last == eod_id;
    }
    if (!found) missing.push_back(entry.prefix);
  }
  return missing;
}

bool names_indexed_datasets(const std::vector<std::string>& words) {
  std::vector<BlendEntry> entries;
  try {
    entries = parse_data_blend(words);
  } catch (const UsageError&) {
    return false;
  }
  for (const BlendEntry& entry : entries) {
    if (!indexed_dataset_exists(entry.prefix)) return false;
  }
  return true;
}

std::shared_ptr<const SampleSource> build_gpt_data(const std::vector<std::string>& data_path, SplitPart split,
                                                   int64_t num_samples, const GPTDatasetConfig& config) {
  std::vector<BlendEntry> entries = parse_data_blend(data_path);
  bool weighted = data_path.size() > 1 && entries.size() * 2 == data_path.size();
  std::vector<std::shared_ptr<const IndexedDataset>> indexed;
  for (const BlendEntry& entry : entries) indexed.push_back(std::make_shared<const IndexedDataset>(entry.prefix));
  if (entries.size() == 1) return std::make_shared<GPTDataset>(indexed[0], split, num_samples, config);

  std::vector<double> weights;
  for (size_t d = 0; d < entries.size(); ++d) {
    if (weighted) {
      weights.push_back(entries[d].weight);
      continue;
    }
    DocumentRange range = megatron_split_range(indexed[d]->num_sequences(), config.split, split);
    double tokens = 0.0;
    for (int64_t s = range.begin; s < range.end; ++s) tokens += indexed[d]->sequence_length(s);
    weights.push_back(tokens);
  }
  std::vector<int64_t> counts = blend_sample_counts(num_samples, weights);
  std::vector<std::shared_ptr<const SampleSource>> datasets;
  std::vector<double> used_weights;
  for (size_t d = 0; d < entries.size(); ++d) {
    if (weights[d] <= 0.0) continue;  // a zero weight contributes no samples; do not build its indices
    datasets.push_back(std::make_shared<GPTDataset>(indexed[d], split, counts[d], config));
    used_weights.push_back(weights[d]);
  }
  return std::make_shared<BlendedDataset>(std::move(datasets), std::move(used_weights), num_samples);
}

}  // namespace primus
