// End-to-end tests of the multi-process launcher of `primus-cli direct` (src/cli/worker_pool.cpp,
// launch_layout.cpp): run the built binary with --nproc-per-node and check what reaches the console, the
// environment the workers really got (/proc/<pid>/environ), and how failures and signals end the launch.
// The workers run commands that share no state (config show/validate, benchmark train), since the trainer
// does not use the ranks yet.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "support/cli_process.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using testing::CliResult;
using testing::read_text;
using testing::spawn_cli;
using testing::wait_cli;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)
#define EXPECT_LACKS(text, part) \
  EXPECT_EQ((text).find(part), std::string::npos) << "unexpected '" << (part) << "' in:\n" << (text)

struct StartedRank {
  int rank = -1;
  int local_rank = -1;
  pid_t pid = -1;
};

size_t count_of(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++count;
  return count;
}

std::map<std::string, std::string> process_environment(pid_t pid) {
  std::string text = read_text("/proc/" + std::to_string(pid) + "/environ");
  std::map<std::string, std::string> env;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\0', start);
    if (end == std::string::npos) end = text.size();
    std::string entry = text.substr(start, end - start);
    size_t equals = entry.find('=');
    if (equals != std::string::npos) env[entry.substr(0, equals)] = entry.substr(equals + 1);
    start = end + 1;
  }
  return env;
}

// A TCP port nobody listens on now, for MASTER_PORT: the workers (benchmark train too) rendezvous there, and
// tests that run at the same time must not share one.
std::string free_port() { return std::to_string(testing::free_port()); }

bool process_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// Stops `pid` and waits until it is stopped (state T in /proc/<pid>/stat): a signal sent earlier would still be
// taken before the pending SIGSTOP, which has the higher number.
bool stop_process(pid_t pid) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  for (int i = 0; i < 200; ++i) {
    std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(testing::cli_path())) << testing::cli_path() << " not found: build primus-cli first";
    setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
    // The layout defaults read these; each test sets what it needs.
    for (const char* name : {"NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
                             "HIP_VISIBLE_DEVICES", "PRIMUS_LAUNCHED", "RANK", "WORLD_SIZE", "LOCAL_RANK"}) {
      unsetenv(name);
    }
    dir_ = testing::temp_dir("launcher");
  }

  // Workers whose launcher dies become children of this process rather than of init, so that TearDown can
  // reap them.
  static void SetUpTestSuite() { ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }

  void TearDown() override {
    // A failed assertion may leave a launcher running: kill it. Its workers die with it (PR_SET_PDEATHSIG),
    // orphaned into this process, and are reaped here with it, so no test leaves a process behind.
    for (pid_t pid : launchers_) ::kill(pid, SIGKILL);
    // Bounded: a worker that failed to die with its launcher fails the test instead of hanging it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      const pid_t pid = ::waitpid(-1, nullptr, WNOHANG);
      if (pid > 0 || (pid < 0 && errno == EINTR)) continue;
      if (pid < 0) break;  // ECHILD: nothing left
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "a worker process outlived its launcher by 30 s";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  CliResult run(const std::vector<std::string>& args) { return wait_cli(spawn_cli(args, dir_), dir_); }

  pid_t spawn(const std::vector<std::string>& args) {
    pid_t pid = spawn_cli(args, dir_);
    launchers_.push_back(pid);
    return pid;
  }

  CliResult wait(pid_t pid) {
    CliResult result = wait_cli(pid, dir_);
    std::erase(launchers_, pid);
    return result;
  }

  // A tiny mock-data experiment; `extra` lines go under overrides. The global batch divides by the
  // micro batch times every data-parallel size used here (1, 2, 4).
  std::string write_config(const std::string& name, const std::string& exp_name, const std::string& extra = "") {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << "exp_name: " << exp_name << "\n"
                        << "workspace: " << dir_ << "/workspace\n"
                        << "modules:\n"
                           "  pre_trainer:\n"
                           "    framework: megatron\n"
                           "    model: tiny_llama\n"
                           "    overrides:\n"
                           "      train_iters: 2\n"
                           "      seq_length: 16\n"
                           "      micro_batch_size: 2\n"
                           "      global_batch_size: 8\n"
                           "      lr: 1.0e-3\n"
                           "      mock_data: true\n"
                           "      log_interval: 1\n"
                           "      eval_interval: 0\n"
                        << extra;
    return path;
  }

  // Launch flags for workers that run until stopped (the benchmark never reaches its step count).
  std::vector<std::string> long_run(const std::vector<std::string>& launch_flags) {
    std::vector<std::string> args{"direct"};
    args.insert(args.end(), launch_flags.begin(), launch_flags.end());
    for (const char* word : {"--", "benchmark", "train", "--warmup", "0", "--steps", "1000000000"})
      args.push_back(word);
    args.push_back("--config");
    args.push_back(write_config("long.yaml", "long"));
    return args;
  }

  // The "started" lines of the launcher's stderr, once `count` are there and every worker has exec'd its
  // command (its cmdline names it and its environment is the worker's: before exec, the forked child still
  // has the launcher's); fails after 30 s.
  std::vector<StartedRank> wait_for_workers(size_t count, const std::string& command_word) {
    const std::regex started(R"(launcher: rank (\d+) \(local (\d+)\) started, pid (\d+))");
    std::vector<StartedRank> ranks;
    for (auto deadline = Clock::now() + std::chrono::seconds(30); Clock::now() < deadline;) {
      std::string err = read_text(dir_ + "/stderr");
      ranks.clear();
      for (std::sregex_iterator it(err.begin(), err.end(), started), end; it != end; ++it) {
        ranks.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), static_cast<pid_t>(std::stoi((*it)[3]))});
      }
      bool ready = ranks.size() == count;
      for (const StartedRank& rank : ranks) {
        std::string cmdline = read_text("/proc/" + std::to_string(rank.pid) + "/cmdline");
        ready = ready && cmdline.find(command_word) != std::string::npos &&
                process_environment(rank.pid)["PRIMUS_LAUNCHED"] == "1";
      }
      if (ready) return ranks;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "the launcher did not start " << count << " workers:\n" << read_text(dir_ + "/stderr");
    return ranks;
  }

  std::string dir_;
  std::vector<pid_t> launchers_;
};

TEST_F(LauncherTest, TwoWorkersSucceedAndOnlyRankZeroIsShown) {
  // Each worker expands its own RANK, WORLD_SIZE, ... into exp_name, which `config show` prints.
  std::string config =
      write_config("show.yaml",
                   "env_${RANK}_${WORLD_SIZE}_${LOCAL_RANK}_${LOCAL_WORLD_SIZE}_${GROUP_RANK}_${NNODES}_${NODE_RANK}_"
                   "${MASTER_ADDR}_${MASTER_PORT}_${PRIMUS_LAUNCHED}");
  std::string log = dir_ + "/logs/run.log";
  auto start = Clock::now();
  std::string port = free_port();
  std::string expected = "env_0_2_0_2_0_1_0_127.0.0.1_" + port + "_1";
  CliResult result = run({"direct", "--nproc-per-node", "2", "--master-port", port, "--log-file", log, "--", "config",
                          "show", "--config", config});
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_LT(seconds, 30);
  // Rank 0's table, once; rank 1's stdout is not shown.
  EXPECT_EQ(count_of(result.out, "# top level"), 1u) << result.out;
  EXPECT_EQ(count_of(result.out, "\nexp_name "), 1u) << result.out;
  EXPECT_CONTAINS(result.out, expected);
  EXPECT_LACKS(result.out, "env_1_");
  EXPECT_CONTAINS(result.err, "launcher: rank 0 (local 0) started, pid ");
  EXPECT_CONTAINS(result.err, "launcher: rank 1 (local 1) started, pid ");
  EXPECT_CONTAINS(result.err, "launcher: all 2 rank(s) finished");
  EXPECT_LACKS(result.err, "[rank 1]");
  EXPECT_LACKS(result.err, "error");
  std::string text = read_text(log);
  EXPECT_CONTAINS(text, expected);
  EXPECT_CONTAINS(text, "launcher: rank 1 (local 1) started, pid ");
  EXPECT_LACKS(text, "env_1_");
}

TEST_F(LauncherTest, WorkersGetTheTorchrunEnvironmentAndKeepVisibleDevices) {
  setenv("CUDA_VISIBLE_DEVICES", "0,1,2", 1);
  std::string port = free_port();
  pid_t launcher = spawn(long_run({"--nproc-per-node", "2", "--nnodes", "2", "--node_rank", "1", "--master_addr",
                                   "127.0.0.1", "--master_port", port}));
  unsetenv("CUDA_VISIBLE_DEVICES");
  std::vector<StartedRank> ranks = wait_for_workers(2, "benchmark");
  ASSERT_EQ(ranks.size(), 2u);
  for (const StartedRank& started : ranks) {
    EXPECT_EQ(started.rank, 2 + started.local_rank);
    std::map<std::string, std::string> env = process_environment(started.pid);
    ASSERT_FALSE(env.empty()) << "rank " << started.rank << " ended early:\n" << read_text(dir_ + "/stderr");
    EXPECT_EQ(env["RANK"], std::to_string(started.rank));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(started.local_rank));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "1");
    EXPECT_EQ(env["NNODES"], "2");
    EXPECT_EQ(env["NODE_RANK"], "1");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], port);
    EXPECT_EQ(env["PRIMUS_LAUNCHED"], "1");
    EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "0,1,2");
    EXPECT_EQ(env["PRIMUS_CONFIGS_DIR"], PRIMUS_SOURCE_DIR "/configs");  // the rest of the environment passes
  }
  std::string err = read_text(dir_ + "/stderr");
  EXPECT_CONTAINS(err, "CUDA_VISIBLE_DEVICES lists 3 device(s) but 2 workers start on this node");
  EXPECT_CONTAINS(err, "the other nodes cannot reach it");
  ::kill(launcher, SIGTERM);
  EXPECT_EQ(wait(launcher).exit_code, 128 + SIGTERM);
}

TEST_F(LauncherTest, AKilledWorkerStopsTheOthersAndIsNamed) {
  pid_t launcher = spawn(long_run({"--nproc-per-node", "2", "--master-port", free_port()}));
  std::vector<StartedRank> ranks = wait_for_workers(2, "benchmark");
  ASSERT_EQ(ranks.size(), 2u);
  // Let rank 1 print something for the failure report (500 ms was too short on a loaded 2-core machine: "Rank 1
  // printed nothing").
  std::this_thread::sleep_for(std::chrono::seconds(2));
  auto start = Clock::now();
  ASSERT_EQ(::kill(ranks[1].pid, SIGKILL), 0);
  CliResult result = wait(launcher);
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout << "launcher exit " << seconds << " s after SIGKILL of rank 1\n";
  EXPECT_LT(seconds, 30);
  EXPECT_EQ(result.exit_code, 3) << result.err;
  EXPECT_CONTAINS(result.err, "primus-cli: error: rank 1 (pid " + std::to_string(ranks[1].pid) +
                                  ") was killed by SIGKILL; the other ranks were stopped. Last lines of rank 1:");
  EXPECT_TRUE(process_gone(ranks[0].pid));
}

TEST_F(LauncherTest, ARankThatIgnoresSigtermIsKilledAfterTheGracePeriod) {
  pid_t launcher = spawn(long_run({"--nproc-per-node", "2", "--master-port", free_port()}));
  std::vector<StartedRank> ranks = wait_for_workers(2, "benchmark");
  ASSERT_EQ(ranks.size(), 2u);
  // A stopped process leaves SIGTERM pending, as a rank stuck in a collective would ignore it; only SIGKILL ends it.
  ASSERT_TRUE(stop_process(ranks[0].pid));
  auto start = Clock::now();
  ASSERT_EQ(::kill(ranks[1].pid, SIGKILL), 0);
  CliResult result = wait(launcher);
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout << "launcher exit " << seconds << " s after SIGKILL of rank 1, rank 0 stopped\n";
  EXPECT_GT(seconds, 9);
  EXPECT_LT(seconds, 30);
  EXPECT_EQ(result.exit_code, 3) << result.err;
  EXPECT_CONTAINS(result.err, "launcher: rank(s) 0 still running 10 s after the failure: SIGKILL");
  EXPECT_CONTAINS(result.err, "launcher: rank 0 (pid " + std::to_string(ranks[0].pid) + ") was killed by SIGKILL");
  EXPECT_CONTAINS(result.err,
                  "primus-cli: error: rank 1 (pid " + std::to_string(ranks[1].pid) + ") was killed by SIGKILL");
  EXPECT_TRUE(process_gone(ranks[0].pid));
}

TEST_F(LauncherTest, SigtermToTheLauncherReachesEveryWorker) {
  pid_t launcher = spawn(long_run({"--nproc-per-node", "2", "--master-port", free_port()}));
  std::vector<StartedRank> ranks = wait_for_workers(2, "benchmark");
  ASSERT_EQ(ranks.size(), 2u);
  auto start = Clock::now();
  ASSERT_EQ(::kill(launcher, SIGTERM), 0);
  CliResult result = wait(launcher);
  std::cout << "launcher exit " << std::chrono::duration<double>(Clock::now() - start).count() << " s after SIGTERM\n";
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.err;
  EXPECT_CONTAINS(result.err, "launcher: SIGTERM received: forwarded to every rank");
  for (const StartedRank& started : ranks) {
    // Each rank ended by the forwarded signal: killed by it (benchmark) or exiting 143 (the trainer).
    std::string prefix =
        "launcher: rank " + std::to_string(started.rank) + " (pid " + std::to_string(started.pid) + ") ";
    bool by_signal = result.err.find(prefix + "was killed by SIGTERM") != std::string::npos ||
                     result.err.find(prefix + "exited with code 143") != std::string::npos;
    EXPECT_TRUE(by_signal) << prefix << "...SIGTERM missing in:\n" << result.err;
    EXPECT_TRUE(process_gone(started.pid));
  }
  EXPECT_CONTAINS(result.err, "launcher: stopped by SIGTERM");
  EXPECT_LACKS(result.err, "primus-cli: error:");
}

TEST_F(LauncherTest, ASecondSignalKillsTheWorkers) {
  pid_t launcher = spawn(long_run({"--nproc-per-node", "2", "--master-port", free_port()}));
  std::vector<StartedRank> ranks = wait_for_workers(2, "benchmark");
  ASSERT_EQ(ranks.size(), 2u);
  // Stopped ranks keep the forwarded SIGTERM pending, like ranks still saving their checkpoint.
  for (const StartedRank& started : ranks) ASSERT_TRUE(stop_process(started.pid));
  ASSERT_EQ(::kill(launcher, SIGTERM), 0);
  for (int i = 0; i < 200 && read_text(dir_ + "/stderr").find("forwarded") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(::kill(launcher, SIGINT), 0);
  CliResult result = wait(launcher);
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.err;
  EXPECT_CONTAINS(result.err, "launcher: SIGINT received again: killing every rank (SIGKILL)");
  for (const StartedRank& started : ranks) {
    EXPECT_CONTAINS(result.err, "launcher: rank " + std::to_string(started.rank) + " (pid " +
                                    std::to_string(started.pid) + ") was killed by SIGKILL");
    EXPECT_TRUE(process_gone(started.pid));
  }
  EXPECT_LACKS(result.err, "primus-cli: error:");
}

TEST_F(LauncherTest, ARankThatFailsIsNamedWithItsErrorLines) {
  // hidden_dropout must be 0: local rank 0's config is valid, local rank 1's is not.
  std::string config = write_config("per_rank.yaml", "per_rank", "      hidden_dropout: ${LOCAL_RANK}\n");
  CliResult result = run({"direct", "--nproc-per-node", "2", "--master-port", free_port(), "--", "config", "validate",
                          "--config", config});
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_CONTAINS(result.err, "[rank 1] primus-cli: error: [config] ");
  EXPECT_CONTAINS(result.err, "hidden_dropout");
  EXPECT_CONTAINS(result.err, "primus-cli: error: rank 1 (pid ");
  EXPECT_CONTAINS(result.err, ") exited with code 2; the other ranks were stopped. Last lines of rank 1:\n    ");
}

TEST_F(LauncherTest, BadLaunchFlagsExitTwoNamingTheFlag) {
  std::string config = write_config("ok.yaml", "ok");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nproc-per-node", "0"}, "--nproc-per-node 0: must be at least 1"},
      {{"--nproc_per_node", "-3"}, "--nproc-per-node -3: must be at least 1"},
      {{"--nproc-per-node", "two"}, "--nproc-per-node"},
      {{"--nnodes", "0"}, "--nnodes 0: must be at least 1"},
      {{"--nnodes", "2", "--node-rank", "2"}, "--node-rank 2: must be in 0..1 for --nnodes 2"},
      {{"--node-rank", "1"}, "--node-rank 1: must be in 0..0 for --nnodes 1 (the default)"},
      {{"--master-port", "70000"}, "--master-port 70000: must be a TCP port, 1..65535"},
      {{"--master_port", "0"}, "--master-port 0: must be a TCP port, 1..65535"},
      {{"--master-addr", ""}, "--master-addr: must not be empty"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args{"direct"};
    args.insert(args.end(), flags.begin(), flags.end());
    for (const std::string& word :
         {std::string("--"), std::string("config"), std::string("validate"), std::string("--config"), config}) {
      args.push_back(word);
    }
    CliResult result = run(args);
    std::string command = ::testing::PrintToString(flags);
    EXPECT_EQ(result.exit_code, 2) << command << "\n" << result.err;
    EXPECT_CONTAINS(result.err, "primus-cli: error: ") << command;
    EXPECT_CONTAINS(result.err, message) << command;
    EXPECT_LACKS(result.err, "started, pid") << command;
    EXPECT_TRUE(result.out.empty()) << command << "\n" << result.out;
  }

  // The same checks name the environment variable a bad value came from.
  setenv("NNODES", "2", 1);
  setenv("NODE_RANK", "3", 1);
  CliResult result = run({"direct", "--nproc-per-node", "2", "--", "config", "validate", "--config", config});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err,
                  "NODE_RANK=3 (from the environment): must be in 0..1 for NNODES=2 (from the environment)");
  unsetenv("NNODES");
  unsetenv("NODE_RANK");
  setenv("MASTER_PORT", "port", 1);
  result = run({"direct", "--nproc-per-node", "2", "--", "config", "validate", "--config", config});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_CONTAINS(result.err,
                  "MASTER_PORT=port (from the environment): not a whole number; fix it or pass --master-port");
}

TEST_F(LauncherTest, DryRunPrintsTheWorkersAndTheirEnvironment) {
  std::string config = write_config("ok.yaml", "ok");
  CliResult result =
      run({"--dry-run", "direct", "--nproc_per_node", "2", "--nnodes", "2", "--node_rank", "1", "--master_addr",
           "10.1.2.3", "--master_port", "1234", "--", "config", "validate", "--config", config});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_CONTAINS(result.out, "primus-cli dry run: nothing was started");
  EXPECT_CONTAINS(result.out, "workers      2 on this node (node 1 of 2, world size 4), master 10.1.2.3:1234");
  EXPECT_CONTAINS(result.out,
                  "worker argv  " + testing::cli_path().string() + " -- config validate --config " + config);
  EXPECT_CONTAINS(result.out,
                  "rank 2       RANK=2 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 NNODES=2 NODE_RANK=1 "
                  "MASTER_ADDR=10.1.2.3 MASTER_PORT=1234 PRIMUS_LAUNCHED=1");
  EXPECT_CONTAINS(result.out, "rank 3       RANK=3 WORLD_SIZE=4 LOCAL_RANK=1");
  EXPECT_LACKS(result.err, "started, pid");

  // Training and benchmarks default to one worker per visible GPU; --debug reaches the workers.
  setenv("CUDA_VISIBLE_DEVICES", "0,1", 1);
  result = run({"--dry-run", "--debug", "direct", "--", "benchmark", "train", "--config", config});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_CONTAINS(result.out, "workers      2 on this node (node 0 of 1, world size 2), master 127.0.0.1:29500");
  EXPECT_CONTAINS(result.out, " --debug -- benchmark train --config ");
  EXPECT_LACKS(result.err, "lists 2 device(s)");
}

TEST_F(LauncherTest, OneProcessRunsAsBefore) {
  std::string config = write_config("ok.yaml", "ok");
  CliResult result = run({"direct", "--", "config", "validate", "--config", config});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "OK: " + config + "\n");
  EXPECT_EQ(result.err, "");

  // One visible GPU and one node from the environment: still in this process.
  setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  setenv("NNODES", "1", 1);
  result = run({"--dry-run", "direct", "--", "benchmark", "train", "--config", config});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_LACKS(result.out, "workers");

  // Commands that use no device stay one process on a multi-GPU node (N copies of `data preprocess` would
  // write the same files).
  setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3", 1);
  result = run({"direct", "--", "config", "validate", "--config", config});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "OK: " + config + "\n");
  EXPECT_EQ(result.err, "");
  unsetenv("CUDA_VISIBLE_DEVICES");
  unsetenv("NNODES");

  // A worker never launches again, whatever its flags say.
  setenv("PRIMUS_LAUNCHED", "1", 1);
  result = run({"direct", "--nproc-per-node", "2", "--", "config", "validate", "--config", config});
  unsetenv("PRIMUS_LAUNCHED");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "OK: " + config + "\n");
  EXPECT_CONTAINS(result.err, "PRIMUS_LAUNCHED=1: this is a worker already; the launch flags are ignored");
  EXPECT_LACKS(result.err, "started, pid");

  // An explicit --nproc-per-node 1 starts one worker, whose output is shown as it is.
  result = run({"direct", "--nproc-per-node", "1", "--", "config", "validate", "--config", config});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "OK: " + config + "\n");
  EXPECT_CONTAINS(result.err, "launcher: rank 0 (local 0) started, pid ");
}

}  // namespace
}  // namespace primus
