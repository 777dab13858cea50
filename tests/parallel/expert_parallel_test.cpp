// Expert parallelism on CPU ranks over Gloo (support/training_job.h): MoE models whose experts are split over 2 and 4
// expert-parallel ranks, composed with data parallelism (world 2 and 4), with and without the distributed optimizer,
// and beside pipeline and context parallelism, against one rank at the same global batch: losses, gradient norms,
// evaluation losses and every parameter after 20 steps within relative 1e-5. A checkpoint saved at ep 2 × dp 2 resumes on one rank, and one saved without expert
// parallelism resumes at ep 2, each continuing the one-rank loss curve. Bad layouts exit 2 naming the key.
//
// Without balancing losses: Megatron's aux loss is a per-rank quantity by design (docs/moe.md), so with one a
// data-parallel run is not the one-rank computation; what the language-model loss gives must agree.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/cli_process.h"
#include "support/test_support.h"
#include "support/training_job.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;
using testing::with;

// Mixtral-style (Mixtral's names): 4 layers, every other one MoE, 4 experts, top 2.
const std::vector<std::string> kMixtral{"num_layers=4",          "vocab_size=384",         "num_experts=4",
                                        "moe_router_topk=2",     "moe_ffn_hidden_size=48", "moe_layer_freq=2",
                                        "moe_aux_loss_coeff=0.0", "adam_eps=1.0e-6",       "lr=1.0e-3"};
// Qwen3-MoE-style (q/k norms, Qwen3-MoE's names): 8 experts, top 2, a shared expert, every layer MoE.
const std::vector<std::string> kQwen3Moe{"num_layers=2",
                                         "vocab_size=384",
                                         "qk_layernorm=true",
                                         "num_experts=8",
                                         "moe_router_topk=2",
                                         "moe_ffn_hidden_size=32",
                                         "moe_shared_expert_intermediate_size=40",
                                         "moe_aux_loss_coeff=0.0",
                                         "adam_eps=1.0e-6",
                                         "lr=1.0e-3"};
const std::vector<std::string> kDistOpt{"use_distributed_optimizer=true", "ddp_bucket_size=7001"};

TEST(ExpertParallel, Ep2WithDataParallelEqualsOneRank) {
  const RunResult one = testing::train("ep_single", 1, kMixtral);
  ASSERT_FALSE(one.losses.empty());
  testing::expect_same_run(one, testing::train("ep2", 2, with(kMixtral, {"expert_model_parallel_size=2"})), "ep2");
  testing::expect_same_run(
      one, testing::train("ep2_distopt", 2, with(kMixtral, with({"expert_model_parallel_size=2"}, kDistOpt))),
      "ep2 distributed optimizer");
  // ep 2 inside dp 4: the experts' gradients reduce over the 2 ranks holding each half.
  testing::expect_same_run(
      one, testing::train("ep2_dp4_distopt", 4, with(kMixtral, with({"expert_model_parallel_size=2"}, kDistOpt))),
      "ep2 dp4 distributed optimizer");
}

// An expert capacity applies per micro-batch and rank before the all-to-all: one rank accumulating the same
// micro-batches drops the same routing entries, so ep 2 (and ep 2 inside dp 4) equals it; the dropped counts in
// metrics.jsonl are compared with the tokens per expert.
TEST(ExpertParallel, CapacityEp2WithDataParallelEqualsOneRank) {
  const std::vector<std::string> capacity = with(kMixtral, {"moe_expert_capacity_factor=0.5"});
  const RunResult one = testing::train("ep_cap_single", 1, capacity);
  ASSERT_FALSE(one.losses.empty());
  testing::expect_same_run(one, testing::train("ep2_cap", 2, with(capacity, {"expert_model_parallel_size=2"})),
                           "ep2 capacity");
  testing::expect_same_run(
      one, testing::train("ep2_dp4_cap", 4, with(capacity, with({"expert_model_parallel_size=2"}, kDistOpt))),
      "ep2 dp4 capacity, distributed optimizer");
  const std::vector<std::string> padded =
      with(kMixtral, {"moe_expert_capacity_factor=0.5", "moe_token_drop_policy=position",
                      "moe_pad_expert_input_to_capacity=true"});
  testing::expect_same_run(testing::train("ep_pad_single", 1, padded),
                           testing::train("ep2_pad", 2, with(padded, {"expert_model_parallel_size=2"})),
                           "ep2 padded capacity, drop policy position");
}

TEST(ExpertParallel, Ep4EqualsOneRank) {
  const RunResult one = testing::train("ep4_single", 1, kQwen3Moe);
  ASSERT_FALSE(one.losses.empty());
  testing::expect_same_run(one, testing::train("ep4", 4, with(kQwen3Moe, {"expert_model_parallel_size=4"})), "ep4");
  testing::expect_same_run(
      one, testing::train("ep4_distopt", 4, with(kQwen3Moe, with({"expert_model_parallel_size=4"}, kDistOpt))),
      "ep4 distributed optimizer");
}

// ep 2 beside pipeline stages (each stage's ep group exchanges its layers' tokens), and across context-parallel ranks
// (the ep group is taken from dp × cp: a sequence's two halves go to the experts from two ranks).
TEST(ExpertParallel, ComposesWithPipelineAndContextParallelism) {
  const RunResult one = testing::train("ep_compose_single", 1, kMixtral);
  ASSERT_FALSE(one.losses.empty());
  testing::expect_same_run(
      one,
      testing::train("ep2_pp2", 4,
                     with(kMixtral, with({"expert_model_parallel_size=2", "pipeline_model_parallel_size=2"}, kDistOpt))),
      "ep2 pp2 distributed optimizer");
  testing::expect_same_run(
      one, testing::train("ep2_cp2", 4, with(kMixtral, {"expert_model_parallel_size=2", "context_parallel_size=2"})),
      "ep2 cp2 dp2");
}

TEST(ExpertParallel, CheckpointsReshardBetweenExpertLayouts) {
  // Saved at ep 2 x dp 2 (distributed optimizer), resumed on one rank and at ep 2 x dp 2 without it.
  testing::expect_resumes("ep_reshard", kMixtral, 4, with({"expert_model_parallel_size=2"}, kDistOpt),
                          {{1, {}}, {2, {"expert_model_parallel_size=2"}}});
  // Saved without expert parallelism on 2 ranks, resumed at ep 2.
  testing::expect_resumes("ep_from_dp", kMixtral, 2, {}, {{2, with({"expert_model_parallel_size=2"}, kDistOpt)}});
}

TEST(ExpertParallel, BadLayoutsExit2NamingTheKey) {
  ASSERT_TRUE(fs::exists(testing::cli_path())) << testing::cli_path() << " not found: build primus-cli first";
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  const std::string dir = testing::temp_dir("ep_bad");
  auto config = [&](const std::string& model) {
    const std::string path = dir + "/" + model + ".yaml";
    std::ofstream(path) << "exp_name: ep\n"
                           "workspace: " << dir << "/workspace\n"
                           "modules:\n"
                           "  pre_trainer:\n"
                           "    framework: megatron\n"
                           "    model: " << model << "\n"
                           "    overrides:\n"
                           "      device: cpu\n"
                           "      train_iters: 2\n"
                           "      seq_length: 32\n"
                           "      micro_batch_size: 1\n"
                           "      global_batch_size: 12\n"
                           "      lr: 1.0e-3\n"
                           "      mock_data: true\n";
    return path;
  };
  struct Case {
    const char* world;
    const char* model;
    std::vector<std::string> overrides;
    const char* message;
  };
  const std::vector<Case> cases = {
      // 4 experts over 3 ranks.
      {"3", "tiny_mixtral", {"expert_model_parallel_size=3"},
       "expert_model_parallel_size (3) does not divide num_experts"},
      // ep 2 inside a data-parallel size of 3.
      {"3", "tiny_mixtral", {"expert_model_parallel_size=2"},
       "expert_model_parallel_size (2) does not divide the data-parallel size x context_parallel_size = 3"},
      {"2", "tiny_llama", {"expert_model_parallel_size=2"}, "expert_model_parallel_size 2 needs a MoE model"},
      {"1", "tiny_mixtral", {"moe_token_dispatcher_type=allgather"},
       "moe_token_dispatcher_type allgather is not implemented"},
      {"2", "tiny_mixtral",
       {"expert_model_parallel_size=2", "use_megatron_fsdp=true", "data_parallel_sharding_strategy=optim_grads"},
       "expert_model_parallel_size 2 with FSDP's optim_grads"},
  };
  for (const Case& c : cases) {
    setenv("WORLD_SIZE", c.world, 1);
    std::vector<std::string> args{"--", "config", "validate", "--config", config(c.model)};
    args.insert(args.end(), c.overrides.begin(), c.overrides.end());
    const testing::CliResult result = testing::wait_cli(testing::spawn_cli(args, dir), dir);
    unsetenv("WORLD_SIZE");
    EXPECT_EQ(result.exit_code, 2) << c.message << "\n" << result.err;
    EXPECT_NE(result.err.find(c.message), std::string::npos) << "missing '" << c.message << "' in:\n" << result.err;
  }
}

}  // namespace
}  // namespace primus
