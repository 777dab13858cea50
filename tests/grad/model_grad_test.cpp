// Finite differences through a whole tiny model: the analytic gradient of the mean token loss with
// respect to sampled entries of every parameter tensor against central differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "models/model.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

double mean_loss(Model& model, const Tensor& tokens, const Tensor& labels) {
  LossSum s = model.evaluate(tokens, labels);
  return s.loss_sum / static_cast<double>(s.tokens);
}

void check_model_gradients(const ModelArgs& args, uint64_t seed) {
  const int64_t B = 2, T = 7;
  const std::unique_ptr<Model> model = make_model(args, T);
  model->params().initialize(seed);
  // Larger weights than the 0.02 init so every path carries gradient well above fp32 noise.
  Rng rng(seed + 1);
  float* p = model->params().flat_params().f32();
  for (int64_t i = 0; i < model->params().numel(); ++i) p[i] += static_cast<float>(rng.normal() * 0.3);
  Tensor tokens = testing::random_ids({B, T}, args.vocab_size, rng);
  Tensor labels = testing::random_ids({B, T}, args.vocab_size, rng);
  labels.i32()[3] = -1;  // one ignored position

  model->params().zero_grads();
  testing::train_micro_batch(*model, tokens, labels);

  const double h = 1e-2;
  for (size_t i = 0; i < model->params().specs().size(); ++i) {
    const ParamSpec& spec = model->params().specs()[i];
    Tensor param = model->params().param(i);
    Tensor grad = model->params().grad(i);
    for (int sample = 0; sample < 3; ++sample) {
      const int64_t k = static_cast<int64_t>(rng.below(param.numel()));
      const float saved = param.f32()[k];
      param.f32()[k] = saved + static_cast<float>(h);
      const double up = mean_loss(*model, tokens, labels);
      param.f32()[k] = saved - static_cast<float>(h);
      const double down = mean_loss(*model, tokens, labels);
      param.f32()[k] = saved;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grad.f32()[k];
      EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << spec.name << "[" << k << "]";
    }
  }
}

TEST(ModelGrad, TinyLlamaMatchesFiniteDifferences) { check_model_gradients(testing::tiny_llama_args(), 11); }
TEST(ModelGrad, TinyLlamaWithRopeScalingMatchesFiniteDifferences) {
  check_model_gradients(testing::tiny_llama_args(true), 12);
}
TEST(ModelGrad, TinyQwen3MatchesFiniteDifferences) { check_model_gradients(testing::tiny_qwen3_args(), 13); }

TEST(ModelGrad, GradientAccumulationEqualsOneBigBatch) {
  const ModelArgs args = testing::tiny_llama_args();
  const int64_t T = 6;
  const std::unique_ptr<Model> model = make_model(args, T);
  model->params().initialize(5);
  Rng rng(6);
  Tensor tokens = testing::random_ids({4, T}, args.vocab_size, rng);
  Tensor labels = testing::random_ids({4, T}, args.vocab_size, rng);
  model->params().zero_grads();
  testing::train_micro_batch(*model, tokens, labels, 1.0f / (4 * T));
  Tensor whole = Tensor::empty({model->params().numel()}, DType::kF32);
  whole.copy_from(model->params().flat_grads());

  model->params().zero_grads();
  for (int half = 0; half < 2; ++half) {
    Tensor t = tokens.slice_elements(half * 2 * T, {2, T});
    Tensor l = labels.slice_elements(half * 2 * T, {2, T});
    testing::train_micro_batch(*model, t, l, 1.0f / (4 * T));
  }
  EXPECT_LT(testing::relative_error(model->params().flat_grads(), whole), 1e-5);
}

// Recompute changes what is kept, never the numbers: every mode gives the same gradients bit for bit.
TEST(ModelGrad, RecomputeGivesIdenticalGradients) {
  ModelArgs args = testing::tiny_qwen3_args();
  args.num_layers = 3;
  const int64_t T = 6;
  Rng rng(8);
  Tensor tokens = testing::random_ids({2, T}, args.vocab_size, rng);
  Tensor labels = testing::random_ids({2, T}, args.vocab_size, rng);
  auto gradients = [&](const RecomputeConfig& recompute) {
    const std::unique_ptr<Model> model = make_model(args, T);
    model->params().initialize(9);
    model->set_recompute(recompute);
    model->params().zero_grads();
    const LossSum s = testing::train_micro_batch(*model, tokens, labels);
    Tensor grads = Tensor::empty({model->params().numel()}, DType::kF32);
    grads.copy_from(model->params().flat_grads());
    return std::pair{s.loss_sum, grads};
  };
  using G = RecomputeConfig::Granularity;
  const auto [loss, grads] = gradients(RecomputeConfig{});
  const RecomputeConfig modes[] = {{G::kFull, false, 1}, {G::kFull, false, 2}, {G::kFull, false, 3},
                                   {G::kFull, true, 1},  {G::kFull, true, 3},  {G::kSelective, false, 1}};
  for (const RecomputeConfig& mode : modes) {
    const auto [mode_loss, mode_grads] = gradients(mode);
    const std::string what = fmt::format("granularity {} block {} layers {}", static_cast<int>(mode.granularity),
                                         mode.block, mode.num_layers);
    EXPECT_EQ(mode_loss, loss) << what;
    EXPECT_EQ(std::memcmp(mode_grads.data(), grads.data(), grads.nbytes()), 0) << what;
  }
}

// Multi-head latent attention (layers/mla.h) with a low-rank query and YaRN, and with a full-rank query and plain
// RoPE: every parameter of the compressions, their norms and the up-projections against finite differences.
TEST(ModelGrad, TinyMlaMatchesFiniteDifferences) {
  check_model_gradients(testing::tiny_deepseek_args(true, true, false), 13);
  check_model_gradients(testing::tiny_deepseek_args(false, false, false), 14);
}

}  // namespace
}  // namespace primus
