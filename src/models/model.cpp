#include "models/model.h"

#include <algorithm>

#include "models/llama.h"

namespace primus {

namespace {

std::unique_ptr<Model> make_llama(const ModelArgs& args, int64_t max_seq_length, Device device, DType compute_dtype,
                                  const ModelParallel& parallel) {
  return std::make_unique<LlamaModel>(args, max_seq_length, device, compute_dtype, parallel);
}

// Llama and Qwen3 differ only in what the shape keys already say (q/k norms, head_dim, tied head), and their MoE
// variants Mixtral and Qwen3-MoE in the MoE keys (num_experts ...) and parameter names, DeepSeek-V2/V3 in its
// attention (multi_latent_attention): one class.
constexpr ModelFamily kFamilies[] = {
    {"llama", &LlamaModel::param_specs, &LlamaModel::matmul_params, &LlamaModel::flops_per_token, &make_llama},
    {"qwen3", &LlamaModel::param_specs, &LlamaModel::matmul_params, &LlamaModel::flops_per_token, &make_llama},
    {"mixtral", &LlamaModel::param_specs, &LlamaModel::matmul_params, &LlamaModel::flops_per_token, &make_llama},
    {"qwen3_moe", &LlamaModel::param_specs, &LlamaModel::matmul_params, &LlamaModel::flops_per_token, &make_llama},
    {"deepseek_v2", &LlamaModel::param_specs, &LlamaModel::matmul_params, &LlamaModel::flops_per_token, &make_llama},
};

}  // namespace

std::string_view model_family_name(const ModelArgs& args) {
  if (args.multi_latent_attention) return "deepseek_v2";  // DeepSeek-V2 and V3, dense or MoE
  if (args.num_experts > 0) return args.qk_layernorm ? "qwen3_moe" : "mixtral";
  return args.qk_layernorm ? "qwen3" : "llama";
}

const ModelFamily& find_model_family(std::string_view name) {
  std::string known;
  for (const ModelFamily& family : kFamilies) {
    if (family.name == name) return family;
    known += fmt::format("{}{}", known.empty() ? "" : ", ", family.name);
  }
  throw UsageError(fmt::format("[model] unknown model family \"{}\" (known: {})", name, known));
}

std::unique_ptr<Model> make_model(const ModelArgs& args, int64_t max_seq_length, Device device, DType compute_dtype,
                                  const ModelParallel& parallel) {
  return model_family(args).make(args, max_seq_length, device, compute_dtype, parallel);
}

ModelArgs tensor_parallel_shapes(const ModelArgs& args, int tp) {
  ModelArgs part = args;
  part.num_attention_heads /= tp;
  part.num_query_groups = std::max<int64_t>(1, part.num_query_groups / tp);  // replicated when fewer than tp
  part.ffn_hidden_size /= tp;
  part.vocab_size /= tp;
  return part;
}

int64_t counted_tokens(const Tensor& host_labels) {
  const int32_t* labels = host_labels.i32();
  int64_t counted = 0;
  for (int64_t k = 0; k < host_labels.numel(); ++k) counted += labels[k] >= 0;
  return counted;
}

RecomputeConfig RecomputeConfig::from(const TrainingArgs& t) {
  RecomputeConfig r;
  if (t.recompute_granularity == "full") {
    r.granularity = Granularity::kFull;
    r.block = t.recompute_method == "block";
    r.num_layers = std::max<int64_t>(1, t.recompute_num_layers);
  } else if (t.recompute_granularity == "selective") {
    r.granularity = Granularity::kSelective;
  }
  return r;
}

std::pair<int64_t, int64_t> RecomputeConfig::chunk(int64_t i, int64_t layers) const {
  if (granularity != Granularity::kFull) return {i, i};
  const int64_t n = std::max<int64_t>(1, num_layers);
  if (block) return i < n ? std::pair{i, i + 1} : std::pair{i, i};
  const int64_t first = i / n * n;
  return {first, std::min(first + n, layers)};
}

}  // namespace primus
