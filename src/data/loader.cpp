// BatchLoader: samples to [B, T] token and label tensors, plus the packed-document masks when asked.
#include "data/loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "core/error.h"
#include "data/gpt_dataset.h"

namespace primus {

BatchLoader::BatchLoader(const SampleSource& source, int64_t micro_batch, int64_t seq_length, int64_t start_sample,
                         const PackingOptions& packing, DataShard shard)
    : source_(source), micro_batch_(micro_batch), seq_length_(seq_length), consumed_(0), packing_(packing),
      shard_(shard) {
  if (micro_batch < 1) throw UsageError(fmt::format("micro_batch_size must be >= 1, got {}", micro_batch));
  PRIMUS_CHECK(shard.size >= 1 && shard.rank >= 0 && shard.rank < shard.size, "data shard {} of {} is invalid",
               shard.rank, shard.size);
  PRIMUS_CHECK(seq_length == source.seq_length(), "loader seq_length {} differs from its sample source's {}",
               seq_length, source.seq_length());
  if (packing.any() && packing.eod_id < 0) {
    throw UsageError("reset_position_ids, reset_attention_mask and eod_mask_loss need the tokenizer's EOD id");
  }
  set_consumed_samples(start_sample);
  sample_.resize(static_cast<size_t>(seq_length + 1));
}

void BatchLoader::set_consumed_samples(int64_t consumed) {
  if (consumed < 0) throw UsageError(fmt::format("consumed samples must be >= 0, got {}", consumed));
  consumed_ = consumed;
}

Batch BatchLoader::next() {
  const Shape shape{micro_batch_, seq_length_};
  Batch batch;
  batch.tokens = Tensor::empty(shape, DType::kI32);
  batch.labels = Tensor::empty(shape, DType::kI32);
  if (packing_.reset_position_ids) batch.position_ids = Tensor::empty(shape, DType::kI32);
  if (packing_.reset_attention_mask) batch.segment_start = Tensor::empty(shape, DType::kI32);
  int32_t* tokens = batch.tokens.i32();
  int32_t* labels = batch.labels.i32();
  for (int64_t b = 0; b < micro_batch_; ++b) {
    source_.read_sample(consumed_ + shard_.rank * micro_batch_ + b, sample_);
    std::copy(sample_.begin(), sample_.end() - 1, tokens + b * seq_length_);
    std::copy(sample_.begin() + 1, sample_.end(), labels + b * seq_length_);
    if (packing_.any()) apply_packing(batch, b);
  }
  consumed_ += micro_batch_ * shard_.size;
  return batch;
}

void BatchLoader::apply_packing(Batch& batch, int64_t b) const {
  const int64_t row = b * seq_length_;
  const std::span<const int32_t> tokens(batch.tokens.i32() + row, static_cast<size_t>(seq_length_));
  const SampleMasks masks = sample_masks(tokens, packing_.eod_id, packing_.reset_position_ids,
                                         packing_.reset_attention_mask, packing_.eod_mask_loss);
  if (packing_.eod_mask_loss) {
    int32_t* labels = batch.labels.i32() + row;
    for (int64_t t = 0; t < seq_length_; ++t) {
      if (masks.loss_mask[static_cast<size_t>(t)] == 0.0f) labels[t] = kIgnoreLabel;
    }
  }
  if (packing_.reset_position_ids) {
    std::copy(masks.position_ids.begin(), masks.position_ids.end(), batch.position_ids.i32() + row);
  }
  if (packing_.reset_attention_mask) {  // segment_starts lists each document's first position, ascending from 0
    int32_t* starts = batch.segment_start.i32() + row;
    size_t next = 1;
    int32_t start = 0;
    for (int64_t t = 0; t < seq_length_; ++t) {
      if (next < masks.segment_starts.size() && masks.segment_starts[next] == t) start = masks.segment_starts[next++];
      starts[t] = start;
    }
  }
}

}  // namespace primus
