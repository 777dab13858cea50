// BatchLoader: turns a SampleSource into micro-batches of input and label ids, and, for documents packed into
// one sample, Megatron's per-token masks (PackingOptions).
//
// The only state is the number of samples consumed; a checkpoint saves it and a resumed loader
// (start_sample or set_consumed_samples) yields exactly the batches the uninterrupted run would have.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "data/samples.h"

namespace primus {

// A label that counts for nothing: no loss, no gradient, not in the token count (the cross-entropy ops skip
// negative targets). PyTorch's ignore_index.
inline constexpr int32_t kIgnoreLabel = -100;

// Megatron's switches for samples that hold several documents separated by the tokenizer's EOD id
// (get_ltor_masks_and_position_ids, see sample_masks in gpt_dataset.h). All off: plain batches.
struct PackingOptions {
  int32_t eod_id = -1;                // needed (>= 0) when any switch is on
  bool reset_position_ids = false;    // positions restart at 0 after each EOD
  bool reset_attention_mask = false;  // tokens attend only within their document (the EOD ends a document)
  bool eod_mask_loss = false;         // no loss where the input token is EOD (predicting the next document)
  bool any() const { return reset_position_ids || reset_attention_mask || eod_mask_loss; }
  // The config key of the first switch that is on (for error messages); "" when none is.
  const char* first_key() const {
    return reset_position_ids ? "reset_position_ids" : reset_attention_mask ? "reset_attention_mask"
                                                      : eod_mask_loss        ? "eod_mask_loss"
                                                                             : "";
  }
};

struct Batch {
  Tensor tokens;  // [B, T] i32: sample[:-1]
  Tensor labels;  // [B, T] i32: sample[1:], the next token at each position; kIgnoreLabel where eod_mask_loss
                  // masks it, so the loss is Σ mask·loss / Σ mask over the global batch as in Megatron
  // Present only when their switch is on (no cost otherwise):
  Tensor position_ids;   // [B, T] i32 with reset_position_ids: position within the document
  Tensor segment_start;  // [B, T] i32 with reset_attention_mask: first position of the token's document
};

// One data-parallel rank's share of the samples, as Megatron's MegatronPretrainingSampler deals them: the
// samples are taken in chunks of micro_batch × size, and rank r reads rows [r × micro_batch, (r + 1) ×
// micro_batch) of each chunk. So N ranks together read, step by step, exactly the samples one rank reads
// alone at the same global batch, and the consumed count stays global (a checkpoint resumes at any size).
struct DataShard {
  int64_t rank = 0;
  int64_t size = 1;
};

class BatchLoader {
 public:
  // Borrows `source`, which must outlive the loader. seq_length must equal source.seq_length().
  // Throws UsageError for micro_batch < 1, start_sample < 0, or a packing switch on without an EOD id.
  BatchLoader(const SampleSource& source, int64_t micro_batch, int64_t seq_length, int64_t start_sample = 0,
              const PackingOptions& packing = {}, DataShard shard = {});

  // Micro-batch of samples consumed + s .. consumed + s + B - 1 with s = shard.rank × B (row b is sample
  // consumed + s + b), then advances consumed by B × shard.size. Each call returns fresh tensors, so earlier
  // batches stay valid.
  Batch next();

  int64_t consumed_samples() const { return consumed_; }
  // Throws UsageError for a negative count (e.g. from a corrupt checkpoint the caller did not validate).
  void set_consumed_samples(int64_t consumed);

  int64_t micro_batch() const { return micro_batch_; }
  int64_t seq_length() const { return seq_length_; }
  const PackingOptions& packing() const { return packing_; }

 private:
  // Row b of the batch's packing tensors and label mask from the row's input tokens.
  void apply_packing(Batch& batch, int64_t b) const;

  const SampleSource& source_;
  int64_t micro_batch_;
  int64_t seq_length_;
  int64_t consumed_;
  PackingOptions packing_;
  DataShard shard_;
  std::vector<int32_t> sample_;  // [T + 1] scratch for one sample
};

}  // namespace primus
