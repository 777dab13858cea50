// Mixed precision on the CUDA backend, where the op harness (support/op_cases.cpp, op_cases_gpu_test: every op's
// forward and gradients in bf16 against the CPU on the same rounded inputs) does not reach: bf16 GEMMs on operands
// aligned to 2 bytes only, into bf16 or f32 C with alpha and beta; cast (the same round-to-nearest-even on both
// devices, bit for bit); sum_into without waiting; determinism (two runs give identical bits for every op except
// cuDNN's dq, fp32 atomics by design); bf16 refused on the CPU; and a throughput test that prints GB/s and TFLOP/s at
// the llama3.2-1B step shapes (not asserted). Every GPU output is poisoned with NaN bits first.
//
// Tolerances (relative L2 error of a whole tensor, ||gpu − cpu|| / ||cpu||):
//  - kRounded 5e-3: a bf16 output that is an fp32 result rounded once. Rounding to bf16 moves an element by at most
//    2^-8 ≈ 3.9e-3 of itself, so the error cannot pass 3.9e-3 plus the fp32 differences (~1e-6).
//  - kFp32 1e-5: fp32 results from the same bf16 inputs, only fp32 roundings in another order.
//  - kGemmFp32 1e-4: fp32 GEMM outputs: bf16 products are exact in fp32, the K sums run in cuBLASLt's blocked order.
// Measured on the H200 (2026-12-02, cuDNN 9.14), when these tests still covered every op: largest kRounded error
// 2.2e-3, kFp32 and kGemmFp32 1.2e-7, attention 3.2e-3 (dk), lse 1.2e-7.
//
// Without a usable CUDA device (or in a build without the CUDA backend) the GPU tests are skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "ops/ops.h"
#include "support/test_support.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace primus {
namespace {

using primus::testing::expect_close;
using primus::testing::random_ids;
using primus::testing::random_tensor;
using primus::testing::same_bits;

constexpr Device kGpu{DeviceType::kCuda, 0};
constexpr double kRounded = 5e-3;
constexpr double kFp32 = 1e-5;
constexpr double kGemmFp32 = 1e-4;

class Bf16Ops : public testing::GpuTest {};

// t with every value rounded to bf16, still f32: the CPU reference's input.
Tensor rounded(Tensor t) {
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
  return t;
}

// Fresh N(0, scale²) values, already rounded to bf16.
Tensor random_bf16_values(const Shape& shape, Rng& rng, float scale = 1.0f) {
  return rounded(random_tensor(shape, rng, scale));
}

// A GPU tensor of `dtype` holding the host f32 tensor's values (exact when they are bf16 values).
Tensor to_gpu(const Tensor& host_f32, DType dtype) {
  if (dtype == DType::kF32) return ops::to_device(host_f32, kGpu);
  Tensor h = Tensor::empty(host_f32.shape(), dtype);
  ops::cast(h, host_f32);
  return ops::to_device(h, kGpu);
}

Tensor bf16_gpu(const Tensor& host_f32) { return to_gpu(host_f32, DType::kBF16); }

// Every byte 0xFF: NaN in both f32 and bf16.
Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor h = Tensor::empty(shape, dtype);
  std::memset(h.data(), 0xFF, h.nbytes());
  return ops::to_device(h, kGpu);
}

// ---- gemm ------------------------------------------------------------------------------------------------------

// bf16 A and B (views `offset` elements into larger buffers: offset 1 leaves them 2-byte aligned) into a C of
// c_dtype with alpha and beta.
void check_gemm(Rng& rng, int64_t m, int64_t n, int64_t k, bool ta, bool tb, float alpha, float beta, int64_t offset,
                DType c_dtype) {
  const Shape a_shape = ta ? Shape{k, m} : Shape{m, k};
  const Shape b_shape = tb ? Shape{n, k} : Shape{k, n};
  const Tensor a_buf = random_bf16_values({shape_numel(a_shape) + offset}, rng);
  const Tensor b_buf = random_bf16_values({shape_numel(b_shape) + offset}, rng);
  const Tensor a = a_buf.slice_elements(offset, a_shape), b = b_buf.slice_elements(offset, b_shape);
  const Tensor ga_buf = bf16_gpu(a_buf), gb_buf = bf16_gpu(b_buf);
  const Tensor ga = ga_buf.slice_elements(offset, a_shape), gb = gb_buf.slice_elements(offset, b_shape);
  Tensor c, gc;
  if (beta == 0.0f) {
    c = Tensor::empty({m, n}, DType::kF32);
    c.fill(NAN);
    gc = poisoned({m, n}, c_dtype);
  } else {
    c = random_bf16_values({m, n}, rng);
    gc = to_gpu(c, c_dtype);
  }
  ops::gemm(GemmArgs{&a, &b, &c, ta, tb, alpha, beta});
  ops::gemm(GemmArgs{&ga, &gb, &gc, ta, tb, alpha, beta});
  expect_close(fmt::format("gemm bf16->{} M={} N={} K={} ta={} tb={} alpha={} beta={} offset={}", dtype_name(c_dtype),
                           m, n, k, ta, tb, alpha, beta, offset),
               gc, c, c_dtype == DType::kF32 ? kGemmFp32 : kRounded);
}

TEST_F(Bf16Ops, GemmMatchesCpu) {
  Rng rng(401);
  const int64_t shapes[][3] = {{1, 33, 16}, {31, 64, 17}, {33, 1, 128}, {130, 96, 64}};
  for (const auto& s : shapes) {
    for (int t = 0; t < 4; ++t) {
      check_gemm(rng, s[0], s[1], s[2], t & 1, t & 2, 1.0f, 0.0f, 0, DType::kBF16);
      check_gemm(rng, s[0], s[1], s[2], t & 1, t & 2, 1.0f, 0.0f, 1, DType::kF32);
      check_gemm(rng, s[0], s[1], s[2], t & 1, t & 2, 0.5f, 1.0f, 1, DType::kF32);
    }
  }
  check_gemm(rng, 31, 33, 0, false, false, 1.0f, 0.5f, 0, DType::kBF16);  // empty K: C = beta·C
}

// ---- cast, sum_into ---------------------------------------------------------------------------------------------

// swiglu and add_inplace are op cases (op_cases_gpu_test); cast must give core/bf16.h's bits.
TEST_F(Bf16Ops, CastMatchesCpuBitForBit) {
  Rng rng(406);
  for (int64_t n : {1, 31, 33, 16385, 1000003}) {
    const Tensor f = random_tensor({n}, rng, 3.0f);  // not bf16 values: the cast must round
    Tensor want = Tensor::empty({n}, DType::kBF16);
    ops::cast(want, f);
    Tensor narrowed = poisoned({n}, DType::kBF16), widened = poisoned({n}, DType::kF32);
    ops::cast(narrowed, ops::to_device(f, kGpu));
    ops::cast(widened, narrowed);
    EXPECT_TRUE(same_bits(narrowed, want)) << "cast f32 -> bf16 rounds as core/bf16.h, n=" << n;
    Tensor want_wide = Tensor::empty({n}, DType::kF32);
    ops::cast(want_wide, want);
    EXPECT_TRUE(same_bits(widened, want_wide)) << "cast bf16 -> f32 is exact, n=" << n;
  }
}

TEST_F(Bf16Ops, SumIntoMatchesCpuWithoutWaiting) {
  Rng rng(407);
  Tensor acc = Tensor::zeros({1}, DType::kF32), gacc = ops::to_device(acc, kGpu);
  for (int64_t n : {1, 31, 33, 16384, 16385, 1000003}) {
    const Tensor x = random_tensor({n}, rng, 2.0f);
    ops::sum_into(acc, x);
    ops::sum_into(gacc, ops::to_device(x, kGpu));
  }
  expect_close("sum_into over six tensors", gacc, acc, kFp32);
  const Tensor x = ops::to_device(random_tensor({1000003}, rng), kGpu);
  Tensor a1 = ops::zeros({1}, DType::kF32, kGpu), a2 = ops::zeros({1}, DType::kF32, kGpu);
  ops::sum_into(a1, x);
  ops::sum_into(a2, x);
  EXPECT_TRUE(same_bits(a1, a2)) << "sum_into is deterministic";
}

// ---- dtype rules (no GPU needed) ------------------------------------------------------------------------------

TEST(Bf16Rules, BfloatOnTheCpuIsRejectedWithTheExpectedDtype) {
  Rng rng(411);
  Tensor x = Tensor::empty({4, 8}, DType::kBF16), w = Tensor::empty({3, 8}, DType::kBF16);
  ops::cast(x, random_tensor({4, 8}, rng));
  ops::cast(w, random_tensor({3, 8}, rng));
  Tensor y = Tensor::empty({4, 3}, DType::kBF16);
  try {
    ops::linear_forward(x, w, y);
    FAIL() << "bf16 linear_forward ran on the cpu";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("[op linear_forward] x is [4, 8] bf16 cpu but must be f32"), std::string::npos) << message;
    EXPECT_NE(message.find("bf16 runs on cuda"), std::string::npos) << message;
  }
  Tensor f = Tensor::empty({5}, DType::kF32), i = Tensor::empty({5}, DType::kI32);
  EXPECT_THROW(ops::cast(f, i), Error);
  Tensor acc = Tensor::zeros({2}, DType::kF32);
  EXPECT_THROW(ops::sum_into(acc, f), Error);
}

// ---- throughput at the llama3.2-1B step shapes (printed, not asserted) ---------------------------------------

// A GPU bf16 tensor of `shape` tiled with one block of 2^20 random bf16 values (drawing hundreds of millions of
// values on the host would take longer than the whole test); never zeros.
Tensor tiled_values(const Shape& shape, Rng& rng) {
  const int64_t block = int64_t{1} << 20;
  const Tensor source = bf16_gpu(random_bf16_values({block}, rng));
  Tensor t = Tensor::empty({shape_numel(shape)}, DType::kBF16, kGpu);
  for (int64_t offset = 0; offset < t.numel(); offset += block) {
    const int64_t count = std::min(block, t.numel() - offset);
    Tensor dst = t.slice_elements(offset, {count});
    ops::copy(dst, source.slice_elements(0, {count}));
  }
  return t.reshape(shape);
}

// Median milliseconds of `run` over 10 timed calls after 3 warm-up calls, the device drained around each.
double median_ms(const std::function<void()>& run) {
  std::vector<double> ms;
  for (int i = 0; i < 13; ++i) {
    ops::synchronize(kGpu);
    const auto start = std::chrono::steady_clock::now();
    run();
    ops::synchronize(kGpu);
    const auto stop = std::chrono::steady_clock::now();
    if (i >= 3) ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

TEST_F(Bf16Ops, ThroughputAtTrainingShapes) {
  Rng rng(412);
  const int64_t n = 16384, c = 2048, f = 8192;  // 4 × 4096 tokens, model width, MLP width
  auto values = [&](const Shape& shape) { return tiled_values(shape, rng); };
  const Tensor x = values({n, c}), w_up = values({f, c}), dy = values({n, f});
  Tensor y = poisoned({n, f}, DType::kBF16), dw = ops::zeros({f, c}, DType::kF32, kGpu);
  Tensor dx = poisoned({n, c}, DType::kBF16);
  auto gemm_line = [](const char* what, int64_t m, int64_t nn, int64_t k, double ms) {
    std::printf("  %-44s %8.3f ms %7.1f TFLOP/s\n", what, ms, 2.0 * m * nn * k / ms / 1e9);
  };
  gemm_line("gemm y = x·Wᵀ  [16384,2048]x[8192,2048]ᵀ bf16", n, f, c,
            median_ms([&] { ops::linear_forward(x, w_up, y); }));
  gemm_line("gemm dx = dy·W [16384,8192]x[8192,2048] bf16", n, c, f, median_ms([&] {
              ops::gemm(GemmArgs{&dy, &w_up, &dx});
            }));
  gemm_line("gemm dW += dyᵀ·x (f32 C, beta 1)", f, c, n, median_ms([&] {
              ops::gemm(GemmArgs{&dy, &x, &dw, true, false, 1.0f, 1.0f});
            }));

  auto bandwidth_line = [](const char* what, double bytes, double ms) {
    std::printf("  %-44s %8.3f ms %7.0f GB/s\n", what, ms, bytes / ms / 1e6);
  };
  const Tensor nw = values({c});
  Tensor ny = poisoned({n, c}, DType::kBF16), rstd = poisoned({n}, DType::kF32);
  bandwidth_line("rmsnorm forward [16384, 2048]", 4.0 * n * c,
                 median_ms([&] { ops::rmsnorm_forward(x, nw, 1e-5f, ny, rstd); }));
  Tensor nweight = ops::zeros({c}, DType::kF32, kGpu);
  bandwidth_line("rmsnorm backward [16384, 2048]", 6.0 * n * c,
                 median_ms([&] { ops::rmsnorm_backward(x, x, nw, rstd, dx, nweight); }));
  const Tensor gate_up = values({n, 2 * f});
  Tensor act = poisoned({n, f}, DType::kBF16), dgate_up = poisoned({n, 2 * f}, DType::kBF16);
  bandwidth_line("swiglu forward [16384, 2 x 8192]", 6.0 * n * f,
                 median_ms([&] { ops::swiglu_forward(gate_up, act); }));
  bandwidth_line("swiglu backward [16384, 2 x 8192]", 10.0 * n * f,
                 median_ms([&] { ops::swiglu_backward(gate_up, act, dgate_up); }));
  Tensor residual = values({n, c});
  bandwidth_line("add_inplace [16384, 2048]", 6.0 * n * c, median_ms([&] { ops::add_inplace(residual, x); }));
  const int64_t params = int64_t{1} << 28;
  Tensor master = Tensor::empty({params}, DType::kF32, kGpu);
  ops::cast(master, values({params}));
  Tensor copy = poisoned({params}, DType::kBF16);
  bandwidth_line("cast f32 -> bf16, 2^28 elements", 6.0 * params, median_ms([&] { ops::cast(copy, master); }));
  const int64_t rows = 4096, vocab = 128256;
  Tensor logits = values({rows, vocab});
  const Tensor targets = ops::to_device(random_ids({rows}, vocab, rng), kGpu);
  Tensor losses = poisoned({rows}, DType::kF32), lse = poisoned({rows}, DType::kF32);
  bandwidth_line("cross_entropy forward [4096, 128256]", 2.0 * rows * vocab,
                 median_ms([&] { ops::cross_entropy_forward(logits, targets, losses, lse); }));
  bandwidth_line("cross_entropy backward in place [4096, 128256]", 4.0 * rows * vocab,
                 median_ms([&] { ops::cross_entropy_backward(logits, targets, lse, 1e-4f, logits); }));
}

}  // namespace
}  // namespace primus
