// MoE through the primus-cli binary: the tiny Mixtral and Qwen3-MoE presets train on the CPU engine and their loss
// falls; bad MoE configs exit 2 naming the key to change.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

class MoeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(testing::cli_path())) << testing::cli_path() << " not found: build primus-cli first";
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    dir_ = testing::temp_dir("moe_cli");
  }

  // An experiment on `preset` on the CPU (mock data, or Shakespeare's text in bytes with `text`); `extra` override lines
  // appended.
  std::string write_config(const std::string& preset, const std::string& extra, int train_iters = 2,
                           bool text = false) {
    const std::string path = dir_ + "/" + preset + ".yaml";
    std::ofstream(path) << "exp_name: moe_exp\n"
                           "workspace: " << dir_ << "/workspace\n"
                           "modules:\n"
                           "  pre_trainer:\n"
                           "    framework: megatron\n"
                           "    model: " << preset << "\n"
                           "    overrides:\n"
                           "      device: cpu\n"
                           "      train_iters: " << train_iters << "\n"
                           "      seq_length: 32\n"
                           "      micro_batch_size: 2\n"
                           "      global_batch_size: 4\n"
                           "      lr: 3.0e-3\n"
                           "      lr_warmup_iters: 0\n"
                        << (text ? "      data_path: [" + testing::shakespeare_path() + "]\n" : "      mock_data: true\n")
                        << "      log_interval: 1\n"
                           "      eval_interval: 0\n"
                        << extra;
    return path;
  }

  testing::CliResult run(const std::vector<std::string>& args) {
    return testing::wait_cli(testing::spawn_cli(args, dir_), dir_);
  }

  std::string dir_;
};

// The losses logged in metrics.jsonl, in step order.
std::vector<double> logged_losses(const std::string& path) {
  std::vector<double> losses;
  std::istringstream in(testing::read_text(path));
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"loss\":");
    if (at != std::string::npos && line.find("\"eval_loss\"") == std::string::npos) {
      losses.push_back(std::stod(line.substr(at + 7)));
    }
  }
  return losses;
}

// Two micro-batches a step (the aux losses weighted by their tokens), Shakespeare's bytes; then the run resumes from
// its checkpoint (config.json with the MoE fields, read back and compared with the configured model).
TEST_F(MoeCliTest, TinyPresetsTrainTheLossFallsAndTheRunResumes) {
  for (const std::string preset : {"tiny_mixtral", "tiny_qwen3_moe"}) {
    fs::remove_all(dir_ + "/workspace");
    const std::string config = write_config(preset, "", 40, true);
    const testing::CliResult result = run({"--", "train", "pretrain", "--config", config});
    ASSERT_EQ(result.exit_code, 0) << preset << "\n" << result.err;
    const std::string metrics = dir_ + "/workspace/moe_exp/metrics.jsonl";
    const std::vector<double> losses = logged_losses(metrics);
    ASSERT_EQ(losses.size(), 40u) << preset;
    EXPECT_LT(losses.back(), losses.front() - 1.0) << preset << ": " << losses.front() << " -> " << losses.back();
    const testing::CliResult resumed = run({"--", "train", "pretrain", "--config", config, "train_iters=43"});
    ASSERT_EQ(resumed.exit_code, 0) << preset << "\n" << resumed.err;
    EXPECT_EQ(logged_losses(metrics).size(), 43u) << preset;
  }
}

TEST_F(MoeCliTest, BadMoeConfigsExit2NamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"      moe_router_topk: 5\n", "moe_router_topk (5) exceeds num_experts"},
      {"      moe_router_num_groups: 3\n      moe_router_group_topk: 1\n",
       "moe_router_num_groups (3) must divide num_experts"},
      {"      moe_router_num_groups: 2\n", "moe_router_num_groups needs moe_router_group_topk"},
      {"      moe_layer_freq: [1, 0, 1]\n", "moe_layer_freq lists 3 layers but the model has 2"},
      {"      moe_layer_freq: 0\n", "moe_layer_freq"},
      {"      moe_router_score_function: sigmoid\n      moe_router_pre_softmax: true\n",
       "moe_router_pre_softmax applies to softmax scores only"},
      {"      moe_router_enable_expert_bias: true\n", "moe_router_enable_expert_bias"},
  };
  for (const auto& [extra, message] : cases) {
    const testing::CliResult result = run({"--", "config", "validate", "--config", write_config("tiny_mixtral", extra)});
    EXPECT_EQ(result.exit_code, 2) << extra << result.err;
    EXPECT_NE(result.err.find(message), std::string::npos) << "missing '" << message << "' in:\n" << result.err;
  }
  const testing::CliResult cuda =
      run({"--", "config", "validate", "--config", write_config("tiny_mixtral", ""), "device=cuda"});
  EXPECT_EQ(cuda.exit_code, 0) << cuda.err;  // MoE runs on cuda too (validate needs no device)
  // An MoE key on a dense model would do nothing: refused.
  const testing::CliResult dense =
      run({"--", "config", "validate", "--config", write_config("tiny_llama", "      moe_ffn_hidden_size: 64\n")});
  EXPECT_EQ(dense.exit_code, 2);
  EXPECT_NE(dense.err.find("moe_ffn_hidden_size is set but num_experts is not"), std::string::npos) << dense.err;
}

}  // namespace
}  // namespace primus
