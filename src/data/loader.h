// BatchLoader: turns a SampleSource into micro-batches of input and label ids.
//
// The only state is the number of samples consumed; a checkpoint saves it and a resumed loader
// (start_sample or set_consumed_samples) yields exactly the batches the uninterrupted run would have.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "data/samples.h"

namespace primus {

struct Batch {
  Tensor tokens;  // [B, T] i32: sample[:-1]
  Tensor labels;  // [B, T] i32: sample[1:], the next token at each position
};

class BatchLoader {
 public:
  // Borrows `source`, which must outlive the loader. seq_length must equal source.seq_length().
  // Throws UsageError for micro_batch < 1 or start_sample < 0.
  BatchLoader(const SampleSource& source, int64_t micro_batch, int64_t seq_length, int64_t start_sample = 0);

  // Micro-batch of samples consumed .. consumed + B - 1 (row b is sample consumed + b), then advances
  // consumed by B. Each call returns fresh tensors, so earlier batches stay valid.
  Batch next();

  int64_t consumed_samples() const { return consumed_; }
  // Throws UsageError for a negative count (e.g. from a corrupt checkpoint the caller did not validate).
  void set_consumed_samples(int64_t consumed);

  int64_t micro_batch() const { return micro_batch_; }
  int64_t seq_length() const { return seq_length_; }

 private:
  const SampleSource& source_;
  int64_t micro_batch_;
  int64_t seq_length_;
  int64_t consumed_;
  std::vector<int32_t> sample_;  // [T + 1] scratch for one sample
};

}  // namespace primus
