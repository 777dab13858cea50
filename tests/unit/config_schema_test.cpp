// The schema table itself: docs/config-reference.md is generated from it, every key is well formed,
// suggestions find near misses, and value <-> YAML text conversions are exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "config/config.h"
#include "config/schema.h"
#include "core/error.h"
#include "core/rng.h"
#include "support/test_support.h"

namespace primus {
namespace {

using config::KeySpec;
using config::KeyType;

TEST(ConfigSchemaTest, ReferenceDocMatchesTheSchema) {
  std::string path = std::string(PRIMUS_SOURCE_DIR) + "/docs/config-reference.md";
  std::string expected = schema_markdown();
  std::ifstream in(path);
  std::stringstream actual;
  actual << in.rdbuf();
  if (actual.str() == expected) return;
  const char* regenerate = std::getenv("PRIMUS_REGENERATE_DOCS");
  if (regenerate != nullptr && std::string(regenerate) == "1") {
    std::ofstream(path) << expected;
    GTEST_SKIP() << "rewrote " << path;
  }
  FAIL() << path << " is out of date with src/config/schema.cpp; run this test with PRIMUS_REGENERATE_DOCS=1 to "
         << "rewrite it, then review and commit the change";
}

TEST(ConfigSchemaTest, EveryKeyIsWellFormed) {
  std::set<std::string> names;
  for (const KeySpec& spec : config::module_key_specs()) {
    SCOPED_TRACE(spec.name);
    EXPECT_TRUE(names.insert(spec.name).second) << "declared twice";
    EXPECT_GT(std::strlen(spec.help), 0u);
    EXPECT_EQ(config::find_key_spec(spec.name), &spec);
    // Defaults parse and satisfy their own limits.
    config::TypedValue def = config::default_value(spec);
    EXPECT_EQ(def.is_set, spec.presence == config::Presence::kDefault);
    // A key that fills no field must be pinned to one value or be refused whenever it is set (a feature not
    // implemented yet), or steer resolution.
    if (spec.apply == nullptr) {
      config::TypedValue set;
      set.is_set = true;
      const bool refused_when_set =
          spec.presence == config::Presence::kOptional && spec.check != nullptr && !spec.check(set).empty();
      bool pinned = spec.choices.size() == 1 || (spec.min && spec.max && *spec.min == *spec.max) || refused_when_set;
      EXPECT_TRUE(pinned || std::string(spec.name) == "group_query_attention");
    }
    EXPECT_TRUE(spec.choices.empty() || spec.type == KeyType::kString || spec.type == KeyType::kBool);
    for (const std::string& alias : spec.aliases) EXPECT_EQ(config::find_key_spec(alias), nullptr) << alias;
  }
  EXPECT_EQ(names.size(), 141u);  // 61 model keys (18 of them MoE, 12 of MLA and YaRN, 2 of multi-token
                                  // prediction, 3 naming missing features), 80 training keys (8 of them fp8)
  EXPECT_EQ(config::find_key_spec("no_such_key"), nullptr);
}

TEST(ConfigSchemaTest, DidYouMeanFindsNearMisses) {
  EXPECT_EQ(config::did_you_mean_module_key("lerning_rate"), " (did you mean 'lr'?)");
  EXPECT_EQ(config::did_you_mean_module_key("learning_rate"), " (did you mean 'lr'?)");
  EXPECT_EQ(config::did_you_mean_module_key("Hidden_Size"), " (did you mean 'hidden_size'?)");
  EXPECT_EQ(config::did_you_mean_module_key("trian_iters"), " (did you mean 'train_iters'?)");
  EXPECT_EQ(config::did_you_mean_module_key("num_key_value_heads"), " (did you mean 'num_query_groups'?)");
  EXPECT_EQ(config::did_you_mean_module_key("sede"), " (did you mean 'seed'?)");
  EXPECT_EQ(config::did_you_mean_module_key("completely_unrelated"), "");
  EXPECT_EQ(config::did_you_mean("workspce", config::top_level_keys()), " (did you mean 'workspace'?)");
  EXPECT_EQ(config::did_you_mean("zz", config::top_level_keys()), "");
}

TEST(ConfigSchemaTest, FloatsRoundTripThroughText) {
  const KeySpec& spec = *config::find_key_spec("weight_decay");
  Rng rng(20240611);
  config::Origin origin{config::OriginKind::kCommandLine, "", 0, "weight_decay"};
  for (int i = 0; i < 2000; ++i) {
    double value = std::ldexp(rng.uniform() + 0.5, static_cast<int>(rng.below(80)) - 60);
    config::TypedValue v;
    v.is_set = true;
    v.f = value;
    std::string text = config::format_value(spec, v);
    ASSERT_NE(text.substr(0, text.find_first_of("eE")).find('.'), std::string::npos) << text;
    config::TypedValue back = config::type_value(spec, config::parse_override_value(text, origin));
    ASSERT_EQ(back.f, value) << text;
  }
}

TEST(ConfigSchemaTest, StringsRoundTripThroughYaml) {
  setenv("PRIMUS_CONFIGS_DIR", (testing::assets_dir() + "/config").c_str(), 1);
  std::vector<std::string> strings = {
      "",       "true",   "null",    "~",        "123",      "1e-4",     "a: b",        "#x",
      "- a",    "[x]",    "{y}",     "${HOME}",  "$${HOME}", "quote\"s", "back\\slash", "tab\tnew\nline",
      "  lead", "trail ", "ünïcødé", "'single'", "*alias",   "&anchor",  "!tag",        "%pct",
      "@at",    "`"};
  Rng rng(7);
  for (int i = 0; i < 50; ++i) {
    std::string s;
    for (int j = 0, n = static_cast<int>(rng.below(12)) + 1; j < n; ++j) s += static_cast<char>(32 + rng.below(95));
    strings.push_back(s);
  }
  std::string dir = testing::temp_dir("config-strings");
  for (const std::string& s : strings) {
    std::string path = dir + "/s.yaml";
    std::ofstream(path) << "exp_name: s\nmodules:\n  pre_trainer:\n    framework: megatron\n    model: tiny\n"
                        << "    overrides: {train_iters: 1, seq_length: 8, lr: 0.1, mock_data: true}\n"
                        << "env:\n  V: " << config::yaml_string(s) << "\n";
    ExperimentConfig c = load_experiment_config(path, {"sample_prompt=" + config::yaml_string(s)}).config;
    EXPECT_EQ(c.env.at("V"), s) << config::yaml_string(s);
    // On the command line a plain value is taken verbatim, so compare only the quoted spellings there.
    if (config::yaml_string(s).starts_with("\"")) {
      EXPECT_EQ(c.train.sample_prompt, s) << config::yaml_string(s);
    }
  }
}

TEST(ConfigSchemaTest, LimitsAreDescribed) {
  EXPECT_EQ(config::describe_limits(*config::find_key_spec("num_layers")), "[1, 16384]");
  EXPECT_EQ(config::describe_limits(*config::find_key_spec("hidden_size")), ">= 1");
  EXPECT_EQ(config::describe_limits(*config::find_key_spec("lr")), "> 0");
  EXPECT_EQ(config::describe_limits(*config::find_key_spec("adam_beta2")), "[0, 1)");
  EXPECT_EQ(config::describe_limits(*config::find_key_spec("hidden_dropout")), "0 only");
  EXPECT_EQ(config::describe_limits(*config::find_key_spec("lr_decay_style")), "constant | linear | cosine");
  EXPECT_EQ(config::describe_limits(*config::find_key_spec("sample_prompt")), "");
}

}  // namespace
}  // namespace primus
