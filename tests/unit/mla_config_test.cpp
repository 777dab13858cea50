// Multi-head latent attention and YaRN: the config keys (accepted with Megatron's names, each bad combination refused
// with exit 2 naming its key), the YaRN RoPE table against numbers of the formula in float64 (tools/torch_mla.py's
// inv_frequencies), and DeepSeek's parameter table: Hugging Face names, the published size of DeepSeek-V2-Lite.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "config/config.h"
#include "core/error.h"
#include "layers/rope_table.h"
#include "models/llama.h"
#include "parallel/distributed_env.h"
#include "support/test_support.h"
#include "support/tiny_models.h"
#include "train/moe_routing.h"
#include "train/train_step.h"

namespace primus {
namespace {

ExperimentConfig load_with(const std::string& overrides) {
  return testing::load_tiny_llama_experiment("mla_config", overrides, PRIMUS_SOURCE_DIR "/configs");
}

// MLA's shape keys; tiny_llama has grouped-query attention, which MLA refuses, so kMla turns it off.
constexpr const char* kMlaShape =
    "multi_latent_attention: true, kv_lora_rank: 16, qk_head_dim: 8, qk_pos_emb_head_dim: 4, v_head_dim: 6";
const std::string kMla = std::string(kMlaShape) + ", group_query_attention: false, num_query_groups: 4";

void expect_refused(const std::string& overrides, const std::string& key, const std::string& words) {
  testing::expect_tiny_llama_refused("mla_config", overrides, key, words, PRIMUS_SOURCE_DIR "/configs");
}

TEST(MlaConfig, KeysLoadIntoModelArgs) {
  const ModelArgs m = load_with(std::string(kMla) +
                                ", q_lora_rank: 12, position_embedding_type: yarn, rotary_scaling_factor: 4.0, "
                                "original_max_position_embeddings: 16, beta_fast: 16.0, beta_slow: 2.0, "
                                "mscale: 1.0, mscale_all_dim: 0.5")
                          .model;
  EXPECT_TRUE(m.multi_latent_attention);
  EXPECT_EQ(m.q_lora_rank, 12);
  EXPECT_EQ(m.kv_lora_rank, 16);
  EXPECT_EQ(m.qk_head_dim, 8);
  EXPECT_EQ(m.qk_pos_emb_head_dim, 4);
  EXPECT_EQ(m.v_head_dim, 6);
  EXPECT_TRUE(m.yarn);
  EXPECT_EQ(m.rotary_scaling_factor, 4.0);
  EXPECT_EQ(m.original_max_position_embeddings, 16);
  EXPECT_EQ(m.beta_fast, 16.0);
  EXPECT_EQ(m.beta_slow, 2.0);
  EXPECT_EQ(m.mscale, 1.0);
  EXPECT_EQ(m.mscale_all_dim, 0.5);
  EXPECT_EQ(model_family_name(m), "deepseek_v2");
  // Without q_lora_rank the query is a full-rank projection; plain RoPE without the yarn type.
  const ModelArgs lite = load_with(kMla).model;
  EXPECT_EQ(lite.q_lora_rank, 0);
  EXPECT_FALSE(lite.yarn);
}

TEST(MlaConfig, BadCombinationsExitTwoNamingTheKey) {
  expect_refused(kMlaShape, "group_query_attention", "multi_latent_attention");
  expect_refused("multi_latent_attention: true, qk_head_dim: 8, qk_pos_emb_head_dim: 4, v_head_dim: 6", "kv_lora_rank",
                 "is required");
  expect_refused(
      "multi_latent_attention: true, kv_lora_rank: 16, qk_head_dim: 8, qk_pos_emb_head_dim: 5, "
      "v_head_dim: 6",
      "qk_pos_emb_head_dim", "must be even");
  expect_refused("kv_lora_rank: 16", "kv_lora_rank", "multi_latent_attention is false");
  expect_refused("position_embedding_type: yarn", "position_embedding_type", "multi-head latent attention only");
  expect_refused("beta_fast: 8.0", "beta_fast", "position_embedding_type is rope");
  expect_refused(kMla + ", position_embedding_type: yarn, beta_fast: 1.0, beta_slow: 2.0", "beta_fast",
                 "must exceed beta_slow");
  expect_refused(kMla + ", qk_layernorm: true", "qk_layernorm", "multi_latent_attention");
  expect_refused(kMla + ", tensor_model_parallel_size: 2", "multi_latent_attention",
                 "not split over tensor- or context-parallel ranks");
  expect_refused(kMla + ", context_parallel_size: 2", "multi_latent_attention",
                 "not split over tensor- or context-parallel ranks");
}

// MLA runs on CUDA (mla_gpu_test): the config takes device: cuda and the trainer builds the model for the CPU; a
// CUDA model needs a GPU, so its construction is left to the GPU tests.
TEST(MlaConfig, CudaIsAcceptedByTheConfig) {
  EXPECT_NO_THROW(load_with(kMla + ", device: cuda"));
  EXPECT_NO_THROW(load_with(kMla + ", device: cpu"));
  ModelArgs args = load_with(kMla).model;
  args.vocab_size = 64;  // the tokenizer's, resolved by the trainer
  TrainingArgs t;
  t.seq_length = 32;
  const ProcessGroups groups = make_process_groups(
      make_world_communicator(DistributedEnv{}, kCpuDevice, DistributedTimeout(10000)), args, t);
  EXPECT_NE(make_parallel_model(args, t, kCpuDevice, groups), nullptr);
}

// DeepSeek-V2's rope_scaling (dim 64, theta 1e4, factor 40, original 4096, beta 32 and 1): frequencies below index 10
// kept, from 23 divided by 40, a ramp between; expected values from the formula in float64.
TEST(YarnRope, InverseFrequenciesMatchTheFormula) {
  RopeConfig config;
  config.yarn = YarnConfig{true, 40.0, 4096, 32.0, 1.0, 0.707, 0.707};
  const std::vector<double> f = rope_inverse_frequencies(64, config);
  const std::vector<std::pair<int, double>> expected = {{0, 1.0},
                                                        {5, 0.23713737056616555},
                                                        {10, 0.056234132519034905},
                                                        {11, 0.03900692656714386},
                                                        {12, 0.026879360111431223},
                                                        {15, 0.008334508951020777},
                                                        {16, 0.0055},
                                                        {20, 0.0007905694150420945},
                                                        {23, 3.33380358040831e-05},
                                                        {24, 2.5e-05},
                                                        {31, 3.3338035804083097e-06}};
  for (const auto& [i, value] : expected) EXPECT_NEAR(f[i], value, 1e-12 * value) << i;
  // m(mscale_all_dim)² multiplies the softmax scale; equal mscales leave the tables' magnitude 1.
  EXPECT_NEAR(yarn_softmax_scale_factor(config), 1.5896261651208736, 1e-12);
  const RopeTable table = make_rope_table(64, 3, config);
  EXPECT_NEAR(table.cos.f32()[2 * 32 + 16], std::cos(2 * 0.0055), 1e-7);
  EXPECT_NEAR(table.sin.f32()[2 * 32 + 16], std::sin(2 * 0.0055), 1e-7);
}

// The tiny DeepSeek shape's YaRN: index 1 half interpolated, and the tables scaled by m(1.0) / m(0.8).
TEST(YarnRope, TablesCarryTheMscaleRatio) {
  const ModelArgs a = testing::tiny_deepseek_args(false, true, false);
  RopeConfig config;
  config.yarn =
      YarnConfig{true,     a.rotary_scaling_factor, a.original_max_position_embeddings, a.beta_fast, a.beta_slow,
                 a.mscale, a.mscale_all_dim};
  const std::vector<double> f = rope_inverse_frequencies(8, config);
  EXPECT_NEAR(f[0], 1.0, 1e-15);
  EXPECT_NEAR(f[1], 0.0625, 1e-15);
  EXPECT_NEAR(f[2], 0.0025, 1e-15);
  EXPECT_NEAR(f[3], 0.00025, 1e-15);
  const double ratio = 1.0249579607969668;
  const RopeTable table = make_rope_table(8, 5, config);
  EXPECT_NEAR(table.cos.f32()[3 * 4 + 1], ratio * std::cos(3 * 0.0625), 1e-7);
  EXPECT_NEAR(table.sin.f32()[3 * 4 + 1], ratio * std::sin(3 * 0.0625), 1e-7);
}

bool has(const std::vector<ParamSpec>& specs, const std::string& name) {
  for (const ParamSpec& s : specs) {
    if (s.name == name) return true;
  }
  return false;
}

// DeepSeek-V2's Hugging Face names: q_proj or q_a_proj / q_a_layernorm / q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm,
// kv_b_proj, o_proj; MoE layers under mlp. with shared_experts.
TEST(MlaModel, HuggingFaceParameterNamesAndShapes) {
  const ModelArgs lite = testing::tiny_deepseek_args(false, true, true);
  const std::vector<ParamSpec> specs = LlamaModel::param_specs(lite);
  EXPECT_TRUE(has(specs, "model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(has(specs, "model.layers.0.self_attn.q_a_proj.weight"));
  EXPECT_FALSE(has(specs, "model.layers.0.self_attn.k_proj.weight"));
  EXPECT_TRUE(has(specs, "model.layers.0.mlp.gate_proj.weight"));  // the dense first layer
  EXPECT_TRUE(has(specs, "model.layers.1.mlp.gate.weight"));
  EXPECT_TRUE(has(specs, "model.layers.1.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(has(specs, "model.layers.1.mlp.shared_experts.up_proj.weight"));
  const ModelArgs v3 = testing::tiny_deepseek_args(true, true, false);
  auto shape_of = [&](const std::string& name) {
    for (const ParamSpec& s : LlamaModel::param_specs(v3)) {
      if (s.name == name) return s.shape;
    }
    return Shape{};
  };
  const std::string at = "model.layers.2.self_attn.";
  EXPECT_EQ(shape_of(at + "q_a_proj.weight"), (Shape{10, 32}));
  EXPECT_EQ(shape_of(at + "q_a_layernorm.weight"), (Shape{10}));
  EXPECT_EQ(shape_of(at + "q_b_proj.weight"), (Shape{4 * 16, 10}));
  EXPECT_EQ(shape_of(at + "kv_a_proj_with_mqa.weight"), (Shape{12 + 8, 32}));
  EXPECT_EQ(shape_of(at + "kv_a_layernorm.weight"), (Shape{12}));
  EXPECT_EQ(shape_of(at + "kv_b_proj.weight"), (Shape{4 * (8 + 6), 12}));
  EXPECT_EQ(shape_of(at + "o_proj.weight"), (Shape{32, 4 * 6}));
  // Every projection is a Linear module that code outside the model sees by name.
  const std::unique_ptr<Model> model = make_model(v3, 8);
  std::vector<std::string> names;
  model->for_each_linear([&](const std::string& name, std::unique_ptr<Linear>&) { names.push_back(name); });
  const std::vector<std::string> first = {at + "q_a_proj", at + "q_b_proj", at + "kv_a_proj_with_mqa", at + "kv_b_proj",
                                          at + "o_proj"};
  EXPECT_EQ(std::vector<std::string>(names.end() - 7, names.end() - 2), first);
}

// The multi-token prediction modules' projections are Linear modules code outside the model sees (for_each_linear),
// after the decoder layers', under DeepSeek-V3's names: eh_proj, then the module's layer's own.
TEST(MlaModel, MultiTokenPredictionProjectionsAreVisibleByName) {
  ModelArgs args = testing::tiny_deepseek_args(true, false, true);
  args.mtp_num_layers = 2;
  const std::unique_ptr<Model> model = make_model(args, 8);
  std::vector<std::string> names;
  model->for_each_linear([&](const std::string& name, std::unique_ptr<Linear>&) { names.push_back(name); });
  std::vector<std::string> modules;
  for (const int layer : {3, 4}) {
    const std::string pre = "model.layers." + std::to_string(layer) + ".";
    for (const char* name : {"eh_proj", "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
                             "self_attn.kv_b_proj", "self_attn.o_proj", "mlp.shared_experts.gate_up_proj",
                             "mlp.shared_experts.down_proj"}) {
      modules.push_back(pre + name);
    }
  }
  ASSERT_GE(names.size(), modules.size());
  EXPECT_EQ(std::vector<std::string>(names.end() - static_cast<std::ptrdiff_t>(modules.size()), names.end()), modules);
  // Every one names parameters of the model (gate_up_proj: the adjacent gate_proj and up_proj).
  for (const std::string& name : names) {
    const std::string joined = "gate_up_proj";
    const std::string weight = name.size() > joined.size() && name.ends_with(joined)
                                   ? name.substr(0, name.size() - joined.size()) + "gate_proj.weight"
                                   : name + ".weight";
    EXPECT_TRUE(model->params().contains(weight)) << name;
  }
}

// The multi-token prediction module's MoE router reports its routing as a decoder layer's, numbered on
// (num_layers + k − 1), so the aux-loss-free expert bias moves for it too.
TEST(MlaModel, MultiTokenPredictionRouterUpdatesItsExpertBias) {
  ModelArgs args = testing::tiny_deepseek_args(false, false, true);
  args.mtp_num_layers = 2;
  args.moe_router_enable_expert_bias = true;
  const int64_t B = 2, T = 16;
  const std::unique_ptr<Model> model = make_model(args, T);
  model->params().initialize(83);
  Rng rng(84);
  const Tensor tokens = testing::random_ids({B, T}, args.vocab_size, rng);
  const Tensor labels = testing::random_ids({B, T}, args.vocab_size, rng);
  model->clear_moe_routing();
  testing::train_micro_batch(*model, tokens, labels);
  const std::vector<MoeLayerRouting> routing = model->moe_routing();
  std::vector<int64_t> layers;
  for (const MoeLayerRouting& r : routing) {
    layers.push_back(r.layer);
    double entries = 0.0;
    for (double n : r.tokens_per_expert) entries += n;
    EXPECT_EQ(entries, static_cast<double>(B * T * args.moe_router_topk)) << "layer " << r.layer;
    EXPECT_EQ(r.micro_batches, 1) << "layer " << r.layer;
  }
  EXPECT_EQ(layers, (std::vector<int64_t>{1, 2, 3, 4}));  // the first layer dense; the modules' layers 3 and 4

  MoeMetrics metrics;
  for (const MoeLayerRouting& r : routing) {
    MoeMetrics::Layer layer;
    layer.layer = r.layer;
    layer.tokens_per_expert = r.tokens_per_expert;
    metrics.layers.push_back(layer);
  }
  const double rate = 0.01;
  update_expert_bias(*model, metrics, rate);
  for (const MoeLayerRouting& r : routing) {
    const std::string name = moe_param_names(args, "model.layers." + std::to_string(r.layer) + ".").expert_bias;
    const Tensor bias = model->params().flat_params().slice_elements(
        model->params().offset(model->params().index_of(name)), {args.num_experts});
    double mean = 0.0;
    for (double n : r.tokens_per_expert) mean += n / static_cast<double>(args.num_experts);
    for (int64_t e = 0; e < args.num_experts; ++e) {
      const double load = r.tokens_per_expert[static_cast<size_t>(e)];
      const double expected = load < mean ? rate : load > mean ? -rate : 0.0;
      EXPECT_FLOAT_EQ(bias.f32()[e], static_cast<float>(expected)) << name << " expert " << e;
    }
  }
  model->clear_moe_routing();
  for (const MoeLayerRouting& r : model->moe_routing()) EXPECT_EQ(r.micro_batches, 0) << "layer " << r.layer;
}

// DeepSeek-V2-Lite's preset has the parameters of its checkpoint: 15,706,484,224 (the model card's 15.7B). Its
// sequence-level aux loss is another change's: the count is taken with the plain aux loss in its place.
TEST(MlaModel, DeepSeekV2LiteHasItsPublishedParameterCount) {
  const std::string dir = testing::temp_dir("mla_lite");
  const std::string path = dir + "/exp.yaml";
  std::ofstream(path) << "exp_name: lite\n"
                         "modules:\n"
                         "  pre_trainer:\n"
                         "    framework: megatron\n"
                         "    model: deepseek_v2_lite\n"
                         "    overrides: {train_iters: 1, seq_length: 128, lr: 1.0e-4, mock_data: true, "
                         "moe_router_load_balancing_type: aux_loss}\n";
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  const ModelArgs lite = load_experiment_config(path, {}).config.model;
  int64_t total = 0;
  for (const ParamSpec& s : LlamaModel::param_specs(lite)) total += shape_numel(s.shape);
  EXPECT_EQ(total, 15706484224);
}

}  // namespace
}  // namespace primus
