// Every op through src/ops on the CUDA backend against the CPU reference backend, on fresh random inputs at
// awkward sizes (1, 31, 33 rows; head sizes 16, 64, 128; T = 1, 17, 130; GQA 8/2 and plain heads). Outputs on
// both devices are poisoned with NaN first, so an element a kernel forgets to write fails the comparison.
//
// Tolerances (relative error of a whole tensor, ||gpu − cpu|| / ||cpu||):
//  - 1e-5 for element-wise ops, norms, RoPE, cross-entropy, AdamW, embedding: same formulas in fp32 on both
//    sides; they differ only by fused multiply-adds on the GPU and expf vs glibc exp (≤ 2 ulp), ~1e-7.
//  - 1e-4 for gemm and attention: cuBLASLt sums over K in its own blocked order (error grows like sqrt(K)·eps
//    with K up to 130 here), and attention chains several such sums through exp.
//  - sum_squares: 1e-11, both sides accumulate in double (in different orders).
// Also: the embedding gradient equals the CPU's bit for bit (same order of fp32 adds), two runs of every
// reduction-heavy op give identical bits, data errors found on the GPU are thrown at the next wait, and the
// caching allocator reuses freed blocks. The vocabulary-parallel ops (tensor parallelism) are checked step by step
// against the CPU and, over 1 to 4 simulated ranks (support/vocab_shards.h), against the unsharded ops.
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
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

class CudaOps : public ::testing::Test {
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

TEST_F(CudaOps, LinearMatchesCpu) {
  Rng rng(302);
  for (int64_t rows : {1, 31, 33}) {
    const Tensor x = random_tensor({rows, 64}, rng), w = random_tensor({48, 64}, rng),
                 dy = random_tensor({rows, 48}, rng);
    const Tensor dw0 = random_tensor({48, 64}, rng);
    Tensor y = poisoned({rows, 48}, kCpuDevice), gy = poisoned({rows, 48}, kGpu);
    Tensor dx = poisoned({rows, 64}, kCpuDevice), gdx = poisoned({rows, 64}, kGpu);
    Tensor dw = host(gpu(dw0)), gdw = gpu(dw0);
    const Tensor gx = gpu(x), gw = gpu(w), gdy = gpu(dy);
    ops::linear_forward(x, w, y);
    ops::linear_forward(gx, gw, gy);
    ops::linear_backward(x, w, dy, dx, dw);
    ops::linear_backward(gx, gw, gdy, gdx, gdw);
    expect_close(fmt::format("linear y rows={}", rows), gy, y, 1e-4);
    expect_close(fmt::format("linear dx rows={}", rows), gdx, dx, 1e-4);
    expect_close(fmt::format("linear dw (accumulated) rows={}", rows), gdw, dw, 1e-4);
  }
}

// ---- embedding, rmsnorm, rope, swiglu ------------------------------------------------------------------------

TEST_F(CudaOps, EmbeddingMatchesCpuBitForBit) {
  Rng rng(303);
  for (int64_t vocab : {37, 1000}) {
    for (int64_t channels : {16, 64, 128}) {
      for (int64_t n : {1, 31, 33, 130}) {
        const std::string shape = fmt::format("V={} C={} N={}", vocab, channels, n);
        const Tensor ids = random_ids({n}, vocab, rng), table = random_tensor({vocab, channels}, rng);
        const Tensor dout = random_tensor({n, channels}, rng), dtable0 = random_tensor({vocab, channels}, rng);
        Tensor out = poisoned({n, channels}, kCpuDevice), gout = poisoned({n, channels}, kGpu);
        ops::embedding_forward(ids, table, out);
        ops::embedding_forward(gpu(ids), gpu(table), gout);
        expect_close("embedding out " + shape, gout, out, 1e-5);
        Tensor dtable = host(gpu(dtable0)), gdtable = gpu(dtable0);
        ops::embedding_backward(ids, dout, dtable);
        ops::embedding_backward(gpu(ids), gpu(dout), gdtable);
        expect_close("embedding dtable (accumulated) " + shape, gdtable, dtable, 1e-5);
        EXPECT_TRUE(same_bits(gdtable, dtable)) << "repeated ids are summed in token order on both devices, " << shape;
      }
    }
  }
}

TEST_F(CudaOps, RmsNormMatchesCpu) {
  Rng rng(304);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t channels : {16, 64, 128, 1000}) {
      const std::string shape = fmt::format("N={} C={}", rows, channels);
      const Tensor x = random_tensor({rows, channels}, rng, 2.0f), w = random_tensor({channels}, rng);
      const Tensor dy = random_tensor({rows, channels}, rng), dw0 = random_tensor({channels}, rng);
      const Tensor gx = gpu(x), gw = gpu(w);
      Tensor y = poisoned({rows, channels}, kCpuDevice), gy = poisoned({rows, channels}, kGpu);
      Tensor rstd = poisoned({rows}, kCpuDevice), grstd = poisoned({rows}, kGpu);
      ops::rmsnorm_forward(x, w, 1e-5f, y, rstd);
      ops::rmsnorm_forward(gx, gw, 1e-5f, gy, grstd);
      expect_close("rmsnorm y " + shape, gy, y, 1e-5);
      expect_close("rmsnorm rstd " + shape, grstd, rstd, 1e-5);
      Tensor dx = poisoned({rows, channels}, kCpuDevice), gdx = poisoned({rows, channels}, kGpu);
      Tensor dw = host(gpu(dw0)), gdw = gpu(dw0);
      ops::rmsnorm_backward(dy, x, w, rstd, dx, dw);
      ops::rmsnorm_backward(gpu(dy), gx, gw, grstd, gdx, gdw);
      expect_close("rmsnorm dx " + shape, gdx, dx, 1e-5);
      expect_close("rmsnorm dweight (accumulated) " + shape, gdw, dw, 1e-5);
    }
  }
}

TEST_F(CudaOps, RopeMatchesCpu) {
  Rng rng(305);
  for (int64_t seq : {1, 17, 130}) {
    for (int64_t head_dim : {16, 64, 128}) {
      const std::string shape = fmt::format("T={} D={}", seq, head_dim);
      Tensor cos = Tensor::empty({seq, head_dim / 2}, DType::kF32),
             sin = Tensor::empty({seq, head_dim / 2}, DType::kF32);
      for (int64_t t = 0; t < seq; ++t) {
        for (int64_t i = 0; i < head_dim / 2; ++i) {
          const double angle = static_cast<double>(t) * std::pow(10000.0, -2.0 * static_cast<double>(i) / head_dim);
          cos.f32()[t * head_dim / 2 + i] = static_cast<float>(std::cos(angle));
          sin.f32()[t * head_dim / 2 + i] = static_cast<float>(std::sin(angle));
        }
      }
      const Tensor gcos = gpu(cos), gsin = gpu(sin);
      Tensor x = random_tensor({2, seq, 3, head_dim}, rng);
      Tensor gx = gpu(x);
      ops::rope_forward(x, cos, sin);
      ops::rope_forward(gx, gcos, gsin);
      expect_close("rope forward " + shape, gx, x, 1e-5);
      Tensor dx = random_tensor({2, seq, 3, head_dim}, rng);
      Tensor gdx = gpu(dx);
      ops::rope_backward(dx, cos, sin);
      ops::rope_backward(gdx, gcos, gsin);
      expect_close("rope backward " + shape, gdx, dx, 1e-5);
    }
  }
}

TEST_F(CudaOps, SwiGluMatchesCpu) {
  Rng rng(306);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t width : {16, 64, 1000, 1001}) {
      const std::string shape = fmt::format("N={} F={}", rows, width);
      const Tensor gate_up = random_tensor({rows, 2 * width}, rng, 4.0f);
      const Tensor dout = random_tensor({rows, width}, rng);
      const Tensor ggate_up = gpu(gate_up);
      Tensor out = poisoned({rows, width}, kCpuDevice), gout = poisoned({rows, width}, kGpu);
      ops::swiglu_forward(gate_up, out);
      ops::swiglu_forward(ggate_up, gout);
      expect_close("swiglu out " + shape, gout, out, 1e-5);
      Tensor grad = poisoned({rows, 2 * width}, kCpuDevice), ggrad = poisoned({rows, 2 * width}, kGpu);
      ops::swiglu_backward(gate_up, dout, grad);
      ops::swiglu_backward(ggate_up, gpu(dout), ggrad);
      expect_close("swiglu dgate_up " + shape, ggrad, grad, 1e-5);
      Tensor in_place = gpu(gate_up);
      ops::swiglu_backward(in_place, gpu(dout), in_place);
      EXPECT_TRUE(same_bits(in_place, ggrad)) << "swiglu gradient written over its input, " << shape;
    }
  }
}

// ---- attention ------------------------------------------------------------------------------------------------

TEST_F(CudaOps, AttentionMatchesCpu) {
  Rng rng(307);
  const int64_t heads[][2] = {{8, 2}, {4, 4}};
  for (const auto& hh : heads) {
    for (int64_t seq : {1, 17, 130}) {
      for (int64_t d : {16, 64, 128}) {
        const int64_t batch = 2, hq = hh[0], hkv = hh[1];
        const std::string shape = fmt::format("Hq={} Hkv={} T={} D={}", hq, hkv, seq, d);
        const Tensor q = random_tensor({batch, seq, hq, d}, rng), k = random_tensor({batch, seq, hkv, d}, rng);
        const Tensor v = random_tensor({batch, seq, hkv, d}, rng), dout = random_tensor({batch, seq, hq, d}, rng);
        const Tensor gq = gpu(q), gk = gpu(k), gv = gpu(v);
        Tensor out = poisoned(q.shape(), kCpuDevice), gout = poisoned(q.shape(), kGpu);
        Tensor lse = poisoned({batch, hq, seq}, kCpuDevice), glse = poisoned({batch, hq, seq}, kGpu);
        ops::attention_forward(q, k, v, out, lse);
        ops::attention_forward(gq, gk, gv, gout, glse);
        expect_close("attention out " + shape, gout, out, 1e-4);
        expect_close("attention lse " + shape, glse, lse, 1e-4);
        Tensor dq = poisoned(q.shape(), kCpuDevice), gdq = poisoned(q.shape(), kGpu);
        Tensor dk = poisoned(k.shape(), kCpuDevice), gdk = poisoned(k.shape(), kGpu);
        Tensor dv = poisoned(k.shape(), kCpuDevice), gdv = poisoned(k.shape(), kGpu);
        ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv);
        ops::attention_backward(gq, gk, gv, gout, glse, gpu(dout), gdq, gdk, gdv);
        expect_close("attention dq " + shape, gdq, dq, 1e-4, 1.0);
        expect_close("attention dk " + shape, gdk, dk, 1e-4, 1.0);
        expect_close("attention dv " + shape, gdv, dv, 1e-4);
      }
    }
  }
}

// Ring attention's ops (fp32: the native kernels): an unmasked block and a causal one against the same queries,
// merged; each block's backward from the merged out and lse (its contributions to the whole's gradients). The GPU's
// merge starts from the GPU's own block results; each backward reads the CPU's merged out and lse on both devices.
TEST_F(CudaOps, AttentionBlocksMergeAndBlockBackwardMatchCpu) {
  Rng rng(308);
  const int64_t heads[][2] = {{8, 2}, {4, 4}};
  for (const auto& hh : heads) {
    for (int64_t seq : {1, 17, 130}) {
      const int64_t batch = 2, hq = hh[0], hkv = hh[1], d = 64;
      const std::string shape = fmt::format("Hq={} Hkv={} T={} D={}", hq, hkv, seq, d);
      const Shape q_shape{batch, seq, hq, d}, kv_shape{batch, seq, hkv, d}, lse_shape{batch, hq, seq};
      const Tensor q = random_tensor(q_shape, rng), dout = random_tensor(q_shape, rng);
      const Tensor ka = random_tensor(kv_shape, rng), va = random_tensor(kv_shape, rng);
      const Tensor kb = random_tensor(kv_shape, rng), vb = random_tensor(kv_shape, rng);
      Tensor out = poisoned(q_shape, kCpuDevice), lse = poisoned(lse_shape, kCpuDevice);
      Tensor block = poisoned(q_shape, kCpuDevice), block_lse = poisoned(lse_shape, kCpuDevice);
      Tensor gout = poisoned(q_shape, kGpu), glse = poisoned(lse_shape, kGpu);
      Tensor gblock = poisoned(q_shape, kGpu), gblock_lse = poisoned(lse_shape, kGpu);
      ops::attention_block_forward(q, ka, va, AttentionMask::kNone, out, lse);
      ops::attention_block_forward(gpu(q), gpu(ka), gpu(va), AttentionMask::kNone, gout, glse);
      expect_close("unmasked block out " + shape, gout, out, 1e-4);
      expect_close("unmasked block lse " + shape, glse, lse, 1e-4);
      ops::attention_block_forward(q, kb, vb, AttentionMask::kCausal, block, block_lse);
      ops::attention_block_forward(gpu(q), gpu(kb), gpu(vb), AttentionMask::kCausal, gblock, gblock_lse);
      ops::attention_merge(out, lse, block, block_lse);
      ops::attention_merge(gout, glse, gblock, gblock_lse);
      expect_close("merged out " + shape, gout, out, 1e-4);
      expect_close("merged lse " + shape, glse, lse, 1e-4);
      const Tensor merged = gpu(out), merged_lse = gpu(lse), gdout = gpu(dout);
      for (const bool causal : {false, true}) {
        const AttentionMask mask = causal ? AttentionMask::kCausal : AttentionMask::kNone;
        const Tensor& k = causal ? kb : ka;
        const Tensor& v = causal ? vb : va;
        const std::string what = fmt::format("{} block {}", causal ? "causal" : "unmasked", shape);
        Tensor dq = poisoned(q_shape, kCpuDevice), gdq = poisoned(q_shape, kGpu);
        Tensor dk = poisoned(kv_shape, kCpuDevice), gdk = poisoned(kv_shape, kGpu);
        Tensor dv = poisoned(kv_shape, kCpuDevice), gdv = poisoned(kv_shape, kGpu);
        ops::attention_block_backward(q, k, v, mask, out, lse, dout, dq, dk, dv);
        ops::attention_block_backward(gpu(q), gpu(k), gpu(v), mask, merged, merged_lse, gdout, gdq, gdk, gdv);
        expect_close("dq of the " + what, gdq, dq, 1e-4, 1.0);
        expect_close("dk of the " + what, gdk, dk, 1e-4, 1.0);
        expect_close("dv of the " + what, gdv, dv, 1e-4);
      }
    }
  }
}

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

// ---- cross-entropy, adamw, element-wise -----------------------------------------------------------------------

TEST_F(CudaOps, CrossEntropyMatchesCpu) {
  Rng rng(308);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t vocab : {16, 1000, 50257}) {
      const std::string shape = fmt::format("N={} V={}", rows, vocab);
      const Tensor logits = random_tensor({rows, vocab}, rng, 3.0f);
      Tensor targets = random_ids({rows}, vocab, rng);
      for (int64_t r = 3; r < rows; r += 7) targets.i32()[r] = -1;  // ignored rows
      const Tensor glogits = gpu(logits), gtargets = gpu(targets);
      Tensor losses = poisoned({rows}, kCpuDevice), glosses = poisoned({rows}, kGpu);
      Tensor lse = poisoned({rows}, kCpuDevice), glse = poisoned({rows}, kGpu);
      ops::cross_entropy_forward(logits, targets, losses, lse);
      ops::cross_entropy_forward(glogits, gtargets, glosses, glse);
      expect_close("cross_entropy losses " + shape, glosses, losses, 1e-5);
      expect_close("cross_entropy lse " + shape, glse, lse, 1e-5);
      const float scale = 1.0f / static_cast<float>(rows);
      Tensor dlogits = poisoned({rows, vocab}, kCpuDevice), gdlogits = poisoned({rows, vocab}, kGpu);
      ops::cross_entropy_backward(logits, targets, lse, scale, dlogits);
      ops::cross_entropy_backward(glogits, gtargets, glse, scale, gdlogits);
      expect_close("cross_entropy dlogits " + shape, gdlogits, dlogits, 1e-5);
      Tensor in_place = gpu(logits);  // dlogits written over the logits
      ops::cross_entropy_backward(in_place, gtargets, glse, scale, in_place);
      expect_close("cross_entropy dlogits in place " + shape, in_place, dlogits, 1e-5);
      // Forward and backward in one launch, in place, as the loss layer runs them.
      Tensor fused = gpu(logits), flosses = poisoned({rows}, kGpu), flse = poisoned({rows}, kGpu);
      ops::cross_entropy_forward_backward(fused, gtargets, flosses, flse, scale, fused);
      expect_close("cross_entropy fused losses " + shape, flosses, losses, 1e-5);
      expect_close("cross_entropy fused lse " + shape, flse, lse, 1e-5);
      expect_close("cross_entropy fused dlogits " + shape, fused, dlogits, 1e-5);
    }
  }
}

// ---- vocabulary-parallel cross-entropy and embedding (tensor parallelism) -------------------------------------

// One rank's steps (columns [7, 7 + Vl) of Vl + 20) on both devices, at widths that take the 16-byte path and the
// element-wise one; targets held here, held elsewhere and ignored.
TEST_F(CudaOps, VocabParallelCrossEntropyStepsMatchCpu) {
  Rng rng(314);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t cols : {1, 31, 32, 33, 257, 4096}) {
      const std::string shape = fmt::format("N={} Vl={}", rows, cols);
      const VocabShard shard{7, cols + 20};
      const Tensor logits = random_tensor({rows, cols}, rng, 3.0f);
      Tensor targets = random_ids({rows}, shard.total, rng);
      for (int64_t r = 0; r < rows; r += 2) {
        targets.i32()[r] = static_cast<int32_t>(shard.begin + static_cast<int64_t>(rng.below(cols)));
      }
      for (int64_t r = 3; r < rows; r += 7) targets.i32()[r] = -1;
      const Tensor glogits = gpu(logits), gtargets = gpu(targets);
      Tensor max = poisoned({rows}, kCpuDevice), gmax = poisoned({rows}, kGpu);
      ops::row_max(logits, max);
      ops::row_max(glogits, gmax);
      EXPECT_TRUE(same_bits(gmax, max)) << "row_max " << shape;

      // The group's max: at or above this shard's.
      for (int64_t r = 0; r < rows; r += 3) max.f32()[r] += 1.5f;
      const Tensor group_max = max, ggroup_max = gpu(max);
      Tensor sum_exp = poisoned({rows}, kCpuDevice), gsum_exp = poisoned({rows}, kGpu);
      Tensor target_logit = poisoned({rows}, kCpuDevice), gtarget_logit = poisoned({rows}, kGpu);
      ops::cross_entropy_shard_stats(logits, targets, shard, group_max, sum_exp, target_logit);
      ops::cross_entropy_shard_stats(glogits, gtargets, shard, ggroup_max, gsum_exp, gtarget_logit);
      expect_close("shard_stats sum_exp " + shape, gsum_exp, sum_exp, 1e-5);
      EXPECT_TRUE(same_bits(gtarget_logit, target_logit)) << "shard_stats target_logit " << shape;

      Tensor losses = poisoned({rows}, kCpuDevice), glosses = poisoned({rows}, kGpu);
      Tensor lse = poisoned({rows}, kCpuDevice), glse = poisoned({rows}, kGpu);
      ops::cross_entropy_finish(group_max, sum_exp, target_logit, targets, losses, lse);
      ops::cross_entropy_finish(ggroup_max, gpu(sum_exp), gpu(target_logit), gtargets, glosses, glse);
      expect_close("finish losses " + shape, glosses, losses, 1e-5);
      expect_close("finish lse " + shape, glse, lse, 1e-5);

      const float scale = 1.0f / static_cast<float>(rows);
      const Tensor same_lse = gpu(lse);  // both backwards from the same lse
      Tensor dlogits = poisoned({rows, cols}, kCpuDevice), gdlogits = poisoned({rows, cols}, kGpu);
      ops::cross_entropy_backward(logits, targets, lse, scale, dlogits, shard);
      ops::cross_entropy_backward(glogits, gtargets, same_lse, scale, gdlogits, shard);
      expect_close("sharded dlogits " + shape, gdlogits, dlogits, 1e-5, scale);  // Vl=1: exact 0 vs an ulp of p
      Tensor in_place = gpu(logits);
      ops::cross_entropy_backward(in_place, gtargets, same_lse, scale, in_place, shard);
      EXPECT_TRUE(same_bits(in_place, gdlogits)) << "sharded dlogits written over the logits, " << shape;
    }
  }
}

// The steps over 1 to 4 simulated ranks (the reductions done on the host) equal the GPU's unsharded op and the
// same steps on the CPU; 50257 columns split unevenly leave shards that are not 16-byte multiples.
TEST_F(CudaOps, VocabParallelCrossEntropyMatchesUnshardedAndCpu) {
  Rng rng(315);
  for (int64_t rows : {1, 31, 33}) {
    for (int64_t vocab : {16, 1000, 50257}) {
      const Tensor logits = random_tensor({rows, vocab}, rng, 3.0f);
      Tensor targets = random_ids({rows}, vocab, rng);
      for (int64_t r = 3; r < rows; r += 7) targets.i32()[r] = -1;
      const Tensor glogits = gpu(logits), gtargets = gpu(targets);
      const float scale = 1.0f / static_cast<float>(rows);
      Tensor glosses = poisoned({rows}, kGpu), glse = poisoned({rows}, kGpu), gdlogits = poisoned({rows, vocab}, kGpu);
      ops::cross_entropy_forward(glogits, gtargets, glosses, glse);
      ops::cross_entropy_backward(glogits, gtargets, glse, scale, gdlogits);
      for (int ranks = 1; ranks <= 4; ++ranks) {
        const std::string what = fmt::format("N={} V={} ranks={}", rows, vocab, ranks);
        const testing::VocabParallelLoss g = testing::vocab_parallel_cross_entropy(glogits, gtargets, ranks, scale);
        const testing::VocabParallelLoss c = testing::vocab_parallel_cross_entropy(logits, targets, ranks, scale);
        expect_close("losses vs unsharded " + what, g.losses, glosses, 1e-5);
        expect_close("lse vs unsharded " + what, g.lse, glse, 1e-5);
        expect_close("dlogits vs unsharded " + what, g.dlogits, gdlogits, 1e-5);
        expect_close("losses vs cpu " + what, g.losses, c.losses, 1e-5);
        expect_close("lse vs cpu " + what, g.lse, c.lse, 1e-5);
        expect_close("dlogits vs cpu " + what, g.dlogits, c.dlogits, 1e-5);
      }
    }
  }
}

// The table's rows split over 1 to 4 ranks: outputs (summed) and dtable rows equal the CPU's and the GPU's
// unsharded ones bit for bit.
TEST_F(CudaOps, VocabParallelEmbeddingMatchesCpuBitForBit) {
  Rng rng(316);
  for (int64_t vocab : {37, 1000}) {
    for (int64_t n : {1, 31, 33, 130}) {
      const int64_t channels = 64;
      const Tensor ids = random_ids({n}, vocab, rng), table = random_tensor({vocab, channels}, rng);
      const Tensor dout = random_tensor({n, channels}, rng), dtable0 = random_tensor({vocab, channels}, rng);
      const Tensor gids = gpu(ids), gtable = gpu(table), gdout = gpu(dout), gdtable0 = gpu(dtable0);
      Tensor out = poisoned({n, channels}, kGpu), dtable = gpu(dtable0);
      ops::embedding_forward(gids, gtable, out);
      ops::embedding_backward(gids, gdout, dtable);
      for (int ranks = 1; ranks <= 4; ++ranks) {
        const std::string what = fmt::format("V={} N={} ranks={}", vocab, n, ranks);
        const testing::VocabParallelEmbedding g =
            testing::vocab_parallel_embedding(gids, gtable, gdout, gdtable0, ranks);
        const testing::VocabParallelEmbedding c = testing::vocab_parallel_embedding(ids, table, dout, dtable0, ranks);
        EXPECT_TRUE(same_bits(g.out, out)) << "out vs unsharded " << what;
        EXPECT_TRUE(same_bits(g.dtable, dtable)) << "dtable vs unsharded " << what;
        EXPECT_TRUE(same_bits(g.out, c.out)) << "out vs cpu " << what;
        EXPECT_TRUE(same_bits(g.dtable, c.dtable)) << "dtable vs cpu " << what;
      }
    }
  }
}

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

TEST_F(CudaOps, ElementwiseAndSumSquaresMatchCpu) {
  Rng rng(310);
  for (int64_t n : {1, 31, 33, 16384, 16385, 1000003}) {
    Tensor y = random_tensor({n}, rng);
    const Tensor x = random_tensor({n}, rng);
    Tensor gy = gpu(y);
    ops::add_inplace(y, x);
    ops::add_inplace(gy, gpu(x));
    expect_close(fmt::format("add_inplace n={}", n), gy, y, 1e-5);
    ops::scale_inplace(y, -0.37f);
    ops::scale_inplace(gy, -0.37f);
    expect_close(fmt::format("scale_inplace n={}", n), gy, y, 1e-5);
    const double want = ops::sum_squares(y);
    const double got = ops::sum_squares(gy);
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
