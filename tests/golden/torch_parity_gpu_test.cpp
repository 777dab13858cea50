// The GPU engine against PyTorch over a whole training run: the same initial weights (exported as a Hugging Face
// folder) and the same stream of real-text micro-batches (300 distinct ones, consecutive windows of
// tinyshakespeare), 300 AdamW steps with clipping and weight decay, bf16 mixed precision here against
// tools/torch_llama.py in float32. The loss curves must agree within 2% in every 20-step window.
// Needs a GPU and a python with torch (PRIMUS_TEST_PYTHON, default python3 on the PATH); skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/file_io.h"
#include "optim/adamw.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

constexpr int kSteps = 300, kWindow = 20;
constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1, kClip = 1.0;

TEST(TorchParityGpu, Bf16TrainingTracksPyTorchFor300Steps) {
  PRIMUS_SKIP_WITHOUT_GPU();
  const char* python_env = std::getenv("PRIMUS_TEST_PYTHON");
  const std::string python = python_env != nullptr ? python_env : "python3";
  ModelArgs args = testing::tiny_llama_args();
  args.hidden_size = 64;
  args.ffn_hidden_size = 176;
  args.num_attention_heads = 4;
  args.num_query_groups = 2;
  args.kv_channels = 16;  // cuDNN attention needs head_dim % 8 == 0
  args.vocab_size = 256;  // bytes
  args.max_position_embeddings = 128;
  const int64_t B = 8, T = 128, rows = B * kSteps;  // every step a fresh micro-batch: 307,200 bytes of text
  const Device gpu{DeviceType::kCuda, 0};

  // Row r is the window of T + 1 bytes of tinyshakespeare starting at byte r * T; step i trains on rows
  // [i * B, (i + 1) * B), here and in torch_llama.py (--micro-batch-size).
  const std::string text = read_file(testing::shakespeare_path());
  ASSERT_GT(text.size(), static_cast<size_t>(rows * T + 1));
  Tensor tokens = Tensor::empty({rows, T}, DType::kI32), labels = Tensor::empty({rows, T}, DType::kI32);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < T; ++t) {
      tokens.i32()[r * T + t] = static_cast<unsigned char>(text[r * T + t]);
      labels.i32()[r * T + t] = static_cast<unsigned char>(text[r * T + t + 1]);
    }
  }

  const std::unique_ptr<Model> model = make_model(args, T, gpu, DType::kBF16);
  model->params().initialize(77);
  model->weights_changed();
  const std::string dir = testing::temp_dir("parity_gpu");
  export_hf_model(dir + "/model", *model);
  SafetensorsWriter batch;
  batch.add("input_ids", tokens);
  batch.add("labels", labels);
  batch.write(dir + "/batch.safetensors");
  const std::string command = fmt::format(
      "{} {}/tools/torch_llama.py --model-dir {}/model --batch {}/batch.safetensors --out {}/out.safetensors "
      "--steps {} --micro-batch-size {} --lr {} --beta1 {} --beta2 {} --eps {} --weight-decay {} --clip-grad {} --dtype float32",
      python, PRIMUS_SOURCE_DIR, dir, dir, dir, kSteps, B, kLr, kBeta1, kBeta2, kEps, kWeightDecay, kClip);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const Tensor reference = SafetensorsFile::open(dir + "/out.safetensors").read_f32("losses");
  ASSERT_EQ(reference.numel(), kSteps);

  AdamW optimizer(model->params(), AdamWConfig{kBeta1, kBeta2, kEps, kWeightDecay});
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    model->params().zero_grads();
    const int64_t first = step * B * T;
    const Tensor step_tokens = Tensor::empty({B, T}, DType::kI32), step_labels = Tensor::empty({B, T}, DType::kI32);
    std::copy_n(tokens.i32() + first, B * T, step_tokens.i32());
    std::copy_n(labels.i32() + first, B * T, step_labels.i32());
    const LossSum s = testing::train_micro_batch(*model, step_tokens, step_labels);
    losses.push_back(s.loss_sum / static_cast<double>(s.tokens));
    optimizer.step(model->params(), kLr, clip_grad_norm(model->params(), kClip).scale, model->compute_weights());
  }
  EXPECT_LT(losses.back(), 0.6 * losses.front()) << "the run must actually learn for the comparison to mean much";
  double worst = 0.0;
  for (int w = 0; w < kSteps / kWindow; ++w) {
    double ours = 0.0, theirs = 0.0;
    for (int i = w * kWindow; i < (w + 1) * kWindow; ++i) {
      ours += losses[i];
      theirs += reference.f32()[i];
    }
    worst = std::max(worst, std::abs(ours / theirs - 1.0));
    EXPECT_NEAR(ours / theirs, 1.0, 0.02) << "steps " << w * kWindow << ".." << (w + 1) * kWindow - 1 << ": ours "
                                          << ours / kWindow << ", PyTorch " << theirs / kWindow;
  }
  std::printf("loss %.4f -> %.4f (PyTorch %.4f -> %.4f); largest 20-step window difference %.2f%%\n", losses.front(),
              losses.back(), reference.f32()[0], reference.f32()[kSteps - 1], 100.0 * worst);
}

}  // namespace
}  // namespace primus
