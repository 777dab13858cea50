// ParallelDims: how the world's ranks split into data, tensor, pipeline and context parallel groups, validated
// once, and the process groups built from it. Model code never reads ranks; parallel wrappers receive groups.
//
// Rank order is Megatron-LM's default (order "tp-cp-ep-dp-pp"): tensor parallel fastest, then context, then
// data, then pipeline, so the ranks of a tensor-parallel group are adjacent (one node's NVLink):
//   rank = tp_rank + tp · (cp_rank + cp · (dp_rank + dp · pp_rank))
// Expert parallelism (later) subdivides dp × cp for the experts only. Today tp = pp = cp = 1 is all the
// engine runs; the layout and its checks already take the other sizes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/communicator.h"

namespace primus {

struct ParallelSizes {
  int tp = 1;  // tensor_model_parallel_size
  int pp = 1;  // pipeline_model_parallel_size
  int cp = 1;  // context_parallel_size
};

// What validation needs of the model (divisibility of heads, groups and layers).
struct ParallelModelShape {
  int64_t num_attention_heads = 1;
  int64_t num_query_groups = 1;
  int64_t num_layers = 1;
  int64_t seq_length = 1;
};

struct RankCoord {
  int tp = 0, cp = 0, dp = 0, pp = 0;
};

class ParallelDims {
 public:
  // Throws UsageError naming the Megatron key (tensor_model_parallel_size, ...) when world_size is not
  // tp × pp × cp × dp, or the model does not divide (heads by tp, layers by pp, sequence by 2 × cp).
  static ParallelDims make(int world_size, const ParallelSizes& sizes, const ParallelModelShape& model);

  int world() const { return world_; }
  int dp() const { return dp_; }
  int tp() const { return sizes_.tp; }
  int pp() const { return sizes_.pp; }
  int cp() const { return sizes_.cp; }

  RankCoord coord(int rank) const;
  int rank_of(const RankCoord& c) const;
  // The ranks of `rank`'s data-parallel group (same tp, cp, pp coordinates), in dp order; likewise tp.
  std::vector<int> dp_group(int rank) const;
  std::vector<int> tp_group(int rank) const;
  // "dp 4 × tp 1 × pp 1 × cp 1 = 4 ranks", for logs.
  std::string describe() const;

 private:
  int world_ = 1;
  int dp_ = 1;
  ParallelSizes sizes_;
};

// The communicators of one rank. world is the one the job started with; the others are splits of it.
// A dimension of size 1 still has a (one-rank) communicator, so callers never branch on the layout.
struct ProcessGroups {
  std::shared_ptr<Communicator> world;
  std::shared_ptr<Communicator> dp;
  std::shared_ptr<Communicator> tp;

  // Collective over `world`: every rank calls it with the same dims.
  static ProcessGroups build(std::shared_ptr<Communicator> world, const ParallelDims& dims);
};

}  // namespace primus
