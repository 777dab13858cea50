// `primus-cli projection memory|performance` and `tune` through the binary, without a GPU: every preset answers both
// projections; a 405B model planned on 8 x 8 GPUs gives one plan per pipeline stage and a step; the bytes are the
// trainer's own table (the same total `benchmark train` logs for the same config); tune prints a winner that loads;
// bad layouts, GPUs and rate files exit 2 naming what to change.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

class ProjectionCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(testing::cli_path())) << testing::cli_path() << " not found: build primus-cli first";
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    dir_ = testing::temp_dir("projection_cli");
  }

  // A bf16 pretraining experiment of `preset` on mock tokens; `extra` override lines appended.
  std::string write_config(const std::string& preset, const std::string& extra = "", int seq_length = 4096) {
    const std::string path = dir_ + "/" + preset + ".yaml";
    std::ofstream(path) << "exp_name: projection\n"
                           "workspace: " << dir_ << "/workspace\n"
                           "modules:\n"
                           "  pre_trainer:\n"
                           "    framework: megatron\n"
                           "    model: " << preset << "\n"
                           "    overrides:\n"
                           "      train_iters: 10\n"
                           "      seq_length: " << seq_length << "\n"
                           "      micro_batch_size: 1\n"
                           "      lr: 3.0e-4\n"
                           "      bf16: true\n"
                           "      mock_data: true\n"
                        << extra;
    return path;
  }

  // A tiny Llama on the CPU engine (mock tokens, 2 steps of 64 tokens); `extra` override lines appended.
  std::string write_cpu_config(const std::string& name, const std::string& extra) {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path) << "exp_name: " << name << "\n"
                           "workspace: " << dir_ << "/workspace\n"
                           "modules:\n"
                           "  pre_trainer:\n"
                           "    framework: megatron\n"
                           "    model: tiny_llama\n"
                           "    overrides:\n"
                           "      device: cpu\n"
                           "      train_iters: 2\n"
                           "      seq_length: 64\n"
                           "      lr: 1.0e-3\n"
                           "      mock_data: true\n"
                        << extra;
    return path;
  }

  testing::CliResult run(const std::vector<std::string>& args) {
    return testing::wait_cli(testing::spawn_cli(args, dir_), dir_);
  }

  nlohmann::json run_json(const std::vector<std::string>& args) {
    const testing::CliResult r = run(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
  }

  std::string dir_;
};

TEST_F(ProjectionCliTest, EveryLoadablePresetAnswers) {
  int answered = 0;
  for (const auto& entry : fs::directory_iterator(PRIMUS_SOURCE_DIR "/configs/models")) {
    const std::string name = entry.path().stem().string();
    // Partial files, and the presets of models whose features the engine lacks (presets_test: they exit 2). 256
    // tokens: the tiny presets' longest sequence.
    if (name.ends_with("_base") || name.starts_with("gpt_oss")) continue;
    const nlohmann::json j = run_json({"--", "projection", "memory", "--config", write_config(name, "", 256), "--gpu", "H100", "--json"});
    if (j.is_null()) continue;
    ASSERT_EQ(j.at("stages").size(), 1u) << name;
    const nlohmann::json& bytes = j["stages"][0]["bytes"];
    const int64_t parameters = j["stages"][0]["parameters"].get<int64_t>();
    EXPECT_EQ(bytes["parameters"].get<int64_t>(), 4 * parameters) << name;
    EXPECT_EQ(bytes["compute_copy"].get<int64_t>(), 2 * parameters) << name;
    EXPECT_EQ(bytes["optimizer"].get<int64_t>(), 8 * parameters) << name;
    EXPECT_GT(bytes["activations"].get<int64_t>(), 0) << name;
    int64_t sum = 0;
    for (const char* kind : {"parameters", "compute_copy", "gradients", "optimizer", "communication", "activations"}) {
      sum += bytes[kind].get<int64_t>();
    }
    EXPECT_EQ(bytes["total"].get<int64_t>(), sum - bytes["not_at_once"].get<int64_t>()) << name;
    EXPECT_EQ(j["gpu"]["name"], "H100") << name;
    const nlohmann::json step = run_json({"--", "projection", "performance", "--config", write_config(name, "", 256),
                                          "--gpu", "H100", "--json"});
    ASSERT_FALSE(step.is_null()) << name;
    EXPECT_GT(step["step_ms"].get<double>(), 0.0) << name;
    EXPECT_GT(step["mfu"].get<double>(), 0.0) << name;
    EXPECT_LT(step["mfu"].get<double>(), 0.8) << name;
    ++answered;
  }
  EXPECT_GE(answered, 20);
}

// DeepSeek-V3 with its multi-token prediction module answers both projections in under a second (beyond the time the
// program takes to start and print its help, about a second itself on a loaded two-core machine); the module's
// parameters, activations and step time are in them (against the same config with mtp_num_layers 0), and on two
// pipeline stages the last holds the module and a copy of the embedding.
TEST_F(ProjectionCliTest, DeepSeekV3AnswersWithItsMultiTokenPrediction) {
  auto seconds_of = [&](const std::vector<std::string>& args, nlohmann::json* j) {
    const auto start = std::chrono::steady_clock::now();
    if (j != nullptr) {
      *j = run_json(args);
    } else {
      EXPECT_EQ(run(args).exit_code, 0);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double startup = seconds_of({"--", "projection", "memory", "--help"}, nullptr);
  auto timed_json = [&](const std::vector<std::string>& args) {
    nlohmann::json j;
    EXPECT_LT(seconds_of(args, &j), startup + 1.0) << args[2] << " (the program starts in " << startup << " s)";
    return j;
  };
  const std::string with_mtp = write_config("deepseek_v3");
  const nlohmann::json memory = timed_json({"--", "projection", "memory", "--config", with_mtp, "--gpu", "H200", "--json"});
  const nlohmann::json step =
      timed_json({"--", "projection", "performance", "--config", with_mtp, "--gpu", "H200", "--json"});
  ASSERT_FALSE(memory.is_null() || step.is_null());
  const std::string path = write_config("deepseek_v3", "      mtp_num_layers: 0\n");
  const nlohmann::json memory0 = run_json({"--", "projection", "memory", "--config", path, "--gpu", "H200", "--json"});
  const nlohmann::json step0 = run_json({"--", "projection", "performance", "--config", path, "--gpu", "H200", "--json"});
  ASSERT_FALSE(memory0.is_null() || step0.is_null());
  const int64_t parameters = memory["stages"][0]["parameters"].get<int64_t>();
  const int64_t main_parameters = memory0["stages"][0]["parameters"].get<int64_t>();
  EXPECT_NEAR(static_cast<double>(main_parameters), 671e9, 0.5e9);
  EXPECT_NEAR(static_cast<double>(parameters - main_parameters), 11.61e9, 0.01e9);  // without the shared copies
  EXPECT_GT(memory["stages"][0]["bytes"]["activations"].get<int64_t>(),
            memory0["stages"][0]["bytes"]["activations"].get<int64_t>());
  // A 62nd layer of 61, and the output layer again: a few percent more time.
  const double ratio = step["step_ms"].get<double>() / step0["step_ms"].get<double>();
  EXPECT_GT(ratio, 1.01);
  EXPECT_LT(ratio, 1.1);

  const std::string split = write_config("deepseek_v3",
                                         "      pipeline_model_parallel_size: 2\n"
                                         "      decoder_first_pipeline_num_layers: 31\n"
                                         "      global_batch_size: 8\n");
  const nlohmann::json stages = timed_json(
      {"--", "projection", "memory", "--config", split, "--nnodes", "1", "--gpus-per-node", "2", "--gpu", "H200", "--json"});
  ASSERT_FALSE(stages.is_null());
  ASSERT_EQ(stages["stages"].size(), 2u);
  const int64_t copy = 129280LL * 7168;  // the last stage's embedding, for the module's shifted tokens
  EXPECT_EQ(stages["stages"][0]["parameters"].get<int64_t>() + stages["stages"][1]["parameters"].get<int64_t>(),
            parameters + copy);
  EXPECT_NE(stages["stages"][1]["pipeline"].get<std::string>().find("multi-token prediction"), std::string::npos)
      << stages.dump(1);
  EXPECT_TRUE(timed_json({"--", "projection", "performance", "--config", split, "--nnodes", "1", "--gpus-per-node",
                          "2", "--gpu", "H200", "--json"})
                  .contains("step_ms"));
}

TEST_F(ProjectionCliTest, Llama405BOnSixtyFourGpusPlansEachStage) {
  const std::string config = write_config("llama3.1_405B",
                                          "      tensor_model_parallel_size: 8\n"
                                          "      pipeline_model_parallel_size: 8\n"
                                          "      sequence_parallel: true\n"
                                          "      use_distributed_optimizer: true\n"
                                          "      recompute_granularity: full\n"
                                          "      recompute_method: uniform\n"
                                          "      recompute_num_layers: 1\n"
                                          "      decoder_first_pipeline_num_layers: 15\n"
                                          "      decoder_last_pipeline_num_layers: 15\n"
                                          "      global_batch_size: 64\n");
  const nlohmann::json many = run_json({"--", "projection", "memory", "--config", config, "--nnodes", "8",
                                        "--gpus-per-node", "8", "--gpu", "h200", "--json"});
  ASSERT_FALSE(many.is_null());
  EXPECT_EQ(many["world_size"], 64);
  EXPECT_EQ(many["gpu"]["name"], "H200");
  ASSERT_EQ(many["stages"].size(), 8u);
  // 126 layers over 8 stages (15, 6 x 16, 15), each holding a tensor-parallel rank's eighth of its layers.
  int64_t parameters = 0;
  for (const nlohmann::json& stage : many["stages"]) parameters += stage["parameters"].get<int64_t>();
  EXPECT_NEAR(static_cast<double>(parameters) * 8.0, 405.85e9, 1.5e9);  // the stages hold 1/tp each
  EXPECT_NE(many["verdict"], "OOM") << many.dump(1);
  const nlohmann::json step = run_json({"--", "projection", "performance", "--config", config, "--nnodes", "8",
                                        "--gpus-per-node", "8", "--gpu", "h200", "--json"});
  ASSERT_FALSE(step.is_null());
  EXPECT_EQ(step["micro_batches"], 64);
  std::vector<std::string> parts;
  for (const nlohmann::json& part : step["parts"]) parts.push_back(part["name"]);
  for (const char* part : {"GEMMs", "attention", "tensor-parallel all-reduce", "pipeline bubble", "optimizer (AdamW)"}) {
    EXPECT_NE(std::find(parts.begin(), parts.end(), part), parts.end()) << part << " missing in " << step.dump(1);
  }
  // Published runs of this model on thousands of H100s reached 38-43% MFU; the projection should not promise more
  // than the single-GPU engine reaches (~0.6).
  EXPECT_GT(step["mfu"].get<double>(), 0.25);
  EXPECT_LT(step["mfu"].get<double>(), 0.6);
  // The same model on one GPU cannot fit, and the report says what to change.
  const testing::CliResult one =
      run({"--", "projection", "memory", "--config", write_config("llama3.1_405B"), "--gpu", "H200"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NE(one.out.find("verdict: OOM"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("What to change:"), std::string::npos) << one.out;
}

// The projection's total is the trainer's: `benchmark train` logs the same table for the same config.
TEST_F(ProjectionCliTest, TheTotalIsTheOneTheTrainerLogs) {
  const std::string config = write_cpu_config("cpu", "      micro_batch_size: 2\n");
  const testing::CliResult bench = run({"--", "benchmark", "train", "--config", config, "--warmup", "0", "--steps", "1"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const testing::CliResult projected = run({"--", "projection", "memory", "--config", config});
  ASSERT_EQ(projected.exit_code, 0) << projected.err;
  auto total_line = [](const std::string& text) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find("  total  ");
      if (at != std::string::npos) return line.substr(at);
    }
    return std::string();
  };
  EXPECT_FALSE(total_line(projected.out).empty()) << projected.out;
  EXPECT_EQ(total_line(projected.out), total_line(bench.err)) << projected.out << "\n---\n" << bench.err;
}

TEST_F(ProjectionCliTest, TunePrintsAWinnerThatLoads) {
  const std::string config = write_config("llama3.2_1B", "      global_batch_size: 16\n");
  const testing::CliResult r = run({"--", "tune", "--config", config, "--gpus-per-node", "4", "--gpu", "H200", "--top", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("layouts on 1 node(s) x 4 H200"), std::string::npos) << r.out;
  // The winner's overrides, as printed, give the projection tune ranked it by.
  std::vector<std::string> overrides;
  const size_t start = r.out.find("The fastest by projection, as overrides");
  ASSERT_NE(start, std::string::npos) << r.out;
  std::istringstream in(r.out.substr(start));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line) && line.rfind("  ", 0) == 0) {
    const size_t colon = line.find(": ");
    overrides.push_back(line.substr(2, colon - 2) + "=" + line.substr(colon + 2));
  }
  ASSERT_FALSE(overrides.empty()) << r.out;
  const nlohmann::json tuned = run_json({"--", "tune", "--config", config, "--gpus-per-node", "4", "--gpu", "H200", "--json"});
  ASSERT_FALSE(tuned.is_null());
  EXPECT_GT(tuned["fit"].get<int64_t>(), 0);
  std::vector<std::string> command = {"--", "projection", "performance", "--config", config, "--gpus-per-node", "4",
                                      "--gpu", "H200", "--json"};
  command.insert(command.end(), overrides.begin(), overrides.end());
  const nlohmann::json step = run_json(command);
  ASSERT_FALSE(step.is_null());
  EXPECT_DOUBLE_EQ(step["tokens_per_s_per_gpu"].get<double>(),
                   tuned["ranked"][0]["projection"]["tokens_per_s_per_gpu"].get<double>());
}

// --confirm times the best candidates with benchmark train in child processes (here two CPU ranks over Gloo each) and
// names the fastest measured one; it needs the candidates to run on this machine.
TEST_F(ProjectionCliTest, TuneConfirmTimesTheBestCandidates) {
  const std::string config = write_cpu_config("tiny", "      global_batch_size: 8\n");
  const nlohmann::json j = run_json({"--", "tune", "--config", config, "--gpus-per-node", "2", "--gpu", "H200",
                                     "--confirm", "2", "--confirm-warmup", "1", "--confirm-steps", "1", "--json"});
  ASSERT_FALSE(j.is_null());
  ASSERT_GE(j["ranked"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const nlohmann::json& measured = j["ranked"][i]["measured"];
    ASSERT_TRUE(measured.contains("tokens_per_s_per_gpu")) << measured.dump();
    EXPECT_GT(measured["tokens_per_s_per_gpu"].get<double>(), 0.0);
  }
  EXPECT_FALSE(j["ranked"][2].contains("measured"));
  const int best = j["measured_best"].get<int>();
  ASSERT_TRUE(best == 0 || best == 1) << j.dump(1);
  EXPECT_GE(j["ranked"][best]["measured"]["tokens_per_s_per_gpu"].get<double>(),
            j["ranked"][1 - best]["measured"]["tokens_per_s_per_gpu"].get<double>());

  const testing::CliResult nodes =
      run({"--", "tune", "--config", config, "--nnodes", "2", "--gpus-per-node", "2", "--confirm", "1"});
  EXPECT_EQ(nodes.exit_code, 2) << nodes.err;
  EXPECT_NE(nodes.err.find("--confirm runs the candidates on this machine's GPUs"), std::string::npos) << nodes.err;
}

TEST_F(ProjectionCliTest, BadLayoutsAndGpusExit2NamingWhatToChange) {
  const std::string config = write_config("llama3.2_1B");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--gpus-per-node", "3", "tensor_model_parallel_size=2"}, "tensor_model_parallel_size"},
      {{"--gpus-per-node", "3", "tensor_model_parallel_size=3"}, "num_attention_heads"},
      {{"--gpu", "A100"}, "--gpu A100: not a GPU the projection knows (H100, H200, B200, MI300X, MI325X, MI355X)"},
      {{"--gpus-per-node", "2", "pipeline_model_parallel_size=2", "num_layers_per_virtual_pipeline_stage=3"},
       "num_layers_per_virtual_pipeline_stage"},
  };
  for (const char* what : {"memory", "performance"}) {
    for (const auto& [args, message] : cases) {
      std::vector<std::string> command = {"--", "projection", what, "--config", config};
      command.insert(command.end(), args.begin(), args.end());
      const testing::CliResult r = run(command);
      EXPECT_EQ(r.exit_code, 2) << what << " " << args.back() << "\n" << r.err;
      EXPECT_NE(r.err.find(message), std::string::npos) << "missing '" << message << "' in:\n" << r.err;
    }
  }
  std::ofstream(dir_ + "/rates.jsonl") << "{\"op\": \"q_proj\"}\n";
  const testing::CliResult rates =
      run({"--", "projection", "performance", "--config", config, "--rates", dir_ + "/rates.jsonl"});
  EXPECT_EQ(rates.exit_code, 2) << rates.err;
  EXPECT_NE(rates.err.find("rates.jsonl line 1: no \"pass\""), std::string::npos) << rates.err;
}

}  // namespace
}  // namespace primus
