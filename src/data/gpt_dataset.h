// Megatron's GPTDataset over an indexed dataset: a train/valid/test split by documents, as many shuffled
// epochs as num_samples needs, samples of seq_length + 1 tokens that cross document boundaries, and index
// caches built once and reused. The algorithms follow shared/docs/FORMATS.md §2 step by step (and
// docs/data.md); with numpy's RandomState reproduced exactly the sample order equals Megatron-LM's.
//
// The three index arrays, as in Megatron:
//   document_index [E·docs]   the split's documents repeated E times, shuffled (last epoch apart if needed)
//   sample_index   [n + 1, 2] (position in document_index, token offset) where sample i starts
//   shuffle_index  [n]        the order samples are served in
// A GPTDataset is a SampleSource: sample k (k >= 0) is sample shuffle_index[k mod n]; reads are const and
// thread-safe (the indexed dataset and the caches are memory-mapped).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/npy_file.h"
#include "data/numpy_rng.h"
#include "data/samples.h"
#include "data/text_corpus.h"

namespace primus {

// "train", "valid", "test".
const char* split_name(SplitPart part);

// Megatron's split string ("969,30,1"; any non-number characters separate) as three weights normalised to
// sum 1 (missing parts are 0). Throws UsageError for a malformed split or one summing to 0.
std::vector<double> parse_megatron_split(const std::string& split);

// Documents [begin, end) of part `which` among `num_documents`: round-half-to-even of the cumulative
// normalised weights × num_documents, computed in double as Megatron does. Empty when the part's weight is 0.
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const DocumentRange&) const = default;
};
DocumentRange megatron_split_range(int64_t num_documents, const std::string& split, SplitPart which);

// How many epochs num_samples needs and whether the last one is shuffled on its own.
struct EpochPlan {
  int64_t num_epochs = 1;
  bool separate_final_epoch = false;
  int64_t samples_before_final_epoch = 0;  // meaningful when num_epochs > 1
  int64_t num_built_samples = 0;           // n = (E·T − 1) // seq_length
};
// Throws UsageError when tokens_per_epoch cannot make one sample or num_samples < 1.
EpochPlan plan_epochs(int64_t tokens_per_epoch, int64_t num_samples, int64_t seq_length);

// The building blocks, exposed for tests against numpy. `documents` are the split's document ids.
std::vector<int64_t> build_document_index(std::span<const int64_t> documents, int64_t num_epochs,
                                          bool separate_final_epoch, NumpyRandomState& rng);
// Rows (position, offset) flattened: [2 (n + 1)]. `sizes[d]` is the token count of document d.
std::vector<int64_t> build_sample_index(std::span<const int32_t> sizes, std::span<const int64_t> document_index,
                                        int64_t seq_length, int64_t num_samples);
// arange(samples_first) shuffled, then arange(samples_first, total) shuffled (when total > samples_first).
std::vector<int64_t> build_shuffle_index(int64_t samples_first, int64_t total, NumpyRandomState& rng);

struct GPTDatasetConfig {
  int64_t seq_length = 0;
  uint32_t seed = 1234;
  std::string split = "969,30,1";
  // Where the index caches live; empty means <prefix>/cache/GPTDataset_indices as in Megatron.
  std::string cache_dir;
  // False: build the indices in memory and write nothing (e.g. for `data inspect`).
  bool use_cache = true;
  // The tokenizer's name, part of the cache description.
  std::string tokenizer;
  // The model's vocabulary: read_sample refuses a token id outside [0, vocab_size) with a UsageError naming the
  // .bin file and byte offset (a dataset made with another tokenizer). 0: not checked (`data inspect`).
  int64_t vocab_size = 0;
};

class GPTDataset final : public SampleSource {
 public:
  // Throws UsageError when the split is empty, has no tokens, or num_samples < 1; RuntimeError when a cache
  // cannot be written. A cache that exists but does not match (shape, dtype, description) is rebuilt.
  GPTDataset(std::shared_ptr<const IndexedDataset> data, SplitPart split, int64_t num_samples,
             const GPTDatasetConfig& config);

  void read_sample(int64_t index, std::span<int32_t> out) const override;
  int64_t samples_per_epoch() const override { return num_built_; }
  int64_t seq_length() const override { return config_.seq_length; }

  // Samples built (>= the num_samples asked for).
  int64_t size() const { return num_built_; }
  const EpochPlan& plan() const { return plan_; }
  DocumentRange documents() const { return documents_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  // The JSON whose MD5 names the cache files.
  const std::string& description() const { return description_; }
  const std::string& cache_hash() const { return hash_; }
  // Cache file paths (empty without a cache) and whether they were read rather than built.
  std::vector<std::string> cache_files() const;
  bool loaded_from_cache() const { return loaded_from_cache_; }

  int64_t shuffled(int64_t index) const;  // shuffle_index[index mod n]
  const IndexArray& document_index() const { return document_index_; }
  const IndexArray& sample_index() const { return sample_index_; }
  const IndexArray& shuffle_index() const { return shuffle_index_; }

 private:
  std::string cache_path(const std::string& name) const;
  // Throws UsageError for an id outside the vocabulary; `ids` were read from `sequence` at token `offset`.
  void check_token_ids(int64_t sequence, int64_t offset, std::span<const int32_t> ids) const;
  bool try_load_cache();
  void build_indices();

  std::shared_ptr<const IndexedDataset> data_;
  SplitPart split_;
  int64_t num_samples_;
  GPTDatasetConfig config_;
  DocumentRange documents_;
  int64_t tokens_per_epoch_ = 0;
  EpochPlan plan_;
  int64_t num_built_ = 0;
  std::string description_;
  std::string hash_;
  std::string cache_dir_;
  bool loaded_from_cache_ = false;
  IndexArray document_index_;
  IndexArray sample_index_;
  IndexArray shuffle_index_;
};

// Megatron's per-sample masks for packed documents (get_ltor_masks_and_position_ids), from the input tokens
// of one sample (tokens = sample[:-1], T ids). EOD at position i:
//   eod_mask_loss        loss_mask[i] = 0
//   reset_position_ids   positions restart at 0 after i
//   reset_attention_mask a new attention segment starts at i + 1 (segment_starts lists every start, from 0)
struct SampleMasks {
  std::vector<int32_t> position_ids;    // [T]
  std::vector<float> loss_mask;         // [T]
  std::vector<int32_t> segment_starts;  // ascending, first 0: token t attends to [start of its segment, t]
};
SampleMasks sample_masks(std::span<const int32_t> tokens, int32_t eod_id, bool reset_position_ids,
                         bool reset_attention_mask, bool eod_mask_loss);

}  // namespace primus
