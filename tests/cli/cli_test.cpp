// End-to-end tests of the primus-cli binary: run it as a user would and check exit codes, stdout and stderr.
// The binary is found next to the tests folder of the build (<build>/tests/cli_test -> <build>/primus-cli),
// so build the primus-cli target before running this test.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "data/indexed_dataset.h"
#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

using testing::cli_path;
using testing::CliResult;
using testing::read_text;
using testing::spawn_cli;
using testing::wait_cli;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(cli_path())) << cli_path() << " not found: build the primus-cli target first";
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    dir_ = testing::temp_dir("cli");
  }

  CliResult run(const std::vector<std::string>& args) { return wait_cli(spawn_cli(args, dir_), dir_); }

  // A valid experiment on the tiny preset with `extra` lines appended; they start at line 18.
  std::string write_config(const std::string& name, const std::string& extra = "", int train_iters = 2) {
    std::string text =
        "exp_name: cli_exp\n"
        "workspace: " +
        dir_ +
        "/workspace\n"
        "env:\n"
        "  PRIMUS_CLI_TEST_VAR: from_yaml\n"
        "modules:\n"
        "  pre_trainer:\n"
        "    framework: megatron\n"
        "    model: tiny_llama\n"
        "    overrides:\n"
        "      train_iters: " +
        std::to_string(train_iters) +
        "\n"
        "      seq_length: 16\n"
        "      micro_batch_size: 2\n"
        "      global_batch_size: 2\n"
        "      lr: 1.0e-3\n"
        "      mock_data: true\n"
        "      log_interval: 1\n"
        "      eval_interval: 0\n" +
        extra;
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  std::string run_dir() const { return dir_ + "/workspace/cli_exp"; }

  std::string dir_;
};

TEST_F(CliTest, VersionPrintsNameAndVersion) {
  CliResult result = run({"--version"});
  EXPECT_EQ(result.exit_code, 0);
#if PRIMUS_WITH_CUDA
  // The versions of the headers the build used, e.g. "(built with CUDA 13.0, cuDNN 9.19.0, NCCL 2.28.9)".
  EXPECT_TRUE(result.out.starts_with(std::string("primus-cli ") + PRIMUS_VERSION + " (built with CUDA "))
      << result.out;
  EXPECT_NE(result.out.find(", cuDNN 9."), std::string::npos) << result.out;
  EXPECT_NE(result.out.find(", NCCL 2."), std::string::npos) << result.out;
#else
  EXPECT_EQ(result.out, std::string("primus-cli ") + PRIMUS_VERSION + " (built without CUDA)\n");
#endif
}

TEST_F(CliTest, HelpAtEveryLevelExitsZeroAndListsWhatIsThere) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"--help"},
       {"--dry-run", "--debug", "--version", "direct", "container", "slurm", "train pretrain", "config validate",
        "Exit codes", "Examples"}},
      {{"-h"}, {"direct", "train pretrain"}},
      {{"direct", "--help"}, {"--log-file", "Examples"}},
      {{"container", "--help"}, {"--image", "--runtime", "--volume", "--env", "Exit codes", "Examples"}},
      {{"slurm", "--help"}, {"srun|sbatch", "--gpus-per-node", "slurm node"}},
      {{"--", "--help"}, {"train", "config"}},
      {{"--", "train", "--help"}, {"pretrain", "posttrain", "Examples"}},
      {{"--", "train", "pretrain", "--help"}, {"--config", "Overrides", "KEY=VALUE", "Examples"}},
      {{"direct", "--", "train", "pretrain", "--help"}, {"--config"}},
      {{"train", "pretrain", "--help"}, {"--config"}},
      {{"--", "train", "posttrain", "--help"}, {"not implemented yet"}},
      {{"--", "config", "--help"}, {"show", "validate", "schema", "Examples"}},
      {{"--", "config", "show", "--help"}, {"--config", "Overrides", "Examples"}},
      {{"--", "config", "validate", "--help"}, {"--config", "OK: FILE", "Examples"}},
      {{"--", "config", "schema", "--help"}, {"--markdown", "Examples"}},
  };
  for (const auto& [args, expected] : cases) {
    CliResult result = run(args);
    std::string command = ::testing::PrintToString(args);
    EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.err;
    EXPECT_TRUE(result.err.empty()) << command << "\n" << result.err;
    for (const std::string& word : expected) EXPECT_CONTAINS(result.out, word) << " for " << command;
  }
}

TEST_F(CliTest, UnknownCommandsAndFlagsExitTwoWithAHint) {
  CliResult result = run({"--", "bogus"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "primus-cli: error: unknown command 'bogus' (expected one of: train, config, data, benchmark, report, checkpoint, preflight, projection, tune)");
  EXPECT_CONTAINS(result.err, "run 'primus-cli --help'");
  EXPECT_TRUE(result.out.empty());

  result = run({"--", "train", "finetune"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "unknown command 'finetune' (expected one of: pretrain, posttrain)");
  EXPECT_CONTAINS(result.err, "run 'primus-cli -- train --help'");

  result = run({"--", "config"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "needs a subcommand: show, validate, schema");

  result = run({"--bogus", "--", "config", "schema"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "primus-cli: error: ");
  EXPECT_CONTAINS(result.err, "--bogus");

  result = run({});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "no command given");
}


TEST_F(CliTest, PosttrainIsNotImplementedYet) {
  CliResult result = run({"--", "train", "posttrain", "--config", write_config("exp.yaml")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_EQ(result.err, "primus-cli: error: posttrain (SFT/LoRA) is not implemented yet\n");
}

TEST_F(CliTest, MissingOrEmptyConfigOptionExitsTwo) {
  CliResult result = run({"--", "train", "pretrain", "lr=0.1"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "primus-cli: error: --config is required");
  EXPECT_CONTAINS(result.err, "run 'primus-cli -- train pretrain --help'");
  result = run({"--", "config", "validate", "--config"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "--config");
  result = run({"--", "config", "validate", "--config", dir_ + "/absent.yaml"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "absent.yaml");
  // Issue 12 hole 13: an empty path was std::filesystem's "cannot make absolute path", exit 3.
  result = run({"--", "train", "pretrain", "--config", ""});
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_CONTAINS(result.err, "[config] experiment file: the file name is empty");
}

// Issue 12 hole 13: a micro-batch no host can hold ran into bad_alloc; it is refused before allocation, exit 2.
TEST_F(CliTest, ABatchThatCannotFitExitsTwoBeforeAllocating) {
  CliResult result = run({"--", "train", "pretrain", "--config", write_config("exp.yaml"),
                          "micro_batch_size=100000000", "global_batch_size=100000000"});
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_CONTAINS(result.err, "the run cannot fit");
  EXPECT_CONTAINS(result.err, "micro_batch_size 100000000");
}

// Issue 12 hole 13: a token id the model has no embedding for failed inside embedding_forward; it is named with
// its dataset file and byte offset, exit 2.
TEST_F(CliTest, TokenIdsBeyondTheVocabularyNameTheDatasetAndOffset) {
  const std::string prefix = dir_ + "/wide_ids";
  {
    IndexedDatasetWriter writer(prefix, TokenDType::kI32);
    for (int d = 0; d < 50; ++d) writer.add_document(std::vector<int32_t>(20, 100000));  // every sample has them
    writer.finish();
  }
  CliResult result = run({"--", "train", "pretrain", "--config", write_config("exp.yaml"), "mock_data=false",
                          "data_path=[" + prefix + "]", "split=1"});
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_CONTAINS(result.err, prefix + ".bin: token 100000 at byte offset ");
  EXPECT_CONTAINS(result.err, "is outside the model's vocabulary");
}

TEST_F(CliTest, ValidateAcceptsAGoodConfigAndOverrides) {
  std::string config = write_config("good.yaml");
  CliResult result = run({"--", "config", "validate", "--config", config});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "OK: " + config + "\n");
  result = run({"config", "validate", "--config", config, "lr=0.5", "--seq_length", "32", "--seed=7", "--mock_data"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "OK: " + config + "\n");
}

TEST_F(CliTest, ValidateNamesFileLineAndKeyOfABadConfig) {
  std::string unknown = write_config("unknown.yaml", "      lerning_rate: 0.1\n");
  CliResult result = run({"--", "config", "validate", "--config", unknown});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_TRUE(result.out.empty()) << result.out;
  EXPECT_CONTAINS(result.err, "primus-cli: error: [config] ");
  EXPECT_CONTAINS(result.err, unknown + ":18");
  EXPECT_CONTAINS(result.err, "lerning_rate");

  std::string wrong_type = write_config("wrong_type.yaml", "      eval_iters: many\n");
  result = run({"--", "config", "validate", "--config", wrong_type});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, wrong_type + ":18");
  EXPECT_CONTAINS(result.err, "eval_iters");
  EXPECT_CONTAINS(result.err, "many");

  result = run({"--", "config", "validate", "--config", write_config("good.yaml"), "seq_length=long"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "seq_length");
}

TEST_F(CliTest, MalformedOverridesExitTwo) {
  std::string config = write_config("exp.yaml");
  CliResult result = run({"--", "train", "pretrain", "--config", config, "oops"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "unexpected argument 'oops'");
  result = run({"--", "train", "pretrain", "--config", config, "-x"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "unknown option '-x'");
}

TEST_F(CliTest, ConfigShowAndSchemaPrintToStdout) {
  CliResult result = run({"--", "config", "show", "--config", write_config("exp.yaml"), "--lr", "0.25"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_CONTAINS(result.out, "train_iters");
  EXPECT_CONTAINS(result.out, "0.25");
  EXPECT_CONTAINS(result.out, "command line");

  result = run({"--", "config", "schema", "--markdown"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_CONTAINS(result.out, "train_iters");
  EXPECT_CONTAINS(result.out, "|");
}

TEST_F(CliTest, DryRunReportsThePlanAndStartsNothing) {
  std::string config = write_config("exp.yaml");
  CliResult result = run({"--dry-run", "direct", "--log-file", dir_ + "/logs/run.log", "--", "train", "pretrain",
                          "--config", config, "train_iters=7"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_CONTAINS(result.out, "dry run");
  EXPECT_CONTAINS(result.out, "direct");
  EXPECT_CONTAINS(result.out, "train pretrain");
  EXPECT_CONTAINS(result.out, config);
  EXPECT_CONTAINS(result.out, "train_iters=7");
  EXPECT_CONTAINS(result.out, "run dir      " + run_dir());
  EXPECT_CONTAINS(result.out, "7 iters");
  EXPECT_CONTAINS(result.out, "PRIMUS_CLI_TEST_VAR=from_yaml");
  EXPECT_FALSE(fs::exists(run_dir()));
  EXPECT_FALSE(fs::exists(dir_ + "/logs"));

  // --dry-run after the mode works too, and a bad config still fails.
  result = run({"direct", "--dry-run", "--", "train", "pretrain", "--config",
                write_config("bad.yaml", "      eval_iters: x\n")});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err, "bad.yaml:18");
  EXPECT_TRUE(result.out.empty()) << result.out;
}

TEST_F(CliTest, LogFileReceivesTheLogAndTheFinalError) {
  std::string log = dir_ + "/deep/logs/run.log";
  CliResult result = run({"direct", "--log-file", log, "--", "train", "pretrain", "--config",
                          write_config("bad.yaml", "      eval_iters: x\n")});
  EXPECT_EQ(result.exit_code, 2);
  ASSERT_TRUE(fs::exists(log));
  EXPECT_CONTAINS(read_text(log), "primus-cli: error: [config] ");
  EXPECT_CONTAINS(read_text(log), "bad.yaml:18");
}

TEST_F(CliTest, TrainPretrainRunsAppliesEnvAndTeesTheLog) {
  setenv("PRIMUS_CLI_TEST_VAR", "from_shell", 1);
  std::string log = dir_ + "/run.log";
  CliResult result = run({"--debug", "direct", "--log-file", log, "--", "train", "pretrain", "--config",
                          write_config("exp.yaml"), "train_iters=2"});
  unsetenv("PRIMUS_CLI_TEST_VAR");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  std::string text = read_text(log);
  EXPECT_CONTAINS(text, "env: PRIMUS_CLI_TEST_VAR=from_yaml (from the config; the shell had from_shell)");
  EXPECT_CONTAINS(text, "[debug] overrides: train_iters=2");
  EXPECT_CONTAINS(text, "iteration");
  EXPECT_TRUE(fs::exists(run_dir() + "/config.yaml"));
}

// A log that cannot be written (a full disk; /dev/full fails every write) is an error, not a silent loss: the
// first failure is said at once and the run, though it trained, exits 3.
TEST_F(CliTest, ALogFileOnAFullDiskFailsTheRun) {
  CliResult result = run({"direct", "--log-file", "/dev/full", "--", "train", "pretrain", "--config",
                          write_config("exp.yaml"), "train_iters=2"});
  EXPECT_EQ(result.exit_code, 3) << result.err;
  EXPECT_CONTAINS(result.err, "writing the log failed: ");
  EXPECT_CONTAINS(result.err, "/dev/full");
  EXPECT_CONTAINS(result.err, "the log is incomplete");
  EXPECT_TRUE(fs::exists(run_dir() + "/checkpoints/iter_0000002")) << "the training itself completed";
}

TEST_F(CliTest, SigtermStopsTrainingWithExitCode143) {
  std::string log = dir_ + "/run.log";
  pid_t pid = spawn_cli({"direct", "--log-file", log, "--", "train", "pretrain", "--config",
                         write_config("exp.yaml", "", /*train_iters=*/100000)},
                        dir_);
  // Signal once training is under way (the first logged iteration), at most ~20 s later.
  for (int i = 0; i < 400 && read_text(log).find("iteration") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(read_text(log).find("iteration"), std::string::npos) << read_text(dir_ + "/stderr");
  kill(pid, SIGTERM);
  CliResult result = wait_cli(pid, dir_);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.err;
  EXPECT_CONTAINS(result.err, "SIGTERM received");
}

}  // namespace
}  // namespace primus
