// The two bf16 grouped GEMM kernels of the CUDA backend on the same random problems: v1 (mma.sync) and v2 (wgmma with
// TMA, kernels/grouped_gemm_wgmma.cu), chosen through PRIMUS_GROUPED_GEMM, each against the CPU reference (the spec)
// and against each other, element by element, for forward, dgrad and wgrad (dw added to a random start). The
// problems have partial row, column and k tiles, empty and one-row experts, skew, k long enough for the 4-stage
// ring to wrap many times (barrier phases), and wgrad experts whose rows end inside a k block. v2 must also give the
// same bits twice; so must a grid of 3 persistent blocks. A shape v2 cannot take with PRIMUS_GROUPED_GEMM=wgmma, an
// unknown value and a bad PRIMUS_GROUPED_GEMM_BLOCKS are usage errors naming the variable. Needs an sm_90 GPU for the
// v2 parts (skipped with the reason elsewhere).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/moe_ops.h"
#include "ops/ops.h"
#include "support/test_support.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_runtime.h"
#endif

namespace primus {
namespace {

using testing::host_f32;
using testing::random_tensor;

constexpr Device kGpu{DeviceType::kCuda, 0};

bool hopper() {
#if PRIMUS_WITH_CUDA
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) return false;
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

class GroupedGemmWgmma : public testing::GpuTest {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    if (IsSkipped()) return;
    if (!hopper()) GTEST_SKIP() << "the wgmma grouped GEMM needs an sm_90 (Hopper) GPU";
  }
};

Tensor bf16_on_gpu(const Tensor& f32) {
  Tensor g = ops::to_device(f32, kGpu);
  Tensor b = Tensor::empty(f32.shape(), DType::kBF16, kGpu);
  ops::cast(b, g);
  return b;
}

Tensor offsets_of(const std::vector<int32_t>& counts) {
  Tensor o = Tensor::empty({static_cast<int64_t>(counts.size()) + 1}, DType::kI32);
  o.i32()[0] = 0;
  for (size_t e = 0; e < counts.size(); ++e) o.i32()[e + 1] = o.i32()[e] + counts[e];
  return o;
}

// max |got − want| ≤ tol · max |want| over all elements (both on the host, f32), every element finite: one wrong
// row or tile among many fails it, where a norm-wise error could hide it.
void expect_elementwise(const std::string& what, const Tensor& got, const Tensor& want, double tol) {
  const Tensor g = host_f32(got), w = host_f32(want);
  ASSERT_EQ(g.numel(), w.numel()) << what;
  double scale = 0.0, worst = 0.0;
  int64_t worst_at = -1, not_finite = 0;
  for (int64_t i = 0; i < w.numel(); ++i) scale = std::max(scale, std::fabs(static_cast<double>(w.f32()[i])));
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double d = std::fabs(static_cast<double>(g.f32()[i]) - static_cast<double>(w.f32()[i]));
    if (!std::isfinite(d)) {
      ++not_finite;
    } else if (d > worst) {
      worst = d;
      worst_at = i;
    }
  }
  EXPECT_EQ(not_finite, 0) << what << ": elements not finite";
  EXPECT_LE(worst, tol * scale) << what << ": worst at element " << worst_at << " (scale " << scale << ")";
}

struct Outputs {
  Tensor y, dx, dw;
};

// Forward, dgrad and wgrad on the GPU with the kernel `choice`; y and dx start as garbage (unwritten elements
// show), dw from dw0.
Outputs run(const char* choice, const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& offsets,
            const Tensor& dw0, uint64_t seed) {
  const testing::ScopedEnv guard("PRIMUS_GROUPED_GEMM", choice);
  Rng rng(seed);
  Outputs o{bf16_on_gpu(random_tensor({x.dim(0), w.dim(1)}, rng, 1e3f)),
            bf16_on_gpu(random_tensor(x.shape(), rng, 1e3f)), ops::to_device(dw0, kGpu)};
  ops::grouped_linear_forward(x, w, offsets, o.y);
  ops::grouped_linear_backward(x, w, offsets, dy, o.dx, o.dw);
  return o;
}

void check_problem(const std::string& name, int64_t in, int64_t out, const std::vector<int32_t>& counts,
                   uint64_t seed) {
  SCOPED_TRACE(name);
  Rng rng(seed);
  const auto experts = static_cast<int64_t>(counts.size());
  const Tensor offsets_host = offsets_of(counts);
  const int64_t rows = offsets_host.i32()[experts];
  const Tensor x = bf16_on_gpu(random_tensor({rows, in}, rng)),
               w = bf16_on_gpu(random_tensor({experts, out, in}, rng, 0.1f)),
               dy = bf16_on_gpu(random_tensor({rows, out}, rng));
  const Tensor offsets = ops::to_device(offsets_host, kGpu);
  const Tensor dw0 = random_tensor({experts, out, in}, rng);

  // The CPU reference on the same (bf16-rounded) values.
  const Tensor xc = host_f32(x), wc = host_f32(w), dyc = host_f32(dy);
  Tensor y_ref = Tensor::empty({rows, out}, DType::kF32), dx_ref = ops::zeros({rows, in}, DType::kF32, kCpuDevice);
  Tensor dw_ref = ops::to_device(dw0, kCpuDevice);
  ops::grouped_linear_forward(xc, wc, offsets_host, y_ref);
  ops::grouped_linear_backward(xc, wc, offsets_host, dyc, dx_ref, dw_ref);

  const Outputs v1 = run("v1", x, w, dy, offsets, dw0, seed + 1);
  const Outputs v2 = run("wgmma", x, w, dy, offsets, dw0, seed + 2);
  // bf16 outputs: one rounding (2^-9 relative) on top of fp32 sums in a different order; dw stays fp32.
  expect_elementwise("v2 forward vs CPU", v2.y, y_ref, 1e-2);
  expect_elementwise("v2 dgrad vs CPU", v2.dx, dx_ref, 1e-2);
  expect_elementwise("v2 wgrad vs CPU", v2.dw, dw_ref, 1e-4);
  expect_elementwise("v1 forward vs CPU", v1.y, y_ref, 1e-2);
  expect_elementwise("v1 dgrad vs CPU", v1.dx, dx_ref, 1e-2);
  expect_elementwise("v1 wgrad vs CPU", v1.dw, dw_ref, 1e-4);
  expect_elementwise("v2 forward vs v1", v2.y, v1.y, 1e-2);
  expect_elementwise("v2 dgrad vs v1", v2.dx, v1.dx, 1e-2);
  expect_elementwise("v2 wgrad vs v1", v2.dw, v1.dw, 1e-4);

  const Outputs again = run("wgmma", x, w, dy, offsets, dw0, seed + 3);
  EXPECT_TRUE(testing::same_bits(v2.y, again.y)) << "v2 forward differs between two runs";
  EXPECT_TRUE(testing::same_bits(v2.dx, again.dx)) << "v2 dgrad differs between two runs";
  EXPECT_TRUE(testing::same_bits(v2.dw, again.dw)) << "v2 wgrad differs between two runs";
}

// Partial k (136 = 2·64 + 8), n (200) and m tiles, an empty expert, a one-row one, experts straddling row tiles
// and wgrad k blocks.
TEST_F(GroupedGemmWgmma, PartialTilesEmptyAndOneRowExperts) {
  check_problem("partial", 136, 200, {65, 1, 0, 130, 47}, 1401);
}

// Long k: forward 16 and dgrad 8 k blocks (the 4-stage ring wraps, both barrier parities reused), wgrad experts of
// up to 2000 rows (32 k blocks) beside short ones; several column tiles.
TEST_F(GroupedGemmWgmma, LongInnerDimensionWrapsTheRing) {
  check_problem("long k", 1024, 520, {2000, 3, 0, 700, 129}, 1402);
}

// 64 experts with routing skewed 8:1 towards expert 0, a few empty and one-row experts among them (Qwen-like
// small experts: most row tiles partial).
TEST_F(GroupedGemmWgmma, SkewedManySmallExperts) {
  Rng rng(1403);
  std::vector<int32_t> counts(64);
  for (size_t e = 0; e < counts.size(); ++e) counts[e] = static_cast<int32_t>(rng.uniform() * 90.0);
  counts[0] = 8 * 90;
  counts[5] = counts[17] = counts[63] = 0;
  counts[6] = counts[40] = 1;
  check_problem("skewed", 256, 192, counts, 1404);
}

// The persistent grid capped at 3 blocks (PRIMUS_GROUPED_GEMM_BLOCKS): each block runs dozens of tiles of different
// k lengths, so the ring's stages and phases carry over from tile to tile, empty tiles are passed over, and the
// producer loads a tile while the consumers store the one before.
TEST_F(GroupedGemmWgmma, FewPersistentBlocksRunManyTilesEach) {
  const testing::ScopedEnv guard("PRIMUS_GROUPED_GEMM_BLOCKS", "3");
  check_problem("3 blocks, long k", 1024, 520, {2000, 3, 0, 700, 129}, 1407);
  Rng rng(1408);
  std::vector<int32_t> counts(24);
  for (size_t e = 0; e < counts.size(); ++e) counts[e] = static_cast<int32_t>(rng.uniform() * 300.0);
  counts[3] = counts[11] = 0;
  counts[7] = 1;
  check_problem("3 blocks, skewed", 264, 328, counts, 1409);
}

// The smallest shapes v2 takes: in = out = 8.
TEST_F(GroupedGemmWgmma, TinyShapes) { check_problem("tiny", 8, 8, {1, 0, 5, 64}, 1405); }

TEST_F(GroupedGemmWgmma, BadSettingsAreUsageErrorsNamingTheVariable) {
  Rng rng(1406);
  const Tensor x = bf16_on_gpu(random_tensor({10, 20}, rng)), w = bf16_on_gpu(random_tensor({2, 16, 20}, rng));
  const Tensor offsets = ops::to_device(offsets_of({4, 6}), kGpu);
  Tensor y = Tensor::empty({10, 16}, DType::kBF16, kGpu);
  {
    const testing::ScopedEnv guard("PRIMUS_GROUPED_GEMM", "wgmma");
    const std::string message = testing::message_of<UsageError>([&] { ops::grouped_linear_forward(x, w, offsets, y); });
    EXPECT_NE(message.find("PRIMUS_GROUPED_GEMM=wgmma"), std::string::npos) << message;
    EXPECT_NE(message.find("multiples of 8"), std::string::npos) << message;
  }
  {
    const testing::ScopedEnv guard("PRIMUS_GROUPED_GEMM_BLOCKS", "0");
    const Tensor xa = bf16_on_gpu(random_tensor({10, 16}, rng)), wa = bf16_on_gpu(random_tensor({2, 16, 16}, rng));
    const std::string message =
        testing::message_of<UsageError>([&] { ops::grouped_linear_forward(xa, wa, offsets, y); });
    EXPECT_NE(message.find("PRIMUS_GROUPED_GEMM_BLOCKS=0"), std::string::npos) << message;
  }
  {
    const testing::ScopedEnv guard("PRIMUS_GROUPED_GEMM", "v3");
    const std::string message = testing::message_of<UsageError>([&] { ops::grouped_linear_forward(x, w, offsets, y); });
    EXPECT_NE(message.find("PRIMUS_GROUPED_GEMM=v3"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace primus
