// Packed documents on the CUDA backend, what the op harness (support/op_cases.cpp: the rope_positions and
// attention_segments cases against the CPU in f32 and bf16, op_cases_gpu_test) does not state: one document is plain
// causal attention bit for bit on the native kernels, and positions and segment starts outside their range are
// reported at the next wait. Every GPU output is poisoned with NaN bits first.
//
// Without a usable CUDA device (or in a build without the CUDA backend) every test is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "ops/ops.h"
#include "support/test_support.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace primus {
namespace {

using primus::testing::host_f32;
using primus::testing::random_tensor;

constexpr Device kGpu{DeviceType::kCuda, 0};

class PackingGpu : public testing::GpuTest {};

// Every byte 0xFF: NaN in both f32 and bf16.
Tensor poisoned(const Shape& shape, DType dtype, Device device) {
  Tensor h = Tensor::empty(shape, dtype);
  std::memset(h.data(), 0xFF, h.nbytes());
  return device.is_cpu() ? h : ops::to_device(h, device);
}

// ---- attention confined to segments -------------------------------------------------------------------------------

TEST_F(PackingGpu, OneDocumentEqualsPlainCausalAttention) {
  // segment_start all 0 is plain causal attention: the native kernels with segments give what the kernels
  // without them give (fp32, the same kernels: identical bits).
  Rng rng(603);
  const Shape q_shape{2, 45, 4, 32}, kv_shape{2, 45, 2, 32}, lse_shape{2, 4, 45};
  const Tensor gq = ops::to_device(random_tensor(q_shape, rng), kGpu);
  const Tensor gk = ops::to_device(random_tensor(kv_shape, rng), kGpu);
  const Tensor gv = ops::to_device(random_tensor(kv_shape, rng), kGpu);
  const Tensor gstarts = ops::to_device(Tensor::zeros({2, 45}, DType::kI32), kGpu);
  Tensor a = poisoned(q_shape, DType::kF32, kGpu), b = poisoned(q_shape, DType::kF32, kGpu);
  Tensor la = poisoned(lse_shape, DType::kF32, kGpu), lb = poisoned(lse_shape, DType::kF32, kGpu);
  ops::attention_forward(gq, gk, gv, a, la);
  ops::attention_forward(gq, gk, gv, b, lb, gstarts);
  const Tensor ha = host_f32(a), hb = host_f32(b);
  EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.nbytes()), 0);
}

// ---- data errors ------------------------------------------------------------------------------------------------

// Runs `launch` (which queues a kernel without waiting), then expects the next wait to throw with `message`.
template <typename F>
void expect_reported(F&& launch, const std::string& message) {
  launch();
  try {
    backend_for(kGpu).synchronize();
    ADD_FAILURE() << "not reported: " << message;
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
  backend_for(kGpu).synchronize();  // reported once, then cleared
}

TEST_F(PackingGpu, BadPositionsAndSegmentStartsAreReportedAtTheNextWait) {
  Rng rng(604);
  Tensor positions = Tensor::zeros({2, 5}, DType::kI32);
  positions.i32()[7] = 9;
  const Tensor cos = ops::to_device(random_tensor({9, 8}, rng), kGpu);
  Tensor x = ops::to_device(random_tensor({2, 5, 2, 16}, rng), kGpu);
  const Tensor gpositions = ops::to_device(positions, kGpu);
  expect_reported([&] { ops::rope_forward(x, cos, cos, gpositions); },
                  "[op rope] position 9 at token 7 is outside the rope table [0, 9)");

  Tensor starts = Tensor::zeros({2, 5}, DType::kI32);
  starts.i32()[6] = 2;  // token (1, 1) cannot start its segment at 2
  const Tensor gstarts = ops::to_device(starts, kGpu);
  const Tensor q = ops::to_device(random_tensor({2, 5, 2, 16}, rng), kGpu);
  Tensor out = poisoned(q.shape(), DType::kF32, kGpu), lse = poisoned({2, 2, 5}, DType::kF32, kGpu);
  expect_reported([&] { ops::attention_forward(q, q, q, out, lse, gstarts); },
                  "[op attention] segment start 2 at token 6 is outside its causal range [0, 2)");
}

}  // namespace
}  // namespace primus
