// Context parallelism on forked CPU ranks over Gloo.
//   - Ring attention: every rank holds its two chunks (i and 2·cp − 1 − i) of the same sequences; the ring's out, lse
//     and gradients dq, dk, dv must equal the rows of one rank's causal attention over the whole sequences, for rings
//     of 2, 3 and 4 ranks (odd rings too) and GQA.
//   - The model: each rank builds the context-parallel model and, beside it, the whole model from the same seed, and
//     runs the same micro-batches through both (the cp model its chunks of them). Losses and the evaluation loss summed
//     over the ranks, and every parameter gradient summed over the ranks, must equal the whole model's to fp32
//     rounding; next-token logits (whole context on one rank, no ring) too; also with full recompute (backward runs
//     each block's forward, the ring's included, again).
//   - Training steps in a layout (cp 2; cp 2 × dp 2, also with the distributed optimizer and overlapped reduction,
//     and with FSDP's ZeRO-3; cp 2 × tp 2): the trainer's own pieces (process groups, parallel model, data parallelism
//     over dp × cp, the batch split, train_step, evaluate) against one rank at the same global batch: every step's loss
//     and gradient norm and the evaluation loss within relative 1e-5, and after the steps every parameter tensor (this
//     rank's tensor-parallel slice of it) within 1e-5 (relative norm).
// Training jobs of the built primus-cli against one rank are in context_parallel_job_test.cpp.
#include "layers/context_parallel.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>

#include "core/rng.h"
#include "data/samples.h"
#include "models/model.h"
#include "ops/ops.h"
#include "parallel/distributed_env.h"
#include "support/cpu_ranks.h"
#include "support/multiprocess.h"
#include "support/test_support.h"
#include "support/tiny_models.h"
#include "train/train_step.h"

namespace primus {
namespace {

using namespace std::chrono_literals;

using testing::slice_of;

std::shared_ptr<Communicator> connect(int rank, int size, int port) {
  return testing::join_cpu_world(rank, size, port, 20s);
}

// "" when a and b agree within fp32 rounding of sums in another order, else what differs.
std::string compare(const std::string& what, const float* a, const float* b, int64_t n, double tol = 1e-5) {
  double worst = 0.0, scale = 1e-30;
  for (int64_t k = 0; k < n; ++k) {
    if (!std::isfinite(b[k])) return fmt::format("{}: element {} is {}; ", what, k, b[k]);
    worst = std::max(worst, std::abs(static_cast<double>(a[k]) - b[k]));
    scale = std::max(scale, std::abs(static_cast<double>(a[k])));
  }
  if (worst <= tol * scale) return "";
  return fmt::format("{}: differs by {:.3g} (largest value {:.3g}); ", what, worst, scale);
}

// Rank `rank`'s chunks of a [B, T, H, D] tensor (or, with stats, of an lse [B, H, T]), chunk-major as the split lays
// them out: written here from the definition (chunks r and 2·cp − 1 − r), not through the code under test.
Tensor chunks_of(const Tensor& whole, int rank, int cp, bool stats = false) {
  const int64_t B = whole.dim(0), T = stats ? whole.dim(2) : whole.dim(1), C = T / (2 * cp);
  const int64_t chunk[2] = {rank, 2 * cp - 1 - rank};
  if (stats) {
    const int64_t H = whole.dim(1);
    Tensor part = Tensor::empty({2 * B, H, C}, DType::kF32);
    for (int half = 0; half < 2; ++half) {
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
          std::copy_n(whole.f32() + (b * H + h) * T + chunk[half] * C, C, part.f32() + ((half * B + b) * H + h) * C);
        }
      }
    }
    return part;
  }
  const int64_t row = whole.dim(2) * whole.dim(3);
  Tensor part = Tensor::empty({2 * B, C, whole.dim(2), whole.dim(3)}, DType::kF32);
  for (int half = 0; half < 2; ++half) {
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(whole.f32() + (b * T + chunk[half] * C) * row, C * row, part.f32() + (half * B + b) * C * row);
    }
  }
  return part;
}

std::string check_ring_rank(int rank, int cp, int port, uint64_t seed) {
  const ContextParallelGroup ring(connect(rank, cp, port));
  std::string errors;
  if (ring.size() != cp || ring.rank() != rank) return fmt::format("group of {} at rank {}", ring.size(), ring.rank());
  // Every rank draws the same whole sequences.
  Rng rng(seed);
  const int64_t B = 2, C = 3, T = 2 * cp * C, Hq = 4, Hkv = 2, D = 8;
  const Tensor q = testing::random_tensor({B, T, Hq, D}, rng), k = testing::random_tensor({B, T, Hkv, D}, rng);
  const Tensor v = testing::random_tensor(k.shape(), rng), dout = testing::random_tensor(q.shape(), rng);
  Tensor out = Tensor::empty(q.shape(), DType::kF32), lse = Tensor::empty({B, Hq, T}, DType::kF32);
  ops::attention_forward(q, k, v, out, lse);
  Tensor dq = Tensor::empty(q.shape(), DType::kF32), dk = Tensor::empty(k.shape(), DType::kF32);
  Tensor dv = Tensor::empty(k.shape(), DType::kF32);
  ops::attention_backward(q, k, v, out, lse, dout, dq, dk, dv);

  const Tensor lq = chunks_of(q, rank, cp), lk = chunks_of(k, rank, cp), lv = chunks_of(v, rank, cp);
  Tensor lout = Tensor::empty(lq.shape(), DType::kF32), llse = Tensor::empty({2 * B, Hq, C}, DType::kF32);
  lout.fill(std::nanf(""));
  llse.fill(std::nanf(""));
  ring.attention_forward(lq, lk, lv, lout, llse);
  const Tensor want_out = chunks_of(out, rank, cp), want_lse = chunks_of(lse, rank, cp, true);
  errors += compare("out", want_out.f32(), lout.f32(), lout.numel(), 1e-6);
  errors += compare("lse", want_lse.f32(), llse.f32(), llse.numel(), 1e-6);
  Tensor ldq = Tensor::empty(lq.shape(), DType::kF32), ldk = Tensor::empty(lk.shape(), DType::kF32);
  Tensor ldv = Tensor::empty(lk.shape(), DType::kF32);
  for (Tensor* t : {&ldq, &ldk, &ldv}) t->fill(std::nanf(""));
  ring.attention_backward(lq, lk, lv, lout, llse, chunks_of(dout, rank, cp), ldq, ldk, ldv);
  const Tensor want_dq = chunks_of(dq, rank, cp), want_dk = chunks_of(dk, rank, cp), want_dv = chunks_of(dv, rank, cp);
  errors += compare("dq", want_dq.f32(), ldq.f32(), ldq.numel());
  errors += compare("dk", want_dk.f32(), ldk.f32(), ldk.numel());
  errors += compare("dv", want_dv.f32(), ldv.f32(), ldv.numel());

  // The split of token ids and the positions follow the same definition.
  Tensor ids = Tensor::empty({B, T}, DType::kI32);
  for (int64_t i = 0; i < B * T; ++i) ids.i32()[i] = static_cast<int32_t>(i);
  const Tensor local = ring.local_chunks(ids), positions = ring.positions(B, C);
  for (int half = 0; half < 2; ++half) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < C; ++t) {
        const int64_t at = (half * B + b) * C + t, position = ring.chunk(half) * C + t;
        if (local.i32()[at] != b * T + position || positions.i32()[at] != position) {
          errors += fmt::format("token ({}, {}, {}): id {} position {}, want {} and {}; ", half, b, t, local.i32()[at],
                                positions.i32()[at], b * T + position, position);
        }
      }
    }
  }
  return errors;
}

void check_ring(int cp) {
  const uint64_t seed = std::random_device{}();
  const int port = testing::free_port();
  const auto results = testing::run_ranks(
      cp, 120s, [&](int rank) { return check_ring_rank(rank, cp, port, seed); }, 2);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].status, 0) << "rank " << rank << " of " << cp << " (seed " << seed
                                       << "): " << results[rank].message;
  }
}

TEST(ContextParallel, RingAttentionOfTwoRanksEqualsTheWholeAttention) { check_ring(2); }
TEST(ContextParallel, RingAttentionOfThreeRanksEqualsTheWholeAttention) { check_ring(3); }
TEST(ContextParallel, RingAttentionOfFourRanksEqualsTheWholeAttention) { check_ring(4); }

// Σ over the group of a host f32 tensor, in place.
void group_sum(Communicator& comm, Tensor& t) { comm.all_reduce(t, ReduceOp::kSum); }

float group_sum(Communicator& comm, double value) {
  Tensor t = Tensor::empty({1}, DType::kF32);
  t.f32()[0] = static_cast<float>(value);
  comm.all_reduce(t, ReduceOp::kSum);
  return t.f32()[0];
}

// One rank: the context-parallel model against the whole one.
std::string check_model_rank(const ModelArgs& args, int rank, int cp, int port, uint64_t seed,
                             const RecomputeConfig& recompute) {
  std::shared_ptr<Communicator> world = connect(rank, cp, port);
  const ContextParallelGroup ring(std::shared_ptr<Communicator>(world->split(0, rank)));
  const int64_t T = 4 * cp;  // chunks of 2 tokens
  const std::unique_ptr<Model> whole = make_model(args, T);
  const std::unique_ptr<Model> part = make_model(args, T, kCpuDevice, DType::kF32, ModelParallel{{}, ring, false, {}, {}});
  part->set_recompute(recompute);  // full: backward runs each block's forward, the ring included, again
  whole->params().initialize(seed);
  part->params().initialize(seed);
  std::string errors;
  // Two micro-batches accumulate, one with ignored targets; the same sequences on every rank.
  Rng rng(seed);
  const Tensor tokens_a = testing::random_ids({2, T}, args.vocab_size, rng);
  Tensor labels_a = testing::random_ids({2, T}, args.vocab_size, rng);
  labels_a.i32()[3] = -1;
  labels_a.i32()[T + 1] = -1;
  const Tensor tokens_b = testing::random_ids({1, T}, args.vocab_size, rng);
  const Tensor labels_b = testing::random_ids({1, T}, args.vocab_size, rng);
  const float grad_scale = 1.0f / 40.0f;
  for (Model* m : {whole.get(), part.get()}) m->params().zero_grads();
  int64_t counted = 0;
  for (const auto& [tokens, labels] : {std::pair{tokens_a, labels_a}, std::pair{tokens_b, labels_b}}) {
    const LossSum w = testing::train_micro_batch(*whole, tokens, labels, grad_scale);
    const LossSum p =
        testing::train_micro_batch(*part, ring.local_chunks(tokens), ring.local_chunks(labels), grad_scale);
    const float wl = static_cast<float>(w.loss_sum), pl = group_sum(*world, p.loss_sum);
    errors += compare("training loss", &wl, &pl, 1);
    counted += p.tokens;
  }
  const float all_counted = group_sum(*world, static_cast<double>(counted));
  if (all_counted != static_cast<float>(counted_tokens(labels_a) + counted_tokens(labels_b))) {
    errors += fmt::format("{} tokens counted over the ranks; ", all_counted);
  }
  Tensor grads = part->params().flat_grads();
  group_sum(*world, grads);
  for (size_t i = 0; i < part->params().specs().size(); ++i) {
    const std::string& name = part->params().specs()[i].name;
    const Tensor want = whole->params().grad(name), got = part->params().grad(i);
    errors += compare(name + " (gradient)", want.f32(), got.f32(), want.numel());
  }
  const LossSum we = whole->evaluate(tokens_a, labels_a);
  const LossSum pe = part->evaluate(ring.local_chunks(tokens_a), ring.local_chunks(labels_a));
  const float wel = static_cast<float>(we.loss_sum), pel = group_sum(*world, pe.loss_sum);
  errors += compare("evaluation loss", &wel, &pel, 1);
  // Sampling reads a whole context on one rank: no ring, the other ranks take no part.
  if (rank == cp - 1) {
    const std::vector<int32_t> context(tokens_b.i32(), tokens_b.i32() + 5);
    const std::vector<float> wlog = whole->next_token_logits(context), plog = part->next_token_logits(context);
    errors += compare("next-token logits", wlog.data(), plog.data(), static_cast<int64_t>(wlog.size()));
  }
  return errors;
}

void check_model(const ModelArgs& args, int cp, const RecomputeConfig& recompute = {}) {
  const uint64_t seed = std::random_device{}();
  const int port = testing::free_port();
  const auto results = testing::run_ranks(
      cp, 120s, [&](int rank) { return check_model_rank(args, rank, cp, port, seed, recompute); }, 2);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].status, 0) << "rank " << rank << " of " << cp << " (seed " << seed
                                       << "): " << results[rank].message;
  }
}

TEST(ContextParallel, LlamaOnTwoRanksEqualsOneRank) { check_model(testing::tiny_llama_args(), 2); }

// q/k norms, tied embeddings, a head size apart from hidden / heads.
TEST(ContextParallel, Qwen3OnTwoRanksEqualsOneRank) { check_model(testing::tiny_qwen3_args(), 2); }

TEST(ContextParallel, LlamaOnFourRanksEqualsOneRank) { check_model(testing::tiny_llama_args(true), 4); }

TEST(ContextParallel, FullRecomputeOnTwoRanksEqualsOneRank) {
  RecomputeConfig full;
  full.granularity = RecomputeConfig::Granularity::kFull;
  full.num_layers = 1;
  check_model(testing::tiny_llama_args(), 2, full);
}

// ---- training steps in a layout -----------------------------------------------------------------------------------

struct Layout {
  int tp = 1, cp = 1, dp = 1;
  bool distributed_optimizer = false;
  const char* fsdp = "";  // data_parallel_sharding_strategy of use_megatron_fsdp, or none
  int world() const { return tp * cp * dp; }
};

constexpr int kSteps = 4;

TrainingArgs layout_args(const Layout& l) {
  TrainingArgs t;
  t.micro_batch_size = 2;
  t.global_batch_size = 8;  // 2 micro-batches per step at dp 2, 4 at dp 1
  t.seq_length = 16;        // chunks of 4 tokens at cp 2
  t.data_parallel_size = l.dp;
  t.world_size = l.world();
  t.tensor_model_parallel_size = l.tp;
  t.context_parallel_size = l.cp;
  t.use_distributed_optimizer = l.distributed_optimizer;
  t.overlap_grad_reduce = l.distributed_optimizer;
  t.use_megatron_fsdp = *l.fsdp != '\0';
  if (t.use_megatron_fsdp) t.data_parallel_sharding_strategy = l.fsdp;
  t.ddp_bucket_size = 3000;  // several buckets
  t.weight_decay = 0.1;
  t.clip_grad = 0.5;
  // AdamW's first steps move every element by about ±lr whatever its gradient's size, so an element whose gradient
  // is ~0 (its sign left to fp32 rounding, which differs between layouts) would move by 2·lr more in one layout than
  // in the other; an epsilon above such gradients keeps their updates proportional to them.
  t.adam_eps = 1e-6;
  t.eval_iters = 1;
  t.distributed_timeout_minutes = 1.0;
  return t;
}

struct Trace {
  std::vector<double> losses, grad_norms;
  double eval_loss = 0.0;
  std::unique_ptr<Model> model;
  std::unique_ptr<DataParallel> dp;  // after the model, which it refers to: destroyed first
};

// kSteps training steps of `layout` on `world` (every rank of it calls this), on mock tokens from `seed`.
Trace train(const ModelArgs& args, const Layout& layout, std::shared_ptr<Communicator> world, uint64_t seed) {
  const TrainingArgs t = layout_args(layout);
  const ProcessGroups groups = make_process_groups(std::move(world), args, t);
  Trace trace;
  trace.model = make_parallel_model(args, t, kCpuDevice, groups);
  Model& model = *trace.model;
  model.params().initialize(seed);
  trace.dp = make_data_parallel(groups, model, t);
  DataParallel* dp = trace.dp.get();
  AdamW optimizer = make_optimizer(model, *dp, t);
  weights_ready(model, *dp);
  const BatchSplit split = batch_split(groups);
  const MockTokens source(args.vocab_size, t.seq_length, seed);
  BatchLoader loader(source, t.micro_batch_size, t.seq_length, 0, {}, split.shard);
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<Batch> batches;
    for (int64_t i = 0; i < micro_batches_per_step(t); ++i) batches.push_back(split.local(loader.next()));
    const StepResult r = train_step(model, optimizer, *dp, batches, t, 3e-3 / step);
    trace.losses.push_back(r.loss);
    trace.grad_norms.push_back(r.grad_norm);
  }
  trace.eval_loss = evaluate(model, *dp, source, t, split);
  return trace;
}

std::string check_layout_rank(const ModelArgs& args, const Layout& layout, int rank, int port, uint64_t seed) {
  omp_set_num_threads(1);
  DistributedEnv alone;  // the baseline: a world of one rank
  const Trace one = train(args, Layout{}, make_world_communicator(alone, kCpuDevice, 20s), seed);
  const Trace many = train(args, layout, connect(rank, layout.world(), port), seed);
  std::string errors;
  for (int step = 0; step < kSteps; ++step) {
    const float wl = static_cast<float>(one.losses[step]), pl = static_cast<float>(many.losses[step]);
    const float wn = static_cast<float>(one.grad_norms[step]), pn = static_cast<float>(many.grad_norms[step]);
    errors += compare(fmt::format("loss of step {}", step + 1), &wl, &pl, 1);
    errors += compare(fmt::format("gradient norm of step {}", step + 1), &wn, &pn, 1);
  }
  const float we = static_cast<float>(one.eval_loss), pe = static_cast<float>(many.eval_loss);
  errors += compare("evaluation loss", &we, &pe, 1);
  // Per tensor (per range of the flat buffer under FSDP: its fp32 master weights are this rank's shards only, the
  // flat buffer freed): AdamW's g / sqrt(v) magnifies last-bit differences of near-zero gradients in single elements.
  auto compare_weights = [&](const std::string& what, const float* want, const float* got, int64_t n) {
    double diff = 0.0, norm = 0.0;
    for (int64_t k = 0; k < n; ++k) {
      diff += std::pow(static_cast<double>(want[k]) - got[k], 2);
      norm += std::pow(static_cast<double>(want[k]), 2);
    }
    const double relative = std::sqrt(diff / std::max(norm, 1e-30));
    if (!(relative <= 1e-5))
      errors += fmt::format("{} after {} steps: relative difference {:.3g}; ", what, kSteps, relative);
  };
  if (const FullyShardedDataParallel* fsdp = many.dp->fsdp(); fsdp != nullptr) {
    const float* whole = one.model->params().flat_params().f32();
    for (size_t k = 0; k < fsdp->owned().size(); ++k) {
      const FlatRange& r = fsdp->owned()[k];
      compare_weights(fmt::format("master weights [{}, {})", r.begin, r.end), whole + r.begin,
                      fsdp->master_shards().f32() + fsdp->owned_offsets()[k], r.size());
    }
    return errors;
  }
  const ParamStore& params = many.model->params();
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    const Tensor want = slice_of(one.model->params().param(spec.name), spec), got = params.param(i);
    compare_weights(spec.name, want.f32(), got.f32(), want.numel());
  }
  return errors;
}

void check_layout(const Layout& layout, const std::string& name) {
  const uint64_t seed = std::random_device{}() % 100000;
  const int port = testing::free_port();
  const ModelArgs args = testing::tiny_llama_args();
  const auto results = testing::run_ranks(
      layout.world(), 180s, [&](int rank) { return check_layout_rank(args, layout, rank, port, seed); }, 2);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].status, 0) << name << ", rank " << rank << " (seed " << seed
                                       << "): " << results[rank].message;
  }
}

TEST(ContextParallelTraining, TwoRanksEqualOneRank) { check_layout(Layout{.cp = 2}, "cp 2"); }

TEST(ContextParallelTraining, WithTwoDataParallelRanksEqualsOneRank) {
  check_layout(Layout{.cp = 2, .dp = 2}, "cp 2 x dp 2");
}

TEST(ContextParallelTraining, WithTheDistributedOptimizerEqualsOneRank) {
  check_layout(Layout{.cp = 2, .dp = 2, .distributed_optimizer = true}, "cp 2 x dp 2, distributed optimizer");
}

// ZeRO-3: the blocks' weights gathered over dp × cp before each use, beside the ring's exchanges.
TEST(ContextParallelTraining, WithFsdpZero3EqualsOneRank) {
  check_layout(Layout{.cp = 2, .dp = 2, .fsdp = "optim_grads_params"}, "cp 2 x dp 2, FSDP optim_grads_params");
}

TEST(ContextParallelTraining, WithTwoTensorParallelRanksEqualsOneRank) {
  check_layout(Layout{.tp = 2, .cp = 2}, "cp 2 x tp 2");
}

}  // namespace
}  // namespace primus
