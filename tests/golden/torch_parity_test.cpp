// Whole-model parity with PyTorch (tools/torch_llama.py on Debian's python3-torch, in float64): the same tiny Llama
// and Qwen3 weights and batch give the same loss and parameter gradients (relative error <= 1e-5 in fp32),
// and the same losses over 10 AdamW steps with clipping and weight decay.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "optim/adamw.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

constexpr const char* kPython = "/usr/bin/python3";
constexpr int kSteps = 10;
constexpr double kLr = 3e-3, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1, kClip = 1.0;

void check_parity(ModelArgs args, uint64_t seed) {
  ASSERT_TRUE(std::filesystem::exists(kPython)) << kPython << " is missing: run scripts/setup.sh --test";
  const int64_t B = 2, T = 12;
  args.init_method_std = 0.1;  // livelier activations than the 0.02 default, so every gradient is well above noise
  const std::unique_ptr<Model> model = make_model(args, T);
  model->params().initialize(seed);
  Rng rng(seed + 7);
  Tensor tokens = testing::random_ids({B, T}, args.vocab_size, rng);
  Tensor labels = testing::random_ids({B, T}, args.vocab_size, rng);
  labels.i32()[5] = -100;  // an ignored position, as in HF's loss masking

  const std::string dir = testing::temp_dir("parity");
  export_hf_model(dir + "/model", *model);
  SafetensorsWriter batch;
  batch.add("input_ids", tokens);
  batch.add("labels", labels);
  batch.write(dir + "/batch.safetensors");
  const std::string command = fmt::format(
      "{} {}/tools/torch_llama.py --model-dir {}/model --batch {}/batch.safetensors --out {}/out.safetensors "
      "--steps {} --lr {} --beta1 {} --beta2 {} --eps {} --weight-decay {} --clip-grad {} --dtype float64",
      kPython, PRIMUS_SOURCE_DIR, dir, dir, dir, kSteps, kLr, kBeta1, kBeta2, kEps, kWeightDecay, kClip);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  SafetensorsFile reference = SafetensorsFile::open(dir + "/out.safetensors");

  // Step 0: loss and every gradient.
  model->params().zero_grads();
  LossSum s = testing::train_micro_batch(*model, tokens, labels);
  const double loss = s.loss_sum / s.tokens;
  const double ref_loss = reference.read_f32("loss").f32()[0];
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss));
  for (size_t i = 0; i < model->params().specs().size(); ++i) {
    const std::string& name = model->params().specs()[i].name;
    Tensor ref_grad = reference.read_f32("grad." + name);
    EXPECT_LE(testing::relative_error(model->params().grad(i), ref_grad), 1e-5) << name;
  }

  // 10 AdamW steps on the same batch: losses before each update.
  Tensor ref_losses = reference.read_f32("losses");
  ASSERT_EQ(ref_losses.numel(), kSteps);
  AdamW optimizer(model->params(), AdamWConfig{kBeta1, kBeta2, kEps, kWeightDecay});
  for (int step = 0; step < kSteps; ++step) {
    model->params().zero_grads();
    LossSum ls = testing::train_micro_batch(*model, tokens, labels);
    const double step_loss = ls.loss_sum / ls.tokens;
    EXPECT_NEAR(step_loss, ref_losses.f32()[step], 1e-5 * std::fabs(ref_losses.f32()[step])) << "step " << step;
    optimizer.step(model->params(), kLr, clip_grad_norm(model->params(), kClip).scale);
  }
}

TEST(TorchParity, TinyLlama) { check_parity(testing::tiny_llama_args(), 21); }
TEST(TorchParity, TinyLlamaWithRopeScaling) { check_parity(testing::tiny_llama_args(true), 22); }
TEST(TorchParity, TinyQwen3) { check_parity(testing::tiny_qwen3_args(), 23); }

}  // namespace
}  // namespace primus
