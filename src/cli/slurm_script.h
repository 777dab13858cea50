// The pure half of `primus-cli slurm`: reading its command line (srun|sbatch|node, Slurm flags, ours), merging
// the flags with the experiment's `slurm:` section, and writing the srun command and the sbatch script; also the
// helpers the per-node entry needs (Slurm host lists, `scontrol show node` output) and the reading of srun's
// failure lines. No process is started here (slurm_mode.h does that), so all of it is unit tested.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/experiment.h"

namespace primus::cli {

// What `primus-cli slurm` was asked, from the words between `slurm` and `--`.
struct SlurmArguments {
  std::string launcher = "srun";         // srun | sbatch | node (the per-node entry that srun runs on every node)
  SlurmSettings given;                   // the recognised Slurm flags; `sources` holds each as typed ("-N 2")
  std::string gpus_per_node_text;        // --gpus-per-node as given ("h100:8" keeps its type for Slurm)
  std::vector<std::string> passthrough;  // every other Slurm flag, verbatim and in order
  bool wait = false;                     // sbatch --wait / -W: wait for the job and report how it ended
  std::optional<int> nproc_per_node;     // ours: workers per node
  std::optional<int> master_port;        // ours: the rendezvous port on the first node
  bool dry_run = false;                  // global flags, also accepted after `slurm`
  bool debug = false;
};

// Parses the words after `slurm` (before `--`). Flags take `--flag=value`, `--flag value`, `-Xvalue` or
// `-X value`. Throws UsageError naming the flag: a missing or bad value, -n/--ntasks/--ntasks-per-node (one
// task per node is how the job runs), and for `node` any Slurm flag.
SlurmArguments parse_slurm_arguments(const std::vector<std::string>& words);

// The job to submit: flags win over the config's section; defaults for what neither gives.
struct SlurmJob {
  std::string launcher;  // srun | sbatch
  int64_t nodes = 1;
  std::string partition, time, job_name, account, output, error;
  std::string gpus_per_node;  // as Slurm reads it; empty: not requested
  std::optional<int> nproc_per_node;
  std::optional<int> master_port;
  std::vector<std::string> passthrough;
  bool wait = false;
  bool debug = false;
  std::vector<std::string> origins;  // "nodes 2 (from exp.yaml:4)", ... for the dry run
};

// `run_dir` is where sbatch's output goes by default (<run dir>/slurm/job-%j.out); `default_job_name` is the
// experiment's name (or "primus").
SlurmJob merge_slurm_job(const SlurmArguments& arguments, const SlurmSettings& config, const std::string& run_dir,
                         const std::string& default_job_name);

// The command each node runs: `<executable> [--debug] slurm node [--nproc-per-node N] [--master-port P] -- <command>`.
std::vector<std::string> node_entry_argv(const SlurmJob& job, const std::string& executable,
                                         const std::vector<std::string>& command);

// `srun --nodes=N --ntasks-per-node=1 --kill-on-bad-exit=1 [flags] <node entry>`, for the foreground run.
std::vector<std::string> srun_argv(const SlurmJob& job, const std::vector<std::string>& node_entry);

// The batch script: #SBATCH lines for the job, then one srun of the node entry in `workdir`, and a closing line
// that names the job's failure. `header` lines are written as comments after the shebang.
std::string sbatch_script(const SlurmJob& job, const std::vector<std::string>& node_entry, const std::string& workdir,
                          const std::vector<std::string>& header);

// A word for a POSIX shell: unchanged when it holds only safe characters, else single-quoted.
std::string shell_quote(const std::string& word);
std::string shell_join(const std::vector<std::string>& words);

// Expands a Slurm host list as `scontrol show hostnames` does: "n[1-3,07],gpu5" -> n1 n2 n3 n07 gpu5 (leading zeros
// kept as written). Throws UsageError on an unbalanced bracket or a bad range.
std::vector<std::string> expand_hostlist(const std::string& list);

// The NodeAddr of `scontrol show node` output; empty when absent.
std::string parse_node_addr(const std::string& scontrol_output);

// sbatch's output path with %j (job id), %x (job name) and %% replaced; nullopt when another pattern remains
// (%N, %t, ...: per node or task, not one file).
std::optional<std::string> resolve_output_path(const std::string& pattern, const std::string& job_id,
                                               const std::string& job_name);

// A task that srun reported as failed ("srun: error: n2: task 1: Exited with exit code 2").
struct SrunFailure {
  std::string node;
  std::string tasks;   // "1" or "0-1"
  std::string how;     // "exited with code 2", "was killed", "was terminated"
  int exit_code = -1;  // -1 when it ended by a signal
};

// The task that failed first, as far as srun's lines tell: the first with an exit code other than 128+SIGTERM,
// 128+SIGKILL or 128+SIGINT (those were stopped because another task failed), else the first reported.
std::optional<SrunFailure> find_failed_task(const std::string& srun_stderr);

}  // namespace primus::cli
