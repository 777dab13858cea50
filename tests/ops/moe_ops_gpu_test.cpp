// What the op harness (support/moe_op_cases.cpp: every MoE op against the CPU on CUDA) does not state about the
// CUDA MoE kernels: an expert index outside [0, E) reaching moe_sort or moe_capacity is reported naming the op, the
// routing entry and the value at the next wait, not inside the step (no host synchronisation), and nothing reads out
// of bounds meanwhile; moe_capacity's cost does not grow with skewed routing; and a whole MoE layer's ops at the
// Qwen3-30B-A3B routing shape give identical bits on a second run (no float atomics). Skipped, with the reason,
// without a usable CUDA device.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/moe_ops.h"
#include "ops/ops.h"
#include "support/test_support.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace primus {
namespace {

using testing::random_ids;
using testing::random_tensor;
using testing::same_bits;

constexpr Device kGpu{DeviceType::kCuda, 0};

class CudaMoeOps : public testing::GpuTest {};

Tensor gpu(const Tensor& t) { return ops::to_device(t, kGpu); }
Tensor host(const Tensor& t) { return ops::to_device(t, kCpuDevice); }

TEST_F(CudaMoeOps, ExpertOutOfRangeIsReportedAtTheNextWait) {
  Rng rng(71);
  Tensor chosen = random_ids({5, 2}, 8, rng);
  chosen.i32()[3] = 8;
  Tensor slots = Tensor::empty({10}, DType::kI32, kGpu), offsets = Tensor::empty({9}, DType::kI32, kGpu);
  ops::moe_sort(gpu(chosen), slots, offsets);  // returns without waiting
  Tensor rows = Tensor::empty({10, 16}, DType::kF32, kGpu);
  ops::moe_permute(gpu(random_tensor({5, 16}, rng)), slots, 2, rows);  // slots stay in range: no fault
  try {
    backend_for(kGpu).synchronize();
    FAIL() << "an expert outside [0, 8) was not reported";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("[op moe_sort] expert 8 at routing entry 3 is outside the experts [0, 8)"),
              std::string::npos)
        << e.what();
  }
  backend_for(kGpu).synchronize();  // reported once, then cleared
  const Tensor h = host(offsets);
  EXPECT_EQ(h.i32()[8], 9) << "the bad entry sorts past offsets[E]";
  const Tensor s = host(slots);
  EXPECT_EQ(s.i32()[9], 3) << "the bad entry is the last slot";
}

// moe_capacity's bad expert: reported the same way, naming its op; the entry is dropped (kept as E) meanwhile.
TEST_F(CudaMoeOps, CapacityExpertOutOfRangeIsReportedAtTheNextWait) {
  Rng rng(73);
  Tensor chosen = random_ids({5, 2}, 8, rng);
  chosen.i32()[3] = 8;
  const Tensor weights = random_tensor({5, 2}, rng);
  Tensor kept = Tensor::empty({5, 2}, DType::kI32, kGpu);
  ops::moe_capacity(gpu(chosen), gpu(weights), 8, 2, false, kept);  // returns without waiting
  try {
    backend_for(kGpu).synchronize();
    FAIL() << "an expert outside [0, 8) was not reported";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("[op moe_capacity] expert 8 at routing entry 3 is outside the experts [0, 8)"),
              std::string::npos)
        << e.what();
  }
  backend_for(kGpu).synchronize();
  EXPECT_EQ(host(kept).i32()[3], 8) << "the bad entry is dropped";
}

// moe_capacity at Qwen3-30B-A3B's routing (16,384 tokens, top 8 of 128, capacity factor 1) costs the same whether
// the routing is balanced or every token's first choice is expert 0 (which then drops 15/16 of its 16,384 entries):
// a radix sort over all entries, independent of the spread (moe_capacity.cu). The bound, 1 ms a call, is some 20×
// what five radix passes over 131,072 keys take on an H100/H200; skewed may take at most 1.5× balanced.
TEST_F(CudaMoeOps, CapacityCostsTheSameUnderSkewedRouting) {
  const int64_t n = 16384, e = 128, k = 8;
  const int64_t capacity = ops::moe_expert_capacity(n, k, e, 1.0);
  Rng rng(74);
  const Tensor balanced = random_ids({n, k}, e, rng);
  Tensor skewed = Tensor::empty({n, k}, DType::kI32);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) skewed.i32()[t * k + j] = static_cast<int32_t>(j == 0 ? 0 : 1 + (t + j) % (e - 1));
  }
  const Tensor weights = gpu(random_tensor({n, k}, rng));
  Tensor kept = Tensor::empty({n, k}, DType::kI32, kGpu);
  auto time_ms = [&](const Tensor& chosen_host, bool by_position) {
    const Tensor chosen = gpu(chosen_host);
    ops::moe_capacity(chosen, weights, e, capacity, by_position, kept);  // warm-up (scratch buffers, code)
    backend_for(kGpu).synchronize();
    constexpr int kRuns = 50;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < kRuns; ++r) ops::moe_capacity(chosen, weights, e, capacity, by_position, kept);
    backend_for(kGpu).synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / kRuns;
  };
  for (const bool by_position : {false, true}) {
    const double even = time_ms(balanced, by_position), skew = time_ms(skewed, by_position);
    std::printf("  moe_capacity %s 16384x8 of 128: balanced %.3f ms, skewed %.3f ms\n",
                by_position ? "position" : "probs", even, skew);
    EXPECT_LT(even, 1.0);
    EXPECT_LT(skew, 1.0);
    EXPECT_LT(skew, 1.5 * even + 0.02) << "skewed routing costs more than balanced";
  }
  // The skewed expert keeps exactly `capacity` entries.
  ops::moe_capacity(gpu(skewed), weights, e, capacity, false, kept);
  const Tensor h = host(kept);
  int64_t kept_of_0 = 0;
  for (int64_t i = 0; i < n * k; ++i) kept_of_0 += h.i32()[i] == 0;
  EXPECT_EQ(kept_of_0, capacity);
}

// Router, sort, permutation, un-permutation and their backwards twice on the same inputs (4096 tokens, 128 experts,
// top 8, bf16 rows of 2048): every output the same bits.
TEST_F(CudaMoeOps, TwoRunsGiveIdenticalBits) {
  const int64_t n = 4096, e = 128, k = 8, c = 2048;
  Rng rng(72);
  const Tensor logits = gpu(random_tensor({n, e}, rng));
  Tensor x = Tensor::empty({n, c}, DType::kBF16, kGpu), dout = Tensor::empty({n, c}, DType::kBF16, kGpu);
  ops::cast(x, gpu(random_tensor({n, c}, rng)));
  ops::cast(dout, gpu(random_tensor({n, c}, rng)));
  const MoeRouting routing{k, MoeScoreFunction::kSoftmax, true, 1.0f, 1, 1};
  auto run = [&] {
    std::vector<Tensor> out;
    Tensor scores = Tensor::empty({n, e}, DType::kF32, kGpu), weights = Tensor::empty({n, k}, DType::kF32, kGpu);
    Tensor chosen = Tensor::empty({n, k}, DType::kI32, kGpu);
    ops::moe_router_forward(logits, Tensor(), routing, scores, chosen, weights);
    Tensor slots = Tensor::empty({n * k}, DType::kI32, kGpu), offsets = Tensor::empty({e + 1}, DType::kI32, kGpu);
    ops::moe_sort(chosen, slots, offsets);
    Tensor rows = Tensor::empty({n * k, c}, DType::kBF16, kGpu), combined = Tensor::empty({n, c}, DType::kBF16, kGpu);
    ops::moe_permute(x, slots, k, rows);
    ops::moe_unpermute(rows, slots, weights, combined);
    Tensor drows = Tensor::empty({n * k, c}, DType::kBF16, kGpu), dweights = Tensor::empty({n, k}, DType::kF32, kGpu);
    ops::moe_unpermute_backward(rows, slots, weights, dout, drows, dweights);
    Tensor dx = Tensor::empty({n, c}, DType::kBF16, kGpu), dlogits = Tensor::empty({n, e}, DType::kF32, kGpu);
    ops::moe_permute_backward(drows, slots, k, dx);
    ops::moe_router_backward(scores, chosen, routing, dweights, Tensor(), dlogits);
    Tensor aux = Tensor::empty({1}, DType::kF32, kGpu), daux = Tensor::empty({n, e}, DType::kF32, kGpu);
    ops::moe_aux_loss(scores, offsets, k, 0.01f, false, 0.5f, aux, daux);
    return std::vector<Tensor>{scores, weights, chosen, slots, offsets, combined, drows, dweights, dx, dlogits, aux};
  };
  const std::vector<Tensor> a = run(), b = run();
  const char* names[] = {"scores", "weights", "chosen", "slots", "offsets", "combined",
                         "drows",  "dweights", "dx",    "dlogits", "aux"};
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << names[i];
}

}  // namespace
}  // namespace primus
