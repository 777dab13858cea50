// `primus-cli slurm srun|sbatch [Slurm flags] -- <command>`: runs the command on Slurm nodes, one task per node,
// each task `primus-cli slurm node -- <command>`, which derives this node's part of the job from Slurm's variables
// and starts the direct launcher's workers (worker_pool.h). Argument parsing and script writing are pure and
// live in slurm_script.h; this file starts srun, sbatch and scontrol.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli/launch_layout.h"
#include "cli/slurm_script.h"

namespace primus::cli {

// The experiment a command names (`--config FILE` and its overrides), when it names one.
struct CommandExperiment {
  std::string config_path;
  std::vector<std::string> overrides;  // as typed; normalised when the config is loaded
};

// srun: runs the job in the foreground and returns its exit code (0; the failing task's 2 or 3, else 3; 128+N
// when the launcher was stopped by signal N), after naming the node and task that failed.
// sbatch: writes the batch script into <run dir>/slurm/ and submits it, printing the job id; with --wait, waits
// and reports as srun does. Dry run: prints the srun command or the script and submits nothing.
// Throws UsageError (bad flags or config: exit 2) and RuntimeError (srun/sbatch missing or failing: exit 3).
int run_slurm_job(const LaunchOptions& launch, const SlurmArguments& arguments, const std::vector<std::string>& command,
                  const std::optional<CommandExperiment>& experiment);

// The per-node entry: this node's launch from SLURM_NNODES, SLURM_NODEID and the first host of the step's nodes
// (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST; expanded by `scontrol show hostnames`, its address from
// `scontrol show node`), with the
// port and workers per node of `arguments`. Throws UsageError outside a Slurm job or when a preset MASTER_ADDR
// disagrees with the first node.
// Throws NodeStopped when the step's SIGTERM/SIGINT arrives while it asks scontrol (a job cancelled before this
// node started its workers): no worker is started then.
LaunchRequest slurm_node_request(const SlurmArguments& arguments);

// A stop signal reached the node entry before it started the workers; the exit code is 128+N.
class NodeStopped : public Error {
 public:
  explicit NodeStopped(int signal_number)
      : Error(128 + signal_number, fmt::format("slurm node: stopped by signal {} before the workers started; none was "
                                               "started",
                                               signal_number)) {}
};

}  // namespace primus::cli
