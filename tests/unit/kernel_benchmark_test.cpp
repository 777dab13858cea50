// benchmark gemm / attention on the CPU: the GEMMs are the ones one rank of the config runs (shapes under tensor and
// context parallelism, the experts' grouped GEMMs, the output layer's logits chunk), each with its three passes and
// 2·M·N·K FLOPs, timed.
#include "tools/kernel_benchmark.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>

#include "core/error.h"

namespace primus {
namespace {

ModelArgs small_model() {
  ModelArgs a;
  a.num_layers = 2;
  a.hidden_size = 64;
  a.ffn_hidden_size = 96;
  a.num_attention_heads = 8;
  a.num_query_groups = 2;
  a.kv_channels = 8;
  a.vocab_size = 320;
  return a;
}

TrainingArgs batch(int64_t tp, int64_t cp) {
  TrainingArgs t;
  t.micro_batch_size = 2;
  t.seq_length = 32;
  t.tensor_model_parallel_size = tp;
  t.context_parallel_size = cp;
  return t;
}

const KernelBenchmarkOptions kQuick{.warmup = 1, .iters = 3};

std::map<std::string, KernelTiming> by_name(const std::vector<KernelTiming>& timings) {
  std::map<std::string, KernelTiming> out;
  for (const KernelTiming& t : timings) {
    EXPECT_TRUE(out.emplace(t.op + "/" + t.pass, t).second) << t.op << " " << t.pass << " twice";
    EXPECT_GT(t.ms, 0.0) << t.op << " " << t.pass;
    if (t.m > 0) {
      EXPECT_DOUBLE_EQ(t.flops, 2.0 * t.m * t.n * t.k) << t.op << " " << t.pass;
    }
  }
  return out;
}

void expect_gemm(const std::map<std::string, KernelTiming>& g, const std::string& op, int64_t rows, int64_t in,
                 int64_t out) {
  ASSERT_TRUE(g.count(op + "/forward") && g.count(op + "/data_grad") && g.count(op + "/weight_grad")) << op;
  const KernelTiming& f = g.at(op + "/forward");
  const KernelTiming& d = g.at(op + "/data_grad");
  const KernelTiming& w = g.at(op + "/weight_grad");
  EXPECT_EQ(std::tuple(f.m, f.n, f.k), std::tuple(rows, out, in)) << op;
  EXPECT_EQ(std::tuple(d.m, d.n, d.k), std::tuple(rows, in, out)) << op;
  EXPECT_EQ(std::tuple(w.m, w.n, w.k), std::tuple(out, in, rows)) << op;
}

TEST(KernelBenchmark, DenseGemmsAreOneRanksUnderTensorAndContextParallelism) {
  // tp 2: 4 query heads and 1 key/value head of 8, half the MLP and vocabulary; cp 2: half the tokens.
  const auto g = by_name(benchmark_gemms(small_model(), batch(2, 2), kCpuDevice, DType::kF32, kQuick));
  EXPECT_EQ(g.size(), 7u * 3u);
  const int64_t rows = 2 * 32 / 2;
  expect_gemm(g, "q_proj", rows, 64, 4 * 8);
  expect_gemm(g, "k_proj", rows, 64, 1 * 8);
  expect_gemm(g, "v_proj", rows, 64, 1 * 8);
  expect_gemm(g, "o_proj", rows, 4 * 8, 64);
  expect_gemm(g, "gate_up_proj", rows, 64, 96);
  expect_gemm(g, "down_proj", rows, 48, 64);
  expect_gemm(g, "lm_head", rows, 64, 160);
  EXPECT_EQ(g.count("experts.gate_up/forward"), 0u);
}

TEST(KernelBenchmark, MoeLayersAddTheRouterAndTheExpertsGroupedGemms) {
  ModelArgs a = small_model();
  a.num_experts = 4;
  a.moe_router_topk = 2;
  a.moe_ffn_hidden_size = 40;
  const auto every = by_name(benchmark_gemms(a, batch(1, 1), kCpuDevice, DType::kF32, kQuick));
  const int64_t rows = 64, routed = rows * 2;
  expect_gemm(every, "router", rows, 64, 4);
  const KernelTiming& up = every.at("experts.gate_up/forward");
  EXPECT_EQ(std::tuple(up.m, up.n, up.k), std::tuple(routed, 80, 64));
  const KernelTiming& down_w = every.at("experts.down/weight_grad");  // each expert's dw: [64, 40] over 32 rows
  EXPECT_DOUBLE_EQ(down_w.flops, 2.0 * 64 * 40 * routed);
  EXPECT_EQ(every.count("gate_up_proj/forward"), 0u) << "every layer is MoE";
  a.moe_first_k_dense_replace = 1;
  const auto mixed = by_name(benchmark_gemms(a, batch(1, 1), kCpuDevice, DType::kF32, kQuick));
  expect_gemm(mixed, "gate_up_proj", rows, 64, 192);
}

TEST(KernelBenchmark, AttentionCountsTheCausalHalf) {
  const std::vector<KernelTiming> a = benchmark_attention(small_model(), batch(1, 1), kCpuDevice, DType::kF32, kQuick);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].pass, "forward");
  EXPECT_DOUBLE_EQ(a[0].flops, 2.0 * 2 * 32 * 32 * 8 * 8);
  EXPECT_DOUBLE_EQ(a[1].flops, 2.5 * a[0].flops);
  EXPECT_GT(a[1].ms, 0.0);
  EXPECT_FALSE(dense_peak_tflops(kCpuDevice, DType::kF32).has_value());
  const std::string table = format_kernel_timings(a, std::nullopt);
  EXPECT_NE(table.find("attention        backward"), std::string::npos) << table;
  EXPECT_EQ(kernel_timing_json(a[1], 989.0)["percent_of_peak"].get<double>(), 100.0 * a[1].tflops() / 989.0);
}

// --fp8 on the CPU: refused as bad input (exit 2) naming the device, before anything is timed.
TEST(KernelBenchmark, Fp8GemmsAreRefusedOnTheCpu) {
  for (const Fp8GemmRecipe recipe : {Fp8GemmRecipe::kTensorwise, Fp8GemmRecipe::kBlockwise}) {
    try {
      benchmark_fp8_gemms(small_model(), batch(1, 1), kCpuDevice, recipe, kQuick);
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--fp8: fp8 GEMMs need a GPU with fp8 tensor cores"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("the device is cpu"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fp8_dense_peak_tflops(kCpuDevice).has_value());
}

}  // namespace
}  // namespace primus
