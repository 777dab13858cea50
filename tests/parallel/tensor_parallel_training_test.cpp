// Tensor parallelism end to end on CPU ranks over Gloo: whole `train pretrain` jobs of the built primus-cli
// (support/training_job.h) at tensor_model_parallel_size 2, alone and composed with data parallelism (the
// distributed optimizer, FSDP's ZeRO-2 and ZeRO-3), against one process at the same global batch: the losses,
// gradient norms and evaluation losses of every step and every parameter tensor of the saved checkpoint (exported
// to Hugging Face by `checkpoint convert`, which reads the tensor-parallel pieces back whole) within relative 1e-5.
// Then the checkpoints reshard: saved at tp 2 × dp 2 with the distributed optimizer, a run resumes at tp 1 × dp 1,
// at tp 4, at tp 1 × dp 4, and a tp 1 checkpoint resumes at tp 2, each continuing the uninterrupted run's curve.
// The vocabulary is given so that every tensor-parallel size has the same one (padding to a multiple of 128 × tp
// would make it 384 at tp 1, 512 at tp 2 and tp 4): 384, what tp 1 pads the tokenizer's to, so the one-rank runs
// are the data-parallel tests' model. (With 512 one step of this run has a gradient-norm spike whose norm moves by
// 7e-6 between one rank and 2 data-parallel ranks alone, too close to the 1e-5 bound to tell layouts apart.)
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

const std::vector<std::string> kVocab{"vocab_size=384"};
const std::vector<std::string> kTp2{"tensor_model_parallel_size=2"};
// Buckets of 7001 parameters: the distributed optimizer's shards cut the tensor-parallel slices inside rows.
const std::vector<std::string> kDistOpt{"use_distributed_optimizer=true", "ddp_bucket_size=7001"};
const std::vector<std::string> kZero2{"use_megatron_fsdp=true", "data_parallel_sharding_strategy=optim_grads"};
const std::vector<std::string> kZero3{"use_megatron_fsdp=true", "data_parallel_sharding_strategy=optim_grads_params"};

// One job in a fresh workspace, its run read back.
RunResult train(const std::string& label, int ranks, const std::vector<std::string>& overrides) {
  return testing::train("tp_" + label, ranks, with(kVocab, overrides));
}

class TensorParallelTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { baseline_ = new RunResult(train("single", 1, {})); }
  static void TearDownTestSuite() { delete baseline_; }
  static RunResult* baseline_;

  void check(const std::string& label, int ranks, const std::vector<std::string>& overrides) {
    ASSERT_NE(baseline_, nullptr);
    const RunResult run = train(label, ranks, overrides);
    if (HasFatalFailure()) return;
    expect_same_run(*baseline_, run, fmt::format("{} on {} ranks", label, ranks));
  }
};

RunResult* TensorParallelTraining::baseline_ = nullptr;

// Two tensor-parallel ranks with two accumulated micro-batches each; the sample at the end runs its forwards on
// both ranks (the logits are gathered over the group).
TEST_F(TensorParallelTraining, Tp2EqualsOneRank) { check("tp2", 2, with(kTp2, {"sample_length=4"})); }

TEST_F(TensorParallelTraining, Tp2TimesDp2WithTheDistributedOptimizerEqualsOneRank) {
  check("tp2_dp2_distopt", 4, with(kTp2, kDistOpt));
}

// FSDP's units are the tensor-parallel rank's slices; ZeRO-3 gathers them over the data-parallel group.
TEST_F(TensorParallelTraining, Tp2TimesDp2WithFsdpEqualsOneRank) {
  check("tp2_dp2_zero2", 4, with(kTp2, kZero2));
  check("tp2_dp2_zero3", 4, with(kTp2, kZero3));
}

// Replicated parameters whose gradients are summed over the group (q/k norms), and tied embeddings: the output
// layer reads the vocabulary-parallel embedding's slice.
TEST(TensorParallelTrainingShapes, QkNormsAndTiedEmbeddingsUnderTp2TimesDp2EqualOneRank) {
  const std::vector<std::string> shape{"qk_layernorm=true", "untie_embeddings_and_output_weights=false"};
  const RunResult one = train("qk_tied_single", 1, shape);
  if (::testing::Test::HasFatalFailure()) return;
  expect_same_run(one, train("qk_tied_tp2_dp2", 4, with(shape, with(kTp2, kDistOpt))), "q/k norms, tied, tp2 x dp2");
  expect_same_run(one, train("qk_tied_tp2_zero3", 4, with(shape, with(kTp2, kZero3))),
                  "q/k norms, tied, tp2 x dp2 ZeRO-3");
}

void expect_resumes(const std::string& label, const std::vector<std::string>& shape, int ranks,
                    const std::vector<std::string>& layout,
                    const std::vector<std::pair<int, std::vector<std::string>>>& resumes) {
  testing::expect_resumes("tp_" + label, with(kVocab, shape), ranks, layout, resumes);
}

// 4 key/value groups, so that the heads split over 4 tensor-parallel ranks too.
const std::vector<std::string> kFourGroups{"num_query_groups=4"};

// The first run also saves at step 5, both saves in the background (async_save: the host snapshot holds each rank's
// pieces only).
TEST(TensorParallelCheckpoints, Tp2TimesDp2ResumesAtTp1AtTp4AndAtDp4) {
  expect_resumes("reshard", kFourGroups, 4, with(kTp2, with(kDistOpt, {"async_save=true", "save_interval=5"})),
                 {{1, {}}, {4, {"tensor_model_parallel_size=4"}}, {4, kDistOpt}});
}

TEST(TensorParallelCheckpoints, Tp1ResumesAtTp2) { expect_resumes("tp1_to_tp2", {}, 1, {}, {{2, kTp2}}); }

}  // namespace
}  // namespace primus
