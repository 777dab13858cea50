// Mixed precision on the CUDA backend: every op that takes bf16 activations, through src/ops, against the CPU
// fp32 reference run on the same inputs rounded to bf16 (core/bf16.h), at awkward sizes (1, 31, 33 rows; head
// sizes 12, 64, 128; T = 1, 17, 130, 1000; GQA 8/2 and 32/8). Every GPU output is poisoned with NaN bits first
// and must come back finite.
//
// Tolerances (relative L2 error of a whole tensor, ||gpu − cpu|| / ||cpu||):
//  - kRounded 5e-3: a bf16 output that is an fp32 result rounded once (every kernel here computes in fp32 from
//    the same bf16 inputs as the CPU). Rounding to bf16 moves an element by at most 2^-8 ≈ 3.9e-3 of itself, so
//    the error cannot pass 3.9e-3 plus the fp32 differences (~1e-6); expect ~1.5e-3.
//  - kFp32 1e-5: fp32 outputs computed from the same bf16 inputs (rstd, lse, losses, rmsnorm dweight, casts
//    back): only fp32 roundings in another order, as in ops_cuda_gpu_test.
//  - kGemmFp32 1e-4: fp32 GEMM outputs (weight gradients accumulated into fp32): bf16 products are exact in fp32,
//    the K sums run in cuBLASLt's blocked order (error ~sqrt(K)·2^-24).
//  - kAttention 1e-2: cuDNN rounds P and dS to bf16 before their matmuls and the outputs once more
//    (docs/perf/attention.md measured 1.8e-3 – 3.2e-3); lse within kFp32.
// Exact: embedding forward (a row copy), embedding dtable (fp32 sums of exactly widened bf16 in the CPU's
// order), both also split over vocabulary shards, and cast (the same round-to-nearest-even on both devices).
// Measured on the H200 (2026-12-02, cuDNN 9.14): largest kRounded error 2.2e-3, kFp32 and kGemmFp32 1.2e-7,
// attention 3.2e-3 (dk), lse 1.2e-7.
// Determinism: two runs give identical bits for every op except cuDNN's dq (fp32 atomics by design).
// A throughput test prints GB/s and TFLOP/s at the llama3.2-1B step shapes (not asserted).
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
#include "support/vocab_shards.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace primus {
namespace {

using primus::testing::expect_close;
using primus::testing::host_f32;
using primus::testing::random_ids;
using primus::testing::random_tensor;
using primus::testing::same_bits;

constexpr Device kGpu{DeviceType::kCuda, 0};
constexpr double kRounded = 5e-3;
constexpr double kFp32 = 1e-5;
constexpr double kGemmFp32 = 1e-4;
constexpr double kAttention = 1e-2;

class Bf16Ops : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = testing::why_no_gpu();
    if (!why.empty()) GTEST_SKIP() << why;
#if PRIMUS_WITH_CUDA
    start_cuda_backend(0);
#endif
  }
};

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

// ---- gemm and linear -----------------------------------------------------------------------------------------

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

TEST_F(Bf16Ops, LinearMatchesCpu) {
  Rng rng(402);
  for (int64_t rows : {1, 31, 33}) {
    const Tensor x = random_bf16_values({rows, 64}, rng), w = random_bf16_values({48, 64}, rng);
    const Tensor dy = random_bf16_values({rows, 48}, rng), dw0 = random_tensor({48, 64}, rng);
    const Tensor gx = bf16_gpu(x), gw = bf16_gpu(w), gdy = bf16_gpu(dy);
    Tensor y = Tensor::empty({rows, 48}, DType::kF32), dx = Tensor::empty({rows, 64}, DType::kF32);
    Tensor dw = Tensor::empty(dw0.shape(), DType::kF32);
    dw.copy_from(dw0);
    Tensor gy = poisoned({rows, 48}, DType::kBF16), glogits = poisoned({rows, 48}, DType::kF32);
    Tensor gdx = poisoned({rows, 64}, DType::kBF16), gdw = ops::to_device(dw0, kGpu);
    ops::linear_forward(x, w, y);
    ops::linear_forward(gx, gw, gy);
    ops::linear_forward(gx, gw, glogits);
    ops::linear_backward(x, w, dy, dx, dw);
    ops::linear_backward(gx, gw, gdy, gdx, gdw);
    expect_close(fmt::format("linear y bf16 rows={}", rows), gy, y, kRounded);
    expect_close(fmt::format("linear y f32 (logits) rows={}", rows), glogits, y, kGemmFp32);
    expect_close(fmt::format("linear dx bf16 rows={}", rows), gdx, dx, kRounded);
    expect_close(fmt::format("linear dw f32 (accumulated) rows={}", rows), gdw, dw, kGemmFp32);
  }
}

// ---- embedding, rmsnorm, rope, swiglu, add, cast --------------------------------------------------------------

TEST_F(Bf16Ops, EmbeddingMatchesCpuBitForBit) {
  Rng rng(403);
  for (int64_t vocab : {37, 1000}) {
    for (int64_t channels : {64, 128}) {
      for (int64_t n : {1, 31, 33, 130}) {
        const std::string shape = fmt::format("V={} C={} N={}", vocab, channels, n);
        const Tensor ids = random_ids({n}, vocab, rng), table = random_bf16_values({vocab, channels}, rng);
        const Tensor dout = random_bf16_values({n, channels}, rng), dtable0 = random_tensor({vocab, channels}, rng);
        Tensor out = Tensor::empty({n, channels}, DType::kF32), gout = poisoned({n, channels}, DType::kBF16);
        ops::embedding_forward(ids, table, out);
        ops::embedding_forward(ops::to_device(ids, kGpu), bf16_gpu(table), gout);
        EXPECT_TRUE(same_bits(host_f32(gout), out)) << "embedding out " << shape;
        Tensor dtable = Tensor::empty(dtable0.shape(), DType::kF32), gdtable = ops::to_device(dtable0, kGpu);
        dtable.copy_from(dtable0);
        ops::embedding_backward(ids, dout, dtable);
        ops::embedding_backward(ops::to_device(ids, kGpu), bf16_gpu(dout), gdtable);
        EXPECT_TRUE(same_bits(gdtable, dtable)) << "embedding dtable (f32, accumulated) " << shape;
      }
    }
  }
}

TEST_F(Bf16Ops, RmsNormMatchesCpu) {
  Rng rng(404);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t channels : {64, 128, 1000, 2048}) {
      const std::string shape = fmt::format("N={} C={}", rows, channels);
      const Tensor x = random_bf16_values({rows, channels}, rng, 2.0f), w = random_bf16_values({channels}, rng);
      const Tensor dy = random_bf16_values({rows, channels}, rng), dw0 = random_tensor({channels}, rng);
      const Tensor gx = bf16_gpu(x), gw = bf16_gpu(w);
      Tensor y = Tensor::empty({rows, channels}, DType::kF32), rstd = Tensor::empty({rows}, DType::kF32);
      Tensor gy = poisoned({rows, channels}, DType::kBF16), grstd = poisoned({rows}, DType::kF32);
      ops::rmsnorm_forward(x, w, 1e-5f, y, rstd);
      ops::rmsnorm_forward(gx, gw, 1e-5f, gy, grstd);
      expect_close("rmsnorm y " + shape, gy, y, kRounded);
      expect_close("rmsnorm rstd " + shape, grstd, rstd, kFp32);
      Tensor dx = Tensor::empty({rows, channels}, DType::kF32), gdx = poisoned({rows, channels}, DType::kBF16);
      Tensor dw = Tensor::empty({channels}, DType::kF32), gdw = ops::to_device(dw0, kGpu);
      dw.copy_from(dw0);
      ops::rmsnorm_backward(dy, x, w, rstd, dx, dw);
      ops::rmsnorm_backward(bf16_gpu(dy), gx, gw, grstd, gdx, gdw);
      expect_close("rmsnorm dx " + shape, gdx, dx, kRounded);
      expect_close("rmsnorm dweight f32 (accumulated) " + shape, gdw, dw, kFp32);
    }
  }
}

TEST_F(Bf16Ops, RopeMatchesCpu) {
  Rng rng(405);
  for (int64_t seq : {1, 17, 130}) {
    for (int64_t head_dim : {64, 128}) {
      const std::string shape = fmt::format("T={} D={}", seq, head_dim);
      const int64_t half = head_dim / 2;
      Tensor cos = Tensor::empty({seq, half}, DType::kF32), sin = Tensor::empty({seq, half}, DType::kF32);
      for (int64_t t = 0; t < seq; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(t) * std::pow(10000.0, -2.0 * static_cast<double>(i) / head_dim);
          cos.f32()[t * half + i] = static_cast<float>(std::cos(angle));
          sin.f32()[t * half + i] = static_cast<float>(std::sin(angle));
        }
      }
      const Tensor gcos = ops::to_device(cos, kGpu), gsin = ops::to_device(sin, kGpu);
      for (const bool forward : {true, false}) {
        Tensor x = random_bf16_values({2, seq, 3, head_dim}, rng);
        Tensor gx = bf16_gpu(x);
        if (forward) {
          ops::rope_forward(x, cos, sin);
          ops::rope_forward(gx, gcos, gsin);
        } else {
          ops::rope_backward(x, cos, sin);
          ops::rope_backward(gx, gcos, gsin);
        }
        expect_close(std::string(forward ? "rope forward " : "rope backward ") + shape, gx, x, kRounded);
      }
    }
  }
}

TEST_F(Bf16Ops, SwiGluAddAndCastMatchCpu) {
  Rng rng(406);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t width : {64, 1000}) {
      const std::string shape = fmt::format("N={} F={}", rows, width);
      const Tensor gate_up = random_bf16_values({rows, 2 * width}, rng, 4.0f);
      const Tensor dout = random_bf16_values({rows, width}, rng);
      const Tensor ggate_up = bf16_gpu(gate_up);
      Tensor out = Tensor::empty({rows, width}, DType::kF32), gout = poisoned({rows, width}, DType::kBF16);
      ops::swiglu_forward(gate_up, out);
      ops::swiglu_forward(ggate_up, gout);
      expect_close("swiglu out " + shape, gout, out, kRounded);
      Tensor grad = Tensor::empty({rows, 2 * width}, DType::kF32);
      Tensor ggrad = poisoned({rows, 2 * width}, DType::kBF16);
      ops::swiglu_backward(gate_up, dout, grad);
      ops::swiglu_backward(ggate_up, bf16_gpu(dout), ggrad);
      expect_close("swiglu dgate_up " + shape, ggrad, grad, kRounded);
    }
  }
  for (int64_t n : {1, 31, 33, 16385, 1000003}) {
    Tensor y = random_bf16_values({n}, rng);
    const Tensor x = random_bf16_values({n}, rng);
    Tensor gy = bf16_gpu(y);
    ops::add_inplace(y, x);
    ops::add_inplace(gy, bf16_gpu(x));
    expect_close(fmt::format("add_inplace n={}", n), gy, y, kRounded);

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

// ---- cross-entropy --------------------------------------------------------------------------------------------

TEST_F(Bf16Ops, CrossEntropyMatchesCpu) {
  Rng rng(408);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t vocab : {16, 1000, 50257}) {
      const std::string shape = fmt::format("N={} V={}", rows, vocab);
      const Tensor logits = random_bf16_values({rows, vocab}, rng, 3.0f);
      Tensor targets = random_ids({rows}, vocab, rng);
      for (int64_t r = 3; r < rows; r += 7) targets.i32()[r] = -1;  // ignored rows
      const Tensor glogits = bf16_gpu(logits), gtargets = ops::to_device(targets, kGpu);
      Tensor losses = Tensor::empty({rows}, DType::kF32), lse = Tensor::empty({rows}, DType::kF32);
      Tensor glosses = poisoned({rows}, DType::kF32), glse = poisoned({rows}, DType::kF32);
      ops::cross_entropy_forward(logits, targets, losses, lse);
      ops::cross_entropy_forward(glogits, gtargets, glosses, glse);
      expect_close("cross_entropy losses " + shape, glosses, losses, kFp32);
      expect_close("cross_entropy lse " + shape, glse, lse, kFp32);
      const float scale = 1.0f / static_cast<float>(rows);
      Tensor dlogits = Tensor::empty({rows, vocab}, DType::kF32), gdlogits = poisoned({rows, vocab}, DType::kBF16);
      ops::cross_entropy_backward(logits, targets, lse, scale, dlogits);
      ops::cross_entropy_backward(glogits, gtargets, glse, scale, gdlogits);
      expect_close("cross_entropy dlogits " + shape, gdlogits, dlogits, kRounded);
      Tensor in_place = bf16_gpu(logits);
      ops::cross_entropy_backward(in_place, gtargets, glse, scale, in_place);
      EXPECT_TRUE(same_bits(in_place, gdlogits)) << "dlogits written over the logits, " << shape;
      // Forward and backward in one launch, in place, as the loss layer runs them.
      Tensor fused = bf16_gpu(logits);
      Tensor flosses = poisoned({rows}, DType::kF32), flse = poisoned({rows}, DType::kF32);
      ops::cross_entropy_forward_backward(fused, gtargets, flosses, flse, scale, fused);
      expect_close("cross_entropy fused losses " + shape, flosses, losses, kFp32);
      expect_close("cross_entropy fused lse " + shape, flse, lse, kFp32);
      expect_close("cross_entropy fused dlogits " + shape, fused, dlogits, kRounded);
    }
  }
}

// The vocabulary-parallel steps over 1 to 4 simulated ranks on bf16 logits (support/vocab_shards.h) against the CPU's
// unsharded op on the same rounded values and the GPU's unsharded bf16 op. Against the GPU op the dlogits are bf16
// roundings of fp32 values that differ by an lse rounding at most, so an element may round the other way: kRounded.
TEST_F(Bf16Ops, VocabParallelCrossEntropyMatchesCpu) {
  Rng rng(411);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t vocab : {16, 1000, 50257}) {
      const Tensor logits = random_bf16_values({rows, vocab}, rng, 3.0f);
      Tensor targets = random_ids({rows}, vocab, rng);
      for (int64_t r = 3; r < rows; r += 7) targets.i32()[r] = -1;
      const Tensor glogits = bf16_gpu(logits), gtargets = ops::to_device(targets, kGpu);
      const float scale = 1.0f / static_cast<float>(rows);
      Tensor losses = Tensor::empty({rows}, DType::kF32), lse = Tensor::empty({rows}, DType::kF32);
      Tensor dlogits = Tensor::empty({rows, vocab}, DType::kF32);
      ops::cross_entropy_forward(logits, targets, losses, lse);
      ops::cross_entropy_backward(logits, targets, lse, scale, dlogits);
      Tensor glosses = poisoned({rows}, DType::kF32), glse = poisoned({rows}, DType::kF32);
      Tensor gdlogits = poisoned({rows, vocab}, DType::kBF16);
      ops::cross_entropy_forward(glogits, gtargets, glosses, glse);
      ops::cross_entropy_backward(glogits, gtargets, glse, scale, gdlogits);
      for (int ranks = 1; ranks <= 4; ++ranks) {
        const std::string what = fmt::format("N={} V={} ranks={}", rows, vocab, ranks);
        const testing::VocabParallelLoss g = testing::vocab_parallel_cross_entropy(glogits, gtargets, ranks, scale);
        expect_close("losses vs cpu " + what, g.losses, losses, kFp32);
        expect_close("lse vs cpu " + what, g.lse, lse, kFp32);
        expect_close("dlogits vs cpu " + what, g.dlogits, dlogits, kRounded);
        expect_close("losses vs unsharded " + what, g.losses, glosses, kFp32);
        expect_close("lse vs unsharded " + what, g.lse, glse, kFp32);
        expect_close("dlogits vs unsharded " + what, g.dlogits, gdlogits, kRounded);
      }
    }
  }
}

TEST_F(Bf16Ops, VocabParallelEmbeddingMatchesCpuBitForBit) {
  Rng rng(412);
  for (int64_t vocab : {37, 1000}) {
    for (int64_t n : {1, 33, 130}) {
      const int64_t channels = 128;
      const Tensor ids = random_ids({n}, vocab, rng), table = random_bf16_values({vocab, channels}, rng);
      const Tensor dout = random_bf16_values({n, channels}, rng), dtable0 = random_tensor({vocab, channels}, rng);
      const Tensor gids = ops::to_device(ids, kGpu), gtable = bf16_gpu(table), gdout = bf16_gpu(dout);
      const Tensor gdtable0 = ops::to_device(dtable0, kGpu);
      for (int ranks = 1; ranks <= 4; ++ranks) {
        const std::string what = fmt::format("V={} N={} ranks={}", vocab, n, ranks);
        const testing::VocabParallelEmbedding g =
            testing::vocab_parallel_embedding(gids, gtable, gdout, gdtable0, ranks);
        const testing::VocabParallelEmbedding c = testing::vocab_parallel_embedding(ids, table, dout, dtable0, ranks);
        EXPECT_TRUE(same_bits(g.out, c.out)) << "out " << what;
        EXPECT_TRUE(same_bits(g.dtable, c.dtable)) << "dtable (f32, accumulated) " << what;
      }
    }
  }
}

// ---- attention ------------------------------------------------------------------------------------------------

struct AttentionCase {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
};

void check_attention(const AttentionCase& c, uint64_t seed) {
  Rng rng(seed);
  const Shape q_shape{c.batch, c.seq, c.q_heads, c.head_dim}, kv_shape{c.batch, c.seq, c.kv_heads, c.head_dim};
  const Shape lse_shape{c.batch, c.q_heads, c.seq};
  const std::string shape =
      fmt::format("B={} T={} Hq={} Hkv={} D={}", c.batch, c.seq, c.q_heads, c.kv_heads, c.head_dim);
  const Tensor q = random_bf16_values(q_shape, rng), k = random_bf16_values(kv_shape, rng);
  const Tensor v = random_bf16_values(kv_shape, rng), dout = random_bf16_values(q_shape, rng);
  const Tensor gq = bf16_gpu(q), gk = bf16_gpu(k), gv = bf16_gpu(v), gdout = bf16_gpu(dout);
  Tensor out = Tensor::empty(q_shape, DType::kF32), lse = Tensor::empty(lse_shape, DType::kF32);
  Tensor gout = poisoned(q_shape, DType::kBF16), glse = poisoned(lse_shape, DType::kF32);
  ops::attention_forward(q, k, v, out, lse);
  ops::attention_forward(gq, gk, gv, gout, glse);
  expect_close("attention out " + shape, gout, out, kAttention);
  expect_close("attention lse " + shape, glse, lse, kFp32);
  Tensor dq = Tensor::empty(q_shape, DType::kF32), dk = Tensor::empty(kv_shape, DType::kF32);
  Tensor dv = Tensor::empty(kv_shape, DType::kF32);
  Tensor gdq = poisoned(q_shape, DType::kBF16), gdk = poisoned(kv_shape, DType::kBF16);
  Tensor gdv = poisoned(kv_shape, DType::kBF16);
  ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv);
  ops::attention_backward(gq, gk, gv, gout, glse, gdout, gdq, gdk, gdv);
  // At T = 1, dq and dk are zero in exact arithmetic (p = 1): compare absolutely there (see ops_cuda_gpu_test).
  const double floor = c.seq == 1 ? 1.0 : 1e-30;
  expect_close("attention dq " + shape, gdq, dq, kAttention, floor);
  expect_close("attention dk " + shape, gdk, dk, kAttention, floor);
  expect_close("attention dv " + shape, gdv, dv, kAttention);
}

TEST_F(Bf16Ops, AttentionMatchesCpu) {
  uint64_t seed = 409;
  for (int64_t seq : {1, 17, 130}) {
    for (int64_t d : {64, 128}) check_attention({2, seq, 8, 2, d}, seed++);
  }
  check_attention({1, 1000, 32, 8, 128}, seed++);  // the llama3.2-1B head layout
  check_attention({2, 17, 4, 4, 12}, seed++);      // D not a multiple of 8: the simple kernels in bf16
}

// Ring attention's ops in bf16 (cuDNN's unmasked and causal graphs, the native kernels for D = 12 and the T = 1
// backward, the merge kernel): an unmasked block and a causal one against the same queries, merged on each device
// from its own block results; then each block's backward from the merged out and lse (the CPU's, rounded to bf16,
// on both devices), i.e. the block's contributions to the whole's gradients.
void check_attention_blocks(const AttentionCase& c, uint64_t seed) {
  Rng rng(seed);
  const Shape q_shape{c.batch, c.seq, c.q_heads, c.head_dim}, kv_shape{c.batch, c.seq, c.kv_heads, c.head_dim};
  const Shape lse_shape{c.batch, c.q_heads, c.seq};
  const std::string shape =
      fmt::format("B={} T={} Hq={} Hkv={} D={}", c.batch, c.seq, c.q_heads, c.kv_heads, c.head_dim);
  const Tensor q = random_bf16_values(q_shape, rng), dout = random_bf16_values(q_shape, rng);
  const Tensor ka = random_bf16_values(kv_shape, rng), va = random_bf16_values(kv_shape, rng);
  const Tensor kb = random_bf16_values(kv_shape, rng), vb = random_bf16_values(kv_shape, rng);
  Tensor out = Tensor::empty(q_shape, DType::kF32), lse = Tensor::empty(lse_shape, DType::kF32);
  Tensor block = Tensor::empty(q_shape, DType::kF32), block_lse = Tensor::empty(lse_shape, DType::kF32);
  Tensor gout = poisoned(q_shape, DType::kBF16), glse = poisoned(lse_shape, DType::kF32);
  Tensor gblock = poisoned(q_shape, DType::kBF16), gblock_lse = poisoned(lse_shape, DType::kF32);
  ops::attention_block_forward(q, ka, va, AttentionMask::kNone, out, lse);
  ops::attention_block_forward(bf16_gpu(q), bf16_gpu(ka), bf16_gpu(va), AttentionMask::kNone, gout, glse);
  expect_close("unmasked block out " + shape, gout, out, kAttention);
  expect_close("unmasked block lse " + shape, glse, lse, kFp32);
  ops::attention_block_forward(q, kb, vb, AttentionMask::kCausal, block, block_lse);
  ops::attention_block_forward(bf16_gpu(q), bf16_gpu(kb), bf16_gpu(vb), AttentionMask::kCausal, gblock, gblock_lse);
  ops::attention_merge(out, lse, block, block_lse);
  ops::attention_merge(gout, glse, gblock, gblock_lse);
  expect_close("merged out " + shape, gout, out, kAttention);
  expect_close("merged lse " + shape, glse, lse, kFp32);
  const Tensor merged = rounded(out);  // the backward's inputs: the same bf16 values on both devices
  const Tensor gmerged = bf16_gpu(merged), gmerged_lse = ops::to_device(lse, kGpu), gdout = bf16_gpu(dout);
  const double floor = c.seq == 1 ? 1.0 : 1e-30;  // dq, dk of one key: zero in exact arithmetic
  for (const bool causal : {false, true}) {
    const AttentionMask mask = causal ? AttentionMask::kCausal : AttentionMask::kNone;
    const Tensor& k = causal ? kb : ka;
    const Tensor& v = causal ? vb : va;
    const std::string what = fmt::format("{} block {}", causal ? "causal" : "unmasked", shape);
    Tensor dq = Tensor::empty(q_shape, DType::kF32), dk = Tensor::empty(kv_shape, DType::kF32);
    Tensor dv = Tensor::empty(kv_shape, DType::kF32);
    Tensor gdq = poisoned(q_shape, DType::kBF16), gdk = poisoned(kv_shape, DType::kBF16);
    Tensor gdv = poisoned(kv_shape, DType::kBF16);
    ops::attention_block_backward(q, k, v, mask, merged, lse, dout, dq, dk, dv);
    ops::attention_block_backward(bf16_gpu(q), bf16_gpu(k), bf16_gpu(v), mask, gmerged, gmerged_lse, gdout, gdq, gdk,
                                  gdv);
    expect_close("dq of the " + what, gdq, dq, kAttention, floor);
    expect_close("dk of the " + what, gdk, dk, kAttention, floor);
    expect_close("dv of the " + what, gdv, dv, kAttention);
  }
}

TEST_F(Bf16Ops, AttentionBlocksMergeAndBlockBackwardMatchCpu) {
  uint64_t seed = 431;
  for (int64_t seq : {1, 17, 128, 130}) {
    for (int64_t d : {64, 128}) check_attention_blocks({2, seq, 8, 2, d}, seed++);
  }
  check_attention_blocks({1, 1024, 32, 8, 128}, seed++);  // a chunk of an 8k sequence at cp 4, 1B head layout
  check_attention_blocks({1, 704, 8, 8, 64}, seed++);     // S ≡ 64 (mod 128), unmasked: the padded backward
  check_attention_blocks({2, 17, 4, 4, 12}, seed++);      // D not a multiple of 8: the simple kernels in bf16
}

// ---- determinism ----------------------------------------------------------------------------------------------

TEST_F(Bf16Ops, TwoRunsGiveIdenticalBits) {
  Rng rng(410);
  auto twice = [](const std::string& what, const std::function<std::vector<Tensor>()>& run) {
    const std::vector<Tensor> first = run(), second = run();
    for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(same_bits(first[i], second[i])) << what << " output " << i;
  };
  const Tensor x = bf16_gpu(random_bf16_values({4097, 256}, rng)), w = bf16_gpu(random_bf16_values({96, 256}, rng));
  const Tensor dy = bf16_gpu(random_bf16_values({4097, 96}, rng));
  twice("linear", [&] {
    Tensor y = poisoned({4097, 96}, DType::kBF16), dx = poisoned({4097, 256}, DType::kBF16);
    Tensor dw = ops::zeros({96, 256}, DType::kF32, kGpu);
    ops::linear_forward(x, w, y);
    ops::linear_backward(x, w, dy, dx, dw);
    return std::vector<Tensor>{y, dx, dw};
  });
  const Tensor nw = bf16_gpu(random_bf16_values({256}, rng)), ndy = bf16_gpu(random_bf16_values({4097, 256}, rng));
  twice("rmsnorm", [&] {
    Tensor y = poisoned({4097, 256}, DType::kBF16), rstd = poisoned({4097}, DType::kF32);
    Tensor dx = poisoned({4097, 256}, DType::kBF16), dweight = ops::zeros({256}, DType::kF32, kGpu);
    ops::rmsnorm_forward(x, nw, 1e-5f, y, rstd);
    ops::rmsnorm_backward(ndy, x, nw, rstd, dx, dweight);
    return std::vector<Tensor>{y, rstd, dx, dweight};
  });
  const Tensor ids = ops::to_device(random_ids({4097}, 37, rng), kGpu);
  twice("embedding_backward", [&] {
    Tensor dtable = ops::zeros({37, 256}, DType::kF32, kGpu);
    ops::embedding_backward(ids, ndy, dtable);
    return std::vector<Tensor>{dtable};
  });
  const Tensor logits = bf16_gpu(random_bf16_values({33, 50257}, rng, 3.0f));
  const Tensor targets = ops::to_device(random_ids({33}, 50257, rng), kGpu);
  twice("cross_entropy", [&] {
    Tensor losses = poisoned({33}, DType::kF32), lse = poisoned({33}, DType::kF32);
    Tensor dlogits = poisoned({33, 50257}, DType::kBF16);
    ops::cross_entropy_forward(logits, targets, losses, lse);
    ops::cross_entropy_backward(logits, targets, lse, 0.03f, dlogits);
    return std::vector<Tensor>{losses, lse, dlogits};
  });
  const VocabShard shard{25128, 50257};  // the second of two ranks' columns
  const Tensor half = bf16_gpu(random_bf16_values({33, 50257 - 25128}, rng, 3.0f));
  twice("vocabulary-parallel cross_entropy", [&] {
    Tensor max = poisoned({33}, DType::kF32), sum_exp = poisoned({33}, DType::kF32);
    Tensor target_logit = poisoned({33}, DType::kF32), losses = poisoned({33}, DType::kF32);
    Tensor lse = poisoned({33}, DType::kF32), dlogits = poisoned(half.shape(), DType::kBF16);
    ops::row_max(half, max);
    ops::cross_entropy_shard_stats(half, targets, shard, max, sum_exp, target_logit);
    ops::cross_entropy_finish(max, sum_exp, target_logit, targets, losses, lse);
    ops::cross_entropy_backward(half, targets, lse, 0.03f, dlogits, shard);
    return std::vector<Tensor>{max, sum_exp, target_logit, losses, lse, dlogits};
  });
  const Tensor q = bf16_gpu(random_bf16_values({2, 130, 8, 64}, rng));
  const Tensor k = bf16_gpu(random_bf16_values({2, 130, 2, 64}, rng));
  const Tensor v = bf16_gpu(random_bf16_values({2, 130, 2, 64}, rng));
  const Tensor dout = bf16_gpu(random_bf16_values({2, 130, 8, 64}, rng));
  twice("attention (cuDNN; dq excluded: fp32 atomics)", [&] {
    Tensor out = poisoned(q.shape(), DType::kBF16), lse = poisoned({2, 8, 130}, DType::kF32);
    Tensor dq = poisoned(q.shape(), DType::kBF16), dk = poisoned(k.shape(), DType::kBF16);
    Tensor dv = poisoned(k.shape(), DType::kBF16);
    ops::attention_forward(q, k, v, out, lse);
    ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv);
    return std::vector<Tensor>{out, lse, dk, dv};
  });
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
