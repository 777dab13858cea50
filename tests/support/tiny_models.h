// Tiny model shapes for tests: a GQA Llama (optionally with Llama 3.1 rope scaling) and a Qwen3 with
// q/k norms, tied embeddings and a head_dim that differs from hidden/heads.
#pragma once

#include "config/experiment.h"
#include "models/model.h"
#include "ops/ops.h"

namespace primus::testing {

inline ModelArgs tiny_llama_args(bool rope_scaling = false) {
  ModelArgs a;
  a.num_layers = 2;
  a.hidden_size = 32;
  a.ffn_hidden_size = 48;
  a.num_attention_heads = 4;
  a.num_query_groups = 2;
  a.kv_channels = 8;
  a.vocab_size = 50;
  a.max_position_embeddings = 64;
  a.rotary_base = 10000.0;
  a.untie_embeddings_and_output_weights = true;
  a.use_rope_scaling = rope_scaling;
  a.rope_scaling_original_max_position_embeddings = 16;
  return a;
}

inline ModelArgs tiny_qwen3_args() {
  ModelArgs a;
  a.num_layers = 2;
  a.hidden_size = 24;
  a.ffn_hidden_size = 40;
  a.num_attention_heads = 4;
  a.num_query_groups = 2;
  a.kv_channels = 10;
  a.vocab_size = 40;
  a.max_position_embeddings = 64;
  a.rotary_base = 1000000.0;
  a.norm_epsilon = 1e-6;
  a.qk_layernorm = true;
  a.untie_embeddings_and_output_weights = false;
  return a;
}

// One training micro-batch (host tokens and labels [B, T]) through `model`: forward with the loss gradient, then
// backward, gradients accumulating. grad_scale 0 means 1 / this batch's counted tokens. Returns Σ token losses
// and the counted tokens. `packed` holds host tensors (moved to the model's device here).
inline LossSum train_micro_batch(Model& model, const Tensor& tokens, const Tensor& labels,
                                 float grad_scale = 0.0f, const PackedSequence& packed = {}) {
  const int64_t counted = counted_tokens(labels);
  if (grad_scale == 0.0f) grad_scale = static_cast<float>(1.0 / static_cast<double>(counted));
  Tensor loss_sum = ops::zeros({1}, DType::kF32, model.device());
  PackedSequence on_device;
  if (packed.position_ids.defined()) on_device.position_ids = ops::to_device(packed.position_ids, model.device());
  if (packed.segment_start.defined()) on_device.segment_start = ops::to_device(packed.segment_start, model.device());
  const std::unique_ptr<MicroBatchContext> ctx = model.forward(
      ops::to_device(tokens, model.device()), ops::to_device(labels, model.device()), grad_scale, loss_sum, on_device);
  model.backward(*ctx);
  return LossSum{static_cast<double>(ops::to_device(loss_sum, kCpuDevice).f32()[0]), counted};
}

}  // namespace primus::testing
