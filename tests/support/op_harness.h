// The op test harness (DESIGN.md principle 2, after ggml's test-backend-ops): each op is one declarative OpCase
// (support/op_cases.cpp), and the harness sweeps it over every backend × dtype × awkward size:
//  - on the CPU (tests/ops/op_cases_test.cpp): forward and gradients against the case's naive double-precision
//    reference, and every gradient against central finite differences of L = Σ y ⊙ W (W random and fixed, so every
//    output element matters), the fp32 op evaluated per nudge and L accumulated in double;
//  - on a device (tests/ops/op_cases_gpu_test.cpp): forward and every gradient against the CPU backend on the same
//    inputs (in bf16 runs the inputs rounded to bf16 first, so both sides see the same values).
// Inputs are fresh random values from a generator seeded by case and size (never zeros); outputs start as NaN, so an
// element an op forgets to write fails; gradients an op accumulates into start from random values, so an op that
// overwrites instead fails too.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace primus::testing {

// Named tensors in a fixed order: a case's inputs, outputs or gradients. A gradient is named "d" + its input's name.
class Tensors {
 public:
  Tensors() = default;
  Tensors(std::initializer_list<std::pair<std::string, Tensor>> items) : items_(items) {}
  void add(const std::string& name, Tensor t) { items_.emplace_back(name, std::move(t)); }
  // Throws naming the tensor when the case has none of that name.
  const Tensor& operator[](const std::string& name) const;
  bool has(const std::string& name) const;
  const std::vector<std::pair<std::string, Tensor>>& items() const { return items_; }

 private:
  std::vector<std::pair<std::string, Tensor>> items_;
};

// What an input is, which decides its dtype in a run and whether it is differentiated:
//  kAct   float: activations and the weights an op reads; the run's dtype (bf16 on a bf16 run); differentiated.
//  kF32   float, always f32, not differentiated: RoPE tables, the lse a backward reads, the group max.
//  kIndex i32: ids, targets, positions, segment starts.
enum class InputKind { kAct, kF32, kIndex };

struct Input {
  std::string name;
  InputKind kind;
  Tensor value;  // on the host: f32, or i32 for kIndex
};

// One run of a case: the device and activation dtype, and the buffers the case's lambdas allocate there.
class OpEnv {
 public:
  OpEnv(Device device, DType act, uint64_t seed, float upstream_scale)
      : device_(device), act_(act), rng_(seed), upstream_scale_(upstream_scale) {}
  Device device() const { return device_; }
  DType act() const { return act_; }
  // An output of the run's dtype (or f32: statistics, f32 logits), every element NaN.
  Tensor out(const Shape& shape) const { return nan(shape, act_); }
  Tensor out_f32(const Shape& shape) const { return nan(shape, DType::kF32); }
  Tensor nan(const Shape& shape, DType dtype) const;
  // An f32 gradient that the op adds to (dw, dweight, dtable): starts from random values, the same on every run of
  // one case and size; the harness subtracts them before comparing with finite differences or a reference.
  Tensor accumulator(const Shape& shape);
  // A copy of t on t's device (ops that work in place must not change the case's inputs).
  Tensor copy(const Tensor& t) const;
  // t (any float dtype, anywhere) as a tensor of the run's dtype on the run's device.
  Tensor act_tensor(const Tensor& t) const;
  // The weight of every element of the loss when the case has a scalar upstream (OpCase::scalar_upstream).
  float upstream_scale() const { return upstream_scale_; }
  // t less the starting values when t is one of this run's accumulators; as a host f32 tensor.
  Tensor pure_gradient(const Tensor& t) const;

 private:
  Device device_;
  DType act_;
  Rng rng_;
  float upstream_scale_;
  std::vector<std::pair<Tensor, Tensor>> accumulators_;  // (the buffer, its starting values on the host)
};

// Relative L2 errors ||got − want|| / max(||want||, floor) allowed.
struct Tolerance {
  double f32 = 1e-5;           // an f32 run of a device against the CPU
  double bf16 = 5e-3;          // bf16 outputs of a bf16 run (an fp32 result rounded once: ≤ 2^-8 of each element)
  double bf16_f32_out = 1e-5;  // f32 outputs of a bf16 run (statistics, parameter gradients) from the same inputs
};

// The sizes every case is swept over unless it names its own: 1, around a 32-wide tile, and a non-multiple of
// 32, 64 and 128. A case's make_inputs turns a size into shapes (usually rows or sequence length).
inline const std::vector<int64_t> kAwkwardSizes = {1, 31, 32, 33, 129};

struct OpCase {
  std::string name;  // letters, digits and '_' (part of the test's name)
  std::vector<int64_t> sizes = kAwkwardSizes;
  // Larger sizes swept on devices only (against the CPU forward and backward, no finite differences).
  std::vector<int64_t> device_sizes;
  // Sizes a device backend cannot take (cuBLASLt's fp8 GEMM: dimensions multiples of 16): the device tests of a size
  // that is not a multiple of this skip with device_size_reason; the CPU runs every size.
  int64_t device_size_multiple = 1;
  std::string device_size_reason;
  std::vector<DType> dtypes = {DType::kF32, DType::kBF16};  // on devices; the CPU runs f32
  std::function<std::vector<Input>(int64_t size, Rng& rng)> make_inputs;
  // Outputs, named; the first `loss_outputs` of them make the loss (the rest are statistics such as rstd or lse).
  std::function<Tensors(const Tensors& in, OpEnv& env)> forward;
  int loss_outputs = 1;
  // The loss weights W are one random scalar (env.upstream_scale()) instead of a random tensor: for backwards that
  // take dL/dloss as a scalar (cross-entropy's grad_scale).
  bool scalar_upstream = false;
  // Gradients "d" + name of every kAct input, from the upstream gradients dy (named as the loss outputs). Absent for
  // ops without one (checked forward only).
  std::function<Tensors(const Tensors& in, const Tensors& out, const Tensors& dy, OpEnv& env)> backward;
  // The math written out in double on the host (inputs and dy as host f32 / i32): any outputs and gradients it
  // names are compared with the CPU backend's at reference_tol. Empty: finite differences alone judge the CPU.
  std::function<Tensors(const Tensors& in, const Tensors& dy, float upstream_scale)> reference;
  double reference_tol = 1e-5;
  // Off only where fp32 cannot resolve the gradients by differences (cross-entropy over 50k columns: each is
  // ~1/V, below the rounding of the loss); the reference still checks them, and a narrower case the differences.
  bool finite_differences = true;
  double fd_eps = 1e-2;  // the step of the central differences
  double fd_tol = 1e-2;  // relative L2 error of the analytic gradient against them
  Tolerance device_tol;
  // Per output or gradient name: the floor of the relative error, for values that are 0 in exact arithmetic at some
  // sizes (dq, dk of attention at T = 1).
  std::map<std::string, double> floors;
};

// Inputs of a case, by kind (InputKind), and small helpers the cases' references use.
inline Input act(const std::string& name, Tensor t) { return {name, InputKind::kAct, std::move(t)}; }
inline Input f32(const std::string& name, Tensor t) { return {name, InputKind::kF32, std::move(t)}; }
inline Input index(const std::string& name, Tensor t) { return {name, InputKind::kIndex, std::move(t)}; }
// A host f32 tensor of `shape` holding `values` (the references compute in double).
inline Tensor from_doubles(const Shape& shape, const std::vector<double>& values) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(values[static_cast<size_t>(i)]);
  return t;
}
inline double at(const Tensor& t, int64_t i) { return static_cast<double>(t.f32()[i]); }

// One test of the sweep: a case at a size on a backend ("cpu" or "cuda") in a dtype.
struct OpTestParam {
  const OpCase* op;
  int64_t size;
  Device device;
  DType dtype;
};

// How gtest prints a parameter (the test name's parts), instead of its bytes.
void PrintTo(const OpTestParam& p, std::ostream* os);
// The test name gtest shows and ctest lists: <case>_<backend>_<dtype>_<size>.
std::string op_test_name(const OpTestParam& p);
// Every case at its sizes on the CPU in f32.
std::vector<OpTestParam> cpu_op_tests(const std::vector<OpCase>& cases);
// Every case at its sizes and device sizes on `device` in each of its dtypes.
std::vector<OpTestParam> device_op_tests(const std::vector<OpCase>& cases, Device device);

// The CPU checks (gtest expectations): against the reference, and by finite differences.
void check_against_reference(const OpTestParam& p);
void check_finite_differences(const OpTestParam& p);
// A device run against the CPU backend on the same inputs.
void check_against_cpu(const OpTestParam& p);

}  // namespace primus::testing
