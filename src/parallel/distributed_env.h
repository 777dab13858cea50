// This process's place in a multi-process job, from torchrun's environment contract as `primus-cli direct`,
// torchrun and Slurm-launched Primus scripts set it: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT (and NNODES / NODE_RANK as Primus's scripts export them). With none of them set
// the process is a world of one.
#pragma once

#include <cstdint>
#include <string>

#include "ops/communicator.h"

namespace primus {

struct DistributedEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  bool is_multi_process() const { return world_size > 1; }
  // Reads the variables above; throws UsageError naming the variable for a value that is not a number, out
  // of range (RANK >= WORLD_SIZE, ...) or inconsistent, or when WORLD_SIZE > 1 without MASTER_ADDR/PORT.
  static DistributedEnv from_environment();
};

class Store;

// The world communicator of this process: Gloo over TCP for CPU ranks, NCCL for a CUDA device, after a
// rendezvous through a TCP store served by rank 0 at MASTER_ADDR:MASTER_PORT. A world of one needs no
// rendezvous. Every wait fails after `timeout` naming the ranks or the key it waited for.
std::unique_ptr<Communicator> make_world_communicator(const DistributedEnv& env, Device device,
                                                      DistributedTimeout timeout);

}  // namespace primus
