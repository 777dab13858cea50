// The memory projection against what the ranks hold (issue 17: per-rank memory within 5% on CPU ranks for the
// layouts the parity tests run). Each layout trains a few steps of the layout matrix's shape as a `train pretrain`
// job of CPU ranks over Gloo; rank 0's peak of host tensor bytes (mem_peak_gib in metrics.jsonl, core/host_memory.h)
// is compared with `projection memory`'s total for rank 0's stage (train/projection.h) of the same config.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "support/cli_process.h"
#include "support/test_support.h"
#include "support/training_job.h"
#include "train/projection.h"

namespace primus {
namespace {

using testing::with;

// The layout matrix's shape (4 layers, 4 key/value groups), two micro-batches of 2 × 64 tokens a step on each
// data-parallel rank: the activations are about a third of a rank's bytes, so their estimate counts.
const std::vector<std::string> kShape{"num_layers=4",     "num_query_groups=4", "vocab_size=384", "seq_length=64",
                                      "train_iters=3",    "eval_interval=0",    "global_batch_size=8"};
const std::vector<std::string> kMoe{"num_experts=4", "moe_router_topk=2", "moe_ffn_hidden_size=48",
                                    "moe_aux_loss_coeff=0.01"};

struct Layout {
  const char* name;
  int ranks;
  std::vector<std::string> overrides;
};

std::ostream& operator<<(std::ostream& os, const Layout& layout) { return os << layout.name; }

const Layout kLayouts[] = {
    {"one_rank", 1, {}},
    {"dp2", 2, {}},
    {"dp2_distopt", 2, {"use_distributed_optimizer=true", "ddp_bucket_size=7001"}},
    {"dp2_fsdp_zero3", 2, {"use_megatron_fsdp=true", "data_parallel_sharding_strategy=optim_grads_params"}},
    {"tp2_sp", 2, {"tensor_model_parallel_size=2", "sequence_parallel=true"}},
    {"pp2", 2, {"pipeline_model_parallel_size=2"}},
    {"pp2_interleaved", 2, {"pipeline_model_parallel_size=2", "num_layers_per_virtual_pipeline_stage=1"}},
    {"cp2", 2, {"context_parallel_size=2"}},
    {"full_recompute", 1, {"recompute_granularity=full"}},
    {"moe_one_rank", 1, kMoe},
    {"moe_ep2", 2, with(kMoe, {"expert_model_parallel_size=2", "use_distributed_optimizer=true"})},
};

class MemoryAccuracy : public ::testing::TestWithParam<Layout> {};

TEST_P(MemoryAccuracy, RankZerosPeakIsTheProjectionWithinFivePercent) {
  const Layout& layout = GetParam();
  const std::vector<std::string> overrides = with(kShape, layout.overrides);
  testing::Job job{testing::temp_dir(std::string("memory_") + layout.name), overrides, layout.ranks};
  testing::run_job(job);
  if (HasFatalFailure()) return;

  // The second step's record: past the first step's allocations, before the checkpoint saved at the end.
  std::istringstream metrics(testing::read_text(job.workspace + "/dp/metrics.jsonl"));
  double peak_gib = 0.0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record["step"] == 2) peak_gib = record.at("mem_peak_gib").get<double>();
  }
  ASSERT_GT(peak_gib, 0.0) << "no step 2 record with mem_peak_gib";
  const double measured = peak_gib * static_cast<double>(int64_t{1} << 30);

  setenv("WORLD_SIZE", std::to_string(layout.ranks).c_str(), 1);
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  const LoadedConfig loaded = load_experiment_config(job.workspace + "/dp.yaml", overrides);
  unsetenv("WORLD_SIZE");  // the next job's ranks get their own
  const MemoryProjection projection = project_memory(loaded.config, find_gpu("H200"), layout.ranks);
  const double planned = static_cast<double>(projection.stages.front().total_bytes());
  EXPECT_NEAR(measured / planned, 1.0, 0.05) << layout.name << ": rank 0 held at most " << measured
                                             << " bytes, the projection planned " << planned;
  RecordProperty("measured_bytes", std::to_string(static_cast<int64_t>(measured)));
  RecordProperty("planned_bytes", std::to_string(static_cast<int64_t>(planned)));
  std::printf("%s: measured %.0f, planned %.0f, ratio %.4f\n", layout.name, measured, planned, measured / planned);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MemoryAccuracy, ::testing::ValuesIn(kLayouts),
                         [](const ::testing::TestParamInfo<Layout>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace primus
