// PrefetchLoader: the same batches in the same order as the synchronous BatchLoader, exact resume from a
// consumed-sample count, a bounded queue, and read errors surfacing at next().
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "data/gpt_dataset.h"
#include "data/loader.h"
#include "data/prefetch_loader.h"
#include "support/test_support.h"

namespace primus {
namespace {

std::vector<int32_t> ids(const Tensor& t) { return std::vector<int32_t>(t.i32(), t.i32() + t.numel()); }

std::shared_ptr<GPTDataset> make_dataset(const std::string& dir) {
  Rng rng(13);
  IndexedDatasetWriter writer(dir + "/ds", TokenDType::kU16);
  for (int d = 0; d < 150; ++d) {
    std::vector<int32_t> tokens(1 + rng.below(60));
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(50000));
    writer.add_document(tokens);
  }
  writer.finish();
  GPTDatasetConfig config;
  config.seq_length = 12;
  config.use_cache = false;
  return std::make_shared<GPTDataset>(std::make_shared<const IndexedDataset>(dir + "/ds"), kSplitTrain, 2000, config);
}

TEST(PrefetchLoader, YieldsExactlyTheSynchronousLoadersBatches) {
  auto dataset = make_dataset(testing::temp_dir("prefetch-order"));
  BatchLoader reference(*dataset, 3, 12);
  PrefetchLoader loader(*dataset, 3, 12, 0, 2);
  for (int step = 0; step < 200; ++step) {
    Batch want = reference.next();
    Batch got = loader.next();
    ASSERT_EQ(ids(got.tokens), ids(want.tokens)) << "step " << step;
    ASSERT_EQ(ids(got.labels), ids(want.labels)) << "step " << step;
    EXPECT_EQ(loader.consumed_samples(), reference.consumed_samples());
  }
}

TEST(PrefetchLoader, ResumesAtTheNextSampleWhateverWasQueued) {
  auto dataset = make_dataset(testing::temp_dir("prefetch-resume"));
  PrefetchLoader first(*dataset, 4, 12, 0, 8);
  for (int step = 0; step < 7; ++step) first.next();
  // Give the thread time to fill its queue: queued batches must not count as consumed.
  for (int wait = 0; wait < 200 && first.ready() < 8; ++wait) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(first.ready(), 8);
  int64_t saved = first.consumed_samples();
  EXPECT_EQ(saved, 28);
  Batch continued = first.next();

  PrefetchLoader resumed(*dataset, 4, 12, saved);
  EXPECT_EQ(ids(resumed.next().tokens), ids(continued.tokens));

  BatchLoader reference(*dataset, 4, 12, 100);
  first.set_consumed_samples(100);
  EXPECT_EQ(first.consumed_samples(), 100);
  EXPECT_EQ(ids(first.next().labels), ids(reference.next().labels));
  EXPECT_THROW(first.set_consumed_samples(-1), UsageError);
  EXPECT_THROW(PrefetchLoader(*dataset, 4, 12, 0, 0), UsageError);
}

// Fails on one sample, so the error must arrive with the batch that holds it, after the good ones.
class FailingSource final : public SampleSource {
 public:
  void read_sample(int64_t index, std::span<int32_t> out) const override {
    if (index == 9) throw RuntimeError("sample 9 is corrupt");
    std::fill(out.begin(), out.end(), static_cast<int32_t>(index));
  }
  int64_t samples_per_epoch() const override { return kUnboundedEpoch; }
  int64_t seq_length() const override { return 3; }
};

TEST(PrefetchLoader, ReadErrorsSurfaceAtTheBatchTheyBelongTo) {
  FailingSource source;
  PrefetchLoader loader(source, 2, 3);
  for (int step = 0; step < 4; ++step) EXPECT_EQ(ids(loader.next().tokens)[0], 2 * step);
  EXPECT_THROW(loader.next(), RuntimeError);  // samples 8, 9
  EXPECT_EQ(loader.consumed_samples(), 8);
}

}  // namespace
}  // namespace primus
