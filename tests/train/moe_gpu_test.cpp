// Mixture-of-experts models on the CUDA engine against the CPU engine: tiny Mixtral-, Qwen3-MoE- and DeepSeek-routed
// models, also with token dropping (expert capacity, both drop policies, with and without padding) and the
// sequence-level aux loss, give the CPU's loss and gradient of every parameter in fp32 and track them in bf16 mixed
// precision (router in fp32, experts in bf16), a short bf16 run on one batch lowers the loss, and step-scoped buffers
// train as the flat ones. Skipped, with the reason, where there is no CUDA build or no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "models/model.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "support/step_scoped_check.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

constexpr Device kGpu{DeviceType::kCuda, 0};

using testing::tiny_mixtral_args;
using testing::tiny_qwen3_moe_args;

// DeepSeek-V3's routing on the Mixtral layout: sigmoid scores, 4 groups of which 2, top-4 scaled by 2.5, and a shared
// expert.
ModelArgs tiny_deepseek_routed_args() {
  ModelArgs a = tiny_mixtral_args();
  a.num_experts = 16;
  a.moe_router_topk = 4;
  a.moe_ffn_hidden_size = 24;
  a.moe_router_score_function = "sigmoid";
  a.moe_router_topk_scaling_factor = 2.5;
  a.moe_router_num_groups = 4;
  a.moe_router_group_topk = 2;
  a.moe_shared_expert_intermediate_size = 40;
  a.moe_z_loss_coeff = 0.0;
  return a;
}

// Token dropping on the Mixtral layout: capacity factor 1.0 over 128 tokens × top-2 of 8 (32 entries an expert), so
// the busier experts drop entries; by weight (probs) or by position, with or without padding to capacity.
ModelArgs tiny_capacity_args(const std::string& policy, bool pad) {
  ModelArgs a = tiny_mixtral_args();
  a.moe_expert_capacity_factor = 1.0;
  a.moe_token_drop_policy = policy;
  a.moe_pad_expert_input_to_capacity = pad;
  return a;
}

// DeepSeek's sequence-level aux loss on the Qwen3-MoE layout: the aux loss of each of the micro-batch's 2 sequences.
ModelArgs tiny_seq_aux_args() {
  ModelArgs a = tiny_qwen3_moe_args();
  a.moe_aux_loss_coeff = 0.01;
  a.moe_router_load_balancing_type = "seq_aux_loss";
  return a;
}

// Loss and flat fp32 gradients of one micro-batch on `device` in `dtype`, from the same initial weights.
std::pair<double, Tensor> loss_and_grads(const ModelArgs& args, Device device, DType dtype, const Tensor& tokens,
                                         const Tensor& labels) {
  const std::unique_ptr<Model> model = make_model(args, tokens.dim(1), device, dtype);
  model->params().initialize(29);
  model->weights_changed();
  model->params().zero_grads();
  const LossSum s = testing::train_micro_batch(*model, tokens, labels);
  return {s.loss_sum / s.tokens, ops::to_device(model->params().flat_grads(), kCpuDevice)};
}

void check_against_cpu(const char* name, const ModelArgs& args, DType dtype, double loss_tolerance,
                       double grad_tolerance) {
  Rng rng(17);
  const Tensor tokens = testing::random_ids({2, 64}, args.vocab_size, rng);
  const Tensor labels = testing::random_ids({2, 64}, args.vocab_size, rng);
  const auto [cpu_loss, cpu_grads] = loss_and_grads(args, kCpuDevice, DType::kF32, tokens, labels);
  const auto [gpu_loss, gpu_grads] = loss_and_grads(args, kGpu, dtype, tokens, labels);
  const double grad_error = testing::relative_error(gpu_grads, cpu_grads);
  std::printf("  %s %s: loss cpu %.6f gpu %.6f (rel %.2e), gradients rel err %.2e\n", name,
              dtype == DType::kF32 ? "f32" : "bf16", cpu_loss, gpu_loss, std::abs(gpu_loss - cpu_loss) / cpu_loss,
              grad_error);
  EXPECT_NEAR(gpu_loss, cpu_loss, loss_tolerance * cpu_loss) << name;
  EXPECT_LE(grad_error, grad_tolerance) << name;
}

// fp32: the same formulas on both engines; GEMMs sum in other blocked orders (1e-6 per product), and the router's
// choices are the CPU's (moe_op_cases.cpp holds the kernels to that).
TEST(MoeGpu, Fp32LossAndGradientsMatchTheCpuEngine) {
  PRIMUS_SKIP_WITHOUT_GPU();
  check_against_cpu("mixtral", tiny_mixtral_args(), DType::kF32, 1e-4, 1e-4);
  check_against_cpu("qwen3_moe", tiny_qwen3_moe_args(), DType::kF32, 1e-4, 1e-4);
  check_against_cpu("deepseek_routed", tiny_deepseek_routed_args(), DType::kF32, 1e-4, 1e-4);
}

// Each drop policy, padded or not, and the sequence-level aux loss, against the CPU engine in `dtype`.
void check_capacity_and_seq_aux(DType dtype, double loss_tolerance, double grad_tolerance) {
  for (const char* policy : {"probs", "position"}) {
    for (const bool pad : {false, true}) {
      const std::string name = fmt::format("capacity_{}{}", policy, pad ? "_padded" : "");
      check_against_cpu(name.c_str(), tiny_capacity_args(policy, pad), dtype, loss_tolerance, grad_tolerance);
    }
  }
  check_against_cpu("seq_aux_loss", tiny_seq_aux_args(), dtype, loss_tolerance, grad_tolerance);
}

// fp32 with token dropping and with the sequence-level aux loss: the router's weights are the CPU's to ~1e-7 and
// moe_capacity keeps exactly the CPU's entries for equal weights (op case moe_capacity_*), so the same entries drop
// and the tolerances stay the dropless ones.
TEST(MoeGpu, Fp32CapacityAndSeqAuxLossMatchTheCpuEngine) {
  PRIMUS_SKIP_WITHOUT_GPU();
  check_capacity_and_seq_aux(DType::kF32, 1e-4, 1e-4);
}

// bf16 rounds activations and the weight copy to 8 bits of mantissa, as for the dense model (ModelGpu: 1e-2 on the
// loss, 5e-2 on the gradients). On top of that the router's input is rounded: a token whose k-th and (k+1)-th scores
// lie within that rounding (a few percent of the 128 tokens × layers here) picks the other expert, which moves that
// token's share of both experts' gradients; hence 1e-1 on the gradients.
TEST(MoeGpu, Bf16LossAndGradientsTrackTheCpuEngine) {
  PRIMUS_SKIP_WITHOUT_GPU();
  check_against_cpu("mixtral", tiny_mixtral_args(), DType::kBF16, 2e-2, 1e-1);
  check_against_cpu("qwen3_moe", tiny_qwen3_moe_args(), DType::kBF16, 2e-2, 1e-1);
  check_against_cpu("deepseek_routed", tiny_deepseek_routed_args(), DType::kBF16, 2e-2, 1e-1);
}

// bf16 with token dropping and the sequence-level aux loss. Besides the bf16 router input moving a near-tied token to
// another expert (above), under the probs policy a weight near the capacity boundary of its expert may then be
// dropped on one engine and kept on the other, moving that token's share again: the looser bounds of the dropless
// variants, which a wrong kept set (a whole expert's rows) exceeds many times over.
TEST(MoeGpu, Bf16CapacityAndSeqAuxLossTrackTheCpuEngine) {
  PRIMUS_SKIP_WITHOUT_GPU();
  check_capacity_and_seq_aux(DType::kBF16, 2e-2, 1e-1);
}

// 30 AdamW steps in bf16 on one batch lower the loss well below where it started, as on the CPU (MoeModel).
TEST(MoeGpu, Bf16TrainingLowersTheLoss) {
  PRIMUS_SKIP_WITHOUT_GPU();
  for (const ModelArgs& args : {tiny_mixtral_args(), tiny_qwen3_moe_args()}) {
    const std::unique_ptr<Model> model = make_model(args, 32, kGpu, DType::kBF16);
    model->params().initialize(43);
    model->weights_changed();
    Rng rng(44);
    const Tensor tokens = testing::random_ids({4, 32}, args.vocab_size, rng);
    const Tensor labels = testing::random_ids({4, 32}, args.vocab_size, rng);
    const auto [first, last] = testing::overfit_one_batch(*model, tokens, labels);
    std::printf("  %s bf16: loss %.4f -> %.4f\n", std::string(model_family_name(args)).c_str(), first, last);
    EXPECT_LT(last, 0.6 * first) << model_family_name(args) << ": " << first << " -> " << last;
  }
}

// A single rank's step-scoped buffers in bf16 on the GPU, where they free the experts' compute copy inside the MoE
// layer's backward: the flat buffers' losses and weights bit for bit (deterministic mode: cuDNN's attention backward
// otherwise adds in a varying order), also with gradient accumulation and for a dense model.
TEST(MoeGpu, Bf16StepScopedBuffersMatchTheFlatBuffers) {
  PRIMUS_SKIP_WITHOUT_GPU();
  ops::set_deterministic(kGpu, true);
  testing::expect_step_scoped_buffers_match_flat(tiny_mixtral_args(), kGpu, DType::kBF16, 2);
  testing::expect_step_scoped_buffers_match_flat(tiny_qwen3_moe_args(), kGpu, DType::kBF16, 1);
  testing::expect_step_scoped_buffers_match_flat(testing::tiny_llama_args(), kGpu, DType::kBF16, 1);
  ops::set_deterministic(kGpu, false);
}

}  // namespace
}  // namespace primus
