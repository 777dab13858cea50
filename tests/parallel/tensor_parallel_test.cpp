// Tensor parallelism at the model: N forked CPU ranks over Gloo each build the tensor-parallel model (its slices of
// the heads, MLP columns and vocabulary) and, beside it, the whole model from the same seed, and run the same
// micro-batches through both. Every rank must hold exactly its slice of the whole model's initial weights, and
// get the same losses, the slice of the whole model's gradients (replicated norm weights whole; q/k norms, every norm
// under sequence parallelism and replicated key/value projections once the step's sum over the group has run), the
// same evaluation losses and the same next-token logits, to fp32 rounding. Layouts: tp 2 and 4, with and without
// sequence parallelism, and fewer key/value groups than ranks (replicated).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>

#include "core/rng.h"
#include "models/model.h"
#include "ops/ops.h"
#include "parallel/distributed_env.h"
#include "parallel/tensor_parallel_grads.h"
#include "support/cpu_ranks.h"
#include "support/multiprocess.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

using namespace std::chrono_literals;

using testing::slice_of;

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

// One rank: the tensor-parallel model against the whole one. Returns "" or the mismatches.
std::string check_rank(const ModelArgs& args, int rank, int tp, bool sequence_parallel, int port, uint64_t seed) {
  std::shared_ptr<Communicator> group = testing::join_cpu_world(rank, tp, port, 20s);
  constexpr int64_t kSeq = 12;
  const std::unique_ptr<Model> whole = make_model(args, kSeq);
  const std::unique_ptr<Model> part =
      make_model(args, kSeq, kCpuDevice, DType::kF32, ModelParallel{TensorParallelGroup(group), {}, sequence_parallel, {}, {}});
  whole->params().initialize(seed);
  part->params().initialize(seed);
  std::string errors;
  const std::vector<ParamSpec>& specs = part->params().specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor want = slice_of(whole->params().param(specs[i].name), specs[i]);
    errors += compare(specs[i].name + " (initial weight)", want.f32(), part->params().param(i).f32(), want.numel());
  }
  // Two micro-batches accumulate, one of them with ignored targets; the same ids on every rank. Their rows (24 and 8)
  // divide by 2 and 4 (sequence parallelism splits them).
  Rng rng(seed);
  const Tensor tokens_a = testing::random_ids({2, kSeq}, args.vocab_size, rng);
  Tensor labels_a = testing::random_ids({2, kSeq}, args.vocab_size, rng);
  labels_a.i32()[3] = -1;
  const Tensor tokens_b = testing::random_ids({1, kSeq - 4}, args.vocab_size, rng);
  const Tensor labels_b = testing::random_ids({1, kSeq - 4}, args.vocab_size, rng);
  const float grad_scale = 1.0f / 40.0f;
  for (Model* m : {whole.get(), part.get()}) m->params().zero_grads();
  for (const auto& [tokens, labels] : {std::pair{tokens_a, labels_a}, std::pair{tokens_b, labels_b}}) {
    const LossSum w = testing::train_micro_batch(*whole, tokens, labels, grad_scale);
    const LossSum p = testing::train_micro_batch(*part, tokens, labels, grad_scale);
    const float wl = static_cast<float>(w.loss_sum), pl = static_cast<float>(p.loss_sum);
    errors += compare("training loss", &wl, &pl, 1);
  }
  // The step's sum of the partial gradients over the group, on the whole flat buffer (one data-parallel rank).
  sum_tensor_parallel_grads(*group, part->tensor_parallel_grad_sums(), {FlatRange{0, part->params().numel()}},
                            {part->params().flat_grads()});
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor want = slice_of(whole->params().grad(specs[i].name), specs[i]);
    errors += compare(specs[i].name + " (gradient)", want.f32(), part->params().grad(i).f32(), want.numel());
  }
  const LossSum we = whole->evaluate(tokens_a, labels_a), pe = part->evaluate(tokens_a, labels_a);
  const float wel = static_cast<float>(we.loss_sum), pel = static_cast<float>(pe.loss_sum);
  errors += compare("evaluation loss", &wel, &pel, 1);
  // 7 tokens: rows that divide by no tp size here, so sequence parallelism leaves them unsplit.
  const std::vector<int32_t> context(tokens_b.i32(), tokens_b.i32() + 7);
  const std::vector<float> wlog = whole->next_token_logits(context), plog = part->next_token_logits(context);
  if (plog.size() != wlog.size()) return errors + fmt::format("{} logits, not {}", plog.size(), wlog.size());
  errors += compare("next-token logits", wlog.data(), plog.data(), static_cast<int64_t>(wlog.size()));
  return errors;
}

void check_layout(const ModelArgs& args, int tp, bool sequence_parallel = false) {
  const uint64_t seed = std::random_device{}();
  const int port = testing::free_port();
  const auto results = testing::run_ranks(
      tp, 120s, [&](int rank) { return check_rank(args, rank, tp, sequence_parallel, port, seed); },
      /*status_if_message=*/2);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].status, 0) << "rank " << rank << " of " << tp << (sequence_parallel ? " with" : " without")
                                       << " sequence parallelism (seed " << seed << "): " << results[rank].message;
  }
}

TEST(TensorParallel, LlamaOnTwoRanksEqualsOneRank) { check_layout(testing::tiny_llama_args(), 2); }

TEST(TensorParallel, TiedEmbeddingsOnTwoRanksEqualOneRank) {
  ModelArgs args = testing::tiny_llama_args();
  args.untie_embeddings_and_output_weights = false;
  check_layout(args, 2);
}

// q/k norms: one weight over each rank's heads, so its gradient is summed over the group.
TEST(TensorParallel, Qwen3OnTwoRanksEqualsOneRank) { check_layout(testing::tiny_qwen3_args(), 2); }

TEST(TensorParallel, FourRanksEqualOneRank) {
  ModelArgs args = testing::tiny_qwen3_args();
  args.num_query_groups = 4;
  check_layout(args, 4);
}

// Sequence parallelism: norms and residuals on each rank's rows, gathers and reduce-scatters around the
// tensor-parallel regions; every norm's gradient partial until the step's sum.
TEST(TensorParallel, SequenceParallelOnTwoRanksEqualsOneRank) {
  check_layout(testing::tiny_llama_args(), 2, true);
  ModelArgs tied = testing::tiny_llama_args();
  tied.untie_embeddings_and_output_weights = false;
  check_layout(tied, 2, true);
}

TEST(TensorParallel, Qwen3WithSequenceParallelOnTwoRanksEqualsOneRank) {
  check_layout(testing::tiny_qwen3_args(), 2, true);
}

TEST(TensorParallel, SequenceParallelOnFourRanksEqualsOneRank) {
  ModelArgs args = testing::tiny_qwen3_args();
  args.num_query_groups = 4;
  check_layout(args, 4, true);
}

// Fewer key/value groups than ranks: each rank holds the group its query heads read, and the k/v gradients of the
// ranks that share a group add up (2 groups: ranks {0,1} and {2,3}; 1 group: all four).
TEST(TensorParallel, ReplicatedKeyValueHeadsOnFourRanksEqualOneRank) {
  ModelArgs args = testing::tiny_llama_args();  // 2 groups
  args.vocab_size = 48;                          // rows for 4 ranks
  check_layout(args, 4);
  ModelArgs qwen3 = testing::tiny_qwen3_args();
  qwen3.num_query_groups = 1;  // multi-query attention, with k norms over the one shared head
  check_layout(qwen3, 4, true);
}

}  // namespace
}  // namespace primus
