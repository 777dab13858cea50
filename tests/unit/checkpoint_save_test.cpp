// The save path's guarantees, on a tiny model in one process: a snapshot taken between steps writes the same
// bytes as a save of the live state even while training changes the originals (async_save); an iteration is
// saved once; an iteration that is not the latest is replaced whole; a failed save removes its temporary and
// keeps the previous checkpoint; a save without room fails before writing; temporaries of crashed saves are
// removed and named; retention keeps the latest K and the multiples of keep_every.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/checkpoint_snapshot.h"
#include "checkpoint/retention.h"
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint/tensor_catalog.h"
#include "core/file_io.h"
#include "ops/ops.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

struct TinyRun {
  ModelArgs args = testing::tiny_llama_args();
  std::unique_ptr<Model> model = make_model(args, 16);
  AdamW optimizer{model->params(), AdamWConfig{}};
  explicit TinyRun(uint64_t seed = 11) {
    model->params().initialize(seed);
    step();
  }
  // One training step on fresh random tokens: weights and moments change.
  void step() {
    Rng rng(seed_++);
    model->params().zero_grads();
    testing::train_micro_batch(*model, testing::random_ids({2, 8}, args.vocab_size, rng),
                               testing::random_ids({2, 8}, args.vocab_size, rng));
    optimizer.step(model->params(), 1e-3);
  }
  uint64_t seed_ = 5;
};

TrainerState state_at(int64_t iteration) {
  return TrainerState{.iteration = iteration, .consumed_train_samples = 2 * iteration, .optimizer_steps = 1,
                      .seed = 1, .fp8_scaling = {}};
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CheckpointSave, ASnapshotWritesTheStateOfItsStepWhileTrainingGoesOn) {
  TinyRun run;
  const std::string root = testing::temp_dir("ckpt-snapshot");
  save_checkpoint(root + "/live", *run.model, run.optimizer, state_at(1), "exp_name: tiny\n");

  const int64_t numel = run.model->params().numel();
  // Two ranges, as a rank of a distributed optimizer may own, taken in one snapshot.
  const std::vector<FlatRange> ranges = {{numel / 3, numel}, {0, numel / 3}};
  CheckpointSnapshot snapshot;
  snapshot.take(ranges, live_state(run.model->params(), run.optimizer), kCpuDevice);
  EXPECT_EQ(snapshot.bytes(), 3 * 4 * numel);
  CheckpointSave save(root + "/snap", *run.model, ranges, nullptr, state_at(1), "exp_name: tiny\n");
  run.step();  // training goes on before the background write
  save.write(snapshot.state());
  EXPECT_GT(save.finish(), 0);
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "manifest.json"}) {
    EXPECT_EQ(read_file(root + "/snap/iter_0000001/" + file), read_file(root + "/live/iter_0000001/" + file)) << file;
  }
  EXPECT_THROW(snapshot.state().weights(numel - 1, numel + 1), RuntimeError);
}

TEST(CheckpointSave, AnIterationIsSavedOnce) {
  TinyRun run;
  const std::string dir = testing::temp_dir("ckpt-once");
  save_checkpoint(dir, *run.model, run.optimizer, state_at(1), "");
  const std::string weights = read_file(dir + "/iter_0000001/model.safetensors");
  run.step();
  try {
    save_checkpoint(dir, *run.model, run.optimizer, state_at(1), "");
    FAIL() << "a second save of the latest iteration was accepted";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("iter_0000001 is already the latest checkpoint"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(dir + "/iter_0000001/model.safetensors"), weights);
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"iter_0000001", "latest_checkpointed_iteration.txt"}));
  verify_checkpoint(dir + "/iter_0000001");
}

TEST(CheckpointSave, AnIterationThatIsNotTheLatestIsReplacedWhole) {
  TinyRun run;
  const std::string dir = testing::temp_dir("ckpt-replace");
  save_checkpoint(dir, *run.model, run.optimizer, state_at(1), "");
  save_checkpoint(dir, *run.model, run.optimizer, state_at(2), "");
  write_file_atomic(dir + "/latest_checkpointed_iteration.txt", "1\n");  // resumed from 1 by hand
  run.step();
  save_checkpoint(dir, *run.model, run.optimizer, state_at(2), "");
  EXPECT_EQ(read_file(dir + "/latest_checkpointed_iteration.txt"), "2\n");
  EXPECT_EQ(entries(dir),
            (std::vector<std::string>{"iter_0000001", "iter_0000002", "latest_checkpointed_iteration.txt"}));
  verify_checkpoint(dir + "/iter_0000002");
  TinyRun loaded(99);
  load_checkpoint(dir + "/iter_0000002", *loaded.model, loaded.optimizer);
  std::vector<float> want(run.model->params().numel()), got(want.size());
  copy_to_host(run.model->params().flat_params(), want.data());
  copy_to_host(loaded.model->params().flat_params(), got.data());
  EXPECT_EQ(want, got) << "the new save replaced the old iter_0000002";
}

TEST(CheckpointSave, AFailedWriteRemovesItsTemporaryAndKeepsThePreviousCheckpoint) {
  TinyRun run;
  const std::string dir = testing::temp_dir("ckpt-failed");
  save_checkpoint(dir, *run.model, run.optimizer, state_at(1), "");
  const int64_t numel = run.model->params().numel();
  CheckpointSave save(dir, *run.model, {{0, numel}}, nullptr, state_at(2), "");
  EXPECT_TRUE(fs::is_directory(dir + "/iter_0000002.tmp"));
  SavedState failing = live_state(run.model->params(), run.optimizer);
  failing.moments = [](bool, int64_t, int64_t) -> std::vector<Tensor> {
    throw RuntimeError("disk full at offset 12345");
  };
  save.write(failing);
  try {
    save.finish();
    FAIL() << "a failed write was committed";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("disk full at offset 12345"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the latest checkpoint is still the previous one"), std::string::npos) << e.what();
  }
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"iter_0000001", "latest_checkpointed_iteration.txt"}));
}

TEST(CheckpointSave, ASaveWithoutRoomFailsBeforeWritingAndNamesTheNumbers) {
  const std::string dir = testing::temp_dir("ckpt-room");
  const uint64_t available = fs::space(dir).available;
  EXPECT_NO_THROW(check_free_space(dir, 1));
  try {
    check_free_space(dir, available + (uint64_t{1} << 40));
    FAIL() << "no error for a checkpoint larger than the free space";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("GB free, the checkpoint needs about"), std::string::npos) << e.what();
  }
  EXPECT_THROW(prepare_temporary_dir(dir, 3, available + (uint64_t{1} << 40)), RuntimeError);
  EXPECT_FALSE(fs::exists(dir + "/iter_0000003.tmp"));
}

TEST(CheckpointSave, TemporariesOfCrashedSavesAreRemovedAndNamed) {
  const std::string dir = testing::temp_dir("ckpt-stale");
  for (const char* name : {"iter_0000004.tmp", "iter_0000002.tmp.4242", "iter_0000003.tmp.removing", "iter_0000005",
                           "notes.tmp"}) {
    fs::create_directories(dir + "/" + name);
  }
  EXPECT_EQ(remove_stale_temporaries(dir),
            (std::vector<std::string>{"iter_0000002.tmp.4242", "iter_0000003.tmp.removing", "iter_0000004.tmp"}));
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"iter_0000005", "notes.tmp"}));
}

TEST(CheckpointRetention, KeepsTheLatestKAndEveryMultipleAndNothingNewer) {
  const std::string dir = testing::temp_dir("ckpt-retention");
  for (int i = 1; i <= 7; ++i) fs::create_directories(dir + "/" + checkpoint_dir_name(i));
  fs::create_directories(dir + "/iter_0000006.tmp");
  std::ofstream(dir + "/iter_0000002.txt") << "not a checkpoint";
  // Latest 5 (a run resumed from 5 with 6 and 7 left from before): keep 4 and 5, and 2 (a multiple of 2).
  EXPECT_TRUE(checkpoints_to_remove(dir, 5, {.keep_latest_k = 0, .keep_every = 2}).empty());
  EXPECT_EQ(apply_retention(dir, 5, {.keep_latest_k = 2, .keep_every = 2}),
            (std::vector<std::string>{"iter_0000001", "iter_0000003"}));
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"iter_0000002", "iter_0000002.txt", "iter_0000004",
                                                    "iter_0000005", "iter_0000006", "iter_0000006.tmp",
                                                    "iter_0000007"}));
  EXPECT_EQ(apply_retention(dir, 5, {.keep_latest_k = 1, .keep_every = 0}),
            (std::vector<std::string>{"iter_0000002", "iter_0000004"}));
}

}  // namespace
}  // namespace primus
