// `primus-cli tune`: the layouts a config could train with on a cluster, each checked as a job would check it,
// planned for memory (a hard limit: only FITS counts) and ranked by projected tokens/s per GPU.
//
// The search: tensor_model_parallel_size 1, 2, 4, 8 (within a node; sequence_parallel with it), pipeline stages in
// powers of two (with and without two virtual stages a rank; where the layers do not split evenly, the middle
// stages take ceil(layers / pp) and the first and last share the rest), context_parallel_size 1, 2, 4, 8,
// expert_model_parallel_size over the powers of two dividing the experts, micro_batch_size 1, 2, 4, 8, and
// recompute none, selective or full; the data-parallel size is what the world leaves, with the distributed
// optimizer and overlapped gradient reduction and weight gathering whenever it is above one. The global batch, the
// sequence length and everything else stay as the config has them; recompute is searched only when the config leaves
// it unset. FSDP is not searched.
#pragma once

#include <string>
#include <vector>

#include "train/projection.h"
#include "train/step_projection.h"

namespace primus {

struct TuneCandidate {
  std::vector<std::string> overrides;  // key=value, in the config's key names
  std::string summary;                 // "tp 2, pp 1, cp 1, dp 4, mbs 2, recompute none"
  PerformanceProjection performance;
  int64_t memory_bytes = 0;            // the fullest stage's per-GPU total
  MemoryVerdict verdict = MemoryVerdict::kFits;
};

struct TuneResult {
  std::vector<TuneCandidate> ranked;  // the candidates that fit, fastest first
  int64_t tried = 0;                  // layouts enumerated
  int64_t invalid = 0;                // refused by the config's or the layout's checks (a job would exit 2)
  int64_t too_big = 0;                // valid, but AT-RISK or OOM
  std::string first_invalid;          // the first refusal's message, to show what limits the search
};

// `overrides` are the user's (kept under every candidate's own). Loads the config once per candidate with WORLD_SIZE
// set to the cluster's; a config that does not load even as given throws its UsageError.
TuneResult tune_layouts(const std::string& config_path, const std::vector<std::string>& overrides,
                        const GpuModel& gpu, const ClusterShape& cluster);

// What was searched and the top `rows` candidates as a table.
std::string format_tune_result(const TuneResult& result, const GpuModel& gpu, const ClusterShape& cluster, int rows);
// A candidate's overrides as YAML lines to paste under the module's overrides ("  key: value").
std::string format_overrides_yaml(const std::vector<std::string>& overrides);

}  // namespace primus
