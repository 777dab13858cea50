// MoE models under the parallel layouts that wrap the model unchanged, on CPU ranks over Gloo (support/training_job.h):
// data parallelism (with the distributed optimizer) and pipeline parallelism of a 4-layer Mixtral-style model (every
// other layer MoE, 4 experts, top 2) against one rank at the same global batch: losses, gradient norms, evaluation
// losses and every parameter after 20 steps within relative 1e-5, and the same tokens per expert in metrics.jsonl (each
// rank's routing summed over dp and the stages).
//
// Without balancing losses: the aux loss of Megatron's switch router is a product of the counts and mean scores of the
// tokens a rank routes, so per rank (or per micro-batch) it is not the one-rank loss of the whole batch, by design
// (docs/moe.md); the router's gradient from the language-model loss is what must agree. The same with DeepSeek's
// multi-head latent attention in every layer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/test_support.h"
#include "support/training_job.h"

namespace primus {
namespace {

using testing::RunResult;
using testing::with;

const std::vector<std::string> kMoe{"num_layers=4",          "vocab_size=384",         "num_experts=4",
                                    "moe_router_topk=2",     "moe_ffn_hidden_size=48", "moe_layer_freq=2",
                                    "moe_aux_loss_coeff=0.0", "adam_eps=1.0e-6",       "lr=1.0e-3"};

TEST(MoeParallel, DataAndPipelineParallelEqualOneRank) {
  const RunResult one = testing::train("moe_single", 1, kMoe);
  ASSERT_FALSE(one.losses.empty());
  ASSERT_EQ(one.moe_tokens.size(), one.losses.size());
  const RunResult dp = testing::train("moe_dp2", 2, kMoe);
  testing::expect_same_run(one, dp, "dp2");
  const RunResult dist = testing::train(
      "moe_dp2_distopt", 2, with(kMoe, {"use_distributed_optimizer=true", "ddp_bucket_size=7001"}));
  testing::expect_same_run(one, dist, "dp2 distributed optimizer");
  const RunResult pp = testing::train("moe_pp2", 2, with(kMoe, {"pipeline_model_parallel_size=2"}));
  testing::expect_same_run(one, pp, "pp2");
}

// DeepSeek's attention on the same model: multi-head latent attention with a low-rank query and YaRN RoPE
// (docs/mla.md), under data parallelism and two pipeline stages.
TEST(MoeParallel, LatentAttentionDataAndPipelineParallelEqualOneRank) {
  const std::vector<std::string> mla =
      with(kMoe, {"group_query_attention=false", "num_query_groups=4", "multi_latent_attention=true", "q_lora_rank=24",
                  "kv_lora_rank=32", "qk_head_dim=16", "qk_pos_emb_head_dim=8", "v_head_dim=12",
                  "position_embedding_type=yarn", "rotary_scaling_factor=4.0", "original_max_position_embeddings=16"});
  const RunResult one = testing::train("mla_single", 1, mla);
  ASSERT_FALSE(one.losses.empty());
  const RunResult dp = testing::train("mla_dp2", 2, mla);
  testing::expect_same_run(one, dp, "mla dp2");
  const RunResult pp = testing::train("mla_pp2", 2, with(mla, {"pipeline_model_parallel_size=2"}));
  testing::expect_same_run(one, pp, "mla pp2");
}

// DeepSeek-V3's multi-token prediction (two modules, each an MLA + MoE layer, docs/mla.md) under data parallelism,
// with and without the distributed optimizer.
TEST(MoeParallel, MultiTokenPredictionDataParallelEqualsOneRank) {
  const std::vector<std::string> mtp =
      with(kMoe, {"group_query_attention=false", "num_query_groups=4", "multi_latent_attention=true", "q_lora_rank=24",
                  "kv_lora_rank=32", "qk_head_dim=16", "qk_pos_emb_head_dim=8", "v_head_dim=12",
                  "mtp_num_layers=2", "mtp_loss_scaling_factor=0.3"});
  const RunResult one = testing::train("mtp_single", 1, mtp);
  ASSERT_FALSE(one.losses.empty());
  ASSERT_TRUE(one.weights.count("model.layers.5.eh_proj.weight"));
  const RunResult dp = testing::train("mtp_dp2", 2, mtp);
  testing::expect_same_run(one, dp, "mtp dp2");
  const RunResult dist = testing::train(
      "mtp_dp2_distopt", 2, with(mtp, {"use_distributed_optimizer=true", "ddp_bucket_size=7001"}));
  testing::expect_same_run(one, dist, "mtp dp2 distributed optimizer");
}

// The expert bias moves by the global batch's loads: every layout moves it as one rank does.
TEST(MoeParallel, ExpertBiasUpdatesEqualOneRank) {
  const std::vector<std::string> biased =
      with(kMoe, {"moe_router_enable_expert_bias=true", "moe_router_bias_update_rate=0.01"});
  const RunResult one = testing::train("moe_bias_single", 1, biased);
  ASSERT_FALSE(one.losses.empty());
  const RunResult dist = testing::train(
      "moe_bias_dp2_distopt", 2, with(biased, {"use_distributed_optimizer=true", "ddp_bucket_size=7001"}));
  testing::expect_same_run(one, dist, "dp2 distributed optimizer, expert bias");
  const RunResult pp = testing::train("moe_bias_pp2", 2, with(biased, {"pipeline_model_parallel_size=2"}));
  testing::expect_same_run(one, pp, "pp2, expert bias");
}

}  // namespace
}  // namespace primus
