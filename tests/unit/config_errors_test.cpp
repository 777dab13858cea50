// Every way a config can be wrong: each error must be a UsageError (exit 2) whose message names the file,
// the line and the key path (or "command line" and the key), without yaml-cpp internals.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "support/test_support.h"

namespace primus {
namespace {

namespace fs = std::filesystem;

std::string assets() { return testing::assets_dir() + "/config"; }

// Lines 1-10; keys added by a test start at line 11.
constexpr const char* kBase = R"(exp_name: e
modules:
  pre_trainer:
    framework: megatron
    model: tiny
    overrides:
      train_iters: 10
      seq_length: 64
      lr: 1.0e-3
      mock_data: true
)";

class ConfigErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("PRIMUS_CONFIGS_DIR", assets().c_str(), 1);
    dir_ = testing::temp_dir("config-errors");
  }

  std::string write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
    return path;
  }

  // The message of the UsageError that loading must throw.
  static std::string error_of(const std::string& path, const std::vector<std::string>& overrides = {}) {
    try {
      load_experiment_config(path, overrides);
    } catch (const UsageError& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage);
      std::string message = e.what();
      EXPECT_TRUE(message.starts_with("[config] ")) << message;
      EXPECT_EQ(message.find("yaml-cpp"), std::string::npos) << message;
      return message;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected a UsageError, got: " << e.what();
      return "";
    }
    ADD_FAILURE() << "expected a UsageError loading " << path;
    return "";
  }

  // Loads kBase with `extra` override lines appended (from line 11 on).
  std::string error_with(const std::string& extra, const std::vector<std::string>& overrides = {}) {
    return error_of(write("exp.yaml", std::string(kBase) + extra), overrides);
  }

  std::string dir_;
};

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in: " << (text)

TEST_F(ConfigErrorsTest, BaseExperimentIsValid) {
  EXPECT_EQ(load_experiment_config(write("exp.yaml", kBase), {}).config.train.train_iters, 10);
}

TEST_F(ConfigErrorsTest, MissingExperimentFile) {
  std::string message = error_of(dir_ + "/absent.yaml");
  EXPECT_CONTAINS(message, "absent.yaml");
  EXPECT_CONTAINS(message, "not found");
  // Issue 12 hole 13: `--config ''` was std::filesystem's "cannot make absolute path", exit 3.
  EXPECT_CONTAINS(error_of(""), "[config] experiment file: the file name is empty");
}

TEST_F(ConfigErrorsTest, BrokenYamlNamesFileAndLine) {
  std::string message = error_of(write("broken.yaml", "exp_name: e\nmodules:\n  pre_trainer: [a, b\nx: 1\n"));
  EXPECT_CONTAINS(message, "broken.yaml:");
  EXPECT_CONTAINS(message, "invalid YAML");
  message = error_of(write("indent.yaml", "exp_name: e\nworkspace: w\n  bad: 1\n"));
  EXPECT_CONTAINS(message, "indent.yaml:3: invalid YAML");
}

TEST_F(ConfigErrorsTest, TopLevelMustBeAMap) {
  EXPECT_CONTAINS(error_of(write("list.yaml", "- a\n- b\n")),
                  "list.yaml:1: expected a map of keys at the top level, got a list");
}

TEST_F(ConfigErrorsTest, DuplicateKey) {
  std::string message = error_with("      lr: 2.0e-3\n");
  EXPECT_CONTAINS(message, "exp.yaml:11: modules.pre_trainer.overrides.lr: duplicate key 'lr' (first written at ");
  EXPECT_CONTAINS(message, "exp.yaml:9)");
}

TEST_F(ConfigErrorsTest, UnknownKeysSuggestTheClosestName) {
  EXPECT_CONTAINS(
      error_with("      lerning_rate: 0.1\n"),
      "exp.yaml:11: modules.pre_trainer.overrides.lerning_rate: unknown key 'lerning_rate' (did you mean 'lr'?)");
  EXPECT_CONTAINS(error_with("      hiden_size: 64\n"), "unknown key 'hiden_size' (did you mean 'hidden_size'?)");
  EXPECT_CONTAINS(error_with("      num_kv_heads: 2\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.num_kv_heads: unknown key");
  EXPECT_CONTAINS(error_with("    framwork: megatron\n"),
                  "exp.yaml:11: modules.pre_trainer.framwork: unknown key 'framwork' (did you mean 'framework'?)");
  EXPECT_CONTAINS(error_with("exp_nme: x\n"),
                  "exp.yaml:11: exp_nme: unknown top-level key 'exp_nme' (did you mean 'exp_name'?)");
  EXPECT_CONTAINS(error_with("lr: 0.1\n"),
                  "exp.yaml:11: lr: unknown top-level key 'lr' (module keys go under modules.pre_trainer.overrides)");
  EXPECT_CONTAINS(error_with("    seed: 3\n"),
                  "exp.yaml:11: modules.pre_trainer.seed: unknown key 'seed' (module keys go under");
  EXPECT_CONTAINS(error_with("      zzzzzz: 1\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.zzzzzz: unknown key 'zzzzzz'");
  EXPECT_EQ(error_with("      zzzzzz: 1\n").find("did you mean"), std::string::npos);
}

TEST_F(ConfigErrorsTest, ModulesAndFramework) {
  EXPECT_CONTAINS(error_with("  post_trainer:\n    framework: megatron\n"),
                  "exp.yaml:11: modules.post_trainer: module 'post_trainer' is not supported yet");
  EXPECT_CONTAINS(error_with("  pre_trainr: {}\n"),
                  "exp.yaml:11: modules.pre_trainr: unknown module 'pre_trainr' (did you mean 'pre_trainer'?)");
  EXPECT_CONTAINS(error_of(write("fw.yaml", "exp_name: e\nmodules:\n  pre_trainer:\n    framework: torchtitan\n")),
                  "fw.yaml:4: modules.pre_trainer.framework: 'torchtitan' is not supported yet; allowed: megatron");
  EXPECT_CONTAINS(error_of(write("nofw.yaml", "exp_name: e\nmodules:\n  pre_trainer:\n    model: tiny\n")),
                  "nofw.yaml:3: modules.pre_trainer.framework: required");
  EXPECT_CONTAINS(error_of(write("nomod.yaml", "exp_name: e\n")), "nomod.yaml:1: modules: required");
  EXPECT_CONTAINS(error_with("    config: base.yaml\n"),
                  "exp.yaml:11: modules.pre_trainer.config: module presets are not supported yet");
}

TEST_F(ConfigErrorsTest, TopLevelValues) {
  EXPECT_CONTAINS(error_of(write("noname.yaml", std::string(kBase).substr(12))), "noname.yaml:1: exp_name: required");
  EXPECT_CONTAINS(error_with("workspace: [a]\n"), "exp.yaml:11: workspace: expected a string, got a list");
  EXPECT_CONTAINS(error_with("env:\n  GOOD: 1\n  BAD: {a: 1}\n"), "exp.yaml:13: env.BAD: expected a scalar value");
  EXPECT_CONTAINS(error_with("env:\n  1BAD: x\n"),
                  "exp.yaml:12: env.1BAD: '1BAD' is not a valid environment variable name");
  std::string text = kBase;
  text.replace(0, 11, "exp_name: a/b");
  EXPECT_CONTAINS(error_of(write("slash.yaml", text)), "slash.yaml:1: exp_name: 'a/b' must be a single directory name");
}

TEST_F(ConfigErrorsTest, WrongTypes) {
  EXPECT_CONTAINS(error_with("      eval_iters: abc\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.eval_iters: expected an integer, got 'abc'");
  EXPECT_CONTAINS(error_with("      eval_iters: 1.5\n"), "expected an integer, got '1.5'");
  EXPECT_CONTAINS(error_with("      eval_iters: \"5\"\n"),
                  "expected an integer, got the string \"5\" (write it without quotes)");
  EXPECT_CONTAINS(error_with("      weight_decay: lots\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.weight_decay: expected a number, got 'lots'");
  EXPECT_CONTAINS(error_with("      weight_decay: .inf\n"), "expected a number, got '.inf'");
  EXPECT_CONTAINS(error_with("      weight_decay: 1e999\n"), "'1e999' is out of the range of a double");
  EXPECT_CONTAINS(error_with("      qk_layernorm: yes\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.qk_layernorm: expected true or false, got 'yes'");
  EXPECT_CONTAINS(error_with("      save: [a, b]\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.save: expected a string, got a list");
  EXPECT_CONTAINS(error_with("      data_path: {a: 1}\n"), "expected a list of strings, got a map");
  EXPECT_CONTAINS(error_with("      data_path:\n        - a\n        - [b]\n"),
                  "exp.yaml:13: modules.pre_trainer.overrides.data_path[1]: expected a string, got a list");
  EXPECT_CONTAINS(error_with("      seed: 99999999999999999999\n"), "does not fit in a 64-bit integer");
}

// Issue 12 hole 13: vocab_size 2^63-1 overflowed the memory table, num_layers 10^9 and huge widths or batches ran
// into bad_alloc after tens of seconds. Sizes are bounded by the schema and by what any machine could hold.
TEST_F(ConfigErrorsTest, AbsurdModelAndBatchSizesAreRefusedUpFront) {
  EXPECT_CONTAINS(error_with("      vocab_size: 9223372036854775807\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.vocab_size: 9223372036854775807 is out of range");
  EXPECT_CONTAINS(error_with("      vocab_size: 9223372036854775807\n"), "(token ids are int32)");
  EXPECT_CONTAINS(error_with("      num_layers: 1000000000\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.num_layers: 1000000000 is out of range");
  EXPECT_CONTAINS(error_with("      num_layers: 16000\n      ffn_hidden_size: 100000000\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.num_layers: the model would have about ");
  EXPECT_CONTAINS(error_with("      num_layers: 16000\n      ffn_hidden_size: 100000000\n"),
                  "more than any machine holds");
  EXPECT_CONTAINS(error_with("      micro_batch_size: 1000000000000\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.micro_batch_size: one micro-batch of 64000000000000 "
                  "tokens");
}

TEST_F(ConfigErrorsTest, RecomputeKeys) {
  EXPECT_CONTAINS(error_with("      recompute_method: block\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.recompute_method: recompute_method applies only to "
                  "recompute_granularity: full (recompute_granularity = null from the default)");
  EXPECT_CONTAINS(error_with("      recompute_granularity: selective\n      recompute_num_layers: 1\n"),
                  "recompute_num_layers applies only to recompute_granularity: full (recompute_granularity = "
                  "selective from ");
  EXPECT_CONTAINS(error_with("      recompute_granularity: full\n      recompute_num_layers: 99\n"),
                  "exp.yaml:12: modules.pre_trainer.overrides.recompute_num_layers: recompute_num_layers (99) exceeds "
                  "num_layers");
  EXPECT_CONTAINS(error_with("      recompute_granularity: partial\n"),
                  "'partial' is not allowed; allowed: full | selective");
  const TrainingArgs full =
      load_experiment_config(write("full.yaml", std::string(kBase) + "      recompute_granularity: full\n"), {})
          .config.train;
  EXPECT_EQ(full.recompute_method, "uniform");
  EXPECT_EQ(full.recompute_num_layers, 1);
  const TrainingArgs block = load_experiment_config(write("block.yaml", std::string(kBase) +
                                                                          "      recompute_granularity: full\n"
                                                                          "      recompute_method: block\n"),
                                                    {})
                                 .config.train;
  EXPECT_EQ(block.recompute_num_layers, load_experiment_config(write("n.yaml", kBase), {}).config.model.num_layers);
}

TEST_F(ConfigErrorsTest, PackedDocumentKeysNeedRealDocuments) {
  // Mock data has no EOD-separated documents: each packing key is refused there, naming the key and where
  // mock_data was set, rather than silently doing nothing.
  for (const char* key : {"reset_position_ids", "reset_attention_mask", "eod_mask_loss"}) {
    EXPECT_CONTAINS(error_with(fmt::format("      {}: true\n", key)),
                    fmt::format("exp.yaml:11: modules.pre_trainer.overrides.{}: {} needs documents separated by EOD "
                                "tokens, which mock data does not have (mock_data = true from ",
                                key, key));
  }
  EXPECT_CONTAINS(error_with("", {"eod_mask_loss=true"}), "command line");
  std::string text = kBase;
  text.replace(text.find("mock_data: true"), 15, "data_path: [corpus.txt]");
  const TrainingArgs t = load_experiment_config(write("real.yaml", text + "      reset_position_ids: true\n"
                                                                         "      reset_attention_mask: true\n"
                                                                         "      eod_mask_loss: true\n"),
                                                {})
                             .config.train;
  EXPECT_TRUE(t.reset_position_ids && t.reset_attention_mask && t.eod_mask_loss);
  const TrainingArgs defaults = load_experiment_config(write("plain.yaml", text), {}).config.train;
  EXPECT_FALSE(defaults.reset_position_ids || defaults.reset_attention_mask || defaults.eod_mask_loss);
}

TEST_F(ConfigErrorsTest, RangesAndChoices) {
  std::string text = kBase;
  text.replace(text.find("train_iters: 10"), 15, "train_iters: 0");
  EXPECT_CONTAINS(error_of(write("range.yaml", text)),
                  "range.yaml:7: modules.pre_trainer.overrides.train_iters: 0 is out of range; allowed: >= 1");
  EXPECT_CONTAINS(error_with("      adam_beta1: 1.0\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.adam_beta1: 1.0 is out of range; allowed: [0, 1)");
  EXPECT_CONTAINS(error_with("      clip_grad: -1\n"), "-1.0 is out of range; allowed: >= 0");
  EXPECT_CONTAINS(error_with("", {"lr=0"}), "command line: lr: 0.0 is out of range; allowed: > 0");
  EXPECT_CONTAINS(error_with("      attention_dropout: 0.1\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.attention_dropout: 0.1 is out of range; allowed: 0 only "
                  "(dropout is not implemented; must be 0)");
  EXPECT_CONTAINS(error_with("      lr_decay_style: exponential\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.lr_decay_style: 'exponential' is not allowed; allowed: "
                  "constant | linear | cosine");
  EXPECT_CONTAINS(error_with("      swiglu: false\n"),
                  "'false' is not allowed; allowed: true (only SwiGLU MLPs are implemented)");
  EXPECT_CONTAINS(error_with("      add_bias_linear: true\n"), "not allowed; allowed: false");
  EXPECT_CONTAINS(error_with("      device: tpu\n"), "'tpu' is not allowed; allowed: auto | cpu | cuda");
  EXPECT_CONTAINS(error_with("      split: 1,2,3,4\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.split: expected 1 to 3 comma-separated");
  EXPECT_CONTAINS(error_with("      split: a,b\n"),
                  "expected 1 to 3 comma-separated non-negative weights like '969,30,1', got 'a,b'");
  EXPECT_CONTAINS(error_with("      split: 1,-2\n"), "got '1,-2'");
  EXPECT_CONTAINS(error_with("      split: 0,0\n"), "sum to 0");
  // Issue 12 hole 13: a weight beyond a double's range was std::stod's out_of_range, exit 3 "stod".
  EXPECT_CONTAINS(error_with("      split: " + std::string(400, '9') + ",1\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.split: weight '999");
  EXPECT_CONTAINS(error_with("      split: " + std::string(400, '9') + ",1\n"), "is too large");
}

TEST_F(ConfigErrorsTest, RequiredKeys) {
  EXPECT_CONTAINS(error_with("      num_layers: null\n"),
                  "exp.yaml:3: modules.pre_trainer.overrides.num_layers: required key is missing");
  std::string text = kBase;
  text.replace(text.find("model: tiny"), 11, "model: null");
  std::string message = error_of(write("nomodel.yaml", text));
  EXPECT_CONTAINS(message,
                  "nomodel.yaml:3: modules.pre_trainer.overrides: required keys are missing: num_layers, "
                  "hidden_size, ffn_hidden_size, num_attention_heads, max_position_embeddings");
}

TEST_F(ConfigErrorsTest, CrossKeyChecksNameBothKeysAndSources) {
  EXPECT_CONTAINS(error_with("      group_query_attention: true\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.group_query_attention: group_query_attention is true, so "
                  "num_query_groups is required");
  std::string message = error_with("      group_query_attention: true\n      num_query_groups: 3\n");
  EXPECT_CONTAINS(message,
                  "exp.yaml:12: modules.pre_trainer.overrides.num_query_groups: num_query_groups (3) must divide "
                  "num_attention_heads (num_attention_heads = 4 from ");
  EXPECT_CONTAINS(message, "models/tiny.yaml:5)");
  EXPECT_CONTAINS(error_with("      num_query_groups: 2\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.num_query_groups: "
                  "num_query_groups (2) differs from num_attention_heads");
  // hidden_size 64 comes from the preset: the error points there and says where the heads came from.
  message = error_with("      num_attention_heads: 5\n");
  EXPECT_CONTAINS(message,
                  "models/tiny.yaml:3: hidden_size: hidden_size (64) is not divisible by num_attention_heads "
                  "(num_attention_heads = 5 from ");
  EXPECT_CONTAINS(message, "exp.yaml:11)");
  EXPECT_NO_THROW(load_experiment_config(
      write("kv.yaml", std::string(kBase) + "      num_attention_heads: 5\n      kv_channels: 8\n"), {}));
  message = error_with("      micro_batch_size: 3\n      global_batch_size: 8\n");
  EXPECT_CONTAINS(message,
                  "exp.yaml:12: modules.pre_trainer.overrides.global_batch_size: global_batch_size (8) must be a "
                  "multiple of micro_batch_size x data-parallel size (3 x 1; micro_batch_size = 3 from ");
  EXPECT_CONTAINS(error_with("      min_lr: 0.01\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.min_lr: min_lr (0.01) must "
                  "not exceed lr (lr = 0.001 from ");
  EXPECT_CONTAINS(error_with("      lr_warmup_iters: 11\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.lr_warmup_iters: lr_warmup_iters (11) must not exceed "
                  "lr_decay_iters (lr_decay_iters defaults to train_iters: train_iters = 10 from ");
  EXPECT_CONTAINS(error_with("      lr_warmup_iters: 6\n      lr_decay_iters: 5\n"),
                  "lr_warmup_iters (6) must not exceed lr_decay_iters (lr_decay_iters = 5 from ");
  message = error_with("", {"seq_length=512"});
  EXPECT_CONTAINS(message,
                  "[config] command line: seq_length: seq_length (512) exceeds max_position_embeddings "
                  "(max_position_embeddings = 256 from ");
  EXPECT_CONTAINS(message, "models/tiny.yaml:6)");
}

// Megatron's parallel keys load, and each one the engine cannot run yet is refused naming it: first by Megatron's
// rule among the keys (sequence parallel needs tp > 1, virtual stages and uneven stages need pp > 1), saying what is
// not implemented where something is not (sequence parallelism; FSDP's ZeRO-2/3 with pp > 1).
TEST_F(ConfigErrorsTest, ParallelKeysNotImplementedYetAreRefusedNamingTheKey) {
  const TrainingArgs defaults = load_experiment_config(write("plain.yaml", kBase), {}).config.train;
  EXPECT_FALSE(defaults.sequence_parallel);
  EXPECT_EQ(defaults.num_layers_per_virtual_pipeline_stage, 0);
  EXPECT_EQ(defaults.num_virtual_stages_per_pipeline_rank, 0);
  EXPECT_EQ(defaults.decoder_first_pipeline_num_layers, 0);
  EXPECT_EQ(defaults.decoder_last_pipeline_num_layers, 0);
  EXPECT_FALSE(load_experiment_config(write("off.yaml", std::string(kBase) + "      sequence_parallel: false\n"
                                                                             "      decoder_first_pipeline_num_layers: "
                                                                             "null\n"),
                                      {})
                   .config.train.sequence_parallel);

  std::string message = error_with("      sequence_parallel: true\n");
  EXPECT_CONTAINS(message,
                  "exp.yaml:11: modules.pre_trainer.overrides.sequence_parallel: sequence_parallel needs "
                  "tensor_model_parallel_size > 1 (tensor_model_parallel_size = 1 from the default): Megatron's rule");
  EXPECT_EQ(message.find("not implemented"), std::string::npos) << message;
  EXPECT_CONTAINS(error_with("", {"sequence_parallel=true"}), "command line: sequence_parallel: sequence_parallel");

  for (const char* key : {"num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank"}) {
    message = error_with(fmt::format("      {}: 2\n", key));
    EXPECT_CONTAINS(message, fmt::format("exp.yaml:11: modules.pre_trainer.overrides.{}: {} needs "
                                         "pipeline_model_parallel_size > 1 (pipeline_model_parallel_size = 1 from the "
                                         "default): virtual stages interleave the stages of a pipeline",
                                         key, key));
  }
  for (const char* key : {"decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"}) {
    message = error_with(fmt::format("      {}: 1\n", key));
    EXPECT_CONTAINS(message, fmt::format("exp.yaml:11: modules.pre_trainer.overrides.{}: {} needs "
                                         "pipeline_model_parallel_size > 1",
                                         key, key));
  }
  EXPECT_CONTAINS(error_with("      decoder_last_pipeline_num_layers: 0\n"), "0 is out of range; allowed: >= 1");
  // Megatron's rules between the virtual-stage keys.
  EXPECT_CONTAINS(error_with("      num_layers_per_virtual_pipeline_stage: 1\n"
                             "      num_virtual_stages_per_pipeline_rank: 2\n"),
                  "exp.yaml:12: modules.pre_trainer.overrides.num_virtual_stages_per_pipeline_rank: "
                  "num_virtual_stages_per_pipeline_rank and num_layers_per_virtual_pipeline_stage "
                  "(num_layers_per_virtual_pipeline_stage = 1 from ");
  EXPECT_CONTAINS(error_with("      num_layers_per_virtual_pipeline_stage: 1\n"
                             "      decoder_last_pipeline_num_layers: 1\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.num_layers_per_virtual_pipeline_stage: "
                  "num_layers_per_virtual_pipeline_stage with an uneven split (decoder_last_pipeline_num_layers = 1 "
                  "from ");
  // FSDP's ZeRO-2 and ZeRO-3 with pipeline stages (WORLD_SIZE 2: pp 2, dp 1); its optim strategy composes.
  setenv("WORLD_SIZE", "2", 1);
  for (const char* strategy : {"optim_grads", "optim_grads_params"}) {
    message = error_with(fmt::format("      pipeline_model_parallel_size: 2\n      use_megatron_fsdp: true\n"
                                     "      data_parallel_sharding_strategy: {}\n",
                                     strategy));
    EXPECT_CONTAINS(message, fmt::format("modules.pre_trainer.overrides.data_parallel_sharding_strategy: "
                                         "data_parallel_sharding_strategy {} (use_megatron_fsdp) with pipeline "
                                         "parallelism (pipeline_model_parallel_size = 2 from ",
                                         strategy));
  }
  const TrainingArgs pp2 = load_experiment_config(write("pp.yaml", std::string(kBase) +
                                                                       "      pipeline_model_parallel_size: 2\n"
                                                                       "      use_megatron_fsdp: true\n"
                                                                       "      data_parallel_sharding_strategy: optim\n"),
                                                  {})
                               .config.train;
  unsetenv("WORLD_SIZE");
  EXPECT_EQ(pp2.pipeline_model_parallel_size, 2);
  EXPECT_EQ(pp2.data_parallel_size, 1);
  // Megatron's name for the derived size suggests the key.
  EXPECT_CONTAINS(error_with("      virtual_pipeline_model_parallel_size: 2\n"),
                  "did you mean 'num_virtual_stages_per_pipeline_rank'?");
}

// The sequence-level aux loss needs each sequence whole on a rank: with context parallelism it is refused naming the
// key and where context_parallel_size came from.
TEST_F(ConfigErrorsTest, SequenceAuxLossWithContextParallelismIsRefusedNamingTheKey) {
  setenv("WORLD_SIZE", "2", 1);  // cp 2 needs two ranks
  const std::string message = error_with(
      "      num_experts: 4\n      context_parallel_size: 2\n      moe_router_load_balancing_type: seq_aux_loss\n");
  unsetenv("WORLD_SIZE");
  EXPECT_CONTAINS(message, "exp.yaml:13: modules.pre_trainer.overrides.moe_router_load_balancing_type: "
                           "moe_router_load_balancing_type seq_aux_loss with context parallelism "
                           "(context_parallel_size = 2 from ");
}

// Context parallelism splits every sequence; documents packed into one (their positions and attention) are not split
// yet: refused naming the packing key and where context_parallel_size came from. Without them cp 2 loads (WORLD_SIZE
// 2: data-parallel size 1).
TEST_F(ConfigErrorsTest, PackedDocumentsWithContextParallelismAreRefusedNamingTheKey) {
  for (const char* key : {"reset_position_ids", "reset_attention_mask"}) {
    const std::string message = error_with(fmt::format("      context_parallel_size: 2\n      {}: true\n", key));
    EXPECT_CONTAINS(message, fmt::format("exp.yaml:12: modules.pre_trainer.overrides.{}: {}: packed documents with "
                                         "context parallelism (context_parallel_size = 2 from ",
                                         key, key));
    EXPECT_CONTAINS(message, fmt::format("exp.yaml:11) are not implemented yet; turn {} off", key));
  }
  setenv("WORLD_SIZE", "2", 1);  // cp 2 needs two ranks
  const TrainingArgs t =
      load_experiment_config(write("cp.yaml", std::string(kBase) + "      context_parallel_size: 2\n"), {})
          .config.train;
  unsetenv("WORLD_SIZE");
  EXPECT_EQ(t.context_parallel_size, 2);
  EXPECT_EQ(t.data_parallel_size, 1);
}

TEST_F(ConfigErrorsTest, NoSilentFallbackToMockData) {
  std::string text = kBase;
  text.replace(text.find("mock_data: true"), 15, "mock_data: false");
  std::string message = error_of(write("nodata.yaml", text));
  EXPECT_CONTAINS(message,
                  "nodata.yaml:10: modules.pre_trainer.overrides.mock_data: data_path is empty and mock_data is false");
  EXPECT_CONTAINS(message, "no silent fallback to mock data");
  EXPECT_CONTAINS(error_with("", {"mock_data=false", "data_path=[]"}), "command line: data_path: data_path is empty");
  EXPECT_NO_THROW(load_experiment_config(write("data.yaml", text + "      data_path: [x.txt]\n"), {}));
}

TEST_F(ConfigErrorsTest, MissingEnvironmentVariable) {
  unsetenv("PRIMUS_TEST_UNSET_VAR");
  EXPECT_CONTAINS(
      error_with("      save: ${PRIMUS_TEST_UNSET_VAR}/ckpt\n"),
      "exp.yaml:11: modules.pre_trainer.overrides.save: environment variable 'PRIMUS_TEST_UNSET_VAR' is not set");
  EXPECT_CONTAINS(error_with("      save: ${oops\n"),
                  "exp.yaml:11: modules.pre_trainer.overrides.save: unterminated '${'");
  EXPECT_CONTAINS(error_with("      save: ${1X}\n"), "invalid variable name '1X'");
}

TEST_F(ConfigErrorsTest, ExtendsErrors) {
  std::string message = error_of(write("ext.yaml", "exp_name: e\nextends:\n  - present.yaml\n  - missing.yaml\n"));
  EXPECT_CONTAINS(message, "ext.yaml:3: extends[0]: file 'present.yaml' not found");
  write("present.yaml", "workspace: w\n");
  message = error_of(dir_ + "/ext.yaml");
  EXPECT_CONTAINS(message, "ext.yaml:4: extends[1]: file 'missing.yaml' not found");
  EXPECT_CONTAINS(error_of(write("extmap.yaml", "extends: {a: 1}\n")),
                  "extmap.yaml:1: extends: expected a file name or a list");

  message = error_of(assets() + "/cycle_a.yaml");
  EXPECT_CONTAINS(message, "cycle_b.yaml:3: extends[0]: extends cycle: ");
  EXPECT_CONTAINS(message, "cycle_a.yaml -> ");
  EXPECT_CONTAINS(message, "cycle_b.yaml -> ");
  write("self.yaml", "extends: self.yaml\n");
  EXPECT_CONTAINS(error_of(dir_ + "/self.yaml"), "self.yaml:1: extends: extends cycle: ");
}

// Issue 12 hole 6: nine aliases of nine aliases ... ("billion laughs", 9^9 values from ~500 bytes) took gigabytes
// and ended in std::bad_alloc. The values aliases produce are bounded, naming the file and line.
TEST_F(ConfigErrorsTest, AliasBombIsRefusedNamingFileAndLine) {
  std::string text = "exp_name: e\na0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int level = 1; level <= 9; ++level) {
    std::string refs = fmt::format("*a{}", level - 1);
    for (int i = 1; i < 9; ++i) refs += fmt::format(", *a{}", level - 1);
    text += fmt::format("a{}: &a{} [{}]\n", level, level, refs);
  }
  const auto start = std::chrono::steady_clock::now();
  std::string message = error_of(write("bomb.yaml", text));
  EXPECT_CONTAINS(message, "bomb.yaml:");
  EXPECT_CONTAINS(message, "aliases expand to more than");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  // The same from the command line.
  EXPECT_CONTAINS(error_with("", {"data_path=[&a [x, x, x, x, x, x, x, x], &b [*a, *a, *a, *a, *a, *a, *a, *a], "
                                  "&c [*b, *b, *b, *b, *b, *b, *b, *b], &d [*c, *c, *c, *c, *c, *c, *c, *c], "
                                  "&e [*d, *d, *d, *d, *d, *d, *d, *d], [*e, *e, *e, *e, *e, *e, *e, *e]]"}),
                  "command line: data_path[5][1][4][1][6][1][6]: YAML aliases expand to more than");
  // Aliases of ordinary size are fine.
  EXPECT_CONTAINS(error_of(write("alias.yaml", std::string(kBase) + "      data_path: &p [a.bin]\ncopy: *p\n")),
                  "alias.yaml:12: copy: unknown top-level key");
}

// Issue 12 hole 6: each level of `extends` naming two files that both extend the next level loaded the deepest
// file 2^24 times (over a minute). Each file is now resolved once per load.
TEST_F(ConfigErrorsTest, ExtendsDiamondsLoadEachFileOnce) {
  constexpr int kLevels = 24;
  for (int level = 0; level < kLevels; ++level) {
    for (const char* side : {"a", "b"}) {
      std::string body = level + 1 < kLevels
                             ? fmt::format("extends: [l{}a.yaml, l{}b.yaml]\n", level + 1, level + 1)
                             : std::string("modules:\n  pre_trainer:\n    overrides:\n      train_iters: 77\n");
      write(fmt::format("l{}{}.yaml", level, side), body);
    }
  }
  std::string text = kBase;
  text.replace(text.find("      train_iters: 10\n"), 22, "");
  const auto start = std::chrono::steady_clock::now();
  LoadedConfig loaded = load_experiment_config(write("diamond.yaml", "extends: [l0a.yaml, l0b.yaml]\n" + text), {});
  EXPECT_EQ(loaded.config.train.train_iters, 77);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

TEST_F(ConfigErrorsTest, ExtendsChainsAreBounded) {
  constexpr int kFiles = 300;
  for (int i = 0; i < kFiles; ++i) write(fmt::format("c{}.yaml", i), fmt::format("extends: c{}.yaml\n", i + 1));
  write(fmt::format("c{}.yaml", kFiles), "workspace: w\n");
  std::string message = error_of(dir_ + "/c0.yaml");
  EXPECT_CONTAINS(message, ".yaml:1: extends: more than ");
  EXPECT_CONTAINS(message, "files in one extends tree");
}

// Issue 12 hole 6: 100k keys took 18 s, as every key was looked up by a linear scan of the ones before it (while
// parsing, for duplicates, and while merging `extends`). Four times the keys must take about four times as long,
// not sixteen (a ratio, so that a loaded machine does not fail the test).
TEST_F(ConfigErrorsTest, HundredThousandKeysLoadInLinearTime) {
  auto seconds_to_load = [&](int count) {
    std::string keys;
    for (int i = 0; i < count; ++i) keys += fmt::format("    key{}: {}\n", i, i);
    write("many_base.yaml", "modules:\n  extra:\n" + keys);
    std::string path = write("many.yaml", "extends: many_base.yaml\n" + std::string(kBase) + "  extra:\n" + keys);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_CONTAINS(error_of(path), "unknown module 'extra'");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double quarter = seconds_to_load(25000);
  const double full = seconds_to_load(100000);
  EXPECT_LT(full, 8 * quarter + 0.5) << "25k keys: " << quarter << " s, 100k keys: " << full << " s";

  std::string text = std::string(kBase) + "  extra:\n    key0: 0\n";
  for (int i = 1; i < 100000; ++i) text += fmt::format("    key{}: {}\n", i, i);
  const std::string message = error_of(write("dup.yaml", text + "    key0: again\n"));
  EXPECT_CONTAINS(message, "dup.yaml:100012: modules.extra.key0: duplicate key 'key0' (first written at ");
  EXPECT_CONTAINS(message, "dup.yaml:12)");
}

TEST_F(ConfigErrorsTest, ModelPresetErrors) {
  std::string text = kBase;
  text.replace(text.find("model: tiny"), 11, "model: tinyy");
  std::string message = error_of(write("preset.yaml", text));
  EXPECT_CONTAINS(message, "preset.yaml:5: modules.pre_trainer.model: model preset 'tinyy' not found in ");
  EXPECT_CONTAINS(message, "(available: tiny, tiny_gqa)");
  write("bad_preset.yaml", "num_layers: 2\nhidden_sise: 64\n");
  text = kBase;
  text.replace(text.find("model: tiny"), 11, "model: bad_preset.yaml");
  EXPECT_CONTAINS(error_of(write("uses_bad.yaml", text)),
                  "bad_preset.yaml:2: hidden_sise: unknown key 'hidden_sise' (did you mean 'hidden_size'?)");
  write("typed_preset.yaml", "num_layers: two\n");
  text.replace(text.find("bad_preset.yaml"), 15, "typed_preset.yaml");
  EXPECT_CONTAINS(error_of(write("uses_typed.yaml", text)),
                  "typed_preset.yaml:1: num_layers: expected an integer, got 'two'");
  setenv("PRIMUS_CONFIGS_DIR", (dir_ + "/nowhere").c_str(), 1);
  EXPECT_CONTAINS(error_with(""), "no preset directory");
}

TEST_F(ConfigErrorsTest, CommandLineErrors) {
  EXPECT_CONTAINS(error_with("", {"train_iters=abc"}),
                  "[config] command line: train_iters: expected an integer, got 'abc'");
  EXPECT_CONTAINS(error_with("", {"--lerning_rate=0.1"}),
                  "[config] command line: lerning_rate: unknown key 'lerning_rate' (did you mean 'lr'?)");
  EXPECT_CONTAINS(error_with("", {"lr"}), "[config] command line: lr: expected key=value");
  EXPECT_CONTAINS(error_with("", {"=3"}), "expected key=value");
  EXPECT_CONTAINS(error_with("", {"exp_name.x=1"}), "command line: exp_name.x: cannot set a key inside 'exp_name'");
  EXPECT_CONTAINS(error_with("", {"a..b=1"}), "command line: a..b: empty name in the dotted key");
  EXPECT_CONTAINS(error_with("", {"extends=x.yaml"}), "extends cannot be set on the command line");
  EXPECT_CONTAINS(error_with("", {"modules.pre_trainer.overides.lr=1"}),
                  "command line: modules.pre_trainer.overides.lr: unknown key 'overides' (did you mean 'overrides'?)");
  EXPECT_CONTAINS(error_with("", {"data_path=[a, b"}), "command line: data_path: invalid YAML value '[a, b'");
}

// Found by fuzz/config_fuzzer: a key inside an anchor that names the anchor is a cycle (the walk overflowed the
// stack); it is refused naming the file and line (AliasBombIsRefusedNamingFileAndLine covers aliases of aliases).
TEST_F(ConfigErrorsTest, RecursiveAliases) {
  EXPECT_CONTAINS(error_of(write("cycle.yaml", "exp_name: e\ndefaults: &d\n  <<: *d\n")),
                  "cycle.yaml:3: defaults.<<.<<.<<.");
  EXPECT_CONTAINS(error_of(write("cycle.yaml", "exp_name: e\ndefaults: &d\n  <<: *d\n")),
                  "nested more than 64 levels deep (an alias inside its own anchor?)");
}

// Randomly damaged configs either load or fail with a UsageError; nothing else escapes.
TEST_F(ConfigErrorsTest, DamagedFilesNeverCrash) {
  std::ifstream in(assets() + "/exp_tiny.yaml");
  std::string original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(original.empty());
  const std::string alphabet = ":-[]{}\"'#$&*!|>%@`\t\n ,?~0123456789.eabcxyz_";
  Rng rng(99);
  int loaded = 0, rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string text = original;
    for (int edits = static_cast<int>(rng.below(3)) + 1; edits > 0; --edits) {
      size_t at = rng.below(text.size());
      char c = alphabet[rng.below(alphabet.size())];
      switch (rng.below(3)) {
        case 0:
          text[at] = c;
          break;
        case 1:
          text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        default:
          text.erase(at, 1);
      }
    }
    std::string path = write("fuzz.yaml", text);
    try {
      load_experiment_config(path, {});
      ++loaded;
    } catch (const UsageError& e) {
      ++rejected;
      EXPECT_TRUE(std::string(e.what()).starts_with("[config] ")) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected " << e.what() << " for:\n" << text;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace primus
