// Pieces shared by the tests that fork CPU ranks over Gloo and compare a parallel layout with one rank: joining the
// world of a forked rank, and cutting a whole parameter into the tensor-parallel slice a ParamSpec describes.
#pragma once

#include <chrono>
#include <memory>

#include "core/tensor.h"
#include "ops/param_store.h"
#include "parallel/distributed_env.h"

namespace primus::testing {

// Rank `rank` of a world of `size` forked processes on this host (Gloo over loopback, rank 0's store at `port`),
// every wait bounded by `timeout`.
inline std::shared_ptr<Communicator> join_cpu_world(int rank, int size, int port, std::chrono::seconds timeout) {
  DistributedEnv env;
  env.rank = rank;
  env.world_size = size;
  env.local_rank = rank;
  env.local_world_size = size;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return make_world_communicator(env, kCpuDevice, DistributedTimeout(timeout));
}

// The part of `whole` ([rows, cols] or [n], f32 on the host) that `spec` describes (its tensor-parallel slice).
inline Tensor slice_of(const Tensor& whole, const ParamSpec& spec) {
  if (!spec.slice.sliced()) return whole;
  Tensor part = Tensor::empty(spec.shape, DType::kF32);
  const int64_t rows = spec.shape[0], cols = spec.shape[1], whole_cols = whole.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t wr = spec.slice.dim == 0 ? spec.slice.offset + r : r;
      const int64_t wc = spec.slice.dim == 1 ? spec.slice.offset + c : c;
      part.f32()[r * cols + c] = whole.f32()[wr * whole_cols + wc];
    }
  }
  return part;
}

}  // namespace primus::testing
