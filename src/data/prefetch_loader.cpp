// The prefetching thread and its bounded queue.
#include "data/prefetch_loader.h"

#include "core/error.h"

namespace primus {

PrefetchLoader::PrefetchLoader(const SampleSource& source, int64_t micro_batch, int64_t seq_length,
                               int64_t start_sample, int64_t depth, const PackingOptions& packing, DataShard shard)
    : source_(source), micro_batch_(micro_batch), seq_length_(seq_length), depth_(depth), packing_(packing),
      shard_(shard) {
  if (depth < 1) throw UsageError(fmt::format("prefetch depth must be >= 1, got {}", depth));
  // Validates the arguments here, not on the thread.
  BatchLoader check(source, micro_batch, seq_length, start_sample, packing, shard);
  consumed_ = start_sample;
  start(start_sample);
}

PrefetchLoader::~PrefetchLoader() { stop(); }

void PrefetchLoader::start(int64_t from_sample) {
  stopping_ = false;
  error_ = nullptr;
  queue_.clear();
  thread_ = std::thread([this, from_sample] { run(from_sample); });
}

void PrefetchLoader::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PrefetchLoader::run(int64_t from_sample) {
  try {
    BatchLoader loader(source_, micro_batch_, seq_length_, from_sample, packing_, shard_);
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [this] { return stopping_ || static_cast<int64_t>(queue_.size()) < depth_; });
        if (stopping_) return;
      }
      Batch batch = loader.next();  // outside the lock: this is the work that overlaps the step
      {
        std::lock_guard lock(mutex_);
        queue_.push_back(std::move(batch));
      }
      changed_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
    }
    changed_.notify_all();
  }
}

Batch PrefetchLoader::next() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !queue_.empty() || error_ != nullptr; });
  if (queue_.empty()) std::rethrow_exception(error_);
  Batch batch = std::move(queue_.front());
  queue_.pop_front();
  consumed_ += micro_batch_ * shard_.size;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

void PrefetchLoader::set_consumed_samples(int64_t consumed) {
  if (consumed < 0) throw UsageError(fmt::format("consumed samples must be >= 0, got {}", consumed));
  stop();
  consumed_ = consumed;
  start(consumed);
}

int64_t PrefetchLoader::ready() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(queue_.size());
}

}  // namespace primus
