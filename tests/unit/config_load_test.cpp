// Loading valid experiment configs: typed values, preset lookup, extends merging, ${VAR} substitution,
// derived values, entries with sources, `config show`, and the effective-YAML round trip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "core/error.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

std::string assets() { return testing::assets_dir() + "/config"; }

std::string write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
  return path;
}

const ConfigEntry& entry(const LoadedConfig& loaded, const std::string& key) {
  for (const ConfigEntry& e : loaded.entries) {
    if (e.key_path == key) return e;
  }
  throw std::runtime_error("no entry " + key);
}

// Sources are display paths (relative to the working directory when below it), so compare the tail.
#define EXPECT_SOURCE(loaded, key, tail)                                                                  \
  do {                                                                                                    \
    std::string source_ = entry(loaded, key).source;                                                      \
    EXPECT_TRUE(source_.ends_with(tail)) << key << " has source " << source_ << ", expected ..." << tail; \
  } while (0)

class ConfigLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("PRIMUS_CONFIGS_DIR", assets().c_str(), 1);
    unsetenv("PRIMUS_TEST_TEAM");
    unsetenv("PRIMUS_TEST_USER");
  }
};

TEST_F(ConfigLoadTest, LoadsTypedValuesFromPresetAndOverrides) {
  setenv("PRIMUS_TEST_USER", "alice", 1);
  LoadedConfig loaded = load_experiment_config(assets() + "/exp_tiny.yaml", {});
  const ExperimentConfig& c = loaded.config;
  EXPECT_EQ(c.work_group, "amd");  // ${PRIMUS_TEST_TEAM:amd} with the variable unset
  EXPECT_EQ(c.user_name, "alice");
  EXPECT_EQ(c.exp_name, "tiny_exp");
  EXPECT_EQ(c.workspace, "./output");
  EXPECT_EQ(c.run_dir(), "./output/tiny_exp");
  EXPECT_EQ(c.env.at("OMP_NUM_THREADS"), "2");
  EXPECT_EQ(c.env.at("PRIMUS_FLAG"), "on");
  EXPECT_EQ(c.module_name, "pre_trainer");
  EXPECT_EQ(c.framework, "megatron");
  EXPECT_EQ(c.model.preset, "tiny");
  // From the preset.
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.ffn_hidden_size, 172);
  EXPECT_EQ(c.model.num_attention_heads, 4);
  EXPECT_EQ(c.model.max_position_embeddings, 256);
  EXPECT_DOUBLE_EQ(c.model.norm_epsilon, 1e-5);
  // Derived.
  EXPECT_EQ(c.model.num_query_groups, 4);
  EXPECT_EQ(c.model.kv_channels, 16);
  EXPECT_EQ(c.model.vocab_size, 0);
  EXPECT_EQ(c.train.lr_decay_iters, 20);
  EXPECT_EQ(c.train.data_parallel_size, 1);
  // Defaults.
  EXPECT_EQ(c.model.make_vocab_size_divisible_by, 128);
  EXPECT_DOUBLE_EQ(c.model.init_method_std, 0.02);
  EXPECT_EQ(c.train.lr_decay_style, "cosine");
  EXPECT_DOUBLE_EQ(c.train.adam_beta2, 0.999);
  EXPECT_EQ(c.train.seed, 1234);
  EXPECT_EQ(c.train.split, "969,30,1");
  EXPECT_EQ(c.train.device, "auto");
  // From overrides; 3.0e-4 and 3e-5 are floats although YAML 1.2 calls them strings.
  EXPECT_EQ(c.train.train_iters, 20);
  EXPECT_EQ(c.train.micro_batch_size, 2);
  EXPECT_EQ(c.train.global_batch_size, 8);
  EXPECT_EQ(c.train.seq_length, 128);
  EXPECT_DOUBLE_EQ(c.train.lr, 3.0e-4);
  EXPECT_DOUBLE_EQ(c.train.min_lr, 3e-5);
  EXPECT_EQ(c.train.lr_warmup_iters, 5);
  EXPECT_TRUE(c.train.mock_data);
  EXPECT_EQ(c.train.data_path, (std::vector<std::string>{"a.txt", "b.txt"}));
  EXPECT_EQ(c.train.sample_prompt, "cost: ${HOME} \"quoted\"");  // $${ is a literal ${
  EXPECT_EQ(c.source_path, assets() + "/exp_tiny.yaml");
}

TEST_F(ConfigLoadTest, EntriesNameTheSourceOfEveryValue) {
  LoadedConfig loaded = load_experiment_config(assets() + "/exp_tiny.yaml", {"lr=1e-4"});
  EXPECT_SOURCE(loaded, "exp_name", "config/exp_tiny.yaml:4");
  EXPECT_SOURCE(loaded, "hidden_size", "config/models/tiny.yaml:3");
  EXPECT_EQ(entry(loaded, "hidden_size").value, "64");
  EXPECT_SOURCE(loaded, "train_iters", "config/exp_tiny.yaml:14");
  EXPECT_EQ(entry(loaded, "seed").source, "default");
  EXPECT_EQ(entry(loaded, "seed").value, "1234");
  EXPECT_EQ(entry(loaded, "kv_channels").source, "derived");
  EXPECT_EQ(entry(loaded, "kv_channels").value, "16");
  EXPECT_EQ(entry(loaded, "lr").source, "command line");
  EXPECT_EQ(entry(loaded, "lr").value, "0.0001");
  EXPECT_EQ(entry(loaded, "env.OMP_NUM_THREADS").value, "\"2\"");
  EXPECT_EQ(entry(loaded, "modules.pre_trainer.model").value, "tiny");
  EXPECT_EQ(entry(loaded, "vocab_size").value, "null");
  // Every schema key appears once.
  size_t module_entries = 0;
  for (const ConfigEntry& e : loaded.entries) module_entries += e.key_path.find('.') == std::string::npos;
  EXPECT_GT(module_entries, 55u);
}

TEST_F(ConfigLoadTest, ConfigShowListsKeysGroupedWithSources) {
  LoadedConfig loaded = load_experiment_config(assets() + "/exp_tiny.yaml", {"seed=7"});
  std::string table = format_config_show(loaded);
  size_t top = table.find("# top level");
  size_t model = table.find("# model");
  size_t training = table.find("# training");
  ASSERT_NE(top, std::string::npos) << table;
  ASSERT_NE(model, std::string::npos) << table;
  ASSERT_NE(training, std::string::npos) << table;
  EXPECT_LT(top, model);
  EXPECT_LT(model, training);
  size_t hidden = table.find("\nhidden_size ");
  size_t seed = table.find("\nseed ");
  ASSERT_NE(hidden, std::string::npos);
  ASSERT_NE(seed, std::string::npos);
  EXPECT_GT(hidden, model);
  EXPECT_LT(hidden, training);
  EXPECT_GT(seed, training);
  std::string seed_line = table.substr(seed + 1, table.find('\n', seed + 1) - seed - 1);
  EXPECT_NE(seed_line.find("7"), std::string::npos) << seed_line;
  EXPECT_NE(seed_line.find("command line"), std::string::npos) << seed_line;
  EXPECT_NE(table.find("models/tiny.yaml:3"), std::string::npos) << table;
  EXPECT_NE(table.find("default"), std::string::npos) << table;
}

TEST_F(ConfigLoadTest, PresetFoundByNameWithSuffixOrByRelativePath) {
  std::string dir = testing::temp_dir("config-preset");
  const char* body =
      "exp_name: e\nmodules:\n  pre_trainer:\n    framework: megatron\n    model: {}\n"
      "    overrides: {{train_iters: 3, seq_length: 32, lr: 0.1, mock_data: true}}\n";
  for (const std::string& name : {std::string("tiny"), std::string("tiny.yaml"), assets() + "/models/tiny.yaml"}) {
    std::string path = write_file(dir + "/by_name.yaml", fmt::format(fmt::runtime(body), name));
    EXPECT_EQ(load_experiment_config(path, {}).config.model.hidden_size, 64) << name;
  }
  // A path relative to the experiment file wins over the presets directory.
  write_file(dir + "/mine/tiny.yaml",
             "num_layers: 1\nhidden_size: 32\nffn_hidden_size: 8\nnum_attention_heads: 2\n"
             "max_position_embeddings: 64\n");
  std::string path = write_file(dir + "/local.yaml", fmt::format(fmt::runtime(body), "mine/tiny.yaml"));
  LoadedConfig loaded = load_experiment_config(path, {});
  EXPECT_EQ(loaded.config.model.hidden_size, 32);
  EXPECT_SOURCE(loaded, "hidden_size", "/mine/tiny.yaml:2");
}

TEST_F(ConfigLoadTest, PresetMayExtendAnotherPreset) {
  LoadedConfig loaded = load_experiment_config(assets() + "/exp_tiny.yaml", {"modules.pre_trainer.model=tiny_gqa"});
  EXPECT_EQ(loaded.config.model.preset, "tiny_gqa");
  EXPECT_EQ(loaded.config.model.hidden_size, 64);               // from tiny.yaml
  EXPECT_EQ(loaded.config.model.num_query_groups, 2);           // from tiny_gqa.yaml
  EXPECT_DOUBLE_EQ(loaded.config.model.rotary_base, 500000.0);  // int written for a float key
  EXPECT_SOURCE(loaded, "rotary_base", "config/models/tiny_gqa.yaml:5");
}

TEST_F(ConfigLoadTest, ExtendsMergesDeeplyLaterWinsListsReplace) {
  LoadedConfig loaded = load_experiment_config(assets() + "/exp_extends.yaml", {});
  const ExperimentConfig& c = loaded.config;
  EXPECT_EQ(c.exp_name, "extends_exp");
  EXPECT_EQ(c.workspace, "/tmp/primus-base-workspace");  // only in base/training.yaml
  EXPECT_EQ(c.model.hidden_size, 64);                    // preset path relative to base/model.yaml
  EXPECT_EQ(c.train.train_iters, 30);                    // base/training.yaml wins over base/model.yaml
  EXPECT_EQ(c.train.seq_length, 64);                     // deep merge keeps base/model.yaml's key
  EXPECT_EQ(c.train.log_interval, 7);
  EXPECT_EQ(c.train.eval_interval, 0);
  EXPECT_DOUBLE_EQ(c.train.lr, 2.0e-4);                                    // the file's own body wins over all
  EXPECT_EQ(c.train.data_path, std::vector<std::string>{"training.txt"});  // lists replace, not append
  EXPECT_SOURCE(loaded, "train_iters", "config/base/training.yaml:6");
  EXPECT_SOURCE(loaded, "lr", "config/exp_extends.yaml:7");
}

TEST_F(ConfigLoadTest, EnvSubstitutionTypesWholeValues) {
  std::string dir = testing::temp_dir("config-env");
  std::string path = write_file(dir + "/env.yaml", R"(exp_name: ${PRIMUS_TEST_EXP:env_exp}
workspace: ${PRIMUS_TEST_WS}/runs
modules:
  pre_trainer:
    framework: megatron
    model: tiny
    overrides:
      train_iters: "${PRIMUS_TEST_ITERS:4}"
      seq_length: ${PRIMUS_TEST_SEQ:64}
      lr: ${PRIMUS_TEST_LR:1e-3}
      mock_data: ${PRIMUS_TEST_MOCK:true}
      sample_prompt: "a:${PRIMUS_TEST_WORD:b:c}"
)");
  setenv("PRIMUS_TEST_WS", "/scratch", 1);
  setenv("PRIMUS_TEST_SEQ", "96", 1);
  unsetenv("PRIMUS_TEST_EXP");
  unsetenv("PRIMUS_TEST_ITERS");
  LoadedConfig loaded = load_experiment_config(path, {});
  EXPECT_EQ(loaded.config.exp_name, "env_exp");
  EXPECT_EQ(loaded.config.workspace, "/scratch/runs");
  EXPECT_EQ(loaded.config.train.train_iters, 4);  // quoted, but substituted: typed by content
  EXPECT_EQ(loaded.config.train.seq_length, 96);
  EXPECT_DOUBLE_EQ(loaded.config.train.lr, 1e-3);
  EXPECT_TRUE(loaded.config.train.mock_data);
  EXPECT_EQ(loaded.config.train.sample_prompt, "a:b:c");  // the default is everything after the first ':'
  unsetenv("PRIMUS_TEST_WS");
  unsetenv("PRIMUS_TEST_SEQ");
}

TEST_F(ConfigLoadTest, NullResetsAPresetValue) {
  LoadedConfig loaded = load_experiment_config(
      assets() + "/exp_tiny.yaml",
      {"modules.pre_trainer.model=tiny_gqa", "group_query_attention=false", "num_query_groups=null", "rotary_base=~"});
  EXPECT_EQ(loaded.config.model.num_query_groups, 4);  // derived again: equals the heads
  EXPECT_DOUBLE_EQ(loaded.config.model.rotary_base, 10000.0);
}

TEST_F(ConfigLoadTest, EffectiveYamlRoundTrips) {
  setenv("PRIMUS_TEST_TEAM", "team-x", 1);
  LoadedConfig first =
      load_experiment_config(assets() + "/exp_tiny.yaml", {"kv_channels=32", "split=98,2", "save=/ckpt dir/run #1"});
  std::string dir = testing::temp_dir("config-roundtrip");
  std::string path = write_file(dir + "/config.yaml", first.config.effective_yaml);
  unsetenv("PRIMUS_TEST_TEAM");
  unsetenv("PRIMUS_CONFIGS_DIR");  // the effective config needs no preset
  LoadedConfig second = load_experiment_config(path, {});
  const ExperimentConfig& a = first.config;
  const ExperimentConfig& b = second.config;
  // The same text, less the comment naming the preset (whose keys are all spelled out).
  std::string preset_comment = "# Model preset tiny (its keys are copied under overrides).\n";
  size_t comment = a.effective_yaml.find(preset_comment);
  ASSERT_NE(comment, std::string::npos) << a.effective_yaml;
  EXPECT_EQ(b.effective_yaml, std::string(a.effective_yaml).erase(comment, preset_comment.size()));
  EXPECT_NE(a.effective_yaml.find("norm_epsilon: 1.0e-05\n"), std::string::npos) << a.effective_yaml;
  EXPECT_EQ(b.work_group, "team-x");
  EXPECT_EQ(b.user_name, a.user_name);
  EXPECT_EQ(b.exp_name, a.exp_name);
  EXPECT_EQ(b.workspace, a.workspace);
  EXPECT_EQ(b.env, a.env);
  EXPECT_EQ(b.framework, a.framework);
  EXPECT_EQ(b.module_name, a.module_name);
  const ModelArgs& m = a.model;
  const ModelArgs& n = b.model;
  EXPECT_EQ(std::tie(n.num_layers, n.hidden_size, n.ffn_hidden_size, n.num_attention_heads, n.num_query_groups,
                     n.kv_channels, n.vocab_size, n.make_vocab_size_divisible_by, n.max_position_embeddings,
                     n.rotary_base, n.use_rope_scaling, n.rope_scaling_factor, n.rope_scaling_low_freq_factor,
                     n.rope_scaling_high_freq_factor, n.rope_scaling_original_max_position_embeddings, n.norm_epsilon,
                     n.qk_layernorm, n.untie_embeddings_and_output_weights, n.init_method_std),
            std::tie(m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.num_query_groups,
                     m.kv_channels, m.vocab_size, m.make_vocab_size_divisible_by, m.max_position_embeddings,
                     m.rotary_base, m.use_rope_scaling, m.rope_scaling_factor, m.rope_scaling_low_freq_factor,
                     m.rope_scaling_high_freq_factor, m.rope_scaling_original_max_position_embeddings, m.norm_epsilon,
                     m.qk_layernorm, m.untie_embeddings_and_output_weights, m.init_method_std));
  const TrainingArgs& t = a.train;
  const TrainingArgs& u = b.train;
  EXPECT_EQ(std::tie(u.train_iters, u.micro_batch_size, u.global_batch_size, u.seq_length, u.data_parallel_size, u.lr,
                     u.min_lr, u.lr_warmup_iters, u.lr_decay_style, u.lr_decay_iters, u.weight_decay, u.adam_beta1,
                     u.adam_beta2, u.adam_eps, u.clip_grad, u.seed, u.log_interval, u.eval_interval, u.eval_iters,
                     u.save, u.save_interval, u.load, u.pretrained_checkpoint, u.mock_data, u.data_path, u.split,
                     u.reset_position_ids, u.reset_attention_mask, u.eod_mask_loss, u.tokenizer_type, u.tokenizer_model, u.tensorboard_dir, u.mlflow_tracking_dir,
                     u.mlflow_experiment_name, u.bf16, u.device, u.sample_length, u.sample_prompt),
            std::tie(t.train_iters, t.micro_batch_size, t.global_batch_size, t.seq_length, t.data_parallel_size, t.lr,
                     t.min_lr, t.lr_warmup_iters, t.lr_decay_style, t.lr_decay_iters, t.weight_decay, t.adam_beta1,
                     t.adam_beta2, t.adam_eps, t.clip_grad, t.seed, t.log_interval, t.eval_interval, t.eval_iters,
                     t.save, t.save_interval, t.load, t.pretrained_checkpoint, t.mock_data, t.data_path, t.split,
                     t.reset_position_ids, t.reset_attention_mask, t.eod_mask_loss, t.tokenizer_type, t.tokenizer_model, t.tensorboard_dir, t.mlflow_tracking_dir,
                     t.mlflow_experiment_name, t.bf16, t.device, t.sample_length, t.sample_prompt));
  EXPECT_EQ(u.save, "/ckpt dir/run #1");
  EXPECT_EQ(n.kv_channels, 32);
}

TEST_F(ConfigLoadTest, FindConfigsDirHonoursTheEnvironment) {
  EXPECT_EQ(find_configs_dir(), assets());
  unsetenv("PRIMUS_CONFIGS_DIR");
  std::string dir = find_configs_dir();
  EXPECT_TRUE(fs::is_directory(dir) || dir == std::string(PRIMUS_SOURCE_DIR) + "/configs") << dir;
  EXPECT_EQ(fs::path(dir).filename(), "configs");
}

}  // namespace
}  // namespace primus
