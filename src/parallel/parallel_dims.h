// ParallelDims: how the world's ranks split into tensor, context, data and pipeline parallel groups, how the
// model splits over them (heads, key/value heads, the layers of each pipeline stage), validated once against the
// world size and the model; and the process groups built from it. Model code never reads ranks; parallel wrappers
// receive groups.
//
// Rank order is Megatron-LM's default (order "tp-cp-ep-dp-pp"): tensor parallel fastest, then context, then
// data, then pipeline, so the ranks of a tensor-parallel group are adjacent (one node's NVLink):
//   rank = tp_rank + tp · (cp_rank + cp · (dp_rank + dp · pp_rank))
// 8 ranks at tp 2 × pp 2 × dp 2 (cp 1):
//   rank     0 1 2 3 4 5 6 7
//   tp_rank  0 1 0 1 0 1 0 1     tp groups {0,1} {2,3} {4,5} {6,7}
//   dp_rank  0 0 1 1 0 0 1 1     dp groups {0,2} {1,3} {4,6} {5,7}
//   pp_rank  0 0 0 0 1 1 1 1     pp groups {0,4} {1,5} {2,6} {3,7} (also the embedding groups at pp 2)
// Expert parallelism subdivides dp × cp for the experts only (Megatron's default: ep fastest inside it). Number the
// ranks of a dp × cp group by i = cp_rank + cp · dp_rank; then ep_rank = i % ep, and
//   ep group (the ranks that exchange tokens, each holding num_experts / ep experts): consecutive i, ⌊i / ep⌋ equal;
//   expert-data-parallel group (the ranks holding the same experts, which reduce their gradients): i % ep equal.
// 4 ranks at dp 4, ep 2: ep groups {0,1} {2,3}; expert-data-parallel groups {0,2} {1,3}.
//
// Where the checks live, each once: config/resolve.cpp (check_parallel_keys) refuses combinations of the parallel
// keys among themselves and what is not implemented yet, when the config loads; ParallelDims::make checks what
// needs the world size or the model's shape (divisibility of heads, groups, ffn, vocabulary, layers, sequence).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/communicator.h"

namespace primus {

// The parallel keys as the config gives them (0: unset).
struct ParallelSizes {
  int tp = 1;                            // tensor_model_parallel_size
  int pp = 1;                            // pipeline_model_parallel_size
  int cp = 1;                            // context_parallel_size
  int ep = 1;                            // expert_model_parallel_size (inside dp × cp)
  bool sequence_parallel = false;        // sequence_parallel (the config requires tp > 1)
  int64_t layers_per_virtual_stage = 0;  // num_layers_per_virtual_pipeline_stage
  int64_t virtual_stages = 0;            // num_virtual_stages_per_pipeline_rank (exclusive with the one above)
  int64_t first_stage_layers = 0;        // decoder_first_pipeline_num_layers
  int64_t last_stage_layers = 0;         // decoder_last_pipeline_num_layers
};

// What validation needs of the model. vocab_size is the padded one (resolve_vocab pads the tokenizer's to a
// multiple of make_vocab_size_divisible_by × tp, as Megatron; a vocab_size given in the config is taken as is).
struct ParallelModelShape {
  int64_t num_attention_heads = 1;
  int64_t num_query_groups = 1;
  int64_t ffn_hidden_size = 1;
  int64_t vocab_size = 1;
  int64_t num_layers = 1;
  int64_t seq_length = 1;
  int64_t micro_batch_size = 1;  // with seq_length / cp: the rows sequence parallelism splits over tp
  int64_t num_experts = 0;       // routed experts per MoE layer; 0: a dense model
};

// Transformer layers [begin, end).
struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const LayerRange&) const = default;
};

struct PipelineSplit {
  int64_t num_layers = 1;
  int pp = 1;
  int vpp = 1;                     // model chunks (virtual stages) per pipeline stage; 1: no interleaving
  int64_t first_stage_layers = 0;  // decoder_first_pipeline_num_layers; 0: the first stage is split like the middle
  int64_t last_stage_layers = 0;   // decoder_last_pipeline_num_layers; 0: likewise
};

// Which layers each pipeline stage owns, Megatron's interleaved assignment: entry v·pp + s is chunk v of stage s,
// and the entries in order cover [0, num_layers) back to back, i.e. chunk v of stage s holds the (v·pp + s)-th
// group of layers. Stage s holds L_s layers (the first/last stage overrides where given, the remaining layers
// evenly over the other stages); each of its chunks holds L_s / vpp. Without interleaving (vpp 1) entry s is stage
// s. Throws UsageError naming the keys, by Megatron's rules, when: the even split does not divide (num_layers by
// pp, or a stage's layers by vpp), the overrides leave layers without a middle stage or a middle stage without
// layers, the middle layers do not split evenly, or an override is not a multiple of vpp.
std::vector<LayerRange> stage_layers(const PipelineSplit& split);

struct RankCoord {
  int tp = 0, cp = 0, dp = 0, pp = 0;
};

class ParallelDims {
 public:
  // Throws UsageError naming the keys (tensor_model_parallel_size, ...) when world_size is not tp × pp × cp × dp,
  // or the model does not split: num_attention_heads, ffn_hidden_size or the vocabulary by tp; num_query_groups by
  // tp unless there are fewer groups than tp and tp is a multiple of them (each key/value head is then replicated
  // on tp / num_query_groups ranks); the layers over the pipeline stages (stage_layers; the virtual stages from
  // num_layers_per_virtual_pipeline_stage need num_layers / pp to be a multiple of it); seq_length by 2 × cp; with
  // sequence_parallel, a micro-batch's rows on a cp rank (micro_batch_size × seq_length / cp) by tp; with
  // expert_model_parallel_size > 1: a MoE model (num_experts), whose experts ep divides, and ep dividing dp × cp.
  static ParallelDims make(int world_size, const ParallelSizes& sizes, const ParallelModelShape& model);

  int world() const { return world_; }
  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int cp() const { return cp_; }
  int ep() const { return ep_; }
  // rank's place in its ep group: it holds experts [ep_rank · num_experts / ep, (ep_rank + 1) · num_experts / ep).
  int ep_rank(int rank) const;
  // Model chunks per pipeline stage (Megatron's virtual_pipeline_model_parallel_size); 1 without interleaving.
  int vpp() const { return vpp_; }
  bool sequence_parallel() const { return sequence_parallel_; }

  // The tensor-parallel split of attention: query heads and key/value heads per tp rank, and how many tp ranks
  // hold each key/value head (1 unless num_query_groups < tp).
  int64_t heads_per_rank() const { return heads_per_rank_; }
  int64_t kv_heads_per_rank() const { return kv_heads_per_rank_; }
  int kv_head_replicas() const { return kv_head_replicas_; }

  // The layers of chunk `chunk` of stage `stage` (stage_layers of the model).
  LayerRange layers(int stage, int chunk = 0) const;
  const std::vector<LayerRange>& stage_layout() const { return stage_layout_; }

  RankCoord coord(int rank) const;
  int rank_of(const RankCoord& c) const;

  // The ranks of `rank`'s groups, ascending (so a member's index is its rank in the group's communicator; for tp,
  // cp, dp and pp that index is the rank's coordinate along the dimension):
  std::vector<int> tp_group(int rank) const;     // same cp, dp, pp
  std::vector<int> cp_group(int rank) const;     // same tp, dp, pp
  std::vector<int> dp_group(int rank) const;     // same tp, cp, pp
  std::vector<int> pp_group(int rank) const;     // same tp, cp, dp: one per stage, in stage order
  std::vector<int> dp_cp_group(int rank) const;  // same tp, pp: where gradients are reduced (= dp_group at cp 1)
  std::vector<int> model_group(int rank) const;  // same cp, dp: tp × pp, the ranks that hold one model replica's
                                                 // distinct parameters (gradient norm, NaN check)
  std::vector<int> ep_group(int rank) const;         // ep consecutive members of dp_cp_group: tokens go to experts
  std::vector<int> expert_dp_group(int rank) const;  // dp_cp_group's members with rank's ep_rank: same experts
  // The first and last stage of rank's pipeline (one rank at pp 1), which hold the embedding and the output layer
  // (tied embeddings are kept in sync over it); a middle stage's rank is alone in its own.
  std::vector<int> embedding_group(int rank) const;

  bool is_first_stage(int rank) const { return coord(rank).pp == 0; }
  bool is_last_stage(int rank) const { return coord(rank).pp == pp_ - 1; }
  // The ranks before and after `rank` in its pipeline, wrapping around as Megatron's (the interleaved schedule
  // sends from the last stage's chunk v to the first stage's chunk v + 1); `rank` itself at pp 1.
  int pipeline_prev(int rank) const;
  int pipeline_next(int rank) const;

  // "dp 4 x tp 1 x pp 1 x cp 1 = 4 ranks", for logs (with the virtual stages and sequence parallel when used).
  std::string describe() const;

 private:
  // The ranks whose coordinates equal rank's on every dimension that `varying` (a mask of kVary*) leaves out.
  std::vector<int> ranks_varying(int rank, unsigned varying) const;

  int world_ = 1;
  int tp_ = 1, pp_ = 1, cp_ = 1, dp_ = 1, vpp_ = 1, ep_ = 1;
  bool sequence_parallel_ = false;
  int64_t heads_per_rank_ = 1, kv_heads_per_rank_ = 1;
  int kv_head_replicas_ = 1;
  std::vector<LayerRange> stage_layout_;
};

// The communicators of one rank. world is the one the job started with; the others are splits of it, one for each
// kind of group in ParallelDims. A dimension of size 1 still has a (one-rank) communicator, so callers never
// branch on the layout. Kinds whose groups have the same members on every rank share one communicator (at cp 1, dp
// and dp_cp are one object; every one-rank kind shares one): a caller that runs collectives on two of them at
// once, from two threads, splits its own (as DataParallel does for its control messages).
struct ProcessGroups {
  ParallelDims dims;
  std::shared_ptr<Communicator> world;
  std::shared_ptr<Communicator> tp;
  std::shared_ptr<Communicator> cp;
  std::shared_ptr<Communicator> dp;
  std::shared_ptr<Communicator> pp;  // a rank's index in it is its stage
  std::shared_ptr<Communicator> dp_cp;
  std::shared_ptr<Communicator> model;
  std::shared_ptr<Communicator> embedding;
  std::shared_ptr<Communicator> ep;         // a rank's index in it is its ep_rank
  std::shared_ptr<Communicator> expert_dp;  // where expert gradients are reduced

  // Collective over `world`: every rank calls it with the same dims.
  static ProcessGroups build(std::shared_ptr<Communicator> world, const ParallelDims& dims);
};

}  // namespace primus
