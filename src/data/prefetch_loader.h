// PrefetchLoader: BatchLoader on a background thread, `depth` micro-batches ahead of the trainer, so reading
// and assembling samples (page faults on a memory-mapped dataset included) overlaps the training step.
//
// Order and resume are exactly BatchLoader's: the thread runs a BatchLoader, and consumed_samples() counts
// only the batches handed out by next(), never the ones still queued, so a checkpoint that saves it resumes
// at precisely the next sample. The SampleSource must be safe to read from another thread while the caller
// does not read it (true of GPTDataset, BlendedDataset, SequentialWindows and MockTokens; ShuffledWindows
// caches a permutation, so only this thread may read it while the loader runs).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "data/loader.h"
#include "data/samples.h"

namespace primus {

class PrefetchLoader {
 public:
  // Borrows `source`, which must outlive the loader. Throws UsageError for depth < 1 and whatever
  // BatchLoader's constructor throws. `packing` as for BatchLoader.
  PrefetchLoader(const SampleSource& source, int64_t micro_batch, int64_t seq_length, int64_t start_sample = 0,
                 int64_t depth = 4, const PackingOptions& packing = {}, DataShard shard = {});
  ~PrefetchLoader();
  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  // The next micro-batch (samples consumed .. consumed + B - 1); waits for the thread when the queue is empty.
  // An exception thrown while reading (e.g. a corrupt dataset) is rethrown here, at the batch it belongs to.
  Batch next();

  int64_t consumed_samples() const { return consumed_; }
  // Drops the queued batches and restarts the thread at `consumed`. Throws UsageError for a negative count.
  void set_consumed_samples(int64_t consumed);

  int64_t micro_batch() const { return micro_batch_; }
  int64_t seq_length() const { return seq_length_; }
  int64_t depth() const { return depth_; }
  // Batches ready in the queue now (for tests and stall metrics).
  int64_t ready() const;

 private:
  void start(int64_t from_sample);
  void stop();
  void run(int64_t from_sample);

  const SampleSource& source_;
  int64_t micro_batch_;
  int64_t seq_length_;
  int64_t depth_;
  PackingOptions packing_;
  DataShard shard_;
  int64_t consumed_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> queue_;
  std::exception_ptr error_;  // set by the thread after the batches queued before the failure
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace primus
