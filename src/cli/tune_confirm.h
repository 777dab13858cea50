// `primus-cli tune --confirm K`: the top K layouts of the projection timed for real, each a short `benchmark train`
// of this binary on this machine's GPUs (`primus-cli direct --nproc-per-node G -- benchmark train ...` in a child
// process, so that one candidate's out-of-memory or crash cannot end the search).
#pragma once

#include <string>
#include <vector>

namespace primus::cli {

struct ConfirmRun {
  bool ok = false;
  double tokens_per_s_per_gpu = 0.0;  // the job's tokens/s over its ranks
  double step_ms = 0.0;
  std::string failure;  // why not ok: the run's exit and its last error line
};

// Runs `benchmark train --config config_path <overrides> --warmup W --steps S` over `ranks` local ranks (1: in one
// process without the launcher) and reads the JSON line it prints last.
ConfirmRun confirm_layout(const std::string& config_path, const std::vector<std::string>& overrides, int ranks,
                          int warmup_steps, int timed_steps);

}  // namespace primus::cli
