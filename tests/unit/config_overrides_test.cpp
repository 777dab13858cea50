// Command-line overrides: key=value and --key=value into the module's overrides, dotted paths anywhere in
// the experiment tree, YAML flow values, precedence over the file and the preset.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "core/error.h"
#include "support/test_support.h"

namespace primus {
namespace {

std::string assets() { return testing::assets_dir() + "/config"; }

class ConfigOverridesTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv("PRIMUS_CONFIGS_DIR", assets().c_str(), 1); }

  static ExperimentConfig load(const std::vector<std::string>& overrides) {
    return load_experiment_config(assets() + "/exp_tiny.yaml", overrides).config;
  }

  static std::string source_of(const LoadedConfig& loaded, const std::string& key) {
    for (const ConfigEntry& e : loaded.entries) {
      if (e.key_path == key) return e.source;
    }
    return "";
  }
};

TEST_F(ConfigOverridesTest, BareKeysSetModuleOverridesInBothForms) {
  LoadedConfig loaded = load_experiment_config(assets() + "/exp_tiny.yaml", {"train_iters=55", "--seed=9"});
  EXPECT_EQ(loaded.config.train.train_iters, 55);
  EXPECT_EQ(loaded.config.train.seed, 9);
  EXPECT_EQ(source_of(loaded, "train_iters"), "command line");
  EXPECT_EQ(source_of(loaded, "seed"), "command line");
  EXPECT_EQ(loaded.config.train.lr_decay_iters, 55);  // derived from the overridden train_iters
}

TEST_F(ConfigOverridesTest, NumbersInEveryFloatSpelling) {
  EXPECT_DOUBLE_EQ(load({"lr=1e-4"}).train.lr, 1e-4);
  EXPECT_DOUBLE_EQ(load({"lr=3.0e-4"}).train.lr, 3.0e-4);
  EXPECT_DOUBLE_EQ(load({"lr=1"}).train.lr, 1.0);  // an integer for a float key
  EXPECT_DOUBLE_EQ(load({"lr=.5"}).train.lr, 0.5);
  EXPECT_DOUBLE_EQ(load({"rotary_base=1E5"}).model.rotary_base, 1e5);
  EXPECT_DOUBLE_EQ(load({"weight_decay=+2.5E-3"}).train.weight_decay, 2.5e-3);
  EXPECT_EQ(load({"seed=-0"}).train.seed, 0);
}

TEST_F(ConfigOverridesTest, DottedPathsSetAnyKeyOfTheTree) {
  ExperimentConfig c = load({"modules.pre_trainer.overrides.lr=2e-3", "env.NEW_VAR=x y", "env.OMP_NUM_THREADS=8",
                             "modules.pre_trainer.overrides.data_path=[one.txt]"});
  EXPECT_DOUBLE_EQ(c.train.lr, 2e-3);
  EXPECT_EQ(c.env.at("NEW_VAR"), "x y");
  EXPECT_EQ(c.env.at("OMP_NUM_THREADS"), "8");
  EXPECT_EQ(c.env.at("PRIMUS_FLAG"), "on");  // the rest of the map stays
  EXPECT_EQ(c.train.data_path, std::vector<std::string>{"one.txt"});
}

TEST_F(ConfigOverridesTest, TopLevelKeysByBareName) {
  ExperimentConfig c = load({"exp_name=cli_exp", "workspace=/runs", "--work_group=team", "user_name=bob"});
  EXPECT_EQ(c.exp_name, "cli_exp");
  EXPECT_EQ(c.workspace, "/runs");
  EXPECT_EQ(c.work_group, "team");
  EXPECT_EQ(c.user_name, "bob");
}

TEST_F(ConfigOverridesTest, ValuesAreYamlScalarsOrFlowCollections) {
  EXPECT_EQ(load({"data_path=[x.txt, \"y z.txt\"]"}).train.data_path, (std::vector<std::string>{"x.txt", "y z.txt"}));
  EXPECT_EQ(load({"data_path=only.txt"}).train.data_path, std::vector<std::string>{"only.txt"});
  EXPECT_FALSE(load({"mock_data=false", "data_path=[d.txt]"}).train.mock_data);
  EXPECT_EQ(load({"sample_prompt=a=b"}).train.sample_prompt, "a=b");
  EXPECT_EQ(load({"sample_prompt=Q: why? # not a comment"}).train.sample_prompt, "Q: why? # not a comment");
  EXPECT_EQ(load({"sample_prompt=\"true\""}).train.sample_prompt, "true");
  EXPECT_EQ(load({"sample_prompt='it''s'"}).train.sample_prompt, "it's");
  EXPECT_EQ(load({"save="}).train.save, "");
  EXPECT_EQ(load({"env={A: 1}"}).env, (std::map<std::string, std::string>{{"A", "1"}}));  // a map replaces
  setenv("PRIMUS_TEST_SAVE_DIR", "/fast", 1);
  EXPECT_EQ(load({"save=${PRIMUS_TEST_SAVE_DIR}/ckpt"}).train.save, "/fast/ckpt");
  EXPECT_EQ(load({"load=${PRIMUS_TEST_NO_SUCH_VAR:/slow}"}).train.load, "/slow");
  unsetenv("PRIMUS_TEST_SAVE_DIR");
}

TEST_F(ConfigOverridesTest, PrecedenceDefaultPresetFileCommandLine) {
  // hidden_size: preset 64 < command line; train_iters: file 20 < command line; later command line wins.
  LoadedConfig loaded = load_experiment_config(assets() + "/exp_tiny.yaml",
                                               {"hidden_size=128", "train_iters=7", "train_iters=8", "log_interval=3"});
  EXPECT_EQ(loaded.config.model.hidden_size, 128);
  EXPECT_EQ(loaded.config.model.kv_channels, 32);  // derived from the overridden hidden_size
  EXPECT_EQ(loaded.config.train.train_iters, 8);
  EXPECT_EQ(loaded.config.train.log_interval, 3);
  EXPECT_EQ(source_of(loaded, "hidden_size"), "command line");
  EXPECT_EQ(source_of(loaded, "num_layers").find("command line"), std::string::npos);
}

TEST_F(ConfigOverridesTest, CreatesMissingSections) {
  std::string dir = testing::temp_dir("config-overrides");
  std::string path = dir + "/bare.yaml";
  std::ofstream(path) << "exp_name: bare\nmodules:\n  pre_trainer:\n    framework: megatron\n";
  LoadedConfig loaded = load_experiment_config(path, {"modules.pre_trainer.model=tiny", "train_iters=2",
                                                      "seq_length=16", "lr=0.5", "mock_data=true", "env.X=1"});
  EXPECT_EQ(loaded.config.model.preset, "tiny");
  EXPECT_EQ(loaded.config.model.num_layers, 2);
  EXPECT_EQ(loaded.config.train.train_iters, 2);
  EXPECT_EQ(loaded.config.env.at("X"), "1");
}

}  // namespace
}  // namespace primus
