// Data parallelism end to end on CPU ranks over Gloo: the built primus-cli started as N processes with
// torchrun's environment (as `primus-cli direct --nproc-per-node N` starts them), against one process at the
// same global batch. Losses of every step, the evaluation loss and the parameters after the run must match one
// rank's to fp32 rounding (relative 1e-5), for plain data parallelism, the distributed optimizer and FSDP's
// optim, optim_grads (ZeRO-2) and optim_grads_params (ZeRO-3) strategies, with gradient accumulation, with
// bucketed reduction overlapped with backward and with the weight gathers overlapped with forward.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "checkpoint/safetensors.h"
#include "core/file_io.h"
#include "support/cli_process.h"
#include "support/test_support.h"

extern char** environ;

namespace primus {
namespace {

namespace fs = std::filesystem;

struct Job {
  std::string workspace;
  std::vector<std::string> overrides;
  int ranks = 1;
};

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
  const int port = testing::free_port();
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
    std::vector<std::string> args{testing::cli_path().string(), "--", "train", "pretrain", "--config", config};
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
        << testing::read_text(fmt::format("{}/rank{}.out", job.workspace, rank));
  }
}

struct RunResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::vector<double> eval_losses;
  std::map<std::string, std::vector<float>> weights;
};

RunResult read_run(const std::string& workspace) {
  RunResult r;
  std::istringstream in(testing::read_text(workspace + "/dp/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    r.losses.push_back(record["loss"]);
    r.grad_norms.push_back(record["grad_norm"]);
    if (record.contains("eval_loss")) r.eval_losses.push_back(record["eval_loss"]);
  }
  // Whatever the format (one file, or a shard per rank), `checkpoint convert` gives the whole weights.
  const std::string hf = workspace + "/hf";
  const std::string command = fmt::format("'{}' -- checkpoint convert --input '{}/dp/checkpoints' --output '{}' >'{}/convert.out' 2>&1",
                                          testing::cli_path().string(), workspace, hf, workspace);
  EXPECT_EQ(std::system(command.c_str()), 0) << testing::read_text(workspace + "/convert.out");
  const SafetensorsFile file = SafetensorsFile::open(hf + "/model.safetensors");
  for (const SafetensorsEntry& entry : file.entries()) {
    const Tensor t = file.read_f32(entry.name);
    r.weights[entry.name].assign(t.f32(), t.f32() + t.numel());
  }
  return r;
}

void expect_close(double a, double b, const std::string& what) {
  EXPECT_LE(std::abs(a - b), 1e-5 * std::max(std::abs(a), std::abs(b)) + 1e-7) << what << ": " << a << " vs " << b;
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
  ASSERT_EQ(many.weights.size(), one.weights.size()) << layout;
  // Per tensor, ||a - b|| / ||a||: the reduction adds the ranks' partial gradients in another order than one
  // rank accumulating them, and AdamW's g / sqrt(v) magnifies those last-bit differences for the elements whose
  // gradient is near zero, so single elements drift more than the tensor does.
  double worst = 0.0;
  std::string worst_name;
  for (const auto& [name, values] : one.weights) {
    const std::vector<float>& other = many.weights.at(name);
    ASSERT_EQ(other.size(), values.size()) << name;
    double diff = 0.0, norm = 0.0;
    for (size_t k = 0; k < values.size(); ++k) {
      diff += (static_cast<double>(values[k]) - other[k]) * (static_cast<double>(values[k]) - other[k]);
      norm += static_cast<double>(values[k]) * values[k];
    }
    const double rel = std::sqrt(diff / std::max(norm, 1e-30));
    if (rel > worst) worst = rel, worst_name = name;
  }
  std::printf("%s: largest relative difference of a parameter tensor after 20 steps: %.2e (%s)\n", layout.c_str(),
              worst, worst_name.c_str());
  EXPECT_LE(worst, 1e-5) << layout << ": parameters after 20 steps differ most in " << worst_name;
}

// ZeRO-2: gradients reduce-scattered per micro-batch into shards, fp32 master weights and moments sharded, the
// weights gathered after each step while the next forward runs (overlap_param_gather).
const std::vector<std::string> kZero2{"use_megatron_fsdp=true", "data_parallel_sharding_strategy=optim_grads",
                                      "overlap_param_gather=true"};
// ZeRO-3: also the blocks' weights sharded, gathered (one block ahead) before each use and freed after it.
const std::vector<std::string> kZero3{"use_megatron_fsdp=true", "data_parallel_sharding_strategy=optim_grads_params"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class DataParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Job single{testing::temp_dir("dp_single"), {}, 1};
    run_job(single);
    baseline_ = new RunResult(read_run(single.workspace));
  }
  static void TearDownTestSuite() { delete baseline_; }
  static RunResult* baseline_;

  void check(const std::string& label, int ranks, std::vector<std::string> overrides) {
    ASSERT_NE(baseline_, nullptr);
    Job job{testing::temp_dir("dp_" + label), std::move(overrides), ranks};
    run_job(job);
    if (HasFatalFailure()) return;
    expect_same_run(*baseline_, read_run(job.workspace), fmt::format("{} on {} ranks", label, ranks));
  }
};

RunResult* DataParallel::baseline_ = nullptr;

// 2 ranks × 2 micro-batches of 2 (gradient accumulation) and 4 ranks × 1 equal one rank's 4 micro-batches.
TEST_F(DataParallel, TwoRanksWithAccumulationEqualOneRank) { check("plain2", 2, {}); }
TEST_F(DataParallel, FourRanksEqualOneRank) { check("plain4", 4, {}); }

// Small buckets (several per backward) reduced on the communication thread while backward continues.
TEST_F(DataParallel, OverlappedBucketsEqualOneRank) {
  check("overlap2", 2, {"overlap_grad_reduce=true", "ddp_bucket_size=5000"});
}

// A Perfetto trace of a 2-rank step with overlap_grad_reduce: bucket all-reduces run on the communication
// thread while backward still computes the layers below (a span starts before the step's last backward ends).
// Rank 0's trace of a profiled run of `job` (steps 2-3): the collectives on the communication track whose name
// starts with `prefix`, and how many of them started while a `phase` span ("forward", "backward") was running.
struct Overlap {
  int collectives = 0;
  int started_inside = 0;
};
Overlap overlap_in_trace(const Job& job, const std::string& phase, const std::string& prefix) {
  const nlohmann::json trace = nlohmann::json::parse(testing::read_text(job.workspace + "/dp/profile/trace_rank0.json"));
  int comm_pid = -1;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == "communication (gloo thread)") {
      comm_pid = e["pid"];
    }
  }
  EXPECT_GE(comm_pid, 0) << "no communication track";
  std::vector<std::pair<double, double>> phases, collectives;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double begin = e["ts"], end = begin + e["dur"].get<double>();
    if (e["pid"] == 1 && e["name"] == phase) phases.emplace_back(begin, end);
    if (e["pid"] == comm_pid && e["name"].get<std::string>().starts_with(prefix)) collectives.emplace_back(begin, end);
  }
  EXPECT_FALSE(phases.empty()) << "no " << phase << " span";
  Overlap overlap;
  overlap.collectives = static_cast<int>(collectives.size());
  for (const auto& [cb, ce] : collectives) {
    for (const auto& [pb, pe] : phases) overlap.started_inside += cb >= pb && cb < pe;
  }
  return overlap;
}

const std::vector<std::string> kProfile{"micro_batch_size=4", "train_iters=4", "profile=true", "profile_step_start=2",
                                        "profile_step_end=4"};

// A Perfetto trace of a 2-rank step with overlap_grad_reduce: bucket all-reduces run on the communication
// thread while backward is still running.
TEST_F(DataParallel, TraceShowsBucketReductionOverlappingBackward) {
  Job job{testing::temp_dir("dp_trace"), {"overlap_grad_reduce=true", "ddp_bucket_size=5000"}, 2};
  job.overrides.insert(job.overrides.end(), kProfile.begin(), kProfile.end());
  run_job(job);
  if (HasFatalFailure()) return;
  const Overlap o = overlap_in_trace(job, "backward", "all_reduce bucket");
  EXPECT_GE(o.collectives, 4) << "several buckets per step";
  EXPECT_GT(o.started_inside, 0) << "no bucket reduction started while a backward was running";
}

// overlap_param_gather: the distributed optimizer's weight gathers run while the next forward runs; ZeRO-3
// prefetches the next block's weights during forward and reduce-scatters each block's gradient during backward.
TEST_F(DataParallel, TraceShowsWeightGathersOverlappingForward) {
  Job distopt{testing::temp_dir("dp_trace_gather"),
              {"use_distributed_optimizer=true", "ddp_bucket_size=5000", "overlap_param_gather=true"}, 2};
  distopt.overrides.insert(distopt.overrides.end(), kProfile.begin(), kProfile.end());
  run_job(distopt);
  if (HasFatalFailure()) return;
  const Overlap gathers = overlap_in_trace(distopt, "forward", "all_gather weights bucket");
  EXPECT_GE(gathers.collectives, 4);
  EXPECT_GT(gathers.started_inside, 0) << "no weight gather started while a forward was running";

  Job zero3{testing::temp_dir("dp_trace_zero3"), with(kZero3, kProfile), 2};
  run_job(zero3);
  if (HasFatalFailure()) return;
  EXPECT_GT(overlap_in_trace(zero3, "forward", "all_gather unit").started_inside, 0)
      << "no block's gather started while a forward was running";
  EXPECT_GT(overlap_in_trace(zero3, "backward", "reduce_scatter unit").started_inside, 0)
      << "no block's reduce-scatter started while a backward was running";
}

// The distributed optimizer: reduce-scatter, AdamW on each rank's shards, all-gather. The top bucket (the rest
// of the buffer) here divides evenly; the next test covers the padded one.
TEST_F(DataParallel, DistributedOptimizerEqualsOneRank) {
  check("distopt2", 2, {"use_distributed_optimizer=true", "overlap_grad_reduce=true", "ddp_bucket_size=7001"});
  check("distopt4", 4, {"use_distributed_optimizer=true", "ddp_bucket_size=7001"});
  // The weights gathered bucket by bucket while the next forward runs, each unit waiting for its buckets only.
  check("distopt_overlap2", 2, {"use_distributed_optimizer=true", "ddp_bucket_size=7001", "overlap_param_gather=true",
                                "micro_batch_size=1"});
}

// 3 ranks: the tiny model's 141,632 parameters are not a multiple of 3, so the top bucket goes through the
// padded staging buffer (reduce-scatter and weight all-gather), against one rank at the same global batch of 12.
TEST_F(DataParallel, DistributedOptimizerOnThreeRanksPadsTheTopBucket) {
  const std::vector<std::string> batch{"global_batch_size=12"};
  Job one{testing::temp_dir("dp_single12"), batch, 1};
  run_job(one);
  if (HasFatalFailure()) return;
  Job three{testing::temp_dir("dp_distopt3"), batch, 3};
  three.overrides.insert(three.overrides.end(), {"use_distributed_optimizer=true", "ddp_bucket_size=7001"});
  run_job(three);
  if (HasFatalFailure()) return;
  const RunResult baseline = read_run(one.workspace);
  expect_same_run(baseline, read_run(three.workspace), "distributed optimizer on 3 ranks");
  Job overlapped{testing::temp_dir("dp_distopt3_overlap"), three.overrides, 3};
  overlapped.overrides.push_back("overlap_param_gather=true");
  run_job(overlapped);
  if (HasFatalFailure()) return;
  expect_same_run(baseline, read_run(overlapped.workspace), "distributed optimizer on 3 ranks, overlap_param_gather");
}

// 8 micro-batches of the global batch over 2 ranks of micro-batch 1: four accumulated backwards per rank.
TEST_F(DataParallel, AccumulationOfFourMicroBatchesPerRank) { check("accum2", 2, {"micro_batch_size=1"}); }

TEST_F(DataParallel, FsdpOptimStrategyEqualsOneRank) {
  check("fsdp_optim2", 2, {"use_megatron_fsdp=true", "data_parallel_sharding_strategy=optim", "overlap_grad_reduce=true"});
}

// 2 ranks × 4 accumulated micro-batches of 1 (each one's reduce-scatter adds into the shards), and 4 ranks × 1.
TEST_F(DataParallel, FsdpOptimGradsEqualsOneRank) {
  check("zero2_2", 2, with(kZero2, {"micro_batch_size=1"}));
  check("zero2_4", 4, kZero2);
}

// The units' sizes are not multiples of 4 or 3 (padded shards); full recompute gathers a block again inside
// backward; a world of one is a real one-rank FSDP (and saves the single-file checkpoint from its shards).
TEST_F(DataParallel, FsdpOptimGradsParamsEqualsOneRank) {
  // sample_length: the sample at the end runs forwards on every rank (their gathers are collectives).
  check("zero3_2", 2, with(kZero3, {"micro_batch_size=1", "overlap_param_gather=true", "sample_length=8"}));
  check("zero3_4", 4, with(kZero3, {"recompute_granularity=full", "recompute_method=uniform", "recompute_num_layers=2"}));
  check("zero3_1", 1, kZero3);
}

// A tied output layer reads and writes the embedding's unit in the loss's forward; 3 ranks pad every unit.
TEST_F(DataParallel, FsdpWithTiedEmbeddingsOnThreeRanks) {
  const std::vector<std::string> tied{"global_batch_size=12", "untie_embeddings_and_output_weights=false"};
  Job one{testing::temp_dir("dp_tied1"), tied, 1};
  run_job(one);
  if (HasFatalFailure()) return;
  const RunResult baseline = read_run(one.workspace);
  Job three{testing::temp_dir("dp_tied3_ZeRO-2"), with(tied, kZero2), 3};
  run_job(three);
  if (HasFatalFailure()) return;
  expect_same_run(baseline, read_run(three.workspace), "tied embeddings, ZeRO-2 on 3 ranks");
  Job three3{testing::temp_dir("dp_tied3_ZeRO-3"), with(tied, kZero3), 3};
  run_job(three3);
  if (HasFatalFailure()) return;
  expect_same_run(baseline, read_run(three3.workspace), "tied embeddings, ZeRO-3 on 3 ranks");
}

// A ZeRO-3 checkpoint of 4 ranks resumes under ZeRO-2 on 2 ranks and replicated on 1, on the same curve.
TEST_F(DataParallel, FsdpCheckpointResumesAtOtherLayouts) {
  const std::vector<std::pair<int, std::vector<std::string>>> resumes{{2, kZero2}, {1, {}}};
  for (const auto& [ranks, strategy] : resumes) {
    Job first{testing::temp_dir(fmt::format("dp_fsdp_resume{}", ranks)), with(kZero3, {"train_iters=10"}), 4};
    run_job(first);
    if (HasFatalFailure()) return;
    Job second{first.workspace, strategy, ranks};
    run_job(second);
    if (HasFatalFailure()) return;
    expect_same_run(*baseline_, read_run(first.workspace), fmt::format("ZeRO-3 on 4 ranks, then {} ranks", ranks));
  }
}

// A checkpoint saved by 4 ranks (sharded optimizer state) resumes on 2 ranks and on 1 and continues the same
// curve: the resumed steps' losses equal the uninterrupted run's.
TEST_F(DataParallel, CheckpointOf4RanksResumesOn2AndOn1) {
  const std::vector<std::string> sharded{"use_distributed_optimizer=true", "ddp_bucket_size=7001"};
  for (int resume_ranks : {2, 1}) {
    Job first{testing::temp_dir(fmt::format("dp_resume{}", resume_ranks)), sharded, 4};
    first.overrides.push_back("train_iters=10");
    run_job(first);
    if (HasFatalFailure()) return;
    Job second{first.workspace, sharded, resume_ranks};  // the same run directory: resumes at iteration 10
    run_job(second);
    if (HasFatalFailure()) return;
    expect_same_run(*baseline_, read_run(first.workspace), fmt::format("4 ranks, then {} from iteration 10", resume_ranks));
  }
}

// A job killed in the middle of a save leaves its shards in iter_N.tmp, never committed (staged here: the
// sharded checkpoint's own test kills a rank between its shard and the commit). The previous checkpoint stays
// the latest, the next run resumes from it, removes the temporary (saying so), and continues the same curve; it
// saves in the background (async_save, both ranks' shards) and keeps the latest two checkpoints.
TEST_F(DataParallel, AnInterruptedSaveLeavesThePreviousCheckpoint) {
  Job job{testing::temp_dir("dp_kill"), {"use_distributed_optimizer=true", "save_interval=5"}, 2};
  job.overrides.push_back("train_iters=10");
  run_job(job);  // iter_0000005 and iter_0000010 complete
  if (HasFatalFailure()) return;
  const std::string checkpoints = job.workspace + "/dp/checkpoints";
  // A save that died after writing its shards: the temporary directory of iteration 15, no commit.
  fs::create_directories(checkpoints + "/iter_0000015.tmp");
  write_file_atomic(checkpoints + "/iter_0000015.tmp/shard_0_of_2.safetensors", "partial");
  EXPECT_EQ(testing::read_text(checkpoints + "/latest_checkpointed_iteration.txt").substr(0, 2), "10");
  Job resume{job.workspace,
             {"use_distributed_optimizer=true", "save_interval=5", "train_iters=20", "async_save=true",
              "keep_latest_k=2"},
             2};
  run_job(resume);
  if (HasFatalFailure()) return;
  const std::string log = testing::read_text(fmt::format("{}/rank0.out", job.workspace));
  EXPECT_NE(log.find("resumed from"), std::string::npos);
  EXPECT_NE(log.find("by interrupted saves: iter_0000015.tmp"), std::string::npos) << log;
  EXPECT_NE(log.find("writing in the background"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(checkpoints + "/iter_0000015.tmp")) << "the stale temporary was not removed";
  EXPECT_FALSE(fs::exists(checkpoints + "/iter_0000010")) << "keep_latest_k=2 keeps 15 and 20";
  EXPECT_TRUE(fs::exists(checkpoints + "/iter_0000015/shard_1_of_2.safetensors"));
  EXPECT_EQ(testing::read_text(checkpoints + "/latest_checkpointed_iteration.txt"), "20\n");
  expect_same_run(*baseline_, read_run(job.workspace), "2 ranks resumed after an interrupted save");
}


// Settings that contradict the job exit 2 naming the key, before any rendezvous: a global batch that
// micro_batch_size × dp does not divide (dp from WORLD_SIZE), a model-parallel size that does not divide WORLD_SIZE
// (only 1 is implemented), a sharding strategy without FSDP, overlap_param_gather without sharded weights.
TEST(DataParallelConfig, InconsistentSettingsExitTwoNamingTheKey) {
  const std::string dir = testing::temp_dir("dp_bad");
  const std::string config = write_config(dir);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"WORLD_SIZE=3 RANK=0", "global_batch_size"},
      {"WORLD_SIZE=4 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 tensor_model_parallel_size=2",
       "tensor_model_parallel_size"},
      {"WORLD_SIZE=1 data_parallel_sharding_strategy=optim", "use_megatron_fsdp"},
      {"WORLD_SIZE=1 overlap_param_gather=true", "overlap_param_gather"},
      {"WORLD_SIZE=two RANK=0", "WORLD_SIZE"},
  };
  for (const auto& [settings, key] : cases) {
    // Environment words go before the command, key=value overrides after it.
    std::string env, overrides;
    std::istringstream words(settings);
    for (std::string word; words >> word;) {
      const std::string name = word.substr(0, word.find('='));
      (name.find_first_of("abcdefghijklmnopqrstuvwxyz") == std::string::npos ? env : overrides) += " " + word;
    }
    const std::string out = dir + "/bad.out";
    const std::string command = fmt::format("env{} '{}' -- train pretrain --config '{}'{} >'{}' 2>&1", env,
                                            testing::cli_path().string(), config, overrides, out);
    const int status = std::system(command.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << settings << ": status " << status << "\n"
                                                                << testing::read_text(out);
    EXPECT_NE(testing::read_text(out).find(key), std::string::npos) << settings << ":\n" << testing::read_text(out);
  }
}

}  // namespace
}  // namespace primus
