// Expert parallelism at the model: P forked CPU ranks over Gloo each build the expert-parallel model (its E / P
// experts of every MoE layer, the all-to-all dispatcher) and, beside it, the whole model from the same seed. Each rank
// trains on its own fresh random tokens. Then on every rank: the expert-parallel model holds exactly the whole
// model's weights of its experts, its loss equals the whole model's on the same tokens, its non-expert gradients equal
// the whole model's, and its experts' gradients equal the sum over the ranks of the whole model's gradients of those
// experts (the rows of every rank's tokens reached them); evaluation losses and next-token logits agree too. Tiny
// batches make some ranks receive no rows at all for some experts, or none at all. With an expert capacity each rank
// drops over its own tokens, as the whole model does over the same tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>

#include "core/rng.h"
#include "models/model.h"
#include "ops/ops.h"
#include "support/cpu_ranks.h"
#include "support/multiprocess.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

using namespace std::chrono_literals;

// "" when a and b agree within fp32 rounding of sums in another order, else what differs.
std::string compare(const std::string& what, const float* a, const float* b, int64_t n) {
  double worst = 0.0, scale = 1e-30;
  for (int64_t k = 0; k < n; ++k) {
    worst = std::max(worst, std::abs(static_cast<double>(a[k]) - b[k]));
    scale = std::max(scale, std::abs(static_cast<double>(a[k])));
  }
  if (worst <= 2e-5 * scale + 1e-7) return "";
  return fmt::format("{}: differs by {:.3g} (largest value {:.3g}); ", what, worst, scale);
}

// Whether a parameter of the expert-parallel model is one of its experts (its gradient holds every rank's rows).
bool is_expert(const Model& model, size_t i) {
  const int64_t offset = model.params().offset(i);
  for (const FlatRange& r : model.expert_ranges()) {
    if (offset >= r.begin && offset < r.end) return true;
  }
  return false;
}

std::string check_rank(const ModelArgs& args, int rank, int ep, int64_t batch, int64_t seq, int port,
                       uint64_t seed) {
  std::shared_ptr<Communicator> group = testing::join_cpu_world(rank, ep, port, 20s);
  const std::unique_ptr<Model> whole = make_model(args, seq);
  ModelParallel parallel;
  parallel.ep = ExpertParallelGroup(group);
  const std::unique_ptr<Model> part = make_model(args, seq, kCpuDevice, DType::kF32, parallel);
  whole->params().initialize(seed);
  part->params().initialize(seed);
  std::string errors;
  const std::vector<ParamSpec>& specs = part->params().specs();
  if (part->expert_ranges().empty()) errors += "no expert ranges; ";
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor want = whole->params().param(specs[i].name);
    errors += compare(specs[i].name + " (initial weight)", want.f32(), part->params().param(i).f32(), want.numel());
  }
  // This rank's own tokens (fresh for every run, different on every rank).
  Rng rng(seed + 1000003ull * static_cast<uint64_t>(rank + 1));
  const Tensor tokens = testing::random_ids({batch, seq}, args.vocab_size, rng);
  const Tensor labels = testing::random_ids({batch, seq}, args.vocab_size, rng);
  const float grad_scale = 1.0f / static_cast<float>(batch * seq * ep);
  for (Model* m : {whole.get(), part.get()}) m->params().zero_grads();
  const LossSum w = testing::train_micro_batch(*whole, tokens, labels, grad_scale);
  const LossSum p = testing::train_micro_batch(*part, tokens, labels, grad_scale);
  const float wl = static_cast<float>(w.loss_sum), pl = static_cast<float>(p.loss_sum);
  errors += compare("training loss", &wl, &pl, 1);
  // The whole model's gradients of every rank's tokens, summed: what the experts' gradients must hold.
  Tensor summed = ops::to_device(whole->params().flat_grads(), kCpuDevice);
  group->all_reduce(summed, ReduceOp::kSum);
  for (size_t i = 0; i < specs.size(); ++i) {
    const size_t j = whole->params().index_of(specs[i].name);
    const Tensor want = is_expert(*part, i) ? summed.slice_elements(whole->params().offset(j), specs[i].shape)
                                            : whole->params().grad(j);
    errors += compare(specs[i].name + " (gradient)", want.f32(), part->params().grad(i).f32(), want.numel());
  }
  const LossSum we = whole->evaluate(tokens, labels), pe = part->evaluate(tokens, labels);
  const float wel = static_cast<float>(we.loss_sum), pel = static_cast<float>(pe.loss_sum);
  errors += compare("evaluation loss", &wel, &pel, 1);
  const std::vector<int32_t> context(tokens.i32(), tokens.i32() + std::min<int64_t>(seq, 5));
  const std::vector<float> wlog = whole->next_token_logits(context), plog = part->next_token_logits(context);
  if (plog.size() != wlog.size()) return errors + fmt::format("{} logits, not {}", plog.size(), wlog.size());
  errors += compare("next-token logits", wlog.data(), plog.data(), static_cast<int64_t>(wlog.size()));
  return errors;
}

void check_layout(const ModelArgs& args, int ep, int64_t batch, int64_t seq) {
  const uint64_t seed = std::random_device{}();
  const int port = testing::free_port();
  const auto results = testing::run_ranks(
      ep, 120s, [&](int rank) { return check_rank(args, rank, ep, batch, seq, port, seed); },
      /*status_if_message=*/2);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].status, 0) << "rank " << rank << " of ep " << ep << ", batch " << batch << " x " << seq
                                       << " (seed " << seed << "): " << results[rank].message;
  }
}

// Mixtral's names: 4 experts, top 2, the second layer dense.
ModelArgs mixtral_args() {
  ModelArgs a = testing::tiny_llama_args();
  a.num_experts = 4;
  a.moe_router_topk = 2;
  a.moe_ffn_hidden_size = 24;
  a.moe_layer_freq = {1, 0};
  return a;
}

// Qwen3-MoE's names: 8 experts, top 2, a shared expert, with the balancing losses (each rank's own, as on one rank).
ModelArgs qwen3_moe_args() {
  ModelArgs a = testing::tiny_qwen3_args();
  a.num_experts = 8;
  a.moe_router_topk = 2;
  a.moe_ffn_hidden_size = 16;
  a.moe_shared_expert_intermediate_size = 20;
  a.moe_aux_loss_coeff = 0.01;
  a.moe_z_loss_coeff = 0.001;
  return a;
}

// An expert capacity (Megatron's alltoall dispatcher: each rank drops over its own tokens before the all-to-all, so
// the exchanged counts are the kept ones): factor 0.5 drops about half of every rank's routing entries.
ModelArgs with_capacity(ModelArgs a, const std::string& policy, bool pad) {
  a.moe_expert_capacity_factor = 0.5;
  a.moe_token_drop_policy = policy;
  a.moe_pad_expert_input_to_capacity = pad;
  return a;
}

TEST(ExpertParallelModel, MixtralOnTwoRanksEqualsOneRank) { check_layout(mixtral_args(), 2, 2, 12); }

TEST(ExpertParallelModel, CapacityOnTwoRanksEqualsOneRank) {
  check_layout(with_capacity(mixtral_args(), "probs", false), 2, 2, 12);
  check_layout(with_capacity(mixtral_args(), "position", true), 2, 2, 12);
}

// Padded to capacity over 4 ranks (each local expert pads to 4 × the per-rank capacity), with the sequence-level aux
// loss (each rank's own sequences).
TEST(ExpertParallelModel, PaddedCapacityAndSequenceAuxLossOnFourRanksEqualOneRank) {
  ModelArgs a = with_capacity(qwen3_moe_args(), "probs", true);
  a.moe_router_load_balancing_type = "seq_aux_loss";
  check_layout(a, 4, 2, 9);
}

TEST(ExpertParallelModel, Qwen3MoeOnFourRanksEqualsOneRank) { check_layout(qwen3_moe_args(), 4, 2, 9); }

// One token a rank: 2 of 8 experts per layer each, so most ranks' experts receive nothing from some ranks, and some
// ranks receive no rows at all.
TEST(ExpertParallelModel, RanksWithoutRowsStillAgree) {
  check_layout(qwen3_moe_args(), 4, 1, 1);
  check_layout(mixtral_args(), 2, 1, 1);
}

}  // namespace
}  // namespace primus
