// The op test harness's runs and checks (op_harness.h says what is checked and why).
#include "support/op_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16.h"
#include "core/error.h"
#include "ops/ops.h"
#include "support/test_support.h"

namespace primus::testing {

const Tensor& Tensors::operator[](const std::string& name) const {
  for (const auto& [n, t] : items_) {
    if (n == name) return t;
  }
  throw RuntimeError(fmt::format("[op harness] no tensor named '{}'", name));
}

bool Tensors::has(const std::string& name) const {
  return std::any_of(items_.begin(), items_.end(), [&](const auto& item) { return item.first == name; });
}

Tensor OpEnv::nan(const Shape& shape, DType dtype) const {
  Tensor h = Tensor::empty(shape, dtype);
  std::memset(h.data(), 0xFF, h.nbytes());  // NaN in f32 and in bf16
  return device_.is_cpu() ? h : ops::to_device(h, device_);
}

Tensor OpEnv::accumulator(const Shape& shape) {
  const Tensor start = random_tensor(shape, rng_);
  Tensor t = ops::to_device(start, device_);
  accumulators_.emplace_back(t, start);
  return t;
}

Tensor OpEnv::copy(const Tensor& t) const {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  ops::copy(c, t);
  return c;
}

Tensor OpEnv::act_tensor(const Tensor& t) const {
  const Tensor h = host_f32(t);
  Tensor narrowed = h;
  if (act_ != DType::kF32) {
    narrowed = Tensor::empty(h.shape(), act_);
    ops::cast(narrowed, h);
  }
  return ops::to_device(narrowed, device_);
}

Tensor OpEnv::pure_gradient(const Tensor& t) const {
  Tensor g = host_f32(t);
  for (const auto& [buffer, start] : accumulators_) {
    if (buffer.data() != t.data()) continue;
    // host_f32 of a host f32 tensor is the tensor itself: subtract into a copy.
    Tensor pure = Tensor::empty(g.shape(), DType::kF32);
    for (int64_t i = 0; i < g.numel(); ++i) pure.f32()[i] = g.f32()[i] - start.f32()[i];
    return pure;
  }
  return g;
}

namespace {

const char* dtype_label(DType dtype) { return dtype == DType::kBF16 ? "bf16" : "f32"; }

// FNV-1a of the case's name: a seed that does not change with the order or number of cases.
uint64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Seeds of one case at one size; the same for the CPU and the device run, so both see the same values.
uint64_t seed_of(const OpTestParam& p, uint64_t purpose) {
  return Rng::derive(name_hash(p.op->name) + static_cast<uint64_t>(p.size), purpose).seed();
}

void round_to_bf16(Tensor& t) {
  float* v = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = bf16_to_f32(f32_to_bf16(v[i]));
}

// The case's inputs on the host, the kAct ones rounded to bf16 for a bf16 run.
std::vector<Input> make_inputs(const OpTestParam& p) {
  Rng rng(seed_of(p, 1));
  std::vector<Input> inputs = p.op->make_inputs(p.size, rng);
  for (Input& in : inputs) {
    const DType want = in.kind == InputKind::kIndex ? DType::kI32 : DType::kF32;
    PRIMUS_CHECK(in.value.dtype() == want && in.value.device().is_cpu(),
                 "[op harness] case {}: input {} must be a host {} tensor, is {}", p.op->name, in.name,
                 dtype_name(want), in.value.describe());
    if (in.kind == InputKind::kAct && p.dtype == DType::kBF16) round_to_bf16(in.value);
  }
  return inputs;
}

// Inputs where a run of `act` on `device` reads them. On the host in f32 they are the inputs themselves (finite
// differences nudge them there).
Tensors place(const std::vector<Input>& inputs, Device device, DType act) {
  Tensors placed;
  for (const Input& in : inputs) {
    if (in.kind == InputKind::kAct && act == DType::kBF16) {
      Tensor h = Tensor::empty(in.value.shape(), DType::kBF16);
      ops::cast(h, in.value);
      placed.add(in.name, ops::to_device(h, device));
    } else {
      placed.add(in.name, device.is_cpu() ? in.value : ops::to_device(in.value, device));
    }
  }
  return placed;
}

// The loss weights W of the first loss_outputs outputs, on the host in f32: random (rounded to bf16 for a bf16 run,
// so the device can hold them exactly) or, for a scalar upstream, the one scale everywhere.
Tensors loss_weights(const OpTestParam& p, const Tensors& outputs, float scale) {
  Rng rng(seed_of(p, 2));
  Tensors w;
  const auto& items = outputs.items();
  PRIMUS_CHECK(static_cast<int>(items.size()) >= p.op->loss_outputs, "[op harness] case {}: {} outputs, {} in the loss",
               p.op->name, items.size(), p.op->loss_outputs);
  for (int k = 0; k < p.op->loss_outputs; ++k) {
    Tensor t = random_tensor(items[k].second.shape(), rng);
    if (p.op->scalar_upstream) t.fill(scale);
    if (p.dtype == DType::kBF16) round_to_bf16(t);
    w.add(items[k].first, t);
  }
  return w;
}

// The upstream gradients: W in each loss output's dtype, where that output lives.
Tensors upstream(const Tensors& weights, const Tensors& outputs) {
  Tensors dy;
  for (const auto& [name, w] : weights.items()) {
    const Tensor& y = outputs[name];
    Tensor h = w;
    if (y.dtype() != DType::kF32) {
      h = Tensor::empty(w.shape(), y.dtype());
      ops::cast(h, w);
    }
    dy.add(name, y.device().is_cpu() ? h : ops::to_device(h, y.device()));
  }
  return dy;
}

float upstream_scale(const OpTestParam& p) {
  Rng rng(seed_of(p, 3));
  return static_cast<float>(0.2 + rng.uniform());
}

uint64_t accumulator_seed(const OpTestParam& p) { return seed_of(p, 4); }

// Gradients of every kAct input, checked to be all there.
Tensors run_backward(const OpCase& op, const std::vector<Input>& inputs, const Tensors& placed, const Tensors& out,
                     const Tensors& dy, OpEnv& env) {
  Tensors grads = op.backward(placed, out, dy, env);
  for (const Input& in : inputs) {
    if (in.kind == InputKind::kAct) {
      EXPECT_TRUE(grads.has("d" + in.name)) << op.name << ": backward gives no d" << in.name;
    }
  }
  return grads;
}

double floor_of(const OpCase& op, const std::string& name) {
  const auto it = op.floors.find(name);
  return it == op.floors.end() ? 1e-30 : it->second;
}

std::string label(const OpTestParam& p, const std::string& what) {
  return fmt::format("{} {} ({} {}, size {})", p.op->name, what, p.device.is_cpu() ? "cpu" : "cuda",
                     dtype_label(p.dtype), p.size);
}

// Σ over the loss outputs of Σ y ⊙ W, in double.
double loss_of(const Tensors& outputs, const Tensors& weights) {
  double sum = 0.0;
  for (const auto& [name, w] : weights.items()) {
    const Tensor y = host_f32(outputs[name]);
    for (int64_t i = 0; i < y.numel(); ++i) sum += static_cast<double>(y.f32()[i]) * w.f32()[i];
  }
  return sum;
}

// The elements of an input probed by finite differences: all of a small one; of a larger one 16 where the analytic
// gradient is not zero (so the check cannot pass vacuously) and 16 anywhere (zeros must be right too). Every size
// of every case draws its own, so the sweep probes a few hundred elements of each op.
std::vector<int64_t> probed_elements(const Tensor& analytic, Rng& rng) {
  const int64_t n = analytic.numel();
  std::vector<int64_t> picked;
  if (n <= 32) {
    for (int64_t i = 0; i < n; ++i) picked.push_back(i);
    return picked;
  }
  std::vector<int64_t> nonzero;
  for (int64_t i = 0; i < n; ++i) {
    if (analytic.f32()[i] != 0.0f) nonzero.push_back(i);
  }
  for (int k = 0; k < 16 && !nonzero.empty(); ++k) picked.push_back(nonzero[rng.below(nonzero.size())]);
  for (int k = 0; k < 16; ++k) picked.push_back(static_cast<int64_t>(rng.below(static_cast<uint64_t>(n))));
  std::sort(picked.begin(), picked.end());
  picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
  return picked;
}

}  // namespace

std::string op_test_name(const OpTestParam& p) {
  return fmt::format("{}_{}_{}_{}", p.op->name, p.device.is_cpu() ? "cpu" : "cuda", dtype_label(p.dtype), p.size);
}

void PrintTo(const OpTestParam& p, std::ostream* os) { *os << op_test_name(p); }

std::vector<OpTestParam> cpu_op_tests(const std::vector<OpCase>& cases) {
  std::vector<OpTestParam> tests;
  for (const OpCase& op : cases) {
    for (const int64_t size : op.sizes) tests.push_back({&op, size, kCpuDevice, DType::kF32});
  }
  return tests;
}

std::vector<OpTestParam> device_op_tests(const std::vector<OpCase>& cases, Device device) {
  std::vector<OpTestParam> tests;
  for (const OpCase& op : cases) {
    for (const DType dtype : op.dtypes) {
      for (const int64_t size : op.sizes) tests.push_back({&op, size, device, dtype});
      for (const int64_t size : op.device_sizes) tests.push_back({&op, size, device, dtype});
    }
  }
  return tests;
}

void check_against_reference(const OpTestParam& p) {
  const OpCase& op = *p.op;
  if (!op.reference) return;
  const std::vector<Input> inputs = make_inputs(p);
  const Tensors in = place(inputs, kCpuDevice, DType::kF32);
  const float scale = upstream_scale(p);
  OpEnv env(kCpuDevice, DType::kF32, accumulator_seed(p), scale);
  const Tensors out = op.forward(in, env);
  const Tensors weights = loss_weights(p, out, scale);
  Tensors grads;
  if (op.backward) grads = run_backward(op, inputs, in, out, upstream(weights, out), env);
  const Tensors want = op.reference(in, weights, scale);
  for (const auto& [name, value] : want.items()) {
    if (out.has(name)) {
      expect_close(label(p, name + " vs reference"), out[name], value, op.reference_tol, floor_of(op, name));
    } else if (grads.has(name)) {
      expect_close(label(p, name + " vs reference"), env.pure_gradient(grads[name]), value, op.reference_tol,
                   floor_of(op, name));
    } else {
      ADD_FAILURE() << op.name << ": the reference gives " << name << ", which the op does not";
    }
  }
}

void check_finite_differences(const OpTestParam& p) {
  const OpCase& op = *p.op;
  if (!op.backward || !op.finite_differences) return;
  std::vector<Input> inputs = make_inputs(p);
  const Tensors in = place(inputs, kCpuDevice, DType::kF32);
  const float scale = upstream_scale(p);
  OpEnv env(kCpuDevice, DType::kF32, accumulator_seed(p), scale);
  const Tensors out = op.forward(in, env);
  const Tensors weights = loss_weights(p, out, scale);
  const Tensors grads = run_backward(op, inputs, in, out, upstream(weights, out), env);
  auto loss = [&] {
    OpEnv fd_env(kCpuDevice, DType::kF32, accumulator_seed(p), scale);
    return loss_of(op.forward(in, fd_env), weights);
  };
  Rng rng(seed_of(p, 5));
  for (Input& input : inputs) {
    if (input.kind != InputKind::kAct || !grads.has("d" + input.name)) continue;
    const std::string name = "d" + input.name;
    const Tensor analytic = env.pure_gradient(grads[name]);
    float* x = input.value.f32();
    const float h = static_cast<float>(op.fd_eps);
    double diff = 0.0, ref = 0.0;
    for (const int64_t i : probed_elements(analytic, rng)) {
      const float saved = x[i];
      x[i] = saved + h;
      const double plus = loss();
      x[i] = saved - h;
      const double minus = loss();
      x[i] = saved;
      // The step actually taken after rounding saved ± h to f32.
      const double numeric = (plus - minus) / (static_cast<double>(saved + h) - static_cast<double>(saved - h));
      const double a = analytic.f32()[i];
      ASSERT_TRUE(std::isfinite(a)) << label(p, name) << ": element " << i << " is " << a;
      diff += (a - numeric) * (a - numeric);
      ref += numeric * numeric;
    }
    const double floor = floor_of(op, name);
    ASSERT_TRUE(ref > 0.0 || floor > 1e-30) << label(p, name) << ": the numeric gradient is zero, a vacuous check";
    const double err = std::sqrt(diff) / std::max(std::sqrt(ref), floor);
    std::printf("  %-70s rel err %.2e (tol %.0e)\n", label(p, name + " vs finite differences").c_str(), err,
                op.fd_tol);
    EXPECT_LE(err, op.fd_tol) << label(p, name + " vs finite differences");
  }
}

void check_against_cpu(const OpTestParam& p) {
  const OpCase& op = *p.op;
  if (p.size % op.device_size_multiple != 0) {
    GTEST_SKIP() << op.name << " at size " << p.size << ": " << op.device_size_reason;
  }
  const std::vector<Input> inputs = make_inputs(p);
  const float scale = upstream_scale(p);
  const Tensors cpu_in = place(inputs, kCpuDevice, DType::kF32), dev_in = place(inputs, p.device, p.dtype);
  OpEnv cpu_env(kCpuDevice, DType::kF32, accumulator_seed(p), scale);
  OpEnv dev_env(p.device, p.dtype, accumulator_seed(p), scale);
  const Tensors cpu_out = op.forward(cpu_in, cpu_env), dev_out = op.forward(dev_in, dev_env);
  auto tolerance = [&](const Tensor& got) {
    if (got.dtype() == DType::kI32) return 0.0;  // indices (chosen experts, slots) are equal or wrong
    if (p.dtype == DType::kF32) return op.device_tol.f32;
    return got.dtype() == DType::kBF16 ? op.device_tol.bf16 : op.device_tol.bf16_f32_out;
  };
  for (const auto& [name, want] : cpu_out.items()) {
    const Tensor& got = dev_out[name];
    expect_close(label(p, name), got, want, tolerance(got), floor_of(op, name));
  }
  if (!op.backward) return;
  const Tensors weights = loss_weights(p, cpu_out, scale);
  const Tensors cpu_grads = run_backward(op, inputs, cpu_in, cpu_out, upstream(weights, cpu_out), cpu_env);
  const Tensors dev_grads = run_backward(op, inputs, dev_in, dev_out, upstream(weights, dev_out), dev_env);
  for (const auto& [name, want] : cpu_grads.items()) {
    const Tensor& got = dev_grads[name];
    expect_close(label(p, name), got, want, tolerance(got), floor_of(op, name));
  }
}

}  // namespace primus::testing
