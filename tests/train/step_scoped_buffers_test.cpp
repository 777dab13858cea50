// A single rank's step-scoped buffers (parallel/unit_residency.h) on the CPU engine: the pieces cut each MoE layer's
// experts out of their unit; training with them gives the flat buffers' losses and weights bit for bit (dense with tied
// and untied heads, Mixtral-, Qwen3-MoE- and DeepSeek-shaped MoE, with gradient accumulation), with the gradients
// allocated only between the step's turns that need them. The CPU engine runs fp32 only, so the compute copy's part is
// moe_gpu_test's (MoeGpu.Bf16StepScopedBuffersMatchTheFlatBuffers).
#include <gtest/gtest.h>

#include "support/step_scoped_check.h"

namespace primus {
namespace {

TEST(StepScopedBuffers, PiecesCutTheExpertsOutOfTheirUnits) {
  const ModelArgs args = testing::tiny_qwen3_moe_args();  // layer 0 dense, layers 1-2 MoE, tied head
  const std::unique_ptr<Model> model = make_model(args, 32, kCpuDevice, DType::kF32);
  const std::vector<FlatRange> units = model->param_units();
  const std::vector<FlatRange> experts = model->expert_weight_ranges();
  ASSERT_EQ(units.size(), 5u);    // embedding, 3 layers, final norm
  ASSERT_EQ(experts.size(), 4u);  // gate/up and down of layers 1 and 2
  const ParamStore& params = model->params();
  const int64_t E = args.num_experts, F = args.moe_ffn_hidden_size, C = args.hidden_size;
  for (int layer = 1; layer <= 2; ++layer) {
    const std::string pre = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    const FlatRange gate_up = experts[2 * (layer - 1)], down = experts[2 * (layer - 1) + 1];
    EXPECT_EQ(gate_up.begin, params.offset(params.index_of(pre + "0.gate_proj.weight")));
    EXPECT_EQ(gate_up.size(), E * 2 * F * C);
    EXPECT_EQ(down.begin, params.offset(params.index_of(pre + "0.down_proj.weight")));
    EXPECT_EQ(down.size(), E * C * F);
  }
  UnitResidency residency(model->params(), units, experts, DType::kF32);
  // Per MoE layer: what comes before its experts, gate/up, down (nothing after them without a shared expert).
  std::vector<FlatRange> expected = {units[0],   units[1],   {units[2].begin, experts[0].begin},
                                     experts[0], experts[1], {units[3].begin, experts[2].begin},
                                     experts[2], experts[3], units[4]};
  ASSERT_EQ(residency.pieces().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(residency.pieces()[i].begin, expected[i].begin) << i;
    EXPECT_EQ(residency.pieces()[i].end, expected[i].end) << i;
  }
  // Expert ranges that do not lie within the units are a bug of the caller, named.
  EXPECT_THROW(UnitResidency(model->params(), units, {{units[1].begin, units[2].begin + 1}}, DType::kF32),
               RuntimeError);
}

TEST(StepScopedBuffers, DenseTrainingMatchesTheFlatBuffers) {
  testing::expect_step_scoped_buffers_match_flat(testing::tiny_llama_args(), kCpuDevice, DType::kF32, 1);
  testing::expect_step_scoped_buffers_match_flat(testing::tiny_qwen3_args(), kCpuDevice, DType::kF32, 2);  // tied
}

TEST(StepScopedBuffers, MoeTrainingMatchesTheFlatBuffers) {
  testing::expect_step_scoped_buffers_match_flat(testing::tiny_mixtral_args(), kCpuDevice, DType::kF32, 2);
  testing::expect_step_scoped_buffers_match_flat(testing::tiny_qwen3_moe_args(), kCpuDevice, DType::kF32, 1);
  // A shared expert after the routed ones (a piece after the experts) and the first layer dense.
  testing::expect_step_scoped_buffers_match_flat(testing::tiny_deepseek_args(false, false, true), kCpuDevice,
                                                 DType::kF32, 1);
}

}  // namespace
}  // namespace primus
