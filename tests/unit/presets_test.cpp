// Every shipped model preset loads through the schema, and the parameter counts it implies equal the
// published model sizes (a check on every shape number at once).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "models/model.h"
#include "support/test_support.h"

namespace primus {
namespace {

ModelArgs load_preset(const std::string& name) {
  const std::string dir = testing::temp_dir("preset");
  const std::string path = dir + "/exp.yaml";
  std::ofstream(path) << "exp_name: preset_check\n"
                         "modules:\n"
                         "  pre_trainer:\n"
                         "    framework: megatron\n"
                         "    model: " << name << "\n"
                         "    overrides: {train_iters: 1, seq_length: 128, lr: 1.0e-4, mock_data: true}\n";
  ModelArgs args = load_experiment_config(path, {}).config.model;
  if (args.vocab_size == 0) args.vocab_size = 384;  // tiny presets take the tokenizer's size
  return args;
}

int64_t parameter_count(const ModelArgs& args) {
  int64_t total = 0;
  for (const ParamSpec& spec : model_family(args).param_specs(args)) total += shape_numel(spec.shape);
  return total;
}

TEST(Presets, EveryShippedPresetLoads) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(PRIMUS_SOURCE_DIR "/configs/models")) {
    const std::string name = entry.path().stem().string();
    if (name.ends_with("_base")) continue;  // partial files meant to be extended
    EXPECT_NO_THROW(load_preset(name)) << name;
    ++loaded;
  }
  EXPECT_GE(loaded, 18);
}

// Parameter counts of the Hugging Face checkpoints (safetensors metadata total_size / bytes per parameter).
TEST(Presets, ParameterCountsMatchThePublishedModels) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  const std::vector<std::pair<std::string, int64_t>> published = {
      {"llama2_7B", 6738415616},     {"llama2_70B", 68976648192},   {"llama3_8B", 8030261248},
      {"llama3_70B", 70553706496},   {"llama3.1_8B", 8030261248},   {"llama3.1_70B", 70553706496},
      {"llama3.1_405B", 405853388800}, {"llama3.2_1B", 1235814400},  {"llama3.2_3B", 3212749824},
      {"qwen3_0.6B", 596049920},     {"qwen3_1.7B", 1720574976},    {"qwen3_4B", 4022468096},
      {"qwen3_8B", 8190735360},      {"qwen3_14B", 14768307200},    {"mixtral_8x7B", 46702792704},
      {"qwen3_30B_A3B", 30532122624},
  };
  for (const auto& [name, count] : published) EXPECT_EQ(parameter_count(load_preset(name)), count) << name;
}

}  // namespace
}  // namespace primus
