#include "train/fp8_training.h"

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "layers/fp8_linear.h"
#include "parallel/gather_text.h"

namespace primus {

int64_t transformer_layer_index(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::stoll(name.substr(prefix.size()));
}

namespace {

// The name of a module's input in the delayed recipe's state: q, k and v_proj read one input (Attention passes them
// one LinearSaved), so they share q_proj's, as they share its codes.
std::string input_name(const std::string& module) {
  for (const std::string suffix : {".self_attn.k_proj", ".self_attn.v_proj"}) {
    if (module.ends_with(suffix)) return module.substr(0, module.size() - suffix.size()) + ".self_attn.q_proj.input";
  }
  return module + ".input";
}

}  // namespace

bool in_fp8_layer(const std::string& name, int64_t num_layers, const TrainingArgs& t) {
  const int64_t layer = transformer_layer_index(name);
  const int64_t bf16_start = t.first_last_layers_bf16 ? t.num_layers_at_start_in_bf16 : 0;
  const int64_t bf16_end = t.first_last_layers_bf16 ? t.num_layers_at_end_in_bf16 : 0;
  return layer >= bf16_start && layer < num_layers - bf16_end;
}

Fp8Recipe fp8_recipe(const TrainingArgs& t) {
  Fp8Recipe r;
  r.scaling = t.fp8_recipe == "tensorwise" ? Fp8Recipe::Scaling::kTensorwise
              : t.fp8_recipe == "blockwise" ? Fp8Recipe::Scaling::kBlockwise
                                            : Fp8Recipe::Scaling::kDelayed;
  r.forward_format = Fp8Format::kE4M3;
  r.backward_format = t.fp8_format == "hybrid" ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  r.margin = static_cast<int>(t.fp8_margin);
  r.amax_history_len = t.fp8_amax_history_len;
  r.amax_algo = t.fp8_amax_compute_algo == "max" ? Fp8AmaxAlgo::kMax : Fp8AmaxAlgo::kMostRecent;
  return r;
}

std::string fp8_layout_refusal(const TrainingArgs& t) {
  if (t.fp8_format.empty()) return "";
  // Pipeline stages hold whole layers, so each quantises its own tensors as one rank would; expert parallelism splits
  // only the routed experts, which stay in the compute dtype. Under tensor and context parallelism a tensor's slices
  // or rows lie on several ranks, whose amaxes are combined: the delayed recipe's at the step's end (DataParallel,
  // over dp × cp and tp), tensorwise's at each quantisation (enable_fp8), so every rank scales with the whole
  // tensor's, as one rank does. Blockwise tiles would have to line up with the ranks' parts: not checked yet. FSDP
  // rebinds the modules fp8 replaces.
  for (const auto& [size, key] : {std::pair{t.tensor_model_parallel_size, "tensor_model_parallel_size"},
                                  std::pair{t.context_parallel_size, "context_parallel_size"}}) {
    if (size > 1 && t.fp8_recipe == "blockwise") {
      return fmt::format("fp8_recipe blockwise with {} {}: its tiles are not yet checked to line up with each rank's "
                         "part of a tensor; use fp8_recipe: tensorwise or delayed, or {}: 1",
                         key, size, key);
    }
  }
  if (t.use_megatron_fsdp) {
    return fmt::format("fp8_format {} with use_megatron_fsdp: fp8 does not run under FSDP yet; use "
                       "use_distributed_optimizer instead or leave fp8_format unset",
                       t.fp8_format);
  }
  return "";
}

std::shared_ptr<Fp8Scaling> enable_fp8(Model& model, const TrainingArgs& t, Device device,
                                       const ProcessGroups& groups) {
  if (t.fp8_format.empty()) return nullptr;
  if (const std::string why = fp8_layout_refusal(t); !why.empty()) throw UsageError("[config] " + why);
  auto scaling = std::make_shared<Fp8Scaling>(fp8_recipe(t), device);
  std::vector<TensorParallelGroup> split_over;  // the groups over which a tensor's parts lie
  for (const std::shared_ptr<Communicator>& group : {groups.tp, groups.cp}) {
    if (group != nullptr && group->size() > 1) split_over.emplace_back(group);
  }
  scaling->combine_current_amaxes_over(std::move(split_over));
  const int64_t layers = model.args().num_layers;
  int64_t fp8_modules = 0, kept = 0;
  model.for_each_linear([&](const std::string& name, std::unique_ptr<Linear>& slot) {
    // Multi-token prediction's modules (layers num_layers and above) stay in the compute dtype with the output layer.
    if (!in_fp8_layer(name, layers, t)) {
      ++kept;
      return;
    }
    slot = std::make_unique<Fp8Linear>(*slot, scaling, name, input_name(name));
    ++fp8_modules;
  });
  spdlog::info("fp8: {} recipe, {} forward / {} gradients; {} Linear modules on fp8 GEMMs, {} kept in {}{}",
               t.fp8_recipe, fp8_format_name(scaling->recipe().forward_format),
               fp8_format_name(scaling->recipe().backward_format), fp8_modules, kept, t.bf16 ? "bf16" : "fp32",
               t.first_last_layers_bf16 ? fmt::format(" (first {}, last {} layers)", t.num_layers_at_start_in_bf16,
                                                        t.num_layers_at_end_in_bf16)
                                          : "");
  return scaling;
}

void restore_fp8_scaling(Fp8Scaling* scaling, const std::vector<Fp8ScalingRecord>& records, bool resumed,
                         bool whole_model) {
  const bool keeps_state = scaling != nullptr && scaling->tensor_count() > 0;
  if (!records.empty() && !keeps_state) {
    spdlog::info("fp8: the checkpoint's delayed-scaling state ({} tensors) is not used: this run {}", records.size(),
                 scaling == nullptr ? "has fp8 off" : "scales currently (no state)");
    return;
  }
  if (!keeps_state) return;
  if (records.empty()) {
    if (resumed) spdlog::info("fp8: the checkpoint has no delayed-scaling state; the scales start at 1");
    return;
  }
  // A pipeline stage (not `whole_model`) finds its own tensors' records among every stage's.
  scaling->restore(records, /*others_allowed=*/!whole_model);
  spdlog::info("fp8: delayed-scaling state of {} tensors restored from the checkpoint", scaling->tensor_count());
}

std::vector<Fp8ScalingRecord> fp8_records_of_all_stages(const Fp8Scaling& scaling, Communicator& pp) {
  if (pp.size() == 1) return scaling.records();
  std::vector<Fp8ScalingRecord> all;
  for (const std::string& text : all_gather_text(pp, fp8_scaling_text(scaling.records()))) {
    for (Fp8ScalingRecord& r : parse_fp8_scaling(text, "a pipeline stage's fp8 scaling state")) {
      all.push_back(std::move(r));
    }
  }
  return all;
}

void fp8_end_step(Fp8Scaling* scaling, DataParallel& dp) {
  if (scaling == nullptr) return;
  scaling->end_step([&dp](Tensor& amaxes) { dp.max_in_place(amaxes); });
}

}  // namespace primus
