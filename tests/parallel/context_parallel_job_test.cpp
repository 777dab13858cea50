// Context parallelism end to end: the built primus-cli as N processes over Gloo (support/training_job.h: a tiny
// Llama on mock tokens, 20 steps, evaluations at 10 and 20) against one process at the same global batch. At
// context_parallel_size 2 alone, with 2 data-parallel ranks (4 processes; with the distributed optimizer too) and with
// 2 tensor-parallel ranks (4 processes), every step's loss and gradient norm, the evaluation losses and every
// parameter after the run must equal one rank's within relative 1e-5. Packed documents at cp > 1 exit 2 naming the
// key.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/cli_process.h"
#include "support/test_support.h"
#include "support/training_job.h"

namespace primus {
namespace {

using testing::Job;
using testing::RunResult;

class ContextParallelJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Job single{testing::temp_dir("cp_single"), {}, 1};
    testing::run_job(single);
    baseline_ = new RunResult(testing::read_run(single.workspace));
  }
  static void TearDownTestSuite() { delete baseline_; }
  static RunResult* baseline_;

  void check(const std::string& label, int ranks, std::vector<std::string> overrides) {
    ASSERT_NE(baseline_, nullptr);
    Job job{testing::temp_dir("cp_" + label), std::move(overrides), ranks};
    testing::run_job(job);
    if (HasFatalFailure()) return;
    testing::expect_same_run(*baseline_, testing::read_run(job.workspace), fmt::format("{} on {} ranks", label, ranks));
  }
};

RunResult* ContextParallelJob::baseline_ = nullptr;

// Each of the 2 ranks holds 2 chunks of 8 of every 32-token sequence; 4 micro-batches of 2 each.
TEST_F(ContextParallelJob, TwoRanksEqualOneRank) { check("cp2", 2, {"context_parallel_size=2"}); }

// cp 2 × dp 2: gradients reduce over all 4 (dp × cp), the samples split over the 2 data-parallel ranks.
TEST_F(ContextParallelJob, WithTwoDataParallelRanksEqualsOneRank) { check("cp2dp2", 4, {"context_parallel_size=2"}); }

TEST_F(ContextParallelJob, WithDistributedOptimizerAndOverlapEqualsOneRank) {
  check("cp2dp2_distopt", 4, {"context_parallel_size=2", "use_distributed_optimizer=true", "overlap_grad_reduce=true"});
}

TEST(ContextParallelConfig, PackedDocumentsExitTwoNamingTheKey) {
  const std::string dir = testing::temp_dir("cp_packed");
  const std::string config = testing::write_config(dir);
  for (const char* key : {"reset_attention_mask", "reset_position_ids"}) {
    const testing::CliResult r = testing::wait_cli(
        testing::spawn_cli(
            {"--", "train", "pretrain", "--config", config, "context_parallel_size=2", fmt::format("{}=true", key)},
            dir),
        dir);
    const std::string output = r.out + r.err;
    EXPECT_EQ(r.exit_code, 2) << output;
    EXPECT_NE(output.find(fmt::format("{}: packed documents with context parallelism", key)), std::string::npos)
        << output;
  }
}

}  // namespace
}  // namespace primus
