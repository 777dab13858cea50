// Mixture-of-experts parity with PyTorch (tools/torch_moe.py on Debian's python3-torch, in float64): tiny Mixtral and
// Qwen3-MoE models, DeepSeek-style sigmoid grouped routing with a shared expert, Mixtral with an expert capacity that
// drops about half of the routing entries (both drop policies, padded or not), and a DeepSeek-style model with the
// sequence-level aux loss give the same loss and the same gradient of every parameter (relative error <= 1e-5) with
// their aux and z losses in the objective; and a short AdamW run on a fixed batch lowers the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

// Two MoE layers of 4 experts, top-2 renormalised (Mixtral), untied head, aux and z losses.
ModelArgs tiny_mixtral_args() {
  ModelArgs a = testing::tiny_llama_args();
  a.num_experts = 4;
  a.moe_router_topk = 2;
  a.moe_ffn_hidden_size = 24;
  a.moe_aux_loss_coeff = 0.05;
  a.moe_z_loss_coeff = 0.01;
  return a;
}

// Qwen3 attention, tied head; the first layer dense, then 8 experts, top-3 without renormalising (norm_topk_prob
// false) and a shared expert.
ModelArgs tiny_qwen3_moe_args() {
  ModelArgs a = testing::tiny_qwen3_args();
  a.num_layers = 3;
  a.num_experts = 8;
  a.moe_router_topk = 3;
  a.moe_ffn_hidden_size = 16;
  a.moe_first_k_dense_replace = 1;
  a.moe_router_pre_softmax = true;
  a.moe_shared_expert_intermediate_size = 20;
  a.moe_aux_loss_coeff = 0.02;
  return a;
}

// DeepSeek-V3's routing on the Mixtral layout: sigmoid scores, 4 groups of which 2, top-4, scaled by 2.5; every
// other layer MoE (moe_layer_freq 2).
ModelArgs tiny_sigmoid_grouped_args() {
  ModelArgs a = testing::tiny_llama_args();
  a.num_layers = 3;
  a.num_experts = 8;
  a.moe_router_topk = 4;
  a.moe_ffn_hidden_size = 12;
  a.moe_layer_freq = {2};
  a.moe_router_score_function = "sigmoid";
  a.moe_router_topk_scaling_factor = 2.5;
  a.moe_router_num_groups = 4;
  a.moe_router_group_topk = 2;
  a.moe_aux_loss_coeff = 0.03;
  return a;
}

// Tiny Mixtral with an expert capacity of half the mean load (factor 0.5: ceil(24 x 2 / 4 x 0.5) = 6 of an expert's
// entries kept per micro-batch of 24 tokens, so about half of all entries are dropped), by `policy`, padded or not.
ModelArgs tiny_mixtral_capacity_args(const std::string& policy, bool pad) {
  ModelArgs a = tiny_mixtral_args();
  a.moe_expert_capacity_factor = 0.5;
  a.moe_token_drop_policy = policy;
  a.moe_pad_expert_input_to_capacity = pad;
  return a;
}

// DeepSeek-style: sigmoid scores, a shared expert, the first layer dense, and the sequence-level aux loss (each of
// the 2 sequences of the batch its own counts and mean scores).
ModelArgs tiny_deepseek_seq_aux_args() {
  ModelArgs a = testing::tiny_llama_args();
  a.num_layers = 3;
  a.num_experts = 8;
  a.moe_router_topk = 3;
  a.moe_ffn_hidden_size = 12;
  a.moe_first_k_dense_replace = 1;
  a.moe_router_score_function = "sigmoid";
  a.moe_router_topk_scaling_factor = 1.5;
  a.moe_shared_expert_intermediate_size = 16;
  a.moe_router_load_balancing_type = "seq_aux_loss";
  a.moe_aux_loss_coeff = 0.05;
  return a;
}

// The keys tools/torch_moe.py reads.
void write_moe_json(const std::string& path, const ModelArgs& a) {
  std::string layers;
  for (int64_t i = 0; i < a.num_layers; ++i) layers += fmt::format("{}{}", i ? ", " : "", a.is_moe_layer(i) ? 1 : 0);
  std::ofstream(path) << fmt::format(
      "{{\"vocab_size\": {}, \"hidden_size\": {}, \"ffn_hidden_size\": {}, \"num_layers\": {}, "
      "\"num_attention_heads\": {}, \"num_query_groups\": {}, \"kv_channels\": {}, \"norm_epsilon\": {}, "
      "\"rotary_base\": {}, \"untie_embeddings_and_output_weights\": {}, \"qk_layernorm\": {}, \"num_experts\": {}, "
      "\"moe_router_topk\": {}, \"moe_ffn_hidden_size\": {}, \"moe_shared_expert_intermediate_size\": {}, "
      "\"moe_layers\": [{}], \"moe_router_score_function\": \"{}\", \"moe_router_pre_softmax\": {}, "
      "\"moe_router_topk_scaling_factor\": {}, \"moe_aux_loss_coeff\": {}, \"moe_z_loss_coeff\": {}, "
      "\"moe_router_num_groups\": {}, \"moe_router_group_topk\": {}, \"moe_expert_capacity_factor\": {}, "
      "\"moe_token_drop_policy\": \"{}\", \"moe_router_load_balancing_type\": \"{}\"}}\n",
      a.vocab_size, a.hidden_size, a.ffn_hidden_size, a.num_layers, a.num_attention_heads, a.num_query_groups,
      a.kv_channels, a.norm_epsilon, a.rotary_base, a.untie_embeddings_and_output_weights, a.qk_layernorm,
      a.num_experts, a.moe_router_topk, a.moe_ffn_hidden_size, a.moe_shared_expert_intermediate_size, layers,
      a.moe_router_score_function, a.moe_router_pre_softmax, a.moe_router_topk_scaling_factor, a.moe_aux_loss_coeff,
      a.moe_z_loss_coeff, a.moe_router_num_groups, a.moe_router_group_topk, a.moe_expert_capacity_factor,
      a.moe_token_drop_policy, a.moe_router_load_balancing_type);
}

void check_parity(ModelArgs args, uint64_t seed) {
  ASSERT_TRUE(std::filesystem::exists(kPython)) << kPython << " is missing: run scripts/setup.sh --test";
  const int64_t B = 2, T = 12;
  args.init_method_std = 0.1;  // livelier activations than the 0.02 default, so every gradient is well above noise
  const std::unique_ptr<Model> model = make_model(args, T);
  model->params().initialize(seed);
  Rng rng(seed + 7);
  const Tensor tokens = testing::random_ids({B, T}, args.vocab_size, rng);
  Tensor labels = testing::random_ids({B, T}, args.vocab_size, rng);
  labels.i32()[5] = -100;  // an ignored position: the router losses then weigh 24 / 23

  const std::string dir = testing::temp_dir("moe_parity");
  std::filesystem::create_directories(dir + "/model");
  write_moe_json(dir + "/model/moe.json", args);
  SafetensorsWriter weights;
  for (size_t i = 0; i < model->params().specs().size(); ++i) {
    weights.add(model->params().specs()[i].name, model->params().param(i));
  }
  weights.write(dir + "/model/model.safetensors");
  SafetensorsWriter batch;
  batch.add("input_ids", tokens);
  batch.add("labels", labels);
  batch.write(dir + "/batch.safetensors");
  const std::string command =
      fmt::format("{} {}/tools/torch_moe.py --model-dir {}/model --batch {}/batch.safetensors --out {}/out.safetensors",
                  kPython, PRIMUS_SOURCE_DIR, dir, dir, dir);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  SafetensorsFile reference = SafetensorsFile::open(dir + "/out.safetensors");
  EXPECT_GT(reference.read_f32("router_losses").f32()[0], 0.0f);  // the aux loss is in the objective

  model->params().zero_grads();
  const LossSum s = testing::train_micro_batch(*model, tokens, labels);
  const double loss = s.loss_sum / s.tokens;
  if (args.moe_expert_capacity_factor > 0.0) {  // the capacity bites: entries were dropped in every MoE layer
    for (const MoeLayerRouting& r : model->moe_routing()) EXPECT_GT(r.dropped, 0.0) << "layer " << r.layer;
  }
  const double ref_loss = reference.read_f32("loss").f32()[0];
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss));
  int experts_checked = 0;
  for (size_t i = 0; i < model->params().specs().size(); ++i) {
    const std::string& name = model->params().specs()[i].name;
    const Tensor ref_grad = reference.read_f32("grad." + name);
    EXPECT_LE(testing::relative_error(model->params().grad(i), ref_grad), 1e-5) << name;
    experts_checked += name.find(".experts.") != std::string::npos;
  }
  EXPECT_GT(experts_checked, 0);
}

TEST(TorchMoeParity, TinyMixtral) { check_parity(tiny_mixtral_args(), 31); }
TEST(TorchMoeParity, TinyQwen3MoeWithDenseLayerAndSharedExpert) { check_parity(tiny_qwen3_moe_args(), 32); }
TEST(TorchMoeParity, SigmoidGroupedRoutingEveryOtherLayer) { check_parity(tiny_sigmoid_grouped_args(), 33); }
TEST(TorchMoeParity, CapacityDropsByProbs) { check_parity(tiny_mixtral_capacity_args("probs", false), 34); }
TEST(TorchMoeParity, CapacityDropsByPosition) { check_parity(tiny_mixtral_capacity_args("position", false), 35); }
TEST(TorchMoeParity, CapacityPaddedDropsByProbs) { check_parity(tiny_mixtral_capacity_args("probs", true), 34); }
TEST(TorchMoeParity, CapacityPaddedDropsByPosition) { check_parity(tiny_mixtral_capacity_args("position", true), 36); }
TEST(TorchMoeParity, DeepSeekSequenceAuxLoss) { check_parity(tiny_deepseek_seq_aux_args(), 37); }

// Parameter names and order: Mixtral's and Qwen3-MoE's Hugging Face names, each kind of expert weight contiguous.
TEST(MoeModel, HuggingFaceParameterNames) {
  const std::vector<ParamSpec> mixtral = model_family(tiny_mixtral_args()).param_specs(tiny_mixtral_args());
  auto has = [](const std::vector<ParamSpec>& specs, const std::string& name) {
    return std::any_of(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == name; });
  };
  EXPECT_EQ(model_family_name(tiny_mixtral_args()), "mixtral");
  EXPECT_TRUE(has(mixtral, "model.layers.1.block_sparse_moe.gate.weight"));
  EXPECT_TRUE(has(mixtral, "model.layers.1.block_sparse_moe.experts.3.w1.weight"));
  EXPECT_TRUE(has(mixtral, "model.layers.1.block_sparse_moe.experts.3.w2.weight"));
  EXPECT_TRUE(has(mixtral, "model.layers.1.block_sparse_moe.experts.3.w3.weight"));
  EXPECT_FALSE(has(mixtral, "model.layers.1.mlp.gate_proj.weight"));
  const ModelArgs q = tiny_qwen3_moe_args();
  const std::vector<ParamSpec> qwen = model_family(q).param_specs(q);
  EXPECT_EQ(model_family_name(q), "qwen3_moe");
  EXPECT_TRUE(has(qwen, "model.layers.0.mlp.gate_proj.weight"));  // the dense first layer
  EXPECT_TRUE(has(qwen, "model.layers.2.mlp.gate.weight"));
  EXPECT_TRUE(has(qwen, "model.layers.2.mlp.experts.7.gate_proj.weight"));
  EXPECT_TRUE(has(qwen, "model.layers.2.mlp.experts.7.up_proj.weight"));
  EXPECT_TRUE(has(qwen, "model.layers.2.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(has(qwen, "model.layers.2.mlp.shared_experts.down_proj.weight"));
}

// Active parameters: a token multiplies by k of the E experts, so matmul_params counts k.
TEST(MoeModel, MatmulParamsCountActiveExperts) {
  ModelArgs moe = tiny_mixtral_args();
  ModelArgs top_all = moe;
  top_all.moe_router_topk = moe.num_experts;
  const int64_t expert = 3 * moe.moe_ffn_hidden_size * moe.hidden_size;
  EXPECT_EQ(LlamaModel::matmul_params(top_all) - LlamaModel::matmul_params(moe),
            moe.num_layers * (moe.num_experts - moe.moe_router_topk) * expert);
}

// MoE on the CPU engine runs in fp32 only (bf16 runs on cuda): a bf16 CPU model is refused naming num_experts.
TEST(MoeModel, MixedPrecisionIsRefusedNamingNumExperts) {
  try {
    make_model(tiny_mixtral_args(), 8, kCpuDevice, DType::kBF16);
    FAIL() << "a bf16 MoE model was built";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts: MoE on the CPU engine runs in fp32 only"), std::string::npos)
        << e.what();
  }
}

// A short run on one batch: 30 AdamW steps lower the loss well below where it started.
TEST(MoeModel, TrainingLowersTheLoss) {
  for (const ModelArgs& args : {tiny_mixtral_args(), tiny_qwen3_moe_args()}) {
    const std::unique_ptr<Model> model = make_model(args, 16);
    model->params().initialize(41);
    Rng rng(42);
    const Tensor tokens = testing::random_ids({4, 16}, args.vocab_size, rng);
    const Tensor labels = testing::random_ids({4, 16}, args.vocab_size, rng);
    const auto [first, last] = testing::overfit_one_batch(*model, tokens, labels);
    EXPECT_LT(last, 0.6 * first) << model_family_name(args) << ": " << first << " -> " << last;
  }
}

}  // namespace
}  // namespace primus
