// config.json of the MoE families: Mixtral's and Qwen3-MoE's fields written and read back to the same model, the
// published Qwen3-30B-A3B style file read as Megatron's keys, and routing Hugging Face's config cannot state refused
// naming the key.
#include <gtest/gtest.h>

#include "checkpoint/hf_config.h"
#include "core/error.h"
#include "models/model.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

using nlohmann::json;

ModelArgs mixtral() {
  ModelArgs a = testing::tiny_llama_args();
  a.num_experts = 4;
  a.moe_router_topk = 2;
  a.moe_ffn_hidden_size = a.ffn_hidden_size;
  a.moe_aux_loss_coeff = 0.02;
  return a;
}

ModelArgs qwen3_moe() {
  ModelArgs a = testing::tiny_qwen3_args();
  a.num_layers = 3;
  a.num_experts = 8;
  a.moe_router_topk = 3;
  a.moe_ffn_hidden_size = 16;
  a.moe_first_k_dense_replace = 1;
  a.moe_router_pre_softmax = true;
  return a;
}

TEST(MoeHfConfig, MixtralRoundTrip) {
  const json j = hf_config_from_model(mixtral());
  EXPECT_EQ(j.at("model_type"), "mixtral");
  EXPECT_EQ(j.at("architectures").at(0), "MixtralForCausalLM");
  EXPECT_EQ(j.at("num_local_experts"), 4);
  EXPECT_EQ(j.at("num_experts_per_tok"), 2);
  const ModelArgs back = model_args_from_hf_config(j, "config.json");
  EXPECT_EQ(back.num_experts, 4);
  EXPECT_EQ(back.moe_router_topk, 2);
  EXPECT_EQ(back.moe_ffn_hidden_size, mixtral().ffn_hidden_size);
  EXPECT_DOUBLE_EQ(back.moe_aux_loss_coeff, 0.02);
  EXPECT_NO_THROW(require_same_model(back, mixtral(), "config.json"));
}

TEST(MoeHfConfig, Qwen3MoeRoundTripKeepsDenseLayersAndNormTopkProb) {
  const json j = hf_config_from_model(qwen3_moe());
  EXPECT_EQ(j.at("model_type"), "qwen3_moe");
  EXPECT_EQ(j.at("norm_topk_prob"), false);
  EXPECT_EQ(j.at("mlp_only_layers"), json::array({0}));
  const ModelArgs back = model_args_from_hf_config(j, "config.json");
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(back.is_moe_layer(i), qwen3_moe().is_moe_layer(i)) << i;
  EXPECT_TRUE(back.moe_router_pre_softmax);
  EXPECT_EQ(model_family_name(back), "qwen3_moe");
  EXPECT_NO_THROW(require_same_model(back, qwen3_moe(), "config.json"));
  ModelArgs other = qwen3_moe();
  other.num_experts = 16;
  EXPECT_NE(testing::message_of<UsageError>([&] { require_same_model(back, other, "config.json"); }).find("num_experts is 8"),
            std::string::npos);
}

TEST(MoeHfConfig, PublishedQwen3MoeFieldsReadAsMegatronKeys) {
  const json j = {{"model_type", "qwen3_moe"}, {"hidden_size", 2048},          {"intermediate_size", 6144},
                  {"num_hidden_layers", 48},   {"num_attention_heads", 32},    {"num_key_value_heads", 4},
                  {"head_dim", 128},           {"vocab_size", 151936},         {"num_experts", 128},
                  {"num_experts_per_tok", 8},  {"moe_intermediate_size", 768}, {"norm_topk_prob", true},
                  {"decoder_sparse_step", 1},  {"mlp_only_layers", json::array()}, {"router_aux_loss_coef", 0.001}};
  const ModelArgs m = model_args_from_hf_config(j, "config.json");
  EXPECT_EQ(m.num_experts, 128);
  EXPECT_EQ(m.moe_router_topk, 8);
  EXPECT_EQ(m.moe_ffn_hidden_size, 768);
  EXPECT_FALSE(m.moe_router_pre_softmax);
  for (int64_t i = 0; i < 48; ++i) EXPECT_TRUE(m.is_moe_layer(i));
}

// Routing Hugging Face's config cannot state: model_type primus_moe (transformers refuses it rather than load another
// model), and the primus_moe block reads back to exactly the model.
TEST(MoeHfConfig, RoutingHuggingFaceCannotStateBecomesPrimusMoeAndRoundTrips) {
  ModelArgs sigmoid = mixtral();
  sigmoid.num_layers = 3;
  sigmoid.num_experts = 8;
  sigmoid.moe_layer_freq = {1, 0, 1};
  sigmoid.moe_ffn_hidden_size = 24;
  sigmoid.moe_router_score_function = "sigmoid";
  sigmoid.moe_router_num_groups = 4;
  sigmoid.moe_router_group_topk = 2;
  sigmoid.moe_router_topk_scaling_factor = 2.5;
  sigmoid.moe_z_loss_coeff = 0.001;
  sigmoid.moe_expert_capacity_factor = 1.25;
  sigmoid.moe_token_drop_policy = "position";
  sigmoid.moe_pad_expert_input_to_capacity = true;
  const json j = hf_config_from_model(sigmoid);
  EXPECT_EQ(j.at("model_type"), "primus_moe");
  EXPECT_NE(j.at("primus_moe_note").get<std::string>().find("moe_router_score_function"), std::string::npos);
  const ModelArgs back = model_args_from_hf_config(j, "config.json");
  EXPECT_EQ(model_family_name(back), "mixtral");
  EXPECT_EQ(back.ffn_hidden_size, sigmoid.ffn_hidden_size);
  EXPECT_EQ(back.moe_ffn_hidden_size, 24);
  EXPECT_EQ(back.moe_layer_freq, sigmoid.moe_layer_freq);
  EXPECT_EQ(back.moe_router_score_function, "sigmoid");
  EXPECT_EQ(back.moe_router_num_groups, 4);
  EXPECT_EQ(back.moe_router_group_topk, 2);
  EXPECT_DOUBLE_EQ(back.moe_router_topk_scaling_factor, 2.5);
  EXPECT_DOUBLE_EQ(back.moe_z_loss_coeff, 0.001);
  EXPECT_DOUBLE_EQ(back.moe_expert_capacity_factor, 1.25);
  EXPECT_EQ(back.moe_token_drop_policy, "position");
  EXPECT_TRUE(back.moe_pad_expert_input_to_capacity);
  EXPECT_NO_THROW(require_same_model(back, sigmoid, "config.json"));

  ModelArgs shared = qwen3_moe();
  shared.moe_shared_expert_intermediate_size = 32;
  const json q = hf_config_from_model(shared);
  EXPECT_EQ(q.at("model_type"), "primus_moe");
  const ModelArgs shared_back = model_args_from_hf_config(q, "config.json");
  EXPECT_EQ(model_family_name(shared_back), "qwen3_moe");
  EXPECT_EQ(shared_back.moe_shared_expert_intermediate_size, 32);
  EXPECT_EQ(shared_back.kv_channels, shared.kv_channels);
}

TEST(MoeHfConfig, PrimusMoeWithoutItsBlockIsRefused) {
  json j = hf_config_from_model(mixtral());
  j["model_type"] = "primus_moe";
  j.erase("primus_moe");
  EXPECT_NE(testing::message_of<UsageError>([&] { model_args_from_hf_config(j, "config.json"); })
                .find("primus_moe is required with model_type primus_moe"),
            std::string::npos);
}

}  // namespace
}  // namespace primus
