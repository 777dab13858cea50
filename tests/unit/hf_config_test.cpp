// checkpoint/hf_config: export of Llama 3.1 and Qwen3 shapes, import of published-style config.json files,
// round trips, and UsageErrors that name the field and the file for everything we cannot reproduce.
#include "checkpoint/hf_config.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/file_io.h"
#include "support/test_support.h"

// gtest-only substring check (the tests do not link gmock).
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"

namespace primus {
namespace {

using nlohmann::json;

void expect_same_model(const ModelArgs& a, const ModelArgs& b) {
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.ffn_hidden_size, b.ffn_hidden_size);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_query_groups, b.num_query_groups);
  EXPECT_EQ(a.kv_channels, b.kv_channels);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rotary_base, b.rotary_base);
  EXPECT_EQ(a.use_rope_scaling, b.use_rope_scaling);
  EXPECT_EQ(a.rope_scaling_factor, b.rope_scaling_factor);
  EXPECT_EQ(a.rope_scaling_low_freq_factor, b.rope_scaling_low_freq_factor);
  EXPECT_EQ(a.rope_scaling_high_freq_factor, b.rope_scaling_high_freq_factor);
  EXPECT_EQ(a.rope_scaling_original_max_position_embeddings, b.rope_scaling_original_max_position_embeddings);
  EXPECT_EQ(a.norm_epsilon, b.norm_epsilon);
  EXPECT_EQ(a.qk_layernorm, b.qk_layernorm);
  EXPECT_EQ(a.untie_embeddings_and_output_weights, b.untie_embeddings_and_output_weights);
  EXPECT_EQ(a.init_method_std, b.init_method_std);
}

ModelArgs llama31_8b() {
  ModelArgs m;
  m.num_layers = 32;
  m.hidden_size = 4096;
  m.ffn_hidden_size = 14336;
  m.num_attention_heads = 32;
  m.num_query_groups = 8;
  m.kv_channels = 128;
  m.vocab_size = 128256;
  m.max_position_embeddings = 131072;
  m.rotary_base = 500000.0;
  m.use_rope_scaling = true;
  m.rope_scaling_factor = 8.0;
  m.rope_scaling_low_freq_factor = 1.0;
  m.rope_scaling_high_freq_factor = 4.0;
  m.rope_scaling_original_max_position_embeddings = 8192;
  m.norm_epsilon = 1e-5;
  m.untie_embeddings_and_output_weights = true;
  m.init_method_std = 0.02;
  return m;
}

ModelArgs qwen3_0_6b() {
  ModelArgs m;
  m.num_layers = 28;
  m.hidden_size = 1024;
  m.ffn_hidden_size = 3072;
  m.num_attention_heads = 16;
  m.num_query_groups = 8;
  m.kv_channels = 128;  // not hidden / heads (= 64): Qwen3 sets head_dim independently
  m.vocab_size = 151936;
  m.max_position_embeddings = 40960;
  m.rotary_base = 1000000.0;
  m.norm_epsilon = 1e-6;
  m.qk_layernorm = true;
  m.untie_embeddings_and_output_weights = false;
  m.init_method_std = 0.02;
  return m;
}

// The config.json published with Llama 3.1 8B (keys as transformers writes them).
const char* kLlama31Json = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* kQwen3Json = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

TEST(HfConfig, ExportsLlama31) {
  json j = hf_config_from_model(llama31_8b(), "bfloat16");
  EXPECT_EQ(j["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["hidden_size"], 4096);
  EXPECT_EQ(j["intermediate_size"], 14336);
  EXPECT_EQ(j["num_hidden_layers"], 32);
  EXPECT_EQ(j["num_attention_heads"], 32);
  EXPECT_EQ(j["num_key_value_heads"], 8);
  EXPECT_EQ(j["head_dim"], 128);
  EXPECT_EQ(j["vocab_size"], 128256);
  EXPECT_EQ(j["max_position_embeddings"], 131072);
  EXPECT_EQ(j["rms_norm_eps"], 1e-5);
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["rope_scaling"], json::parse(R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"));
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["mlp_bias"], false);
  EXPECT_EQ(j["initializer_range"], 0.02);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_FALSE(j.contains("bos_token_id"));
  EXPECT_FALSE(j.contains("eos_token_id"));
  // Everything the published file says about the model, we say the same way.
  json published = json::parse(kLlama31Json);
  for (const char* key :
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings",
        "hidden_act", "attention_bias", "mlp_bias", "model_type", "architectures", "torch_dtype"}) {
    EXPECT_EQ(j[key], published[key]) << key;
  }
}

TEST(HfConfig, ExportsQwen3) {
  json j = hf_config_from_model(qwen3_0_6b());
  EXPECT_EQ(j["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(j["model_type"], "qwen3");
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_EQ(j["head_dim"], 128);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_FALSE(j.contains("mlp_bias"));
  json published = json::parse(kQwen3Json);
  for (const char* key :
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
        "tie_word_embeddings", "use_sliding_window", "max_window_layers", "model_type", "architectures"}) {
    EXPECT_EQ(j[key], published[key]) << key;
  }
}

TEST(HfConfig, ImportsPublishedConfigs) {
  expect_same_model(model_args_from_hf_config(json::parse(kLlama31Json), "llama/config.json"), llama31_8b());
  ModelArgs q = model_args_from_hf_config(json::parse(kQwen3Json), "qwen/config.json");
  expect_same_model(q, qwen3_0_6b());
  EXPECT_EQ(q.preset, "qwen/config.json");
}

TEST(HfConfig, RoundTrips) {
  for (const ModelArgs& m : {llama31_8b(), qwen3_0_6b()}) {
    expect_same_model(model_args_from_hf_config(hf_config_from_model(m), "rt"), m);
  }
  // Unresolved GQA fields export as plain multi-head attention with head_dim = hidden / heads.
  ModelArgs small;
  small.num_layers = 2;
  small.hidden_size = 96;
  small.ffn_hidden_size = 256;
  small.num_attention_heads = 6;
  small.vocab_size = 512;
  small.max_position_embeddings = 64;
  ModelArgs back = model_args_from_hf_config(hf_config_from_model(small), "rt");
  EXPECT_EQ(back.num_query_groups, 6);
  EXPECT_EQ(back.kv_channels, 16);
  EXPECT_FALSE(back.use_rope_scaling);
  EXPECT_FALSE(back.untie_embeddings_and_output_weights);
}

TEST(HfConfig, FilesRoundTrip) {
  std::string dir = testing::temp_dir("hfcfg");
  write_hf_config(dir + "/config.json", llama31_8b(), "bfloat16");
  expect_same_model(read_hf_config(dir + "/config.json"), llama31_8b());
  EXPECT_EQ(json::parse(read_file(dir + "/config.json"))["torch_dtype"], "bfloat16");
  EXPECT_THROW(read_hf_config(dir + "/absent.json"), UsageError);
  write_file_atomic(dir + "/broken.json", "{\"model_type\": \"llama\",");
  try {
    read_hf_config(dir + "/broken.json");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_CONTAINS(e.what(), dir + "/broken.json");
  }
}

TEST(HfConfig, DefaultsFollowTransformers) {
  json j = json::parse(kQwen3Json);
  j.erase("head_dim");
  j.erase("rms_norm_eps");
  j.erase("tie_word_embeddings");
  ModelArgs q = model_args_from_hf_config(j, "q");
  EXPECT_EQ(q.kv_channels, 128);  // Qwen3Config default, not hidden / heads
  EXPECT_EQ(q.norm_epsilon, 1e-6);
  EXPECT_TRUE(q.untie_embeddings_and_output_weights);

  json l = json::parse(kLlama31Json);
  l.erase("num_key_value_heads");
  l.erase("rope_scaling");
  ModelArgs m = model_args_from_hf_config(l, "l");
  EXPECT_EQ(m.num_query_groups, 32);
  EXPECT_EQ(m.kv_channels, 128);
  EXPECT_FALSE(m.use_rope_scaling);

  // transformers v5 layout: rope_theta and scaling under rope_parameters.
  json v5 = json::parse(kLlama31Json);
  v5["rope_parameters"] = v5["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 250000.0;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  ModelArgs m5 = model_args_from_hf_config(v5, "v5");
  EXPECT_EQ(m5.rotary_base, 250000.0);
  EXPECT_TRUE(m5.use_rope_scaling);
  EXPECT_EQ(m5.rope_scaling_factor, 8.0);
}

void expect_usage_error(const json& j, const std::string& field) {
  try {
    model_args_from_hf_config(j, "/models/x/config.json");
    ADD_FAILURE() << "accepted a config with bad " << field;
  } catch (const UsageError& e) {
    EXPECT_CONTAINS(e.what(), "/models/x/config.json");
    EXPECT_CONTAINS(e.what(), field);
  }
}

TEST(HfConfig, RejectsWhatWeCannotReproduce) {
  const json base = json::parse(kLlama31Json);
  for (const char* key :
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "model_type"}) {
    json j = base;
    j.erase(key);
    expect_usage_error(j, key);
  }
  auto with = [&](const char* key, json value) {
    json j = base;
    j[key] = std::move(value);
    return j;
  };
  expect_usage_error(with("model_type", "mistral"), "model_type \"mistral\" is not supported");
  expect_usage_error(with("hidden_act", "gelu"), "hidden_act");
  expect_usage_error(with("attention_bias", true), "attention_bias");
  expect_usage_error(with("mlp_bias", true), "mlp_bias");
  expect_usage_error(with("hidden_size", "4096"), "hidden_size must be a positive integer");
  expect_usage_error(with("num_hidden_layers", 0), "num_hidden_layers");
  expect_usage_error(with("num_key_value_heads", 5), "num_key_value_heads (5) must divide");
  expect_usage_error(with("rms_norm_eps", -1.0), "rms_norm_eps");
  expect_usage_error(with("tie_word_embeddings", "no"), "tie_word_embeddings");
  expect_usage_error(with("rope_scaling", json::parse(R"({"rope_type": "yarn", "factor": 4.0})")),
                     "rope_scaling.rope_type \"yarn\"");
  expect_usage_error(with("rope_scaling", json::parse(R"({"rope_type": "llama3", "factor": 8.0})")),
                     "rope_scaling.low_freq_factor");
  expect_usage_error(with("rope_scaling", 3), "rope_scaling");
  json qwen = json::parse(kQwen3Json);
  qwen["use_sliding_window"] = true;
  expect_usage_error(qwen, "use_sliding_window");
  expect_usage_error(json::array({1, 2}), "top level");
}

}  // namespace
}  // namespace primus
