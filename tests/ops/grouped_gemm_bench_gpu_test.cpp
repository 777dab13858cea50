// Throughput of the experts' grouped GEMM on the GPU (kernels/grouped_gemm.cu) at the two shapes of issue 14's
// performance section, printed beside cuBLASLt's dense GEMM of the same total rows and FLOPs (the ceiling a grouped
// kernel can approach), for uniform and skewed routing; docs/perf/grouped-gemm.md holds the prediction and the
// measured tables. The timings are printed, not asserted; what is asserted is that each form gives the same bits
// twice (no atomics, a fixed order of sums).
//   Qwen3-30B-A3B layer: 16384 tokens × top-8 = 131072 rows over 128 experts; gate_up [128, 1536, 2048], down
//   [128, 2048, 768].
//   Mixtral 8x7B layer: 8192 tokens × top-2 = 16384 rows over 8 experts; gate_up [8, 28672, 4096], down
//   [8, 4096, 14336].
// Each shape runs through both bf16 kernels, v1 (mma.sync) and v2 (wgmma with TMA, sm_90 only), chosen with
// PRIMUS_GROUPED_GEMM=v1|wgmma; the tag of a line names the kernel.
// Skewed routing: one expert takes 4× the mean load, the others share the rest with ±50% jitter (max/mean ≈ 4, what
// an unbalanced router shows early in training).
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/moe_ops.h"
#include "ops/ops.h"
#include "support/test_support.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_runtime.h"
#endif

namespace primus {
namespace {

constexpr Device kGpu{DeviceType::kCuda, 0};

struct LayerShape {
  const char* name;
  int64_t rows, experts, in, out;
};

// Offsets [E + 1] on the GPU: equal counts (the remainder spread one row each), or skewed as the file comment says.
Tensor routing_offsets(int64_t rows, int64_t experts, bool skewed, Rng& rng) {
  std::vector<double> weight(static_cast<size_t>(experts), 1.0);
  if (skewed) {
    for (double& w : weight) w = 0.5 + rng.uniform();
    double others = 0.0;
    for (int64_t e = 1; e < experts; ++e) others += weight[static_cast<size_t>(e)];
    weight[0] = others * 4.0 / (static_cast<double>(experts) - 4.0 > 0 ? static_cast<double>(experts) - 4.0 : 1.0);
  }
  double total = 0.0;
  for (const double w : weight) total += w;
  Tensor offsets = Tensor::empty({experts + 1}, DType::kI32);
  offsets.i32()[0] = 0;
  int64_t given = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t count = e + 1 == experts
                              ? rows - given
                              : static_cast<int64_t>(static_cast<double>(rows) * weight[static_cast<size_t>(e)] / total);
    given += count;
    offsets.i32()[e + 1] = static_cast<int32_t>(given);
  }
  return ops::to_device(offsets, kGpu);
}

// A bf16 GPU tensor of N(0, std²) values, drawn on the device (f32) and rounded.
Tensor random_bf16(const Shape& shape, uint64_t seed, double std) {
  Tensor f = Tensor::empty(shape, DType::kF32, kGpu);
  ops::fill_normal(f, seed, std);
  Tensor b = Tensor::empty(shape, DType::kBF16, kGpu);
  ops::cast(b, f);
  return b;
}

// Mean milliseconds of `run` over `reps` calls queued back to back, after two warm-up calls (device timestamps).
double mean_ms(const std::function<void()>& run, int reps = 10) {
  run();
  run();
  Backend& backend = backend_for(kGpu);
  const auto from = backend.mark();
  for (int i = 0; i < reps; ++i) run();
  const auto to = backend.mark();
  return backend.elapsed_ms(*from, *to) / reps;
}

void line(const std::string& what, double flops, double grouped_ms, double dense_ms) {
  const double grouped = flops / grouped_ms / 1e9, dense = flops / dense_ms / 1e9;
  std::printf("  %-40s %9.3f ms %7.1f TFLOP/s | cuBLASLt dense %9.3f ms %7.1f TFLOP/s | ratio %.2f\n", what.c_str(),
              grouped_ms, grouped, dense_ms, dense, grouped / dense);
}

void bench_layer(const LayerShape& s, const std::vector<const char*>& kernels, Rng& rng) {
  const int64_t m = s.rows;
  const Tensor x = random_bf16({m, s.in}, rng.next_u64(), 1.0);
  const Tensor w = random_bf16({s.experts, s.out, s.in}, rng.next_u64(), 0.02);
  const Tensor dy = random_bf16({m, s.out}, rng.next_u64(), 1.0);
  Tensor y = Tensor::empty({m, s.out}, DType::kBF16, kGpu), y2 = Tensor::empty({m, s.out}, DType::kBF16, kGpu);
  Tensor dx = Tensor::empty({m, s.in}, DType::kBF16, kGpu), dx2 = Tensor::empty({m, s.in}, DType::kBF16, kGpu);
  Tensor dw = ops::zeros({s.experts, s.out, s.in}, DType::kF32, kGpu);
  Tensor none;
  // The dense ceiling: one weight (expert 0's) over all rows; the weight gradient [out, in] summed over all rows.
  const Tensor w0 = w.slice_elements(0, {s.out, s.in});
  Tensor dw0 = ops::zeros({s.out, s.in}, DType::kF32, kGpu);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(s.in) * static_cast<double>(s.out);
  const double dense_fwd = mean_ms([&] { ops::linear_forward(x, w0, y); });
  const double dense_dgrad = mean_ms([&] { ops::gemm(GemmArgs{&dy, &w0, &dx}); });
  const double dense_wgrad = mean_ms([&] { ops::gemm(GemmArgs{&dy, &x, &dw0, true, false, 1.0f, 1.0f}); });

  for (const bool skewed : {false, true}) {
    const Tensor offsets = routing_offsets(m, s.experts, skewed, rng);
    for (const char* kernel : kernels) {
      const testing::ScopedEnv choice("PRIMUS_GROUPED_GEMM", kernel);
      const std::string tag = std::string(s.name) + (skewed ? " skewed " : " uniform ") + kernel + " ";
      line(tag + "forward", flops, mean_ms([&] { ops::grouped_linear_forward(x, w, offsets, y); }), dense_fwd);
      line(tag + "dgrad", flops, mean_ms([&] { ops::grouped_linear_backward(x, w, offsets, dy, dx, none); }),
           dense_dgrad);
      line(tag + "wgrad", flops, mean_ms([&] { ops::grouped_linear_backward(x, w, offsets, dy, none, dw); }),
           dense_wgrad);

      // The same bits twice: forward and dgrad again into fresh buffers, wgrad twice from zero.
      ops::grouped_linear_forward(x, w, offsets, y2);
      ops::grouped_linear_backward(x, w, offsets, dy, dx2, none);
      EXPECT_TRUE(testing::same_bits(y, y2)) << tag << "forward differs between two runs";
      EXPECT_TRUE(testing::same_bits(dx, dx2)) << tag << "dgrad differs between two runs";
      ops::zero(dw);
      ops::grouped_linear_backward(x, w, offsets, dy, none, dw);
      const Tensor first = ops::to_device(dw, Device{});
      ops::zero(dw);
      ops::grouped_linear_backward(x, w, offsets, dy, none, dw);
      EXPECT_TRUE(testing::same_bits(first, dw)) << tag << "wgrad differs between two runs";
    }
  }
}

TEST(GroupedGemmBench, QwenAndMixtralLayerShapes) {
  PRIMUS_SKIP_WITHOUT_GPU();
#if PRIMUS_WITH_CUDA
  start_cuda_backend(0);
#endif
  // Both kernels where the GPU has wgmma (sm_90), v1 alone elsewhere (PRIMUS_GROUPED_GEMM picks, see the file comment).
  int major = 0, minor = 0;
#if PRIMUS_WITH_CUDA
  PRIMUS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  PRIMUS_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
#endif
  std::vector<const char*> kernels{"v1"};
  if (major == 9 && minor == 0) kernels.push_back("wgmma");
  Rng rng(1414);
  std::printf("grouped GEMM (bf16 in, fp32 accumulate), mean of 10 back-to-back calls:\n");
  bench_layer({"qwen3-30b-a3b gate_up", 131072, 128, 2048, 1536}, kernels, rng);
  bench_layer({"qwen3-30b-a3b down", 131072, 128, 768, 2048}, kernels, rng);
  bench_layer({"mixtral gate_up", 16384, 8, 4096, 28672}, kernels, rng);
  bench_layer({"mixtral down", 16384, 8, 14336, 4096}, kernels, rng);
}

}  // namespace
}  // namespace primus
