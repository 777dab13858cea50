// Multi-head latent attention (DeepSeek-V2/V3) on the CUDA engine against the CPU engine: tiny DeepSeek-V2-Lite-shaped
// models give the CPU's loss and gradient of every parameter in fp32 and track them in bf16 mixed precision, with
// and without the query compression, YaRN and MoE layers, at head sizes that take the native attention kernels in
// bf16 (values of 6) and cuDNN's graphs (keys of 24, values of 16), with packed documents, and with DeepSeek-V3's
// multi-token prediction modules; and a short bf16 run on one batch lowers the loss. Skipped, with the reason, where there is no CUDA build or no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "models/model.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

constexpr Device kGpu{DeviceType::kCuda, 0};

// Head sizes cuDNN takes (multiples of 8): queries and keys of 16 + 8 features, values of 16, so bf16 attention runs
// on its graphs with separate d_qk and d_v, as DeepSeek's 192 and 128 do in real runs.
ModelArgs cudnn_shaped_args() {
  ModelArgs a = testing::tiny_deepseek_args(true, true, false);
  a.hidden_size = 64;
  a.qk_head_dim = 16;
  a.qk_pos_emb_head_dim = 8;
  a.v_head_dim = 16;
  a.kv_lora_rank = 32;
  a.q_lora_rank = 24;
  return a;
}

struct Variant {
  const char* name;
  ModelArgs args;
};

// DeepSeek-V3's multi-token prediction: two modules after the MoE decoder, their losses and gradients included.
ModelArgs mtp_args() {
  ModelArgs a = testing::tiny_deepseek_args(true, true, true);
  a.mtp_num_layers = 2;
  return a;
}

std::vector<Variant> variants() {
  return {{"lite", testing::tiny_deepseek_args(false, false, false)},
          {"q_lora_yarn_moe", testing::tiny_deepseek_args(true, true, true)},
          {"cudnn_shaped", cudnn_shaped_args()},
          {"mtp", mtp_args()}};
}

// Two documents in every row (positions restart and attention stays within each), as reset_position_ids and
// reset_attention_mask make them: interleaved RoPE with positions, and attention with segments (native kernels).
PackedSequence two_documents(int64_t batch, int64_t seq, int64_t split) {
  PackedSequence packed{Tensor::empty({batch, seq}, DType::kI32), Tensor::empty({batch, seq}, DType::kI32)};
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      packed.position_ids.i32()[b * seq + t] = static_cast<int32_t>(t < split ? t : t - split);
      packed.segment_start.i32()[b * seq + t] = static_cast<int32_t>(t < split ? 0 : split);
    }
  }
  return packed;
}

// Loss and flat fp32 gradients of one micro-batch on `device` in `dtype`, from the same initial weights.
std::pair<double, Tensor> loss_and_grads(const ModelArgs& args, Device device, DType dtype, const Tensor& tokens,
                                         const Tensor& labels, const PackedSequence& packed) {
  const std::unique_ptr<Model> model = make_model(args, tokens.dim(1), device, dtype);
  model->params().initialize(31);
  model->weights_changed();
  model->params().zero_grads();
  const LossSum s = testing::train_micro_batch(*model, tokens, labels, 0.0f, packed);
  return {s.loss_sum / s.tokens, ops::to_device(model->params().flat_grads(), kCpuDevice)};
}

void check_against_cpu(const Variant& v, DType dtype, double loss_tolerance, double grad_tolerance,
                       bool packed_documents = false) {
  Rng rng(19);
  const int64_t B = 2, T = 64;
  const Tensor tokens = testing::random_ids({B, T}, v.args.vocab_size, rng);
  const Tensor labels = testing::random_ids({B, T}, v.args.vocab_size, rng);
  const PackedSequence packed = packed_documents ? two_documents(B, T, 23) : PackedSequence{};
  const auto [cpu_loss, cpu_grads] = loss_and_grads(v.args, kCpuDevice, DType::kF32, tokens, labels, packed);
  const auto [gpu_loss, gpu_grads] = loss_and_grads(v.args, kGpu, dtype, tokens, labels, packed);
  const double grad_error = testing::relative_error(gpu_grads, cpu_grads);
  std::printf("  %s%s %s: loss cpu %.6f gpu %.6f (rel %.2e), gradients rel err %.2e\n", v.name,
              packed_documents ? " packed" : "", dtype == DType::kF32 ? "f32" : "bf16", cpu_loss, gpu_loss,
              std::abs(gpu_loss - cpu_loss) / cpu_loss, grad_error);
  EXPECT_NEAR(gpu_loss, cpu_loss, loss_tolerance * cpu_loss) << v.name;
  EXPECT_LE(grad_error, grad_tolerance) << v.name;
}

// fp32: the same formulas on both engines; GEMMs and attention sum in other orders (1e-6 per product).
TEST(MlaGpu, Fp32LossAndGradientsMatchTheCpuEngine) {
  PRIMUS_SKIP_WITHOUT_GPU();
  for (const Variant& v : variants()) check_against_cpu(v, DType::kF32, 1e-4, 1e-4);
  for (const Variant& v : variants()) {
    if (v.args.mtp_num_layers == 0) check_against_cpu(v, DType::kF32, 1e-4, 1e-4, true);  // MTP refuses packing
  }
}

// bf16 rounds activations and the weight copy to 8 bits of mantissa: the dense model's allowance (ModelGpu: 1e-2 on
// the loss, 5e-2 on the gradients); with MoE layers, the router's choices may flip for near-tied tokens (MoeGpu's
// 2e-2 and 1e-1).
TEST(MlaGpu, Bf16LossAndGradientsTrackTheCpuEngine) {
  PRIMUS_SKIP_WITHOUT_GPU();
  for (const Variant& v : variants()) {
    const bool moe = v.args.num_experts > 0;
    check_against_cpu(v, DType::kBF16, moe ? 2e-2 : 1e-2, moe ? 1e-1 : 5e-2);
    if (v.args.mtp_num_layers == 0) check_against_cpu(v, DType::kBF16, moe ? 2e-2 : 1e-2, moe ? 1e-1 : 5e-2, true);
  }
}

// 30 AdamW steps in bf16 on one batch lower the loss well below where it started, as on the CPU (MlaModel).
TEST(MlaGpu, Bf16TrainingLowersTheLoss) {
  PRIMUS_SKIP_WITHOUT_GPU();
  for (const Variant& v : variants()) {
    const std::unique_ptr<Model> model = make_model(v.args, 32, kGpu, DType::kBF16);
    model->params().initialize(47);
    model->weights_changed();
    Rng rng(48);
    const Tensor tokens = testing::random_ids({4, 32}, v.args.vocab_size, rng);
    const Tensor labels = testing::random_ids({4, 32}, v.args.vocab_size, rng);
    const auto [first, last] = testing::overfit_one_batch(*model, tokens, labels);
    std::printf("  %s bf16: loss %.4f -> %.4f\n", v.name, first, last);
    EXPECT_LT(last, 0.6 * first) << v.name << ": " << first << " -> " << last;
  }
}

}  // namespace
}  // namespace primus
