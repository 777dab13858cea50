// Pipeline checkpoints are layout-free: a `train pretrain` job at pipeline_model_parallel_size 2 (tied embeddings,
// so the last stage's copy of the embedding must stay out of the checkpoint and come back from the first stage's)
// saves at step 10; copies of its run directory resume to step 20 at pp 1, at pp 2 × dp 2 with the distributed
// optimizer and at pp 2 × tp 2, each continuing the uninterrupted one-rank run's losses, gradient norms, evaluation
// losses and weights within relative 1e-5. And a one-rank checkpoint resumes at pp 2 with virtual stages.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/test_support.h"
#include "support/training_job.h"

namespace primus {
namespace {

using testing::with;

// lr 1e-3 instead of the jobs' 3e-3: at 3e-3 the tied model's fp32 rounding differences of the first 10 steps (a
// relative 1e-7 in the saved state, the order in which stages and ranks sum) grow to 1.004e-5 in the gradient norm of
// step 18 after a resume at pp 1, just over the bound, with every parameter tensor still within 3.3e-7.
const std::vector<std::string> kShape{"vocab_size=384", "num_layers=4", "adam_eps=1.0e-6", "lr=1.0e-3",
                                      "untie_embeddings_and_output_weights=false"};
const std::vector<std::string> kPp2{"pipeline_model_parallel_size=2"};

void expect_resumes(const std::string& label, int ranks, const std::vector<std::string>& layout,
                    const std::vector<std::pair<int, std::vector<std::string>>>& resumes) {
  testing::expect_resumes("pp_" + label, kShape, ranks, layout, resumes);
}

TEST(PipelineCheckpoints, Pp2ResumesAtPp1AtPp2TimesDp2AndAtPp2TimesTp2) {
  expect_resumes("reshard", 2, kPp2,
                 {{1, {}},
                  {4, with(kPp2, {"use_distributed_optimizer=true"})},
                  {4, with(kPp2, {"tensor_model_parallel_size=2"})}});
}

TEST(PipelineCheckpoints, OneRankResumesAtPp2WithVirtualStages) {
  expect_resumes("pp1_to_vpp", 1, {}, {{2, with(kPp2, {"num_virtual_stages_per_pipeline_rank=2"})}});
}

}  // namespace
}  // namespace primus
