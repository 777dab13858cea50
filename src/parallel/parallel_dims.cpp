#include "parallel/parallel_dims.h"

#include <fmt/format.h>

#include "core/error.h"

namespace primus {

ParallelDims ParallelDims::make(int world_size, const ParallelSizes& sizes, const ParallelModelShape& model) {
  PRIMUS_CHECK(world_size >= 1, "[parallel] world size {} must be >= 1", world_size);
  const int model_ranks = sizes.tp * sizes.pp * sizes.cp;
  if (sizes.tp < 1 || sizes.pp < 1 || sizes.cp < 1 || world_size % model_ranks != 0) {
    throw UsageError(fmt::format(
        "[config] tensor_model_parallel_size {} x pipeline_model_parallel_size {} x context_parallel_size {} = {} "
        "does not divide the world size (WORLD_SIZE) {}",
        sizes.tp, sizes.pp, sizes.cp, model_ranks, world_size));
  }
  if (model.num_attention_heads % sizes.tp != 0 || model.num_query_groups % sizes.tp != 0) {
    throw UsageError(fmt::format("[config] tensor_model_parallel_size {} must divide num_attention_heads {} and "
                                 "num_query_groups {}",
                                 sizes.tp, model.num_attention_heads, model.num_query_groups));
  }
  if (model.num_layers % sizes.pp != 0) {
    throw UsageError(fmt::format("[config] pipeline_model_parallel_size {} must divide num_layers {}", sizes.pp,
                                 model.num_layers));
  }
  if (sizes.cp > 1 && model.seq_length % (2 * sizes.cp) != 0) {
    throw UsageError(fmt::format("[config] seq_length {} must be divisible by 2 x context_parallel_size = {}",
                                 model.seq_length, 2 * sizes.cp));
  }
  ParallelDims d;
  d.world_ = world_size;
  d.sizes_ = sizes;
  d.dp_ = world_size / model_ranks;
  return d;
}

RankCoord ParallelDims::coord(int rank) const {
  PRIMUS_CHECK(rank >= 0 && rank < world_, "[parallel] rank {} outside a world of {}", rank, world_);
  RankCoord c;
  c.tp = rank % sizes_.tp;
  rank /= sizes_.tp;
  c.cp = rank % sizes_.cp;
  rank /= sizes_.cp;
  c.dp = rank % dp_;
  c.pp = rank / dp_;
  return c;
}

int ParallelDims::rank_of(const RankCoord& c) const {
  return c.tp + sizes_.tp * (c.cp + sizes_.cp * (c.dp + dp_ * c.pp));
}

std::vector<int> ParallelDims::dp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> ranks;
  for (c.dp = 0; c.dp < dp_; ++c.dp) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int> ParallelDims::tp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> ranks;
  for (c.tp = 0; c.tp < sizes_.tp; ++c.tp) ranks.push_back(rank_of(c));
  return ranks;
}

std::string ParallelDims::describe() const {
  return fmt::format("dp {} x tp {} x pp {} x cp {} = {} ranks", dp_, sizes_.tp, sizes_.pp, sizes_.cp, world_);
}

ProcessGroups ProcessGroups::build(std::shared_ptr<Communicator> world, const ParallelDims& dims) {
  PRIMUS_CHECK(world->size() == dims.world(), "[parallel] communicator of {} ranks for a layout of {}", world->size(),
               dims.world());
  const RankCoord c = dims.coord(world->rank());
  ProcessGroups groups;
  // A data-parallel group shares (tp, cp, pp); a tensor-parallel one shares (cp, dp, pp). The color is the
  // shared coordinates folded into one number; the key orders members along the split dimension.
  groups.dp = world->split(c.tp + dims.tp() * (c.cp + dims.cp() * c.pp), c.dp);
  groups.tp = world->split(c.cp + dims.cp() * (c.dp + dims.dp() * c.pp), c.tp);
  groups.world = std::move(world);
  return groups;
}

}  // namespace primus
