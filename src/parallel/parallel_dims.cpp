#include "parallel/parallel_dims.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <iterator>

#include "core/error.h"

namespace primus {

namespace {

// Dimensions a group varies along (ParallelDims::ranks_varying).
constexpr unsigned kVaryTp = 1, kVaryCp = 2, kVaryDp = 4, kVaryPp = 8;

// Each stage's layer count, by Megatron's rules for the even and the uneven split.
std::vector<int64_t> layers_per_stage(const PipelineSplit& s) {
  if (s.first_stage_layers == 0 && s.last_stage_layers == 0) {
    if (s.num_layers % s.pp != 0) {
      throw UsageError(fmt::format(
          "[config] num_layers {} is not divisible by pipeline_model_parallel_size {}; for an uneven split set "
          "decoder_first_pipeline_num_layers and/or decoder_last_pipeline_num_layers",
          s.num_layers, s.pp));
    }
    return std::vector<int64_t>(s.pp, s.num_layers / s.pp);
  }
  const int64_t first = s.first_stage_layers, last = s.last_stage_layers;
  const int middle = s.pp - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
  if (middle < 0) {
    throw UsageError(
        fmt::format("[config] decoder_first_pipeline_num_layers and decoder_last_pipeline_num_layers "
                    "are two stages but pipeline_model_parallel_size is {}",
                    s.pp));
  }
  // "decoder_first_pipeline_num_layers 2 and decoder_last_pipeline_num_layers 3", or the one given.
  std::string overrides = first > 0 ? fmt::format("decoder_first_pipeline_num_layers {}", first) : "";
  if (last > 0) {
    overrides += fmt::format("{}decoder_last_pipeline_num_layers {}", first > 0 ? " and " : "", last);
  }
  const char* plural = first > 0 && last > 0 ? "" : "s";  // "... 2 and ... 3 leave", "... 2 leaves"
  const int64_t remaining = s.num_layers - first - last;
  if (remaining < 0) {
    throw UsageError(fmt::format("[config] {} exceed{} num_layers {}", overrides, plural, s.num_layers));
  }
  if (middle == 0 && remaining > 0) {
    throw UsageError(fmt::format(
        "[config] {} leave{} {} of num_layers {} to no stage: at pipeline_model_parallel_size {} there is no other "
        "stage, so the overrides must add up to num_layers",
        overrides, plural, remaining, s.num_layers, s.pp));
  }
  if (middle > 0 && (remaining == 0 || remaining % middle != 0)) {
    throw UsageError(fmt::format(
        "[config] the {} layers that {} leave{} of num_layers {} must split evenly over the {} other stage{} of "
        "pipeline_model_parallel_size {}, at least one layer each",
        remaining, overrides, plural, s.num_layers, middle, middle == 1 ? "" : "s", s.pp));
  }
  std::vector<int64_t> stages(s.pp, middle > 0 ? remaining / middle : 0);
  if (first > 0) stages.front() = first;
  if (last > 0) stages.back() = last;
  return stages;
}

}  // namespace

std::vector<LayerRange> stage_layers(const PipelineSplit& s) {
  PRIMUS_CHECK(s.num_layers >= 1 && s.pp >= 1 && s.vpp >= 1 && s.first_stage_layers >= 0 && s.last_stage_layers >= 0,
               "[parallel] stage_layers({} layers, pp {}, vpp {}, first {}, last {})", s.num_layers, s.pp, s.vpp,
               s.first_stage_layers, s.last_stage_layers);
  const std::vector<int64_t> stages = layers_per_stage(s);
  // Each stage's layers split into vpp chunks of equal size.
  for (int stage = 0; stage < s.pp; ++stage) {
    if (stages[stage] % s.vpp == 0) continue;
    const bool first = stage == 0 && s.first_stage_layers > 0, last = stage == s.pp - 1 && s.last_stage_layers > 0;
    const std::string what = first  ? "decoder_first_pipeline_num_layers"
                             : last ? "decoder_last_pipeline_num_layers"
                             : s.first_stage_layers > 0 || s.last_stage_layers > 0
                                 ? "the layers of each of the other stages"
                                 : "the layers of each stage (num_layers / pipeline_model_parallel_size)";
    throw UsageError(fmt::format(
        "[config] {} = {} is not divisible by num_virtual_stages_per_pipeline_rank {} (each stage's layers split "
        "into that many model chunks)",
        what, stages[stage], s.vpp));
  }
  // Round v holds chunk v of every stage in stage order: num_layers / vpp layers.
  std::vector<int64_t> offset_in_round(s.pp + 1, 0);
  for (int stage = 0; stage < s.pp; ++stage)
    offset_in_round[stage + 1] = offset_in_round[stage] + stages[stage] / s.vpp;
  const int64_t round = offset_in_round[s.pp];
  std::vector<LayerRange> ranges;
  ranges.reserve(static_cast<size_t>(s.pp) * s.vpp);
  for (int chunk = 0; chunk < s.vpp; ++chunk) {
    for (int stage = 0; stage < s.pp; ++stage) {
      ranges.push_back({chunk * round + offset_in_round[stage], chunk * round + offset_in_round[stage + 1]});
    }
  }
  return ranges;
}

ParallelDims ParallelDims::make(int world_size, const ParallelSizes& sizes, const ParallelModelShape& model) {
  PRIMUS_CHECK(world_size >= 1, "[parallel] world size {} must be >= 1", world_size);
  PRIMUS_CHECK(sizes.layers_per_virtual_stage == 0 || sizes.virtual_stages == 0,
               "[parallel] num_layers_per_virtual_pipeline_stage and num_virtual_stages_per_pipeline_rank are both set "
               "(the config refuses that)");
  const int64_t model_ranks = int64_t{sizes.tp} * sizes.pp * sizes.cp;
  if (sizes.tp < 1 || sizes.pp < 1 || sizes.cp < 1 || world_size % model_ranks != 0) {
    throw UsageError(fmt::format(
        "[config] tensor_model_parallel_size {} x pipeline_model_parallel_size {} x context_parallel_size {} = {} "
        "does not divide the world size (WORLD_SIZE) {}",
        sizes.tp, sizes.pp, sizes.cp, model_ranks, world_size));
  }
  const int tp = sizes.tp;
  if (model.num_attention_heads % tp != 0) {
    throw UsageError(
        fmt::format("[config] num_attention_heads {} is not divisible by tensor_model_parallel_size {} "
                    "(each tensor-parallel rank computes whole query heads)",
                    model.num_attention_heads, tp));
  }
  const int64_t groups = model.num_query_groups;
  const bool replicated = groups < tp && tp % groups == 0;
  if (groups % tp != 0 && !replicated) {
    throw UsageError(fmt::format(
        "[config] num_query_groups {} must be a multiple of tensor_model_parallel_size {}, or divide it (fewer "
        "key/value heads than tensor-parallel ranks are replicated, tensor_model_parallel_size / num_query_groups "
        "ranks each)",
        groups, tp));
  }
  if (model.ffn_hidden_size % tp != 0) {
    throw UsageError(
        fmt::format("[config] ffn_hidden_size {} is not divisible by tensor_model_parallel_size {} (the "
                    "MLP's gate/up columns and down rows split over the tensor-parallel ranks)",
                    model.ffn_hidden_size, tp));
  }
  if (model.vocab_size % tp != 0) {
    throw UsageError(fmt::format(
        "[config] vocab_size {} is not divisible by tensor_model_parallel_size {} (the embedding and the output layer "
        "split the vocabulary over the tensor-parallel ranks); leave vocab_size unset to pad the tokenizer's "
        "vocabulary to a multiple of make_vocab_size_divisible_by x tensor_model_parallel_size",
        model.vocab_size, tp));
  }
  if (sizes.cp > 1 && model.seq_length % (2 * sizes.cp) != 0) {
    throw UsageError(
        fmt::format("[config] seq_length {} is not divisible by 2 x context_parallel_size = {} (each "
                    "context-parallel rank takes two of 2 x context_parallel_size equal chunks)",
                    model.seq_length, 2 * sizes.cp));
  }

  // Sequence parallelism splits the rows of the hidden state, [micro_batch_size × seq_length / cp], over tp. (Megatron
  // splits the sequence dimension of its [s, b, h] activations and asserts seq_length / cp divisible by tp when it
  // scatters them; here the rows are batch-major, so the whole micro-batch's count must divide.)
  const int64_t rows = model.micro_batch_size * (model.seq_length / sizes.cp);
  if (sizes.sequence_parallel && tp > 1 && rows % tp != 0) {
    throw UsageError(fmt::format(
        "[config] sequence_parallel: micro_batch_size {} x seq_length {}{} = {} rows of the hidden state are not "
        "divisible by tensor_model_parallel_size {} (each tensor-parallel rank holds an equal share of them between "
        "the tensor-parallel regions)",
        model.micro_batch_size, model.seq_length,
        sizes.cp > 1 ? fmt::format(" / context_parallel_size {}", sizes.cp) : "", rows, tp));
  }

  // Virtual stages: given, or derived as Megatron from the layers per virtual stage.
  int64_t vpp = 1;
  if (sizes.layers_per_virtual_stage > 0) {
    const int64_t n = sizes.layers_per_virtual_stage;
    if (model.num_layers % sizes.pp != 0 || (model.num_layers / sizes.pp) % n != 0) {
      throw UsageError(
          fmt::format("[config] num_layers {} must split into pipeline_model_parallel_size {} stages of a "
                      "multiple of num_layers_per_virtual_pipeline_stage {} layers",
                      model.num_layers, sizes.pp, n));
    }
    vpp = model.num_layers / sizes.pp / n;
  } else if (sizes.virtual_stages > 0) {
    vpp = sizes.virtual_stages;
    if (vpp > model.num_layers) {
      throw UsageError(
          fmt::format("[config] num_virtual_stages_per_pipeline_rank {} exceeds num_layers {}: a model "
                      "chunk holds at least one layer",
                      vpp, model.num_layers));
    }
  }

  // Expert parallelism: the experts of each MoE layer split evenly over ep ranks taken from dp × cp (Megatron's
  // rule: the expert-data-parallel size is then dp × cp / ep).
  const int64_t dp_cp = world_size / model_ranks * sizes.cp;
  if (sizes.ep < 1) {
    throw UsageError(fmt::format("[config] expert_model_parallel_size {} must be >= 1", sizes.ep));
  }
  if (sizes.ep > 1 && model.num_experts == 0) {
    throw UsageError(fmt::format("[config] expert_model_parallel_size {} needs a MoE model (num_experts): a dense "
                                 "model has no experts to split",
                                 sizes.ep));
  }
  if (sizes.ep > 1 && model.num_experts % sizes.ep != 0) {
    throw UsageError(fmt::format("[config] expert_model_parallel_size {} does not divide num_experts {} (each "
                                 "expert-parallel rank holds num_experts / expert_model_parallel_size whole experts)",
                                 sizes.ep, model.num_experts));
  }
  if (dp_cp % sizes.ep != 0) {
    throw UsageError(fmt::format(
        "[config] expert_model_parallel_size {} does not divide the data-parallel size {} x context_parallel_size "
        "{} = {} (WORLD_SIZE {} / tensor x pipeline x context parallel ranks {}): the expert-parallel ranks are "
        "taken from the data- and context-parallel ones",
        sizes.ep, world_size / model_ranks, sizes.cp, dp_cp, world_size, model_ranks));
  }

  ParallelDims d;
  d.world_ = world_size;
  d.ep_ = sizes.ep;
  d.tp_ = tp;
  d.pp_ = sizes.pp;
  d.cp_ = sizes.cp;
  d.dp_ = static_cast<int>(world_size / model_ranks);
  d.vpp_ = static_cast<int>(vpp);
  d.sequence_parallel_ = sizes.sequence_parallel && tp > 1;
  d.heads_per_rank_ = model.num_attention_heads / tp;
  d.kv_heads_per_rank_ = replicated ? 1 : groups / tp;
  d.kv_head_replicas_ = replicated ? static_cast<int>(tp / groups) : 1;
  d.stage_layout_ = stage_layers({.num_layers = model.num_layers,
                                  .pp = sizes.pp,
                                  .vpp = d.vpp_,
                                  .first_stage_layers = sizes.first_stage_layers,
                                  .last_stage_layers = sizes.last_stage_layers});
  return d;
}

LayerRange ParallelDims::layers(int stage, int chunk) const {
  PRIMUS_CHECK(stage >= 0 && stage < pp_ && chunk >= 0 && chunk < vpp_,
               "[parallel] stage {} chunk {} outside {} stages of {} chunks", stage, chunk, pp_, vpp_);
  return stage_layout_[static_cast<size_t>(chunk) * pp_ + stage];
}

RankCoord ParallelDims::coord(int rank) const {
  PRIMUS_CHECK(rank >= 0 && rank < world_, "[parallel] rank {} outside a world of {}", rank, world_);
  RankCoord c;
  c.tp = rank % tp_;
  rank /= tp_;
  c.cp = rank % cp_;
  rank /= cp_;
  c.dp = rank % dp_;
  c.pp = rank / dp_;
  return c;
}

int ParallelDims::rank_of(const RankCoord& c) const { return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp)); }

std::vector<int> ParallelDims::ranks_varying(int rank, unsigned varying) const {
  const RankCoord c = coord(rank);
  auto span = [&](unsigned dim, int own, int size) {
    return (varying & dim) ? std::pair{0, size} : std::pair{own, own + 1};
  };
  const auto [pp0, pp1] = span(kVaryPp, c.pp, pp_);
  const auto [dp0, dp1] = span(kVaryDp, c.dp, dp_);
  const auto [cp0, cp1] = span(kVaryCp, c.cp, cp_);
  const auto [tp0, tp1] = span(kVaryTp, c.tp, tp_);
  std::vector<int> ranks;  // slowest dimension outermost: ascending ranks
  for (int p = pp0; p < pp1; ++p) {
    for (int d = dp0; d < dp1; ++d) {
      for (int x = cp0; x < cp1; ++x) {
        for (int t = tp0; t < tp1; ++t) ranks.push_back(rank_of({.tp = t, .cp = x, .dp = d, .pp = p}));
      }
    }
  }
  return ranks;
}

std::vector<int> ParallelDims::tp_group(int rank) const { return ranks_varying(rank, kVaryTp); }
std::vector<int> ParallelDims::cp_group(int rank) const { return ranks_varying(rank, kVaryCp); }
std::vector<int> ParallelDims::dp_group(int rank) const { return ranks_varying(rank, kVaryDp); }
std::vector<int> ParallelDims::pp_group(int rank) const { return ranks_varying(rank, kVaryPp); }
std::vector<int> ParallelDims::dp_cp_group(int rank) const { return ranks_varying(rank, kVaryDp | kVaryCp); }
std::vector<int> ParallelDims::model_group(int rank) const { return ranks_varying(rank, kVaryTp | kVaryPp); }

int ParallelDims::ep_rank(int rank) const {
  const RankCoord c = coord(rank);
  return (c.cp + cp_ * c.dp) % ep_;
}

std::vector<int> ParallelDims::ep_group(int rank) const {
  const std::vector<int> members = dp_cp_group(rank);  // ascending: index cp_rank + cp · dp_rank
  const RankCoord c = coord(rank);
  const auto first = static_cast<size_t>((c.cp + cp_ * c.dp) / ep_ * ep_);
  return {members.begin() + static_cast<std::ptrdiff_t>(first),
          members.begin() + static_cast<std::ptrdiff_t>(first + static_cast<size_t>(ep_))};
}

std::vector<int> ParallelDims::expert_dp_group(int rank) const {
  const std::vector<int> members = dp_cp_group(rank);
  std::vector<int> group;
  for (size_t i = static_cast<size_t>(ep_rank(rank)); i < members.size(); i += static_cast<size_t>(ep_)) {
    group.push_back(members[i]);
  }
  return group;
}

std::vector<int> ParallelDims::embedding_group(int rank) const {
  if (pp_ == 1 || !(is_first_stage(rank) || is_last_stage(rank))) return {rank};
  const std::vector<int> pipeline = pp_group(rank);
  return {pipeline.front(), pipeline.back()};
}

int ParallelDims::pipeline_prev(int rank) const {
  RankCoord c = coord(rank);
  c.pp = (c.pp + pp_ - 1) % pp_;
  return rank_of(c);
}

int ParallelDims::pipeline_next(int rank) const {
  RankCoord c = coord(rank);
  c.pp = (c.pp + 1) % pp_;
  return rank_of(c);
}

std::string ParallelDims::describe() const {
  std::string text = fmt::format("dp {} x tp {} x pp {} x cp {} = {} ranks", dp_, tp_, pp_, cp_, world_);
  if (ep_ > 1) text += fmt::format(", ep {} (experts) x expert-data-parallel {}", ep_, dp_ * cp_ / ep_);
  if (vpp_ > 1) text += fmt::format(", {} virtual stages per pipeline stage", vpp_);
  if (sequence_parallel_) text += ", sequence parallel";
  return text;
}

ProcessGroups ProcessGroups::build(std::shared_ptr<Communicator> world, const ParallelDims& dims) {
  PRIMUS_CHECK(world->size() == dims.world(), "[parallel] communicator of {} ranks for a layout of {}", world->size(),
               dims.world());
  using Members = std::vector<int> (ParallelDims::*)(int) const;
  struct Kind {
    Members members;
    std::shared_ptr<Communicator> ProcessGroups::*field;
  };
  const Kind kinds[] = {
      {&ParallelDims::tp_group, &ProcessGroups::tp},
      {&ParallelDims::cp_group, &ProcessGroups::cp},
      {&ParallelDims::dp_group, &ProcessGroups::dp},
      {&ParallelDims::pp_group, &ProcessGroups::pp},
      {&ParallelDims::dp_cp_group, &ProcessGroups::dp_cp},
      {&ParallelDims::model_group, &ProcessGroups::model},
      {&ParallelDims::embedding_group, &ProcessGroups::embedding},
      {&ParallelDims::ep_group, &ProcessGroups::ep},
      {&ParallelDims::expert_dp_group, &ProcessGroups::expert_dp},
  };
  auto same_on_every_rank = [&](Members a, Members b) {
    for (int r = 0; r < dims.world(); ++r) {
      if ((dims.*a)(r) != (dims.*b)(r)) return false;
    }
    return true;
  };
  ProcessGroups groups;
  groups.dims = dims;
  const int rank = world->rank();
  for (size_t k = 0; k < std::size(kinds); ++k) {
    // An earlier kind with the same groups everywhere lends its communicator. The test looks at every rank, so
    // all ranks decide alike and call split equally often (split is collective over the world).
    for (size_t j = 0; j < k && !(groups.*kinds[k].field); ++j) {
      if (same_on_every_rank(kinds[j].members, kinds[k].members)) groups.*kinds[k].field = groups.*kinds[j].field;
    }
    if (groups.*kinds[k].field) continue;
    // The groups of a kind partition the world: the lowest rank names a group (the color) and a member's place
    // in the ascending list orders it (the key).
    // Through a local: GCC's UBSan misreads an array index inside a pointer-to-member call as out of bounds.
    const Members members_of = kinds[k].members;
    const std::vector<int> members = (dims.*members_of)(rank);
    const auto place = std::find(members.begin(), members.end(), rank) - members.begin();
    groups.*kinds[k].field = world->split(members.front(), static_cast<int>(place));
  }
  groups.world = std::move(world);
  return groups;
}

}  // namespace primus
