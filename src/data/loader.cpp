// BatchLoader: samples to [B, T] token and label tensors.
#include "data/loader.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace primus {

BatchLoader::BatchLoader(const SampleSource& source, int64_t micro_batch, int64_t seq_length, int64_t start_sample)
    : source_(source), micro_batch_(micro_batch), seq_length_(seq_length), consumed_(0) {
  if (micro_batch < 1) throw UsageError(fmt::format("micro_batch_size must be >= 1, got {}", micro_batch));
  PRIMUS_CHECK(seq_length == source.seq_length(), "loader seq_length {} differs from its sample source's {}",
               seq_length, source.seq_length());
  set_consumed_samples(start_sample);
  sample_.resize(static_cast<size_t>(seq_length + 1));
}

void BatchLoader::set_consumed_samples(int64_t consumed) {
  if (consumed < 0) throw UsageError(fmt::format("consumed samples must be >= 0, got {}", consumed));
  consumed_ = consumed;
}

Batch BatchLoader::next() {
  Batch batch{Tensor::empty({micro_batch_, seq_length_}, DType::kI32),
              Tensor::empty({micro_batch_, seq_length_}, DType::kI32)};
  int32_t* tokens = batch.tokens.i32();
  int32_t* labels = batch.labels.i32();
  for (int64_t b = 0; b < micro_batch_; ++b) {
    source_.read_sample(consumed_ + b, sample_);
    std::copy(sample_.begin(), sample_.end() - 1, tokens + b * seq_length_);
    std::copy(sample_.begin() + 1, sample_.end(), labels + b * seq_length_);
  }
  consumed_ += micro_batch_;
  return batch;
}

}  // namespace primus
