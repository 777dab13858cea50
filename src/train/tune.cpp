#include "train/tune.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "config/config.h"
#include "core/error.h"

namespace primus {

namespace {

std::vector<int64_t> powers_of_two_up_to(int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t v = 1; v <= limit; v *= 2) out.push_back(v);
  return out;
}

std::string key(const char* name, int64_t value) { return fmt::format("{}={}", name, value); }
std::string key(const char* name, bool value) { return fmt::format("{}={}", name, value ? "true" : "false"); }

// Every layout of the search (tune.h) for `model` on `world` ranks, as overrides; the checks come later.
struct Layout {
  std::vector<std::string> overrides;
  std::string summary;  // "tp 2, pp 1, cp 1, mbs 4, recompute none"
};

std::vector<Layout> enumerate_layouts(const ModelArgs& model, const TrainingArgs& t, int world,
                                                        int gpus_per_node) {
  std::vector<Layout> layouts;
  // Recompute is searched when the config leaves it unset (an override cannot unset it again); else it stays.
  const std::vector<std::string> recompute_choices =
      t.recompute_granularity.empty() ? std::vector<std::string>{"none", "selective", "full"}
                                      : std::vector<std::string>{t.recompute_granularity};
  const std::vector<int64_t> experts =
      model.num_experts > 0 ? powers_of_two_up_to(model.num_experts) : std::vector<int64_t>{1};
  for (const int64_t tp : powers_of_two_up_to(std::min<int64_t>(8, gpus_per_node))) {
    for (const int64_t pp : powers_of_two_up_to(world / tp)) {
      // Layers the stages do not share evenly: the middle stages take ceil(L / pp) each and the first and last the
      // rest (lighter, as they also hold the embedding and the output layer: Megatron's uneven split).
      std::vector<std::string> split;
      if (model.num_layers % pp != 0) {
        const int64_t middle = (model.num_layers + pp - 1) / pp, rest = model.num_layers - (pp - 2) * middle;
        if (rest < 2) continue;
        split = {key("decoder_first_pipeline_num_layers", rest / 2),
                 key("decoder_last_pipeline_num_layers", rest - rest / 2)};
      }
      // Without interleaving, and with two virtual stages a rank where an even stage's layers split in two.
      std::vector<int64_t> virtual_layers = {0};
      if (pp > 1 && model.num_layers % (2 * pp) == 0) virtual_layers.push_back(model.num_layers / (2 * pp));
      for (const int64_t vl : virtual_layers) {
        for (const int64_t cp : powers_of_two_up_to(std::min<int64_t>(8, world / (tp * pp)))) {
          const int64_t dp = world / (tp * pp * cp);
          for (const int64_t ep : experts) {
            if (ep > dp * cp) break;
            for (const int64_t mbs : powers_of_two_up_to(std::min<int64_t>(8, t.global_batch_size / dp))) {
              for (const std::string& recompute : recompute_choices) {
                std::vector<std::string> o = {key("tensor_model_parallel_size", tp),
                                              key("sequence_parallel", tp > 1),
                                              key("pipeline_model_parallel_size", pp),
                                              key("context_parallel_size", cp),
                                              key("micro_batch_size", mbs)};
                if (recompute != "none") o.push_back("recompute_granularity=" + recompute);
                if (vl > 0) o.push_back(key("num_layers_per_virtual_pipeline_stage", vl));
                o.insert(o.end(), split.begin(), split.end());
                if (model.num_experts > 0) o.push_back(key("expert_model_parallel_size", ep));
                if (dp * cp > 1) {
                  for (const char* name : {"use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"}) {
                    o.push_back(key(name, true));
                  }
                }
                std::string summary = fmt::format("tp {}, pp {}{}{}, cp {}, ", tp, pp,
                                                  vl > 0 ? fmt::format(" (v {})", model.num_layers / (pp * vl)) : "",
                                                  split.empty() ? "" : " (uneven)", cp);
                if (model.num_experts > 0) summary += fmt::format("ep {}, ", ep);
                summary += fmt::format("dp {}, mbs {}, recompute {}", dp, mbs, recompute);
                layouts.push_back({std::move(o), std::move(summary)});
              }
            }
          }
        }
      }
    }
  }
  return layouts;
}

}  // namespace

TuneResult tune_layouts(const std::string& config_path, const std::vector<std::string>& overrides,
                        const GpuModel& gpu, const ClusterShape& cluster) {
  // Each candidate resolves as every rank of the job would (torchrun's WORLD_SIZE gives the data-parallel size).
  setenv("WORLD_SIZE", std::to_string(cluster.world()).c_str(), 1);
  const LoadedConfig given = load_experiment_config(config_path, overrides);
  TuneResult result;
  for (Layout& layout :
       enumerate_layouts(given.config.model, given.config.train, cluster.world(), cluster.gpus_per_node)) {
    ++result.tried;
    std::vector<std::string> all = overrides;
    all.insert(all.end(), layout.overrides.begin(), layout.overrides.end());
    TuneCandidate c;
    try {
      const LoadedConfig loaded = load_experiment_config(config_path, all);
      const MemoryProjection memory = project_memory(loaded.config, gpu, cluster.world());
      c.verdict = memory.verdict;
      for (const MemoryPlan& stage : memory.stages) c.memory_bytes = std::max(c.memory_bytes, stage.total_bytes());
      if (c.verdict != MemoryVerdict::kFits) {
        ++result.too_big;
        continue;
      }
      c.performance = project_performance(loaded.config, gpu, cluster);
    } catch (const UsageError& e) {
      if (result.invalid++ == 0) result.first_invalid = e.what();
      continue;
    }
    c.overrides = std::move(layout.overrides);
    c.summary = std::move(layout.summary);
    result.ranked.push_back(std::move(c));
  }
  // Fastest first; among equally fast ones (the projection often cannot tell micro-batch sizes apart) the fewest
  // model-parallel ranks, then the least memory.
  auto model_parallel = [](const TuneCandidate& c) { return c.performance.model_parallel_ranks; };
  std::stable_sort(result.ranked.begin(), result.ranked.end(), [&](const TuneCandidate& a, const TuneCandidate& b) {
    const double ta = a.performance.tokens_per_s_per_gpu, tb = b.performance.tokens_per_s_per_gpu;
    if (std::abs(ta - tb) > 1e-6 * std::max(ta, tb)) return ta > tb;
    if (model_parallel(a) != model_parallel(b)) return model_parallel(a) < model_parallel(b);
    return a.memory_bytes < b.memory_bytes;
  });
  return result;
}

std::string format_tune_result(const TuneResult& r, const GpuModel& gpu, const ClusterShape& cluster, int rows) {
  std::string text = fmt::format(
      "{} layouts on {} node(s) x {} {}: {} fit, {} do not fit the memory (AT-RISK or OOM), {} refused by the "
      "checks{}\n",
      r.tried, cluster.nnodes, cluster.gpus_per_node, gpu.name, r.ranked.size(), r.too_big, r.invalid,
      r.invalid > 0 ? fmt::format(" (the first: {})", r.first_invalid) : "");
  if (r.ranked.empty()) {
    return text + "No layout fits: try more GPUs, a shorter seq_length or a smaller global_batch_size.\n";
  }
  text += fmt::format("  {:>4}  {:>12}  {:>9}  {:>5}  {:>10}  {}\n", "rank", "tokens/s/GPU", "step ms", "MFU",
                      "memory", "layout");
  for (int i = 0; i < std::min<int>(rows, static_cast<int>(r.ranked.size())); ++i) {
    const TuneCandidate& c = r.ranked[static_cast<size_t>(i)];
    text += fmt::format("  {:>4}  {:>12.0f}  {:>9.1f}  {:>5.3f}  {:>10}  {}\n", i + 1,
                        c.performance.tokens_per_s_per_gpu, c.performance.step_ms, c.performance.mfu,
                        format_memory_bytes(c.memory_bytes), c.summary);
  }
  return text;
}

std::string format_overrides_yaml(const std::vector<std::string>& overrides) {
  std::string text;
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    text += fmt::format("  {}: {}\n", o.substr(0, eq), o.substr(eq + 1));
  }
  return text;
}

}  // namespace primus
