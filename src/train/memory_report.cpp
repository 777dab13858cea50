// The memory estimate and its table (formula in memory_report.h), and the out-of-memory explanation.
#include "train/memory_report.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "layers/basic_layers.h"
#include "parallel/grad_reducer.h"
#include "parallel/parallel_dims.h"
#include "train/fp8_training.h"
#include "train/train_step.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/device_memory.h"
#endif

namespace primus {

namespace {

constexpr double kKiB = 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Rows of one logits chunk, as LmLoss sizes it: as many as fit max_bytes, a multiple of 64 when there is room.
int64_t logits_chunk_rows(int64_t max_bytes, int64_t rows, int64_t vocab, int64_t element_bytes) {
  int64_t chunk = max_bytes / std::max<int64_t>(1, vocab * element_bytes);
  if (chunk >= 64) chunk = chunk / 64 * 64;
  return std::clamp<int64_t>(chunk, 1, std::max<int64_t>(rows, 1));
}

std::string describe_recompute(const RecomputeConfig& r) {
  switch (r.granularity) {
    case RecomputeConfig::Granularity::kNone:
      return "none";
    case RecomputeConfig::Granularity::kSelective:
      return "selective";
    case RecomputeConfig::Granularity::kFull:
      break;
  }
  if (r.block) return fmt::format("full (block, the first {} layers)", r.num_layers);
  return fmt::format("full (uniform, {} layer{} a chunk)", r.num_layers, r.num_layers == 1 ? "" : "s");
}

// Under expert parallelism a rank holds num_experts / ep of each MoE layer's routed experts
// ("...experts.5.w1.weight"; not the shared expert's): whether `name` is among expert-parallel rank 0's (every rank
// holds as many).
bool held_by_expert_rank0(const std::string& name, const ModelArgs& args, int64_t ep) {
  const size_t at = name.find(".experts.");
  if (ep <= 1 || at == std::string::npos) return true;
  return std::stoll(name.substr(at + 9)) < args.num_experts / ep;
}

bool is_routed_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }

// A rank's parameters and, of them, its routed experts' (under expert parallelism those shard over the
// expert-data-parallel ranks, the rest over data × context parallel).
struct ParameterCount {
  int64_t total = 0;
  int64_t experts = 0;
};

ParameterCount parameter_count(const ModelArgs& args, int64_t ep) {
  ParameterCount count;
  for (const ParamSpec& spec : model_family(args).param_specs(args)) {
    if (!held_by_expert_rank0(spec.name, args, ep)) continue;
    count.total += shape_numel(spec.shape);
    if (is_routed_expert(spec.name)) count.experts += shape_numel(spec.shape);
  }
  return count;
}

// fp8 (memory_report.h): the codes of the fp8 Linear weights (those enable_fp8 replaces: the `_proj` modules of the
// transformer layers outside first_last_layers_bf16, routed experts excepted), the inputs' codes one micro-batch
// keeps for backward, and the bf16 inputs those codes replace (layers/attention.cpp: drop_unread_input). Of the layers
// this rank holds: `held` by whole-model index (a pipeline stage's), empty for all.
void plan_fp8_codes(MemoryPlan& plan, const ModelArgs& m, const TrainingArgs& t, const RecomputeConfig& recompute,
                    int64_t tokens, const std::vector<bool>& held = {}) {
  if (t.fp8_format.empty()) return;
  const int64_t first = t.first_last_layers_bf16 ? t.num_layers_at_start_in_bf16 : 0;
  const int64_t end = m.num_layers - (t.first_last_layers_bf16 ? t.num_layers_at_end_in_bf16 : 0);
  auto holds = [&](int64_t layer) { return held.empty() || held[static_cast<size_t>(layer)]; };
  for (const ParamSpec& spec : model_family(m).param_specs(m)) {
    if (spec.name.ends_with("_proj.weight") && in_fp8_layer(spec.name, m.num_layers, t) &&
        holds(transformer_layer_index(spec.name)) && !is_routed_expert(spec.name)) {
      plan.fp8_weight_codes_bytes += 2 * shape_numel(spec.shape);
    }
  }
  const bool selective = recompute.granularity == RecomputeConfig::Granularity::kSelective;
  // Per token of a layer: the elements whose codes are kept, and the bf16 elements freed for them (attention's and
  // the dense MLP's inputs, the SwiGLU product; a MoE layer's input stays, its router reads it).
  int64_t largest_codes = 0, all_codes = 0, largest_freed = 0, all_freed = 0, layers = 0;
  for (int64_t i = first; i < end; ++i) {
    if (!holds(i)) continue;
    ++layers;
    int64_t codes = m.multi_latent_attention ? 0 : m.hidden_size + m.num_attention_heads * m.kv_channels;
    int64_t freed = m.multi_latent_attention ? 0 : m.hidden_size;
    if (!m.is_moe_layer(i)) {
      codes += m.hidden_size + (selective ? 0 : m.ffn_hidden_size);
      freed += m.hidden_size + (selective ? 0 : m.ffn_hidden_size);
    } else if (m.moe_shared_expert_intermediate_size > 0) {
      codes += m.hidden_size + (selective ? 0 : m.moe_shared_expert_intermediate_size);
      freed += selective ? 0 : m.moe_shared_expert_intermediate_size;
    }
    largest_codes = std::max(largest_codes, codes);
    all_codes += codes;
    largest_freed = std::max(largest_freed, freed);
    all_freed += freed;
  }
  const bool full = recompute.granularity == RecomputeConfig::Granularity::kFull;
  const int64_t chunk_layers = std::min(recompute.num_layers, layers);
  const int64_t codes = full ? chunk_layers * largest_codes : all_codes;
  const int64_t freed = full ? chunk_layers * largest_freed : all_freed;
  plan.fp8_input_codes_bytes = std::max<int64_t>(0, codes) * tokens * plan.micro_batches_in_flight;
  plan.fp8_freed_inputs_bytes = std::max<int64_t>(0, freed) * static_cast<int64_t>(dtype_size(plan.activation_dtype)) *
                                tokens * plan.micro_batches_in_flight;
}

}  // namespace

std::string format_memory_bytes(int64_t bytes) {
  if (bytes < 0) return "-" + format_memory_bytes(-bytes);
  const double b = static_cast<double>(bytes);
  if (b >= kGiB) return fmt::format("{:.2f} GiB", b / kGiB);
  if (b >= kMiB) return fmt::format("{:.2f} MiB", b / kMiB);
  return fmt::format("{:.1f} KiB", b / kKiB);
}

namespace {

// What an MoE block (layers/moe.h, MoeSaved) keeps for backward in place of the dense MLP's gate_up and act: the
// router's logits and scores (f32 in every run, as the router is), the top-k choices and weights and the slots, the
// M = N·k dispatched rows, their gate_up, act and expert outputs (activation dtype), the aux and z losses' gradients
// when on (f32), and the shared expert's gate_up and act (act dropped by selective recompute, as the dense MLP's).
int64_t moe_layer_bytes(const ModelArgs& m, int64_t n, int64_t a, bool selective, int64_t expert_parallel_ranks) {
  constexpr int64_t f32 = 4, i32 = 4;
  const int64_t e = m.num_experts, k = m.moe_router_topk, c = m.hidden_size, fe = m.moe_ffn_hidden_size;
  const int64_t rows = n * k, s = m.moe_shared_expert_intermediate_size;
  int64_t bytes = 2 * f32 * n * e + (i32 + f32) * n * k + i32 * (rows + e + 1);
  bytes += rows * a * (2 * c + 3 * fe);
  // The all-to-all dispatcher also keeps the rows that came back [N·k, C] (for the combine's backward) and the
  // received rows' regrouping [M] (M = N·k at an even routing).
  if (expert_parallel_ranks > 1) bytes += rows * a * c + i32 * rows;
  if (m.moe_router_load_balancing_type != "none" && m.moe_aux_loss_coeff > 0.0) bytes += f32 * n * e;
  if (m.moe_z_loss_coeff > 0.0) bytes += f32 * n * e;
  if (s > 0) bytes += n * a * (2 * s + (selective ? 0 : s));
  return bytes;
}

}  // namespace

ActivationEstimate estimate_activations(const ModelArgs& m, int64_t micro_batch_size, int64_t seq_length,
                                        DType activation_dtype, const RecomputeConfig& recompute,
                                        int64_t sequence_parallel_ranks, int64_t expert_parallel_ranks) {
  const int64_t N = micro_batch_size * seq_length;
  const int64_t R = N / std::max<int64_t>(1, sequence_parallel_ranks);  // rows of the residual stream held here
  const int64_t a = static_cast<int64_t>(dtype_size(activation_dtype));
  constexpr int64_t f32 = 4;
  const int64_t C = m.hidden_size, F = m.ffn_hidden_size, D = m.kv_channels;
  const int64_t Hq = m.num_attention_heads, Hkv = m.num_query_groups, L = m.num_layers;
  const bool selective = recompute.granularity == RecomputeConfig::Granularity::kSelective;

  ActivationEstimate e;
  e.tokens = N;
  const int64_t dense_mlp = N * a * (2 * F + (selective ? 0 : F));  // gate_up [N, 2F] and act [N, F]
  int64_t attention_and_norms = R * a * 2 * C + N * a * (2 * C + 2 * Hq * D + 2 * Hkv * D) + f32 * (2 * R + N * Hq);
  if (m.qk_layernorm) attention_and_norms += N * a * (Hq + Hkv) * D + f32 * N * (Hq + Hkv);
  if (m.multi_latent_attention) {
    // MLA (layers/mla.h) keeps q and k [N, H, Dn + Dr], v and out [N, H, Dv], and per compression (q's when
    // q_lora_rank, kv's) the norm's input and output with its rstd, instead of q, k, v and out of D features.
    const int64_t Dqk = m.qk_head_dim + m.qk_pos_emb_head_dim, ranks = m.q_lora_rank + m.kv_lora_rank;
    attention_and_norms = R * a * 2 * C + N * a * (2 * C + 2 * Hq * Dqk + 2 * Hq * m.v_head_dim + 2 * ranks) +
                          f32 * (2 * R + N * Hq + N * (m.q_lora_rank > 0 ? 2 : 1));
  }
  const int64_t dense_layer = attention_and_norms + dense_mlp;
  const int64_t moe_layer = attention_and_norms + moe_layer_bytes(m, N, a, selective, expert_parallel_ranks);
  auto layer_bytes = [&](int64_t i) { return m.is_moe_layer(i) ? moe_layer : dense_layer; };
  e.layer_bytes = 0;
  for (int64_t i = 0; i < L; ++i) e.layer_bytes = std::max(e.layer_bytes, layer_bytes(i));
  const int64_t row_block = R * C * a;  // one [R, C] activation: a chunk's input, a norm input, dhidden
  const int64_t final_norm = row_block + f32 * R;

  // Forward: each layer keeps all it saved, or (recomputed) only its chunk's input; a recomputed layer still
  // holds everything while its forward runs.
  int64_t kept = 0, peak = 0;
  std::vector<int64_t> kept_by_layer(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) {
    const auto [first, end] = recompute.chunk(i, L);  // the chunking the model applies
    const bool recomputed = first != end;
    if (recomputed) peak = std::max(peak, kept + layer_bytes(i));
    kept_by_layer[static_cast<size_t>(i)] = !recomputed ? layer_bytes(i) : (i == first ? row_block : 0);
    kept += kept_by_layer[static_cast<size_t>(i)];
  }
  e.layers_saved_bytes = kept;
  // Multi-token prediction modules (memory_report.h): the shifted embedding, eh_proj's input and the norms' rstd,
  // their layer whole, their final norm and loss gradient.
  const int64_t mtp_module = row_block + 2 * N * C * a + 2 * f32 * R +
                             (m.is_mtp_moe_layer() ? moe_layer : dense_layer) + final_norm + row_block;
  e.mtp_bytes = m.mtp_num_layers * mtp_module;
  e.saved_bytes = kept + final_norm + row_block + e.mtp_bytes;  // + the loss gradient dhidden

  // The loss: final norm output, losses and lse, one logits chunk, on top of everything saved.
  const LmLoss loss_layer;
  e.logits_chunk_bytes = logits_chunk_rows(loss_layer.max_logits_bytes, N, m.vocab_size, a) * m.vocab_size * a;
  peak = std::max(peak, e.saved_bytes + N * C * a + e.logits_chunk_bytes + 2 * f32 * N);

  // Backward, top down: dhidden is used up at once, the final norm's saved tensors stay to the end; entering a
  // recomputed chunk from its top replaces the chunk's input by its layers whole.
  int64_t live = kept + final_norm;  // the modules' backward ran first and freed theirs
  for (int64_t i = L - 1; i >= 0; --i) {
    const auto [first, end] = recompute.chunk(i, L);  // the chunking the model applies
    if (first != end && i == end - 1) {
      for (int64_t j = first; j < end; ++j) {
        live += layer_bytes(j);
        kept_by_layer[static_cast<size_t>(j)] = layer_bytes(j);
      }
      live -= row_block;
      peak = std::max(peak, live);
    }
    live -= kept_by_layer[static_cast<size_t>(i)];
  }
  e.peak_bytes = peak;
  return e;
}

namespace {

// The sizes of the parameter units FSDP shards (Model::param_units of the dense family): the embedding, each
// block, the final norm with the output layer.
std::vector<int64_t> unit_sizes(const ModelArgs& args) {
  std::vector<int64_t> sizes{0};
  std::string block;
  for (const ParamSpec& spec : model_family(args).param_specs(args)) {
    const bool layer = spec.name.rfind("model.layers.", 0) == 0;
    const std::string prefix = layer ? spec.name.substr(0, spec.name.find('.', 13)) : std::string();
    if ((layer && prefix != block) || spec.name == "model.norm.weight") sizes.push_back(0);
    block = prefix;
    sizes.back() += shape_numel(spec.shape);
  }
  return sizes;
}

// Per rank, as parallel/fsdp.h keeps them: shards of every unit (fp32 master, moments, gradients; compute dtype for
// the gathers), the first and last unit gathered with their gradients throughout, and the blocks' gathered weights
// and gradients: all of them (ZeRO-2 weights) or the one in use and the one prefetched (ZeRO-3; a recomputed
// chunk holds its blocks during its backward).
// Returns what of the units' buffers counted here is not held at the loss, where the activations peak: during the
// loss only the next block in backward order is gathered (ZeRO-3) and no block's gradient exists yet.
int64_t plan_fully_sharded(MemoryPlan& plan, const ModelArgs& args, const std::string& zero,
                           const RecomputeConfig& recompute) {
  const int64_t d = plan.data_parallel_size;
  const int64_t c = static_cast<int64_t>(dtype_size(plan.activation_dtype));
  int64_t shards = 0, outer = 0, all = 0, block = 0;
  const std::vector<int64_t> sizes = unit_sizes(args);
  for (size_t u = 0; u < sizes.size(); ++u) {
    const int64_t s = (sizes[u] + d - 1) / d;
    shards += s;
    all += d * s;
    if (u == 0 || u + 1 == sizes.size()) {
      outer += d * s;
    } else {
      block = std::max(block, d * s);
    }
  }
  const int64_t held_blocks =
      recompute.granularity == RecomputeConfig::Granularity::kFull ? recompute.num_layers + 1 : 2;
  plan.fully_sharded = zero;
  plan.sharded_optimizer = true;
  plan.param_bytes = 4 * shards;
  plan.optimizer_bytes = 2 * 4 * shards;
  plan.comm_bytes = 0;
  const int64_t gathered = zero == "ZeRO-2" ? all : outer + held_blocks * block;
  plan.compute_copy_bytes = (c == 4 ? 0 : c * shards) + c * gathered;
  plan.grad_bytes = 4 * shards + 4 * (outer + 2 * block);
  return (zero == "ZeRO-2" ? 0 : c * (held_blocks - 1) * block) + 4 * 2 * block;
}

}  // namespace

namespace {

// Pipeline stage `stage`'s share of the model (pipeline_model_parallel_size > 1): its parameter count (of the
// tensor-parallel shapes `args`), its layers, and a description.
struct StageShare {
  int64_t parameters = 0;
  int64_t expert_parameters = 0;  // of them, routed experts
  int64_t layers = 0;
  std::vector<int64_t> moe_layers;  // per layer held, in order: 1 when it is a MoE layer
  std::vector<bool> held;           // by the whole model's layer index
  int chunks = 1;
  std::string description;
};

StageShare stage_share(const ModelArgs& args, const TrainingArgs& t, int stage) {
  const int pp = static_cast<int>(t.pipeline_model_parallel_size);
  int vpp = 1;
  if (t.num_virtual_stages_per_pipeline_rank > 0) vpp = static_cast<int>(t.num_virtual_stages_per_pipeline_rank);
  if (t.num_layers_per_virtual_pipeline_stage > 0) {
    vpp = static_cast<int>(args.num_layers / pp / t.num_layers_per_virtual_pipeline_stage);
  }
  const std::vector<LayerRange> layout = stage_layers(PipelineSplit{args.num_layers, pp, vpp,
                                                                    t.decoder_first_pipeline_num_layers,
                                                                    t.decoder_last_pipeline_num_layers});
  StageShare share;
  share.chunks = vpp;
  std::vector<bool>& held = share.held;
  held.assign(static_cast<size_t>(args.num_layers), false);
  std::string ranges;
  for (int v = 0; v < vpp; ++v) {
    const LayerRange r = layout[static_cast<size_t>(v * pp + stage)];
    for (int64_t i = r.begin; i < r.end; ++i) {
      held[static_cast<size_t>(i)] = true;
      share.moe_layers.push_back(args.is_moe_layer(i) ? 1 : 0);
    }
    share.layers += r.size();
    ranges += fmt::format("{}{}-{}", ranges.empty() ? "" : ", ", r.begin, r.end - 1);
  }
  const bool first = stage == 0, last = stage == pp - 1, tied = !args.untie_embeddings_and_output_weights;
  // Multi-token prediction's modules run on the last stage, which then needs the embedding too (for the shifted
  // tokens), as a copy when the first stage holds it.
  const bool mtp = args.mtp_num_layers > 0;
  for (const ParamSpec& spec : model_family(args).param_specs(args)) {
    bool mine;
    if (const int64_t layer = transformer_layer_index(spec.name); layer >= 0) {
      mine = layer < args.num_layers ? held[static_cast<size_t>(layer)] : last;  // beyond: the modules
    } else if (spec.name == "model.embed_tokens.weight") {
      mine = first || (last && (tied || mtp));
    } else {
      mine = last;  // final norm, untied output layer
    }
    if (mine && held_by_expert_rank0(spec.name, args, t.expert_model_parallel_size)) {
      share.parameters += shape_numel(spec.shape);
      if (is_routed_expert(spec.name)) share.expert_parameters += shape_numel(spec.shape);
    }
  }
  share.description = fmt::format("stage {} of {}: layers {}{}{}{}", stage, pp, ranges, first ? ", embedding" : "",
                                  last ? (tied ? ", output layer (a copy of the embedding) and loss"
                                               : ", output layer and loss")
                                       : "",
                                  last && mtp ? fmt::format(", {} multi-token prediction module{} (with a copy of "
                                                            "the embedding)",
                                                            args.mtp_num_layers, args.mtp_num_layers == 1 ? "" : "s")
                                              : "");
  return share;
}

// The tokens of each sequence one rank computes: all of them, or under context parallelism its 2 of 2·cp chunks.
int64_t rank_seq_length(const TrainingArgs& t) { return t.seq_length / std::max<int64_t>(1, t.context_parallel_size); }

}  // namespace

MemoryPlan plan_memory(const ModelArgs& whole, const TrainingArgs& t, Device device, DType compute_dtype,
                       int stage) {
  // One rank's share of a tensor-parallel model: its slices of the weights, its heads' and columns' activations.
  const ModelArgs args = tensor_parallel_shapes(whole, static_cast<int>(t.tensor_model_parallel_size));
  MemoryPlan plan;
  plan.model = whole;
  plan.train = t;
  plan.device = device.str();
  const ParameterCount count = parameter_count(args, t.expert_model_parallel_size);
  plan.parameters = count.total;
  int64_t expert_parameters = count.experts;
  std::optional<StageShare> share;
  if (t.pipeline_model_parallel_size > 1) {
    share = stage_share(args, t, stage);
    plan.parameters = share->parameters;
    expert_parameters = share->expert_parameters;
    plan.pipeline_stage = share->description;
  }
  plan.micro_batch_size = t.micro_batch_size;
  plan.seq_length = rank_seq_length(t);
  if (t.sequence_parallel) plan.sequence_parallel_ranks = std::max<int64_t>(1, t.tensor_model_parallel_size);
  plan.activation_dtype = compute_dtype;
  const RecomputeConfig recompute = RecomputeConfig::from(t);
  plan.recompute = describe_recompute(recompute);
  plan.param_bytes = 4 * plan.parameters;
  plan.compute_copy_bytes =
      compute_dtype == DType::kF32 ? 0 : static_cast<int64_t>(dtype_size(compute_dtype)) * plan.parameters;
  plan.grad_bytes = 4 * plan.parameters;
  // The distributed optimizer keeps the moments of this rank's shards only (parallel/grad_reducer.h), plus a
  // staging buffer for the one bucket the data-parallel size does not divide. It shards over the ranks gradients
  // reduce over: data × context parallel, and under expert parallelism the routed experts over their
  // expert-data-parallel ranks, dp × cp / ep (estimated as two regions; the trainer interleaves them by layer).
  plan.data_parallel_size = t.data_parallel_size * std::max<int64_t>(1, t.context_parallel_size);
  plan.sharded_optimizer =
      t.use_distributed_optimizer || (t.use_megatron_fsdp && t.data_parallel_sharding_strategy == "optim");
  if (plan.sharded_optimizer) {
    const int64_t ep = std::max<int64_t>(1, t.expert_model_parallel_size);
    const int64_t expert_sharded = ep > 1 ? expert_parameters : 0;
    int64_t owned = 0;
    auto shard = [&](int64_t numel, int64_t ranks) {
      if (numel == 0) return;
      const BucketLayout layout(numel, ddp_bucket_size(t), static_cast<int>(ranks));
      for (const FlatRange& r : layout.owned(0)) owned += r.size();  // rank 0 owns the largest shards
      for (size_t k = 0; k < layout.buckets().size(); ++k) {
        if (layout.buckets()[k].size() % layout.dp() != 0) {
          plan.comm_bytes = std::max(plan.comm_bytes, 4 * layout.shard_size(k) * layout.dp());
        }
      }
    };
    shard(plan.parameters - expert_sharded, plan.data_parallel_size);
    shard(expert_sharded, std::max<int64_t>(1, plan.data_parallel_size / ep));
    plan.optimizer_bytes = 2 * 4 * owned;
  } else {
    plan.optimizer_bytes = 2 * 4 * plan.parameters;
  }
  const std::string& strategy = t.data_parallel_sharding_strategy;
  int64_t units_released_at_loss = 0;
  if (t.use_megatron_fsdp && (strategy == "optim_grads" || strategy == "optim_grads_params")) {
    units_released_at_loss =
        plan_fully_sharded(plan, args, strategy == "optim_grads" ? "ZeRO-2" : "ZeRO-3", recompute);
  }
  if (!share) {
    plan.rank_model = args;
    plan.activations = estimate_activations(args, t.micro_batch_size, plan.seq_length, compute_dtype, recompute,
                                            plan.sequence_parallel_ranks, t.expert_model_parallel_size);
    // The units' buffers peak in backward, after the loss's transients are gone: the two peaks do not add up.
    plan.not_at_once_bytes =
        std::min(units_released_at_loss, plan.activations.peak_bytes - plan.activations.saved_bytes);
    const bool one_rank = t.data_parallel_size * t.tensor_model_parallel_size * t.pipeline_model_parallel_size *
                              std::max<int64_t>(1, t.context_parallel_size) ==
                          1;
    // With accumulation the gradients stay from the first micro-batch's backward through the next ones' forwards.
    if (one_rank && plan.fully_sharded.empty() && micro_batches_per_step(t) == 1) {
      // Step-scoped buffers (parallel/unit_residency.h), one micro-batch a step: at the loss the blocks' gradients are
      // not allocated yet (the
      // embedding's and the output layer's are); backward allocates a layer's gradients while the activations of the
      // layers below it are still held, and frees its compute copy after it. Its peak is at its first layer (most
      // activations) or at its last (most gradients), with that layer's compute copy and activations.
      const int64_t outer = args.vocab_size * args.hidden_size * (args.untie_embeddings_and_output_weights ? 2 : 1);
      const int64_t layers = std::max<int64_t>(1, args.num_layers);
      const int64_t whole = plan.static_bytes() + plan.activations.peak_bytes;
      const int64_t without_grads = plan.static_bytes() - plan.grad_bytes + 4 * outer;
      const int64_t at_loss = without_grads + plan.activations.peak_bytes;
      const int64_t first_layer = without_grads + (plan.grad_bytes - 4 * outer) / layers + plan.activations.peak_bytes -
                                  plan.activations.logits_chunk_bytes;
      const int64_t last_layer = plan.static_bytes() - plan.compute_copy_bytes + plan.compute_copy_bytes / layers +
                                 plan.activations.layer_bytes;
      plan.not_at_once_bytes = whole - std::max({at_loss, first_layer, last_layer});
      plan.step_scoped_buffers = true;
    }
    plan_fp8_codes(plan, args, t, recompute, plan.activations.tokens);
    return plan;
  }
  // A stage's layers, with the output layer's loss counted as if every stage had it (an overestimate off the last
  // stage), kept for as many micro-batches as the schedule has in flight there.
  ModelArgs stage_args = args;
  stage_args.num_layers = share->layers;
  // Which of the stage's layers are MoE, by the whole model's numbering (a one-entry list reads as a frequency,
  // which gives the same answer for 0 and 1).
  stage_args.moe_layer_freq = share->moe_layers;
  stage_args.moe_first_k_dense_replace = 0;
  // The multi-token prediction modules are the last stage's (their layer of the kind of its last layer).
  if (stage != t.pipeline_model_parallel_size - 1) stage_args.mtp_num_layers = 0;
  plan.rank_model = stage_args;
  plan.activations = estimate_activations(stage_args, t.micro_batch_size, plan.seq_length, compute_dtype, recompute,
                                          plan.sequence_parallel_ranks, t.expert_model_parallel_size);
  const int64_t pp = t.pipeline_model_parallel_size, v = share->chunks, m = micro_batches_per_step(t);
  const int64_t virtual_in_flight =
      v == 1 ? std::min(pp - stage, m) : std::min((pp - stage - 1) * 2 + (v - 1) * pp + 1, m * v);
  plan.micro_batches_in_flight = (virtual_in_flight + v - 1) / v;
  // Each virtual micro-batch in flight holds one model chunk's layers (1/v of the stage's; the chunks are equal, as
  // interleaving requires); the output layer's part is counted once.
  const int64_t extra = (virtual_in_flight - v) * plan.activations.layers_saved_bytes / v;
  plan.activations.saved_bytes += extra;
  plan.activations.peak_bytes += extra;
  plan_fp8_codes(plan, args, t, recompute, plan.activations.tokens, share->held);
  return plan;
}

void add_device_memory(MemoryPlan& plan, Device device) {
#if PRIMUS_WITH_CUDA
  if (device.type == DeviceType::kCuda) {
    const GpuMemoryInfo info = cuda_memory_info(device.index);
    plan.device_total_bytes = info.total_bytes;
    plan.device_free_bytes = info.free_bytes;
  }
#else
  (void)plan;
  (void)device;
#endif
}

namespace {

// What the plan must fit in: the device's memory, or on the CPU the host's physical memory.
std::pair<int64_t, std::string> memory_capacity(const MemoryPlan& plan) {
  if (plan.device_total_bytes > 0) return {plan.device_total_bytes, plan.device + "'s memory"};
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0) return {0, ""};
  return {static_cast<int64_t>(pages) * page_bytes, "the host's memory"};
}

}  // namespace

void check_memory_plan_fits(const MemoryPlan& plan) {
  const auto [capacity, what] = memory_capacity(plan);
  if (capacity <= 0) return;
  if (plan.static_bytes() > capacity) {
    throw UsageError(fmt::format(
        "[config] the model cannot fit: its parameters, gradients and optimizer state alone need {}, more than {} "
        "({}; {} parameters from num_layers {}, hidden_size {}, ffn_hidden_size {}, vocab_size {}); use a smaller "
        "model or shard it over more devices",
        format_memory_bytes(plan.static_bytes()), what, format_memory_bytes(capacity), plan.parameters,
        plan.model.num_layers, plan.model.hidden_size, plan.model.ffn_hidden_size, plan.model.vocab_size));
  }
  if (plan.total_bytes() / 2 > capacity) {
    throw UsageError(fmt::format(
        "[config] the run cannot fit: the estimate is {} ({} of activations for micro_batch_size {} x seq_length "
        "{}{}), more than twice {} ({}); use a smaller micro_batch_size (global_batch_size stays, with more "
        "accumulation steps), recompute_granularity or a shorter seq_length",
        format_memory_bytes(plan.total_bytes()), format_memory_bytes(plan.activations.peak_bytes),
        plan.micro_batch_size, plan.train.seq_length,
        plan.seq_length == plan.train.seq_length
            ? ""
            : fmt::format(" / context_parallel_size {}", plan.train.context_parallel_size),
        what, format_memory_bytes(capacity)));
  }
}

std::vector<std::string> format_memory_table(const MemoryPlan& p) {
  auto row = [](const std::string& what, int64_t bytes, const std::string& note = "") {
    return fmt::format("  {:<36}{:>12}{}", what, format_memory_bytes(bytes), note.empty() ? "" : "  " + note);
  };
  const char* act = dtype_name(p.activation_dtype);
  std::vector<std::string> lines;
  lines.push_back(
      fmt::format("memory per device, estimated ({}: {} parameters; micro-batch {} x {} tokens, {} "
                  "activations, recompute {}):",
                  p.device, p.parameters, p.micro_batch_size, p.seq_length, act, p.recompute));
  if (!p.pipeline_stage.empty()) {
    lines.push_back(fmt::format("  pipeline {}; activations of {} micro-batch{} in flight", p.pipeline_stage,
                                p.micro_batches_in_flight, p.micro_batches_in_flight == 1 ? "" : "es"));
  }
  const std::string shard = fmt::format(", 1/{} shard", p.data_parallel_size);
  if (!p.fully_sharded.empty()) {
    lines.push_back(row(fmt::format("parameters (fp32 master{})", shard), p.param_bytes,
                        fmt::format("(FSDP {})", p.fully_sharded)));
    lines.push_back(row(fmt::format("weights ({}, gathered units)", act), p.compute_copy_bytes));
    lines.push_back(row("gradients (fp32, shard + units)", p.grad_bytes));
  } else {
    lines.push_back(row("parameters (fp32 master)", p.param_bytes));
    if (p.compute_copy_bytes > 0) lines.push_back(row(fmt::format("compute copy ({})", act), p.compute_copy_bytes));
    lines.push_back(row("gradients (fp32)", p.grad_bytes));
  }
  lines.push_back(row(p.sharded_optimizer ? fmt::format("optimizer state (AdamW, fp32, 1/{} shard)", p.data_parallel_size)
                                          : std::string("optimizer state (AdamW, fp32)"),
                      p.optimizer_bytes));
  if (p.comm_bytes > 0) lines.push_back(row("communication buffers", p.comm_bytes));
  lines.push_back(
      row(p.micro_batches_in_flight > 1 ? fmt::format("activations, {} micro-batches (peak)", p.micro_batches_in_flight)
                                        : std::string("activations per micro-batch (peak)"),
          p.activations.peak_bytes,
          fmt::format("(kept for backward {}{}, logits chunk {})", format_memory_bytes(p.activations.saved_bytes),
                      p.activations.mtp_bytes > 0
                          ? fmt::format(", of it multi-token prediction {}", format_memory_bytes(p.activations.mtp_bytes))
                          : std::string(),
                      format_memory_bytes(p.activations.logits_chunk_bytes))));
  if (p.fp8_weight_codes_bytes > 0) lines.push_back(row("fp8 codes of the weights (W, W^T)", p.fp8_weight_codes_bytes));
  if (p.fp8_input_codes_bytes > 0) {
    lines.push_back(row("fp8 codes of the inputs (x^T)", p.fp8_input_codes_bytes, "(kept for backward)"));
  }
  if (p.fp8_freed_inputs_bytes > 0) {
    lines.push_back(row("inputs not kept in bf16", -p.fp8_freed_inputs_bytes, "(their fp8 codes stand in)"));
  }
  if (p.not_at_once_bytes > 0) {
    lines.push_back(row("not held at once", -p.not_at_once_bytes,
                        p.step_scoped_buffers ? "(one rank: gradients come as backward frees the compute copy)"
                                              : "(units' buffers peak after the loss's transients)"));
  }
  lines.push_back(row("total", p.total_bytes()));
  if (p.device_total_bytes > 0) {
    lines.push_back(row("device memory", p.device_total_bytes,
                        fmt::format("({} free at start)", format_memory_bytes(p.device_free_bytes))));
  }
  return lines;
}

void log_memory_plan(const MemoryPlan& plan) {
  for (const std::string& line : format_memory_table(plan)) spdlog::info("{}", line);
  if (plan.device_total_bytes > 0 && plan.total_bytes() > plan.device_total_bytes) {
    spdlog::warn(
        "memory: the estimate ({}) exceeds {}'s {}; expect out-of-memory (smaller micro_batch_size, "
        "recompute_granularity or seq_length)",
        format_memory_bytes(plan.total_bytes()), plan.device, format_memory_bytes(plan.device_total_bytes));
  }
}

std::vector<std::string> memory_suggestions(const MemoryPlan& plan) {
  const ModelArgs& args = plan.rank_model;
  const TrainingArgs& t = plan.train;
  auto activations = [&](int64_t micro_batch_size, const std::string& granularity) {
    TrainingArgs changed = t;
    changed.micro_batch_size = micro_batch_size;
    changed.recompute_granularity = granularity;
    if (granularity == "full" && t.recompute_granularity != "full") {
      changed.recompute_method = "uniform";
      changed.recompute_num_layers = 1;
    }
    return format_memory_bytes(estimate_activations(args, micro_batch_size, plan.seq_length, plan.activation_dtype,
                                                    RecomputeConfig::from(changed), plan.sequence_parallel_ranks,
                                                    t.expert_model_parallel_size)
                                   .peak_bytes);
  };
  std::vector<std::string> tips;
  if (t.micro_batch_size > 1) {
    const int64_t half = t.micro_batch_size / 2;
    tips.push_back(fmt::format(
        "a smaller micro_batch_size (now {}; {} would need about {} of activations); global_batch_size stays, "
        "with more accumulation steps",
        t.micro_batch_size, half, activations(half, t.recompute_granularity)));
  }
  if (t.recompute_granularity.empty()) {
    tips.push_back(fmt::format("recompute_granularity: selective (about {} of activations) or full (about {})",
                               activations(t.micro_batch_size, "selective"), activations(t.micro_batch_size, "full")));
  } else if (t.recompute_granularity == "selective") {
    tips.push_back(
        fmt::format("recompute_granularity: full (about {} of activations)", activations(t.micro_batch_size, "full")));
  } else if (t.recompute_method != "uniform" || t.recompute_num_layers != 1) {
    TrainingArgs every = t;
    every.recompute_method = "uniform";
    every.recompute_num_layers = 1;
    tips.push_back(fmt::format(
        "recompute_method: uniform with recompute_num_layers: 1 (every layer, about {} of activations)",
        format_memory_bytes(estimate_activations(args, t.micro_batch_size, plan.seq_length, plan.activation_dtype,
                                                 RecomputeConfig::from(every), plan.sequence_parallel_ranks,
                                                 t.expert_model_parallel_size)
                                .peak_bytes)));
  }
  tips.push_back(fmt::format("a shorter seq_length (now {}; activations scale with it)", t.seq_length));
  tips.push_back("on several GPUs, use_distributed_optimizer: true (the optimizer state divided by the data-parallel "
                 "size)");
  return tips;
}

std::string out_of_memory_message(const OutOfMemoryError& error, const MemoryPlan& plan) {
  const std::string device = error.device() == "cuda" ? plan.device : error.device();
  std::string text =
      error.requested_bytes() > 0
          ? fmt::format("out of memory on {}: a request for {} ({} bytes) did not fit.\n", device,
                        format_memory_bytes(static_cast<int64_t>(error.requested_bytes())), error.requested_bytes())
          : fmt::format("out of memory on {}.\n", device);
  text += fmt::format("  {}\n", error.what());
  for (const std::string& line : format_memory_table(plan)) text += line + "\n";
  if (plan.device_total_bytes > 0 && plan.static_bytes() >= plan.device_total_bytes) {
    text += fmt::format(
        "The parameters, gradients and optimizer state alone need {}, more than the device's {}: no batch or "
        "recompute setting fits this model on one device.\n"
        "What to try: a smaller model, or several GPUs with use_distributed_optimizer: true (the optimizer state "
        "divided by the data-parallel size; sharding gradients and weights too is not implemented yet)",
        format_memory_bytes(plan.static_bytes()), format_memory_bytes(plan.device_total_bytes));
    return text;
  }
  text += "What to try:\n";
  for (const std::string& tip : memory_suggestions(plan)) text += "  - " + tip + "\n";
  text.pop_back();
  return text;
}

}  // namespace primus
