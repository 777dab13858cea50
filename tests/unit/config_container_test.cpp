// The `container:` section of an experiment file (config/container_section.cpp) as Primus's launcher YAML writes
// it, and secret masking in `config show` and the effective YAML of a run: shapes accepted, values with where
// they were written, every rejection naming file, line and key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "core/error.h"
#include "core/secrets.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (text)
#define EXPECT_LACKS(text, part) \
  EXPECT_EQ((text).find(part), std::string::npos) << "unexpected '" << (part) << "' in:\n" << (text)

// Lines 1-8; the container section of a test starts at line 9.
constexpr const char* kBase = R"(exp_name: e
env: {HF_TOKEN: hf_config_secret, OMP_NUM_THREADS: "2"}
modules:
  pre_trainer:
    framework: megatron
    model: tiny
    overrides:
      {mock_data: true, train_iters: 10, seq_length: 64, lr: 1.0e-3}
)";

class ConfigContainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("PRIMUS_CONFIGS_DIR", (testing::assets_dir() + "/config").c_str(), 1);
    dir_ = testing::temp_dir("config-container");
  }

  std::string write(const std::string& extra) {
    std::string path = dir_ + "/exp.yaml";
    std::ofstream(path) << kBase << extra;
    return path;
  }

  std::string error_of(const std::string& extra) {
    try {
      load_experiment_config(write(extra), {});
    } catch (const UsageError& error) {
      return error.what();
    }
    ADD_FAILURE() << "expected a UsageError for:\n" << extra;
    return "";
  }

  std::string dir_;
};

TEST_F(ConfigContainerTest, PrimusShapeUnderOptions) {
  LoadedConfig loaded = load_experiment_config(write(R"(container:
  runtime: podman
  options:
    image: "rocm/primus:v25.9_gfx942"
    ipc: host
    device: ["/dev/kfd", "/dev/dri", "/dev/infiniband"]
    cap-add: [SYS_PTRACE]
    privileged: true
    volume: ["/data:/data", "/model_weights:/model_weights:ro"]
    env: ["NCCL_DEBUG=INFO", "WANDB_API_KEY=wandb_config_secret", "HF_TOKEN"]
)"),
                                               {});
  const ContainerSettings& c = loaded.config.container;
  ASSERT_TRUE(c.image && c.runtime);
  EXPECT_EQ(c.image->value, "rocm/primus:v25.9_gfx942");
  EXPECT_TRUE(c.image->where.ends_with("exp.yaml:12: container.options.image")) << c.image->where;
  EXPECT_EQ(c.runtime->value, "podman");
  ASSERT_EQ(c.volumes.size(), 2u);
  EXPECT_EQ(c.volumes[1].value, "/model_weights:/model_weights:ro");
  EXPECT_TRUE(c.volumes[1].where.ends_with("exp.yaml:17: container.options.volume[1]")) << c.volumes[1].where;
  ASSERT_EQ(c.env.size(), 3u);
  EXPECT_EQ(c.env[1].value, "WANDB_API_KEY=wandb_config_secret");
  EXPECT_EQ(c.env[2].value, "HF_TOKEN");
  std::vector<std::string> options;
  for (const auto& [name, value] : c.options) options.push_back(name + "=" + value.value);
  EXPECT_EQ(options, (std::vector<std::string>{"ipc=host", "device=/dev/kfd", "device=/dev/dri",
                                               "device=/dev/infiniband", "cap-add=SYS_PTRACE", "privileged="}));
}

TEST_F(ConfigContainerTest, KeysAtTheSectionTopAndEnvAsAMap) {
  LoadedConfig loaded = load_experiment_config(write(R"(container:
  image: localhost/primus:cpu
  volume: /data:/data:ro
  env: {NCCL_DEBUG: WARN}
)"),
                                               {"container.options.image=localhost/primus:other"});
  const ContainerSettings& c = loaded.config.container;
  ASSERT_TRUE(c.image);
  EXPECT_EQ(c.image->value, "localhost/primus:other");  // the command line wins, as for every key
  EXPECT_EQ(c.image->where, "command line: container.options.image");
  ASSERT_EQ(c.volumes.size(), 1u);
  EXPECT_EQ(c.volumes[0].value, "/data:/data:ro");
  ASSERT_EQ(c.env.size(), 1u);
  EXPECT_EQ(c.env[0].value, "NCCL_DEBUG=WARN");
}

TEST_F(ConfigContainerTest, NoSectionMeansNothingSet) {
  LoadedConfig loaded = load_experiment_config(write(""), {});
  EXPECT_FALSE(loaded.config.container.image);
  EXPECT_TRUE(loaded.config.container.volumes.empty());
}

TEST_F(ConfigContainerTest, RejectionsNameFileLineAndKey) {
  std::string message = error_of("container:\n  options:\n    imgae: x\n");
  EXPECT_CONTAINS(message, "exp.yaml:11: container.options.imgae: unknown key 'imgae' (did you mean 'image'?)");
  message = error_of("container:\n  images: x\n");
  EXPECT_CONTAINS(message, "exp.yaml:10: container.images: unknown key 'images'");
  message = error_of("container:\n  options:\n    name: my-job\n");
  EXPECT_CONTAINS(message, "container.options.name: primus-cli names each container itself");
  message = error_of("container:\n  dry_run: true\n");
  EXPECT_CONTAINS(message, "container.dry_run: not read from the config: give primus-cli's global --dry-run flag");
  message = error_of("container:\n  options:\n    image: [a, b]\n");
  EXPECT_CONTAINS(message, "exp.yaml:11: container.options.image: expected a string, got a list");
  message = error_of("container:\n  options:\n    volume: {a: b}\n");
  EXPECT_CONTAINS(message, "container.options.volume: expected a string or a list, got a map");
  message = error_of("container:\n  options:\n    privileged: maybe\n");
  EXPECT_CONTAINS(message, "container.options.privileged: expected true or false");
  message = error_of("container: podman\n");
  EXPECT_CONTAINS(message, "exp.yaml:9: container: expected a map");
}

TEST_F(ConfigContainerTest, SecretsAreMaskedInConfigShowAndTheEffectiveYaml) {
  LoadedConfig loaded = load_experiment_config(write(R"(container:
  options:
    image: localhost/primus:cpu
    device: [/dev/kfd, /dev/dri]
    env: ["WANDB_API_KEY=wandb_config_secret", "NCCL_DEBUG=INFO"]
)"),
                                               {});
  // The values themselves are kept: the run needs them.
  EXPECT_EQ(loaded.config.env.at("HF_TOKEN"), "hf_config_secret");
  std::string shown = format_config_show(loaded);
  EXPECT_LACKS(shown, "hf_config_secret");
  EXPECT_LACKS(shown, "wandb_config_secret");
  EXPECT_CONTAINS(shown, "env.HF_TOKEN");
  EXPECT_CONTAINS(shown, "WANDB_API_KEY=***");
  EXPECT_CONTAINS(shown, "NCCL_DEBUG=INFO");
  EXPECT_CONTAINS(shown, "container.options.image");

  const std::string& yaml = loaded.config.effective_yaml;
  EXPECT_LACKS(yaml, "hf_config_secret");
  EXPECT_LACKS(yaml, "wandb_config_secret");
  EXPECT_CONTAINS(yaml, "HF_TOKEN: \"***\"");
  // The effective YAML loads back, the section included (secrets as ***).
  std::string path = dir_ + "/effective.yaml";
  std::ofstream(path) << yaml;
  LoadedConfig again = load_experiment_config(path, {});
  ASSERT_TRUE(again.config.container.image);
  EXPECT_EQ(again.config.container.image->value, "localhost/primus:cpu");
  ASSERT_EQ(again.config.container.options.size(), 2u);
  EXPECT_EQ(again.config.container.options[1].second.value, "/dev/dri");
  ASSERT_EQ(again.config.container.env.size(), 2u);
  EXPECT_EQ(again.config.container.env[0].value, std::string("WANDB_API_KEY=") + kMaskedValue);
  EXPECT_EQ(again.config.env.at("OMP_NUM_THREADS"), "2");
}

TEST(SecretsTest, NamesThatHoldSecrets) {
  for (const char* name : {"HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "hf_token", "DB_PASSWORD", "KEY"}) {
    EXPECT_TRUE(is_secret_name(name)) << name;
  }
  for (const char* name : {"NCCL_DEBUG", "OMP_NUM_THREADS", "PRIMUS_WORKSPACE", "HOME", ""}) {
    EXPECT_FALSE(is_secret_name(name)) << name;
  }
  EXPECT_EQ(shown_value("HF_TOKEN", "abc"), "***");
  EXPECT_EQ(shown_value("NCCL_DEBUG", "INFO"), "INFO");
}

}  // namespace
}  // namespace primus
