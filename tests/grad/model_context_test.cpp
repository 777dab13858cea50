// The Model seams: per-micro-batch contexts (several forwards in flight, backwards in any order, as a pipeline
// stage runs them), the family factory, and the Linear modules code outside the model can find and wrap.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include <fmt/format.h>

#include "models/model.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

using G = RecomputeConfig::Granularity;

// A tiny model with well-conditioned weights (the 0.02 init plus N(0, 0.3²)), the same for every call.
std::unique_ptr<Model> tiny_model(const ModelArgs& args, int64_t max_seq, const RecomputeConfig& recompute = {}) {
  std::unique_ptr<Model> model = make_model(args, max_seq);
  model->params().initialize(41);
  Rng rng(42);
  float* p = model->params().flat_params().f32();
  for (int64_t i = 0; i < model->params().numel(); ++i) p[i] += static_cast<float>(rng.normal() * 0.3);
  model->set_recompute(recompute);
  return model;
}

struct MicroBatch {
  Tensor tokens, labels;  // [B, T]
  PackedSequence packed;
};

// A: two plain rows of 6 tokens. B: one row of 5 tokens holding two packed documents, [0, 2) and [2, 5).
std::pair<MicroBatch, MicroBatch> two_micro_batches(int64_t vocab) {
  Rng rng(43);
  MicroBatch a{testing::random_ids({2, 6}, vocab, rng), testing::random_ids({2, 6}, vocab, rng), {}};
  MicroBatch b{testing::random_ids({1, 5}, vocab, rng), testing::random_ids({1, 5}, vocab, rng), {}};
  a.labels.i32()[4] = -1;
  b.packed.position_ids = Tensor::empty({1, 5}, DType::kI32);
  b.packed.segment_start = Tensor::empty({1, 5}, DType::kI32);
  const int32_t positions[] = {0, 1, 0, 1, 2}, starts[] = {0, 0, 2, 2, 2};
  std::memcpy(b.packed.position_ids.i32(), positions, sizeof(positions));
  std::memcpy(b.packed.segment_start.i32(), starts, sizeof(starts));
  return {a, b};
}

struct Run {
  float loss_sum = 0.0f;
  Tensor grads;  // flat, host
};

Run gradients_of(Model& model) {
  Run r{0.0f, Tensor::empty({model.params().numel()}, DType::kF32)};
  r.grads.copy_from(model.params().flat_grads());
  return r;
}

// The grads_ready ranges of one backward, checked to be disjoint, reported top down, and to cover the buffer.
void expect_ranges_cover(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t numel) {
  int64_t end = numel;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(e, end);
    EXPECT_LT(b, e);
    end = b;
  }
  EXPECT_EQ(end, 0);
}

void expect_interleaved_equals_sequential(const ModelArgs& args, const RecomputeConfig& recompute) {
  const std::string what = fmt::format("granularity {} block {} layers {}", static_cast<int>(recompute.granularity),
                                       recompute.block, recompute.num_layers);
  const auto [a, b] = two_micro_batches(args.vocab_size);
  const float scale = 1.0f / 16.0f;

  std::unique_ptr<Model> sequential = tiny_model(args, 8, recompute);
  sequential->params().zero_grads();
  Tensor loss_seq = Tensor::zeros({1}, DType::kF32);
  for (const MicroBatch* m : {&a, &b}) {
    std::unique_ptr<MicroBatchContext> ctx = sequential->forward(m->tokens, m->labels, scale, loss_seq, m->packed);
    sequential->backward(*ctx);
  }
  const Run want = gradients_of(*sequential);

  // Forward A, forward B, backward B, backward A: both contexts alive at once, the backwards in reverse order.
  std::unique_ptr<Model> interleaved = tiny_model(args, 8, recompute);
  interleaved->params().zero_grads();
  Tensor loss_int = Tensor::zeros({1}, DType::kF32);
  std::unique_ptr<MicroBatchContext> ctx_a = interleaved->forward(a.tokens, a.labels, scale, loss_int, a.packed);
  std::unique_ptr<MicroBatchContext> ctx_b = interleaved->forward(b.tokens, b.labels, scale, loss_int, b.packed);
  std::vector<std::pair<int64_t, int64_t>> ranges_b, ranges_a;
  interleaved->backward(*ctx_b, [&](int64_t begin, int64_t end) { ranges_b.emplace_back(begin, end); });
  interleaved->backward(*ctx_a, [&](int64_t begin, int64_t end) { ranges_a.emplace_back(begin, end); });
  const Run got = gradients_of(*interleaved);

  EXPECT_EQ(loss_int.f32()[0], loss_seq.f32()[0]) << what;  // the same forwards in the same order
  // Each gradient element sums the same two contributions, in the other order: equal to fp32 rounding.
  EXPECT_LE(testing::relative_error(got.grads, want.grads), 1e-6) << what;
  expect_ranges_cover(ranges_b, interleaved->params().numel());
  expect_ranges_cover(ranges_a, interleaved->params().numel());
}

TEST(ModelContext, MicroBatchesInFlightGiveTheSequentialGradients) {
  ModelArgs args = testing::tiny_qwen3_args();
  args.num_layers = 3;
  const RecomputeConfig modes[] = {{}, {G::kFull, false, 2}, {G::kFull, true, 1}, {G::kSelective, false, 1}};
  for (const RecomputeConfig& mode : modes) expect_interleaved_equals_sequential(args, mode);
  expect_interleaved_equals_sequential(testing::tiny_llama_args(), {});
}

// Multi-head latent attention (with MoE layers) under full recompute: the contexts in flight give the sequential
// gradients, and recomputing gives the gradients of keeping every activation, bit for bit (the same ops again).
TEST(ModelContext, LatentAttentionRecomputesExactly) {
  const ModelArgs args = testing::tiny_deepseek_args(true, true, true);
  expect_interleaved_equals_sequential(args, {G::kFull, false, 2});
  const auto [a, b] = two_micro_batches(args.vocab_size);
  std::vector<Tensor> grads;  // without, then with recompute
  for (const RecomputeConfig& mode : {RecomputeConfig{}, RecomputeConfig{G::kFull, true, 2}}) {
    std::unique_ptr<Model> model = tiny_model(args, 8, mode);
    model->params().zero_grads();
    Tensor loss = Tensor::zeros({1}, DType::kF32);
    for (const MicroBatch* m : {&a, &b}) {
      std::unique_ptr<MicroBatchContext> ctx = model->forward(m->tokens, m->labels, 1.0f / 16.0f, loss, m->packed);
      model->backward(*ctx);
    }
    grads.push_back(gradients_of(*model).grads);
  }
  EXPECT_EQ(testing::relative_error(grads[0], grads[1]), 0.0);
}

// A context keeps the recompute setting its forward ran with, whatever is set before its backward.
TEST(ModelContext, ContextKeepsItsRecomputeSetting) {
  const ModelArgs args = testing::tiny_llama_args();
  const auto [a, b] = two_micro_batches(args.vocab_size);
  auto grads = [&](bool switch_between) {
    std::unique_ptr<Model> model = tiny_model(args, 8, RecomputeConfig{G::kFull, false, 2});
    model->params().zero_grads();
    Tensor loss = Tensor::zeros({1}, DType::kF32);
    std::unique_ptr<MicroBatchContext> ctx = model->forward(a.tokens, a.labels, 0.1f, loss);
    if (switch_between) model->set_recompute(RecomputeConfig{G::kSelective, false, 1});
    model->backward(*ctx);
    return gradients_of(*model).grads;
  };
  EXPECT_TRUE(testing::same_bits(grads(true), grads(false)));
}

TEST(ModelContext, BackwardTwiceOrOfAnotherModelIsAnError) {
  const ModelArgs args = testing::tiny_llama_args();
  const auto [a, b] = two_micro_batches(args.vocab_size);
  std::unique_ptr<Model> model = tiny_model(args, 8);
  std::unique_ptr<Model> other = tiny_model(args, 8);
  Tensor loss = Tensor::zeros({1}, DType::kF32);
  std::unique_ptr<MicroBatchContext> ctx = model->forward(a.tokens, a.labels, 0.1f, loss);
  EXPECT_THROW(other->backward(*ctx), Error);
  model->backward(*ctx);
  EXPECT_THROW(model->backward(*ctx), Error);
}

TEST(ModelFamily, FamilyComesFromTheConfigAndUnknownOnesAreNamed) {
  EXPECT_EQ(model_family_name(testing::tiny_llama_args()), "llama");
  EXPECT_EQ(model_family_name(testing::tiny_qwen3_args()), "qwen3");
  EXPECT_EQ(make_model(testing::tiny_qwen3_args(), 8)->family(), "qwen3");
  EXPECT_EQ(make_model(testing::tiny_llama_args(), 8)->family(), "llama");
  try {
    find_model_family("deepseek_v3");
    FAIL() << "an unknown family was found";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("\"deepseek_v3\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("llama, qwen3, mixtral, qwen3_moe"), std::string::npos) << e.what();
  }
}

// Wraps a Linear, counting its calls: what LoRA or an FP8 GEMM would do from outside the model.
class CountingLinear final : public Linear {
 public:
  CountingLinear(std::unique_ptr<Linear> inner, std::map<std::string, int>& calls, std::string name)
      : Linear(inner->weight(), inner->dweight()), inner_(std::move(inner)), calls_(calls), name_(std::move(name)) {}
  Tensor forward(const Tensor& x, LinearSaved* saved = nullptr) override {
    ++calls_[name_ + " forward"];
    return inner_->forward(x, saved);
  }
  void backward(const Tensor& x, const Tensor& dy, Tensor& dx, LinearSaved* saved = nullptr) override {
    ++calls_[name_ + " backward"];
    inner_->backward(x, dy, dx, saved);
  }

 private:
  std::unique_ptr<Linear> inner_;
  std::map<std::string, int>& calls_;
  std::string name_;
};

TEST(ModelModules, LinearsAreNamedAndViewTheirParameters) {
  const ModelArgs args = testing::tiny_qwen3_args();
  std::unique_ptr<Model> model = tiny_model(args, 8);
  const ParamStore& params = model->params();
  std::vector<std::string> names;
  model->for_each_linear([&](const std::string& name, std::unique_ptr<Linear>& slot) {
    names.push_back(name);
    // gate_up_proj views gate_proj then up_proj; every other module its own parameter.
    const std::string first = name.ends_with("gate_up_proj") ? name.substr(0, name.size() - 7) + "proj" : name;
    const std::string param = first + ".weight";
    EXPECT_EQ(slot->weight().data(), params.param(param).data()) << name;
    EXPECT_EQ(slot->dweight().data(), params.grad(param).data()) << name;
  });
  ASSERT_EQ(names.size(), 6u * static_cast<size_t>(args.num_layers));
  EXPECT_EQ(names[0], "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(names[4], "model.layers.0.mlp.gate_up_proj");
  EXPECT_EQ(names[11], "model.layers.1.mlp.down_proj");
  EXPECT_EQ(model->params().param("model.layers.0.mlp.gate_proj.weight").dim(0), args.ffn_hidden_size);
}

TEST(ModelModules, WrappedLinearsRunAndChangeNoNumber) {
  const ModelArgs args = testing::tiny_qwen3_args();
  const auto [a, b] = two_micro_batches(args.vocab_size);
  auto run = [&](std::map<std::string, int>* calls) {
    std::unique_ptr<Model> model = tiny_model(args, 8, RecomputeConfig{G::kFull, false, 1});
    if (calls != nullptr) {
      model->for_each_linear([&](const std::string& name, std::unique_ptr<Linear>& slot) {
        slot = std::make_unique<CountingLinear>(std::move(slot), *calls, name);
      });
    }
    model->params().zero_grads();
    testing::train_micro_batch(*model, b.tokens, b.labels, 0.25f, b.packed);
    return gradients_of(*model).grads;
  };
  std::map<std::string, int> calls;
  const Tensor wrapped = run(&calls);
  EXPECT_TRUE(testing::same_bits(wrapped, run(nullptr)));
  EXPECT_EQ(calls.size(), 2u * 6u * static_cast<size_t>(args.num_layers));
  EXPECT_EQ(calls["model.layers.1.self_attn.q_proj forward"], 2);  // forward, then again under full recompute
  EXPECT_EQ(calls["model.layers.1.self_attn.q_proj backward"], 1);
  EXPECT_EQ(calls["model.layers.0.mlp.down_proj backward"], 1);

  std::unique_ptr<Model> model = tiny_model(args, 8);
  EXPECT_THROW(model->for_each_linear([](const std::string&, std::unique_ptr<Linear>& slot) { slot.reset(); }), Error);
}

}  // namespace
}  // namespace primus
