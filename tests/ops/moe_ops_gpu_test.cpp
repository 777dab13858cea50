// What the op harness (support/moe_op_cases.cpp: every MoE op against the CPU on CUDA) does not state about the
// CUDA MoE kernels: an expert index outside [0, E) reaching moe_sort is reported naming the op, the routing entry
// and the value at the next wait, not inside the step (no host synchronisation), and nothing reads out of bounds
// meanwhile; and a whole MoE layer's ops at the Qwen3-30B-A3B routing shape give identical bits on a second run (no
// float atomics). Skipped, with the reason, without a usable CUDA device.
#include <gtest/gtest.h>

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

class CudaMoeOps : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = testing::why_no_gpu();
    if (!why.empty()) GTEST_SKIP() << why;
#if PRIMUS_WITH_CUDA
    start_cuda_backend(0);
#endif
  }
};

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
