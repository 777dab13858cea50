#include "train/moe_routing.h"

#include <fmt/format.h>

#include <algorithm>

#include "models/llama.h"
#include "ops/ops.h"
#include "train/pipeline_step.h"

namespace primus {

MoeMetrics reduce_moe_routing(const Model& model, DataParallel& dp, const Pipeline* pipeline) {
  const ModelArgs& args = model.args();
  std::vector<int64_t> moe_layers;
  for (int64_t i = 0; i < args.num_layers; ++i) {
    if (args.is_moe_layer(i)) moe_layers.push_back(i);
  }
  // The multi-token prediction modules' layers (numbered on, as in DeepSeek-V3's checkpoint): their routers are
  // logged and their expert biases updated as the decoder layers' are.
  for (int64_t k = 0; k < args.mtp_num_layers; ++k) {
    if (args.is_mtp_moe_layer()) moe_layers.push_back(args.num_layers + k);
  }
  // One row per MoE layer of the whole model: tokens per expert, Σ aux loss, Σ z-loss, micro-batches, dropped
  // entries. Rows of layers this rank does not hold stay zero.
  const int64_t experts = args.num_experts, width = experts + 4;
  Tensor sums = Tensor::zeros({static_cast<int64_t>(moe_layers.size()), width}, DType::kF32);
  for (const MoeLayerRouting& r : model.moe_routing()) {
    const auto row = std::find(moe_layers.begin(), moe_layers.end(), r.layer) - moe_layers.begin();
    float* out = sums.f32() + row * width;
    for (int64_t e = 0; e < experts; ++e) out[e] = static_cast<float>(r.tokens_per_expert[static_cast<size_t>(e)]);
    out[experts] = static_cast<float>(r.load_balancing_loss);
    out[experts + 1] = static_cast<float>(r.z_loss);
    out[experts + 2] = static_cast<float>(r.micro_batches);
    out[experts + 3] = static_cast<float>(r.dropped);
  }
  Tensor reduced = ops::to_device(sums, model.device());
  dp.sum_losses(reduced);
  if (pipeline != nullptr && pipeline->active()) pipeline->stages->all_reduce(reduced, ReduceOp::kSum);
  sums = ops::to_device(reduced, kCpuDevice);

  const bool aux = args.moe_router_load_balancing_type == "aux_loss" && args.moe_aux_loss_coeff > 0.0;
  const bool seq_aux = args.moe_router_load_balancing_type == "seq_aux_loss" && args.moe_aux_loss_coeff > 0.0;
  const bool z = args.moe_z_loss_coeff > 0.0;
  const bool capacity = args.moe_expert_capacity_factor > 0.0;
  MoeMetrics metrics;
  for (size_t row = 0; row < moe_layers.size(); ++row) {
    const float* in = sums.f32() + static_cast<int64_t>(row) * width;
    MoeMetrics::Layer layer;
    layer.layer = moe_layers[row];
    layer.tokens_per_expert.assign(in, in + experts);
    const double micro_batches = std::max(1.0, static_cast<double>(in[experts + 2]));
    if (aux) layer.load_balancing_loss = in[experts] / micro_batches;
    if (seq_aux) layer.seq_load_balancing_loss = in[experts] / micro_batches;
    if (z) layer.z_loss = in[experts + 1] / micro_batches;
    if (capacity) layer.dropped_tokens = in[experts + 3];
    metrics.layers.push_back(std::move(layer));
  }
  return metrics;
}

void update_expert_bias(Model& model, const MoeMetrics& routing, double rate) {
  ParamStore& params = model.params();
  for (const MoeMetrics::Layer& layer : routing.layers) {
    const std::string name = moe_param_names(model.args(), fmt::format("model.layers.{}.", layer.layer)).expert_bias;
    if (!params.contains(name)) continue;  // another pipeline stage's layer
    const size_t experts = layer.tokens_per_expert.size();
    double mean = 0.0;
    for (double tokens : layer.tokens_per_expert) mean += tokens / static_cast<double>(experts);
    Tensor step = Tensor::empty({static_cast<int64_t>(experts)}, DType::kF32);
    for (size_t e = 0; e < experts; ++e) {
      const double offset = mean - layer.tokens_per_expert[e];
      step.f32()[e] = static_cast<float>(offset > 0.0 ? rate : offset < 0.0 ? -rate : 0.0);
    }
    Tensor bias = params.flat_params().slice_elements(params.offset(params.index_of(name)), step.shape());
    ops::add_inplace(bias, ops::to_device(step, bias.device()));
  }
}

}  // namespace primus
