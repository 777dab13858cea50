// GPTDataset: split, epochs, document/sample/shuffle indices, their .npy caches, and sample reads.
#include "data/gpt_dataset.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"
#include "core/file_io.h"

namespace primus {

namespace fs = std::filesystem;

const char* split_name(SplitPart part) {
  switch (part) {
    case kSplitTrain:
      return "train";
    case kSplitValid:
      return "valid";
    case kSplitTest:
      return "test";
  }
  return "unknown";
}

std::vector<double> parse_megatron_split(const std::string& split) {
  // Megatron takes every run of digits and dots as one number (re.findall(r"[.0-9]+")).
  std::vector<double> weights;
  for (size_t i = 0; i < split.size();) {
    if (!std::isdigit(static_cast<unsigned char>(split[i])) && split[i] != '.') {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < split.size() && (std::isdigit(static_cast<unsigned char>(split[end])) || split[end] == '.')) ++end;
    std::string word = split.substr(i, end - i);
    char* stop = nullptr;
    double value = std::strtod(word.c_str(), &stop);
    if (*stop != '\0' || word == ".") {
      throw UsageError(
          fmt::format("split: '{}' is malformed: '{}' is not a number (expected e.g. \"969,30,1\")", split, word));
    }
    if (!std::isfinite(value)) throw UsageError(fmt::format("split: '{}': weight '{}' is too large", split, word));
    weights.push_back(value);
    i = end;
  }
  if (weights.size() > 3) {
    throw UsageError(fmt::format("split: '{}' has {} parts; at most 3 (train, valid, test)", split, weights.size()));
  }
  weights.resize(3, 0.0);
  double sum = 0.0;
  for (double w : weights) sum += w;
  if (!(sum > 0.0)) throw UsageError(fmt::format("split: '{}' has weights summing to 0", split));
  for (double& w : weights) w /= sum;
  return weights;
}

DocumentRange megatron_split_range(int64_t num_documents, const std::string& split, SplitPart which) {
  std::vector<double> weights = parse_megatron_split(split);
  double low = 0.0;
  for (int i = 0; i < which; ++i) low += weights[static_cast<size_t>(i)];
  double high = low + weights[static_cast<size_t>(which)];
  if (high <= low) return {};
  // std::nearbyint rounds half to even in the default rounding mode, as Python's round().
  double n = static_cast<double>(num_documents);
  return {static_cast<int64_t>(std::nearbyint(low * n)), static_cast<int64_t>(std::nearbyint(high * n))};
}

EpochPlan plan_epochs(int64_t tokens_per_epoch, int64_t num_samples, int64_t seq_length) {
  if (seq_length < 1) throw UsageError(fmt::format("seq_length must be >= 1, got {}", seq_length));
  if (num_samples < 1) throw UsageError(fmt::format("a GPT dataset needs num_samples >= 1, got {}", num_samples));
  constexpr int64_t kExtra = 1;  // add_extra_token_to_sequence: samples hold seq_length + 1 tokens
  if (tokens_per_epoch < seq_length + kExtra) {
    throw UsageError(fmt::format("{} tokens cannot hold one sample of seq_length {} (needs at least {} tokens)",
                                 tokens_per_epoch, seq_length, seq_length + kExtra));
  }
  EpochPlan plan;
  int64_t needed = num_samples * seq_length + kExtra;
  plan.num_epochs = std::max<int64_t>(1, (needed + tokens_per_epoch - 1) / tokens_per_epoch);
  plan.num_built_samples = (plan.num_epochs * tokens_per_epoch - kExtra) / seq_length;
  if (plan.num_epochs > 1) {
    int64_t per_epoch = (tokens_per_epoch - kExtra) / seq_length;
    plan.samples_before_final_epoch = ((plan.num_epochs - 1) * tokens_per_epoch - kExtra) / seq_length;
    int64_t from_final = num_samples - plan.samples_before_final_epoch;
    PRIMUS_CHECK(from_final >= 0 && from_final <= per_epoch + 1, "epoch plan: {} samples from the final epoch of {}",
                 from_final, per_epoch);
    // Megatron: int(0.80 * samples_per_epoch), a float product truncated.
    plan.separate_final_epoch = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  return plan;
}

std::vector<int64_t> build_document_index(std::span<const int64_t> documents, int64_t num_epochs,
                                          bool separate_final_epoch, NumpyRandomState& rng) {
  if (separate_final_epoch && num_epochs > 1) {
    std::vector<int64_t> first = build_document_index(documents, num_epochs - 1, false, rng);
    std::vector<int64_t> last = build_document_index(documents, 1, false, rng);
    first.insert(first.end(), last.begin(), last.end());
    return first;
  }
  std::vector<int64_t> index;
  index.reserve(documents.size() * static_cast<size_t>(num_epochs));
  for (int64_t e = 0; e < num_epochs; ++e) index.insert(index.end(), documents.begin(), documents.end());
  rng.shuffle(std::span<int64_t>(index));
  return index;
}

std::vector<int64_t> build_sample_index(std::span<const int32_t> sizes, std::span<const int64_t> document_index,
                                        int64_t seq_length, int64_t num_samples) {
  constexpr int64_t kExtra = 1;
  std::vector<int64_t> rows(static_cast<size_t>(2 * (num_samples + 1)));
  int64_t position = 0;  // in document_index
  int64_t offset = 0;    // token offset inside that document
  rows[0] = 0;
  rows[1] = 0;
  const int64_t last = static_cast<int64_t>(document_index.size()) - 1;
  for (int64_t sample = 1; sample <= num_samples; ++sample) {
    int64_t remaining = seq_length + kExtra;
    while (remaining != 0) {
      int64_t available = sizes[static_cast<size_t>(document_index[static_cast<size_t>(position)])] - offset;
      remaining -= available;
      if (remaining <= 0) {
        // The next sample starts `extra` tokens before this one ends: the shared boundary token.
        offset += remaining + available - kExtra;
        remaining = 0;
      } else if (position == last) {
        PRIMUS_CHECK(sample == num_samples, "sample index: documents ran out at sample {} of {}", sample, num_samples);
        offset = sizes[static_cast<size_t>(document_index[static_cast<size_t>(position)])] - kExtra;
        break;
      } else {
        ++position;
        offset = 0;
      }
    }
    rows[static_cast<size_t>(2 * sample)] = position;
    rows[static_cast<size_t>(2 * sample + 1)] = offset;
  }
  return rows;
}

std::vector<int64_t> build_shuffle_index(int64_t samples_first, int64_t total, NumpyRandomState& rng) {
  std::vector<int64_t> index(static_cast<size_t>(total));
  std::iota(index.begin(), index.end(), int64_t{0});
  rng.shuffle(std::span<int64_t>(index.data(), static_cast<size_t>(samples_first)));
  if (total > samples_first) {
    rng.shuffle(std::span<int64_t>(index.data() + samples_first, static_cast<size_t>(total - samples_first)));
  }
  return index;
}

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> data, SplitPart split, int64_t num_samples,
                       const GPTDatasetConfig& config)
    : data_(std::move(data)), split_(split), num_samples_(num_samples), config_(config) {
  PRIMUS_CHECK(data_ != nullptr, "GPTDataset without an indexed dataset");
  const std::string label = fmt::format("{} ({} split '{}')", data_->prefix(), split_name(split), config_.split);
  documents_ = megatron_split_range(data_->num_sequences(), config_.split, split);
  if (documents_.size() <= 0) {
    throw UsageError(fmt::format("{}: the {} part has no documents ({} in the dataset)", label, split_name(split),
                                 data_->num_sequences()));
  }
  for (int64_t d = documents_.begin; d < documents_.end; ++d) tokens_per_epoch_ += data_->sequence_length(d);
  try {
    plan_ = plan_epochs(tokens_per_epoch_, num_samples_, config_.seq_length);
  } catch (const UsageError& error) {
    throw UsageError(fmt::format("{}: {}", label, error.what()));
  }
  num_built_ = plan_.num_built_samples;

  std::vector<double> weights = parse_megatron_split(config_.split);
  nlohmann::ordered_json matrix = nlohmann::ordered_json::array();
  double low = 0.0;
  for (double w : weights) {
    matrix.push_back(w > 0.0 ? nlohmann::ordered_json::array({low, low + w}) : nlohmann::ordered_json());
    low += w;
  }
  nlohmann::ordered_json description = {
      {"class", "GPTDataset"},
      {"dataset_path", data_->prefix()},
      {"num_samples", num_samples_},
      {"index_split", split_name(split)},
      {"random_seed", config_.seed},
      {"sequence_length", config_.seq_length},
      {"split", config_.split},
      {"split_matrix", matrix},
      {"tokenizer", config_.tokenizer},
      {"add_extra_token_to_sequence", true},
      {"dataset_sequences", data_->num_sequences()},
      {"dataset_tokens", data_->num_tokens()},
  };
  description_ = description.dump(4);
  hash_ = md5_hex(description_);

  if (config_.use_cache) {
    cache_dir_ = config_.cache_dir.empty() ? (fs::path(data_->prefix()) / "cache" / "GPTDataset_indices").string()
                                           : config_.cache_dir;
    if (try_load_cache()) {
      loaded_from_cache_ = true;
      return;
    }
  }
  build_indices();
}

std::string GPTDataset::cache_path(const std::string& name) const {
  return (fs::path(cache_dir_) / fmt::format("{}-GPTDataset-{}-{}", hash_, split_name(split_), name)).string();
}

std::vector<std::string> GPTDataset::cache_files() const {
  if (cache_dir_.empty()) return {};
  return {cache_path("description.txt"), cache_path("document_index.npy"), cache_path("sample_index.npy"),
          cache_path("shuffle_index.npy")};
}

bool GPTDataset::try_load_cache() {
  std::vector<std::string> files = cache_files();
  std::error_code ec;
  for (const std::string& file : files) {
    if (!fs::is_regular_file(file, ec)) return false;
  }
  try {
    if (read_file(files[0]) != description_) throw RuntimeError(fmt::format("{}: description differs", files[0]));
    IndexArray documents = IndexArray::map_npy(files[1]);
    IndexArray samples = IndexArray::map_npy(files[2]);
    IndexArray shuffle = IndexArray::map_npy(files[3]);
    const std::vector<int64_t> want_documents = {plan_.num_epochs * documents_.size()};
    const std::vector<int64_t> want_samples = {num_built_ + 1, 2};
    const std::vector<int64_t> want_shuffle = {num_built_};
    if (documents.shape() != want_documents || samples.shape() != want_samples || shuffle.shape() != want_shuffle) {
      throw RuntimeError(fmt::format("cache arrays have shapes [{}], [{}], [{}]; expected [{}], [{}], [{}]",
                                     fmt::join(documents.shape(), ","), fmt::join(samples.shape(), ","),
                                     fmt::join(shuffle.shape(), ","), fmt::join(want_documents, ","),
                                     fmt::join(want_samples, ","), fmt::join(want_shuffle, ",")));
    }
    document_index_ = std::move(documents);
    sample_index_ = std::move(samples);
    shuffle_index_ = std::move(shuffle);
    return true;
  } catch (const RuntimeError& error) {
    spdlog::warn("[data] index cache {}-GPTDataset-{} in {} is unusable, rebuilding it: {}", hash_, split_name(split_),
                 cache_dir_, error.what());
    return false;
  }
}

void GPTDataset::build_indices() {
  std::vector<int64_t> documents(static_cast<size_t>(documents_.size()));
  std::iota(documents.begin(), documents.end(), documents_.begin);
  std::vector<int32_t> sizes(static_cast<size_t>(data_->num_sequences()));
  for (int64_t d = documents_.begin; d < documents_.end; ++d) sizes[static_cast<size_t>(d)] = data_->sequence_length(d);

  NumpyRandomState rng(config_.seed);
  std::vector<int64_t> document_index =
      build_document_index(documents, plan_.num_epochs, plan_.separate_final_epoch, rng);
  std::vector<int64_t> sample_index = build_sample_index(sizes, document_index, config_.seq_length, num_built_);
  int64_t first = plan_.separate_final_epoch ? plan_.samples_before_final_epoch : num_built_;
  std::vector<int64_t> shuffle_index = build_shuffle_index(first, num_built_, rng);

  if (!config_.use_cache) {
    document_index_ = IndexArray(std::move(document_index), {plan_.num_epochs * documents_.size()});
    sample_index_ = IndexArray(std::move(sample_index), {num_built_ + 1, 2});
    shuffle_index_ = IndexArray(std::move(shuffle_index), {num_built_});
    return;
  }
  std::error_code ec;
  fs::create_directories(cache_dir_, ec);
  if (ec) throw RuntimeError(fmt::format("{}: cannot create the index cache directory: {}", cache_dir_, ec.message()));
  std::vector<std::string> files = cache_files();
  // The dtypes Megatron writes: int32 where values fit, otherwise int64 (uint32 for the shuffle index).
  constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
  bool small_samples = static_cast<int64_t>(document_index.size()) <= kI32Max && tokens_per_epoch_ <= kI32Max;
  write_npy(files[1], document_index, {static_cast<int64_t>(document_index.size())}, IndexDType::kI32);
  write_npy(files[2], sample_index, {num_built_ + 1, 2}, small_samples ? IndexDType::kI32 : IndexDType::kI64);
  bool small_shuffle = num_built_ < static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1;
  write_npy(files[3], shuffle_index, {num_built_}, small_shuffle ? IndexDType::kU32 : IndexDType::kI64);
  write_file_atomic(files[0], description_);  // last: its presence marks a complete cache
  spdlog::info("[data] built {} index cache for {}: {} samples, {} epochs, in {}", split_name(split_), data_->prefix(),
               num_built_, plan_.num_epochs, cache_dir_);
  document_index_ = IndexArray::map_npy(files[1]);
  sample_index_ = IndexArray::map_npy(files[2]);
  shuffle_index_ = IndexArray::map_npy(files[3]);
}

int64_t GPTDataset::shuffled(int64_t index) const {
  PRIMUS_CHECK(index >= 0, "sample index {} is negative", index);
  int64_t sample = shuffle_index_[index % num_built_];
  if (sample < 0 || sample >= num_built_) {
    throw RuntimeError(fmt::format("{}: corrupt shuffle index: entry {} is {}, outside [0, {})",
                                   shuffle_index_.source(), index % num_built_, sample, num_built_));
  }
  return sample;
}

void GPTDataset::check_token_ids(int64_t sequence, int64_t offset, std::span<const int32_t> ids) const {
  if (config_.vocab_size <= 0) return;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 0 && ids[i] < config_.vocab_size) continue;
    const int64_t position = offset + static_cast<int64_t>(i);
    throw UsageError(
        fmt::format("{}: token {} at byte offset {} (sequence {}, position {}) is outside the model's "
                    "vocabulary (vocab_size {}); was the dataset made with another tokenizer?",
                    bin_path(data_->prefix()), ids[i], data_->sequence_pointer(sequence) + position * data_->itemsize(),
                    sequence, position, config_.vocab_size));
  }
}

void GPTDataset::read_sample(int64_t index, std::span<int32_t> out) const {
  PRIMUS_CHECK(static_cast<int64_t>(out.size()) == config_.seq_length + 1,
               "sample buffer holds {} ids, expected seq_length + 1 = {}", out.size(), config_.seq_length + 1);
  int64_t sample = shuffled(index);
  int64_t begin_position = sample_index_[2 * sample];
  int64_t begin_offset = sample_index_[2 * sample + 1];
  int64_t end_position = sample_index_[2 * sample + 2];
  int64_t end_offset = sample_index_[2 * sample + 3];
  const int64_t positions = document_index_.size();
  if (begin_position < 0 || begin_position > end_position || end_position >= positions || begin_offset < 0 ||
      end_offset < 0) {
    throw RuntimeError(fmt::format("{}: corrupt sample index: rows {} and {} are ({}, {}) and ({}, {})",
                                   sample_index_.source(), sample, sample + 1, begin_position, begin_offset,
                                   end_position, end_offset));
  }
  auto document = [&](int64_t position) {
    int64_t d = document_index_[position];
    if (d < documents_.begin || d >= documents_.end) {
      throw RuntimeError(fmt::format("{}: corrupt document index: entry {} is {}, outside the split [{}, {})",
                                     document_index_.source(), position, d, documents_.begin, documents_.end));
    }
    return d;
  };
  int64_t written = 0;
  auto copy = [&](int64_t position, int64_t offset, int64_t length) {
    PRIMUS_CHECK(length >= 0 && written + length <= static_cast<int64_t>(out.size()),
                 "{}: sample {} spans more than {} tokens", sample_index_.source(), sample, out.size());
    const int64_t sequence = document(position);
    std::span<int32_t> ids = out.subspan(static_cast<size_t>(written), static_cast<size_t>(length));
    data_->read(sequence, offset, ids);
    check_token_ids(sequence, offset, ids);
    written += length;
  };
  if (begin_position == end_position) {
    copy(begin_position, begin_offset, end_offset - begin_offset + 1);
  } else {
    copy(begin_position, begin_offset, data_->sequence_length(document(begin_position)) - begin_offset);
    for (int64_t p = begin_position + 1; p < end_position; ++p) copy(p, 0, data_->sequence_length(document(p)));
    copy(end_position, 0, end_offset + 1);
  }
  PRIMUS_CHECK(written == static_cast<int64_t>(out.size()), "{}: sample {} has {} tokens, expected {}",
               sample_index_.source(), sample, written, out.size());
}

SampleMasks sample_masks(std::span<const int32_t> tokens, int32_t eod_id, bool reset_position_ids,
                         bool reset_attention_mask, bool eod_mask_loss) {
  SampleMasks masks;
  const size_t n = tokens.size();
  masks.position_ids.resize(n);
  masks.loss_mask.assign(n, 1.0f);
  masks.segment_starts.push_back(0);
  int32_t position = 0;
  for (size_t t = 0; t < n; ++t) {
    masks.position_ids[t] = position++;
    if (tokens[t] != eod_id) continue;
    if (eod_mask_loss) masks.loss_mask[t] = 0.0f;
    if (reset_position_ids) position = 0;
    if (reset_attention_mask && t + 1 < n) masks.segment_starts.push_back(static_cast<int32_t>(t + 1));
  }
  return masks;
}

}  // namespace primus
