// What the op harness (support/op_cases.cpp, op_cases_gpu_test: every op's forward and gradients against the CPU)
// does not state about the CUDA backend: GEMMs on operands aligned to 4 bytes only and with an empty inner
// dimension, the merge of attention blocks where a side has seen no key, AdamW (with the clip factor and the bf16
// compute copy), sum_squares to 1e-11, copies, fill_normal's values, determinism (two runs give identical bits),
// data errors reported at the next wait, and the caching allocator's reuse.
//
// Tolerances (relative error of a whole tensor, ||gpu − cpu|| / ||cpu||): 1e-5 for AdamW (same formulas in fp32 on
// both sides); 1e-4 for gemm (cuBLASLt sums over K in its own blocked order); sum_squares 1e-11, both sides
// accumulating in double (in different orders).
//
// Without a usable CUDA device (or in a build without the CUDA backend) every test is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>

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
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

class CudaOps : public testing::GpuTest {};

Tensor gpu(const Tensor& t) { return ops::to_device(t, kGpu); }
Tensor host(const Tensor& t) { return ops::to_device(t, kCpuDevice); }

Tensor poisoned(const Shape& shape, Device device) {
  Tensor t = Tensor::empty(shape, DType::kF32, device);
  if (device.is_cpu()) {
    t.fill(kNaN);
  } else {
    backend_for(device).fill(t, kNaN);
  }
  return t;
}

// ---- gemm -----------------------------------------------------------------------------------------------------

// ops::gemm on both devices; a and b are views at `offset` elements into larger buffers, so offset 1 gives
// operands aligned to 4 bytes only.
void check_gemm(Rng& rng, int64_t m, int64_t n, int64_t k, bool ta, bool tb, float alpha, float beta, int64_t offset) {
  const Shape a_shape = ta ? Shape{k, m} : Shape{m, k};
  const Shape b_shape = tb ? Shape{n, k} : Shape{k, n};
  const Tensor a_buf = random_tensor({shape_numel(a_shape) + offset}, rng);
  const Tensor b_buf = random_tensor({shape_numel(b_shape) + offset}, rng);
  const Tensor a = a_buf.slice_elements(offset, a_shape), b = b_buf.slice_elements(offset, b_shape);
  const Tensor ga_buf = gpu(a_buf), gb_buf = gpu(b_buf);
  const Tensor ga = ga_buf.slice_elements(offset, a_shape), gb = gb_buf.slice_elements(offset, b_shape);
  Tensor c, gc;
  if (beta == 0.0f) {
    c = poisoned({m, n}, kCpuDevice);
    gc = poisoned({m, n}, kGpu);
  } else {
    c = random_tensor({m, n}, rng);
    gc = gpu(c);
  }
  ops::gemm(GemmArgs{&a, &b, &c, ta, tb, alpha, beta});
  ops::gemm(GemmArgs{&ga, &gb, &gc, ta, tb, alpha, beta});
  expect_close(
      fmt::format("gemm M={} N={} K={} ta={} tb={} alpha={} beta={} offset={}", m, n, k, ta, tb, alpha, beta, offset),
      gc, c, 1e-4);
}

TEST_F(CudaOps, GemmMatchesCpu) {
  Rng rng(301);
  const int64_t shapes[][3] = {{1, 33, 16}, {31, 64, 17}, {33, 1, 128}, {130, 96, 64}};
  for (const auto& s : shapes) {
    for (int t = 0; t < 4; ++t) {
      check_gemm(rng, s[0], s[1], s[2], t & 1, t & 2, 1.0f, 0.0f, 0);
      check_gemm(rng, s[0], s[1], s[2], t & 1, t & 2, 0.5f, 1.0f, 1);
    }
  }
  check_gemm(rng, 31, 33, 0, false, false, 1.0f, 0.0f, 0);  // empty K: C = 0
  check_gemm(rng, 31, 33, 0, false, true, 1.0f, 0.5f, 0);   // empty K: C = beta·C
}

// ---- attention ------------------------------------------------------------------------------------------------

// Rows that have seen no key (lse −inf, out NaN) take the block's; a block that saw none changes nothing.
TEST_F(CudaOps, AttentionMergeOfAnEmptySideTakesTheOther) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor out = Tensor::empty({1, 3, 1, 2}, DType::kF32), block = Tensor::empty(out.shape(), DType::kF32);
  Tensor lse = Tensor::empty({1, 1, 3}, DType::kF32), block_lse = Tensor::empty(lse.shape(), DType::kF32);
  const float out_rows[] = {kNaN, kNaN, 1, 2, 7, 7}, block_rows[] = {4, 5, kNaN, kNaN, 8, 8};
  const float lses[] = {-inf, 0.5f, -inf}, block_lses[] = {-1.5f, -inf, -inf};
  std::copy(std::begin(out_rows), std::end(out_rows), out.f32());
  std::copy(std::begin(block_rows), std::end(block_rows), block.f32());
  std::copy(std::begin(lses), std::end(lses), lse.f32());
  std::copy(std::begin(block_lses), std::end(block_lses), block_lse.f32());
  Tensor gout = gpu(out), glse = gpu(lse);
  ops::attention_merge(gout, glse, gpu(block), gpu(block_lse));
  const Tensor got = host(gout), got_lse = host(glse);
  const float want[] = {4, 5, 1, 2, 7, 7};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got.f32()[i], want[i]) << "element " << i;
  EXPECT_EQ(got_lse.f32()[0], -1.5f);
  EXPECT_EQ(got_lse.f32()[1], 0.5f);
  EXPECT_EQ(got_lse.f32()[2], -inf);
}

// ---- adamw, sum_squares -----------------------------------------------------------------------------------------

TEST_F(CudaOps, AdamWMatchesCpu) {
  Rng rng(309);
  for (int64_t n : {1, 31, 33, 100003}) {
    Tensor param = random_tensor({n}, rng), m = random_tensor({n}, rng, 0.1f);
    Tensor v = random_tensor({n}, rng, 0.1f);
    for (int64_t i = 0; i < n; ++i) v.f32()[i] *= v.f32()[i];  // second moments are ≥ 0
    Tensor gparam = gpu(param), gm = gpu(m), gv = gpu(v);
    for (int64_t step = 1; step <= 3; ++step) {
      const Tensor grad = random_tensor({n}, rng);
      const Tensor ggrad = gpu(grad);
      AdamWArgs args{&param, &grad, &m, &v, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
      ops::adamw_step(args);
      ops::adamw_step(AdamWArgs{&gparam, &ggrad, &gm, &gv, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step});
    }
    expect_close(fmt::format("adamw param n={}", n), gparam, param, 1e-5);
    expect_close(fmt::format("adamw exp_avg n={}", n), gm, m, 1e-5);
    expect_close(fmt::format("adamw exp_avg_sq n={}", n), gv, v, 1e-5);

    // The clip factor folded in, and the bf16 compute copy written by the same pass: its bits are those of
    // casting the updated weights.
    const Tensor grad = random_tensor({n}, rng);
    AdamWArgs args{&param, &grad, &m, &v, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 4};
    args.grad_scale = 0.37f;
    ops::adamw_step(args);
    const Tensor ggrad = gpu(grad);
    Tensor copy = Tensor::empty({n}, DType::kBF16, kGpu);
    AdamWArgs gargs{&gparam, &ggrad, &gm, &gv, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 4};
    gargs.grad_scale = 0.37f;
    gargs.compute_copy = &copy;
    ops::adamw_step(gargs);
    expect_close(fmt::format("adamw scaled param n={}", n), gparam, param, 1e-5);
    expect_close(fmt::format("adamw scaled exp_avg_sq n={}", n), gv, v, 1e-5);
    Tensor cast = Tensor::empty({n}, DType::kBF16, kGpu);
    ops::cast(cast, gparam);
    EXPECT_TRUE(same_bits(copy, cast)) << "adamw compute copy n=" << n;
  }
}

// add_inplace and scale_inplace are op cases (op_cases_gpu_test); sum_squares returns a double, held here to 1e-11.
TEST_F(CudaOps, SumSquaresMatchesCpu) {
  Rng rng(310);
  for (int64_t n : {1, 31, 33, 16384, 16385, 1000003}) {
    const Tensor y = random_tensor({n}, rng);
    const double want = ops::sum_squares(y);
    const double got = ops::sum_squares(gpu(y));
    std::printf("  %-58s rel err %.2e (tol 1e-11)\n", fmt::format("sum_squares n={}", n).c_str(),
                std::fabs(got - want) / want);
    EXPECT_LE(std::fabs(got - want), 1e-11 * want) << "sum_squares n=" << n;
  }
}

// ---- memory entries, determinism, data errors, allocator -----------------------------------------------------

TEST_F(CudaOps, CopyFillAndZero) {
  Rng rng(311);
  const Tensor x = random_tensor({33, 17}, rng);
  const Tensor ids = random_ids({1000}, 50000, rng);
  const Tensor gx = gpu(x);
  EXPECT_TRUE(same_bits(gx, x));
  EXPECT_TRUE(same_bits(gpu(ids), ids));
  Tensor twice = Tensor::empty(x.shape(), DType::kF32, kGpu);
  backend_for(kGpu).copy(twice, gx);  // device to device
  EXPECT_TRUE(same_bits(twice, x));
  backend_for(kGpu).fill(twice, 2.5f);
  const Tensor filled = host(twice);
  for (int64_t i = 0; i < filled.numel(); ++i) ASSERT_EQ(filled.f32()[i], 2.5f);
  backend_for(kGpu).zero(twice);
  const Tensor zeroed = host(twice);
  for (int64_t i = 0; i < zeroed.numel(); ++i) ASSERT_EQ(zeroed.f32()[i], 0.0f);
}

// Parameter initialisation on the GPU draws the CPU's values: the same counter-based stream, with the device's
// double-precision log and cos (within an ulp or two of glibc's), so after rounding to f32 a rare element may
// differ by one f32 ulp.
TEST_F(CudaOps, FillNormalDrawsTheCpuValues) {
  const int64_t n = 1'000'003;
  const uint64_t seed = Rng::derive(313, 7).seed();
  Tensor cpu_values = Tensor::empty({n}, DType::kF32);
  cpu_values.fill(kNaN);
  ops::fill_normal(cpu_values, seed, 0.02);
  Tensor gpu_values = Tensor::empty({n}, DType::kF32, kGpu);
  backend_for(kGpu).fill(gpu_values, kNaN);
  ops::fill_normal(gpu_values, seed, 0.02);
  const Tensor back = host(gpu_values);
  int64_t differing = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = cpu_values.f32()[i], b = back.f32()[i];
    if (a == b) continue;
    ++differing;
    ASSERT_EQ(std::abs(a - b), std::abs(std::nextafter(a, b) - a)) << "element " << i << ": " << a << " vs " << b;
  }
  EXPECT_LE(differing, 10) << "of " << n;
}

TEST_F(CudaOps, TwoRunsGiveIdenticalBits) {
  Rng rng(312);
  auto twice = [](auto&& run) { return std::make_pair(run(), run()); };
  const Tensor ids = gpu(random_ids({4096}, 37, rng)), dout = gpu(random_tensor({4096, 64}, rng));
  const Tensor dtable0 = gpu(random_tensor({37, 64}, rng));
  auto [e1, e2] = twice([&] {
    Tensor dtable = Tensor::empty(dtable0.shape(), DType::kF32, kGpu);
    backend_for(kGpu).copy(dtable, dtable0);
    ops::embedding_backward(ids, dout, dtable);
    return dtable;
  });
  EXPECT_TRUE(same_bits(e1, e2)) << "embedding_backward";

  const Tensor x = gpu(random_tensor({4097, 96}, rng)), w = gpu(random_tensor({96}, rng));
  const Tensor dy = gpu(random_tensor({4097, 96}, rng));
  Tensor y = poisoned({4097, 96}, kGpu), rstd = poisoned({4097}, kGpu);
  ops::rmsnorm_forward(x, w, 1e-5f, y, rstd);
  auto [r1, r2] = twice([&] {
    Tensor dw = Tensor::empty({96}, DType::kF32, kGpu), dx = poisoned({4097, 96}, kGpu);
    backend_for(kGpu).zero(dw);
    ops::rmsnorm_backward(dy, x, w, rstd, dx, dw);
    return dw;
  });
  EXPECT_TRUE(same_bits(r1, r2)) << "rmsnorm_backward dweight";

  const Tensor a = gpu(random_tensor({130, 256}, rng)), b = gpu(random_tensor({256, 96}, rng));
  auto [g1, g2] = twice([&] {
    Tensor c = poisoned({130, 96}, kGpu);
    ops::gemm(GemmArgs{&a, &b, &c});
    return c;
  });
  EXPECT_TRUE(same_bits(g1, g2)) << "gemm";

  const Tensor q = gpu(random_tensor({2, 130, 8, 64}, rng)), k = gpu(random_tensor({2, 130, 2, 64}, rng));
  const Tensor v = gpu(random_tensor({2, 130, 2, 64}, rng)), gout = gpu(random_tensor({2, 130, 8, 64}, rng));
  Tensor out = poisoned(q.shape(), kGpu), lse = poisoned({2, 8, 130}, kGpu);
  ops::attention_forward(q, k, v, out, lse);
  auto [a1, a2] = twice([&] {
    Tensor dq = poisoned(q.shape(), kGpu), dk = poisoned(k.shape(), kGpu), dv = poisoned(k.shape(), kGpu);
    ops::attention_backward(q, k, v, out, lse, gout, dq, dk, dv);
    return dk;
  });
  EXPECT_TRUE(same_bits(a1, a2)) << "attention_backward dk";

  const Tensor big = gpu(random_tensor({1000003}, rng));
  EXPECT_EQ(ops::sum_squares(big), ops::sum_squares(big)) << "sum_squares";
}

TEST_F(CudaOps, BadIdsAreReportedAtTheNextWait) {
  Rng rng(313);
  Tensor ids = random_ids({5}, 40, rng);
  ids.i32()[2] = 40;
  const Tensor table = gpu(random_tensor({40, 16}, rng));
  Tensor out = poisoned({5, 16}, kGpu);
  ops::embedding_forward(gpu(ids), table, out);  // returns without waiting
  try {
    backend_for(kGpu).synchronize();
    FAIL() << "an id outside the table was not reported";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("[op embedding_forward] id 40 at position 2"), std::string::npos) << e.what();
  }
  backend_for(kGpu).synchronize();  // reported once, then cleared

  Tensor targets = random_ids({3}, 16, rng);
  targets.i32()[1] = 16;
  Tensor losses = poisoned({3}, kGpu), lse = poisoned({3}, kGpu);
  ops::cross_entropy_forward(gpu(random_tensor({3, 16}, rng)), gpu(targets), losses, lse);
  EXPECT_THROW(host(losses), RuntimeError);
}

// Ids and targets of a shard are checked against the whole vocabulary, on the GPU too.
TEST_F(CudaOps, BadIdsOfAVocabularyShardAreReportedAtTheNextWait) {
  Rng rng(317);
  auto expect_reported = [](const std::string& fragment) {
    try {
      backend_for(kGpu).synchronize();
      ADD_FAILURE() << "not reported: " << fragment;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  const VocabShard rows{10, 40};  // table rows [10, 20) of 40
  Tensor ids = random_ids({5}, 40, rng);
  ids.i32()[2] = 40;
  const Tensor table = gpu(random_tensor({10, 16}, rng));
  Tensor out = poisoned({5, 16}, kGpu), dtable = poisoned({10, 16}, kGpu);
  ops::embedding_forward(gpu(ids), table, out, rows);
  expect_reported("[op embedding_forward] id 40 at position 2 is outside the vocabulary [0, 40)");
  ids.i32()[2] = -1;
  ops::embedding_backward(gpu(ids), out, dtable, rows);
  expect_reported("[op embedding_backward] id -1 at position 2 is outside the vocabulary [0, 40)");

  const VocabShard columns{8, 16};  // logit columns [8, 16) of 16
  Tensor targets = random_ids({3}, 16, rng);
  targets.i32()[1] = 16;
  const Tensor logits = gpu(random_tensor({3, 8}, rng)), gtargets = gpu(targets);
  Tensor max = poisoned({3}, kGpu), sum_exp = poisoned({3}, kGpu), target_logit = poisoned({3}, kGpu);
  ops::row_max(logits, max);
  ops::cross_entropy_shard_stats(logits, gtargets, columns, max, sum_exp, target_logit);
  expect_reported("[op cross_entropy_shard_stats] target 16 at row 1 is outside the vocabulary [0, 16)");
  Tensor dlogits = poisoned({3, 8}, kGpu);
  ops::cross_entropy_backward(logits, gtargets, max, 1.0f, dlogits, columns);
  expect_reported("[op cross_entropy_backward] target 16 at row 1 is outside the vocabulary [0, 16)");
}

#if PRIMUS_WITH_CUDA
TEST_F(CudaOps, CachingAllocatorReusesFreedBlocks) {
  EXPECT_EQ(CachingAllocator::size_class(1), 512u);
  EXPECT_EQ(CachingAllocator::size_class(512), 512u);
  EXPECT_EQ(CachingAllocator::size_class(513), 640u);
  EXPECT_EQ(CachingAllocator::size_class(1024), 1024u);
  EXPECT_EQ(CachingAllocator::size_class(1025), 1280u);
  // Above 1 GiB, 64 classes per power of two: the 1B config's 4.60 GiB fp32 state buffers take 4.625 GiB, not 5.
  constexpr size_t kMiB = size_t{1} << 20;
  EXPECT_EQ(CachingAllocator::size_class(1024 * kMiB), 1024 * kMiB);
  EXPECT_EQ(CachingAllocator::size_class(1024 * kMiB + 1), 1040 * kMiB);
  EXPECT_EQ(CachingAllocator::size_class(size_t{1235814400} * 4), 4736 * kMiB);
  // Above 2 GiB in steps of 32 MiB at most: the Mixtral layer shape's 22.6 GiB moments waste under 32 MiB each.
  EXPECT_EQ(CachingAllocator::size_class(24 * 1024 * kMiB + 1), (24 * 1024 + 32) * kMiB);
  EXPECT_EQ(CachingAllocator::size_class(size_t{6068000000} * 4), 23168 * kMiB);
  CachingAllocator& allocator = start_cuda_backend(0).allocator();
  const CudaMemoryStats before = allocator.stats();
  void* first = allocator.allocate(3000);
  allocator.deallocate(first, 3000);
  void* second = allocator.allocate(2900);  // same size class (3072)
  EXPECT_EQ(first, second);
  const CudaMemoryStats during = allocator.stats();
  EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + 3072);
  EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
  EXPECT_GE(during.cache_hits, before.cache_hits + 1);
  allocator.deallocate(second, 2900);
  EXPECT_EQ(allocator.stats().allocated_bytes, before.allocated_bytes);
}
#endif

}  // namespace
}  // namespace primus
