// Data parallelism end to end on CPU ranks over Gloo: the built primus-cli started as N processes with
// torchrun's environment (as `primus-cli direct --nproc-per-node N` starts them), against one process at the
// same global batch. Losses of every step, the evaluation loss and the parameters after the run must match one
// rank's to fp32 rounding (relative 1e-5), for plain data parallelism, the distributed optimizer and FSDP's
// optim, optim_grads (ZeRO-2) and optim_grads_params (ZeRO-3) strategies, with gradient accumulation, with
// bucketed reduction overlapped with backward and with the weight gathers overlapped with forward.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "support/cli_process.h"
#include "support/test_support.h"
#include "support/training_job.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using testing::Job;
using testing::RunResult;
using testing::expect_same_run;
using testing::read_run;
using testing::run_job;
using testing::with;
using testing::write_config;

// ZeRO-2: gradients reduce-scattered per micro-batch into shards, fp32 master weights and moments sharded, the
// weights gathered after each step while the next forward runs (overlap_param_gather).
const std::vector<std::string> kZero2{"use_megatron_fsdp=true", "data_parallel_sharding_strategy=optim_grads",
                                      "overlap_param_gather=true"};
// ZeRO-3: also the blocks' weights sharded, gathered (one block ahead) before each use and freed after it.
const std::vector<std::string> kZero3{"use_megatron_fsdp=true", "data_parallel_sharding_strategy=optim_grads_params"};

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
// (3 into 4), a sharding strategy without FSDP, overlap_param_gather without sharded weights.
TEST(DataParallelConfig, InconsistentSettingsExitTwoNamingTheKey) {
  const std::string dir = testing::temp_dir("dp_bad");
  const std::string config = write_config(dir);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"WORLD_SIZE=3 RANK=0", "global_batch_size"},
      {"WORLD_SIZE=4 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 tensor_model_parallel_size=3",
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
