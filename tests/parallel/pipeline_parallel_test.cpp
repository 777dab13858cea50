// Pipeline parallelism end to end on CPU ranks over Gloo: whole `train pretrain` jobs of the built primus-cli
// (support/training_job.h: 20 steps of 4 micro-batches, evaluation at steps 10 and 20, a checkpoint at the end read
// back whole by `checkpoint convert`) at pipeline_model_parallel_size 2 and 3, alone, with virtual stages (the
// interleaved schedule), with an uneven split, with the distributed optimizer over 2 data-parallel ranks and with 2
// tensor-parallel ranks, each against one process at the same global batch: every step's loss and gradient norm,
// the evaluation losses and every parameter tensor within relative 1e-5. The model has 4 layers so that 2 stages of 2
// virtual stages each get one. adam_eps 1e-6: at 1e-8 AdamW's g / sqrt(v) turns the last-bit differences of gradients
// summed in another order into visible ones for the elements whose gradient is near zero.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/test_support.h"
#include "support/training_job.h"

namespace primus {
namespace {

using testing::expect_same_run;
using testing::RunResult;
using testing::with;

const std::vector<std::string> kShape{"vocab_size=384", "num_layers=4", "adam_eps=1.0e-6"};
const std::vector<std::string> kPp2{"pipeline_model_parallel_size=2"};

RunResult train(const std::string& label, int ranks, const std::vector<std::string>& overrides) {
  return testing::train("pp_" + label, ranks, with(kShape, overrides));
}

class PipelineParallel : public ::testing::Test {
 protected:
  // A failure here would only skip the tests (GoogleTest's rule for the suite's set-up): they fail instead, below.
  static void SetUpTestSuite() {
    baseline_ = new RunResult(train("single", 1, {}));
    baseline_ok_ = !::testing::Test::HasFailure() && !baseline_->losses.empty();
  }
  static void TearDownTestSuite() { delete baseline_; }
  static RunResult* baseline_;
  static bool baseline_ok_;

  RunResult check(const std::string& label, int ranks, const std::vector<std::string>& overrides) {
    EXPECT_TRUE(baseline_ok_) << "the one-rank job to compare with failed";
    if (!baseline_ok_) return {};
    RunResult run = train(label, ranks, overrides);
    if (!HasFatalFailure()) expect_same_run(*baseline_, run, fmt::format("{} on {} ranks", label, ranks));
    return run;
  }
};

RunResult* PipelineParallel::baseline_ = nullptr;
bool PipelineParallel::baseline_ok_ = false;

// 1F1B over two stages; the sample at the end runs through both (the last stage's logits broadcast back).
TEST_F(PipelineParallel, Pp2EqualsOneRank) { check("pp2", 2, with(kPp2, {"sample_length=4"})); }

// The interleaved schedule (each stage holds layers {s, s + 2}) gives what 1F1B gives.
TEST_F(PipelineParallel, Pp2WithVirtualStagesEqualsOneRankAndOneFOneB) {
  const RunResult interleaved = check("pp2_vpp2", 2, with(kPp2, {"num_layers_per_virtual_pipeline_stage=1"}));
  if (HasFatalFailure()) return;
  const RunResult one_f_one_b = train("pp2_1f1b", 2, kPp2);
  if (HasFatalFailure()) return;
  expect_same_run(one_f_one_b, interleaved, "interleaved against 1F1B");
}

// Three stages, the first holding 2 layers and the others one each (a middle stage with neither embedding nor head).
TEST_F(PipelineParallel, Pp3UnevenEqualsOneRank) {
  check("pp3_uneven", 3, {"pipeline_model_parallel_size=3", "decoder_first_pipeline_num_layers=2"});
}

TEST_F(PipelineParallel, Pp2TimesDp2WithTheDistributedOptimizerEqualsOneRank) {
  check("pp2_dp2_distopt", 4, with(kPp2, {"use_distributed_optimizer=true", "ddp_bucket_size=7001"}));
}

TEST_F(PipelineParallel, Pp2TimesTp2EqualsOneRank) { check("pp2_tp2", 4, with(kPp2, {"tensor_model_parallel_size=2"})); }

// Tied embeddings: the last stage's copy of the embedding as output layer, its gradient summed with the first
// stage's, so both stay the first stage's weights (the checkpoint holds that one).
TEST(PipelineParallelShapes, TiedEmbeddingsUnderPp2EqualOneRank) {
  const std::vector<std::string> tied{"untie_embeddings_and_output_weights=false"};
  const RunResult one = train("tied_single", 1, tied);
  if (::testing::Test::HasFatalFailure()) return;
  expect_same_run(one, train("tied_pp2", 2, with(tied, kPp2)), "tied, pp2");
}

}  // namespace
}  // namespace primus
