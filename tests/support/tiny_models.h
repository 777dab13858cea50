// Tiny model shapes for tests: a GQA Llama (optionally with Llama 3.1 rope scaling), a Qwen3 with q/k norms, tied
// embeddings and a head_dim that differs from hidden/heads, and a DeepSeek-V2-Lite-shaped model (MLA).
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

#include "config/experiment.h"
#include "core/error.h"
#include "config/config.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "ops/ops.h"
#include "support/test_support.h"

namespace primus::testing {

// A tiny Llama (2 layers, hidden 64) training on Shakespeare: 8 samples of 64 tokens a step, a metrics record
// every step, no evaluation; lr warmed up over 10 steps and decayed to step 150.
inline ExperimentConfig shakespeare_experiment(const std::string& workspace, int64_t iters) {
  ExperimentConfig c;
  c.exp_name = "tiny";
  c.workspace = workspace;
  c.effective_yaml = "exp_name: tiny\n";
  ModelArgs& m = c.model;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.ffn_hidden_size = 176;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.kv_channels = 16;
  m.max_position_embeddings = 256;
  TrainingArgs& t = c.train;
  t.train_iters = iters;
  t.micro_batch_size = 4;
  t.global_batch_size = 8;
  t.seq_length = 64;
  t.lr = 3e-3;
  t.min_lr = 3e-4;
  t.lr_warmup_iters = 10;
  t.lr_decay_iters = 150;
  t.weight_decay = 0.1;
  t.adam_beta2 = 0.95;
  t.log_interval = 1;
  t.eval_interval = 0;
  t.data_path = {shakespeare_path()};
  return c;
}

// An experiment on the tiny_llama preset (2 layers) with `overrides` (a YAML flow mapping's entries), its presets read
// from `configs_dir` (PRIMUS_SOURCE_DIR "/configs" in the tests), written under a temporary folder named `label`.
inline ExperimentConfig load_tiny_llama_experiment(const std::string& label, const std::string& overrides,
                                                   const std::string& configs_dir) {
  const std::string path = temp_dir(label) + "/exp.yaml";
  std::ofstream(path) << "exp_name: " << label
                      << "\nmodules:\n  pre_trainer:\n    framework: megatron\n    model: tiny_llama\n"
                         "    overrides: {train_iters: 1, seq_length: 32, lr: 1.0e-4, mock_data: true, "
                      << overrides << "}\n";
  setenv("PRIMUS_CONFIGS_DIR", configs_dir.c_str(), 1);
  return load_experiment_config(path, {}).config;
}

// Loading the tiny_llama experiment with `overrides` fails with exit 2, naming `key` and saying `words`.
inline void expect_tiny_llama_refused(const std::string& label, const std::string& overrides, const std::string& key,
                                      const std::string& words, const std::string& configs_dir) {
  try {
    load_tiny_llama_experiment(label, overrides, configs_dir);
    ADD_FAILURE() << overrides << " was accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    const std::string what = e.what();
    EXPECT_NE(what.find(key), std::string::npos) << what;
    EXPECT_NE(what.find(words), std::string::npos) << what;
  }
}

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

// DeepSeek-V2-Lite's layout scaled down: multi-head latent attention (queries and keys of 8 + 8 features, values of
// 6, a kv compression of 12; with q_lora a query compression of 10), YaRN over an original context of 64 with
// mscale != mscale_all_dim (both the table magnitude and the softmax factor differ from 1), then a dense first layer
// and MoE layers of 4 experts, top-2 without renormalising, a shared expert and an aux loss (with moe).
inline ModelArgs tiny_deepseek_args(bool q_lora, bool yarn, bool moe) {
  ModelArgs a;
  a.num_layers = 3;
  a.hidden_size = 32;
  a.ffn_hidden_size = 40;
  a.num_attention_heads = 4;
  a.num_query_groups = 4;
  a.kv_channels = 8;
  a.vocab_size = 50;
  a.max_position_embeddings = 64;
  a.norm_epsilon = 1e-6;
  a.untie_embeddings_and_output_weights = true;
  a.multi_latent_attention = true;
  a.q_lora_rank = q_lora ? 10 : 0;
  a.kv_lora_rank = 12;
  a.qk_head_dim = 8;
  a.qk_pos_emb_head_dim = 8;
  a.v_head_dim = 6;
  a.yarn = yarn;
  a.rotary_scaling_factor = 4.0;
  a.original_max_position_embeddings = 64;
  a.mscale = 1.0;
  a.mscale_all_dim = 0.8;
  if (moe) {
    a.num_experts = 4;
    a.moe_router_topk = 2;
    a.moe_ffn_hidden_size = 12;
    a.moe_shared_expert_intermediate_size = 24;  // two shared experts of 12, as DeepSeek-V2-Lite has
    a.moe_first_k_dense_replace = 1;
    a.moe_router_pre_softmax = true;
    a.moe_aux_loss_coeff = 0.02;
  }
  return a;
}

// Mixtral's layout: every layer MoE, 8 experts, top-2 renormalised, aux and z losses; head size 16 so bf16
// attention runs on cuDNN as in real runs.
inline ModelArgs tiny_mixtral_args() {
  ModelArgs a = tiny_llama_args();
  a.hidden_size = 64;
  a.kv_channels = 16;
  a.num_experts = 8;
  a.moe_router_topk = 2;
  a.moe_ffn_hidden_size = 48;
  a.moe_aux_loss_coeff = 0.01;
  a.moe_z_loss_coeff = 0.001;
  return a;
}

// Qwen3-MoE's: q/k norms, tied head, the first layer dense, then 16 experts, top-4 renormalised (norm_topk_prob),
// aux loss.
inline ModelArgs tiny_qwen3_moe_args() {
  ModelArgs a = tiny_qwen3_args();
  a.num_layers = 3;
  a.hidden_size = 64;
  a.kv_channels = 16;
  a.num_experts = 16;
  a.moe_router_topk = 4;
  a.moe_ffn_hidden_size = 32;
  a.moe_first_k_dense_replace = 1;
  a.moe_aux_loss_coeff = 0.001;
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

// The losses of the first and last of `steps` AdamW steps (lr 1e-2, clip 1, no weight decay) on one fixed
// micro-batch: a model that learns must bring the last well below the first.
struct FirstLastLoss {
  double first = 0.0, last = 0.0;
};
inline FirstLastLoss overfit_one_batch(Model& model, const Tensor& tokens, const Tensor& labels, int steps = 30) {
  AdamW optimizer(model.params(), AdamWConfig{0.9, 0.95, 1e-8, 0.0});
  FirstLastLoss losses;
  for (int step = 0; step < steps; ++step) {
    model.params().zero_grads();
    const LossSum s = train_micro_batch(model, tokens, labels);
    losses.last = s.loss_sum / s.tokens;
    if (step == 0) losses.first = losses.last;
    optimizer.step(model.params(), 1e-2, clip_grad_norm(model.params(), 1.0).scale);
    model.weights_changed();  // the compute copy (bf16), if any
  }
  return losses;
}

}  // namespace primus::testing
