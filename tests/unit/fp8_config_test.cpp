// fp8's config keys (Megatron's names): accepted into TrainingArgs with fp8_format, each bad combination refused with
// exit 2 naming its key, fp8 on the CPU engine refused naming fp8_format and the device; and the trainer's refusal
// on the GPU until the fp8 path has run on one (compute_dtype).
#include <gtest/gtest.h>

#include <fstream>

#include "config/config.h"
#include "core/error.h"
#include "support/test_support.h"
#include "support/tiny_models.h"
#include "train/train_step.h"

namespace primus {
namespace {

ExperimentConfig load_with(const std::string& overrides) {
  return testing::load_tiny_llama_experiment("fp8_config", overrides, PRIMUS_SOURCE_DIR "/configs");
}

void expect_refused(const std::string& overrides, const std::string& key, const std::string& words) {
  testing::expect_tiny_llama_refused("fp8_config", overrides, key, words, PRIMUS_SOURCE_DIR "/configs");
}

TEST(Fp8Config, OffByDefault) {
  const TrainingArgs t = load_with("bf16: false").train;
  EXPECT_TRUE(t.fp8_format.empty());
  EXPECT_EQ(t.fp8_recipe, "delayed");
  EXPECT_EQ(t.fp8_amax_history_len, 1);
  EXPECT_EQ(t.fp8_amax_compute_algo, "most_recent");
  EXPECT_EQ(t.fp8_margin, 0);
  EXPECT_FALSE(t.first_last_layers_bf16);
  EXPECT_EQ(t.num_layers_at_start_in_bf16, 1);
  EXPECT_EQ(t.num_layers_at_end_in_bf16, 1);
}

TEST(Fp8Config, KeysLoadIntoTrainingArgs) {
  const TrainingArgs t = load_with("device: cuda, bf16: true, fp8_format: hybrid, fp8_recipe: delayed, fp8_margin: 1, "
                                   "fp8_amax_history_len: 1024, fp8_amax_compute_algo: max, "
                                   "first_last_layers_bf16: true, num_layers_at_start_in_bf16: 1, "
                                   "num_layers_at_end_in_bf16: 0")
                             .train;
  EXPECT_EQ(t.fp8_format, "hybrid");
  EXPECT_EQ(t.fp8_recipe, "delayed");
  EXPECT_EQ(t.fp8_margin, 1);
  EXPECT_EQ(t.fp8_amax_history_len, 1024);
  EXPECT_EQ(t.fp8_amax_compute_algo, "max");
  EXPECT_TRUE(t.first_last_layers_bf16);
  EXPECT_EQ(t.num_layers_at_start_in_bf16, 1);
  EXPECT_EQ(t.num_layers_at_end_in_bf16, 0);
  EXPECT_EQ(load_with("device: cuda, fp8_format: e4m3, fp8_recipe: blockwise").train.fp8_recipe, "blockwise");
  EXPECT_EQ(load_with("device: auto, fp8_format: e4m3, fp8_recipe: tensorwise").train.fp8_recipe, "tensorwise");
}

TEST(Fp8Config, BadCombinationsExitTwoNamingTheKey) {
  expect_refused("fp8_format: e5m2", "fp8_format", "e4m3 | hybrid");
  expect_refused("fp8_format: e4m3, fp8_recipe: mxfp8", "fp8_recipe", "Blackwell");
  for (const char* key : {"fp8_recipe: blockwise", "fp8_margin: 1", "fp8_amax_history_len: 16",
                          "fp8_amax_compute_algo: max", "first_last_layers_bf16: true",
                          "num_layers_at_start_in_bf16: 2", "num_layers_at_end_in_bf16: 0"}) {
    const std::string name(key, std::string(key).find(':'));
    expect_refused(key, name, "fp8_format is unset");
  }
  for (const char* key : {"fp8_margin: 1", "fp8_amax_history_len: 16", "fp8_amax_compute_algo: max"}) {
    const std::string name(key, std::string(key).find(':'));
    expect_refused(std::string("device: cuda, fp8_format: e4m3, fp8_recipe: tensorwise, ") + key, name,
                   "delayed recipe only");
  }
  expect_refused("device: cuda, fp8_format: e4m3, num_layers_at_end_in_bf16: 2", "num_layers_at_end_in_bf16",
                 "first_last_layers_bf16: true");
  expect_refused("device: cuda, fp8_format: e4m3, first_last_layers_bf16: true, num_layers_at_start_in_bf16: 2",
                 "num_layers_at_start_in_bf16", "exceed num_layers");
  expect_refused("device: cuda, fp8_format: e4m3, first_last_layers_bf16: true, num_layers_at_end_in_bf16: 3",
                 "num_layers_at_end_in_bf16", "exceed num_layers");
  expect_refused("fp8_amax_history_len: 0", "fp8_amax_history_len", ">= 1");
}

TEST(Fp8Config, CpuEngineRefusesFp8NamingTheKeyAndDevice) {
  expect_refused("device: cpu, fp8_format: hybrid", "fp8_format",
                 "fp8 needs a GPU with fp8 tensor cores (Hopper sm_90 or newer, MI300X/MI355X)");
  expect_refused("device: cpu, fp8_format: hybrid", "device = cpu", "CPU engine");
}

// The trainer refuses fp8 on the CPU (but for the reference path the tests ask for) and on GPUs without fp8 tensor
// cores.
TEST(Fp8Config, TrainerTakesFp8OnlyWhereThereAreFp8TensorCores) {
  TrainingArgs t;
  t.fp8_format = "e4m3";
  try {
    compute_dtype(t, kCpuDevice);
    ADD_FAILURE() << "fp8 accepted on the CPU";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_format e4m3: fp8 needs a GPU with fp8 tensor cores"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("device cpu"), std::string::npos) << e.what();
  }
  // On a GPU: taken in bf16 where it has fp8 tensor cores (sm_90 or newer), refused naming the device below that;
  // without a GPU the capability query fails softly and the device's start reports it later.
  t.bf16 = true;
  try {
    EXPECT_EQ(compute_dtype(t, Device{DeviceType::kCuda, 0}), DType::kBF16);
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fp8 tensor cores"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
  }
  t.fp8_format.clear();
  t.bf16 = false;
  EXPECT_EQ(compute_dtype(t, kCpuDevice), DType::kF32);
}

}  // namespace
}  // namespace primus
