#include "tools/kernel_benchmark.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "layers/basic_layers.h"
#include "models/gemm_shapes.h"
#include "models/model.h"
#include "ops/fp8_ops.h"
#include "ops/moe_ops.h"
#include "ops/ops.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/device_info.h"
#endif

namespace primus {

namespace {

// Fresh normal values (std 0.02, a weight's scale) in `dtype` on `device`, drawn from `seed`.
Tensor random_tensor(const Shape& shape, DType dtype, Device device, uint64_t seed) {
  Tensor f32 = Tensor::empty(shape, DType::kF32, device);
  ops::fill_normal(f32, seed, 0.02);
  if (dtype == DType::kF32) return f32;
  Tensor out = Tensor::empty(shape, dtype, device);
  ops::cast(out, f32);
  return out;
}

// The median of `iters` timed runs of `work` after `warmup` untimed ones, from device marks around each run.
double median_ms(Device device, const KernelBenchmarkOptions& o, const std::function<void()>& work) {
  Backend& backend = backend_for(device);
  for (int i = 0; i < o.warmup; ++i) work();
  std::vector<std::unique_ptr<DeviceMark>> marks;
  marks.push_back(backend.mark());
  for (int i = 0; i < o.iters; ++i) {
    work();
    marks.push_back(backend.mark());
  }
  std::vector<double> ms;
  for (size_t i = 0; i + 1 < marks.size(); ++i) ms.push_back(backend.elapsed_ms(*marks[i], *marks[i + 1]));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One linear module of `in` → `out` columns over `rows` rows: its three GEMMs, as Linear runs them.
void time_linear(const std::string& op, int64_t rows, int64_t in, int64_t out, Device device, DType dtype,
                 const KernelBenchmarkOptions& o, std::vector<KernelTiming>& timings) {
  const uint64_t seed = timings.size() + 1;
  const Tensor x = random_tensor({rows, in}, dtype, device, seed);
  const Tensor w = random_tensor({out, in}, dtype, device, seed + 1000);
  const Tensor dy = random_tensor({rows, out}, dtype, device, seed + 2000);
  Tensor y = Tensor::empty({rows, out}, dtype, device);
  Tensor dx = Tensor::empty({rows, in}, dtype, device);
  Tensor dw = ops::zeros({out, in}, DType::kF32, device);
  Tensor none;
  const std::string name = dtype_name(dtype);
  auto add = [&](const char* pass, int64_t m, int64_t n, int64_t k, const std::string& shape, double ms) {
    timings.push_back({op, pass, m, n, k, shape, name, 2.0 * static_cast<double>(m) * n * k, ms});
  };
  add("forward", rows, out, in, fmt::format("[{}, {}] x [{}, {}]^T", rows, in, out, in),
      median_ms(device, o, [&] { ops::linear_forward(x, w, y); }));
  add("data_grad", rows, in, out, fmt::format("[{}, {}] x [{}, {}]", rows, out, out, in),
      median_ms(device, o, [&] { ops::linear_backward(x, w, dy, dx, none); }));
  add("weight_grad", out, in, rows, fmt::format("[{}, {}]^T x [{}, {}]", rows, out, rows, in),
      median_ms(device, o, [&] { ops::linear_backward(x, w, dy, none, dw); }));
}

// The experts' grouped GEMM of `in` → `out` over `rows` routed rows spread evenly over `experts`.
void time_grouped(const std::string& op, int64_t rows, int64_t experts, int64_t in, int64_t out, Device device,
                  DType dtype, const KernelBenchmarkOptions& o, std::vector<KernelTiming>& timings) {
  const uint64_t seed = timings.size() + 1;
  const Tensor x = random_tensor({rows, in}, dtype, device, seed);
  const Tensor w = random_tensor({experts, out, in}, dtype, device, seed + 1000);
  const Tensor dy = random_tensor({rows, out}, dtype, device, seed + 2000);
  Tensor host_offsets = Tensor::empty({experts + 1}, DType::kI32);
  for (int64_t e = 0; e <= experts; ++e) host_offsets.i32()[e] = static_cast<int32_t>(rows * e / experts);
  const Tensor offsets = ops::to_device(host_offsets, device);
  Tensor y = Tensor::empty({rows, out}, dtype, device);
  Tensor dx = Tensor::empty({rows, in}, dtype, device);
  Tensor dw = ops::zeros({experts, out, in}, DType::kF32, device);
  Tensor none;
  const std::string name = dtype_name(dtype);
  const std::string each = fmt::format("{} experts of {} rows: ", experts, rows / experts);
  auto add = [&](const char* pass, int64_t m, int64_t n, int64_t k, const std::string& shape, double ms) {
    timings.push_back({op, pass, m, n, k, each + shape, name, 2.0 * static_cast<double>(m) * n * k, ms});
  };
  add("forward", rows, out, in, fmt::format("[., {}] x [{}, {}]^T", in, out, in),
      median_ms(device, o, [&] { ops::grouped_linear_forward(x, w, offsets, y); }));
  add("data_grad", rows, in, out, fmt::format("[., {}] x [{}, {}]", out, out, in),
      median_ms(device, o, [&] { ops::grouped_linear_backward(x, w, offsets, dy, dx, none); }));
  add("weight_grad", out * experts, in, rows / std::max<int64_t>(experts, 1), fmt::format("[., {}]^T x [., {}]", out, in),
      median_ms(device, o, [&] { ops::grouped_linear_backward(x, w, offsets, dy, none, dw); }));
}

// An fp8 operand and, from the same pass, its transposed copy: codes and scale_inv of each (scales from the amaxes).
struct Fp8Copies {
  Tensor codes, scale_inv, codes_t, scale_inv_t;
  Fp8Format format;
  Fp8Tiling tiling;
  ops::Fp8Operand direct() const { return {&codes, format, tiling, &scale_inv}; }
  ops::Fp8Operand transposed() const { return {&codes_t, format, tiling, &scale_inv_t}; }
};

Fp8Copies quantise_both(const Tensor& x, Fp8Format format, Fp8Tiling tiling) {
  const Device d = x.device();
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const Shape grid = ops::fp8_tile_grid(rows, cols, tiling), grid_t = ops::fp8_tile_grid(cols, rows, tiling);
  Fp8Copies q{Tensor::empty({rows, cols}, DType::kU8, d), Tensor::empty(grid, DType::kF32, d),
              Tensor::empty({cols, rows}, DType::kU8, d), Tensor::empty(grid_t, DType::kF32, d), format, tiling};
  Tensor amax = Tensor::empty(grid, DType::kF32, d), amax_t = Tensor::empty(grid_t, DType::kF32, d);
  Tensor scale = Tensor::empty(grid, DType::kF32, d), scale_t = Tensor::empty(grid_t, DType::kF32, d);
  Tensor non_finite = ops::zeros({1}, DType::kI32, d);
  ops::fp8_amax(x, tiling, amax);
  ops::fp8_amax(x, tiling, amax_t, true);
  ops::fp8_scale(amax, format, {}, scale, q.scale_inv, non_finite);
  ops::fp8_scale(amax_t, format, {}, scale_t, q.scale_inv_t, non_finite);
  ops::fp8_quantize(x, scale, format, tiling, q.codes, scale_t, q.codes_t);
  return q;
}

// One linear module's three fp8 GEMMs (benchmark_fp8_gemms).
void time_fp8_linear(const std::string& op, int64_t rows, int64_t in, int64_t out, Device device, Fp8GemmRecipe recipe,
                     const KernelBenchmarkOptions& o, std::vector<KernelTiming>& timings) {
  const uint64_t seed = timings.size() + 1;
  const bool blockwise = recipe == Fp8GemmRecipe::kBlockwise;
  const Fp8Tiling act = blockwise ? Fp8Tiling{1, 128} : Fp8Tiling{0, 0};
  const Fp8Tiling weight = blockwise ? Fp8Tiling{128, 128} : Fp8Tiling{0, 0};
  const Fp8Format grad = blockwise ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  const Fp8Copies x = quantise_both(random_tensor({rows, in}, DType::kBF16, device, seed), Fp8Format::kE4M3, act);
  const Fp8Copies w =
      quantise_both(random_tensor({out, in}, DType::kBF16, device, seed + 1000), Fp8Format::kE4M3, weight);
  const Fp8Copies dy = quantise_both(random_tensor({rows, out}, DType::kBF16, device, seed + 2000), grad, act);
  Tensor y = Tensor::empty({rows, out}, DType::kBF16, device);
  Tensor dx = Tensor::empty({rows, in}, DType::kBF16, device);
  Tensor dw = ops::zeros({out, in}, DType::kF32, device);
  const std::string recipe_name = blockwise ? "blockwise: " : "tensorwise: ";
  auto add = [&](const char* pass, int64_t m, int64_t n, int64_t k, const std::string& shape, double ms) {
    timings.push_back({op, pass, m, n, k, recipe_name + shape, "fp8", 2.0 * static_cast<double>(m) * n * k, ms});
  };
  add("forward", rows, out, in, fmt::format("[{}, {}] x [{}, {}]^T", rows, in, out, in),
      median_ms(device, o, [&] { ops::fp8_gemm(x.direct(), w.direct(), y); }));
  add("data_grad", rows, in, out, fmt::format("[{}, {}] x ([{}, {}]^T)^T", rows, out, in, out),
      median_ms(device, o, [&] { ops::fp8_gemm(dy.direct(), w.transposed(), dx); }));
  add("weight_grad", out, in, rows, fmt::format("[{}, {}] x [{}, {}]^T", out, rows, in, rows),
      median_ms(device, o, [&] { ops::fp8_gemm(dy.transposed(), x.transposed(), dw, {.accumulate = true}); }));
}

// Rows of one logits chunk of `vocab` columns: the loss never holds more than LmLoss::max_logits_bytes of logits.
int64_t lm_head_chunk_rows(int64_t vocab, int64_t tokens, DType dtype) {
  return std::clamp<int64_t>(LmLoss().max_logits_bytes / (vocab * static_cast<int64_t>(dtype_size(dtype))), 1, tokens);
}

int64_t rank_tokens(const TrainingArgs& t) {
  return t.micro_batch_size * t.seq_length / std::max<int64_t>(1, t.context_parallel_size);
}

}  // namespace

namespace {

// Whether `device` is an H100 or H200, the GPUs whose datasheet peaks the table below holds.
bool is_h100_or_h200(Device device) {
#if PRIMUS_WITH_CUDA
  if (device.type != DeviceType::kCuda) return false;
  CudaDeviceInfo info;
  std::string why;
  return cuda_device_info(device.index, &info, &why) &&
         (info.name.find("H100") != std::string::npos || info.name.find("H200") != std::string::npos);
#else
  (void)device;
  return false;
#endif
}

}  // namespace

std::optional<double> dense_peak_tflops(Device device, DType dtype) {
  if (dtype == DType::kBF16 && is_h100_or_h200(device)) return 989.0;
  return std::nullopt;
}

std::optional<double> fp8_dense_peak_tflops(Device device) {
  if (is_h100_or_h200(device)) return 1979.0;
  return std::nullopt;
}

std::vector<KernelTiming> benchmark_gemms(const ModelArgs& a, const TrainingArgs& t, Device device, DType dtype,
                                          const KernelBenchmarkOptions& o) {
  const ModelArgs rank = tensor_parallel_shapes(a, static_cast<int>(std::max<int64_t>(1, t.tensor_model_parallel_size)));
  const int64_t n = rank_tokens(t), ep = std::max<int64_t>(1, t.expert_model_parallel_size);
  bool moe_layers = false, dense_layers = false;
  for (int64_t i = 0; i < a.num_layers; ++i) (a.is_moe_layer(i) ? moe_layers : dense_layers) = true;
  // Each GEMM once: the attention projections are the same in MoE and dense layers (and in the multi-token
  // prediction modules, which add eh_proj).
  std::vector<std::vector<GemmShape>> lists;
  for (const bool moe : {true, false}) {
    if (moe ? moe_layers : dense_layers) lists.push_back(layer_gemms(rank, ep, moe));
  }
  if (a.mtp_num_layers > 0) lists.push_back(mtp_gemms(rank, ep));
  std::vector<GemmShape> shapes;
  for (const std::vector<GemmShape>& list : lists) {
    for (const GemmShape& g : list) {
      const bool seen = std::any_of(shapes.begin(), shapes.end(), [&](const GemmShape& s) { return s.op == g.op; });
      if (!seen) shapes.push_back(g);
    }
  }
  std::vector<KernelTiming> timings;
  for (const GemmShape& g : shapes) {
    if (g.experts > 0) {
      time_grouped(g.op, n * g.rows_per_token, g.experts, g.in, g.out, device, dtype, o, timings);
    } else {
      time_linear(g.op, n, g.in, g.out, device, dtype, o, timings);
    }
  }
  // The loss computes the logits a chunk of rows at a time (LmLoss::max_logits_bytes): one chunk's GEMMs.
  const GemmShape head = output_gemm(rank);
  time_linear(head.op, lm_head_chunk_rows(head.out, n, dtype), head.in, head.out, device, dtype, o, timings);
  return timings;
}

std::string fp8_gemm_device_error(Device device) {
  return fmt::format("--fp8: fp8 GEMMs need a GPU with fp8 tensor cores (Hopper sm_90 or newer); the device is {}",
                     device.str());
}

std::vector<KernelTiming> benchmark_fp8_gemms(const ModelArgs& a, const TrainingArgs& t, Device device,
                                              Fp8GemmRecipe recipe, const KernelBenchmarkOptions& o) {
  if (device.is_cpu()) throw UsageError(fp8_gemm_device_error(device));
  const ModelArgs rank = tensor_parallel_shapes(a, static_cast<int>(std::max<int64_t>(1, t.tensor_model_parallel_size)));
  const int64_t n = rank_tokens(t), ep = std::max<int64_t>(1, t.expert_model_parallel_size);
  std::vector<KernelTiming> timings;
  std::vector<std::string> seen;
  for (const bool moe : {true, false}) {
    bool present = false;
    for (int64_t i = 0; i < a.num_layers; ++i) present = present || a.is_moe_layer(i) == moe;
    if (!present) continue;
    for (const GemmShape& g : layer_gemms(rank, ep, moe)) {
      if (g.experts > 0 || std::find(seen.begin(), seen.end(), g.op) != seen.end()) continue;
      seen.push_back(g.op);
      time_fp8_linear(g.op, n, g.in, g.out, device, recipe, o, timings);
    }
  }
  return timings;
}

std::vector<KernelTiming> benchmark_attention(const ModelArgs& a, const TrainingArgs& t, Device device, DType dtype,
                                              const KernelBenchmarkOptions& o) {
  const int64_t tp = std::max<int64_t>(1, t.tensor_model_parallel_size);
  const int64_t b = t.micro_batch_size, seq = t.seq_length / std::max<int64_t>(1, t.context_parallel_size);
  const int64_t hq = a.num_attention_heads / tp, hkv = std::max<int64_t>(1, a.num_query_groups / tp);
  // Multi-head latent attention: every head has its own key; queries and keys carry the RoPE part too, values not.
  const int64_t d = a.multi_latent_attention ? a.qk_head_dim + a.qk_pos_emb_head_dim : a.kv_channels;
  const int64_t dv = a.multi_latent_attention ? a.v_head_dim : a.kv_channels;
  const Tensor q = random_tensor({b, seq, hq, d}, dtype, device, 1);
  const Tensor k = random_tensor({b, seq, hkv, d}, dtype, device, 2);
  const Tensor v = random_tensor({b, seq, hkv, dv}, dtype, device, 3);
  const Tensor dout = random_tensor({b, seq, hq, dv}, dtype, device, 4);
  Tensor out = Tensor::empty({b, seq, hq, dv}, dtype, device);
  Tensor lse = Tensor::empty({b, hq, seq}, DType::kF32, device);
  Tensor dq = Tensor::empty(q.shape(), dtype, device), dk = Tensor::empty(k.shape(), dtype, device),
         dvalues = Tensor::empty(v.shape(), dtype, device);
  // QKᵀ and PV, causal half: 2·B·T²·H·(D + Dv)/2 (4·B·T²·H·D / 2 when the widths are equal).
  const double forward_flops = static_cast<double>(b) * seq * seq * hq * (d + dv);
  const std::string shape = fmt::format("q and k [{}, {}, {}, {}] and [{}, {}, {}, {}], v [.., {}], causal", b, seq,
                                        hq, d, b, seq, hkv, d, dv);
  std::vector<KernelTiming> timings;
  timings.push_back({"attention", "forward", 0, 0, 0, shape, dtype_name(dtype), forward_flops,
                     median_ms(device, o, [&] { ops::attention_forward(q, k, v, out, lse); })});
  ops::attention_forward(q, k, v, out, lse);
  timings.push_back({"attention", "backward", 0, 0, 0, shape, dtype_name(dtype), 2.5 * forward_flops,
                     median_ms(device, o, [&] { ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dvalues); })});
  return timings;
}

std::string format_kernel_timings(const std::vector<KernelTiming>& timings, std::optional<double> peak) {
  std::string text = fmt::format("{:<16} {:<12} {:<5} {:>10} {:>9} {:>7}  {}\n", "op", "pass", "dtype", "ms",
                                 "TFLOP/s", peak ? "% peak" : "", "shape");
  for (const KernelTiming& k : timings) {
    text += fmt::format("{:<16} {:<12} {:<5} {:>10.3f} {:>9.1f} {:>7}  {}\n", k.op, k.pass, k.dtype, k.ms,
                        k.tflops(), peak ? fmt::format("{:.1f}", 100.0 * k.tflops() / *peak) : "", k.shape);
  }
  return text;
}

nlohmann::json kernel_timing_json(const KernelTiming& k, std::optional<double> peak) {
  nlohmann::json j = {{"op", k.op},       {"pass", k.pass},   {"dtype", k.dtype}, {"shape", k.shape},
                      {"flops", k.flops}, {"ms", k.ms},       {"tflops", k.tflops()}};
  if (k.m > 0) j["m"] = k.m, j["n"] = k.n, j["k"] = k.k;
  if (peak) j["percent_of_peak"] = 100.0 * k.tflops() / *peak;
  return j;
}

}  // namespace primus
