// The CPU reference backend: plain fp32 kernels that define the numerics of every op. A device kernel is
// accepted only by comparison with these. One .cpp per op family (gemm, embedding, rmsnorm, rope, attention,
// swiglu, cross_entropy, adamw, elementwise, memory, moe_router, moe_permute, fp8, fp8_gemm).
//
// Contract: arguments arrive validated by src/ops (dtypes, shapes, one device); the kernels only check values
// that need reading the data (token ids, targets).
//
// Numerical choices, shared by every kernel here:
//  - Storage and element-wise arithmetic are fp32.
//  - Contractions (GEMM via OpenBLAS; attention's q·k, p·v, dout·v and their gradients) accumulate in fp32,
//    each output summed over the contracted index in one fixed order.
//  - The fp8 GEMM (fp8_gemm.cpp) dequantises exactly and accumulates in double: the exact value the device's fp32
//    accumulation approximates, rounded once to C's dtype.
//  - Normalising reductions accumulate in double: RMSNorm's mean square and Σ dy·w·x̂, softmax denominators
//    (attention, cross-entropy), attention's Σ dout·out, sum_squares.
//  - Gradients summed over rows: RMSNorm's dweight in double per column; embedding's dtable in fp32, adding
//    the rows of a repeated id in token order.
//  - Work is split with OpenMP over independent rows / heads / column blocks with a static schedule, and no
//    output element is ever summed by two threads, so results are bitwise identical run to run. Kernels
//    other than gemm also give the same bits for any thread count; OpenBLAS gemm may not.
#pragma once

#include "backend/backend.h"

namespace primus {

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Device device() const override { return kCpuDevice; }

  void gemm(const GemmArgs& args) override;
  void embedding_forward(const EmbeddingArgs& args) override;
  void embedding_backward(const EmbeddingArgs& args) override;
  void rmsnorm_forward(const RmsNormArgs& args) override;
  void rmsnorm_backward(const RmsNormArgs& args) override;
  void rope_forward(const RopeArgs& args) override;
  void rope_backward(const RopeArgs& args) override;
  void attention_forward(const AttentionArgs& args) override;
  void attention_backward(const AttentionArgs& args) override;
  void attention_merge(const AttentionMergeArgs& args) override;
  void head_concat(const HeadConcatArgs& args) override;
  void head_concat_backward(const HeadConcatArgs& args) override;
  void swiglu_forward(const SwiGluArgs& args) override;
  void swiglu_backward(const SwiGluArgs& args) override;
  void cross_entropy_forward(const CrossEntropyArgs& args) override;
  void cross_entropy_backward(const CrossEntropyArgs& args) override;
  void cross_entropy_shard_stats(const CrossEntropyArgs& args) override;
  void cross_entropy_finish(const CrossEntropyArgs& args) override;
  void row_max(const Tensor& x, Tensor& max) override;
  void adamw_step(const AdamWArgs& args) override;
  void fp8_amax(const Fp8AmaxArgs& args) override;
  void fp8_scale(const Fp8ScaleArgs& args) override;
  void fp8_quantize(const Fp8QuantizeArgs& args) override;
  void fp8_dequantize(const Fp8DequantizeArgs& args) override;
  void fp8_gemm(const Fp8GemmArgs& args) override;
  void moe_router_forward(const MoeRouterArgs& args) override;
  void moe_router_backward(const MoeRouterArgs& args) override;
  void moe_sort(const MoeSortArgs& args) override;
  void moe_capacity(const MoeCapacityArgs& args) override;
  void moe_pad_rows(const MoePadArgs& args) override;
  void moe_unpad_rows(const MoePadArgs& args) override;
  void moe_permute(const MoePermuteArgs& args) override;
  void moe_permute_backward(const MoePermuteArgs& args) override;
  void moe_unpermute(const MoePermuteArgs& args) override;
  void moe_unpermute_backward(const MoePermuteArgs& args) override;
  void grouped_linear_forward(const GroupedLinearArgs& args) override;
  void grouped_linear_backward(const GroupedLinearArgs& args) override;
  void moe_aux_loss(const MoeAuxLossArgs& args) override;
  void moe_z_loss(const MoeAuxLossArgs& args) override;
  void add_inplace(Tensor& y, const Tensor& x) override;
  void scale_inplace(Tensor& x, float s) override;
  double sum_squares(const Tensor& x) override;
  void sum_into(Tensor& acc, const Tensor& x) override;
  void copy(Tensor& dst, const Tensor& src) override;
  void cast(Tensor& dst, const Tensor& src) override;
  void fill(Tensor& x, float value) override;
  void fill_normal(Tensor& x, uint64_t seed, double std, StreamIndex index) override;
  void zero(Tensor& x) override;
  void synchronize() override {}
};

// The process-wide CPU backend (a function-local static). src/ops registers it for DeviceType::kCpu.
Backend& cpu_backend();

}  // namespace primus
