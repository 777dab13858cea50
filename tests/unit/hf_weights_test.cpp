// Weights in and out as a Hugging Face model folder: export writes model.safetensors + config.json that
// load back into a fresh model bit for bit, bf16 shards with an index load too, and a folder whose
// config.json describes other shapes is refused naming the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/bf16.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

TEST(HfWeights, ExportThenLoadGivesTheSameWeights) {
  const ModelArgs args = testing::tiny_qwen3_args();
  const std::unique_ptr<Model> source = make_model(args, 16);
  source->params().initialize(3);
  const std::string dir = testing::temp_dir("hf") + "/model";
  export_hf_model(dir, *source);
  EXPECT_TRUE(std::filesystem::exists(dir + "/config.json"));

  const std::unique_ptr<Model> target = make_model(args, 16);
  target->params().flat_params().fill(-7.0f);
  load_hf_weights(dir, *target);
  EXPECT_EQ(testing::max_abs_diff(target->params().flat_params(), source->params().flat_params()), 0.0);
}

TEST(HfWeights, Bf16ShardsWithAnIndexLoad) {
  const ModelArgs args = testing::tiny_llama_args();
  const std::unique_ptr<Model> source = make_model(args, 16);
  source->params().initialize(4);
  const std::string dir = testing::temp_dir("hf_shards");
  export_hf_model(dir, *source);
  std::filesystem::remove(dir + "/model.safetensors");
  // Two bf16 shards, split by parameter, and the index that maps names to them.
  std::vector<std::vector<uint16_t>> keep;
  SafetensorsWriter shards[2];
  std::string weight_map;
  const ParamStore& params = source->params();
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const Tensor p = params.param(i);
    keep.emplace_back(p.numel());
    for (int64_t k = 0; k < p.numel(); ++k) keep.back()[k] = f32_to_bf16(p.f32()[k]);
    const int shard = i % 2;
    shards[shard].add(params.specs()[i].name, DType::kBF16, p.shape(), keep.back().data());
    weight_map += fmt::format("{}\"{}\": \"model-0000{}-of-00002.safetensors\"", weight_map.empty() ? "" : ", ",
                              params.specs()[i].name, shard + 1);
  }
  for (int s = 0; s < 2; ++s) shards[s].write(fmt::format("{}/model-0000{}-of-00002.safetensors", dir, s + 1));
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"weight_map\": {" << weight_map << "}}";

  const std::unique_ptr<Model> target = make_model(args, 16);
  load_hf_weights(dir, *target);
  const float* got = target->params().flat_params().f32();
  const float* want = params.flat_params().f32();
  for (int64_t k = 0; k < params.numel(); ++k) ASSERT_EQ(got[k], bf16_to_f32(f32_to_bf16(want[k]))) << k;
}

TEST(HfWeights, MismatchedShapesAreRefusedNamingTheKey) {
  const std::unique_ptr<Model> source = make_model(testing::tiny_llama_args(), 16);
  source->params().initialize(5);
  const std::string dir = testing::temp_dir("hf_mismatch");
  export_hf_model(dir, *source);
  ModelArgs other = testing::tiny_llama_args();
  other.ffn_hidden_size += 8;
  const std::unique_ptr<Model> target = make_model(other, 16);
  try {
    load_hf_weights(dir, *target);
    FAIL() << "loaded weights of another shape";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace primus
