// `projection performance` and `tune` (train/step_projection.h, train/tune.h): the projected step of the shipped H200
// configs against the steps the engine measured on an H200; the GEMM FLOPs against the model's own count through
// measured rates; the pipeline bubble, tensor parallelism and the data-parallel reduction as the formulas say;
// measured-rate files with bad lines; the tuner's ranking and its winner.
#include "train/step_projection.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "config/config.h"
#include "core/error.h"
#include "models/model.h"
#include "support/test_support.h"
#include "train/benchmark.h"
#include "train/tune.h"

namespace primus {
namespace {

const std::string kConfigs = PRIMUS_SOURCE_DIR "/configs/H200/";

ExperimentConfig load(const std::string& file, const std::vector<std::string>& overrides = {}, int world = 1) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  return load_experiment_config(kConfigs + file, overrides).config;
}

PerformanceProjection project(const std::string& file, const std::vector<std::string>& overrides = {},
                              ClusterShape cluster = {}, const MeasuredRates* rates = nullptr) {
  return project_performance(load(file, overrides, cluster.world()), find_gpu("H200"), cluster, rates);
}

// `work` throws a UsageError whose message contains `text`.
template <typename Work>
void expect_usage_error(Work work, const std::string& text) {
  try {
    work();
    ADD_FAILURE() << "no UsageError; expected one saying: " << text;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

double part_ms(const PerformanceProjection& p, const std::string& name) {
  for (const StepPart& part : p.parts) {
    if (part.name == name) return part.ms;
  }
  return 0.0;
}

// The H200 row is calibrated on these steps (`benchmark train`, median step, docs/perf/train-h200.md v2/v3): its one
// fitted figure, the memory-bound share, came from the first three; the other runs were not used to fit.
TEST(StepProjection, TheH200StepsTheEngineMeasuredWithinFivePercent) {
  struct Measured {
    std::string config;
    std::vector<std::string> overrides;
    double step_ms;
  };
  const std::vector<Measured> runs = {
      {"llama3.2_1B-bf16-pretrain.yaml", {}, 259.2},
      {"llama3.2_3B-bf16-pretrain.yaml", {}, 629.7},
      {"qwen3_1.7B-bf16-pretrain.yaml", {}, 368.7},
      {"llama3.2_1B-bf16-pretrain.yaml", {"recompute_granularity=selective"}, 262.9},
      {"llama3.2_1B-bf16-pretrain.yaml", {"recompute_granularity=full"}, 318.2},
      // MoE (2026-12-05, docs/perf/moe.md): the grouped GEMM's share came from its own benchmark, not these steps.
      {"mixtral_4L-bf16-bench.yaml", {}, 382.7},
      {"qwen3_moe_4L-bf16-bench.yaml", {}, 184.7},
  };
  for (const Measured& run : runs) {
    const PerformanceProjection p = project(run.config, run.overrides);
    EXPECT_NEAR(p.step_ms / run.step_ms, 1.0, 0.05) << run.config << " " << ::testing::PrintToString(run.overrides)
                                                    << ": projected " << p.step_ms << " ms";
    double sum = 0.0;
    for (const StepPart& part : p.parts) sum += part.ms;
    EXPECT_NEAR(sum, p.step_ms, 1e-9);
    EXPECT_NEAR(p.tokens_per_s_per_gpu, static_cast<double>(p.tokens_per_step) / (p.step_ms * 1e-3), 1e-6);
  }
}

// With every GEMM pass rated by a measurement file, the GEMM time is the model's own matmul FLOPs (6 per parameter
// a token passes through: forward 2, backward 4) at that rate; a recomputed layer adds its forward.
TEST(StepProjection, MeasuredRatesCostTheModelsMatmulFlops) {
  const std::string path = testing::temp_dir("step_projection") + "/gemm.jsonl";
  {
    std::ofstream out(path);
    for (const char* op : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}) {
      for (const char* pass : {"forward", "data_grad", "weight_grad"}) {
        out << nlohmann::json{{"op", op}, {"pass", pass}, {"tflops", 500.0}, {"ms", 1.0}}.dump() << "\n";
      }
    }
    out << "\n" << nlohmann::json{{"op", "attention"}, {"pass", "forward"}, {"tflops", 300.0}}.dump() << "\n";
    out << nlohmann::json{{"op", "attention"}, {"pass", "backward"}, {"tflops", 250.0}}.dump() << "\n";
  }
  const MeasuredRates rates = read_measured_rates({path});
  const ExperimentConfig config = load("llama3.2_1B-bf16-pretrain.yaml");
  const ModelArgs args = with_vocab_size(config.model, config.train);
  const double tokens = static_cast<double>(config.train.micro_batch_size * config.train.seq_length);
  const double flops = 6.0 * static_cast<double>(model_family(args).matmul_params(args)) * tokens;
  const PerformanceProjection p = project("llama3.2_1B-bf16-pretrain.yaml", {}, {}, &rates);
  EXPECT_NEAR(part_ms(p, "GEMMs"), flops / 500e9, 1e-9 * flops / 500e9);
  // Attention: forward 2·B·T²·H·D at 300, backward 2.5 × that at 250.
  const double forward = 2.0 * tokens * static_cast<double>(config.train.seq_length) *
                         static_cast<double>(args.num_layers * args.num_attention_heads * args.kv_channels);
  EXPECT_NEAR(part_ms(p, "attention"), forward / 300e9 + 2.5 * forward / 250e9, 1e-6);
  EXPECT_NE(p.rates_source.find("21 of 21 GEMM passes and attention measured"), std::string::npos) << p.rates_source;
  // A layer recomputed in full runs its forward GEMMs again (not the output layer's): 8 of the 6 units of work.
  const PerformanceProjection full = project("llama3.2_1B-bf16-pretrain.yaml", {"recompute_granularity=full"}, {}, &rates);
  const double head = 6.0 * static_cast<double>(args.hidden_size * args.vocab_size) * tokens;
  EXPECT_NEAR(part_ms(full, "GEMMs"), (head + (flops - head) * 8.0 / 6.0) / 500e9, 1e-6);
}

// The GEMM list (models/gemm_shapes.h) against the model's own parameter table for MoE and multi-head latent
// attention too: DeepSeek-V2-Lite's low-rank key/value projections, its router, routed experts (top-6 of 64 a
// token), shared experts and dense first layer, and Mixtral's experts, all rated alike, cost 6 FLOPs per matmul
// parameter a token passes through.
TEST(StepProjection, TheGemmListIsTheModelsForMoeAndLatentAttention) {
  const std::string dir = testing::temp_dir("step_projection_moe");
  std::ofstream out(dir + "/gemm.jsonl");
  for (const char* op : {"q_proj", "q_a_proj", "q_b_proj", "k_proj", "v_proj", "kv_a_proj_with_mqa", "kv_b_proj",
                         "o_proj", "gate_up_proj", "down_proj", "router", "experts.gate_up", "experts.down",
                         "shared_experts.gate_up", "shared_experts.down", "lm_head"}) {
    for (const char* pass : {"forward", "data_grad", "weight_grad"}) {
      out << nlohmann::json{{"op", op}, {"pass", pass}, {"tflops", 400.0}}.dump() << "\n";
    }
  }
  out.close();
  const MeasuredRates rates = read_measured_rates({dir + "/gemm.jsonl"});
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  setenv("WORLD_SIZE", "1", 1);
  for (const char* preset : {"deepseek_v2_lite", "mixtral_8x7B"}) {
    const std::string path = dir + "/" + preset + ".yaml";
    std::ofstream(path) << "exp_name: moe\nmodules:\n  pre_trainer:\n    framework: megatron\n    model: " << preset
                        << "\n    overrides: {train_iters: 1, seq_length: 2048, micro_batch_size: 1, lr: 1.0e-4, "
                           "bf16: true, mock_data: true}\n";
    const ExperimentConfig config = load_experiment_config(path, {}).config;
    const ModelArgs args = with_vocab_size(config.model, config.train);
    const double flops = 6.0 * static_cast<double>(model_family(args).matmul_params(args)) * 2048.0;
    const PerformanceProjection p = project_performance(config, find_gpu("H200"), {}, &rates);
    // The experts' grouped GEMMs are a part of their own (at the grouped kernel's rate in the table).
    const double gemms = part_ms(p, "GEMMs") + part_ms(p, "experts' grouped GEMMs");
    EXPECT_GT(part_ms(p, "experts' grouped GEMMs"), 0.0) << preset;
    EXPECT_NEAR(gemms, flops / 400e9, 1e-9 * flops / 400e9) << preset;
    // Every GEMM pass came from the file: "K of K GEMM passes".
    const std::string counts = p.rates_source.substr(0, p.rates_source.find(" GEMM passes and not attention measured"));
    const size_t of = counts.find(" of ");
    ASSERT_NE(of, std::string::npos) << p.rates_source;
    EXPECT_EQ(counts.substr(0, of), counts.substr(of + 4)) << p.rates_source;
  }
}

TEST(StepProjection, BadRateFilesNameTheFileAndLine) {
  const std::string dir = testing::temp_dir("step_projection_bad");
  auto write = [&](const std::string& text) {
    std::ofstream(dir + "/rates.jsonl") << text;
    return dir + "/rates.jsonl";
  };
  expect_usage_error([&] { read_measured_rates({dir + "/none.jsonl"}); }, "none.jsonl: cannot read");
  const std::string good = R"({"op": "q_proj", "pass": "forward", "tflops": 1})";
  expect_usage_error([&] { read_measured_rates({write(good + "\n{oops\n")}); }, "rates.jsonl line 2: not a JSON object");
  expect_usage_error([&] { read_measured_rates({write(R"({"op": "q_proj", "pass": "forward"})")}); },
                     "line 1: no \"tflops\"");
  expect_usage_error([&] { read_measured_rates({write(R"({"op": "q_proj", "pass": "forward", "tflops": -3})")}); },
                     "a positive number");
}

// The pipeline's bubble is (p − 1)/v micro-batches of the slowest stage; interleaving shrinks it.
TEST(StepProjection, PipelineBubbleIsTheFormulas) {
  const ClusterShape four{1, 4};
  const std::vector<std::string> base = {"pipeline_model_parallel_size=4", "micro_batch_size=1",
                                         "global_batch_size=8"};
  const PerformanceProjection plain = project("llama3.2_1B-bf16-pretrain.yaml", base, four);
  ASSERT_EQ(plain.micro_batches, 8);
  const double compute = part_ms(plain, "GEMMs") + part_ms(plain, "attention") +
                         part_ms(plain, "norms, RoPE, SwiGLU, adds, loss");
  EXPECT_NEAR(part_ms(plain, "pipeline bubble"), 3.0 * compute / 8.0, 1e-9);
  EXPECT_GT(part_ms(plain, "pipeline send/receive"), 0.0);
  std::vector<std::string> interleaved = base;
  interleaved.push_back("num_layers_per_virtual_pipeline_stage=2");
  const PerformanceProjection v2 = project("llama3.2_1B-bf16-pretrain.yaml", interleaved, four);
  EXPECT_NEAR(part_ms(v2, "pipeline bubble"), part_ms(plain, "pipeline bubble") / 2.0, 1e-6);
  EXPECT_EQ(plain.model_parallel_ranks, 4);
}

// Data parallelism: the gradient reduction crosses the NIC when the group spans nodes, and overlapping it with
// backward hides all but a bucket; tensor parallelism adds its all-reduces; per-GPU tokens/s never rises with scale.
TEST(StepProjection, CommunicationFollowsTheLinksAndTheOverlap) {
  const std::vector<std::string> dp = {"micro_batch_size=1", "global_batch_size=16", "use_distributed_optimizer=true"};
  const PerformanceProjection node = project("llama3.2_3B-bf16-pretrain.yaml", dp, {1, 16});
  const PerformanceProjection nodes = project("llama3.2_3B-bf16-pretrain.yaml", dp, {2, 8});
  EXPECT_GT(part_ms(node, "gradient reduce-scatter"), 0.0);
  EXPECT_GT(part_ms(nodes, "gradient reduce-scatter"), 3.0 * part_ms(node, "gradient reduce-scatter"));
  // Overlapped: inside the node the reduction hides behind the last micro-batch's backward but for the last bucket;
  // across nodes it takes longer than that backward, and the excess shows.
  std::vector<std::string> overlapped = dp;
  overlapped.push_back("overlap_grad_reduce=true");
  const PerformanceProjection node_hidden = project("llama3.2_3B-bf16-pretrain.yaml", overlapped, {1, 16});
  EXPECT_LT(part_ms(node_hidden, "gradient reduce-scatter"), 0.2 * part_ms(node, "gradient reduce-scatter"));
  const PerformanceProjection hidden = project("llama3.2_3B-bf16-pretrain.yaml", overlapped, {2, 8});
  EXPECT_LT(part_ms(hidden, "gradient reduce-scatter"), part_ms(nodes, "gradient reduce-scatter"));
  EXPECT_GT(part_ms(hidden, "gradient reduce-scatter"), 0.2 * part_ms(nodes, "gradient reduce-scatter"));
  const PerformanceProjection one = project("llama3.2_3B-bf16-pretrain.yaml", {"micro_batch_size=1", "global_batch_size=1"});
  EXPECT_LE(hidden.tokens_per_s_per_gpu, one.tokens_per_s_per_gpu);

  const PerformanceProjection tp = project(
      "llama3.2_3B-bf16-pretrain.yaml",
      {"micro_batch_size=1", "global_batch_size=1", "tensor_model_parallel_size=2", "sequence_parallel=true"}, {1, 2});
  EXPECT_GT(part_ms(tp, "tensor-parallel all-reduce"), 0.0);
  EXPECT_EQ(part_ms(tp, "gradient all-reduce"), 0.0);
  EXPECT_LT(part_ms(tp, "GEMMs"), 0.51 * part_ms(one, "GEMMs"));
  EXPECT_LT(tp.tokens_per_s_per_gpu, one.tokens_per_s_per_gpu);
}

TEST(StepProjection, AGpuWithoutRatesIsRefusedByName) {
  GpuModel unknown;
  unknown.name = "NVIDIA A100-SXM4-80GB";
  unknown.memory_bytes = 80'000'000'000;
  expect_usage_error([&] { project_performance(load("llama3.2_1B-bf16-pretrain.yaml"), unknown, {}); },
                     "--gpu: no performance figures for NVIDIA A100-SXM4-80GB");
  GpuModel h200_by_driver = unknown;
  h200_by_driver.name = "NVIDIA H200";
  EXPECT_GT(project_performance(load("llama3.2_1B-bf16-pretrain.yaml"), h200_by_driver, {}).step_ms, 0.0);
}

// The tuner: every candidate it ranks fits and loads, fastest first; the winner on 8 GPUs keeps tp at 1 for a 3B
// model (tensor parallelism only adds communication there) and is at least as fast as the config as given.
TEST(Tune, RanksFittingLayoutsFastestFirst) {
  setenv("PRIMUS_CONFIGS_DIR", PRIMUS_SOURCE_DIR "/configs", 1);
  const ClusterShape cluster{1, 8};
  const TuneResult r =
      tune_layouts(kConfigs + "llama3.2_3B-bf16-pretrain.yaml", {"global_batch_size=32"}, find_gpu("H200"), cluster);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(r.tried, static_cast<int64_t>(r.ranked.size()) + r.too_big + r.invalid);
  for (size_t i = 1; i < r.ranked.size(); ++i) {
    EXPECT_GE(r.ranked[i - 1].performance.tokens_per_s_per_gpu, r.ranked[i].performance.tokens_per_s_per_gpu);
  }
  for (const TuneCandidate& c : r.ranked) EXPECT_EQ(c.verdict, MemoryVerdict::kFits);
  const TuneCandidate& best = r.ranked.front();
  EXPECT_NE(std::find(best.overrides.begin(), best.overrides.end(), "tensor_model_parallel_size=1"),
            best.overrides.end());
  std::vector<std::string> overrides = {"global_batch_size=32"};
  overrides.insert(overrides.end(), best.overrides.begin(), best.overrides.end());
  const PerformanceProjection again = project("llama3.2_3B-bf16-pretrain.yaml", overrides, cluster);
  EXPECT_DOUBLE_EQ(again.tokens_per_s_per_gpu, best.performance.tokens_per_s_per_gpu);
  const PerformanceProjection given = project("llama3.2_3B-bf16-pretrain.yaml", {"global_batch_size=32"}, cluster);
  EXPECT_GE(best.performance.tokens_per_s_per_gpu, given.tokens_per_s_per_gpu);
  EXPECT_NE(format_tune_result(r, find_gpu("H200"), cluster, 3).find(best.summary), std::string::npos);
  EXPECT_NE(format_overrides_yaml(best.overrides).find("  tensor_model_parallel_size: 1\n"), std::string::npos);
}

}  // namespace
}  // namespace primus
