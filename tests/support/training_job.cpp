// The end-to-end parallel tests' training jobs (support/training_job.h).
#include "support/training_job.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "checkpoint/safetensors.h"
#include "core/file_io.h"
#include "support/cli_process.h"
#include "support/test_support.h"

extern char** environ;

namespace primus::testing {

namespace fs = std::filesystem;

// The experiment shared by every run: a tiny Llama on mock tokens, a log line and a metrics record every step.
std::string write_config(const std::string& dir) {
  const std::string path = dir + "/dp.yaml";
  write_file_atomic(path,
                    "exp_name: dp\n"
                    "workspace: " + dir + "\n"
                    "modules:\n"
                    "  pre_trainer:\n"
                    "    framework: megatron\n"
                    "    model: tiny_llama\n"
                    "    overrides:\n"
                    "      train_iters: 20\n"
                    "      micro_batch_size: 2\n"
                    "      global_batch_size: 8\n"
                    "      seq_length: 32\n"
                    "      lr: 3.0e-3\n"
                    "      lr_warmup_iters: 2\n"
                    "      lr_decay_iters: 20\n"
                    "      weight_decay: 0.1\n"
                    "      clip_grad: 0.5\n"
                    "      log_interval: 1\n"
                    "      eval_interval: 10\n"
                    "      eval_iters: 1\n"
                    "      mock_data: true\n"
                    "      device: cpu\n"
                    "      distributed_timeout_minutes: 1\n");
  return path;
}


// Starts `ranks` primus-cli processes with torchrun's variables and waits for all (at most two minutes).
void run_job(const Job& job) {
  fs::create_directories(job.workspace);
  const std::string config = write_config(job.workspace);
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < job.ranks; ++rank) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    for (const std::string& kv :
         {fmt::format("RANK={}", rank), fmt::format("WORLD_SIZE={}", job.ranks), fmt::format("LOCAL_RANK={}", rank),
          fmt::format("LOCAL_WORLD_SIZE={}", job.ranks), std::string("MASTER_ADDR=127.0.0.1"),
          fmt::format("MASTER_PORT={}", port), std::string("OMP_NUM_THREADS=1")}) {
      env_strings.push_back(kv);
    }
    std::vector<char*> envp;
    for (std::string& kv : env_strings) envp.push_back(kv.data());
    envp.push_back(nullptr);
    std::vector<std::string> args{cli_path().string(), "--", "train", "pretrain", "--config", config};
    args.insert(args.end(), job.overrides.begin(), job.overrides.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = fmt::format("{}/rank{}.out", job.workspace, rank);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = -1;
    const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {  // end the ranks already started, which would wait for this one
      for (pid_t p : pids) kill(p, SIGKILL), waitpid(p, nullptr, 0);
      FAIL() << "cannot start rank " << rank << ": " << std::strerror(spawned);
    }
    pids.push_back(pid);
  }
  // Every rank is waited for, whatever happens: one that fails or outlives the deadline ends the others (they
  // would wait for it until distributed_timeout_minutes), so no worker outlives the test.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  std::vector<int> status(pids.size(), 0);
  std::vector<bool> done(pids.size(), false);
  bool timed_out = false;
  for (size_t left = pids.size(); left > 0;) {
    for (size_t rank = 0; rank < pids.size(); ++rank) {
      if (done[rank] || waitpid(pids[rank], &status[rank], WNOHANG) != pids[rank]) continue;
      done[rank] = true;
      --left;
      const bool ok = WIFEXITED(status[rank]) && WEXITSTATUS(status[rank]) == 0;
      if (!ok) {
        for (size_t other = 0; other < pids.size(); ++other) {
          if (!done[other]) kill(pids[other], SIGKILL);
        }
      }
    }
    if (left > 0 && !timed_out && std::chrono::steady_clock::now() > deadline) {
      timed_out = true;
      for (size_t rank = 0; rank < pids.size(); ++rank) {
        if (!done[rank]) kill(pids[rank], SIGKILL);
      }
      ADD_FAILURE() << "the job did not finish in 2 minutes";
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t rank = 0; rank < pids.size(); ++rank) {
    ASSERT_TRUE(WIFEXITED(status[rank]) && WEXITSTATUS(status[rank]) == 0)
        << "rank " << rank << " of " << job.ranks << " failed (status " << status[rank] << "):\n"
        << read_text(fmt::format("{}/rank{}.out", job.workspace, rank));
  }
}


RunResult read_run(const std::string& workspace) {
  RunResult r;
  std::istringstream in(read_text(workspace + "/dp/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    r.losses.push_back(record["loss"]);
    r.grad_norms.push_back(record["grad_norm"]);
    if (record.contains("eval_loss")) r.eval_losses.push_back(record["eval_loss"]);
    if (record.contains("moe")) {
      std::vector<double>& tokens = r.moe_tokens.emplace_back();
      for (const nlohmann::json& layer : record["moe"]["layers"]) {
        for (const nlohmann::json& count : layer["tokens_per_expert"]) tokens.push_back(count.get<double>());
        if (layer.contains("dropped_tokens")) tokens.push_back(layer["dropped_tokens"].get<double>());
      }
    }
  }
  // Whatever the format (one file, or a shard per rank), `checkpoint convert` gives the whole weights.
  const std::string hf = workspace + "/hf";
  const std::string command = fmt::format("'{}' -- checkpoint convert --input '{}/dp/checkpoints' --output '{}' >'{}/convert.out' 2>&1",
                                          cli_path().string(), workspace, hf, workspace);
  EXPECT_EQ(std::system(command.c_str()), 0) << read_text(workspace + "/convert.out");
  const SafetensorsFile file = SafetensorsFile::open(hf + "/model.safetensors");
  for (const SafetensorsEntry& entry : file.entries()) {
    const Tensor t = file.read_f32(entry.name);
    r.weights[entry.name].assign(t.f32(), t.f32() + t.numel());
  }
  return r;
}

namespace {

void expect_close(double a, double b, const std::string& what) {
  EXPECT_LE(std::abs(a - b), 1e-5 * std::max(std::abs(a), std::abs(b)) + 1e-7) << what << ": " << a << " vs " << b;
}

}  // namespace

double largest_parameter_difference(const RunResult& one, const RunResult& many, std::string* name) {
  EXPECT_EQ(many.weights.size(), one.weights.size());
  double worst = 0.0;
  for (const auto& [tensor, values] : one.weights) {
    const auto other = many.weights.find(tensor);
    if (other == many.weights.end() || other->second.size() != values.size()) {
      ADD_FAILURE() << tensor << " is missing or of another size";
      continue;
    }
    double diff = 0.0, norm = 0.0;
    for (size_t k = 0; k < values.size(); ++k) {
      const double d = static_cast<double>(values[k]) - other->second[k];
      diff += d * d;
      norm += static_cast<double>(values[k]) * values[k];
    }
    const double rel = std::sqrt(diff / std::max(norm, 1e-30));
    if (rel > worst) {
      worst = rel;
      *name = tensor;
    }
  }
  return worst;
}

void expect_same_run(const RunResult& one, const RunResult& many, const std::string& layout) {
  ASSERT_EQ(one.losses.size(), 20u);
  ASSERT_EQ(many.losses.size(), one.losses.size()) << layout;
  for (size_t i = 0; i < one.losses.size(); ++i) {
    expect_close(one.losses[i], many.losses[i], fmt::format("{}: loss of step {}", layout, i + 1));
    expect_close(one.grad_norms[i], many.grad_norms[i], fmt::format("{}: grad norm of step {}", layout, i + 1));
  }
  ASSERT_EQ(many.eval_losses.size(), one.eval_losses.size()) << layout;
  for (size_t i = 0; i < one.eval_losses.size(); ++i) {
    expect_close(one.eval_losses[i], many.eval_losses[i], fmt::format("{}: eval loss {}", layout, i));
  }
  EXPECT_EQ(many.moe_tokens, one.moe_tokens) << layout << ": tokens per expert";
  ASSERT_EQ(many.weights.size(), one.weights.size()) << layout;
  // Per tensor, ||a - b|| / ||a||: the reduction adds the ranks' partial gradients in another order than one
  // rank accumulating them, and AdamW's g / sqrt(v) magnifies those last-bit differences for the elements whose
  // gradient is near zero, so single elements drift more than the tensor does.
  std::string worst_name;
  const double worst = largest_parameter_difference(one, many, &worst_name);
  std::printf("%s: largest relative difference of a parameter tensor after 20 steps: %.2e (%s)\n", layout.c_str(),
              worst, worst_name.c_str());
  EXPECT_LE(worst, 1e-5) << layout << ": parameters after 20 steps differ most in " << worst_name;
}


std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

RunResult train(const std::string& label, int ranks, const std::vector<std::string>& overrides) {
  Job job{temp_dir(label), overrides, ranks};
  run_job(job);
  if (::testing::Test::HasFatalFailure()) return {};
  return read_run(job.workspace);
}

void expect_resumes(const std::string& label, const std::vector<std::string>& shape, int ranks,
                    const std::vector<std::string>& layout,
                    const std::vector<std::pair<int, std::vector<std::string>>>& resumes) {
  const RunResult one = train(label + "_single", 1, shape);
  if (::testing::Test::HasFatalFailure()) return;
  Job first{temp_dir(label + "_first"), with(shape, with(layout, {"train_iters=10"})), ranks};
  run_job(first);
  if (::testing::Test::HasFatalFailure()) return;
  for (const auto& [resume_ranks, resume_layout] : resumes) {
    const std::string description = fmt::format("{}: {} ranks {}, then {} ranks {}", label, ranks,
                                                fmt::join(layout, " "), resume_ranks, fmt::join(resume_layout, " "));
    Job second{temp_dir(label + "_resume"), with(shape, resume_layout), resume_ranks};
    fs::copy(first.workspace + "/dp", second.workspace + "/dp", fs::copy_options::recursive);
    run_job(second);
    if (::testing::Test::HasFatalFailure()) return;
    const std::string log = read_text(second.workspace + "/rank0.out");
    EXPECT_NE(log.find("resumed from"), std::string::npos) << description << "\n" << log;
    expect_same_run(one, read_run(second.workspace), description);
  }
}

}  // namespace primus::testing
