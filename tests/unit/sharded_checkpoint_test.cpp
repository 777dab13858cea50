// Sharded checkpoints across real processes: ranks are forked children joined by Gloo over TCP (the model and the
// ops run in the children only, so the test process never starts an OpenMP pool a later fork would inherit
// broken). Each rank fills its weights and moments with values that are a function of the flat element index,
// so any process can check any layout against them. Covered: 4 ranks saving with distributed-optimizer shards
// (BucketLayout owned ranges, tensors cut across buckets) load into 1, 2 and 4 ranks of other bucket sizes; a
// world of one saves the single-file format, which loads into 4 ranks and into Hugging Face's loader as it is;
// export to a Hugging Face folder and import back (library and CLI); a rank that dies after writing its shard
// leaves the previous checkpoint the latest and loadable, and the next save removes the stale temporary; a rank
// that fails makes every rank throw at once; ranges that overlap are refused by every rank; a corrupt shard byte
// is caught naming the file; the manifest must list every file the loader reads, and index.json cannot name others.
#include "checkpoint/sharded_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_catalog.h"
#include "core/file_io.h"
#include "models/llama.h"
#include "parallel/distributed_env.h"
#include "parallel/grad_reducer.h"
#include "support/cli_process.h"
#include "support/cpu_ranks.h"
#include "support/multiprocess.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int64_t kSaveBucket = 1000;  // elements: ~19 buckets of the tiny model, so tensors cross shard boundaries
constexpr int64_t kSeed = 1234;

// --- ranks as processes -------------------------------------------------------------------------------------------

using testing::RankResult;

// Forks `size` ranks running body(rank, port) with a MASTER_PORT of their own; a body returns an empty string
// when its checks passed, else the failed check (status 2).
std::vector<RankResult> run_ranks(int size, const std::function<std::string(int rank, int port)>& body) {
  const int port = testing::free_port();
  return testing::run_ranks(
      size, 90s, [&](int rank) { return body(rank, port); }, 2);
}

void expect_all_ok(const std::vector<RankResult>& results, const std::string& what) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].status, 0) << what << ": rank " << rank << " of " << results.size() << ": "
                                       << results[rank].message;
  }
}

std::shared_ptr<Communicator> join_world(int rank, int size, int port) {
  return testing::join_cpu_world(rank, size, port, 30s);
}

// --- a state every process can check ------------------------------------------------------------------------------

// Weights (which 0) and moments (1, 2) of flat element k in the state tagged `tag`: distinct across all three.
float value(int tag, int which, int64_t k) {
  const uint64_t h = (static_cast<uint64_t>(k) * 2654435761u + static_cast<uint64_t>(tag) * 40503u +
                      static_cast<uint64_t>(which) * 977u) %
                     1000003u;
  return static_cast<float>(h) * 1e-3f - (which == 2 ? 0.0f : 500.0f);
}

struct Rank {
  std::unique_ptr<Model> model = make_model(testing::tiny_llama_args(), 16);
  AdamW optimizer;
  // owned: the optimizer's ranges (empty: everything).
  explicit Rank(std::vector<FlatRange> owned = {}) : optimizer(model->params(), AdamWConfig{}, std::move(owned)) {}
  int64_t numel() const { return model->params().numel(); }
};

int64_t tiny_numel() {
  int64_t n = 0;
  for (const ParamSpec& s : LlamaModel::param_specs(testing::tiny_llama_args())) n += shape_numel(s.shape);
  return n;
}

// Rank r's shards of a distributed optimizer over `dp` ranks.
std::vector<FlatRange> shards(int64_t bucket, int dp, int rank) {
  return BucketLayout(tiny_numel(), bucket, dp).owned(rank);
}

void fill_state(Rank& r, int tag) {
  float* w = r.model->params().flat_params().f32();
  for (int64_t k = 0; k < r.numel(); ++k) w[k] = value(tag, 0, k);
  for (size_t i = 0; i < r.optimizer.owned().size(); ++i) {
    const FlatRange range = r.optimizer.owned()[i];
    float* m = r.optimizer.exp_avg(i).f32();
    float* v = r.optimizer.exp_avg_sq(i).f32();
    for (int64_t j = 0; j < range.size(); ++j) {
      m[j] = value(tag, 1, range.begin + j);
      v[j] = value(tag, 2, range.begin + j);
    }
  }
  r.optimizer.set_steps_taken(tag);
}

void poison(Rank& r) {
  r.model->params().flat_params().fill(-7.0f);
  for (size_t i = 0; i < r.optimizer.owned().size(); ++i) {
    r.optimizer.exp_avg(i).fill(-7.0f);
    r.optimizer.exp_avg_sq(i).fill(-7.0f);
  }
}

// The first element that differs from the state tagged `tag` (moments: zero when `zero_moments`), or empty.
std::string check_state(const Rank& r, int tag, bool zero_moments = false) {
  const float* w = r.model->params().flat_params().f32();
  for (int64_t k = 0; k < r.numel(); ++k) {
    if (w[k] != value(tag, 0, k)) return fmt::format("weight {} is {}, saved {}", k, w[k], value(tag, 0, k));
  }
  for (size_t i = 0; i < r.optimizer.owned().size(); ++i) {
    const FlatRange range = r.optimizer.owned()[i];
    const float* m = r.optimizer.exp_avg(i).f32();
    const float* v = r.optimizer.exp_avg_sq(i).f32();
    for (int64_t j = 0; j < range.size(); ++j) {
      const float want_m = zero_moments ? 0.0f : value(tag, 1, range.begin + j);
      const float want_v = zero_moments ? 0.0f : value(tag, 2, range.begin + j);
      if (m[j] != want_m) return fmt::format("exp_avg {} is {}, saved {}", range.begin + j, m[j], want_m);
      if (v[j] != want_v) return fmt::format("exp_avg_sq {} is {}, saved {}", range.begin + j, v[j], want_v);
    }
  }
  return {};
}

// The trainer state saved with the state tagged `tag` (tag <= iteration: no more optimizer steps than iterations).
TrainerState state_of(int64_t iteration, int tag) {
  return TrainerState{
      .iteration = iteration, .consumed_train_samples = 8 * iteration, .optimizer_steps = tag, .seed = kSeed, .fp8_scaling = {}};
}

// `size` ranks save the state tagged `tag` as `iteration`, each with its distributed-optimizer shards (bucket
// kSaveBucket); `hook` (optional) sees each rank's progress reports.
std::vector<RankResult> save_by(int size, const std::string& dir, int64_t iteration, int tag,
                                const std::function<void(int rank, const CheckpointProgress&)>& hook = {}) {
  return run_ranks(size, [&](int rank, int port) {
    const std::shared_ptr<Communicator> world = join_world(rank, size, port);
    const std::vector<FlatRange> ranges = shards(kSaveBucket, size, rank);
    Rank r(ranges);
    fill_state(r, tag);
    CheckpointProgressFn progress;
    if (hook) progress = [&](const CheckpointProgress& p) { hook(rank, p); };
    save_sharded_checkpoint(dir, *r.model, r.optimizer, ranges, *world, state_of(iteration, tag), "exp_name: tiny\n",
                            progress);
    return std::string();
  });
}

// `size` processes load `checkpoint` with the shards of a `size`-rank distributed optimizer over buckets of
// `bucket` (size 1: an optimizer that owns everything) and check every weight and owned moment.
std::vector<RankResult> load_into(int size, int64_t bucket, const std::string& checkpoint, int tag, int64_t iteration,
                                  bool zero_moments = false) {
  return run_ranks(size, [&](int rank, int) {
    Rank r(size == 1 ? std::vector<FlatRange>{} : shards(bucket, size, rank));
    poison(r);
    const TrainerState state = load_checkpoint(checkpoint, *r.model, r.optimizer);
    if (state.iteration != iteration || state.seed != kSeed) {
      return fmt::format("trainer state: iteration {} seed {}", state.iteration, state.seed);
    }
    if (r.optimizer.steps_taken() != (zero_moments ? 0 : tag)) {
      return fmt::format("optimizer steps {}", r.optimizer.steps_taken());
    }
    return check_state(r, tag, zero_moments);
  });
}

std::string tracker(const std::string& dir) { return read_file(dir + "/latest_checkpointed_iteration.txt"); }

// --- tests --------------------------------------------------------------------------------------------------------

TEST(ShardedCheckpoint, FourRanksSaveLoadsIntoOneTwoAndFourRanksOfOtherLayouts) {
  const std::string dir = testing::temp_dir("sharded-4");
  expect_all_ok(save_by(4, dir, 5, 1), "save by 4");
  const std::string ckpt = dir + "/iter_0000005";
  EXPECT_EQ(tracker(dir), "5\n");
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(fs::exists(ckpt + "/" + shard_file_name(r, 4))) << r;
  for (const char* name : {"index.json", "manifest.json", "trainer_state.json", "config.yaml", "config.json"}) {
    EXPECT_TRUE(fs::exists(ckpt + "/" + name)) << name;
  }
  EXPECT_FALSE(fs::exists(ckpt + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/iter_0000005.tmp"));
  EXPECT_NO_THROW(verify_checkpoint(ckpt));

  // The index: every tensor and moment, its slices tiling it; some tensor cut across ranks, and some shard
  // holding two slices of one tensor (named with '@').
  const nlohmann::json index = nlohmann::json::parse(read_file(ckpt + "/index.json"));
  EXPECT_EQ(index["world_size"], 4);
  size_t names = 0;
  bool cut_across_ranks = false;
  for (const ParamSpec& spec : LlamaModel::param_specs(testing::tiny_llama_args())) {
    for (const std::string prefix : {"", "exp_avg.", "exp_avg_sq."}) {
      const nlohmann::json& slices = index["tensors"][prefix + spec.name];
      ASSERT_TRUE(slices.is_array()) << prefix + spec.name;
      int64_t at = 0;
      for (const nlohmann::json& s : slices) {
        EXPECT_EQ(s["shape"].get<Shape>(), spec.shape);
        EXPECT_EQ(s["dtype"], "F32");
        EXPECT_EQ(s["slice"][0].get<int64_t>(), at) << prefix + spec.name;
        at = s["slice"][1].get<int64_t>();
      }
      EXPECT_EQ(at, shape_numel(spec.shape)) << prefix + spec.name;
      cut_across_ranks = cut_across_ranks || slices.size() > 1;
      ++names;
    }
  }
  EXPECT_EQ(index["tensors"].size(), names);
  EXPECT_TRUE(cut_across_ranks);
  bool two_slices_in_one_shard = false;
  for (int r = 0; r < 4; ++r) {
    const SafetensorsFile shard = SafetensorsFile::open(ckpt + "/" + shard_file_name(r, 4));
    for (const SafetensorsEntry& e : shard.entries()) {
      EXPECT_EQ(e.shape.size(), 1u) << e.name;
      two_slices_in_one_shard = two_slices_in_one_shard || e.name.find('@') != std::string::npos;
    }
  }
  EXPECT_TRUE(two_slices_in_one_shard);

  expect_all_ok(load_into(1, 0, ckpt, 1, 5), "4 -> 1");
  expect_all_ok(load_into(2, 1700, ckpt, 1, 5), "4 -> 2");
  expect_all_ok(load_into(4, 333, ckpt, 1, 5), "4 -> 4 (other buckets)");
  expect_all_ok(load_into(3, 512, ckpt, 1, 5), "4 -> 3");
}

TEST(ShardedCheckpoint, AWorldOfOneSavesTheSingleFileFormatWhichLoadsIntoFourRanksAndHuggingFace) {
  const std::string dir = testing::temp_dir("sharded-1");
  expect_all_ok(save_by(1, dir, 3, 2), "save by 1");  // an optimizer of many ranges (one per bucket)
  const std::string ckpt = dir + "/iter_0000003";
  EXPECT_TRUE(fs::exists(ckpt + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(ckpt + "/optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(ckpt + "/index.json"));
  expect_all_ok(load_into(4, kSaveBucket, ckpt, 2, 3), "1 -> 4");
  expect_all_ok(load_into(1, 0, ckpt, 2, 3), "1 -> 1");
  // model.safetensors + config.json there are a Hugging Face folder.
  expect_all_ok(run_ranks(1,
                          [&](int, int) {
                            Rank r;
                            poison(r);
                            load_hf_weights(ckpt, *r.model);
                            for (size_t i = 0; i < r.optimizer.owned().size(); ++i) {
                              r.optimizer.exp_avg(i).zero();
                              r.optimizer.exp_avg_sq(i).zero();
                            }
                            return check_state(r, 2, true);
                          }),
                "load_hf_weights of a single-file checkpoint");
}

TEST(ShardedCheckpoint, ConvertsToAHuggingFaceFolderAndBack) {
  const std::string dir = testing::temp_dir("sharded-convert");
  expect_all_ok(save_by(4, dir, 7, 3), "save by 4");
  const std::string hf = dir + "/hf";
  const ConversionSummary exported = export_checkpoint_to_hf(resolve_checkpoint_dir(dir), hf);
  EXPECT_TRUE(exported.sharded);
  EXPECT_EQ(exported.iteration, 7);
  EXPECT_EQ(exported.parameters, tiny_numel());
  // Every weight whole, under its Hugging Face name; no optimizer state.
  const SafetensorsFile model = SafetensorsFile::open(hf + "/model.safetensors");
  const std::vector<ParamSpec> specs = LlamaModel::param_specs(testing::tiny_llama_args());
  EXPECT_EQ(model.entries().size(), specs.size());
  for (const ParamSpec& spec : specs) {
    const SafetensorsEntry* e = model.find(spec.name);
    ASSERT_NE(e, nullptr) << spec.name;
    EXPECT_EQ(e->shape, spec.shape) << spec.name;
    EXPECT_EQ(e->dtype, "F32");
  }
  EXPECT_EQ(model.metadata().at("format"), "pt");
  EXPECT_EQ(read_file(hf + "/config.json"), read_file(dir + "/iter_0000007/config.json"));
  expect_all_ok(run_ranks(1,
                          [&](int, int) {
                            Rank r;
                            poison(r);
                            load_hf_weights(hf, *r.model);
                            for (size_t i = 0; i < r.optimizer.owned().size(); ++i) {
                              r.optimizer.exp_avg(i).zero();
                              r.optimizer.exp_avg_sq(i).zero();
                            }
                            return check_state(r, 3, true);
                          }),
                "load_hf_weights of the export");

  // Back: iteration 0, the same weights, zero moments, into a 2-rank layout.
  const std::string native = dir + "/native";
  const ConversionSummary imported = import_hf_to_checkpoint(hf, native, kSeed);
  EXPECT_EQ(imported.tensors, static_cast<int64_t>(specs.size()));
  EXPECT_TRUE(imported.ignored.empty());
  EXPECT_EQ(tracker(native), "0\n");
  expect_all_ok(load_into(2, 900, native + "/iter_0000000", 3, 0, true), "import -> 2");
  EXPECT_THROW(import_hf_to_checkpoint(hf, native, kSeed), UsageError);  // it holds checkpoints now

  // The command line does the same, and names bad paths (exit 2) and corrupt files (exit 3).
  if (!fs::exists(testing::cli_path())) GTEST_SKIP() << testing::cli_path() << " is not built";
  auto cli = [&](const std::vector<std::string>& args) {
    const std::string out = testing::temp_dir("sharded-cli");
    return testing::wait_cli(testing::spawn_cli(args, out), out);
  };
  const testing::CliResult to_hf = cli({"--", "checkpoint", "convert", "--input", dir, "--output", dir + "/hf2"});
  ASSERT_EQ(to_hf.exit_code, 0) << to_hf.err;
  EXPECT_NE(to_hf.out.find("sharded, iteration 7"), std::string::npos) << to_hf.out;
  EXPECT_EQ(read_file(dir + "/hf2/model.safetensors"), read_file(hf + "/model.safetensors"));
  const testing::CliResult to_native =
      cli({"--", "checkpoint", "convert", "--to", "native", "--input", hf, "--output", dir + "/native2"});
  ASSERT_EQ(to_native.exit_code, 0) << to_native.err;
  EXPECT_EQ(read_file(dir + "/native2/iter_0000000/model.safetensors"),
            read_file(native + "/iter_0000000/model.safetensors"));
  const testing::CliResult missing = cli({"--", "checkpoint", "convert", "--input", dir + "/nope", "--output", hf});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find(dir + "/nope"), std::string::npos) << missing.err;
  const testing::CliResult not_checkpoint = cli({"--", "checkpoint", "convert", "--input", hf, "--output", hf});
  EXPECT_EQ(not_checkpoint.exit_code, 2);
  EXPECT_NE(not_checkpoint.err.find(hf), std::string::npos) << not_checkpoint.err;
  const testing::CliResult no_config =
      cli({"--", "checkpoint", "convert", "--to", "native", "--input", dir, "--output", dir + "/native3"});
  EXPECT_EQ(no_config.exit_code, 2) << no_config.err;

  // A corrupt byte in a shard: the manifest's CRC names the file, exit 3.
  const std::string shard = dir + "/iter_0000007/" + shard_file_name(2, 4);
  std::string bytes = read_file(shard);
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  const testing::CliResult corrupt = cli({"--", "checkpoint", "convert", "--input", dir, "--output", dir + "/hf3"});
  EXPECT_EQ(corrupt.exit_code, 3);
  EXPECT_NE(corrupt.err.find(shard), std::string::npos) << corrupt.err;
  EXPECT_NE(corrupt.err.find("CRC32C"), std::string::npos) << corrupt.err;
}

TEST(ShardedCheckpoint, ARankThatDiesMidSaveLeavesThePreviousCheckpointAndTheNextSaveCleansUp) {
  const std::string dir = testing::temp_dir("sharded-crash");
  expect_all_ok(save_by(4, dir, 1, 1), "save of iteration 1");

  // Iteration 2: rank 2 dies once its shard's bytes are all written, before anything is committed.
  auto die_after_shard = [](int victim) {
    return [victim](int rank, const CheckpointProgress& p) {
      if (rank == victim && std::string(p.phase) == "save" && p.done_bytes == p.total_bytes && p.total_bytes > 0) {
        ::_exit(7);
      }
    };
  };
  const std::vector<RankResult> crashed = save_by(4, dir, 2, 2, die_after_shard(2));
  EXPECT_EQ(crashed[2].status, 7);
  for (int r : {0, 1, 3}) EXPECT_EQ(crashed[r].status, 1) << "rank " << r << ": " << crashed[r].message;
  EXPECT_EQ(tracker(dir), "1\n");
  EXPECT_EQ(find_latest_checkpoint(dir), dir + "/iter_0000001");
  EXPECT_TRUE(fs::exists(dir + "/iter_0000002.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/iter_0000002"));
  expect_all_ok(load_into(1, 0, *find_latest_checkpoint(dir), 1, 1), "the previous checkpoint after the crash");

  // Iteration 3: rank 0 dies after its shard; again nothing changes but a temporary.
  const std::vector<RankResult> crashed0 = save_by(4, dir, 3, 3, die_after_shard(0));
  EXPECT_EQ(crashed0[0].status, 7);
  EXPECT_EQ(tracker(dir), "1\n");
  EXPECT_TRUE(fs::exists(dir + "/iter_0000003.tmp"));

  // Iteration 4 succeeds and removes both temporaries (rank 0 removes them before it creates its own).
  expect_all_ok(save_by(4, dir, 4, 4), "save of iteration 4");
  EXPECT_EQ(tracker(dir), "4\n");
  EXPECT_FALSE(fs::exists(dir + "/iter_0000002.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/iter_0000003.tmp"));
  EXPECT_TRUE(fs::exists(dir + "/iter_0000001"));
  expect_all_ok(load_into(2, 600, dir + "/iter_0000004", 4, 4), "iteration 4");
}

TEST(ShardedCheckpoint, ARankThatFailsMakesEveryRankThrowAtOnce) {
  const std::string dir = testing::temp_dir("sharded-fail");
  const auto start = Clock::now();
  const std::vector<RankResult> results = save_by(3, dir, 1, 1, [](int rank, const CheckpointProgress& p) {
    if (rank == 1 && p.done_bytes > 0) throw RuntimeError("disk full (test)");
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 25.0);  // well below the 30 s timeout
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].status, 1) << r;
    EXPECT_NE(results[r].message.find("abandoned"), std::string::npos) << results[r].message;
  }
  EXPECT_NE(results[1].message.find("disk full (test)"), std::string::npos) << results[1].message;
  EXPECT_NE(results[0].message.find("rank(s) 1 could not write"), std::string::npos) << results[0].message;
  EXPECT_FALSE(fs::exists(dir + "/latest_checkpointed_iteration.txt"));
  EXPECT_FALSE(fs::exists(dir + "/iter_0000001"));
}

TEST(ShardedCheckpoint, RangesThatOverlapAreRefusedByEveryRank) {
  const std::string dir = testing::temp_dir("sharded-overlap");
  // Both ranks pass rank 0's shards: rank 1's optimizer owns everything, so only the tiling check stops it.
  const std::vector<RankResult> results = run_ranks(2, [&](int rank, int port) {
    const std::shared_ptr<Communicator> world = join_world(rank, 2, port);
    const std::vector<FlatRange> ranges = shards(kSaveBucket, 2, 0);
    Rank r(rank == 0 ? ranges : std::vector<FlatRange>{});
    fill_state(r, 1);
    save_sharded_checkpoint(dir, *r.model, r.optimizer, ranges, *world, state_of(1, 1), "", {});
    return std::string();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].status, 1) << r;
    EXPECT_NE(results[r].message.find("overlaps"), std::string::npos) << results[r].message;
  }
  EXPECT_FALSE(fs::exists(dir + "/latest_checkpointed_iteration.txt"));
}

TEST(ShardedCheckpoint, ACorruptShardByteIsCaughtNamingTheFile) {
  const std::string dir = testing::temp_dir("sharded-corrupt");
  expect_all_ok(save_by(2, dir, 1, 1), "save by 2");
  const std::string ckpt = dir + "/iter_0000001";
  const std::string shard = ckpt + "/" + shard_file_name(1, 2);
  std::string bytes = read_file(shard);
  bytes[bytes.size() - 5] ^= 0x01;
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  try {
    verify_checkpoint(ckpt);
    FAIL() << "a corrupt shard verified";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(shard), std::string::npos) << e.what();
  }
  const std::vector<RankResult> loaded = load_into(1, 0, ckpt, 1, 1);
  EXPECT_EQ(loaded[0].status, 1);
  EXPECT_NE(loaded[0].message.find(shard), std::string::npos) << loaded[0].message;

  // A shard cut short: the manifest's size names it before any CRC is computed.
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  try {
    verify_checkpoint(ckpt);
    FAIL() << "a truncated shard verified";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(shard), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

// Issue 12, hole 7 for this format: the manifest cannot exempt a file from verification, and index.json cannot make
// the loader read a file the manifest does not cover.
TEST(ShardedCheckpoint, TheManifestMustListEveryFileTheLoaderReads) {
  const std::string dir = testing::temp_dir("sharded-manifest");
  expect_all_ok(save_by(2, dir, 1, 1), "save by 2");
  const std::string saved = dir + "/iter_0000001";
  auto fresh_copy = [&] {
    const std::string copy = testing::temp_dir("sharded-manifest-copy") + "/iter_0000001";
    fs::copy(saved, copy);
    return copy;
  };
  auto message_of_verify = [](const std::string& ckpt) -> std::string {
    try {
      verify_checkpoint(ckpt);
    } catch (const RuntimeError& e) {
      return e.what();
    }
    ADD_FAILURE() << ckpt << " verified";
    return "";
  };
  // Rewrites a file and its manifest entry, as a careful hand-edit would.
  auto rewrite = [](const std::string& ckpt, const std::string& name, const std::string& text) {
    write_file_atomic(ckpt + "/" + name, text);
    nlohmann::json manifest = nlohmann::json::parse(read_file(ckpt + "/manifest.json"));
    manifest["files"][name] = {{"bytes", text.size()}, {"crc32c", crc32c(text)}};
    write_file_atomic(ckpt + "/manifest.json", manifest.dump());
  };

  for (const std::string& name :
       {std::string("index.json"), shard_file_name(0, 2), shard_file_name(1, 2), std::string("trainer_state.json"),
        std::string("config.yaml"), std::string("config.json")}) {
    const std::string ckpt = fresh_copy();
    nlohmann::json manifest = nlohmann::json::parse(read_file(ckpt + "/manifest.json"));
    manifest["files"].erase(name);
    write_file_atomic(ckpt + "/manifest.json", manifest.dump());
    std::string bytes = read_file(ckpt + "/" + name);
    bytes[bytes.size() / 2] ^= 0x01;
    write_file_atomic(ckpt + "/" + name, bytes);
    const std::string message = message_of_verify(ckpt);
    EXPECT_NE(message.find(ckpt + "/manifest.json"), std::string::npos) << message;
    EXPECT_NE(message.find(name), std::string::npos) << message;
  }

  // index.json says three ranks wrote shards: their files, shard_<r>_of_3, must be in the manifest.
  std::string ckpt = fresh_copy();
  nlohmann::json index = nlohmann::json::parse(read_file(ckpt + "/index.json"));
  index["world_size"] = 3;
  rewrite(ckpt, "index.json", index.dump());
  std::string message = message_of_verify(ckpt);
  EXPECT_NE(message.find(shard_file_name(0, 3)), std::string::npos) << message;

  // A slice in a file that is no shard of the index (listed in the manifest, so it verifies) is not read.
  ckpt = fresh_copy();
  rewrite(ckpt, "other.safetensors", read_file(ckpt + "/" + shard_file_name(1, 2)));
  index = nlohmann::json::parse(read_file(ckpt + "/index.json"));
  for (auto& [name, slices] : index["tensors"].items()) {
    for (auto& slice : slices) {
      if (slice["file"] == shard_file_name(1, 2)) slice["file"] = "other.safetensors";
    }
  }
  rewrite(ckpt, "index.json", index.dump());
  EXPECT_NO_THROW(verify_checkpoint(ckpt));
  try {
    TensorCatalog::open_checkpoint(ckpt);
    FAIL() << "a slice outside the shards was accepted";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("other.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(ckpt + "/index.json"), std::string::npos) << e.what();
  }

  // Malformed values name index.json and the key (hole 13), instead of a raw [json.exception...].
  auto first_error = [](const std::string& ckpt) -> std::string {
    try {
      verify_checkpoint(ckpt);
      TensorCatalog::open_checkpoint(ckpt);
    } catch (const RuntimeError& e) {
      return e.what();
    }
    return "";
  };
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"format", 5}, {"world_size", -2}, {"world_size", "2"}, {"tensors", nlohmann::json::array()}}) {
    ckpt = fresh_copy();
    index = nlohmann::json::parse(read_file(ckpt + "/index.json"));
    index[key] = value;
    rewrite(ckpt, "index.json", index.dump());
    message = first_error(ckpt);
    EXPECT_NE(message.find(ckpt + "/index.json"), std::string::npos) << key << ": " << message;
    EXPECT_NE(message.find(key), std::string::npos) << key << ": " << message;
  }
}

// Found by fuzz/safetensors_fuzzer: a non-string "format" escaped as nlohmann's type_error; by reading beside it: a
// shape whose product overflows int64 was undefined behaviour, and negative dimensions or integers past int64
// were taken. Each is a RuntimeError naming index.json and the field.
TEST(ShardedCheckpoint, AHostileIndexIsRefusedNamingTheField) {
  const std::string dir = testing::temp_dir("sharded-hostile-index");
  auto error_of = [&](const std::string& index) {
    std::ofstream(dir + "/index.json", std::ios::trunc) << index;
    try {
      TensorCatalog::open_checkpoint(dir);
    } catch (const RuntimeError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "opened " << index;
    return std::string();
  };
  auto with_shape = [](const std::string& shape) {
    return R"({"format": "primus-sharded-checkpoint", "world_size": 1, "tensors": {"w": [{"file": "shard_0_of_1.safetensors", "key": "w", )"
           R"("shape": )" +
           shape + R"(, "slice": [0, 0]}]}})";
  };
  const std::string format_error = error_of(R"({"format": {"total_size": 24}})");
  EXPECT_NE(format_error.find("index.json"), std::string::npos) << format_error;
  EXPECT_NE(format_error.find("format"), std::string::npos) << format_error;
  EXPECT_NE(error_of(with_shape("[4294967296, 4294967296, 16]"))
                .find("tensors.w[0]: shape [4294967296, 4294967296, 16] has a negative dimension or more than 2^63"),
            std::string::npos);
  EXPECT_NE(error_of(with_shape("[-4, -2]")).find("shape [-4, -2] has a negative dimension"), std::string::npos);
  EXPECT_NE(error_of(with_shape("[18446744073709551615]")).find("tensors.w[0].shape: expected an integer"),
            std::string::npos);
}

}  // namespace
}  // namespace primus
