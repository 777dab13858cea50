// Every shipped model preset loads through the schema, and the parameter counts it implies equal the
// published model sizes (a check on every shape number at once).
#include <gtest/gtest.h>

#include <algorithm>
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

// Presets of models whose features the engine lacks: they carry the published shapes and fail to load, naming a key
// of a missing feature (never a silent approximation of the model).
const std::vector<std::pair<std::string, std::string>>& refused_presets() {
  static const std::vector<std::pair<std::string, std::string>> refused = {
      {"gpt_oss_20B", "add_bias_linear: 'true' is not allowed"},
  };
  return refused;
}

bool is_refused(const std::string& name) {
  for (const auto& [preset, message] : refused_presets()) {
    if (preset == name) return true;
  }
  return false;
}

TEST(Presets, EveryShippedPresetLoads) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(PRIMUS_SOURCE_DIR "/configs/models")) {
    const std::string name = entry.path().stem().string();
    if (name.ends_with("_base") || is_refused(name)) continue;  // partial files meant to be extended; refused ones
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
      {"qwen3_30B_A3B", 30532122624}, {"mixtral_8x22B", 140630071296},
  };
  for (const auto& [name, count] : published) EXPECT_EQ(parameter_count(load_preset(name)), count) << name;
  // The model cards give only rounded figures: 235B and 15.7B parameters.
  EXPECT_NEAR(static_cast<double>(parameter_count(load_preset("qwen3_235B_A22B"))), 235e9, 0.5e9);
  EXPECT_NEAR(static_cast<double>(parameter_count(load_preset("deepseek_v2_lite"))), 15.7e9, 0.05e9);
}

// DeepSeek-V3's card: 671B parameters in the main model and 14B in its multi-token prediction module. The module's
// checkpoint tensors include copies of the embedding and the output layer, which the module shares here (they are
// counted once, in the main model).
TEST(Presets, DeepSeekV3CountsItsMultiTokenPredictionModule) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  ModelArgs v3 = load_preset("deepseek_v3");
  ASSERT_EQ(v3.mtp_num_layers, 1);
  EXPECT_DOUBLE_EQ(v3.mtp_loss_scaling_factor, 0.1);
  const int64_t with_mtp = parameter_count(v3);
  v3.mtp_num_layers = 0;
  const int64_t main_model = parameter_count(v3);
  EXPECT_NEAR(static_cast<double>(main_model), 671e9, 0.5e9);
  const int64_t shared_copies = 2 * v3.vocab_size * v3.hidden_size;
  // 13.46B with the copies: the card's 14B (and its 685B in all) are rounded up.
  EXPECT_NEAR(static_cast<double>(with_mtp - main_model + shared_copies), 14e9, 0.6e9);
  EXPECT_NEAR(static_cast<double>(with_mtp + shared_copies), 685e9, 0.6e9);
  // The module: enorm, hnorm, eh_proj [C, 2C], one MLA + MoE layer (the last layer's kind) and its final norm.
  const int64_t C = v3.hidden_size;
  v3.mtp_num_layers = 1;
  const std::vector<ParamSpec> specs = model_family(v3).param_specs(v3);
  int64_t layer61 = 0, layer60 = 0;
  for (const ParamSpec& spec : specs) {
    if (spec.name.starts_with("model.layers.61.")) layer61 += shape_numel(spec.shape);
    if (spec.name.starts_with("model.layers.60.")) layer60 += shape_numel(spec.shape);
  }
  EXPECT_EQ(layer61, layer60 + 3 * C + 2 * C * C);
  for (const char* name : {"model.layers.61.enorm.weight", "model.layers.61.hnorm.weight",
                           "model.layers.61.eh_proj.weight", "model.layers.61.shared_head.norm.weight",
                           "model.layers.61.self_attn.kv_b_proj.weight", "model.layers.61.mlp.experts.255.down_proj.weight",
                           "model.layers.61.mlp.gate.e_score_correction_bias"}) {
    EXPECT_TRUE(std::any_of(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == name; })) << name;
  }
}

// Multi-token prediction runs on the CPU engine in fp32, on one pipeline stage, without tensor or context parallelism
// or FSDP: the rest is refused naming mtp_num_layers and why.
TEST(Presets, MultiTokenPredictionRefusesWhatItCannotRun) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  ModelArgs tiny = load_preset("tiny_llama");
  tiny.mtp_num_layers = 1;
  EXPECT_NO_THROW(make_model(tiny, 64));
  try {
    make_model(tiny, 64, kCpuDevice, DType::kBF16);
    ADD_FAILURE() << "bf16 multi-token prediction was built";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("mtp_num_layers"), std::string::npos) << e.what();
  }
  EXPECT_EQ(mtp_layout_refusal(tiny, 1, 1, 1, false), "");
  const std::vector<std::pair<std::string, std::string>> refusals = {
      {mtp_layout_refusal(tiny, 1, 2, 1, false), "embedding on the last pipeline stage"},
      {mtp_layout_refusal(tiny, 2, 1, 1, false), "tensor- or context-parallel"},
      {mtp_layout_refusal(tiny, 1, 1, 2, false), "tensor- or context-parallel"},
      {mtp_layout_refusal(tiny, 1, 1, 1, true), "use_megatron_fsdp"},
  };
  for (const auto& [why, what] : refusals) {
    EXPECT_EQ(why.rfind("mtp_num_layers: ", 0), 0u) << why;
    EXPECT_NE(why.find(what), std::string::npos) << why;
  }
  tiny.mtp_num_layers = 0;
  EXPECT_EQ(mtp_layout_refusal(tiny, 2, 2, 2, true), "");
}

TEST(Presets, PresetsOfMissingFeaturesExitTwoNamingTheKey) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  for (const auto& [name, message] : refused_presets()) {
    try {
      load_preset(name);
      ADD_FAILURE() << name << " loaded";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << name << ": " << e.what();
    }
  }
}

// Each feature key of DeepSeek and GPT-OSS the engine lacks is refused on its own, with the feature named
// (multi-head latent attention's keys load: tests/unit/mla_config_test.cpp).
TEST(Presets, EachMissingFeatureKeyIsRefusedByName) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"softmax_type: learnable", "attention sinks"},
      {"window_size: \"(128, 0)\"", "sliding-window attention"},
      {"activation_func_clamp_value: 7.0", "clamped SwiGLU"},
  };
  for (const auto& [line, feature] : keys) {
    const std::string dir = testing::temp_dir("feature");
    const std::string path = dir + "/exp.yaml";
    std::ofstream(path) << "exp_name: feature_check\n"
                           "modules:\n"
                           "  pre_trainer:\n"
                           "    framework: megatron\n"
                           "    model: tiny_llama\n"
                           "    overrides: {train_iters: 1, seq_length: 128, lr: 1.0e-4, mock_data: true, "
                        << line << "}\n";
    const std::string key = line.substr(0, line.find(':'));
    try {
      load_experiment_config(path, {});
      ADD_FAILURE() << line << " accepted";
    } catch (const UsageError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(key), std::string::npos) << what;
      EXPECT_NE(what.find(feature), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace primus
