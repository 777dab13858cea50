// Sharded checkpoints under tensor parallelism, across real processes (forked ranks joined by Gloo): each rank
// builds the tensor-parallel model (its slices of the sliced parameters) and fills its weights and moments with
// values that are a function of the tensor's name and the element's place in the *whole* tensor, so any layout can
// check any other. Covered: tp 2 × dp 2 with distributed-optimizer shards that cut through rows saves pieces in
// boxes (format_version 2), the norm weights once; it loads into one process, tp 4, tp 2 with another dp cut, and
// tp 1 × dp 3, and exports to Hugging Face with every tensor whole; a tp 1 checkpoint (flat slices, format 1) loads
// into tp 2 ranks; the commit check refuses a replicated tensor written twice or by nobody on every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint/tensor_catalog.h"
#include "core/file_io.h"
#include "parallel/distributed_env.h"
#include "parallel/grad_reducer.h"
#include "support/cpu_ranks.h"
#include "support/multiprocess.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::RankResult;

constexpr int64_t kSeed = 99;

// tiny Llama whose heads, key/value groups, MLP and vocabulary split over 4 ranks.
ModelArgs args() {
  ModelArgs a = testing::tiny_llama_args();
  a.num_query_groups = 4;
  a.vocab_size = 48;
  return a;
}

// A value per (state, tensor, element of the whole tensor): weights (which 0) and moments (1, 2) all distinct.
float value(int tag, int which, const std::string& name, int64_t whole_index) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  h = (h ^ static_cast<uint64_t>(whole_index * 2654435761 + tag * 40503 + which * 977)) % 1000003u;
  return static_cast<float>(h) * 1e-3f - 500.0f;
}

// The whole-tensor index of element k of the 2-D (or 1-D) part `spec` holds.
int64_t whole_index(const ParamSpec& spec, int64_t k) {
  if (!spec.slice.sliced()) return k;
  const int64_t cols = spec.shape[1], whole_cols = spec.whole_shape()[1];
  const int64_t r = k / cols + (spec.slice.dim == 0 ? spec.slice.offset : 0);
  const int64_t c = k % cols + (spec.slice.dim == 1 ? spec.slice.offset : 0);
  return r * whole_cols + c;
}

std::shared_ptr<Communicator> join_world(int rank, int size, int port) {
  return testing::join_cpu_world(rank, size, port, 30s);
}

// One rank of tp × dp (rank = tp_rank + tp · dp_rank): its tensor-parallel model and an optimizer owning its
// distributed-optimizer shards of the local flat buffer (buckets of `bucket`), or everything at dp 1.
struct TpRank {
  std::shared_ptr<Communicator> world;
  std::shared_ptr<Communicator> tp_group;
  int tp = 1, tp_rank = 0, dp = 1, dp_rank = 0;
  std::unique_ptr<Model> model;
  std::unique_ptr<AdamW> optimizer;

  TpRank(int rank, int size, int tp_size, int64_t bucket, int port) : tp(tp_size), dp(size / tp_size) {
    world = join_world(rank, size, port);
    tp_rank = rank % tp;
    dp_rank = rank / tp;
    tp_group = world->split(dp_rank, tp_rank);
    model = make_model(args(), 16, kCpuDevice, DType::kF32, ModelParallel{TensorParallelGroup(tp_group), {}, false, {}, {}});
    const int64_t n = model->params().numel();
    optimizer =
        std::make_unique<AdamW>(model->params(), AdamWConfig{},
                                dp == 1 ? std::vector<FlatRange>{} : BucketLayout(n, bucket, dp).owned(dp_rank));
  }
  const ParamStore& params() const { return model->params(); }

  // What this rank writes: its shards, without the replicated tensors unless it is tensor-parallel rank 0.
  std::vector<FlatRange> save_ranges(bool replicated_everywhere = false, bool replicated_nowhere = false) const {
    std::vector<FlatRange> out;
    for (const FlatRange& r : optimizer->owned()) {
      for (size_t i = 0; i < params().specs().size(); ++i) {
        const bool replicated = !params().specs()[i].slice.sliced();
        if (replicated && (replicated_nowhere || (tp_rank != 0 && !replicated_everywhere))) continue;
        const int64_t lo = std::max(r.begin, params().offset(i));
        const int64_t hi = std::min(r.end, params().offset(i) + shape_numel(params().specs()[i].shape));
        if (lo < hi) out.push_back({lo, hi});
      }
    }
    return out;
  }

  // Every weight and owned moment from the value function (tag), or poisoned (tag < 0).
  void fill(int tag) {
    ParamStore& p = model->params();
    for (size_t i = 0; i < p.specs().size(); ++i) {
      float* w = p.param(i).f32();
      for (int64_t k = 0; k < shape_numel(p.specs()[i].shape); ++k) {
        w[k] = tag < 0 ? -7.0f : value(tag, 0, p.specs()[i].name, whole_index(p.specs()[i], k));
      }
    }
    for_each_moment([&](int which, const std::string& name, int64_t whole, float& m) {
      m = tag < 0 ? -7.0f : value(tag, which, name, whole);
    });
    optimizer->set_steps_taken(tag < 0 ? 0 : tag);
  }

  // The first element that differs from the state tagged `tag` (the weights only unless `moments`), or "".
  std::string check(int tag, bool moments = true) {
    const ParamStore& p = model->params();
    for (size_t i = 0; i < p.specs().size(); ++i) {
      const float* w = p.param(i).f32();
      for (int64_t k = 0; k < shape_numel(p.specs()[i].shape); ++k) {
        const int64_t whole = whole_index(p.specs()[i], k);
        if (w[k] != value(tag, 0, p.specs()[i].name, whole)) {
          return fmt::format("tp rank {} dp rank {}: {} element {} (whole {}) is {}", tp_rank, dp_rank,
                             p.specs()[i].name, k, whole, w[k]);
        }
      }
    }
    if (!moments) return {};
    std::string error;
    for_each_moment([&](int which, const std::string& name, int64_t whole, float& m) {
      if (error.empty() && m != value(tag, which, name, whole)) {
        error = fmt::format("tp rank {} dp rank {}: moment {} of {} (whole {}) is {}", tp_rank, dp_rank, which, name,
                            whole, m);
      }
    });
    if (error.empty() && optimizer->steps_taken() != tag) error = "optimizer steps";
    return error;
  }

  void for_each_moment(const std::function<void(int which, const std::string&, int64_t whole, float&)>& f) {
    const ParamStore& p = model->params();
    for (size_t r = 0; r < optimizer->owned().size(); ++r) {
      const FlatRange range = optimizer->owned()[r];
      for (size_t i = 0; i < p.specs().size(); ++i) {
        const int64_t lo = std::max(range.begin, p.offset(i));
        const int64_t hi = std::min(range.end, p.offset(i) + shape_numel(p.specs()[i].shape));
        for (int64_t at = lo; at < hi; ++at) {
          const int64_t whole = whole_index(p.specs()[i], at - p.offset(i));
          f(1, p.specs()[i].name, whole, optimizer->exp_avg(r).f32()[at - range.begin]);
          f(2, p.specs()[i].name, whole, optimizer->exp_avg_sq(r).f32()[at - range.begin]);
        }
      }
    }
  }
};

TrainerState state_of(int64_t iteration, int tag) {
  return TrainerState{
      .iteration = iteration, .consumed_train_samples = iteration, .optimizer_steps = tag, .seed = kSeed, .fp8_scaling = {}};
}

std::vector<RankResult> ranks(int size, const std::function<std::string(int rank, int port)>& body) {
  const int port = testing::free_port();
  return testing::run_ranks(
      size, 90s, [&](int rank) { return body(rank, port); }, 2);
}

void expect_all_ok(const std::vector<RankResult>& results, const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].status, 0) << what << ": rank " << r << " of " << results.size() << ": " << results[r].message;
  }
}

std::vector<RankResult> save_at(int size, int tp, int64_t bucket, const std::string& dir, int tag,
                                bool replicated_everywhere = false, bool replicated_nowhere = false) {
  return ranks(size, [&](int rank, int port) {
    TpRank r(rank, size, tp, bucket, port);
    r.fill(tag);
    save_sharded_checkpoint(dir, *r.model, *r.optimizer, r.save_ranges(replicated_everywhere, replicated_nowhere),
                            *r.world, state_of(tag, tag), "exp_name: tp\n");
    return std::string();
  });
}

std::vector<RankResult> load_at(int size, int tp, int64_t bucket, const std::string& checkpoint, int tag) {
  return ranks(size, [&](int rank, int port) {
    TpRank r(rank, size, tp, bucket, port);
    r.fill(-1);
    const TrainerState state = load_checkpoint(checkpoint, *r.model, *r.optimizer);
    if (state.iteration != tag) return fmt::format("iteration {}", state.iteration);
    return r.check(tag);
  });
}

TEST(TensorParallelCheckpoint, Tp2Dp2SaveLoadsAtAnyLayoutAndExportsWholeTensors) {
  const std::string dir = testing::temp_dir("tp-ckpt");
  // Buckets of 700 elements: the dp shards cut the local tensors inside rows.
  expect_all_ok(save_at(4, 2, 700, dir, 3), "save at tp 2 x dp 2");
  const std::string ckpt = dir + "/iter_0000003";
  EXPECT_NO_THROW(verify_checkpoint(ckpt));
  EXPECT_EQ(nlohmann::json::parse(read_file(ckpt + "/manifest.json"))["format_version"], 2);

  // The index: sliced tensors in boxes, with pieces cut inside rows; replicated ones in tp rank 0's shards only.
  const nlohmann::json index = nlohmann::json::parse(read_file(ckpt + "/index.json"));
  EXPECT_EQ(index["world_size"], 4);
  const nlohmann::json& down = index["tensors"]["model.layers.0.mlp.down_proj.weight"];
  ASSERT_TRUE(down.is_array());
  bool column_box = false, cut_inside_row = false;
  for (const nlohmann::json& piece : down) {
    EXPECT_EQ(piece["shape"], nlohmann::json({32, 48}));
    if (piece.contains("box") && piece["box"]["shape"] == nlohmann::json({32, 24})) column_box = true;
    if (piece["slice"][0].get<int64_t>() % 24 != 0 || piece["slice"][1].get<int64_t>() % 24 != 0) cut_inside_row = true;
  }
  EXPECT_TRUE(column_box) << down.dump();
  EXPECT_TRUE(cut_inside_row) << down.dump();
  EXPECT_EQ(index["tensors"]["lm_head.weight"][0]["box"]["shape"], nlohmann::json({24, 32}));
  for (const char* norm : {"model.norm.weight", "model.layers.1.input_layernorm.weight"}) {
    for (const nlohmann::json& piece : index["tensors"][norm]) {
      EXPECT_FALSE(piece.contains("box"));
      EXPECT_TRUE(piece["file"] == shard_file_name(0, 4) || piece["file"] == shard_file_name(2, 4)) << piece.dump();
    }
  }

  expect_all_ok(load_at(1, 1, 0, ckpt, 3), "-> one process");
  expect_all_ok(load_at(4, 4, 0, ckpt, 3), "-> tp 4");
  expect_all_ok(load_at(4, 2, 333, ckpt, 3), "-> tp 2 x dp 2, other buckets");
  expect_all_ok(load_at(3, 1, 1000, ckpt, 3), "-> tp 1 x dp 3");

  // Hugging Face: every tensor whole, equal to the value function.
  const std::string hf = dir + "/hf";
  const ConversionSummary exported = export_checkpoint_to_hf(ckpt, hf);
  EXPECT_TRUE(exported.sharded);
  const SafetensorsFile file = SafetensorsFile::open(hf + "/model.safetensors");
  const std::vector<ParamSpec> whole = model_family(args()).param_specs(args());
  ASSERT_EQ(file.entries().size(), whole.size());
  for (const ParamSpec& spec : whole) {
    const SafetensorsEntry* e = file.find(spec.name);
    ASSERT_NE(e, nullptr) << spec.name;
    EXPECT_EQ(e->shape, spec.shape) << spec.name;
    const Tensor t = file.read_f32(spec.name);
    for (int64_t k = 0; k < t.numel(); ++k) {
      ASSERT_EQ(t.f32()[k], value(3, 0, spec.name, k)) << spec.name << " element " << k;
    }
  }
  // And the export loads into tp 2 ranks as pretrained weights.
  expect_all_ok(ranks(2,
                      [&](int rank, int port) {
                        TpRank r(rank, 2, 2, 0, port);
                        r.fill(-1);
                        load_hf_weights(hf, *r.model);
                        return r.check(3, /*moments=*/false);
                      }),
                "load_hf_weights at tp 2");
}

TEST(TensorParallelCheckpoint, AnUnslicedCheckpointLoadsIntoTensorParallelRanks) {
  const std::string dir = testing::temp_dir("tp-ckpt-old");
  expect_all_ok(save_at(2, 1, 500, dir, 5), "save at tp 1 x dp 2");
  const std::string ckpt = dir + "/iter_0000005";
  // Without boxes the checkpoint stays format 1, which builds from before tensor parallelism read.
  EXPECT_EQ(nlohmann::json::parse(read_file(ckpt + "/manifest.json"))["format_version"], 1);
  EXPECT_EQ(read_file(ckpt + "/index.json").find("\"box\""), std::string::npos);
  expect_all_ok(load_at(2, 2, 0, ckpt, 5), "-> tp 2");
  expect_all_ok(load_at(4, 2, 400, ckpt, 5), "-> tp 2 x dp 2");
}

TEST(TensorParallelCheckpoint, TheCommitCheckIsPerTensorOnEveryRank) {
  // Every tensor-parallel rank writes the norms: each element of them twice.
  const std::string twice = testing::temp_dir("tp-ckpt-twice");
  const std::vector<RankResult> doubled = save_at(4, 2, 700, twice, 1, /*replicated_everywhere=*/true);
  for (size_t r = 0; r < doubled.size(); ++r) {
    EXPECT_EQ(doubled[r].status, 1) << r;
    EXPECT_NE(doubled[r].message.find("overlap"), std::string::npos) << doubled[r].message;
    EXPECT_NE(doubled[r].message.find("layernorm.weight"), std::string::npos) << doubled[r].message;
  }
  EXPECT_FALSE(fs::exists(twice + "/latest_checkpointed_iteration.txt"));
  // Nobody writes them.
  const std::string none = testing::temp_dir("tp-ckpt-none");
  const std::vector<RankResult> missing = save_at(4, 2, 700, none, 1, false, /*replicated_nowhere=*/true);
  for (size_t r = 0; r < missing.size(); ++r) {
    EXPECT_EQ(missing[r].status, 1) << r;
    EXPECT_NE(missing[r].message.find("is in no rank's pieces"), std::string::npos) << missing[r].message;
  }
  EXPECT_FALSE(fs::exists(none + "/latest_checkpointed_iteration.txt"));
}

// index.json as untrusted input: boxes that do not fit the tensor, are not equally spaced runs, or whose pieces leave
// out or repeat elements are refused naming index.json and the tensor before any shard is read.
TEST(TensorParallelCheckpoint, AHostileBoxIsRefusedNamingTheIndex) {
  const std::string dir = testing::temp_dir("tp-ckpt-hostile");
  auto error_of = [&](const std::string& pieces) {
    std::ofstream(dir + "/index.json", std::ios::trunc)
        << R"({"format": "primus-sharded-checkpoint", "world_size": 2, "tensors": {"w": [)" + pieces + "]}}";
    try {
      TensorCatalog::open_checkpoint(dir);
    } catch (const RuntimeError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "opened " << pieces;
    return std::string();
  };
  auto piece = [](int file, const std::string& box, const std::string& slice) {
    return fmt::format(R"({{"file": "shard_{}_of_2.safetensors", "key": "w", "shape": [4, 6], {}"slice": {}}})", file,
                       box.empty() ? "" : R"("box": )" + box + ", ", slice);
  };
  const std::string left = R"({"offset": [0, 0], "shape": [4, 3]})", right = R"({"offset": [0, 3], "shape": [4, 3]})";
  // The good one opens: two column boxes.
  std::ofstream(dir + "/index.json", std::ios::trunc)
      << R"({"format": "primus-sharded-checkpoint", "world_size": 2, "tensors": {"w": [)" + piece(0, left, "[0, 12]") +
             ", " + piece(1, right, "[0, 12]") + "]}}";
  EXPECT_NO_THROW(TensorCatalog::open_checkpoint(dir));

  const std::vector<std::pair<std::string, std::string>> cases = {
      {piece(0, R"({"offset": [0, 4], "shape": [4, 3]})", "[0, 12]"), "outside the tensor's shape [4, 6]"},
      {piece(0, R"({"offset": [0], "shape": [4]})", "[0, 4]"), "dimensions"},
      {piece(0, R"({"offset": [0, 0]})", "[0, 4]"), "optionally \"box\""},
      {piece(0, left, "[0, 13]"), "outside the 12 elements of its box [0:4, 0:3]"},
      {piece(0, left, "[0, 12]") + ", " + piece(1, right, "[1, 12]"),
       "elements [0, 1) of box [0:4, 3:6] are in no piece"},
      {piece(0, left, "[0, 12]") + ", " + piece(1, left, "[5, 12]"), "overlaps"},
      {piece(0, left, "[0, 12]") + ", " + piece(1, "", "[12, 24]"), "overlaps"},
      {piece(0, left, "[0, 12]"), "hold 12 of its 24 elements"},
  };
  for (const auto& [pieces, want] : cases) {
    const std::string message = error_of(pieces);
    EXPECT_NE(message.find(dir + "/index.json"), std::string::npos) << message;
    EXPECT_NE(message.find("tensors.w"), std::string::npos) << message;
    EXPECT_NE(message.find(want), std::string::npos) << want << " in: " << message;
  }
}

}  // namespace
}  // namespace primus
