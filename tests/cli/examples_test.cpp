// The example configs train on what scripts/prepare_default_data.sh makes (the default job's path: GPT-2's
// tokenizer exported from its npm package, Debian's fortunes as JSONL, `data preprocess` into a Megatron indexed
// dataset), through the built primus-cli, shortened to a few iterations.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;

class ExampleConfigs : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(testing::cli_path())) << "build the primus-cli target first";
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    data_ = testing::use_default_data();
    ASSERT_FALSE(data_.empty()) << "scripts/prepare_default_data.sh failed (see stderr)";
    dir_ = testing::temp_dir("examples");
  }

  CliResult cli(const std::vector<std::string>& args) {
    return testing::wait_cli(testing::spawn_cli(args, dir_), dir_);
  }

  std::vector<double> losses(const std::string& run_dir) {
    std::vector<double> out;
    std::istringstream in(testing::read_text(run_dir + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto record = nlohmann::json::parse(line);
      if (record.contains("loss")) out.push_back(record["loss"].get<double>());
    }
    return out;
  }

  std::string data_, dir_;
};

TEST_F(ExampleConfigs, PreparedDataIsAnIndexedDatasetOfFortunesInGpt2Tokens) {
  const std::string prefix = data_ + "/fortunes_gpt2_text_document";
  ASSERT_TRUE(fs::exists(prefix + ".bin") && fs::exists(prefix + ".idx"));
  const CliResult inspect = cli({"data", "inspect", prefix, "--tokenizer-type", "GPT2BPETokenizer",
                                 "--tokenizer-model", data_ + "/tokenizers/gpt2", "--document", "0"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  // Megatron's EOD for GPT-2 is <|endoftext|> (50256), appended to every fortune.
  EXPECT_NE(inspect.out.find("<|endoftext|>"), std::string::npos) << inspect.out;
}

TEST_F(ExampleConfigs, DefaultJobTrainsOnItsIndexedDataWithGpt2Tokenizer) {
  const std::string workspace = dir_ + "/workspace";
  const CliResult train =
      cli({"train", "pretrain", "--config", PRIMUS_SOURCE_DIR "/configs/examples/default_cpu.yaml",
           "workspace=" + workspace, "exp_name=default_job", "train_iters=6", "lr_warmup_iters=2", "log_interval=1",
           "eval_interval=3", "eval_iters=1", "save_interval=0", "sample_length=8"});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const std::string log = train.out + train.err;
  EXPECT_NE(log.find("data: indexed datasets " + data_ + "/fortunes_gpt2_text_document"), std::string::npos) << log;
  EXPECT_NE(log.find("vocab 50304"), std::string::npos) << log;  // GPT-2's 50257 padded to a multiple of 128
  const std::vector<double> loss = losses(workspace + "/default_job");
  ASSERT_EQ(loss.size(), 6u);
  EXPECT_NEAR(loss.front(), std::log(50304.0), 0.5);  // a fresh model: about uniform over the vocabulary
  EXPECT_LT(loss.back(), loss.front() - 0.2);
}

TEST_F(ExampleConfigs, TinyConfigTrainsOnTheSameData) {
  const std::string workspace = dir_ + "/workspace";
  const CliResult train = cli({"train", "pretrain", "--config", PRIMUS_SOURCE_DIR "/configs/examples/tiny_cpu.yaml",
                               "workspace=" + workspace, "exp_name=tiny", "train_iters=12", "save_interval=0",
                               "eval_interval=0", "sample_length=0"});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const std::vector<double> loss = losses(workspace + "/tiny");
  ASSERT_EQ(loss.size(), 12u);
  EXPECT_LT(loss.back(), loss.front() - 0.2);
}

// The GPU configs name the example data and Llama 3's tokenizer; `benchmark train` runs on random tokens and must
// not need either when the model's vocabulary size is given (vocab_size here, the preset's in configs/H200).
TEST_F(ExampleConfigs, BenchmarkNeedsNoTokenizerFileWhenTheVocabularySizeIsGiven) {
  const std::string config = PRIMUS_SOURCE_DIR "/configs/examples/tiny_cpu.yaml";
  const CliResult given = cli({"benchmark", "train", "--config", config, "vocab_size=512",
                               "tokenizer_model=" + dir_ + "/missing", "--warmup", "1", "--steps", "1"});
  EXPECT_EQ(given.exit_code, 0) << given.err;
  const CliResult derived = cli({"benchmark", "train", "--config", config, "tokenizer_model=" + dir_ + "/missing",
                                 "--warmup", "1", "--steps", "1"});
  EXPECT_EQ(derived.exit_code, 2) << derived.err;  // the size comes from the tokenizer, which is missing
  EXPECT_NE(derived.err.find(dir_ + "/missing"), std::string::npos) << derived.err;
}

}  // namespace
}  // namespace primus
