// Progress bars and the memory table through the binary: `train pretrain` and `benchmark train` run once on a
// pseudo-terminal (stderr a TTY: bars redrawn with \r, erased before every log line, so no log line shares a
// line with a bar) and once into files (no \r at all, the log unchanged), each logging the memory table.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)

struct PtyResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together, as the terminal received them ("\r\n" made "\n")
};

// Runs primus-cli with stdout and stderr on a new pseudo-terminal 200 columns wide.
PtyResult run_on_pty(const std::vector<std::string>& args) {
  std::string binary = testing::cli_path().string();
  std::vector<std::string> copies(args);
  std::vector<char*> argv{binary.data()};
  for (std::string& arg : copies) argv.push_back(arg.data());
  argv.push_back(nullptr);
  winsize size{};
  size.ws_row = 50;
  size.ws_col = 200;
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, &size);
  if (pid == 0) {
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  PtyResult result;
  if (pid < 0) {
    ADD_FAILURE() << "forkpty failed: " << std::strerror(errno);
    return result;
  }
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::read(master, buffer, sizeof(buffer));
    if (got > 0) {
      result.output.append(buffer, static_cast<size_t>(got));
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO once the child has closed the terminal
    }
  }
  ::close(master);
  int status = 0;
  if (::waitpid(pid, &status, 0) == pid && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  std::string text;
  for (size_t i = 0; i < result.output.size(); ++i) {
    if (result.output[i] == '\r' && i + 1 < result.output.size() && result.output[i + 1] == '\n') continue;
    text.push_back(result.output[i]);
  }
  result.output = text;
  return result;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (size_t end = text.find(separator); end != std::string::npos; end = text.find(separator, begin)) {
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  parts.push_back(text.substr(begin));
  return parts;
}

// Every log line ("[HH:MM:SS] [level] ...") starts its line, or directly follows the blanks that erased a bar;
// no piece of a line holds both a bar and log text.
void expect_log_lines_intact(const std::string& output) {
  int log_lines = 0;
  for (const std::string& line : split(output, '\n')) {
    const std::vector<std::string> pieces = split(line, '\r');
    for (size_t k = 0; k < pieces.size(); ++k) {
      const std::string& piece = pieces[k];
      const size_t level = piece.find("] [");
      if (level == std::string::npos || piece.find("info") == std::string::npos) continue;
      ++log_lines;
      EXPECT_EQ(piece.front(), '[') << "log text after other text: '" << piece << "'";
      EXPECT_EQ(piece.find(" ["), piece.find("] [") + 1) << piece;
      if (k == 0) continue;
      // A bar was drawn on this line: the piece just before the log text is the blanks that erased it, as wide
      // as anything drawn on the line before.
      const std::string& erase = pieces[k - 1];
      EXPECT_EQ(erase.find_first_not_of(' '), std::string::npos)
          << "a bar left on the line of '" << piece << "': '" << erase << "'";
      for (size_t j = 0; j + 1 < k; ++j) EXPECT_GE(erase.size(), pieces[j].size()) << pieces[j];
    }
  }
  EXPECT_GT(log_lines, 5);
}

class ProgressCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(testing::cli_path())) << "build primus-cli first: " << testing::cli_path();
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    unsetenv("PRIMUS_PROGRESS");
    dir_ = testing::temp_dir("progress-cli");
    config_ = dir_ + "/exp.yaml";
    std::ofstream(config_) << "exp_name: bars\n"
                              "workspace: "
                           << dir_
                           << "/workspace\n"
                              "modules:\n"
                              "  pre_trainer:\n"
                              "    framework: megatron\n"
                              "    model: tiny_llama\n"
                              "    overrides:\n"
                              "      train_iters: 60\n"
                              "      seq_length: 32\n"
                              "      micro_batch_size: 2\n"
                              "      global_batch_size: 4\n"
                              "      lr: 1.0e-3\n"
                              "      mock_data: true\n"
                              "      log_interval: 20\n"
                              "      eval_interval: 0\n";
  }
  std::string dir_;
  std::string config_;
};

TEST_F(ProgressCli, TrainingOnATerminalDrawsABarBetweenIntactLogLines) {
  const PtyResult result = run_on_pty({"--", "train", "pretrain", "--config", config_});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_CONTAINS(result.output, "\rtrain [");
  EXPECT_CONTAINS(result.output, "/60 steps | ");
  EXPECT_CONTAINS(result.output, "memory per device, estimated (cpu: ");
  EXPECT_CONTAINS(result.output, "activations per micro-batch (peak)");
  EXPECT_CONTAINS(result.output, "saved checkpoint ");
  expect_log_lines_intact(result.output);
  // The bar is gone once training ends: the last line holds no bar.
  const std::vector<std::string> lines = split(result.output, '\n');
  for (size_t i = lines.size(); i-- > 0;) {
    if (lines[i].find("done: 60 iterations") == std::string::npos) continue;
    EXPECT_EQ(lines[i].find("train ["), std::string::npos) << lines[i];
  }
}

TEST_F(ProgressCli, TrainingWithLogIntervalOneDrawsNoBar) {
  const PtyResult result =
      run_on_pty({"--", "train", "pretrain", "--config", config_, "train_iters=8", "log_interval=1"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("train ["), std::string::npos) << result.output;
  expect_log_lines_intact(result.output);
}

TEST_F(ProgressCli, BenchmarkOnATerminalDrawsWarmupAndTimedBars) {
  const PtyResult result =
      run_on_pty({"--", "benchmark", "train", "--config", config_, "--warmup", "2", "--steps", "3"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_CONTAINS(result.output, "\rbenchmark warm-up [");
  EXPECT_CONTAINS(result.output, "\rbenchmark timed [");
  EXPECT_CONTAINS(result.output, "memory per device, estimated (cpu: ");
  EXPECT_CONTAINS(result.output, "benchmark train: tiny_llama on cpu");
  // The table starts on a line of its own: the bars were erased before it.
  for (const std::string& line : split(result.output, '\n')) {
    if (line.find("benchmark train: tiny_llama") == std::string::npos) continue;
    const std::vector<std::string> pieces = split(line, '\r');
    EXPECT_EQ(pieces.back().find("benchmark train: "), 0u) << line;
    if (pieces.size() > 1) {
      EXPECT_EQ(pieces[pieces.size() - 2].find_first_not_of(' '), std::string::npos) << line;
    }
  }
}

TEST_F(ProgressCli, IntoFilesThereAreNoCarriageReturns) {
  testing::CliResult train = testing::wait_cli(
      testing::spawn_cli({"--", "train", "pretrain", "--config", config_, "train_iters=30"}, dir_), dir_);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  EXPECT_EQ(train.err.find('\r'), std::string::npos) << train.err;
  EXPECT_EQ(train.err.find("train ["), std::string::npos);
  EXPECT_CONTAINS(train.err, "] [info]   parameters (fp32 master)");
  EXPECT_CONTAINS(train.err, "] [info]   optimizer state (AdamW, fp32)");
  const std::string log = testing::read_text(dir_ + "/workspace/bars/logs/train.log");
  EXPECT_CONTAINS(log, "memory per device, estimated (cpu: ");

  testing::CliResult bench = testing::wait_cli(
      testing::spawn_cli({"--", "benchmark", "train", "--config", config_, "--warmup", "1", "--steps", "2"}, dir_),
      dir_);
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_EQ(bench.err.find('\r'), std::string::npos) << bench.err;
  EXPECT_CONTAINS(bench.err, "activations per micro-batch (peak)");
  EXPECT_CONTAINS(bench.out, "benchmark train: tiny_llama on cpu");
}

// --trace records one step after the timed ones into a Perfetto trace that tools/trace_summary.py reads; the timed
// steps stay the ones asked for.
TEST_F(ProgressCli, BenchmarkTraceWritesOneMoreStepThatTheSummaryReads) {
  const std::string trace = dir_ + "/step.json";
  testing::CliResult bench = testing::wait_cli(
      testing::spawn_cli({"--", "benchmark", "train", "--config", config_, "--warmup", "1", "--steps", "2", "--trace",
                          trace},
                         dir_),
      dir_);
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_CONTAINS(bench.err, "benchmark: step 4 traced");
  const std::string text = testing::read_text(trace);
  EXPECT_CONTAINS(text, "\"traceEvents\"");
  EXPECT_CONTAINS(text, "linear_forward");
  const std::string summary_path = dir_ + "/summary.txt";
  const std::string command = fmt::format("python3 {}/tools/trace_summary.py {} {} > {} 2>&1", PRIMUS_SOURCE_DIR, trace,
                                          trace, summary_path);
  ASSERT_EQ(std::system(command.c_str()), 0) << testing::read_text(summary_path);
  const std::string summary = testing::read_text(summary_path);
  EXPECT_CONTAINS(summary, "device busy");
  // The trace against itself: every difference is zero.
  EXPECT_CONTAINS(summary, "| linear_forward |");
  std::istringstream lines(summary);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| ", 0) == 0 && line.find("scope") == std::string::npos) {
      EXPECT_NE(line.find("| +0.00 |"), std::string::npos) << line;
    }
  }
}

}  // namespace
}  // namespace primus
