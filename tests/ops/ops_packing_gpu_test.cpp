// Packed documents on the CUDA backend: RoPE at per-token positions and attention confined to segments, fp32
// and bf16, through src/ops against the CPU reference backend on the same inputs (bf16: the inputs rounded to
// bf16 first), at awkward sizes (T = 1, 17, 130, 1000; head sizes 16, 64, 128; GQA 8/2, 32/8 and plain heads)
// and document layouts with one-token and long documents. Every GPU output is poisoned with NaN bits first.
// bf16 attention with segments must not reach cuDNN (which would ignore them): the comparison would fail.
//
// Tolerances (relative L2 error of a whole tensor), as in ops_cuda_gpu_test and ops_bf16_gpu_test:
//  - fp32: 1e-5 for RoPE (same formula), 1e-4 for attention (exp and sums in another order).
//  - bf16: 5e-3 for RoPE (one rounding of an fp32 result); 1e-2 for attention (the native kernels compute in
//    fp32 from bf16 inputs but round out before the backward's Δ = dout · out reads it).
// Also: positions and segment starts outside their range are reported at the next wait.
//
// Without a usable CUDA device (or in a build without the CUDA backend) every test is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/bf16.h"
#include "ops/ops.h"
#include "support/test_support.h"
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

class PackingGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    PRIMUS_SKIP_WITHOUT_GPU();
#if PRIMUS_WITH_CUDA
    start_cuda_backend(0);
#endif
  }
};

// Values representable in `dtype` (bf16: rounded), still f32 on the host: the CPU reference's input.
Tensor representable(Tensor t, DType dtype) {
  if (dtype == DType::kF32) return t;
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
  return t;
}

// A GPU tensor of `dtype` holding the host f32 values (exact when they are representable).
Tensor to_gpu(const Tensor& host_f32, DType dtype) {
  if (dtype == DType::kF32) return ops::to_device(host_f32, kGpu);
  Tensor h = Tensor::empty(host_f32.shape(), dtype);
  ops::cast(h, host_f32);
  return ops::to_device(h, kGpu);
}

// Every byte 0xFF: NaN in both f32 and bf16.
Tensor poisoned(const Shape& shape, DType dtype, Device device) {
  Tensor h = Tensor::empty(shape, dtype);
  std::memset(h.data(), 0xFF, h.nbytes());
  return device.is_cpu() ? h : ops::to_device(h, device);
}

// Documents of random length (mean about mean_length tokens; one-token documents occur) packed into each row;
// row 0 is one document throughout. [B, T] i32: the first position of each token's document.
Tensor random_segments(int64_t batch, int64_t seq, int64_t mean_length, Rng& rng) {
  Tensor starts = Tensor::empty({batch, seq}, DType::kI32);
  for (int64_t b = 0; b < batch; ++b) {
    int32_t start = 0;
    for (int64_t t = 0; t < seq; ++t) {
      if (b > 0 && t > 0 && rng.below(static_cast<uint64_t>(mean_length)) == 0) start = static_cast<int32_t>(t);
      starts.i32()[b * seq + t] = start;
    }
  }
  return starts;
}

// Positions restarting at 0 at each document's start (reset_position_ids).
Tensor positions_of(const Tensor& starts) {
  Tensor positions = Tensor::empty(starts.shape(), DType::kI32);
  const int64_t seq = starts.dim(1);
  for (int64_t i = 0; i < starts.numel(); ++i) positions.i32()[i] = static_cast<int32_t>(i % seq - starts.i32()[i]);
  return positions;
}

const char* name_of(DType dtype) { return dtype == DType::kF32 ? "f32" : "bf16"; }

// ---- rope at per-token positions ----------------------------------------------------------------------------------

void check_rope(DType dtype, int64_t seq, int64_t head_dim, const Tensor& positions, int64_t rows, Rng& rng,
                const std::string& layout) {
  const double tol = dtype == DType::kF32 ? 1e-5 : 5e-3;
  const int64_t half = head_dim / 2;
  Tensor cos = Tensor::empty({rows, half}, DType::kF32), sin = Tensor::empty({rows, half}, DType::kF32);
  for (int64_t p = 0; p < rows; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / head_dim);
      cos.f32()[p * half + i] = static_cast<float>(std::cos(angle));
      sin.f32()[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  const Tensor gcos = ops::to_device(cos, kGpu), gsin = ops::to_device(sin, kGpu);
  const Tensor gpositions = ops::to_device(positions, kGpu);
  for (const bool forward : {true, false}) {
    const std::string what = fmt::format("rope {} {} T={} D={} rows={} {}", forward ? "forward" : "backward",
                                         name_of(dtype), seq, head_dim, rows, layout);
    Tensor x = representable(random_tensor({positions.dim(0), seq, 3, head_dim}, rng), dtype);
    Tensor gx = to_gpu(x, dtype);
    if (forward) {
      ops::rope_forward(x, cos, sin, positions);
      ops::rope_forward(gx, gcos, gsin, gpositions);
    } else {
      ops::rope_backward(x, cos, sin, positions);
      ops::rope_backward(gx, gcos, gsin, gpositions);
    }
    expect_close(what, gx, x, tol);
  }
}

TEST_F(PackingGpu, RopeAtPerTokenPositionsMatchesCpu) {
  Rng rng(601);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t seq : {1, 17, 130}) {
      for (int64_t head_dim : {16, 64, 128}) {
        check_rope(dtype, seq, head_dim, positions_of(random_segments(3, seq, 8, rng)), seq, rng, "restarting");
        // Any positions into a longer table (the kernel must read the row a token names, not row t).
        check_rope(dtype, seq, head_dim, random_ids({2, seq}, seq + 40, rng), seq + 40, rng, "random");
      }
    }
  }
}

// ---- attention confined to segments -------------------------------------------------------------------------------

struct AttentionCase {
  int64_t batch, seq, q_heads, kv_heads, head_dim, mean_length;
};

void check_attention(DType dtype, const AttentionCase& c, Rng& rng) {
  const double tol = dtype == DType::kF32 ? 1e-4 : 1e-2;
  const Shape q_shape{c.batch, c.seq, c.q_heads, c.head_dim}, kv_shape{c.batch, c.seq, c.kv_heads, c.head_dim};
  const Shape lse_shape{c.batch, c.q_heads, c.seq};
  const std::string shape = fmt::format("{} B={} T={} Hq={} Hkv={} D={} docs~{}", name_of(dtype), c.batch, c.seq,
                                        c.q_heads, c.kv_heads, c.head_dim, c.mean_length);
  const Tensor starts = random_segments(c.batch, c.seq, c.mean_length, rng);
  const Tensor gstarts = ops::to_device(starts, kGpu);
  const Tensor q = representable(random_tensor(q_shape, rng), dtype);
  const Tensor k = representable(random_tensor(kv_shape, rng), dtype);
  const Tensor v = representable(random_tensor(kv_shape, rng), dtype);
  const Tensor dout = representable(random_tensor(q_shape, rng), dtype);
  const Tensor gq = to_gpu(q, dtype), gk = to_gpu(k, dtype), gv = to_gpu(v, dtype), gdout = to_gpu(dout, dtype);
  Tensor out = poisoned(q_shape, DType::kF32, kCpuDevice), lse = poisoned(lse_shape, DType::kF32, kCpuDevice);
  Tensor gout = poisoned(q_shape, dtype, kGpu), glse = poisoned(lse_shape, DType::kF32, kGpu);
  ops::attention_forward(q, k, v, out, lse, starts);
  ops::attention_forward(gq, gk, gv, gout, glse, gstarts);
  expect_close("attention out " + shape, gout, out, tol);
  expect_close("attention lse " + shape, glse, lse, 1e-4);
  Tensor dq = poisoned(q_shape, DType::kF32, kCpuDevice), dk = poisoned(kv_shape, DType::kF32, kCpuDevice);
  Tensor dv = poisoned(kv_shape, DType::kF32, kCpuDevice);
  Tensor gdq = poisoned(q_shape, dtype, kGpu), gdk = poisoned(kv_shape, dtype, kGpu);
  Tensor gdv = poisoned(kv_shape, dtype, kGpu);
  ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, starts);
  ops::attention_backward(gq, gk, gv, gout, glse, gdout, gdq, gdk, gdv, gstarts);
  // dq and dk are zero in exact arithmetic for one-token documents (p = 1): compare absolutely where they are
  // a large share (the floor of ops_cuda_gpu_test), relatively elsewhere.
  const double floor = c.seq == 1 || c.mean_length <= 2 ? 1.0 : 1e-30;
  expect_close("attention dq " + shape, gdq, dq, tol, floor);
  expect_close("attention dk " + shape, gdk, dk, tol, floor);
  expect_close("attention dv " + shape, gdv, dv, tol);
}

TEST_F(PackingGpu, AttentionWithSegmentsMatchesCpu) {
  Rng rng(602);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t seq : {1, 17, 130}) {
      for (int64_t d : {16, 64, 128}) {
        check_attention(dtype, {3, seq, 8, 2, d, 6}, rng);
        check_attention(dtype, {2, seq, 4, 4, d, 40}, rng);
      }
    }
    check_attention(dtype, {3, 33, 4, 2, 64, 2}, rng);        // mostly one- and two-token documents
    check_attention(dtype, {2, 1000, 32, 8, 128, 300}, rng);  // the llama3.2-1B head layout, a few documents
  }
}

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
