// `primus-cli benchmark gemm` and `benchmark attention`: the engine's own GEMMs and attention at the shapes one rank
// of a config runs, timed on a device: the measured rates a performance projection starts from (issue 17).
//
// GEMMs: each of models/gemm_shapes.h (the linear modules of the config's dense and MoE layers, the experts' grouped
// GEMMs at an even routing over this rank's experts, and the output layer over one logits chunk, as the loss runs it)
// in its three passes with M, N, K as the GEMM sees them:
//   forward      y  = x · wᵀ      M = tokens, N = out, K = in
//   data grad    dx = dy · w      M = tokens, N = in,  K = out
//   weight grad  dw += dyᵀ · x    M = out,    N = in,  K = tokens
// tokens = micro_batch_size × seq_length / context_parallel_size; tensor parallelism divides the column-parallel
// outputs (q, k, v, gate_up, the vocabulary) and the row-parallel inputs (o_proj, down_proj). FLOPs 2·M·N·K.
// Attention: forward and backward of the causal GQA kernel over [micro_batch_size, seq / cp, Hq / tp, D]; FLOPs
// counted with the causal half: forward 2·B·T²·Hq·D, backward 2.5 × that (flash attention's convention).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "core/tensor.h"

namespace primus {

struct KernelTiming {
  std::string op;    // "q_proj", "experts.gate_up", "attention"
  std::string pass;  // "forward", "data_grad", "weight_grad", "backward"
  int64_t m = 0, n = 0, k = 0;  // a GEMM's (summed over the experts of a grouped one); 0 for attention
  std::string shape;            // "[16384, 2048] x [3072, 2048]^T", for the table
  std::string dtype;            // "bf16", "f32"
  double flops = 0.0;
  double ms = 0.0;  // median over the timed iterations
  double tflops() const { return ms > 0.0 ? flops / (ms * 1e9) : 0.0; }
};

struct KernelBenchmarkOptions {
  int warmup = 3;
  int iters = 10;
};

// The dense peak of `device` in `dtype` (TFLOP/s) when known: H100 and H200 989 in bf16 (the datasheet's dense
// figure, the MFU denominator everywhere in this project); none on the CPU or an unknown GPU.
std::optional<double> dense_peak_tflops(Device device, DType dtype);

// The dense fp8 peak (TFLOP/s) when known: H100 and H200 1979 (the datasheet's dense figure, twice bf16's).
std::optional<double> fp8_dense_peak_tflops(Device device);

// Which fp8 GEMMs `benchmark gemm --fp8` times (docs/fp8.md): tensorwise (current or delayed scaling: one scale per
// tensor; e4m3 operands forward, e5m2 gradients as the hybrid format) or blockwise (1x128 activation and gradient
// tiles with 128x128 weight blocks, e4m3).
enum class Fp8GemmRecipe { kTensorwise, kBlockwise };

// Every GEMM of one rank of `args` under `t` (see the top of this file), in dtype (bf16 or f32) on `device`, with
// fresh random inputs. `args.vocab_size` must be resolved.
std::vector<KernelTiming> benchmark_gemms(const ModelArgs& args, const TrainingArgs& t, Device device, DType dtype,
                                          const KernelBenchmarkOptions& options);
// The fp8 GEMMs of the same linear modules (ops::fp8_gemm through cuBLASLt) in the three passes as the fp8 layers
// run them: forward y = x·Wᵀ (bf16 out), data gradient dx = dy·W from Wᵀ's codes (bf16 out), weight gradient
// dW += dyᵀ·x from the transposed codes (f32, accumulating). Only the GEMM is timed (the operands are quantised once
// before); the experts' grouped GEMMs and the output layer, which stay bf16, are left out. Needs a GPU.
// The refusal of --fp8 on `device` (the CPU): exit 2 with this message.
std::string fp8_gemm_device_error(Device device);
std::vector<KernelTiming> benchmark_fp8_gemms(const ModelArgs& args, const TrainingArgs& t, Device device,
                                              Fp8GemmRecipe recipe, const KernelBenchmarkOptions& options);
// The attention kernel's forward and backward at the config's shapes.
std::vector<KernelTiming> benchmark_attention(const ModelArgs& args, const TrainingArgs& t, Device device,
                                              DType dtype, const KernelBenchmarkOptions& options);

// The table (one line per timing, with % of the peak when known) and one JSON object per timing.
std::string format_kernel_timings(const std::vector<KernelTiming>& timings, std::optional<double> peak_tflops);
nlohmann::json kernel_timing_json(const KernelTiming& timing, std::optional<double> peak_tflops);

}  // namespace primus
