// ParallelDims: the rank order (Megatron's tp-cp-dp-pp), the members of every group for layouts within 8 ranks,
// the checks against the world and the model (errors naming the keys), the pipeline stage layout (even, uneven,
// interleaved), and the splits ProcessGroups::build asks of the world communicator. Pure functions: no ranks run.
#include "parallel/parallel_dims.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "support/test_support.h"

namespace primus {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in: " << (text)

// A model every layout below splits: 8 heads and groups, ffn and vocabulary divisible by 8, 24 layers (1 to 4 and 8
// stages).
ParallelModelShape model8(int64_t layers = 24) {
  return {.num_attention_heads = 8,
          .num_query_groups = 8,
          .ffn_hidden_size = 64,
          .vocab_size = 256,
          .num_layers = layers,
          .seq_length = 32};
}

struct Layout {
  int tp, cp, pp, dp;
};

ParallelDims dims_of(const Layout& l, const ParallelModelShape& model = model8()) {
  return ParallelDims::make(l.tp * l.cp * l.pp * l.dp, {.tp = l.tp, .pp = l.pp, .cp = l.cp}, model);
}

std::string make_error(int world, const ParallelSizes& sizes, const ParallelModelShape& model = model8()) {
  return testing::message_of<UsageError>([&] { ParallelDims::make(world, sizes, model); });
}

TEST(ParallelDims, RankOrderIsMegatronsTensorFastestThenContextDataPipeline) {
  // The table of parallel_dims.h and docs/parallel.md: 8 ranks at tp 2 x pp 2 x dp 2.
  const ParallelDims d = dims_of({.tp = 2, .cp = 1, .pp = 2, .dp = 2});
  EXPECT_EQ(d.describe(), "dp 2 x tp 2 x pp 2 x cp 1 = 8 ranks");
  const int expected[8][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0},
                              {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};  // tp, dp, pp
  for (int r = 0; r < 8; ++r) {
    const RankCoord c = d.coord(r);
    EXPECT_EQ(c.tp, expected[r][0]) << r;
    EXPECT_EQ(c.cp, 0) << r;
    EXPECT_EQ(c.dp, expected[r][1]) << r;
    EXPECT_EQ(c.pp, expected[r][2]) << r;
    EXPECT_EQ(d.rank_of(c), r);
  }
  using G = std::vector<int>;
  EXPECT_EQ(d.tp_group(2), (G{2, 3}));
  EXPECT_EQ(d.dp_group(1), (G{1, 3}));
  EXPECT_EQ(d.pp_group(2), (G{2, 6}));
  EXPECT_EQ(d.cp_group(5), (G{5}));
  EXPECT_EQ(d.dp_cp_group(4), (G{4, 6}));
  EXPECT_EQ(d.model_group(2), (G{2, 3, 6, 7}));
  EXPECT_EQ(d.embedding_group(7), (G{3, 7}));
  EXPECT_TRUE(d.is_first_stage(3));
  EXPECT_FALSE(d.is_last_stage(3));
  EXPECT_TRUE(d.is_last_stage(5));
  EXPECT_EQ(d.pipeline_next(1), 5);
  EXPECT_EQ(d.pipeline_prev(1), 5);
}

TEST(ParallelDims, ContextParallelSitsBetweenTensorAndData) {
  // tp 2 x cp 2 x pp 2: rank = tp + 2 cp + 4 pp.
  const ParallelDims d = dims_of({.tp = 2, .cp = 2, .pp = 2, .dp = 1});
  using G = std::vector<int>;
  EXPECT_EQ(d.coord(6).cp, 1);
  EXPECT_EQ(d.coord(6).pp, 1);
  EXPECT_EQ(d.cp_group(1), (G{1, 3}));
  EXPECT_EQ(d.dp_group(1), (G{1}));
  EXPECT_EQ(d.dp_cp_group(1), (G{1, 3}));  // gradients are reduced over the cp ranks too
  EXPECT_EQ(d.model_group(2), (G{2, 3, 6, 7}));
  EXPECT_EQ(d.embedding_group(2), (G{2, 6}));
  // cp 2 x dp 2 at tp 2: dp×cp groups interleave the two.
  const ParallelDims e = dims_of({.tp = 2, .cp = 2, .pp = 1, .dp = 2});
  EXPECT_EQ(e.dp_group(0), (G{0, 4}));
  EXPECT_EQ(e.cp_group(0), (G{0, 2}));
  EXPECT_EQ(e.dp_cp_group(1), (G{1, 3, 5, 7}));
  EXPECT_EQ(e.embedding_group(5), (G{5}));
}

TEST(ParallelDims, PipelineNeighboursWrapAndMiddleStagesHoldNoEmbedding) {
  // pp 4 x dp 2: rank = dp + 2 pp.
  const ParallelDims d = dims_of({.tp = 1, .cp = 1, .pp = 4, .dp = 2});
  using G = std::vector<int>;
  EXPECT_EQ(d.pp_group(3), (G{1, 3, 5, 7}));
  EXPECT_EQ(d.embedding_group(1), (G{1, 7}));
  EXPECT_EQ(d.embedding_group(7), (G{1, 7}));
  EXPECT_EQ(d.embedding_group(3), (G{3}));
  EXPECT_EQ(d.embedding_group(4), (G{4}));
  EXPECT_EQ(d.pipeline_next(1), 3);
  EXPECT_EQ(d.pipeline_prev(1), 7);
  EXPECT_EQ(d.pipeline_next(7), 1);
  EXPECT_EQ(d.pipeline_prev(5), 3);
  EXPECT_TRUE(d.is_first_stage(0) && d.is_first_stage(1) && !d.is_first_stage(2));
  EXPECT_TRUE(d.is_last_stage(6) && d.is_last_stage(7) && !d.is_last_stage(5));
  // One stage: the rank is its own neighbour, and first and last.
  const ParallelDims one = dims_of({.tp = 2, .cp = 1, .pp = 1, .dp = 2});
  EXPECT_EQ(one.pipeline_next(3), 3);
  EXPECT_EQ(one.pipeline_prev(3), 3);
  EXPECT_TRUE(one.is_first_stage(3) && one.is_last_stage(3));
  EXPECT_EQ(one.embedding_group(3), (G{3}));
}

const std::vector<Layout>& layouts_within_8() {
  static const std::vector<Layout> layouts = {
      {1, 1, 1, 1}, {1, 1, 1, 8}, {8, 1, 1, 1}, {1, 1, 8, 1}, {1, 8, 1, 1}, {2, 1, 2, 2}, {2, 2, 2, 1},
      {2, 2, 1, 2}, {4, 1, 2, 1}, {1, 2, 4, 1}, {1, 2, 2, 2}, {2, 1, 1, 3}, {1, 1, 3, 2}, {2, 2, 1, 1},
  };
  return layouts;
}

// Every kind of group, for every layout: the groups partition the world, hold the ranks that share the fixed
// coordinates (and only them), ascending, of the expected size; along tp, cp, dp and pp a member's index in its
// group is its coordinate.
TEST(ParallelDims, GroupsPartitionTheWorldForLayoutsWithinEightRanks) {
  using Members = std::vector<int> (ParallelDims::*)(int) const;
  struct Kind {
    const char* name;
    Members members;
    bool tp, cp, dp, pp;    // the dimensions its members vary along
    int RankCoord::*place;  // a member's index in the group, for the groups along one dimension
  };
  const Kind kinds[] = {
      {"tp", &ParallelDims::tp_group, true, false, false, false, &RankCoord::tp},
      {"cp", &ParallelDims::cp_group, false, true, false, false, &RankCoord::cp},
      {"dp", &ParallelDims::dp_group, false, false, true, false, &RankCoord::dp},
      {"pp", &ParallelDims::pp_group, false, false, false, true, &RankCoord::pp},
      {"dp_cp", &ParallelDims::dp_cp_group, false, true, true, false, nullptr},
      {"model", &ParallelDims::model_group, true, false, false, true, nullptr},
  };
  for (const Layout& l : layouts_within_8()) {
    const ParallelDims d = dims_of(l);
    SCOPED_TRACE(d.describe());
    EXPECT_EQ(d.dp(), l.dp);
    for (const Kind& kind : kinds) {
      SCOPED_TRACE(kind.name);
      const int size = (kind.tp ? l.tp : 1) * (kind.cp ? l.cp : 1) * (kind.dp ? l.dp : 1) * (kind.pp ? l.pp : 1);
      for (int r = 0; r < d.world(); ++r) {
        const std::vector<int> group = (d.*kind.members)(r);
        ASSERT_EQ(static_cast<int>(group.size()), size) << "rank " << r;
        EXPECT_TRUE(std::is_sorted(group.begin(), group.end()));
        EXPECT_NE(std::find(group.begin(), group.end(), r), group.end()) << "rank " << r << " not in its group";
        const RankCoord c = d.coord(r);
        for (int i = 0; i < size; ++i) {
          const RankCoord m = d.coord(group[i]);
          EXPECT_TRUE((kind.tp || m.tp == c.tp) && (kind.cp || m.cp == c.cp) && (kind.dp || m.dp == c.dp) &&
                      (kind.pp || m.pp == c.pp))
              << "rank " << group[i] << " in rank " << r << "'s group";
          EXPECT_EQ((d.*kind.members)(group[i]), group) << "the members' groups differ";
        }
        if (kind.place != nullptr) {
          EXPECT_EQ(std::find(group.begin(), group.end(), r) - group.begin(), c.*kind.place) << "rank " << r;
        }
      }
    }
    for (int r = 0; r < d.world(); ++r) {
      const std::vector<int> pipeline = d.pp_group(r);
      const std::vector<int> embedding = d.embedding_group(r);
      if (l.pp == 1) {
        EXPECT_EQ(embedding, std::vector<int>{r});
      } else if (d.is_first_stage(r) || d.is_last_stage(r)) {
        EXPECT_EQ(embedding, (std::vector<int>{pipeline.front(), pipeline.back()}));
      } else {
        EXPECT_EQ(embedding, std::vector<int>{r});
      }
      const int stage = d.coord(r).pp;
      EXPECT_EQ(d.pipeline_next(r), pipeline[(stage + 1) % l.pp]);
      EXPECT_EQ(d.pipeline_prev(r), pipeline[(stage + l.pp - 1) % l.pp]);
    }
  }
}

TEST(ParallelDims, WorldAndModelChecksNameTheKeys) {
  EXPECT_CONTAINS(make_error(6, {.tp = 4}),
                  "[config] tensor_model_parallel_size 4 x pipeline_model_parallel_size 1 x context_parallel_size 1 = "
                  "4 does not divide the world size (WORLD_SIZE) 6");
  EXPECT_CONTAINS(make_error(8, {.tp = 2, .pp = 2, .cp = 4}), "= 16 does not divide the world size (WORLD_SIZE) 8");

  ParallelModelShape m = model8();
  m.num_attention_heads = 6;
  m.num_query_groups = 6;
  EXPECT_CONTAINS(make_error(4, {.tp = 4}, m),
                  "[config] num_attention_heads 6 is not divisible by tensor_model_parallel_size 4");
  m = model8();
  m.num_query_groups = 3;  // neither a multiple of tp 2 nor a divisor of it
  EXPECT_CONTAINS(make_error(2, {.tp = 2}, m),
                  "[config] num_query_groups 3 must be a multiple of tensor_model_parallel_size 2, or divide it");
  m.num_query_groups = 6;  // more groups than tp 4, not a multiple
  m.num_attention_heads = 12;
  EXPECT_CONTAINS(make_error(4, {.tp = 4}, m), "num_query_groups 6 must be a multiple of tensor_model_parallel_size 4");
  m = model8();
  m.ffn_hidden_size = 172;
  EXPECT_CONTAINS(make_error(8, {.tp = 8}, m),
                  "[config] ffn_hidden_size 172 is not divisible by tensor_model_parallel_size 8");
  m = model8();
  m.vocab_size = 50257;
  const std::string vocab = make_error(2, {.tp = 2}, m);
  EXPECT_CONTAINS(vocab, "[config] vocab_size 50257 is not divisible by tensor_model_parallel_size 2");
  EXPECT_CONTAINS(vocab,
                  "leave vocab_size unset to pad the tokenizer's vocabulary to a multiple of "
                  "make_vocab_size_divisible_by x tensor_model_parallel_size");
  m = model8();
  m.seq_length = 6;
  EXPECT_CONTAINS(make_error(2, {.cp = 2}, m),
                  "[config] seq_length 6 is not divisible by 2 x context_parallel_size = 4");
  m.seq_length = 8;
  EXPECT_NO_THROW(ParallelDims::make(2, {.cp = 2}, m));
  m.seq_length = 7;  // cp 1 has no chunks
  EXPECT_NO_THROW(ParallelDims::make(2, {}, m));

  m = model8();
  m.num_layers = 6;
  EXPECT_CONTAINS(make_error(4, {.pp = 4}, m),
                  "[config] num_layers 6 is not divisible by pipeline_model_parallel_size 4");
  EXPECT_CONTAINS(make_error(2, {.pp = 2, .layers_per_virtual_stage = 2}, m),
                  "[config] num_layers 6 must split into pipeline_model_parallel_size 2 stages of a multiple of "
                  "num_layers_per_virtual_pipeline_stage 2 layers");
  EXPECT_CONTAINS(make_error(2, {.pp = 2, .virtual_stages = 7}, m),
                  "[config] num_virtual_stages_per_pipeline_rank 7 exceeds num_layers 6");
  EXPECT_CONTAINS(make_error(2, {.pp = 2, .virtual_stages = 2}, m),
                  "the layers of each stage (num_layers / pipeline_model_parallel_size) = 3 is not divisible by "
                  "num_virtual_stages_per_pipeline_rank 2");
}

// Sequence parallelism splits a micro-batch's rows (micro_batch_size x seq_length / cp) over tp: they must divide.
TEST(ParallelDims, SequenceParallelNeedsTheRowsToDivideByTp) {
  ParallelModelShape m = model8();
  m.seq_length = 6;
  m.micro_batch_size = 1;
  EXPECT_CONTAINS(make_error(4, {.tp = 4, .sequence_parallel = true}, m),
                  "[config] sequence_parallel: micro_batch_size 1 x seq_length 6 = 6 rows of the hidden state are not "
                  "divisible by tensor_model_parallel_size 4");
  m.micro_batch_size = 2;  // 12 rows
  EXPECT_TRUE(ParallelDims::make(4, {.tp = 4, .sequence_parallel = true}, m).sequence_parallel());
  m.seq_length = 7;
  m.micro_batch_size = 1;
  EXPECT_NO_THROW(ParallelDims::make(4, {.tp = 4}, m));  // without sequence parallelism the rows need not divide
  m.seq_length = 12;
  EXPECT_CONTAINS(make_error(8, {.tp = 4, .cp = 2, .sequence_parallel = true}, m),
                  "micro_batch_size 1 x seq_length 12 / context_parallel_size 2 = 6 rows");
  EXPECT_NO_THROW(ParallelDims::make(4, {.tp = 2, .cp = 2, .sequence_parallel = true}, m));
}

TEST(ParallelDims, KeyValueHeadsAreSplitOrReplicated) {
  ParallelModelShape m = model8();
  m.num_query_groups = 8;
  ParallelDims d = ParallelDims::make(2, {.tp = 2}, m);
  EXPECT_EQ(d.heads_per_rank(), 4);
  EXPECT_EQ(d.kv_heads_per_rank(), 4);
  EXPECT_EQ(d.kv_head_replicas(), 1);
  m.num_query_groups = 2;  // fewer groups than tp 8: each kv head on 4 ranks, each rank one kv head, one query head
  d = ParallelDims::make(8, {.tp = 8}, m);
  EXPECT_EQ(d.heads_per_rank(), 1);
  EXPECT_EQ(d.kv_heads_per_rank(), 1);
  EXPECT_EQ(d.kv_head_replicas(), 4);
  m.num_query_groups = 1;  // multi-query attention
  d = ParallelDims::make(4, {.tp = 4}, m);
  EXPECT_EQ(d.heads_per_rank(), 2);
  EXPECT_EQ(d.kv_head_replicas(), 4);
  m.num_query_groups = 4;
  d = ParallelDims::make(4, {.tp = 4}, m);
  EXPECT_EQ(d.kv_heads_per_rank(), 1);
  EXPECT_EQ(d.kv_head_replicas(), 1);
}

using R = std::vector<LayerRange>;

TEST(StageLayers, EvenSplit) {
  EXPECT_EQ(stage_layers({.num_layers = 8, .pp = 4}), (R{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(stage_layers({.num_layers = 5}), (R{{0, 5}}));
}

TEST(StageLayers, InterleavedChunkVOfStageSHoldsGroupVTimesPpPlusS) {
  // Megatron's example (--num-layers-per-virtual-pipeline-stage): 8 layers, 2 stages of 2 chunks of 2 layers: the
  // first stage holds layers 0-1 and 4-5, the second 2-3 and 6-7.
  const ParallelDims d = ParallelDims::make(2, {.pp = 2, .layers_per_virtual_stage = 2}, model8(8));
  EXPECT_EQ(d.vpp(), 2);
  EXPECT_EQ(d.layers(0, 0), (LayerRange{0, 2}));
  EXPECT_EQ(d.layers(1, 0), (LayerRange{2, 4}));
  EXPECT_EQ(d.layers(0, 1), (LayerRange{4, 6}));
  EXPECT_EQ(d.layers(1, 1), (LayerRange{6, 8}));
  EXPECT_EQ(d.describe(), "dp 1 x tp 1 x pp 2 x cp 1 = 2 ranks, 2 virtual stages per pipeline stage");
  // The same layout given as chunks per stage.
  EXPECT_EQ(ParallelDims::make(2, {.pp = 2, .virtual_stages = 2}, model8(8)).stage_layout(), d.stage_layout());
  // One layer per chunk over 4 stages.
  EXPECT_EQ(stage_layers({.num_layers = 8, .pp = 4, .vpp = 2}),
            (R{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 8}}));
  // A virtual stage as large as a stage: one chunk, no interleaving.
  EXPECT_EQ(ParallelDims::make(2, {.pp = 2, .layers_per_virtual_stage = 4}, model8(8)).vpp(), 1);
}

TEST(StageLayers, UnevenFirstAndLastStages) {
  EXPECT_EQ(stage_layers({.num_layers = 10, .pp = 4, .first_stage_layers = 1, .last_stage_layers = 3}),
            (R{{0, 1}, {1, 4}, {4, 7}, {7, 10}}));
  EXPECT_EQ(stage_layers({.num_layers = 7, .pp = 3, .first_stage_layers = 1}), (R{{0, 1}, {1, 4}, {4, 7}}));
  EXPECT_EQ(stage_layers({.num_layers = 7, .pp = 3, .last_stage_layers = 3}), (R{{0, 2}, {2, 4}, {4, 7}}));
  EXPECT_EQ(stage_layers({.num_layers = 8, .pp = 2, .first_stage_layers = 3, .last_stage_layers = 5}),
            (R{{0, 3}, {3, 8}}));
  // Interleaved and uneven (Megatron's offsets): each stage's chunks are a vpp-th of it, rounds of 12 / 2 layers.
  EXPECT_EQ(stage_layers({.num_layers = 12, .pp = 3, .vpp = 2, .first_stage_layers = 2, .last_stage_layers = 2}),
            (R{{0, 1}, {1, 5}, {5, 6}, {6, 7}, {7, 11}, {11, 12}}));
}

TEST(StageLayers, ImpossibleSplitsNameTheKeys) {
  auto error = [](const PipelineSplit& s) { return testing::message_of<UsageError>([&] { stage_layers(s); }); };
  EXPECT_CONTAINS(error({.num_layers = 6, .pp = 4}),
                  "[config] num_layers 6 is not divisible by pipeline_model_parallel_size 4; for an uneven split set "
                  "decoder_first_pipeline_num_layers and/or decoder_last_pipeline_num_layers");
  EXPECT_CONTAINS(error({.num_layers = 8, .pp = 2, .first_stage_layers = 3, .last_stage_layers = 3}),
                  "decoder_first_pipeline_num_layers 3 and decoder_last_pipeline_num_layers 3 leave 2 of num_layers 8 "
                  "to no stage");
  EXPECT_CONTAINS(error({.num_layers = 8, .pp = 3, .first_stage_layers = 4, .last_stage_layers = 4}),
                  "the 0 layers that decoder_first_pipeline_num_layers 4 and decoder_last_pipeline_num_layers 4 leave "
                  "of num_layers 8 must split evenly over the 1 other stage of pipeline_model_parallel_size 3, at "
                  "least one layer each");
  EXPECT_CONTAINS(error({.num_layers = 9, .pp = 4, .first_stage_layers = 1, .last_stage_layers = 1}),
                  "the 7 layers that decoder_first_pipeline_num_layers 1 and decoder_last_pipeline_num_layers 1 leave "
                  "of num_layers 9 must split evenly over the 2 other stages");
  EXPECT_CONTAINS(error({.num_layers = 12, .pp = 3, .first_stage_layers = 3}),
                  "the 9 layers that decoder_first_pipeline_num_layers 3 leaves of num_layers 12 must split evenly "
                  "over the 2 other stages");
  EXPECT_CONTAINS(error({.num_layers = 8, .pp = 3, .first_stage_layers = 5, .last_stage_layers = 5}),
                  "decoder_first_pipeline_num_layers 5 and decoder_last_pipeline_num_layers 5 exceed num_layers 8");
  EXPECT_CONTAINS(error({.num_layers = 8, .pp = 1, .first_stage_layers = 4, .last_stage_layers = 4}),
                  "decoder_first_pipeline_num_layers and decoder_last_pipeline_num_layers are two stages but "
                  "pipeline_model_parallel_size is 1");
  EXPECT_CONTAINS(error({.num_layers = 13, .pp = 3, .vpp = 2, .first_stage_layers = 3}),
                  "decoder_first_pipeline_num_layers = 3 is not divisible by num_virtual_stages_per_pipeline_rank 2");
  EXPECT_CONTAINS(error({.num_layers = 9, .pp = 3, .vpp = 2, .last_stage_layers = 1}),
                  "decoder_last_pipeline_num_layers = 1 is not divisible by num_virtual_stages_per_pipeline_rank 2");
  EXPECT_CONTAINS(
      error({.num_layers = 11, .pp = 3, .vpp = 2, .first_stage_layers = 2, .last_stage_layers = 2}),
      "the layers of each of the other stages = 7 is not divisible by num_virtual_stages_per_pipeline_rank 2");
}

// Every split of up to 16 layers over up to 4 stages and 4 chunks, with and without overrides: either a UsageError,
// or pp x vpp ranges that cover the layers back to back in (chunk, stage) order, a stage's chunks all the same
// non-empty size, the overridden stages of the size asked for and the other stages alike.
TEST(StageLayers, EverySplitCoversTheLayersInOrder) {
  int valid = 0;
  for (int64_t layers = 1; layers <= 16; ++layers) {
    for (int pp = 1; pp <= 4; ++pp) {
      for (int vpp = 1; vpp <= 4; ++vpp) {
        for (int64_t first = 0; first <= layers; ++first) {
          for (int64_t last = 0; last <= layers; ++last) {
            const PipelineSplit s{
                .num_layers = layers, .pp = pp, .vpp = vpp, .first_stage_layers = first, .last_stage_layers = last};
            std::vector<LayerRange> ranges;
            try {
              ranges = stage_layers(s);
            } catch (const UsageError&) {
              continue;
            }
            ++valid;
            SCOPED_TRACE(::testing::Message() << layers << " layers, pp " << pp << ", vpp " << vpp << ", first "
                                              << first << ", last " << last);
            ASSERT_EQ(ranges.size(), static_cast<size_t>(pp * vpp));
            EXPECT_EQ(ranges.front().begin, 0);
            EXPECT_EQ(ranges.back().end, layers);
            for (size_t i = 1; i < ranges.size(); ++i) EXPECT_EQ(ranges[i].begin, ranges[i - 1].end);
            std::set<int64_t> middle_sizes;
            for (int stage = 0; stage < pp; ++stage) {
              const int64_t chunk = ranges[stage].size();
              EXPECT_GE(chunk, 1);
              for (int v = 0; v < vpp; ++v) EXPECT_EQ(ranges[v * pp + stage].size(), chunk);
              if (stage == 0 && first > 0) {
                EXPECT_EQ(chunk * vpp, first);
              } else if (stage == pp - 1 && last > 0) {
                EXPECT_EQ(chunk * vpp, last);
              } else {
                middle_sizes.insert(chunk);
              }
            }
            EXPECT_LE(middle_sizes.size(), 1u);
          }
        }
      }
    }
  }
  EXPECT_GT(valid, 300);
}

// ---- ProcessGroups::build, on a world that records the splits each rank asks for ----

// A rank of a world that only splits: the communicators it returns remember their color and key.
class SplitRecorder final : public Communicator {
 public:
  SplitRecorder(int rank, int size, int color = -1, int key = -1)
      : rank_(rank), size_(size), color_(color), key_(key) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "recorder"; }
  Device device() const override { return kCpuDevice; }
  void all_reduce(Tensor&, ReduceOp, Stream) override { unused(); }
  void reduce_scatter(const Tensor&, Tensor&, ReduceOp, Stream) override { unused(); }
  void all_gather(const Tensor&, Tensor&, Stream) override { unused(); }
  void all_to_all(const Tensor&, Tensor&, Stream) override { unused(); }
  void all_to_all_v(const Tensor&, const std::vector<int64_t>&, Tensor&, const std::vector<int64_t>&, Stream) override {
    unused();
  }
  void broadcast(Tensor&, int, Stream) override { unused(); }
  void send(const Tensor&, int, Stream) override { unused(); }
  void recv(Tensor&, int, Stream) override { unused(); }
  void barrier() override { unused(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    ++splits_;
    return std::make_unique<SplitRecorder>(key, 0, color, key);
  }

  int color() const { return color_; }
  int key() const { return key_; }
  int splits() const { return splits_; }

 private:
  [[noreturn]] static void unused() { throw std::logic_error("ProcessGroups::build ran a collective"); }
  int rank_, size_, color_, key_;
  int splits_ = 0;
};

TEST(ProcessGroups, EveryRankSplitsAlikeIntoTheGroupsOfItsLayout) {
  using Members = std::vector<int> (ParallelDims::*)(int) const;
  const std::pair<std::shared_ptr<Communicator> ProcessGroups::*, Members> kinds[] = {
      {&ProcessGroups::tp, &ParallelDims::tp_group},
      {&ProcessGroups::cp, &ParallelDims::cp_group},
      {&ProcessGroups::dp, &ParallelDims::dp_group},
      {&ProcessGroups::pp, &ParallelDims::pp_group},
      {&ProcessGroups::dp_cp, &ParallelDims::dp_cp_group},
      {&ProcessGroups::model, &ParallelDims::model_group},
      {&ProcessGroups::embedding, &ParallelDims::embedding_group},
  };
  for (const Layout& l : layouts_within_8()) {
    const ParallelDims d = dims_of(l);
    SCOPED_TRACE(d.describe());
    int splits = -1;
    for (int r = 0; r < d.world(); ++r) {
      auto world = std::make_shared<SplitRecorder>(r, d.world());
      const ProcessGroups g = ProcessGroups::build(world, d);
      EXPECT_EQ(g.world.get(), world.get());
      if (splits < 0) splits = world->splits();
      EXPECT_EQ(world->splits(), splits) << "rank " << r << " splits a different number of times: a hang";
      for (const auto& [field, members] : kinds) {
        const auto* comm = dynamic_cast<const SplitRecorder*>((g.*field).get());
        ASSERT_NE(comm, nullptr);
        // Ranks with the same color form one communicator, ordered by key: the group's lowest rank names it and
        // the rank's place in the group orders it. A shared communicator was split for a kind with equal groups.
        const std::vector<int> group = (d.*members)(r);
        EXPECT_EQ(comm->color(), group.front()) << "rank " << r;
        EXPECT_EQ(comm->key(), std::find(group.begin(), group.end(), r) - group.begin()) << "rank " << r;
      }
      // Kinds with the same members share one communicator: at cp 1, dp×cp is dp.
      EXPECT_EQ(g.dp_cp.get() == g.dp.get(), l.cp == 1);
      EXPECT_EQ(g.embedding.get() == g.pp.get(), l.pp <= 2);
    }
    // One split per distinct kind of group: a world of one (or any layout with all of tp, cp, pp 1) splits twice
    // (the one-rank groups, and dp) as before the other kinds existed.
    if (l.tp == 1 && l.cp == 1 && l.pp == 1) {
      EXPECT_EQ(splits, l.dp == 1 ? 1 : 2);
    }
  }
}

}  // namespace
}  // namespace primus

namespace primus {
namespace {

// Expert parallelism inside dp × cp (Megatron's order tp-cp-ep-dp-pp): ep groups are consecutive members of the
// dp × cp group, the expert-data-parallel groups the members with the same ep rank; together they tile dp × cp.
TEST(ParallelDims, ExpertGroupsSubdivideDataAndContextParallelRanks) {
  ParallelModelShape m = model8();
  m.num_experts = 8;
  const ParallelDims dp4 = ParallelDims::make(4, {.ep = 2}, m);
  EXPECT_EQ(dp4.ep(), 2);
  EXPECT_EQ(dp4.ep_group(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(dp4.ep_group(3), (std::vector<int>{2, 3}));
  EXPECT_EQ(dp4.expert_dp_group(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(dp4.expert_dp_group(3), (std::vector<int>{1, 3}));
  EXPECT_EQ(dp4.ep_rank(2), 0);
  EXPECT_EQ(dp4.ep_rank(3), 1);
  // tp 2 × cp 2 × dp 2 × pp 2 at ep 4: the dp × cp group of rank 0 is {0, 2, 4, 6}, all one ep group.
  const ParallelDims mixed = ParallelDims::make(16, {.tp = 2, .pp = 2, .cp = 2, .ep = 4}, m);
  EXPECT_EQ(mixed.ep_group(0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(mixed.expert_dp_group(4), (std::vector<int>{4}));
  EXPECT_EQ(mixed.ep_group(9), (std::vector<int>{9, 11, 13, 15}));
  for (int world : {2, 4, 8}) {
    for (int ep = 1; ep <= world; ep *= 2) {
      const ParallelDims d = ParallelDims::make(world, {.ep = ep}, m);
      for (int r = 0; r < world; ++r) {
        const std::vector<int> g = d.ep_group(r), e = d.expert_dp_group(r);
        EXPECT_EQ(static_cast<int>(g.size()), ep);
        EXPECT_EQ(static_cast<int>(e.size()), world / ep);
        EXPECT_EQ(g[static_cast<size_t>(d.ep_rank(r))], r);  // a member's index is its ep rank
        for (int other : e) EXPECT_EQ(d.ep_rank(other), d.ep_rank(r));
      }
    }
  }
}

TEST(ParallelDims, ExpertParallelChecksNameTheKey) {
  ParallelModelShape m = model8();
  EXPECT_CONTAINS(make_error(2, {.ep = 2}, m), "expert_model_parallel_size 2 needs a MoE model (num_experts)");
  m.num_experts = 6;
  EXPECT_CONTAINS(make_error(4, {.ep = 4}, m), "expert_model_parallel_size 4 does not divide num_experts 6");
  m.num_experts = 8;
  EXPECT_CONTAINS(make_error(6, {.ep = 4}, m),
                  "expert_model_parallel_size 4 does not divide the data-parallel size 6 x context_parallel_size 1");
  EXPECT_CONTAINS(make_error(4, {.tp = 2, .ep = 4}, m), "does not divide the data-parallel size 2");
}

}  // namespace
}  // namespace primus
