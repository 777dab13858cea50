// The acceptance check for checkpoints, through the real program: SIGKILL a training run after it has
// saved a checkpoint, start the same command again, and the resumed run's losses equal those of a run that
// was never stopped, bit for bit.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

std::string write_config(const std::string& dir) {
  const std::string path = dir + "/exp.yaml";
  std::ofstream(path) << "exp_name: kill_resume\n"
                         "workspace: " << dir << "/workspace\n"
                         "modules:\n"
                         "  pre_trainer:\n"
                         "    framework: megatron\n"
                         "    model: tiny_llama\n"
                         "    overrides:\n"
                         "      train_iters: 40\n"
                         "      seq_length: 32\n"
                         "      micro_batch_size: 2\n"
                         "      global_batch_size: 4\n"
                         "      lr: 2.0e-3\n"
                         "      lr_warmup_iters: 4\n"
                         "      log_interval: 1\n"
                         "      eval_interval: 0\n"
                         "      save_interval: 6\n"
                         "      data_path: [" << testing::shakespeare_path() << "]\n";
  return path;
}

std::map<int64_t, double> losses_by_step(const std::string& run_dir) {
  std::map<int64_t, double> losses;
  std::istringstream in(testing::read_text(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto record = nlohmann::json::parse(line);
    EXPECT_FALSE(losses.count(record["step"])) << "step " << record["step"] << " logged twice";
    losses[record["step"]] = record["loss"];
  }
  return losses;
}

int64_t latest_checkpoint(const std::string& run_dir) {
  const std::string tracker = run_dir + "/checkpoints/latest_checkpointed_iteration.txt";
  if (!fs::exists(tracker)) return 0;
  try {
    return std::stoll(testing::read_text(tracker));
  } catch (const std::exception&) {
    return 0;
  }
}

TEST(KillResume, SigkillAfterACheckpointThenResumeMatchesAnUninterruptedRun) {
  ASSERT_TRUE(fs::exists(testing::cli_path())) << "build the primus-cli target first";
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  const std::string whole_dir = testing::temp_dir("whole");
  const std::string killed_dir = testing::temp_dir("killed");

  const std::vector<std::string> whole_args{"train", "pretrain", "--config", write_config(whole_dir)};
  ASSERT_EQ(testing::wait_cli(testing::spawn_cli(whole_args, whole_dir), whole_dir).exit_code, 0);

  const std::vector<std::string> args{"train", "pretrain", "--config", write_config(killed_dir)};
  const std::string run_dir = killed_dir + "/workspace/kill_resume";
  pid_t pid = testing::spawn_cli(args, killed_dir);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (latest_checkpoint(run_dir) < 12 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(latest_checkpoint(run_dir), 12) << "no checkpoint appeared";
  kill(pid, SIGKILL);
  testing::CliResult killed = testing::wait_cli(pid, killed_dir);
  ASSERT_EQ(killed.exit_code, 1000 + SIGKILL) << "the run finished before it could be killed";
  const int64_t saved = latest_checkpoint(run_dir);
  // The run's log is flushed line by line: the line of the step the last checkpoint holds (logged before that
  // save began) is on disk although the process was killed.
  const std::string log = testing::read_text(run_dir + "/logs/train.log");
  EXPECT_NE(log.find(fmt::format(" {}/40 ", saved)), std::string::npos) << log;

  testing::CliResult resumed = testing::wait_cli(testing::spawn_cli(args, killed_dir), killed_dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find(fmt::format("resumed from {}", run_dir + "/checkpoints/iter_" + fmt::format("{:07d}", saved))),
            std::string::npos)
      << resumed.err;

  const auto expected = losses_by_step(whole_dir + "/workspace/kill_resume");
  const auto actual = losses_by_step(run_dir);
  ASSERT_EQ(expected.size(), 40u);
  ASSERT_EQ(actual.size(), 40u);
  for (const auto& [step, loss] : expected) EXPECT_EQ(actual.at(step), loss) << "step " << step;
}

}  // namespace
}  // namespace primus
