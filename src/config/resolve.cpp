// Checks that involve several module keys, and resolution of the typed keys into ExperimentConfig
// (including the values derived from other keys when not given). Errors point at the key to change and say
// where the other key's value came from.
#include <algorithm>
#include <cstdlib>

#include "config/loader_steps.h"
#include "core/error.h"

namespace primus::config {

namespace {

const ModuleKey& get(const ModuleKeys& keys, std::string_view name) {
  auto it = std::find_if(keys.begin(), keys.end(), [&](const ModuleKey& k) { return k.spec->name == name; });
  PRIMUS_CHECK(it != keys.end(), "[config] module key '{}' is not in the schema", name);
  return *it;
}

// Where to report a problem with `key`: where it was written, or the module when it kept its default.
Origin place(const ModuleKey& key, const Origin& module_origin) {
  if (key.origin.kind == OriginKind::kFile || key.origin.kind == OriginKind::kCommandLine) return key.origin;
  return module_origin.with_path(std::string("modules.pre_trainer.overrides.") + key.spec->name);
}

// "num_attention_heads = 32 from llama.yaml:4" for naming the other key of a check.
std::string describe(const ModuleKey& key) {
  std::string where = key.origin.kind == OriginKind::kDefault       ? "the default"
                      : key.origin.kind == OriginKind::kCommandLine ? "the command line"
                                                                    : key.origin.source();
  return fmt::format("{} = {} from {}", key.spec->name, format_value(*key.spec, key.value), where);
}

// WORLD_SIZE of the torchrun environment contract (primus-cli direct, torchrun and Slurm scripts set it): the
// data-parallel size derives from it as in Megatron. 1 when unset.
int64_t world_size_from_environment() {
  const char* text = std::getenv("WORLD_SIZE");
  if (text == nullptr || *text == '\0') return 1;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0' || value < 1 || value > (1 << 20)) {
    throw UsageError(fmt::format("[distributed] WORLD_SIZE={} is not a positive process count", text));
  }
  return value;
}

// Ranks per model replica: tensor × pipeline × context parallel.
int64_t model_parallel_ranks(const ModuleKeys& keys) {
  return get(keys, "tensor_model_parallel_size").value.i * get(keys, "pipeline_model_parallel_size").value.i *
         get(keys, "context_parallel_size").value.i;
}

// WORLD_SIZE / (tp × pp × cp); throws naming the keys when it does not divide.
int64_t data_parallel_size(const ModuleKeys& keys, const Origin& module_origin) {
  const int64_t world = world_size_from_environment();
  const int64_t model_ranks = model_parallel_ranks(keys);
  if (world % model_ranks != 0) {
    config_error(place(get(keys, "tensor_model_parallel_size"), module_origin),
                 fmt::format("WORLD_SIZE {} is not divisible by tensor_model_parallel_size x "
                             "pipeline_model_parallel_size x context_parallel_size = {}",
                             world, model_ranks));
  }
  return world / model_ranks;
}

// More bytes than any machine holds (1 PiB): a model whose training state, or one micro-batch whose activations,
// would need more is refused here, before the exact memory plan (whose int64 sizes it would overflow) and before
// anything is allocated. Whether a plausible model fits the device is train/memory_report's check.
constexpr double kImplausibleBytes = 1125899906842624.0;

struct ModelShape {
  double layers, hidden, ffn, vocab, q_width, kv_width;  // q_width, kv_width: heads x head dimension
};

// In double, so that no product overflows. vocab is 0 when the tokenizer will give it (at most 2^31 ids).
ModelShape model_shape(const ModuleKeys& keys) {
  auto value = [&](std::string_view name) { return static_cast<double>(get(keys, name).value.i); };
  const double heads = value("num_attention_heads");
  const double head_dim = get(keys, "kv_channels").value.is_set ? value("kv_channels") : value("hidden_size") / heads;
  const double kv_heads = get(keys, "group_query_attention").value.b ? value("num_query_groups") : heads;
  const double vocab = get(keys, "vocab_size").value.is_set ? value("vocab_size") : 0.0;
  return {value("num_layers"), value("hidden_size"), value("ffn_hidden_size"), vocab,
          heads * head_dim,    kv_heads * head_dim};
}

// Weights, gradients and AdamW state take 18 bytes a parameter in mixed precision (memory_report.h); the layers
// keep about 4 x (4C + 2 q_width + 2 kv_width + 3F) bytes a token each for the backward.
void check_model_size(const ModuleKeys& keys, const Origin& module_origin) {
  const ModelShape m = model_shape(keys);
  const double per_layer = 2 * m.hidden * (m.q_width + m.kv_width) + 3 * m.hidden * m.ffn + 2 * m.hidden;
  const double parameters = m.layers * per_layer + 2 * m.vocab * m.hidden;
  if (18 * parameters > kImplausibleBytes) {
    config_error(place(get(keys, "num_layers"), module_origin),
                 fmt::format("the model would have about {:.3g} parameters ({}; {}; {}), {:.3g} bytes of weights, "
                             "gradients and optimizer state: more than any machine holds",
                             parameters, describe(get(keys, "num_layers")), describe(get(keys, "hidden_size")),
                             describe(get(keys, "ffn_hidden_size")), 18 * parameters));
  }
  const double tokens =
      static_cast<double>(get(keys, "micro_batch_size").value.i) * static_cast<double>(get(keys, "seq_length").value.i);
  const double activations = tokens * m.layers * 4 * (4 * m.hidden + 2 * m.q_width + 2 * m.kv_width + 3 * m.ffn);
  if (activations > kImplausibleBytes) {
    config_error(
        place(get(keys, "micro_batch_size"), module_origin),
        fmt::format("one micro-batch of {:.0f} tokens ({}; {}) would keep about {:.3g} bytes of activations: "
                    "more than any machine holds",
                    tokens, describe(get(keys, "micro_batch_size")), describe(get(keys, "seq_length")), activations));
  }
}

// The parallel keys among themselves (Megatron's rules), then what the engine does not do yet; each key is refused
// once, naming both. What needs the world size or the model's shape is ParallelDims::make's (parallel_dims.h).
void check_parallel_keys(const ModuleKeys& keys, const Origin& module_origin) {
  const ModuleKey& tp = get(keys, "tensor_model_parallel_size");
  const ModuleKey& pp = get(keys, "pipeline_model_parallel_size");
  const ModuleKey& sequence_parallel = get(keys, "sequence_parallel");
  if (sequence_parallel.value.b && tp.value.i == 1) {
    config_error(place(sequence_parallel, module_origin),
                 fmt::format("sequence_parallel needs tensor_model_parallel_size > 1 ({}): Megatron's rule, as it "
                             "splits the activations between the tensor-parallel regions over the tensor-parallel "
                             "ranks (Megatron turns it off at 1 with a warning, Primus refuses)",
                             describe(tp)));
  }
  // Context parallelism splits every sequence over the ranks; documents packed into a sequence (their own positions
  // and attention mask) are not split yet.
  const ModuleKey& cp = get(keys, "context_parallel_size");
  if (cp.value.i > 1) {
    for (const char* name : {"reset_position_ids", "reset_attention_mask"}) {
      const ModuleKey& packing = get(keys, name);
      if (!packing.value.b) continue;
      config_error(place(packing, module_origin),
                   fmt::format("{}: packed documents with context parallelism ({}) are not implemented yet; turn "
                               "{} off or set context_parallel_size: 1",
                               name, describe(cp), name));
    }
  }
  const ModuleKey& layers_per_virtual_stage = get(keys, "num_layers_per_virtual_pipeline_stage");
  const ModuleKey& virtual_stages = get(keys, "num_virtual_stages_per_pipeline_rank");
  const ModuleKey& first = get(keys, "decoder_first_pipeline_num_layers");
  const ModuleKey& last = get(keys, "decoder_last_pipeline_num_layers");
  if (layers_per_virtual_stage.value.is_set && virtual_stages.value.is_set) {
    config_error(place(virtual_stages, module_origin),
                 fmt::format("num_virtual_stages_per_pipeline_rank and num_layers_per_virtual_pipeline_stage ({}) "
                             "both give the virtual stages: set one (Megatron's rule)",
                             describe(layers_per_virtual_stage)));
  }
  if (layers_per_virtual_stage.value.is_set && (first.value.is_set || last.value.is_set)) {
    config_error(place(layers_per_virtual_stage, module_origin),
                 fmt::format("num_layers_per_virtual_pipeline_stage with an uneven split ({}): the stages differ in "
                             "size, so give the virtual stages per stage as num_virtual_stages_per_pipeline_rank "
                             "instead (Megatron's rule)",
                             describe(first.value.is_set ? first : last)));
  }
  for (const ModuleKey* key : {&layers_per_virtual_stage, &virtual_stages, &first, &last}) {
    if (!key->value.is_set) continue;
    const bool virtual_key = key == &layers_per_virtual_stage || key == &virtual_stages;
    if (pp.value.i == 1) {
      config_error(place(*key, module_origin),
                   fmt::format("{} needs pipeline_model_parallel_size > 1 ({}): {}", key->spec->name, describe(pp),
                               virtual_key ? "virtual stages interleave the stages of a pipeline"
                                           : "it sizes one stage of a pipeline of several"));
    }
  }
  // FSDP's units are whole-model units gathered in forward order; a pipeline stage runs its units out of that order
  // (several micro-batches in flight), which its gathers do not follow yet.
  const ModuleKey& fsdp = get(keys, "use_megatron_fsdp");
  const ModuleKey& strategy = get(keys, "data_parallel_sharding_strategy");
  if (pp.value.i > 1 && fsdp.value.b && strategy.value.s != "optim" && strategy.value.s != "no_shard") {
    config_error(place(strategy, module_origin),
                 fmt::format("data_parallel_sharding_strategy {} (use_megatron_fsdp) with pipeline parallelism ({}) is "
                             "not implemented: use the distributed optimizer (use_distributed_optimizer: true, or the "
                             "strategy optim) with pipeline_model_parallel_size > 1",
                             strategy.value.s, describe(pp)));
  }
}

// Token dropping and the sequence-level aux loss (a MoE model): their keys among themselves and with context
// parallelism (both engines run them).
void check_capacity_keys(const ModuleKeys& keys, const Origin& module_origin) {
  const ModuleKey& factor = get(keys, "moe_expert_capacity_factor");
  const ModuleKey& policy = get(keys, "moe_token_drop_policy");
  const ModuleKey& pad = get(keys, "moe_pad_expert_input_to_capacity");
  const ModuleKey& balancing = get(keys, "moe_router_load_balancing_type");
  if (!factor.value.is_set) {
    // Without a capacity nothing is dropped: a drop policy other than the default or padding would do nothing.
    if (pad.value.b) {
      config_error(place(pad, module_origin),
                   "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor (without a capacity nothing is "
                   "dropped or padded)");
    }
    if (policy.value.s != "probs") {
      config_error(place(policy, module_origin),
                   fmt::format("moe_token_drop_policy {} needs moe_expert_capacity_factor (without a capacity "
                               "nothing is dropped)",
                               policy.value.s));
    }
  }
  const ModuleKey& cp = get(keys, "context_parallel_size");
  if (balancing.value.s == "seq_aux_loss" && cp.value.i > 1) {
    config_error(place(balancing, module_origin),
                 fmt::format("moe_router_load_balancing_type seq_aux_loss with context parallelism ({}) is not "
                             "implemented: each rank holds part of every sequence; use aux_loss",
                             describe(cp)));
  }
}

// The MoE keys among themselves and with the model and parallel keys: each bad value names its key.
void check_moe_keys(const ModuleKeys& keys, const Origin& module_origin) {
  const ModuleKey& experts = get(keys, "num_experts");
  const ModuleKey& groups = get(keys, "moe_router_num_groups");
  const ModuleKey& group_topk = get(keys, "moe_router_group_topk");
  if (!experts.value.is_set) {
    // Keys that only shape experts would silently do nothing in a dense model.
    for (const char* name : {"moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_num_groups",
                             "moe_router_group_topk", "moe_router_topk_scaling_factor", "moe_expert_capacity_factor"}) {
      const ModuleKey& key = get(keys, name);
      if (key.value.is_set) {
        config_error(place(key, module_origin),
                     fmt::format("{} is set but num_experts is not: a dense model has no experts; set num_experts "
                                 "or remove {}",
                                 name, name));
      }
    }
    // Keys with defaults: refused when they ask for something (an effective config lists them all).
    const ModuleKey& policy = get(keys, "moe_token_drop_policy");
    const ModuleKey& pad = get(keys, "moe_pad_expert_input_to_capacity");
    if (policy.value.s != "probs" || pad.value.b) {
      const ModuleKey& key = pad.value.b ? pad : policy;
      config_error(place(key, module_origin),
                   fmt::format("{} is set but num_experts is not: a dense model has no experts; set num_experts "
                               "or remove {}",
                               key.spec->name, key.spec->name));
    }
    const ModuleKey& ep = get(keys, "expert_model_parallel_size");
    if (ep.value.i > 1) {
      config_error(place(ep, module_origin),
                   fmt::format("expert_model_parallel_size {} needs a MoE model: num_experts is not set, and a dense "
                               "model has no experts to split",
                               ep.value.i));
    }
    return;
  }
  const int64_t e = experts.value.i;
  const ModuleKey& topk = get(keys, "moe_router_topk");
  if (topk.value.i > e) {
    config_error(place(topk, module_origin),
                 fmt::format("moe_router_topk ({}) exceeds num_experts ({})", topk.value.i, describe(experts)));
  }
  if (group_topk.value.is_set && !groups.value.is_set) {
    config_error(place(group_topk, module_origin), "moe_router_group_topk needs moe_router_num_groups");
  }
  if (groups.value.is_set) {
    if (e % groups.value.i != 0) {
      config_error(place(groups, module_origin),
                   fmt::format("moe_router_num_groups ({}) must divide num_experts ({})", groups.value.i,
                               describe(experts)));
    }
    if (!group_topk.value.is_set) {
      config_error(place(groups, module_origin), "moe_router_num_groups needs moe_router_group_topk");
    }
    const int64_t g = group_topk.value.i;
    if (g > groups.value.i) {
      config_error(place(group_topk, module_origin),
                   fmt::format("moe_router_group_topk ({}) exceeds moe_router_num_groups ({})", g, describe(groups)));
    }
    if (topk.value.i % g != 0 || topk.value.i / g > e / groups.value.i) {
      config_error(place(group_topk, module_origin),
                   fmt::format("moe_router_group_topk ({}) must divide moe_router_topk ({}) into at most {} experts "
                               "a group (num_experts / moe_router_num_groups)",
                               g, describe(topk), e / groups.value.i));
    }
  }
  const ModuleKey& expert_bias = get(keys, "moe_router_enable_expert_bias");
  if (expert_bias.value.b && get(keys, "use_megatron_fsdp").value.b) {
    config_error(place(expert_bias, module_origin),
                 "moe_router_enable_expert_bias with use_megatron_fsdp is not implemented (the bias is updated in the "
                 "replicated fp32 weights): use the distributed optimizer (use_distributed_optimizer: true)");
  }
  const ModuleKey& pre_softmax = get(keys, "moe_router_pre_softmax");
  const ModuleKey& score = get(keys, "moe_router_score_function");
  if (pre_softmax.value.b && score.value.s != "softmax") {
    config_error(place(pre_softmax, module_origin),
                 fmt::format("moe_router_pre_softmax applies to softmax scores only ({})", describe(score)));
  }
  const ModuleKey& layers = get(keys, "num_layers");
  const ModuleKey& freq = get(keys, "moe_layer_freq");
  if (freq.value.list.size() > 1 && static_cast<int64_t>(freq.value.list.size()) != layers.value.i) {
    config_error(place(freq, module_origin),
                 fmt::format("moe_layer_freq lists {} layers but the model has {} ({})", freq.value.list.size(),
                             layers.value.i, describe(layers)));
  }
  const ModuleKey& first_dense = get(keys, "moe_first_k_dense_replace");
  if (first_dense.value.i >= layers.value.i) {
    config_error(place(first_dense, module_origin),
                 fmt::format("moe_first_k_dense_replace ({}) leaves no MoE layer of {}", first_dense.value.i,
                             describe(layers)));
  }
  const ModuleKey& tp = get(keys, "tensor_model_parallel_size");
  if (tp.value.i > 1) {
    config_error(place(experts, module_origin),
                 fmt::format("num_experts: MoE layers are not split over tensor-parallel ranks yet ({}); set "
                             "tensor_model_parallel_size: 1",
                             describe(tp)));
  }
  const ModuleKey& dispatcher = get(keys, "moe_token_dispatcher_type");
  if (dispatcher.value.s != "alltoall") {
    config_error(place(dispatcher, module_origin),
                 fmt::format("moe_token_dispatcher_type {} is not implemented; use alltoall", dispatcher.value.s));
  }
  // Expert parallelism (parallel_dims.h checks the same for layouts built without a config).
  const ModuleKey& ep = get(keys, "expert_model_parallel_size");
  if (e % ep.value.i != 0) {
    config_error(place(ep, module_origin),
                 fmt::format("expert_model_parallel_size ({}) does not divide num_experts ({}): each expert-parallel "
                             "rank holds num_experts / expert_model_parallel_size whole experts",
                             ep.value.i, describe(experts)));
  }
  const int64_t dp_cp = data_parallel_size(keys, module_origin) * get(keys, "context_parallel_size").value.i;
  if (dp_cp % ep.value.i != 0) {
    config_error(place(ep, module_origin),
                 fmt::format("expert_model_parallel_size ({}) does not divide the data-parallel size x "
                             "context_parallel_size = {} (WORLD_SIZE {}): the expert-parallel ranks are taken from "
                             "the data- and context-parallel ones",
                             ep.value.i, dp_cp, world_size_from_environment()));
  }
  const ModuleKey& fsdp = get(keys, "use_megatron_fsdp");
  const ModuleKey& strategy = get(keys, "data_parallel_sharding_strategy");
  if (ep.value.i > 1 && fsdp.value.b && strategy.value.s != "optim" && strategy.value.s != "no_shard") {
    config_error(place(ep, module_origin),
                 fmt::format("expert_model_parallel_size {} with FSDP's {} (use_megatron_fsdp) is not implemented: "
                             "its units would shard different experts together; use the distributed optimizer "
                             "(use_distributed_optimizer: true, or the strategy optim)",
                             ep.value.i, strategy.value.s));
  }
  check_capacity_keys(keys, module_origin);
}

// Multi-head latent attention and YaRN: their shape keys among themselves and against what the engine does with them.
void check_mla_keys(const ModuleKeys& keys, const Origin& module_origin) {
  const ModuleKey& mla = get(keys, "multi_latent_attention");
  const ModuleKey& position = get(keys, "position_embedding_type");
  const char* shape_keys[] = {"q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"};
  const char* yarn_keys[] = {"rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                             "mscale", "mscale_all_dim"};
  if (position.value.s != "yarn") {
    // YaRN keys changed from their defaults would do nothing without YaRN (an effective config, which writes every
    // key, loads back).
    for (const char* name : yarn_keys) {
      const ModuleKey& key = get(keys, name);
      if (format_value(*key.spec, key.value) != format_value(*key.spec, default_value(*key.spec))) {
        config_error(place(key, module_origin),
                     fmt::format("{} is a YaRN key but position_embedding_type is {}; set position_embedding_type: "
                                 "yarn or remove {}",
                                 name, position.value.s, name));
      }
    }
  }
  if (!mla.value.b) {
    for (const char* name : shape_keys) {
      const ModuleKey& key = get(keys, name);
      if (key.value.is_set) {
        config_error(place(key, module_origin),
                     fmt::format("{} is set but multi_latent_attention is false; set multi_latent_attention: true "
                                 "or remove {}",
                                 name, name));
      }
    }
    if (position.value.s == "yarn") {
      config_error(place(position, module_origin),
                   "position_embedding_type yarn is implemented for multi-head latent attention only; set "
                   "multi_latent_attention: true or position_embedding_type: rope");
    }
    return;
  }
  for (const char* name : shape_keys) {
    const ModuleKey& key = get(keys, name);
    if (!key.value.is_set && std::string_view(name) != "q_lora_rank") {
      config_error(place(mla, module_origin), fmt::format("multi_latent_attention is true, so {} is required", name));
    }
  }
  const ModuleKey& rope_dim = get(keys, "qk_pos_emb_head_dim");
  if (rope_dim.value.i % 2 != 0) {
    config_error(place(rope_dim, module_origin),
                 fmt::format("qk_pos_emb_head_dim ({}) must be even: RoPE rotates pairs of features", rope_dim.value.i));
  }
  const ModuleKey& gqa = get(keys, "group_query_attention");
  if (gqa.value.b) {
    config_error(place(gqa, module_origin),
                 "group_query_attention with multi_latent_attention: MLA's keys and values come per head from the "
                 "shared kv_lora_rank compression; set group_query_attention: false");
  }
  const ModuleKey& qk_norm = get(keys, "qk_layernorm");
  if (qk_norm.value.b) {
    config_error(place(qk_norm, module_origin),
                 "qk_layernorm with multi_latent_attention: MLA normalises its compressed q and kv "
                 "(q_a_layernorm, kv_a_layernorm), not per head; set qk_layernorm: false");
  }
  const ModuleKey& beta_fast = get(keys, "beta_fast");
  const ModuleKey& beta_slow = get(keys, "beta_slow");
  if (position.value.s == "yarn" && beta_fast.value.f <= beta_slow.value.f) {
    config_error(place(beta_fast, module_origin),
                 fmt::format("beta_fast ({}) must exceed beta_slow ({})", format_value(*beta_fast.spec, beta_fast.value),
                             describe(beta_slow)));
  }
  for (const char* name : {"tensor_model_parallel_size", "context_parallel_size"}) {
    const ModuleKey& key = get(keys, name);
    if (key.value.i > 1) {
      config_error(place(mla, module_origin),
                   fmt::format("multi_latent_attention is not split over tensor- or context-parallel ranks yet ({}); "
                               "set {}: 1",
                               describe(key), name));
    }
  }

}

// fp8's keys: the recipe keys only with fp8_format (and the delayed ones only with the delayed recipe), the bf16 layers
// within the model, and no fp8 on the CPU engine. A key counts as given when it differs from its default (an effective
// config, which writes every key, loads back).
void check_fp8_keys(const ModuleKeys& keys, const Origin& module_origin) {
  const ModuleKey& format = get(keys, "fp8_format");
  auto changed = [&](const char* name) {
    const ModuleKey& key = get(keys, name);
    return format_value(*key.spec, key.value) != format_value(*key.spec, default_value(*key.spec));
  };
  if (!format.value.is_set) {
    for (const char* name : {"fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo",
                             "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"}) {
      if (changed(name)) {
        config_error(place(get(keys, name), module_origin),
                     fmt::format("{} is an fp8 key but fp8_format is unset (fp8 is off); set fp8_format: e4m3 or "
                                 "hybrid, or remove {}",
                                 name, name));
      }
    }
    return;
  }
  const ModuleKey& recipe = get(keys, "fp8_recipe");
  if (recipe.value.s != "delayed") {
    for (const char* name : {"fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo"}) {
      if (changed(name)) {
        config_error(place(get(keys, name), module_origin),
                     fmt::format("{} applies to the delayed recipe only ({}); set fp8_recipe: delayed or remove {}",
                                 name, describe(recipe), name));
      }
    }
  }
  const ModuleKey& first_last = get(keys, "first_last_layers_bf16");
  const ModuleKey& start = get(keys, "num_layers_at_start_in_bf16");
  const ModuleKey& end = get(keys, "num_layers_at_end_in_bf16");
  if (!first_last.value.b) {
    for (const ModuleKey* key : {&start, &end}) {
      if (changed(key->spec->name)) {
        config_error(place(*key, module_origin),
                     fmt::format("{} applies only with first_last_layers_bf16: true ({})", key->spec->name,
                                 describe(first_last)));
      }
    }
  } else {
    const ModuleKey& layers = get(keys, "num_layers");
    if (start.value.i + end.value.i > layers.value.i) {
      config_error(place(start.origin.kind == OriginKind::kDefault ? end : start, module_origin),
                   fmt::format("num_layers_at_start_in_bf16 ({}) + num_layers_at_end_in_bf16 ({}) exceed num_layers "
                               "({})",
                               start.value.i, end.value.i, describe(layers)));
    }
  }
  const ModuleKey& device = get(keys, "device");
  if (device.value.s == "cpu" && !fp8_cpu_reference_requested()) {
    config_error(place(format, module_origin),
                 fmt::format("fp8_format {}: {}; the CPU engine computes in fp32 ({})", format.value.s, kFp8NeedsGpu,
                             describe(device)));
  }
}

}  // namespace

void check_module_keys(const ModuleKeys& keys, const Origin& module_origin) {
  check_model_size(keys, module_origin);
  check_parallel_keys(keys, module_origin);
  check_moe_keys(keys, module_origin);
  check_mla_keys(keys, module_origin);
  check_fp8_keys(keys, module_origin);
  const ModuleKey& heads = get(keys, "num_attention_heads");
  const ModuleKey& hidden = get(keys, "hidden_size");
  const ModuleKey& gqa = get(keys, "group_query_attention");
  const ModuleKey& groups = get(keys, "num_query_groups");
  if (gqa.value.b) {
    if (!groups.value.is_set) {
      config_error(place(gqa, module_origin), "group_query_attention is true, so num_query_groups is required");
    }
    if (heads.value.i % groups.value.i != 0) {
      config_error(
          place(groups, module_origin),
          fmt::format("num_query_groups ({}) must divide num_attention_heads ({})", groups.value.i, describe(heads)));
    }
  } else if (groups.value.is_set && groups.value.i != heads.value.i) {
    config_error(place(groups, module_origin),
                 fmt::format("num_query_groups ({}) differs from num_attention_heads ({}) but group_query_attention is "
                             "false; set group_query_attention: true for grouped-query attention",
                             groups.value.i, describe(heads)));
  }
  if (!get(keys, "kv_channels").value.is_set && hidden.value.i % heads.value.i != 0) {
    config_error(
        place(hidden, module_origin),
        fmt::format("hidden_size ({}) is not divisible by num_attention_heads ({}); set kv_channels to give the "
                    "head dimension",
                    hidden.value.i, describe(heads)));
  }

  const ModuleKey& micro = get(keys, "micro_batch_size");
  const ModuleKey& global = get(keys, "global_batch_size");
  const int64_t dp = data_parallel_size(keys, module_origin);
  if (global.value.is_set && global.value.i % (micro.value.i * dp) != 0) {
    config_error(
        place(global, module_origin),
        fmt::format("global_batch_size ({}) must be a multiple of micro_batch_size x data-parallel size ({} x {}; "
                    "{}; data-parallel size = WORLD_SIZE {} / model-parallel ranks {})",
                    global.value.i, micro.value.i, dp, describe(micro), world_size_from_environment(),
                    model_parallel_ranks(keys)));
  }
  const ModuleKey& strategy = get(keys, "data_parallel_sharding_strategy");
  if (strategy.value.s != "no_shard" && !get(keys, "use_megatron_fsdp").value.b) {
    config_error(place(strategy, module_origin),
                 fmt::format("data_parallel_sharding_strategy is {} but use_megatron_fsdp is false; set "
                             "use_megatron_fsdp: true (or use_distributed_optimizer: true to shard the optimizer "
                             "state only)",
                             strategy.value.s));
  }
  if (get(keys, "overlap_param_gather").value.b && !get(keys, "use_distributed_optimizer").value.b &&
      !get(keys, "use_megatron_fsdp").value.b) {
    config_error(place(get(keys, "overlap_param_gather"), module_origin),
                 "overlap_param_gather needs use_distributed_optimizer: true (without it no weights are gathered)");
  }

  const ModuleKey& keep_interval = get(keys, "keep_interval");
  const ModuleKey& save_interval = get(keys, "save_interval");
  if (keep_interval.value.i > 0 && save_interval.value.i > 0 && keep_interval.value.i % save_interval.value.i != 0) {
    config_error(place(keep_interval, module_origin),
                 fmt::format("keep_interval ({}) must be a multiple of save_interval ({}): no checkpoint would "
                             "fall on the iterations it keeps",
                             keep_interval.value.i, describe(save_interval)));
  }

  const ModuleKey& lr = get(keys, "lr");
  const ModuleKey& min_lr = get(keys, "min_lr");
  if (min_lr.value.f > lr.value.f) {
    config_error(place(min_lr, module_origin), fmt::format("min_lr ({}) must not exceed lr ({})",
                                                           format_value(*min_lr.spec, min_lr.value), describe(lr)));
  }

  const ModuleKey& warmup = get(keys, "lr_warmup_iters");
  const ModuleKey& decay = get(keys, "lr_decay_iters");
  const ModuleKey& decay_source = decay.value.is_set ? decay : get(keys, "train_iters");
  if (warmup.value.i > decay_source.value.i) {
    std::string limit =
        decay.value.is_set ? describe(decay) : "lr_decay_iters defaults to train_iters: " + describe(decay_source);
    config_error(place(warmup, module_origin),
                 fmt::format("lr_warmup_iters ({}) must not exceed lr_decay_iters ({})", warmup.value.i, limit));
  }

  const ModuleKey& seq = get(keys, "seq_length");
  const ModuleKey& max_pos = get(keys, "max_position_embeddings");
  if (seq.value.i > max_pos.value.i) {
    config_error(place(seq, module_origin),
                 fmt::format("seq_length ({}) exceeds max_position_embeddings ({})", seq.value.i, describe(max_pos)));
  }

  const ModuleKey& profile_start = get(keys, "profile_step_start");
  const ModuleKey& profile_end = get(keys, "profile_step_end");
  if (profile_end.value.i <= profile_start.value.i) {
    config_error(place(profile_end, module_origin),
                 fmt::format("profile_step_end ({}) must exceed profile_step_start ({})", profile_end.value.i,
                             describe(profile_start)));
  }

  const ModuleKey& granularity = get(keys, "recompute_granularity");
  for (const char* name : {"recompute_method", "recompute_num_layers"}) {
    const ModuleKey& key = get(keys, name);
    if (key.value.is_set && (!granularity.value.is_set || granularity.value.s != "full")) {
      config_error(place(key, module_origin),
                   fmt::format("{} applies only to recompute_granularity: full ({})", name, describe(granularity)));
    }
  }
  const ModuleKey& recompute_layers = get(keys, "recompute_num_layers");
  const ModuleKey& layers = get(keys, "num_layers");
  if (recompute_layers.value.is_set && recompute_layers.value.i > layers.value.i) {
    config_error(place(recompute_layers, module_origin),
                 fmt::format("recompute_num_layers ({}) exceeds num_layers ({})", recompute_layers.value.i,
                             describe(layers)));
  }

  const ModuleKey& mock = get(keys, "mock_data");
  for (const char* name : {"reset_position_ids", "reset_attention_mask", "eod_mask_loss"}) {
    const ModuleKey& key = get(keys, name);
    if (key.value.b && mock.value.b) {
      config_error(place(key, module_origin),
                   fmt::format("{} needs documents separated by EOD tokens, which mock data does not have ({}); "
                               "set data_path to real data or turn {} off",
                               name, describe(mock), name));
    }
  }
  const ModuleKey& data = get(keys, "data_path");
  if (!mock.value.b && data.value.list.empty()) {
    const ModuleKey& at = data.origin.kind == OriginKind::kDefault ? mock : data;
    config_error(place(at, module_origin),
                 "data_path is empty and mock_data is false: set data_path to your training data, or set "
                 "mock_data: true to train on synthetic tokens (there is no silent fallback to mock data)");
  }
}

void resolve_module_keys(const ModuleKeys& keys, ExperimentConfig& config, std::vector<ConfigEntry>& entries) {
  for (const ModuleKey& key : keys) {
    if (key.spec->apply != nullptr && key.value.is_set) key.spec->apply(key.value, config);
  }
  ModelArgs& m = config.model;
  TrainingArgs& t = config.train;
  t.world_size = world_size_from_environment();
  t.data_parallel_size = t.world_size / (t.tensor_model_parallel_size * t.pipeline_model_parallel_size *
                                         t.context_parallel_size);
  // Derived values: Megatron's rules for keys that were not given.
  std::vector<std::pair<std::string, std::string>> derived;
  if (!get(keys, "group_query_attention").value.b) {
    if (!get(keys, "num_query_groups").value.is_set) {
      derived.emplace_back("num_query_groups", std::to_string(m.num_attention_heads));
    }
    m.num_query_groups = m.num_attention_heads;
  }
  if (!get(keys, "kv_channels").value.is_set) {
    m.kv_channels = m.hidden_size / m.num_attention_heads;
    derived.emplace_back("kv_channels", std::to_string(m.kv_channels));
  }
  if (!get(keys, "vocab_size").value.is_set) m.vocab_size = 0;
  if (m.num_experts > 0 && !get(keys, "moe_ffn_hidden_size").value.is_set) {
    m.moe_ffn_hidden_size = m.ffn_hidden_size;
    derived.emplace_back("moe_ffn_hidden_size", std::to_string(m.moe_ffn_hidden_size));
  }
  if (!get(keys, "lr_decay_iters").value.is_set) {
    t.lr_decay_iters = t.train_iters;
    derived.emplace_back("lr_decay_iters", std::to_string(t.lr_decay_iters));
  }
  if (!get(keys, "global_batch_size").value.is_set) {
    t.global_batch_size = t.micro_batch_size * t.data_parallel_size;
    derived.emplace_back("global_batch_size", std::to_string(t.global_batch_size));
  }
  if (!get(keys, "ddp_bucket_size").value.is_set) {
    t.ddp_bucket_size = std::max<int64_t>(40'000'000, 1'000'000 * t.data_parallel_size);
    derived.emplace_back("ddp_bucket_size", std::to_string(t.ddp_bucket_size));
  }
  if (t.mlflow_experiment_name.empty()) {
    t.mlflow_experiment_name = config.exp_name;
    derived.emplace_back("mlflow_experiment_name", t.mlflow_experiment_name);
  }
  if (t.recompute_granularity == "full") {
    if (t.recompute_method.empty()) {
      t.recompute_method = "uniform";
      derived.emplace_back("recompute_method", t.recompute_method);
    }
    if (t.recompute_num_layers == 0) {
      t.recompute_num_layers = t.recompute_method == "block" ? m.num_layers : 1;
      derived.emplace_back("recompute_num_layers", std::to_string(t.recompute_num_layers));
    }
  }

  for (const ModuleKey& key : keys) {
    auto d = std::find_if(derived.begin(), derived.end(), [&](const auto& p) { return p.first == key.spec->name; });
    if (d != derived.end()) {
      entries.push_back({key.spec->name, d->second, "derived"});
    } else {
      entries.push_back({key.spec->name, format_value(*key.spec, key.value), key.origin.source()});
    }
  }
}

}  // namespace primus::config
