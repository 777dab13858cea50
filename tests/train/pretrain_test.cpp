// The training loop end to end, in process: the loss falls on real text, metrics are written, a
// resumed run repeats the uninterrupted run's losses bit for bit, and a damaged checkpoint is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "core/file_io.h"
#include "support/test_support.h"
#include "support/tiny_models.h"
#include "train/pretrain.h"

namespace primus {
namespace {

std::vector<nlohmann::json> read_metrics(const std::string& run_dir) {
  std::vector<nlohmann::json> records;
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

// All event files of a TensorBoard directory, concatenated: tags are stored as plain strings in the records.
std::string event_bytes(const std::string& dir) {
  std::string bytes;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) bytes += read_file(entry.path().string());
  return bytes;
}

TEST(Pretrain, TensorBoardSwitchesChooseTheScalarsAsMegatronDoes) {
  for (bool all : {false, true}) {
    ExperimentConfig c = testing::shakespeare_experiment(testing::temp_dir(all ? "tb_all" : "tb_default"), 4);
    c.train.lr_warmup_iters = 1;
    c.train.eval_interval = 2;
    c.train.eval_iters = 1;
    c.train.tensorboard_dir = c.run_dir() + "/tensorboard";
    c.train.log_throughput = c.train.log_timers_to_tensorboard = c.train.log_validation_ppl_to_tensorboard = all;
    c.train.log_learning_rate_to_tensorboard = !all;
    ASSERT_EQ(run_pretrain(c, {}), 0);
    const std::string bytes = event_bytes(c.train.tensorboard_dir);
    for (const char* tag : {"lm loss", "grad-norm", "lm loss validation"}) {
      EXPECT_NE(bytes.find(tag), std::string::npos) << tag;
    }
    EXPECT_EQ(bytes.find("learning-rate") != std::string::npos, !all);
    for (const char* tag : {"tokens-per-sec", "tflops-per-gpu", "data-wait-ms", "forward-time-ms", "backward-time-ms",
                            "optimizer-time-ms", "lm loss validation ppl"}) {
      EXPECT_EQ(bytes.find(tag) != std::string::npos, all) << tag << (all ? " missing" : " written by default");
    }
  }
}

TEST(Pretrain, LossFallsFarBelowStartOnShakespeare) {
  ExperimentConfig c = testing::shakespeare_experiment(testing::temp_dir("train"), 150);
  c.train.eval_interval = 50;
  c.train.eval_iters = 2;
  c.train.tensorboard_dir = c.run_dir() + "/tensorboard";
  ASSERT_EQ(run_pretrain(c, {}), 0);
  bool has_events = false;
  for (const auto& entry : std::filesystem::directory_iterator(c.train.tensorboard_dir)) {
    has_events |= entry.path().filename().string().find("tfevents") != std::string::npos && entry.file_size() > 1000;
  }
  EXPECT_TRUE(has_events) << "no TensorBoard event file with scalars in " << c.train.tensorboard_dir;
  auto records = read_metrics(c.run_dir());
  ASSERT_EQ(records.size(), 150u);
  for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"}) {
    EXPECT_TRUE(records.back().contains(key)) << key;
  }
  EXPECT_TRUE(records[49].contains("eval_loss"));
  const double first = records.front()["loss"], last = records.back()["loss"];
  EXPECT_GT(first, 5.5);  // ~ln(384) for a fresh model over the padded byte vocabulary
  EXPECT_LT(last, 0.6 * first) << "loss went from " << first << " to " << last;
  EXPECT_LT(records.back()["eval_loss"].get<double>(), 0.6 * first);
  EXPECT_TRUE(std::filesystem::exists(c.run_dir() + "/config.yaml"));
  EXPECT_TRUE(std::filesystem::exists(c.run_dir() + "/logs/train.log"));
  EXPECT_TRUE(std::filesystem::exists(c.run_dir() + "/checkpoints/iter_0000150/model.safetensors"));
}

// DeepSeek-V3's preset (MLA with YaRN, sigmoid grouped routing with the expert bias and the sequence-level aux loss,
// a shared expert, dense first layers, a multi-token prediction module), shrunk by overrides, trains on the CPU engine:
// the loss and the module's loss ("mtp_losses" in metrics.jsonl, TensorBoard's "mtp_1 loss") fall.
TEST(Pretrain, ShrunkDeepSeekV3TrainsWithItsMultiTokenPrediction) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  const std::string dir = testing::temp_dir("deepseek_v3");
  std::ofstream(dir + "/exp.yaml")
      << "exp_name: v3\nmodules:\n  pre_trainer:\n    framework: megatron\n    model: deepseek_v3\n"
         "    overrides: {train_iters: 1, seq_length: 64, lr: 1.0e-4, mock_data: true, num_layers: 2, hidden_size: 64, "
         "ffn_hidden_size: 128, num_attention_heads: 4, q_lora_rank: 32, kv_lora_rank: 32, qk_head_dim: 16, "
         "qk_pos_emb_head_dim: 8, v_head_dim: 16, num_experts: 8, moe_router_topk: 2, moe_router_num_groups: 4, "
         "moe_router_group_topk: 2, moe_ffn_hidden_size: 32, moe_shared_expert_intermediate_size: 32, "
         "moe_first_k_dense_replace: 1, original_max_position_embeddings: 16, init_method_std: 0.02}\n";
  ExperimentConfig c = load_experiment_config(dir + "/exp.yaml", {}).config;
  ASSERT_EQ(c.model.mtp_num_layers, 1);
  const ExperimentConfig text = testing::shakespeare_experiment(dir, 60);
  c.workspace = text.workspace;
  c.train = text.train;
  c.train.tensorboard_dir = c.run_dir() + "/tensorboard";
  c.model.vocab_size = 0;  // the byte tokenizer's
  c.model.max_position_embeddings = 256;
  ASSERT_EQ(run_pretrain(c, {}), 0);
  const auto records = read_metrics(c.run_dir());
  ASSERT_EQ(records.size(), 60u);
  ASSERT_TRUE(records.front().contains("mtp_losses")) << records.front().dump();
  ASSERT_EQ(records.front()["mtp_losses"].size(), 1u);
  const double first = records.front()["loss"], last = records.back()["loss"];
  EXPECT_LT(last, 0.8 * first) << "loss went from " << first << " to " << last;
  const double mtp_first = records.front()["mtp_losses"][0], mtp_last = records.back()["mtp_losses"][0];
  EXPECT_LT(mtp_last, 0.8 * mtp_first) << "the module's loss went from " << mtp_first << " to " << mtp_last;
  EXPECT_NE(event_bytes(c.train.tensorboard_dir).find("mtp_1 loss"), std::string::npos);
}

TEST(Pretrain, ResumedRunRepeatsTheUninterruptedLossesBitForBit) {
  const std::string root = testing::temp_dir("resume");
  ExperimentConfig whole = testing::shakespeare_experiment(root + "/whole", 12);
  ASSERT_EQ(run_pretrain(whole, {}), 0);

  ExperimentConfig part = testing::shakespeare_experiment(root + "/part", 7);  // same schedule: lr_decay_iters is fixed
  ASSERT_EQ(run_pretrain(part, {}), 0);
  part.train.train_iters = 12;
  ASSERT_EQ(run_pretrain(part, {}), 0);

  auto a = read_metrics(whole.run_dir());
  auto b = read_metrics(part.run_dir());
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << "step " << i + 1;
  }
}

TEST(Pretrain, CorruptOrTruncatedCheckpointIsRefused) {
  ExperimentConfig c = testing::shakespeare_experiment(testing::temp_dir("corrupt"), 3);
  ASSERT_EQ(run_pretrain(c, {}), 0);
  const std::string weights = c.run_dir() + "/checkpoints/iter_0000003/model.safetensors";
  std::string bytes = read_file(weights);
  bytes[bytes.size() / 2] ^= 0x01;
  write_file_atomic(weights, bytes);
  c.train.train_iters = 5;
  try {
    run_pretrain(c, {});
    FAIL() << "a corrupt checkpoint was loaded";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CRC32C"), std::string::npos) << e.what();
  }
  write_file_atomic(weights, bytes.substr(0, bytes.size() - 10));
  try {
    run_pretrain(c, {});
    FAIL() << "a truncated checkpoint was loaded";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

// A checkpoint at or beyond train_iters: as in Megatron the run has nothing to train and exits 0, but the log says so
// plainly instead of only "done" (issue 12, hole 8).
TEST(Pretrain, ACheckpointBeyondTrainItersSaysThereIsNothingToTrain) {
  ExperimentConfig c = testing::shakespeare_experiment(testing::temp_dir("beyond"), 3);
  ASSERT_EQ(run_pretrain(c, {}), 0);
  c.train.train_iters = 2;
  ASSERT_EQ(run_pretrain(c, {}), 0);
  const std::string log = read_file(c.run_dir() + "/logs/train.log");
  EXPECT_NE(log.find("iteration 3 is beyond train_iters 2: nothing to train"), std::string::npos) << log;
  EXPECT_EQ(read_metrics(c.run_dir()).size(), 3u);
}

// async_save: the background writer saves exactly what a synchronous save does (the snapshot is of its step, not
// of a later one), the losses are unchanged, keep_latest_k leaves the latest two, a run resumed at its last
// iteration saves nothing twice, and temporaries left by a crashed save are removed at start-up, saying so.
TEST(Pretrain, AsyncSavesEqualSynchronousOnesAndRetentionKeepsTheLatest) {
  const std::string root = testing::temp_dir("async-save");
  ExperimentConfig sync = testing::shakespeare_experiment(root + "/sync", 6);
  sync.train.save_interval = 2;
  ASSERT_EQ(run_pretrain(sync, {}), 0);
  ExperimentConfig async = testing::shakespeare_experiment(root + "/async", 6);
  async.train.save_interval = 2;
  async.train.async_save = true;
  async.train.keep_latest_k = 2;
  ASSERT_EQ(run_pretrain(async, {}), 0);

  const std::string a = sync.run_dir() + "/checkpoints", b = async.run_dir() + "/checkpoints";
  EXPECT_TRUE(std::filesystem::exists(a + "/iter_0000002"));
  EXPECT_FALSE(std::filesystem::exists(b + "/iter_0000002")) << "keep_latest_k 2 keeps 4 and 6 only";
  for (const char* iteration : {"/iter_0000004/", "/iter_0000006/"}) {
    for (const char* file : {"model.safetensors", "optimizer.safetensors", "trainer_state.json"}) {
      EXPECT_EQ(read_file(a + iteration + file), read_file(b + iteration + file)) << iteration << file;
    }
  }
  const auto ma = read_metrics(sync.run_dir()), mb = read_metrics(async.run_dir());
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i) EXPECT_EQ(ma[i]["loss"].get<double>(), mb[i]["loss"].get<double>()) << i;
  const std::string log = read_file(async.run_dir() + "/logs/train.log");
  EXPECT_NE(log.find("writing in the background"), std::string::npos) << log;
  EXPECT_NE(log.find("keep_latest_k 2: removed iter_0000002"), std::string::npos) << log;

  std::filesystem::create_directories(b + "/iter_0000008.tmp");  // a save killed part way
  ASSERT_EQ(run_pretrain(async, {}), 0);  // resumed at its last iteration: nothing to train, nothing saved twice
  EXPECT_FALSE(std::filesystem::exists(b + "/iter_0000008.tmp"));
  EXPECT_NE(read_file(async.run_dir() + "/logs/train.log").find("by interrupted saves: iter_0000008.tmp"),
            std::string::npos);
}

// Checkpoints whose tracker was deleted are not overwritten by a run from scratch: the run is refused, naming them.
TEST(Pretrain, CheckpointsWithoutTheirTrackerAreRefused) {
  ExperimentConfig c = testing::shakespeare_experiment(testing::temp_dir("notracker"), 3);
  ASSERT_EQ(run_pretrain(c, {}), 0);
  std::filesystem::remove(c.run_dir() + "/checkpoints/latest_checkpointed_iteration.txt");
  c.train.train_iters = 5;
  try {
    run_pretrain(c, {});
    FAIL() << "trained from scratch over existing checkpoints";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("iter_0000003"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("latest_checkpointed_iteration.txt"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(c.run_dir() + "/checkpoints/iter_0000005"));
}

// An explicit load= that names no checkpoint (a missing path, a file, an empty folder) is an error, not a run from
// scratch.
TEST(Pretrain, LoadNamingNoCheckpointIsAUsageError) {
  const std::string dir = testing::temp_dir("badload");
  write_file_atomic(dir + "/file", "x");
  std::filesystem::create_directories(dir + "/empty");
  for (const std::string& load : {dir + "/missing", dir + "/file", dir + "/empty"}) {
    ExperimentConfig c = testing::shakespeare_experiment(dir, 2);
    c.train.load = load;
    try {
      run_pretrain(c, {});
      FAIL() << "load=" << load << " was ignored";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("load: " + load), std::string::npos) << e.what();
    }
  }
}

// Weights that overflowed in the update are never saved as a checkpoint.
TEST(Pretrain, NonFiniteWeightsAreNotSaved) {
  ExperimentConfig c = testing::shakespeare_experiment(testing::temp_dir("inf"), 1);
  c.train.lr = 1e308;
  c.train.lr_decay_style = "constant";
  c.train.lr_warmup_iters = 0;
  try {
    run_pretrain(c, {});
    FAIL() << "non-finite weights were saved";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(c.run_dir() + "/checkpoints/latest_checkpointed_iteration.txt"));
}

TEST(Pretrain, MissingDataPathIsAUsageError) {
  ExperimentConfig c = testing::shakespeare_experiment(testing::temp_dir("nodata"), 3);
  c.train.data_path = {"/nonexistent/corpus.txt"};
  EXPECT_THROW(run_pretrain(c, {}), UsageError);
}

}  // namespace
}  // namespace primus
