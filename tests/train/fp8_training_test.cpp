// fp8 training on the CPU reference (PRIMUS_FP8_CPU_REFERENCE=1): the delayed recipe's device state against its host
// model (core/fp8_amax_history.h) and through a checkpoint; Fp8Linear's three GEMMs against the op harness's host
// model of the same quantisation (each operand's tiles, formats and transposed copies); and whole runs: each recipe
// follows a tiny Llama's fp32 loss curve on real text within 1%, a resumed delayed-scaling run
// repeats the uninterrupted one bit for bit, first_last_layers_bf16 keeps those layers' modules, and the layouts fp8
// does not run under yet exit 2 naming the key.
#include "train/fp8_training.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <tuple>

#include "checkpoint/checkpoint.h"
#include "core/file_io.h"
#include "core/fp8.h"
#include "layers/attention.h"
#include "layers/fp8_linear.h"
#include "layers/rope_table.h"
#include "ops/ops.h"
#include "support/fp8_reference.h"
#include "support/test_support.h"
#include "support/tiny_models.h"
#include "train/pretrain.h"
#include "train/train_step.h"

namespace primus {
namespace {

using Scaling = Fp8Recipe::Scaling;

std::vector<float> random_values(size_t n, uint64_t seed, float spread) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng) * spread;
  return v;
}

Tensor host_tensor(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::copy(v.begin(), v.end(), t.f32());
  return t;
}

std::vector<float> values_of(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

// x [rows, cols] (or its transpose) quantised and dequantised in `tiling`'s tiles: the op harness's host model
// (support/fp8_reference.h), each tile's scale from its amax or `fixed_scale` when positive.
std::vector<float> fake_quantised(const std::vector<float>& x, int64_t rows, int64_t cols, bool transposed,
                                  Fp8Tiling tiling, Fp8Format format, bool power_of_two, float fixed_scale) {
  const testing::Fp8CaseSpec spec{format, tiling, "", Fp8ScaleOptions{.power_of_two = power_of_two}};
  const testing::Quantized q = testing::reference_quantize(spec, x.data(), rows, cols, transposed, fixed_scale);
  return std::vector<float>(q.y.begin(), q.y.end());
}

// c [m, n] = a [m, k] · b [n, k]ᵀ in double.
std::vector<double> matmul_bt(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n,
                              int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(a[i * k + p]) * b[j * k + p];
      c[i * n + j] = s;
    }
  }
  return c;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (const double v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << what << " element " << i;
  }
}

struct LinearCase {
  Fp8Recipe recipe;
  std::string label;
};

// One forward and backward of an Fp8Linear (x [48, 160], W [96, 160]: partial 128-wide tiles in both dimensions)
// against the quantisation written out above.
void check_linear(const LinearCase& c) {
  SCOPED_TRACE(c.label);
  const int64_t n = 48, in = 160, out = 96;
  const std::vector<float> x = random_values(n * in, 1, 1.5f), w = random_values(out * in, 2, 0.05f),
                           dy = random_values(n * out, 3, 3e-4f);
  Tensor weight = host_tensor(w, {out, in});
  Tensor dweight = Tensor::zeros({out, in}, DType::kF32);
  const Linear plain(weight, dweight);
  auto scaling = std::make_shared<Fp8Scaling>(c.recipe, kCpuDevice);
  Fp8Linear linear(plain, scaling, "model.layers.0.mlp.down_proj");

  const bool blockwise = c.recipe.scaling == Scaling::kBlockwise;
  const Fp8Tiling act = blockwise ? Fp8Tiling{1, 128} : Fp8Tiling{};
  const Fp8Tiling block = blockwise ? Fp8Tiling{128, 128} : Fp8Tiling{};
  const Fp8Format fwd = c.recipe.forward_format, bwd = c.recipe.backward_format;
  const float fixed = c.recipe.scaling == Scaling::kDelayed ? 1.0f : 0.0f;  // the delayed recipe's first step: 1

  const Tensor y = linear.forward(host_tensor(x, {n, in}));
  const std::vector<float> qx = fake_quantised(x, n, in, false, act, fwd, blockwise, fixed);
  const std::vector<float> qw = fake_quantised(w, out, in, false, block, fwd, blockwise, fixed);
  expect_close(values_of(y), matmul_bt(qx, qw, n, out, in), "forward");

  Tensor dx;
  linear.backward(host_tensor(x, {n, in}), host_tensor(dy, {n, out}), dx);
  // dgrad: dy [n, out] · W, W read through its transposed copy Wᵀ [in, out] (the same 128×128 blocks, transposed).
  const std::vector<float> qdy = fake_quantised(dy, n, out, false, act, bwd, blockwise, fixed);
  const std::vector<float> qwt = fake_quantised(w, out, in, true, block, fwd, blockwise, fixed);
  expect_close(values_of(dx), matmul_bt(qdy, qwt, n, in, out), "dgrad");
  // wgrad: dyᵀ [out, n] · x, both transposed copies tiled 1×128 along the tokens.
  const std::vector<float> qdyt = fake_quantised(dy, n, out, true, act, bwd, blockwise, fixed);
  const std::vector<float> qxt = fake_quantised(x, n, in, true, act, fwd, blockwise, fixed);
  expect_close(values_of(dweight), matmul_bt(qdyt, qxt, out, in, n), "wgrad");
}

TEST(Fp8Linear, TensorwiseGemmsEqualTheirQuantisedOperands) {
  check_linear({Fp8Recipe{.scaling = Scaling::kTensorwise}, "tensorwise e4m3"});
  check_linear({Fp8Recipe{.scaling = Scaling::kTensorwise, .backward_format = Fp8Format::kE5M2}, "tensorwise hybrid"});
}

TEST(Fp8Linear, BlockwiseGemmsUseTilesOfTheOperandsAndOfTheirTransposedCopies) {
  check_linear({Fp8Recipe{.scaling = Scaling::kBlockwise}, "blockwise e4m3"});
  check_linear({Fp8Recipe{.scaling = Scaling::kBlockwise, .backward_format = Fp8Format::kE5M2}, "blockwise hybrid"});
}

TEST(Fp8Linear, DelayedScalingStartsAtScaleOne) {
  check_linear({Fp8Recipe{.scaling = Scaling::kDelayed, .backward_format = Fp8Format::kE5M2}, "delayed hybrid"});
}

// Two projections reading one input through one LinearSaved (as q and k_proj do) give what each gives alone, bit for
// bit; the codes the first forward keeps are what the backwards read (x overwritten after the forwards leaves the
// weight gradients unchanged); another input handed the same LinearSaved is quantised afresh.
void check_shared_input(const Fp8Recipe& recipe, const std::string& label) {
  SCOPED_TRACE(label);
  const int64_t n = 40, in = 160, out = 64;
  const std::vector<float> x = random_values(n * in, 11, 1.5f), other = random_values(n * in, 12, 0.7f);
  struct Module {
    Tensor weight, dweight;
    std::unique_ptr<Fp8Linear> linear;
  };
  // One pair of modules sharing a LinearSaved, one pair run alone: the same weights, their own gradients and state.
  auto make = [&](const std::shared_ptr<Fp8Scaling>& scaling, const std::string& proj, uint64_t seed) {
    Module m{host_tensor(random_values(out * in, seed, 0.05f), {out, in}), Tensor::zeros({out, in}, DType::kF32), {}};
    m.linear = std::make_unique<Fp8Linear>(Linear(m.weight, m.dweight), scaling, "model.layers.0.self_attn." + proj,
                                           "model.layers.0.self_attn.q_proj.input");
    return m;
  };
  auto shared_scaling = std::make_shared<Fp8Scaling>(recipe, kCpuDevice);
  auto alone_scaling = std::make_shared<Fp8Scaling>(recipe, kCpuDevice);
  Module q = make(shared_scaling, "q_proj", 21), k = make(shared_scaling, "k_proj", 22);
  Module q_alone = make(alone_scaling, "q_proj", 21), k_alone = make(alone_scaling, "k_proj", 22);
  const std::vector<float> dy_q = random_values(n * out, 31, 1e-3f), dy_k = random_values(n * out, 32, 1e-3f);

  Tensor shared_x = host_tensor(x, {n, in});
  LinearSaved saved;
  const Tensor yq = q.linear->forward(shared_x, &saved);
  ASSERT_NE(saved.forward_only, nullptr);
  ASSERT_NE(saved.for_backward, nullptr);
  const Tensor yk = k.linear->forward(shared_x, &saved);
  saved.end_forward();
  EXPECT_EQ(values_of(yq), values_of(q_alone.linear->forward(host_tensor(x, {n, in}))));
  EXPECT_EQ(values_of(yk), values_of(k_alone.linear->forward(host_tensor(x, {n, in}))));

  std::copy(other.begin(), other.end(), shared_x.f32());  // the backwards must not read x again
  Tensor dx, dx_alone;
  q.linear->backward(shared_x, host_tensor(dy_q, {n, out}), dx, &saved);
  k.linear->backward(shared_x, host_tensor(dy_k, {n, out}), dx, &saved);
  q_alone.linear->backward(host_tensor(x, {n, in}), host_tensor(dy_q, {n, out}), dx_alone);
  k_alone.linear->backward(host_tensor(x, {n, in}), host_tensor(dy_k, {n, out}), dx_alone);
  EXPECT_EQ(values_of(q.dweight), values_of(q_alone.dweight));
  EXPECT_EQ(values_of(k.dweight), values_of(k_alone.dweight));
  EXPECT_EQ(values_of(dx), values_of(dx_alone));

  // A LinearSaved holding x's codes, handed another input: that input's own codes.
  LinearSaved stale;
  q.linear->forward(host_tensor(x, {n, in}), &stale);
  EXPECT_EQ(values_of(k.linear->forward(host_tensor(other, {n, in}), &stale)),
            values_of(k_alone.linear->forward(host_tensor(other, {n, in}))));
}

TEST(Fp8Linear, ProjectionsSharingAnInputQuantiseItOnceAndBackwardReadsTheForwardsCodes) {
  check_shared_input(Fp8Recipe{.scaling = Scaling::kTensorwise, .backward_format = Fp8Format::kE5M2}, "tensorwise");
  check_shared_input(Fp8Recipe{.scaling = Scaling::kBlockwise, .backward_format = Fp8Format::kE5M2}, "blockwise");
  check_shared_input(Fp8Recipe{.scaling = Scaling::kDelayed, .backward_format = Fp8Format::kE5M2}, "delayed");
}

// A SwiGLU MLP on fp8 modules keeps neither its input nor the SwiGLU output in bf16 after forward (the modules' codes
// of their transposes stand in for them), and its outputs and gradients equal the same modules' run step by step
// without LinearSaved, which quantises x and the product again in backward, bit for bit. x overwritten after forward
// changes nothing. With selective recompute the product is recomputed as before; plain Linears keep their inputs.
void check_mlp_drops_inputs(const Fp8Recipe& recipe, bool recompute_act, const std::string& label) {
  SCOPED_TRACE(label + (recompute_act ? ", recompute_act" : ""));
  const int64_t n = 32, c = 128, f = 160;
  const std::vector<float> x = random_values(n * c, 51, 1.2f), dy = random_values(n * c, 52, 1e-3f);
  const std::vector<float> w_gate_up = random_values(2 * f * c, 53, 0.05f), w_down = random_values(c * f, 54, 0.05f);
  struct Modules {
    Tensor gate_up_grad = Tensor::zeros({2 * 160, 128}, DType::kF32),
           down_grad = Tensor::zeros({128, 160}, DType::kF32);
    std::unique_ptr<Linear> gate_up, down;
  };
  auto make = [&](bool fp8) {
    Modules m;
    const Linear gate_up(host_tensor(w_gate_up, {2 * f, c}), m.gate_up_grad),
        down(host_tensor(w_down, {c, f}), m.down_grad);
    if (!fp8) {
      m.gate_up = std::make_unique<Linear>(gate_up);
      m.down = std::make_unique<Linear>(down);
      return m;
    }
    auto scaling = std::make_shared<Fp8Scaling>(recipe, kCpuDevice);
    m.gate_up = std::make_unique<Fp8Linear>(gate_up, scaling, "model.layers.0.mlp.gate_up_proj");
    m.down = std::make_unique<Fp8Linear>(down, scaling, "model.layers.0.mlp.down_proj");
    return m;
  };

  Modules layer_modules = make(true);
  SwiGluMlp mlp{std::move(layer_modules.gate_up), std::move(layer_modules.down), recompute_act};
  Tensor layer_x = host_tensor(x, {n, c});
  MlpSaved saved;
  const Tensor y = mlp.forward(layer_x, saved);
  EXPECT_FALSE(saved.input.defined()) << "the input kept in bf16 beside its codes";
  EXPECT_FALSE(saved.act.defined()) << "the SwiGLU output kept in bf16";
  EXPECT_TRUE(saved.gate_up.defined());
  std::fill(layer_x.f32(), layer_x.f32() + layer_x.numel(), 1e6f);  // backward must not read it
  const Tensor dx = mlp.backward(host_tensor(dy, {n, c}), saved);

  // The same modules step by step, no LinearSaved: every backward quantises its input again from the values.
  Modules alone = make(true);
  const Tensor ax = host_tensor(x, {n, c});
  const Tensor gate_up = alone.gate_up->forward(ax);
  Tensor act = Tensor::empty({n, f}, DType::kF32);
  ops::swiglu_forward(gate_up, act);
  EXPECT_EQ(values_of(y), values_of(alone.down->forward(act)));
  Tensor dact, dx_alone;
  alone.down->backward(act, host_tensor(dy, {n, c}), dact);
  Tensor dgate_up = Tensor::empty(gate_up.shape(), DType::kF32);
  ops::swiglu_backward(gate_up, dact, dgate_up);
  alone.gate_up->backward(ax, dgate_up, dx_alone);
  EXPECT_EQ(values_of(dx), values_of(dx_alone));
  EXPECT_EQ(values_of(layer_modules.gate_up_grad), values_of(alone.gate_up_grad));
  EXPECT_EQ(values_of(layer_modules.down_grad), values_of(alone.down_grad));

  Modules plain = make(false);
  SwiGluMlp plain_mlp{std::move(plain.gate_up), std::move(plain.down), recompute_act};
  MlpSaved plain_saved;
  plain_mlp.forward(host_tensor(x, {n, c}), plain_saved);
  EXPECT_TRUE(plain_saved.input.defined());
  EXPECT_EQ(plain_saved.act.defined(), !recompute_act);
}

TEST(Fp8Linear, AnMlpKeepsItsInputsOnlyAsCodes) {
  for (const bool recompute_act : {false, true}) {
    check_mlp_drops_inputs(Fp8Recipe{.scaling = Scaling::kTensorwise, .backward_format = Fp8Format::kE5M2},
                           recompute_act, "tensorwise");
    check_mlp_drops_inputs(Fp8Recipe{.scaling = Scaling::kBlockwise, .backward_format = Fp8Format::kE5M2},
                           recompute_act, "blockwise");
    check_mlp_drops_inputs(Fp8Recipe{.scaling = Scaling::kDelayed, .backward_format = Fp8Format::kE5M2}, recompute_act,
                           "delayed");
  }
}

// Attention on fp8 modules keeps its input only as q/k/v's codes, while o_proj's input (the attention output, which
// attention's backward reads) stays: saved.input is gone after forward, and x overwritten then changes no gradient.
TEST(Fp8Linear, AttentionKeepsItsInputOnlyAsCodes) {
  const int64_t batch = 2, seq = 16, c = 128, heads = 4, kv_heads = 2, d = 32;
  const std::vector<float> x = random_values(batch * seq * c, 61, 1.0f), dy = random_values(batch * seq * c, 62, 1e-3f);
  struct Run {
    std::vector<Tensor> grads;
    Tensor dx;
  };
  auto run = [&](bool overwrite_x) {
    auto scaling = std::make_shared<Fp8Scaling>(Fp8Recipe{.scaling = Scaling::kTensorwise}, kCpuDevice);
    Run r;
    auto module = [&](const std::string& proj, int64_t out, int64_t in, uint64_t seed) {
      r.grads.push_back(Tensor::zeros({out, in}, DType::kF32));
      const Linear plain(host_tensor(random_values(out * in, seed, 0.05f), {out, in}), r.grads.back());
      return std::make_unique<Fp8Linear>(plain, scaling, "model.layers.0.self_attn." + proj,
                                         "model.layers.0.self_attn.q_proj.input");
    };
    Attention attention;
    attention.q_proj = module("q_proj", heads * d, c, 63);
    attention.k_proj = module("k_proj", kv_heads * d, c, 64);
    attention.v_proj = module("v_proj", kv_heads * d, c, 65);
    r.grads.push_back(Tensor::zeros({c, heads * d}, DType::kF32));
    attention.o_proj = std::make_unique<Fp8Linear>(
        Linear(host_tensor(random_values(c * heads * d, 66, 0.05f), {c, heads * d}), r.grads.back()), scaling,
        "model.layers.0.self_attn.o_proj");
    attention.heads = heads;
    attention.kv_heads = kv_heads;
    attention.head_dim = d;
    const RopeTable rope = make_rope_table(d, seq, RopeConfig{});
    Tensor input = host_tensor(x, {batch * seq, c});
    AttentionSaved saved;
    attention.forward(input, batch, rope, PackedSequence{}, saved);
    EXPECT_FALSE(saved.input.defined()) << "the input kept in bf16 beside its codes";
    EXPECT_TRUE(saved.qkv_input.input_dropped);
    EXPECT_FALSE(saved.o_input.input_dropped) << "the attention output is attention's backward's too";
    EXPECT_TRUE(saved.out.defined());
    if (overwrite_x) std::fill(input.f32(), input.f32() + input.numel(), 1e6f);
    r.dx = attention.backward(host_tensor(dy, {batch * seq, c}), rope, PackedSequence{}, saved);
    return r;
  };
  const Run kept = run(false), overwritten = run(true);
  EXPECT_EQ(values_of(overwritten.dx), values_of(kept.dx));
  for (size_t i = 0; i < kept.grads.size(); ++i) {
    EXPECT_EQ(values_of(overwritten.grads[i]), values_of(kept.grads[i])) << "gradient " << i;
  }
}

// W's codes are made at the first forward of a step and serve its micro-batches until the step ends: the weights
// changed in place (as the optimizer changes them) are seen only after end_step, and then exactly.
TEST(Fp8Linear, WeightCodesLastUntilTheStepEnds) {
  for (const Scaling recipe : {Scaling::kTensorwise, Scaling::kDelayed, Scaling::kBlockwise}) {
    SCOPED_TRACE(static_cast<int>(recipe));
    const int64_t n = 24, in = 128, out = 32;
    const std::vector<float> x = random_values(n * in, 41, 1.0f), w = random_values(out * in, 42, 0.05f),
                             w_next = random_values(out * in, 43, 0.08f);
    Tensor weight = host_tensor(w, {out, in});
    auto scaling = std::make_shared<Fp8Scaling>(Fp8Recipe{.scaling = recipe}, kCpuDevice);
    Fp8Linear linear(Linear(weight, Tensor::zeros({out, in}, DType::kF32)), scaling, "model.layers.0.mlp.down_proj");
    const std::vector<float> first = values_of(linear.forward(host_tensor(x, {n, in})));
    std::copy(w_next.begin(), w_next.end(), weight.f32());
    EXPECT_EQ(values_of(linear.forward(host_tensor(x, {n, in}))), first) << "within the step";
    scaling->end_step({});
    // The next step against a module made on the new weights, whose (delayed) scales have moved on the same way.
    auto fresh_scaling = std::make_shared<Fp8Scaling>(Fp8Recipe{.scaling = recipe}, kCpuDevice);
    Fp8Linear fresh(Linear(host_tensor(w, {out, in}), Tensor::zeros({out, in}, DType::kF32)), fresh_scaling,
                    "model.layers.0.mlp.down_proj");
    fresh.forward(host_tensor(x, {n, in}));
    fresh_scaling->end_step({});
    std::copy(w_next.begin(), w_next.end(), fresh.weight().f32());
    const std::vector<float> next = values_of(linear.forward(host_tensor(x, {n, in})));
    EXPECT_NE(next, first);
    EXPECT_EQ(next, values_of(fresh.forward(host_tensor(x, {n, in})))) << "after end_step";
  }
}

// The device state of the delayed recipe against Fp8AmaxHistory, the host model of one tensor's window: several
// steps of two micro-batches each, amaxes of several magnitudes, a NaN in one step; then the state through records()
// and restore() into a fresh one continues identically.
TEST(Fp8Scaling, DelayedStateFollowsTheHostHistoryAndSurvivesACheckpoint) {
  for (const Fp8AmaxAlgo algo : {Fp8AmaxAlgo::kMax, Fp8AmaxAlgo::kMostRecent}) {
    SCOPED_TRACE(algo == Fp8AmaxAlgo::kMax ? "max" : "most_recent");
    const Fp8Recipe recipe{.scaling = Scaling::kDelayed,
                           .backward_format = Fp8Format::kE5M2,
                           .margin = 1,
                           .amax_history_len = 3,
                           .amax_algo = algo};
    const std::vector<Fp8Role> roles{Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGradOutput};
    auto make = [&]() {
      auto s = std::make_unique<Fp8Scaling>(recipe, kCpuDevice);
      for (size_t i = 0; i < roles.size(); ++i) s->add_tensor(fmt::format("t{}", i), roles[i]);
      return s;
    };
    std::unique_ptr<Fp8Scaling> scaling = make();
    std::vector<Fp8AmaxHistory> model(roles.size(), Fp8AmaxHistory(recipe.amax_history_len, algo));
    std::vector<float> scale(roles.size(), 1.0f);
    std::unique_ptr<Fp8Scaling> resumed;
    for (int step = 0; step < 7; ++step) {
      if (step == 4) {  // checkpoint and resume
        resumed = make();
        resumed->restore(scaling->records());
        scaling = std::move(resumed);
      }
      for (size_t i = 0; i < roles.size(); ++i) {
        for (int micro = 0; micro < 2; ++micro) {
          std::vector<float> x = random_values(40, 100 * step + 10 * i + micro, std::ldexp(1.0f, step - 3 * micro));
          if (step == 2 && i == 1 && micro == 1) x[7] = std::nanf("");
          float amax = 0.0f;
          for (const float v : x) amax = std::isnan(v) || std::isnan(amax) ? NAN : std::max(amax, std::fabs(v));
          model[i].record(amax);
          scaling->record_amax(static_cast<int>(i), host_tensor(x, {5, 8}));
        }
      }
      scaling->end_step({});
      for (size_t i = 0; i < roles.size(); ++i) {
        const Fp8Format format = i == 2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
        scale[i] = fp8_scale_from_amax(model[i].roll(), fp8_info(format).max_finite, 1, scale[i]).scale;
        EXPECT_EQ(scaling->scale(static_cast<int>(i)).f32()[0], scale[i]) << "step " << step << " tensor " << i;
        EXPECT_EQ(scaling->scale_inv(static_cast<int>(i)).f32()[0], 1.0f / scale[i]);
      }
      // The NaN is counted once, at the end of its step, and again while it stays in a max window.
      const int64_t non_finite = scaling->take_non_finite();
      const bool nan_in_window = algo == Fp8AmaxAlgo::kMax ? step >= 2 && step <= 4 : step == 2;
      EXPECT_EQ(non_finite, nan_in_window ? 1 : 0) << "step " << step;
    }
  }
}

TEST(Fp8Scaling, RestoreRefusesAnotherModelOrWindow) {
  const Fp8Recipe recipe{.scaling = Scaling::kDelayed, .amax_history_len = 2};
  Fp8Scaling a(recipe, kCpuDevice);
  a.add_tensor("x", Fp8Role::kInput);
  std::vector<Fp8ScalingRecord> records = a.records();
  records[0].name = "y";
  EXPECT_THROW(a.restore(records), RuntimeError);
  records[0].name = "x";
  records[0].amax_history.push_back(1.0f);
  try {
    a.restore(records);
    ADD_FAILURE() << "a window of 3 restored into one of 2";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_amax_history_len"), std::string::npos) << e.what();
  }
}

// ---- whole runs ----

class Fp8Training : public ::testing::Test {
 protected:
  void SetUp() override { setenv("PRIMUS_FP8_CPU_REFERENCE", "1", 1); }
  void TearDown() override { unsetenv("PRIMUS_FP8_CPU_REFERENCE"); }
};

// testing::shakespeare_experiment, wider (hidden 128) with `layers` layers and a shorter schedule.
ExperimentConfig shakespeare_config(const std::string& workspace, int64_t iters, int64_t layers) {
  ExperimentConfig c = testing::shakespeare_experiment(workspace, iters);
  c.exp_name = "fp8";
  c.model.num_layers = layers;
  c.model.hidden_size = 128;
  c.model.ffn_hidden_size = 256;
  c.model.kv_channels = 32;
  c.train.device = "cpu";
  c.train.lr_warmup_iters = 5;
  c.train.lr_decay_iters = 60;
  return c;
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

// Each step's loss within 1% of the fp32 run's while the loss falls by 40% (a tiny model's later steps, on its
// plateau, wander too much between any two runs to compare).
TEST_F(Fp8Training, EachRecipeFollowsTheFp32LossCurveWithinOnePerCent) {
  const std::string root = testing::temp_dir("fp8_recipes");
  const int64_t iters = 12;
  ExperimentConfig plain = shakespeare_config(root + "/fp32", iters, 2);
  ASSERT_EQ(run_pretrain(plain, {}), 0);
  const std::vector<double> reference = losses(plain.run_dir());
  ASSERT_LT(reference.back(), 0.6 * reference.front());
  for (const auto& [format, recipe] : {std::pair{"hybrid", "delayed"}, std::pair{"hybrid", "tensorwise"},
                                       std::pair{"e4m3", "blockwise"}}) {
    SCOPED_TRACE(std::string(format) + " " + recipe);
    ExperimentConfig c = shakespeare_config(root + "/" + recipe, iters, 2);
    c.train.fp8_format = format;
    c.train.fp8_recipe = recipe;
    if (std::string(recipe) == "delayed") {
      c.train.fp8_amax_history_len = 4;
      c.train.fp8_amax_compute_algo = "max";
    }
    ASSERT_EQ(run_pretrain(c, {}), 0);
    const std::vector<double> fp8 = losses(c.run_dir());
    ASSERT_EQ(fp8.size(), reference.size());
    EXPECT_NE(fp8, reference) << "fp8 changed nothing";
    for (size_t i = 0; i < fp8.size(); ++i) EXPECT_NEAR(fp8[i], reference[i], 0.01 * reference[i]) << "step " << i + 1;
  }
}

TEST_F(Fp8Training, ResumedDelayedScalingRunRepeatsTheUninterruptedOneBitForBit) {
  const std::string root = testing::temp_dir("fp8_resume");
  auto config = [&](const std::string& name, int64_t iters) {
    ExperimentConfig c = shakespeare_config(root + "/" + name, iters, 2);
    c.train.fp8_format = "hybrid";
    c.train.fp8_recipe = "delayed";
    c.train.fp8_amax_history_len = 3;
    c.train.fp8_amax_compute_algo = "max";
    c.train.lr_decay_iters = 12;
    return c;
  };
  ExperimentConfig whole = config("whole", 12);
  ASSERT_EQ(run_pretrain(whole, {}), 0);
  ExperimentConfig part = config("part", 7);
  ASSERT_EQ(run_pretrain(part, {}), 0);
  // The checkpoint holds every quantised tensor's window: 2 layers × 6 modules × (input, weight, gradient), less the
  // inputs k_proj and v_proj share with q_proj.
  const nlohmann::json state =
      nlohmann::json::parse(read_file(part.run_dir() + "/checkpoints/iter_0000007/trainer_state.json"));
  ASSERT_TRUE(state.contains("fp8_scaling"));
  EXPECT_EQ(state["fp8_scaling"].size(), 2u * (6u * 3u - 2u));
  EXPECT_EQ(state["fp8_scaling"][0]["amax_history"].size(), 3u);
  part.train.train_iters = 12;
  ASSERT_EQ(run_pretrain(part, {}), 0);
  const std::vector<double> a = losses(whole.run_dir()), b = losses(part.run_dir());
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

TEST_F(Fp8Training, FirstAndLastLayersInBf16KeepTheirModules) {
  const std::string root = testing::temp_dir("fp8_first_last");
  ExperimentConfig c = shakespeare_config(root, 1, 4);
  c.train.fp8_format = "e4m3";
  c.train.first_last_layers_bf16 = true;
  c.train.num_layers_at_start_in_bf16 = 1;
  c.train.num_layers_at_end_in_bf16 = 2;
  ASSERT_EQ(run_pretrain(c, {}), 0);
  const nlohmann::json state =
      nlohmann::json::parse(read_file(c.run_dir() + "/checkpoints/iter_0000001/trainer_state.json"));
  ASSERT_TRUE(state.contains("fp8_scaling"));
  ASSERT_EQ(state["fp8_scaling"].size(), 6u * 3u - 2u);  // layer 1 only (k and v_proj read q_proj's input)
  for (const auto& record : state["fp8_scaling"]) {
    EXPECT_EQ(record["name"].get<std::string>().rfind("model.layers.1.", 0), 0u) << record["name"];
  }
}

TEST_F(Fp8Training, LayoutsNotYetCombinedExitTwoNamingTheKey) {
  // The layout's key and the fp8 key to change: blockwise tiles under tensor or context parallelism, FSDP.
  for (const auto& [key, fp8_key, recipe, set] :
       std::vector<std::tuple<std::string, std::string, std::string, std::function<void(TrainingArgs&)>>>{
           {"tensor_model_parallel_size", "fp8_recipe", "blockwise",
            [](TrainingArgs& t) { t.tensor_model_parallel_size = 2; }},
           {"context_parallel_size", "fp8_recipe", "blockwise", [](TrainingArgs& t) { t.context_parallel_size = 2; }},
           {"use_megatron_fsdp", "fp8_format", "tensorwise", [](TrainingArgs& t) { t.use_megatron_fsdp = true; }}}) {
    TrainingArgs t;
    t.fp8_format = "hybrid";
    t.fp8_recipe = recipe;
    set(t);
    try {
      compute_dtype(t, kCpuDevice);
      ADD_FAILURE() << key << " accepted with fp8";
    } catch (const UsageError& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage);
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fp8_key), std::string::npos) << e.what();
    }
  }
  // Pipeline stages hold whole layers, ep splits the bf16 experts, tp's and cp's amaxes are combined:
  // fp8_parallel_test.cpp.
  for (const std::string recipe : {"delayed", "tensorwise"}) {
    TrainingArgs accepted;
    accepted.fp8_format = "hybrid";
    accepted.fp8_recipe = recipe;
    accepted.pipeline_model_parallel_size = 2;
    accepted.expert_model_parallel_size = 2;
    accepted.context_parallel_size = 2;
    accepted.tensor_model_parallel_size = 2;
    EXPECT_EQ(fp8_layout_refusal(accepted), "") << recipe;
  }
}

}  // namespace
}  // namespace primus
