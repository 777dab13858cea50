// cuDNN fused attention (backend/cuda/cudnn_attention.h) against the CPU fp32 reference on fresh random inputs.
//
// Inputs are random fp32 rounded to bf16; the CPU reference runs on exactly those rounded values, so the
// differences are cuDNN's own bf16 roundings (P and dS before their matmuls, the bf16 outputs) and its fp32
// summation order. Shapes cover T in {64, 127, 704, 1000, 4096} (704 ≡ 64 mod 128 and the other non-multiples
// of 128 take the padded backward graph), D in {64, 128}, Hq/Hkv in {8/8, 32/8, 4/1}, B in {1, 2}.
// Every GPU output is poisoned with NaN bytes first and must come back finite.
//
// Tolerances (relative L2 error of a whole tensor, ||gpu − cpu|| / ||cpu||), with a margin over the errors
// measured on the H200 with cuDNN 9.14 (docs/perf/attention.md):
//  - out, dq, dk, dv: 1e-2 (measured 1.8e-3 – 3.2e-3). bf16 keeps 8 significant bits (relative rounding
//    ≤ 2^-9 ≈ 2e-3 per element); P is rounded before P·V and the outputs once more, and dS is rounded before
//    dK and dQ, so the errors are a few bf16 roundings, not accumulated ones.
//  - lse: max |gpu − cpu| ≤ 1e-4 (measured ≤ 1e-6): fp32 scores from the same bf16 inputs; only the
//    summation order and exp/log differ.
// A timing test reports TFLOP/s for two training shapes (printed, not asserted).
//
// Without a usable CUDA device (or in a build without the CUDA backend) every test is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "ops/ops.h"
#include "support/test_support.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/gpu_runtime.h"
#endif

namespace primus {
namespace {

#if PRIMUS_WITH_CUDA

using primus::testing::random_tensor;

// A device buffer for the test's lifetime.
class DeviceArray {
 public:
  explicit DeviceArray(size_t bytes) : bytes_(bytes) { PRIMUS_CUDA_CHECK(gpuMalloc(&ptr_, bytes)); }
  ~DeviceArray() { (void)gpuFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  // NaN in both bf16 (0xFFFF) and fp32 (0xFFFFFFFF).
  void poison() const { PRIMUS_CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes_)); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Rounds t to bf16 in place and returns the bf16 bits.
std::vector<uint16_t> round_to_bf16(Tensor& t) {
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
  float* p = t.f32();
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = f32_to_bf16(p[i]);
    p[i] = bf16_to_f32(bits[i]);
  }
  return bits;
}

std::unique_ptr<DeviceArray> upload(const std::vector<uint16_t>& bits) {
  auto d = std::make_unique<DeviceArray>(bits.size() * sizeof(uint16_t));
  PRIMUS_CUDA_CHECK(cudaMemcpy(d->get(), bits.data(), d->bytes(), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> download_bf16(const DeviceArray& d) {
  std::vector<uint16_t> bits(d.bytes() / sizeof(uint16_t));
  PRIMUS_CUDA_CHECK(cudaMemcpy(bits.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bits[i]);
  return out;
}

std::vector<float> download_f32(const DeviceArray& d) {
  std::vector<float> out(d.bytes() / sizeof(float));
  PRIMUS_CUDA_CHECK(cudaMemcpy(out.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost));
  return out;
}

// Relative L2 error of got against want; every element of got must be finite.
double relative_l2(const std::string& what, const std::vector<float>& got, const Tensor& want) {
  EXPECT_EQ(static_cast<int64_t>(got.size()), want.numel()) << what;
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i];
      return INFINITY;
    }
    const double w = want.f32()[i];
    diff += (got[i] - w) * (got[i] - w);
    ref += w * w;
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
}

double max_abs(const std::string& what, const std::vector<float>& got, const Tensor& want) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i];
      return INFINITY;
    }
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want.f32()[i]));
  }
  return worst;
}

class CudnnAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = testing::why_no_gpu();
    if (!why.empty()) GTEST_SKIP() << why;
    PRIMUS_CUDA_CHECK(gpuSetDevice(0));
    PRIMUS_CUDA_CHECK(gpuStreamCreateWithFlags(&stream_, gpuStreamNonBlocking));
    attention_ = std::make_unique<CudnnAttention>(stream_);
  }
  void TearDown() override {
    attention_.reset();
    if (stream_ != nullptr) {
      (void)gpuStreamSynchronize(stream_);
      (void)cudaStreamDestroy(stream_);
    }
  }
  void sync() { PRIMUS_CUDA_CHECK(gpuStreamSynchronize(stream_)); }

  gpuStream_t stream_ = nullptr;
  std::unique_ptr<CudnnAttention> attention_;
};

constexpr double kOutTol = 1e-2;
constexpr double kGradTol = 1e-2;
constexpr double kLseTol = 1e-4;

// Forward and backward of one shape on both devices; `backward` false checks the forward only.
void check_shape(CudnnAttention& attention, gpuStream_t stream, const AttentionShape& s, uint64_t seed,
                 bool backward = true) {
  Rng rng(seed);
  const Shape q_shape{s.batch, s.seq, s.heads, s.head_dim}, kv_shape{s.batch, s.seq, s.kv_heads, s.head_dim};
  Tensor q = random_tensor(q_shape, rng), k = random_tensor(kv_shape, rng), v = random_tensor(kv_shape, rng);
  Tensor dout = random_tensor(q_shape, rng);
  const auto q_bits = round_to_bf16(q), k_bits = round_to_bf16(k), v_bits = round_to_bf16(v);
  const auto dout_bits = round_to_bf16(dout);

  Tensor out = Tensor::empty(q_shape, DType::kF32), lse = Tensor::empty({s.batch, s.heads, s.seq}, DType::kF32);
  ops::attention_forward(q, k, v, out, lse);

  const auto q_dev = upload(q_bits), k_dev = upload(k_bits), v_dev = upload(v_bits);
  DeviceArray out_dev(q_bits.size() * 2), lse_dev(static_cast<size_t>(lse.numel()) * 4);
  out_dev.poison();
  lse_dev.poison();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  attention.forward(s, q_dev->get(), k_dev->get(), v_dev->get(), out_dev.get(), static_cast<float*>(lse_dev.get()),
                    scale);
  PRIMUS_CUDA_CHECK(gpuStreamSynchronize(stream));
  const std::string name = fmt::format("B={} T={} Hq={} Hkv={} D={}", s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
  const double out_err = relative_l2(name + " out", download_bf16(out_dev), out);
  const double lse_err = max_abs(name + " lse", download_f32(lse_dev), lse);
  EXPECT_LE(out_err, kOutTol) << name;
  EXPECT_LE(lse_err, kLseTol) << name;
  if (!backward) {
    std::printf("  %-34s out %.2e  lse %.2e\n", name.c_str(), out_err, lse_err);
    return;
  }

  Tensor dq = Tensor::empty(q_shape, DType::kF32), dk = Tensor::empty(kv_shape, DType::kF32),
         dv = Tensor::empty(kv_shape, DType::kF32);
  ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv);
  const auto dout_dev = upload(dout_bits);
  DeviceArray dq_out(q_bits.size() * 2), dk_out(k_bits.size() * 2), dv_out(v_bits.size() * 2);
  dq_out.poison();
  dk_out.poison();
  dv_out.poison();
  attention.backward(s, q_dev->get(), k_dev->get(), v_dev->get(), out_dev.get(), dout_dev->get(),
                     static_cast<const float*>(lse_dev.get()), dq_out.get(), dk_out.get(), dv_out.get(), scale);
  PRIMUS_CUDA_CHECK(gpuStreamSynchronize(stream));
  const double dq_err = relative_l2(name + " dq", download_bf16(dq_out), dq);
  const double dk_err = relative_l2(name + " dk", download_bf16(dk_out), dk);
  const double dv_err = relative_l2(name + " dv", download_bf16(dv_out), dv);
  EXPECT_LE(dq_err, kGradTol) << name;
  EXPECT_LE(dk_err, kGradTol) << name;
  EXPECT_LE(dv_err, kGradTol) << name;
  std::printf("  %-34s out %.2e  lse %.2e  dq %.2e  dk %.2e  dv %.2e\n", name.c_str(), out_err, lse_err, dq_err, dk_err,
              dv_err);
}

TEST_F(CudnnAttentionTest, MatchesCpuReference) {
  const AttentionShape shapes[] = {
      {2, 64, 8, 8, 64},    {1, 64, 4, 1, 128},   {2, 127, 32, 8, 64}, {1, 127, 8, 8, 128}, {1, 704, 4, 1, 64},
      {2, 704, 32, 8, 128}, {1, 1000, 8, 8, 128}, {2, 1000, 4, 1, 64}, {1, 4096, 8, 8, 64},
  };
  uint64_t seed = 700;
  for (const AttentionShape& s : shapes) check_shape(*attention_, stream_, s, seed++);
  EXPECT_EQ(attention_->plan_count(), 2 * static_cast<int64_t>(std::size(shapes)));
}

TEST_F(CudnnAttentionTest, SingleTokenForward) { check_shape(*attention_, stream_, {2, 1, 4, 1, 64}, 801, false); }

TEST_F(CudnnAttentionTest, PlansAreCachedAndForwardRepeatsBitwise) {
  const AttentionShape s{1, 256, 8, 2, 64};
  Rng rng(802);
  Tensor q = random_tensor({1, 256, 8, 64}, rng), kv = random_tensor({1, 256, 2, 64}, rng);
  const auto q_dev = upload(round_to_bf16(q)), kv_dev = upload(round_to_bf16(kv));
  DeviceArray out1(q_dev->bytes()), out2(q_dev->bytes()), lse(8 * 256 * 4);
  out1.poison();
  out2.poison();
  const float scale = 0.125f;
  attention_->forward(s, q_dev->get(), kv_dev->get(), kv_dev->get(), out1.get(), static_cast<float*>(lse.get()), scale);
  attention_->forward(s, q_dev->get(), kv_dev->get(), kv_dev->get(), out2.get(), static_cast<float*>(lse.get()), scale);
  sync();
  EXPECT_EQ(attention_->plan_count(), 1);
  const auto a = download_bf16(out1), b = download_bf16(out2);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i])) << i;
    ASSERT_EQ(a[i], b[i]) << i;
  }
}

// deterministic_mode's backward: as exact as the default against the CPU reference, and the same bits every call
// (the default's dQ, summed with atomics, may differ in its last bits from call to call).
TEST_F(CudnnAttentionTest, DeterministicBackwardMatchesTheReferenceAndRepeatsBitwise) {
  CudnnAttention deterministic(stream_, nullptr, true);
  const AttentionShape shapes[] = {{2, 127, 32, 8, 64}, {1, 1000, 8, 8, 128}, {2, 2048, 16, 4, 128}};
  uint64_t seed = 900;
  for (const AttentionShape& s : shapes) check_shape(deterministic, stream_, s, seed++);

  const AttentionShape s{2, 2048, 16, 4, 128};
  Rng rng(910);
  Tensor q = random_tensor({2, 2048, 16, 128}, rng), kv = random_tensor({2, 2048, 4, 128}, rng);
  Tensor dout = random_tensor({2, 2048, 16, 128}, rng);
  const auto q_dev = upload(round_to_bf16(q)), kv_dev = upload(round_to_bf16(kv)), dout_dev = upload(round_to_bf16(dout));
  DeviceArray out(q_dev->bytes()), lse(2 * 16 * 2048 * 4), dk(kv_dev->bytes()), dv(kv_dev->bytes());
  const float scale = 1.0f / std::sqrt(128.0f);
  deterministic.forward(s, q_dev->get(), kv_dev->get(), kv_dev->get(), out.get(), static_cast<float*>(lse.get()), scale);
  std::vector<std::vector<float>> dqs;
  for (int call = 0; call < 3; ++call) {
    DeviceArray dq(q_dev->bytes());
    dq.poison();
    deterministic.backward(s, q_dev->get(), kv_dev->get(), kv_dev->get(), out.get(), dout_dev->get(),
                           static_cast<const float*>(lse.get()), dq.get(), dk.get(), dv.get(), scale);
    sync();
    dqs.push_back(download_bf16(dq));
  }
  for (int call = 1; call < 3; ++call) {
    ASSERT_EQ(dqs[0].size(), dqs[call].size());
    size_t differ = 0;
    for (size_t i = 0; i < dqs[0].size(); ++i) differ += dqs[0][i] != dqs[call][i] ? 1 : 0;
    EXPECT_EQ(differ, 0u) << "call " << call << ": dQ elements that differ from the first call's";
  }
}

TEST_F(CudnnAttentionTest, RejectsUnsupportedArguments) {
  DeviceArray buf(1 << 20);
  void* p = buf.get();
  float* f = static_cast<float*>(p);
  EXPECT_THROW(attention_->forward({1, 64, 6, 4, 64}, p, p, p, p, f, 1.0f), UsageError);              // Hq % Hkv != 0
  EXPECT_THROW(attention_->forward({1, 64, 4, 4, 100}, p, p, p, p, f, 1.0f), UsageError);             // D % 8 != 0
  EXPECT_THROW(attention_->forward({1, 64, 4, 4, 264}, p, p, p, p, f, 1.0f), UsageError);             // D > 256
  EXPECT_THROW(attention_->backward({1, 1, 4, 4, 64}, p, p, p, p, p, f, p, p, p, 1.0f), UsageError);  // T = 1
  void* misaligned = static_cast<char*>(p) + 2;
  EXPECT_THROW(attention_->forward({1, 64, 4, 4, 64}, misaligned, p, p, p, f, 1.0f), RuntimeError);
  EXPECT_EQ(attention_->plan_count(), 0);
}

// Not a correctness test: TFLOP/s of the two training shapes of GPU.md's attention table, causal work halved
// (forward 2·2·B·Hq·T²·D / 2, backward 2.5× that), median of 20 timed runs after 3 warm-up runs.
TEST_F(CudnnAttentionTest, ReportsThroughput) {
  const AttentionShape shapes[] = {{4, 4096, 32, 8, 64}, {2, 4096, 16, 8, 128}};
  for (const AttentionShape& s : shapes) {
    const size_t q_elems = static_cast<size_t>(s.batch * s.seq * s.heads * s.head_dim);
    const size_t kv_elems = static_cast<size_t>(s.batch * s.seq * s.kv_heads * s.head_dim);
    Rng rng(900);
    auto random_bits = [&](size_t n) {
      std::vector<uint16_t> bits(n);
      for (auto& b : bits) b = f32_to_bf16(static_cast<float>(rng.uniform() * 3.4 - 1.7));
      return bits;
    };
    const auto q = upload(random_bits(q_elems)), k = upload(random_bits(kv_elems)), v = upload(random_bits(kv_elems));
    const auto dout = upload(random_bits(q_elems));
    DeviceArray out(q_elems * 2), lse(static_cast<size_t>(s.batch * s.heads * s.seq) * 4), dq(q_elems * 2),
        dk(kv_elems * 2), dv(kv_elems * 2);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    auto fwd = [&] {
      attention_->forward(s, q->get(), k->get(), v->get(), out.get(), static_cast<float*>(lse.get()), scale);
    };
    auto bwd = [&] {
      attention_->backward(s, q->get(), k->get(), v->get(), out.get(), dout->get(), static_cast<float*>(lse.get()),
                           dq.get(), dk.get(), dv.get(), scale);
    };
    auto median_ms = [&](auto&& body) {
      for (int i = 0; i < 3; ++i) body();
      std::vector<float> times;
      gpuEvent_t start, stop;
      PRIMUS_CUDA_CHECK(gpuEventCreate(&start));
      PRIMUS_CUDA_CHECK(gpuEventCreate(&stop));
      for (int i = 0; i < 20; ++i) {
        PRIMUS_CUDA_CHECK(gpuEventRecord(start, stream_));
        body();
        PRIMUS_CUDA_CHECK(gpuEventRecord(stop, stream_));
        PRIMUS_CUDA_CHECK(gpuEventSynchronize(stop));
        float ms = 0.0f;
        PRIMUS_CUDA_CHECK(gpuEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
      }
      PRIMUS_CUDA_CHECK(gpuEventDestroy(start));
      PRIMUS_CUDA_CHECK(gpuEventDestroy(stop));
      std::sort(times.begin(), times.end());
      return static_cast<double>(times[times.size() / 2]);
    };
    const double fwd_ms = median_ms(fwd);
    const double bwd_ms = median_ms(bwd);
    const double fwd_flop = 4.0 * s.batch * s.heads * static_cast<double>(s.seq) * s.seq * s.head_dim / 2.0;
    const double bwd_flop = 2.5 * fwd_flop;
    std::printf(
        "  TIMING B=%ld Hq=%ld Hkv=%ld T=%ld D=%ld: fwd %.3f ms %.0f TFLOP/s, bwd %.3f ms %.0f TFLOP/s, "
        "fwd+bwd %.0f TFLOP/s\n",
        static_cast<long>(s.batch), static_cast<long>(s.heads), static_cast<long>(s.kv_heads), static_cast<long>(s.seq),
        static_cast<long>(s.head_dim), fwd_ms, fwd_flop / fwd_ms / 1e9, bwd_ms, bwd_flop / bwd_ms / 1e9,
        (fwd_flop + bwd_flop) / (fwd_ms + bwd_ms) / 1e9);
    const auto sample = download_bf16(dq);
    EXPECT_TRUE(std::all_of(sample.begin(), sample.end(), [](float x) { return std::isfinite(x); }));
  }
}

#else

TEST(CudnnAttentionTest, Skipped) { GTEST_SKIP() << testing::why_no_gpu(); }

#endif

}  // namespace
}  // namespace primus
