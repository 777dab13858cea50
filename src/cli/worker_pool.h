// The worker processes of a multi-process `primus-cli direct` launch: start one per local rank, relay their
// output, end them together when one fails, forward stop signals. Layout and environment: launch_layout.h.
#pragma once

#include <string>
#include <vector>

#include "cli/launch_layout.h"

namespace primus::cli {

struct WorkerPoolOptions {
  LaunchLayout layout;
  std::string executable = "/proc/self/exe";  // the binary each worker runs: this one
  std::vector<std::string> argv;              // argv of every worker, argv[0] included
  std::string log_file;                       // lines shown on the console are appended here too; empty: none
  // A failure stop sends SIGTERM, then SIGKILL to ranks still running this much later. Short, because the
  // survivors of a dead rank usually wait on it inside a collective and cannot finish a checkpoint anyway.
  double failure_grace_s = 10;
  // False under Slurm: slurmstepd signals every process of the step itself (scancel, the time limit), and a
  // second copy from us would make the trainer exit without its checkpoint.
  bool forward_stop_signals = true;
  // True on the other nodes of a Slurm job, whose consoles srun merges: local rank 0 is shown like the other
  // ranks (errors and warnings only), so the job's output is node 0's.
  bool alerts_only = false;
};

// Starts the workers and returns when all have ended, with the exit code for the launcher:
//   0     every rank exited 0;
//   2, 3  the first failing rank's code when it is 2 or 3, else 3 (another code, a signal), after stopping
//         the others; the error names the rank, its pid, how it ended and its last lines;
//   128+N SIGINT/SIGTERM reached the launcher first; it was forwarded to every rank once, and a second
//         signal killed them (SIGKILL).
// Console: local rank 0's stdout and stderr as they are; other ranks' error and warning lines prefixed
// "[rank K] ". Throws RuntimeError when a worker cannot be started (after killing those that were).
int run_worker_pool(const WorkerPoolOptions& options);

}  // namespace primus::cli
