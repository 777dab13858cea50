// The layout of a multi-process `primus-cli direct` launch: how many workers this node starts and the
// torchrun environment contract each of them gets (RANK, WORLD_SIZE, LOCAL_RANK, ... as Primus's scripts and
// torchrun set them). Resolution only; starting and watching the processes is worker_pool.h.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace primus::cli {

// The launch flags as given on the command line; unset ones come from the environment, then the defaults.
struct LaunchRequest {
  std::optional<int> nproc_per_node;
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;

  bool any_given() const { return nproc_per_node || nnodes || node_rank || master_addr || master_port; }
};

// This node's share of the job, validated (1 <= nproc_per_node, 0 <= node_rank < nnodes, port in 1..65535).
struct LaunchLayout {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // False only for the plain single-process run of today: one worker on one node and no launch flag given.
  // Then the command runs in this process instead of in a worker.
  bool multi_process = false;

  int world_size() const { return nnodes * nproc_per_node; }
  int global_rank(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
};

// The value of `PRIMUS_LAUNCHED=1` marks a worker: it runs its command itself and never launches again.
constexpr const char* kLaunchedVariable = "PRIMUS_LAUNCHED";
bool is_launched_worker();

// GPUs this process may use: the entries of CUDA_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES when one is set, else
// the /dev/nvidia<N> device files; 0 when none is found.
int visible_gpu_count();

// Combines the flags, the environment (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT) and the defaults (one
// worker per visible GPU, else 1; 1 node; rank 0; 127.0.0.1:29500). `uses_devices` is false for commands that
// neither train nor benchmark (config, data, report): they get one in-process run unless a launch flag asks
// for workers, because N copies of `data preprocess` would write the same files. Throws UsageError naming the
// flag or the environment variable; logs a warning when a preset visible-devices list disagrees with N.
LaunchLayout resolve_launch_layout(const LaunchRequest& request, bool uses_devices);

// The variables set for one worker, in a stable order: the torchrun contract plus PRIMUS_LAUNCHED=1.
std::vector<std::pair<std::string, std::string>> worker_environment(const LaunchLayout& layout, int local_rank);

// The --dry-run report of the workers this node would start, printed to stdout after the command's own report.
void print_launch_plan(const LaunchLayout& layout, const std::vector<std::string>& worker_argv);

}  // namespace primus::cli
