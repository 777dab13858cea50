// Multi-head latent attention parity with PyTorch (tools/torch_mla.py on Debian's python3-torch, in float64): tiny
// DeepSeek-V2-Lite-shaped models, with a full-rank or a low-rank query, plain or YaRN RoPE, dense or with a dense first
// layer then MoE layers with a shared expert and an aux loss, give the same loss and the same gradient of every
// parameter (relative error <= 1e-5). The reference reads the weights under DeepSeek-V2's Hugging Face names and
// layout (RoPE features interleaved, de-interleaved before rotating), so a checkpoint of that layout gives the same
// loss here. Also: a short AdamW run lowers the loss, and packed documents equal the documents run one by one.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

// The keys tools/torch_mla.py reads (torch_moe.py's and the MLA and YaRN ones).
void write_mla_json(const std::string& path, const ModelArgs& a) {
  std::string layers;
  for (int64_t i = 0; i < a.num_layers; ++i) layers += fmt::format("{}{}", i ? ", " : "", a.is_moe_layer(i) ? 1 : 0);
  std::ofstream(path) << fmt::format(
      "{{\"vocab_size\": {}, \"hidden_size\": {}, \"ffn_hidden_size\": {}, \"num_layers\": {}, "
      "\"num_attention_heads\": {}, \"num_query_groups\": {}, \"kv_channels\": {}, \"norm_epsilon\": {}, "
      "\"rotary_base\": {}, \"untie_embeddings_and_output_weights\": {}, \"qk_layernorm\": {}, \"num_experts\": {}, "
      "\"moe_router_topk\": {}, \"moe_ffn_hidden_size\": {}, \"moe_shared_expert_intermediate_size\": {}, "
      "\"moe_layers\": [{}], \"moe_router_score_function\": \"{}\", \"moe_router_pre_softmax\": {}, "
      "\"moe_router_topk_scaling_factor\": {}, \"moe_aux_loss_coeff\": {}, \"moe_z_loss_coeff\": {}, "
      "\"moe_router_num_groups\": {}, \"moe_router_group_topk\": {}, \"q_lora_rank\": {}, \"kv_lora_rank\": {}, "
      "\"qk_head_dim\": {}, \"qk_pos_emb_head_dim\": {}, \"v_head_dim\": {}, \"yarn\": {}, "
      "\"rotary_scaling_factor\": {}, \"original_max_position_embeddings\": {}, \"beta_fast\": {}, \"beta_slow\": {}, "
      "\"mscale\": {}, \"mscale_all_dim\": {}, \"mtp_num_layers\": {}, \"mtp_loss_scaling_factor\": {}}}\n",
      a.vocab_size, a.hidden_size, a.ffn_hidden_size, a.num_layers, a.num_attention_heads, a.num_query_groups,
      a.kv_channels, a.norm_epsilon, a.rotary_base, a.untie_embeddings_and_output_weights, a.qk_layernorm,
      a.num_experts, a.moe_router_topk, a.moe_ffn_hidden_size, a.moe_shared_expert_intermediate_size, layers,
      a.moe_router_score_function, a.moe_router_pre_softmax, a.moe_router_topk_scaling_factor, a.moe_aux_loss_coeff,
      a.moe_z_loss_coeff, a.moe_router_num_groups, a.moe_router_group_topk, a.q_lora_rank, a.kv_lora_rank,
      a.qk_head_dim, a.qk_pos_emb_head_dim, a.v_head_dim, a.yarn, a.rotary_scaling_factor,
      a.original_max_position_embeddings, a.beta_fast, a.beta_slow, a.mscale, a.mscale_all_dim, a.mtp_num_layers,
      a.mtp_loss_scaling_factor);
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
  labels.i32()[5] = -100;  // an ignored position

  const std::string dir = testing::temp_dir("mla_parity");
  std::filesystem::create_directories(dir + "/model");
  write_mla_json(dir + "/model/mla.json", args);
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
      fmt::format("{} {}/tools/torch_mla.py --model-dir {}/model --batch {}/batch.safetensors --out {}/out.safetensors",
                  kPython, PRIMUS_SOURCE_DIR, dir, dir, dir);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  SafetensorsFile reference = SafetensorsFile::open(dir + "/out.safetensors");
  if (args.num_experts > 0) {
    EXPECT_GT(reference.read_f32("router_losses").f32()[0], 0.0f);  // the aux loss is in the objective
  }

  model->params().zero_grads();
  const LossSum s = testing::train_micro_batch(*model, tokens, labels);
  const double loss = s.loss_sum / s.tokens;
  const double ref_loss = reference.read_f32("loss").f32()[0];
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss));
  int latent_checked = 0;
  for (size_t i = 0; i < model->params().specs().size(); ++i) {
    const std::string& name = model->params().specs()[i].name;
    const Tensor ref_grad = reference.read_f32("grad." + name);
    EXPECT_LE(testing::relative_error(model->params().grad(i), ref_grad), 1e-5) << name;
    latent_checked += name.find("kv_a_proj_with_mqa") != std::string::npos;
  }
  EXPECT_EQ(latent_checked, args.num_layers + args.mtp_num_layers);
  if (args.mtp_num_layers == 0) return;
  // The weighted multi-token prediction losses are in the reference's objective; the engine reports each depth's
  // Σ token losses over its counted tokens (the last k positions of each row and the ignored label have none).
  EXPECT_GT(reference.read_f32("extra_objective").f32()[0], 0.0f);
  const std::vector<LossSum> depths = model->mtp_losses();
  ASSERT_EQ(depths.size(), static_cast<size_t>(args.mtp_num_layers));
  double weighted = 0.0;
  for (int64_t k = 1; k <= args.mtp_num_layers; ++k) {
    const LossSum& d = depths[static_cast<size_t>(k - 1)];
    EXPECT_EQ(d.tokens, B * (T - k) - (5 % T >= k ? 1 : 0)) << "depth " << k;  // label 5 is ignored
    weighted += args.mtp_loss_scaling_factor / static_cast<double>(args.mtp_num_layers) * d.loss_sum / d.tokens;
  }
  const double ref_weighted = reference.read_f32("extra_objective").f32()[0];
  EXPECT_NEAR(weighted, ref_weighted, 1e-5 * std::fabs(ref_weighted));
}

TEST(TorchMlaParity, FullRankQueryPlainRope) { check_parity(testing::tiny_deepseek_args(false, false, false), 51); }
TEST(TorchMlaParity, LowRankQueryWithYarn) { check_parity(testing::tiny_deepseek_args(true, true, false), 52); }
// DeepSeek-V2-Lite's layout: a full-rank query, YaRN, a dense first layer, then MoE with a shared expert and aux loss.
TEST(TorchMlaParity, DeepSeekV2LiteShapedMoe) { check_parity(testing::tiny_deepseek_args(false, true, true), 53); }
TEST(TorchMlaParity, LowRankQueryYarnMoe) { check_parity(testing::tiny_deepseek_args(true, true, true), 54); }
// DeepSeek-V3's layout: low-rank query, YaRN, MoE, and multi-token prediction modules (an MLA + MoE layer each), at
// one and two depths.
TEST(TorchMlaParity, MultiTokenPredictionOneDepth) {
  ModelArgs args = testing::tiny_deepseek_args(true, true, true);
  args.mtp_num_layers = 1;
  args.mtp_loss_scaling_factor = 0.3;
  check_parity(args, 55);
}
TEST(TorchMlaParity, MultiTokenPredictionTwoDepths) {
  ModelArgs args = testing::tiny_deepseek_args(true, true, true);
  args.mtp_num_layers = 2;
  args.mtp_loss_scaling_factor = 0.5;
  check_parity(args, 56);
}
TEST(TorchMlaParity, MultiTokenPredictionDenseTwoDepths) {
  ModelArgs args = testing::tiny_deepseek_args(false, false, false);
  args.mtp_num_layers = 2;
  check_parity(args, 57);
}

// A Hugging Face folder (DeepSeek-V2's config.json and names) written from one model loads into a model built from
// that config.json alone, with the same loss; the config states every MLA, YaRN and MoE setting.
TEST(MlaModel, HuggingFaceExportImportKeepsTheLoss) {
  for (const bool q_lora : {false, true}) {
    ModelArgs args = testing::tiny_deepseek_args(q_lora, true, true);
    args.moe_router_topk_scaling_factor = 1.5;
    args.mtp_num_layers = q_lora ? 1 : 0;  // DeepSeek-V3's num_nextn_predict_layers and its module's tensors
    const std::unique_ptr<Model> source = make_model(args, 12);
    source->params().initialize(81);
    const std::string dir = testing::temp_dir("mla_hf");
    export_hf_model(dir, *source);
    const nlohmann::json config = hf_config_from_model(args);
    EXPECT_EQ(config.at("model_type"), "deepseek_v2");
    EXPECT_EQ(config.at("qk_nope_head_dim"), 8);
    EXPECT_EQ(config.at("qk_rope_head_dim"), 8);
    EXPECT_EQ(config.at("rope_scaling").at("type"), "yarn");
    EXPECT_EQ(config.at("n_shared_experts"), 2);
    const ModelArgs read = read_hf_config(dir + "/config.json");
    EXPECT_NO_THROW(require_same_model(read, args, "config.json"));
    EXPECT_EQ(read.q_lora_rank, args.q_lora_rank);
    EXPECT_EQ(read.moe_first_k_dense_replace, 1);
    EXPECT_EQ(read.moe_router_topk_scaling_factor, 1.5);
    EXPECT_EQ(model_family_name(read), "deepseek_v2");
    const std::unique_ptr<Model> target = make_model(read, 12);
    load_hf_weights(dir, *target);
    Rng rng(82);
    const Tensor tokens = testing::random_ids({2, 12}, args.vocab_size, rng);
    const Tensor labels = testing::random_ids({2, 12}, args.vocab_size, rng);
    EXPECT_EQ(source->evaluate(tokens, labels).loss_sum, target->evaluate(tokens, labels).loss_sum);
    EXPECT_EQ(read.mtp_num_layers, args.mtp_num_layers);
    EXPECT_EQ(config.contains("num_nextn_predict_layers"), args.mtp_num_layers > 0);
    EXPECT_EQ(testing::relative_error(target->params().flat_params(), source->params().flat_params()), 0.0);
    // A different compression is another model: named.
    ModelArgs other = args;
    other.kv_lora_rank += 1;
    try {
      require_same_model(read, other, "config.json");
      ADD_FAILURE() << "a different kv_lora_rank was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("kv_lora_rank"), std::string::npos) << e.what();
    }
  }
}

// Two documents packed into one row (their own positions and attention) give each document's losses as run alone.
TEST(MlaModel, PackedDocumentsEqualSeparateSequences) {
  const ModelArgs args = testing::tiny_deepseek_args(true, true, false);
  const int64_t T = 10, split = 4;
  const std::unique_ptr<Model> model = make_model(args, T);
  model->params().initialize(61);
  Rng rng(62);
  const Tensor tokens = testing::random_ids({1, T}, args.vocab_size, rng);
  const Tensor labels = testing::random_ids({1, T}, args.vocab_size, rng);
  PackedSequence packed{Tensor::empty({1, T}, DType::kI32), Tensor::empty({1, T}, DType::kI32)};
  for (int64_t t = 0; t < T; ++t) {
    packed.position_ids.i32()[t] = static_cast<int32_t>(t < split ? t : t - split);
    packed.segment_start.i32()[t] = static_cast<int32_t>(t < split ? 0 : split);
  }
  const LossSum together = model->evaluate(tokens, labels, packed);
  double apart = 0.0;
  for (const auto& [begin, length] : {std::pair<int64_t, int64_t>{0, split}, {split, T - split}}) {
    Tensor part_tokens = Tensor::empty({1, length}, DType::kI32), part_labels = Tensor::empty({1, length}, DType::kI32);
    std::copy_n(tokens.i32() + begin, length, part_tokens.i32());
    std::copy_n(labels.i32() + begin, length, part_labels.i32());
    apart += model->evaluate(part_tokens, part_labels).loss_sum;
  }
  EXPECT_NEAR(together.loss_sum, apart, 1e-5 * std::fabs(apart));
}

// A short run on one batch: 30 AdamW steps lower the loss well below where it started.
TEST(MlaModel, TrainingLowersTheLoss) {
  ModelArgs with_mtp = testing::tiny_deepseek_args(true, true, true);
  with_mtp.mtp_num_layers = 2;
  for (const ModelArgs& args :
       {testing::tiny_deepseek_args(false, true, true), testing::tiny_deepseek_args(true, true, false), with_mtp}) {
    const std::unique_ptr<Model> model = make_model(args, 16);
    model->params().initialize(71);
    Rng rng(72);
    const Tensor tokens = testing::random_ids({4, 16}, args.vocab_size, rng);
    const Tensor labels = testing::random_ids({4, 16}, args.vocab_size, rng);
    const auto [first, last] = testing::overfit_one_batch(*model, tokens, labels);
    EXPECT_LT(last, 0.6 * first) << "q_lora_rank " << args.q_lora_rank << ": " << first << " -> " << last;
  }
}

}  // namespace
}  // namespace primus
