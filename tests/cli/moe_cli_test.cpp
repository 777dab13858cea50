// MoE through the primus-cli binary: the tiny Mixtral and Qwen3-MoE presets train on the CPU engine and their loss
// falls; the MoE metrics and the expert bias; bad MoE configs exit 2 naming the key to change.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/safetensors.h"
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

// metrics.jsonl has every MoE layer's tokens per expert (each step's routing entries: global batch tokens × top-k)
// and its coefficient-free aux and z losses; TensorBoard has Megatron's tags, per layer with moe_per_layer_logging.
TEST_F(MoeCliTest, MetricsShowEachLayersLoadAndLosses) {
  const std::string tensorboard = dir_ + "/tensorboard";
  const std::string config = write_config("tiny_mixtral",
                                          "      moe_z_loss_coeff: 0.001\n"
                                          "      moe_per_layer_logging: true\n"
                                          "      tensorboard_dir: " + tensorboard + "\n",
                                          3);
  const testing::CliResult result = run({"--", "train", "pretrain", "--config", config});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::istringstream in(testing::read_text(dir_ + "/workspace/moe_exp/metrics.jsonl"));
  int records = 0;
  for (std::string line; std::getline(in, line); ++records) {
    const nlohmann::json moe = nlohmann::json::parse(line).at("moe");
    ASSERT_EQ(moe.at("layers").size(), 2u) << line;
    double max_load = 0.0;
    for (int layer = 0; layer < 2; ++layer) {
      const nlohmann::json& l = moe.at("layers")[static_cast<size_t>(layer)];
      EXPECT_EQ(l.at("layer").get<int>(), layer);
      const std::vector<double> tokens = l.at("tokens_per_expert").get<std::vector<double>>();
      ASSERT_EQ(tokens.size(), 4u);
      double sum = 0.0, most = 0.0;
      for (double t : tokens) sum += t, most = std::max(most, t);
      EXPECT_EQ(sum, 4.0 * 32.0 * 2.0) << line;  // global batch 4 × seq 32 tokens, top-2
      EXPECT_DOUBLE_EQ(l.at("max_load").get<double>(), most * 4.0 / sum);
      max_load = std::max(max_load, most * 4.0 / sum);
      // The switch loss is 1 for a perfectly even routing with uniform scores, and at most E.
      EXPECT_GT(l.at("load_balancing_loss").get<double>(), 0.5) << line;
      EXPECT_LT(l.at("load_balancing_loss").get<double>(), 4.0) << line;
      EXPECT_GT(l.at("z_loss").get<double>(), 0.0) << line;
    }
    EXPECT_DOUBLE_EQ(moe.at("max_load").get<double>(), max_load);
    const double mean_aux = (moe["layers"][0]["load_balancing_loss"].get<double>() +
                             moe["layers"][1]["load_balancing_loss"].get<double>()) / 2.0;
    EXPECT_NEAR(moe.at("load_balancing_loss").get<double>(), mean_aux, 1e-12);
  }
  EXPECT_EQ(records, 3);
  std::string events;
  for (const auto& entry : fs::directory_iterator(tensorboard)) events += testing::read_text(entry.path().string());
  for (const char* tag : {"load_balancing_loss", "z_loss", "moe/max_load", "moe/load_balancing_loss_layer_1",
                          "moe/z_loss_layer_0", "moe/max_load_layer_1"}) {
    EXPECT_NE(events.find(tag), std::string::npos) << tag;
  }
}

// An expert capacity: metrics.jsonl counts each layer's dropped routing entries of the global batch beside its tokens
// per expert (which count the router's choices, dropped ones included) and their sum; a capacity factor of 0.25 keeps
// at most a quarter of the mean load per expert and micro-batch, so at least 3/4 of the entries are dropped. With the
// sequence-level aux loss the balancing loss is Megatron's seq_load_balancing_loss (metrics and TensorBoard).
TEST_F(MoeCliTest, MetricsCountTheTokensTheCapacityDrops) {
  const std::string tensorboard = dir_ + "/tensorboard";
  const std::string config = write_config("tiny_mixtral",
                                          "      moe_expert_capacity_factor: 0.25\n"
                                          "      moe_token_drop_policy: position\n"
                                          "      moe_router_load_balancing_type: seq_aux_loss\n"
                                          "      moe_aux_loss_coeff: 0.01\n"
                                          "      moe_per_layer_logging: true\n"
                                          "      tensorboard_dir: " + tensorboard + "\n",
                                          2);
  const testing::CliResult result = run({"--", "train", "pretrain", "--config", config});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::istringstream in(testing::read_text(dir_ + "/workspace/moe_exp/metrics.jsonl"));
  int records = 0;
  for (std::string line; std::getline(in, line); ++records) {
    const nlohmann::json moe = nlohmann::json::parse(line).at("moe");
    double dropped = 0.0;
    for (const nlohmann::json& l : moe.at("layers")) {
      double chosen = 0.0;
      for (double t : l.at("tokens_per_expert").get<std::vector<double>>()) chosen += t;
      EXPECT_EQ(chosen, 4.0 * 32.0 * 2.0) << line;
      // Per micro-batch of 2 x 32 tokens: each of 4 experts keeps at most ceil(64 x 2 / 4 x 0.25) = 8 entries.
      EXPECT_GE(l.at("dropped_tokens").get<double>(), chosen - 2 * 4 * 8) << line;
      EXPECT_LT(l.at("dropped_tokens").get<double>(), chosen) << line;
      dropped += l.at("dropped_tokens").get<double>();
      EXPECT_GT(l.at("seq_load_balancing_loss").get<double>(), 0.5) << line;
      EXPECT_FALSE(l.contains("load_balancing_loss")) << line;
    }
    EXPECT_EQ(moe.at("dropped_tokens").get<double>(), dropped) << line;
  }
  EXPECT_EQ(records, 2);
  std::string events;
  for (const auto& entry : fs::directory_iterator(tensorboard)) events += testing::read_text(entry.path().string());
  for (const char* tag : {"seq_load_balancing_loss", "moe/seq_load_balancing_loss_layer_1", "moe/dropped_tokens",
                          "moe/dropped_tokens_layer_0"}) {
    EXPECT_NE(events.find(tag), std::string::npos) << tag;
  }
}

// Aux-loss-free balancing: after each step every layer's bias moves by rate × sign(mean − load) of that step's
// logged tokens per expert, so the saved bias is the sum of those steps; and it changes the routing.
TEST_F(MoeCliTest, ExpertBiasMovesTowardsTheLessLoadedExperts) {
  const double rate = 0.01;
  const std::string config = write_config("tiny_mixtral",
                                          "      moe_aux_loss_coeff: 0.0\n"
                                          "      moe_router_enable_expert_bias: true\n"
                                          "      moe_router_bias_update_rate: 0.01\n",
                                          4);
  const testing::CliResult result = run({"--", "train", "pretrain", "--config", config});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::vector<std::vector<double>> expected(2, std::vector<double>(4, 0.0));
  std::istringstream in(testing::read_text(dir_ + "/workspace/moe_exp/metrics.jsonl"));
  bool unbalanced = false;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json layers = nlohmann::json::parse(line).at("moe").at("layers");
    for (size_t layer = 0; layer < 2; ++layer) {
      const std::vector<double> tokens = layers[layer].at("tokens_per_expert").get<std::vector<double>>();
      const double mean = (tokens[0] + tokens[1] + tokens[2] + tokens[3]) / 4.0;
      for (size_t e = 0; e < 4; ++e) {
        expected[layer][e] += tokens[e] < mean ? rate : tokens[e] > mean ? -rate : 0.0;
        unbalanced |= tokens[e] != mean;
      }
    }
  }
  ASSERT_TRUE(unbalanced) << "a routing this even cannot tell the update's sign";
  const std::string hf = dir_ + "/hf";
  const testing::CliResult converted = run({"--", "checkpoint", "convert", "--input",
                                            dir_ + "/workspace/moe_exp/checkpoints", "--output", hf});
  ASSERT_EQ(converted.exit_code, 0) << converted.err;
  const SafetensorsFile file = SafetensorsFile::open(hf + "/model.safetensors");
  for (size_t layer = 0; layer < 2; ++layer) {
    const Tensor bias =
        file.read_f32(fmt::format("model.layers.{}.block_sparse_moe.gate.e_score_correction_bias", layer));
    for (size_t e = 0; e < 4; ++e) EXPECT_NEAR(bias.f32()[e], expected[layer][e], 1e-6) << layer << " " << e;
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
      {"      moe_router_enable_expert_bias: true\n      use_megatron_fsdp: true\n"
       "      data_parallel_sharding_strategy: optim_grads_params\n",
       "moe_router_enable_expert_bias with use_megatron_fsdp is not implemented"},
      {"      moe_expert_capacity_factor: 0\n", "moe_expert_capacity_factor"},
      {"      moe_expert_capacity_factor: -1.0\n", "moe_expert_capacity_factor"},
      {"      moe_token_drop_policy: last\n", "moe_token_drop_policy"},
      {"      moe_pad_expert_input_to_capacity: true\n",
       "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor"},
      {"      moe_token_drop_policy: position\n", "moe_token_drop_policy position needs moe_expert_capacity_factor"},
      {"      moe_router_load_balancing_type: sinkhorn\n", "moe_router_load_balancing_type"},
  };
  for (const auto& [extra, message] : cases) {
    const testing::CliResult result = run({"--", "config", "validate", "--config", write_config("tiny_mixtral", extra)});
    EXPECT_EQ(result.exit_code, 2) << extra << result.err;
    EXPECT_NE(result.err.find(message), std::string::npos) << "missing '" << message << "' in:\n" << result.err;
  }
  const testing::CliResult cuda =
      run({"--", "config", "validate", "--config", write_config("tiny_mixtral", ""), "device=cuda"});
  EXPECT_EQ(cuda.exit_code, 0) << cuda.err;  // the CUDA MoE path passed its GPU tests on an H200 (docs/moe.md)
  // Token dropping (both policies, padded) and the sequence-level aux loss run on cuda too (moe_gpu_test): accepted.
  for (const char* extra : {"      moe_expert_capacity_factor: 1.0\n",
                            "      moe_expert_capacity_factor: 1.25\n      moe_token_drop_policy: position\n"
                            "      moe_pad_expert_input_to_capacity: true\n",
                            "      moe_router_load_balancing_type: seq_aux_loss\n"}) {
    const testing::CliResult on_cuda =
        run({"--", "config", "validate", "--config", write_config("tiny_mixtral", extra), "device=cuda"});
    EXPECT_EQ(on_cuda.exit_code, 0) << extra << on_cuda.err;
  }
  // An MoE key on a dense model would do nothing: refused.
  const testing::CliResult dense =
      run({"--", "config", "validate", "--config", write_config("tiny_llama", "      moe_ffn_hidden_size: 64\n")});
  EXPECT_EQ(dense.exit_code, 2);
  EXPECT_NE(dense.err.find("moe_ffn_hidden_size is set but num_experts is not"), std::string::npos) << dense.err;
  const testing::CliResult dense_capacity = run(
      {"--", "config", "validate", "--config", write_config("tiny_llama", "      moe_expert_capacity_factor: 1.0\n")});
  EXPECT_EQ(dense_capacity.exit_code, 2);
  EXPECT_NE(dense_capacity.err.find("moe_expert_capacity_factor is set but num_experts is not"), std::string::npos)
      << dense_capacity.err;
}

}  // namespace
}  // namespace primus
