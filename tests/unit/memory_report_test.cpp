// The memory table (train/memory_report.h): the activation estimate against a hand computation for a tiny
// model, and against the bytes the CPU engine really holds (a counting allocator) after forward and at its
// peak, with and without recompute; the table's rows; the out-of-memory message with its advice.
#include "train/memory_report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "core/allocator.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

// Counts the bytes live through it (and their peak), passing every call on to the CPU allocator.
class CountingAllocator : public Allocator {
 public:
  explicit CountingAllocator(Allocator& inner) : inner_(inner) {}
  void* allocate(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    live_ += static_cast<int64_t>(bytes);
    peak_ = std::max(peak_, live_);
    return inner_.allocate(bytes);
  }
  void deallocate(void* ptr, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    live_ -= static_cast<int64_t>(bytes);
    inner_.deallocate(ptr, bytes);
  }
  Device device() const override { return kCpuDevice; }
  int64_t live() {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_;
  }
  int64_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = live_;
  }

 private:
  Allocator& inner_;
  std::mutex mutex_;
  int64_t live_ = 0;
  int64_t peak_ = 0;
};

// Routes CPU allocations through a CountingAllocator for its lifetime.
class CountCpuAllocations {
 public:
  CountCpuAllocations() : cpu_(allocator_for(kCpuDevice)), counting_(cpu_) {
    register_allocator(DeviceType::kCpu, &counting_);
  }
  ~CountCpuAllocations() { register_allocator(DeviceType::kCpu, &cpu_); }
  CountingAllocator& counter() { return counting_; }

 private:
  Allocator& cpu_;
  CountingAllocator counting_;
};

struct Measured {
  int64_t saved = 0;  // held after forward
  int64_t peak = 0;   // most held during forward and backward
};

// One training micro-batch of the tiny model on the CPU, counting the bytes allocated beyond the model.
Measured measure(const ModelArgs& args, int64_t B, int64_t T, const RecomputeConfig& recompute) {
  CountCpuAllocations counting;
  CountingAllocator& count = counting.counter();
  Measured m;
  {
    const std::unique_ptr<Model> model = make_model(args, T);
    model->set_recompute(recompute);
    model->params().initialize(1);
    Rng rng(3);
    const Tensor tokens = testing::random_ids({B, T}, args.vocab_size, rng);
    const Tensor labels = testing::random_ids({B, T}, args.vocab_size, rng);
    Tensor loss_sum = Tensor::zeros({1}, DType::kF32);
    const int64_t before = count.live();
    count.reset_peak();
    const std::unique_ptr<MicroBatchContext> ctx =
        model->forward(tokens, labels, 1.0f / static_cast<float>(B * T), loss_sum);
    m.saved = count.live() - before;
    model->backward(*ctx);
    m.peak = count.peak() - before;
    EXPECT_EQ(count.live(), before) << "backward frees every activation";
  }
  return m;
}

RecomputeConfig recompute(RecomputeConfig::Granularity granularity, bool block = false, int64_t layers = 1) {
  RecomputeConfig r;
  r.granularity = granularity;
  r.block = block;
  r.num_layers = layers;
  return r;
}

using G = RecomputeConfig::Granularity;

// Tiny Llama (2 layers, C 32, F 48, 4 q heads and 2 kv heads of 8, V 50), micro-batch 2 x 8 = 16 tokens, fp32.
TEST(MemoryEstimate, MatchesAHandComputationForATinyModel) {
  const ModelArgs args = testing::tiny_llama_args();
  // A layer: 16 tokens x 4 bytes x (4·32 [norm inputs, attention and MLP inputs] + 2·4·8 [q, out] + 2·2·8 [k, v]
  // + 3·48 [gate|up, SwiGLU output]) + 4 bytes x 16 x (2 + 4) [two rstd, lse] = 64 x 368 + 384 = 23,936.
  ActivationEstimate none = estimate_activations(args, 2, 8, DType::kF32, recompute(G::kNone));
  EXPECT_EQ(none.tokens, 16);
  EXPECT_EQ(none.layer_bytes, 23936);
  // Saved: 2 layers + final norm input (16·32·4 = 2048) and rstd (64) + dhidden (2048) = 52,032.
  EXPECT_EQ(none.saved_bytes, 52032);
  // Logits chunk: the whole [16, 50] fits 1 GiB: 3,200 bytes. Peak at the loss: + final norm output 2048
  // + logits 3200 + losses and lse 128 = 57,408.
  EXPECT_EQ(none.logits_chunk_bytes, 3200);
  EXPECT_EQ(none.peak_bytes, 57408);

  // Selective: no SwiGLU output, 16·4·48 = 3,072 less per layer.
  ActivationEstimate selective = estimate_activations(args, 2, 8, DType::kF32, recompute(G::kSelective));
  EXPECT_EQ(selective.layer_bytes, 20864);
  EXPECT_EQ(selective.saved_bytes, 52032 - 2 * 3072);

  // Full, one layer a chunk: each layer keeps its input (2048): saved 4096 + 4160 = 8,256. The peak is in
  // backward: layer 0's input 2048, layer 1 whole 23936, final norm 2112 = 28,096.
  ActivationEstimate full = estimate_activations(args, 2, 8, DType::kF32, recompute(G::kFull));
  EXPECT_EQ(full.saved_bytes, 8256);
  EXPECT_EQ(full.peak_bytes, 28096);

  // bf16 activations: 2 bytes an element, rstd and lse stay fp32.
  ActivationEstimate bf16 = estimate_activations(args, 2, 8, DType::kBF16, recompute(G::kNone));
  EXPECT_EQ(bf16.layer_bytes, 32 * 368 + 384);
}

// An MoE layer keeps the router's tensors in f32 whatever the activation dtype, and its N·k dispatched rows with their
// expert activations in that dtype. The tiny model with layer 0 dense and layer 1 of 4 experts (top 2, F_e 24, aux
// loss on), bf16, 16 tokens.
TEST(MemoryEstimate, MoeLayersKeepTheRouterInF32AndTheDispatchedRows) {
  ModelArgs args = testing::tiny_llama_args();
  args.num_experts = 4;
  args.moe_router_topk = 2;
  args.moe_ffn_hidden_size = 24;
  args.moe_first_k_dense_replace = 1;
  args.moe_aux_loss_coeff = 0.01;
  // Attention and norms: 16 x 2 x (4·32 + 2·4·8 + 2·2·8) + 384 (rstd, lse) = 7,552; the dense MLP 16·2·3·48 = 4,608.
  // The MoE block: logits and scores 2·4·16·4 = 512, top-k experts and weights 8·16·2 = 256, slots and offsets
  // 4·(32 + 5) = 148, 32 rows x 2 x (2·32 [rows, expert output] + 3·24 [gate|up, act]) = 8,704, the aux loss's
  // gradient 4·16·4 = 256: 9,876.
  const ActivationEstimate e = estimate_activations(args, 2, 8, DType::kBF16, recompute(G::kNone));
  EXPECT_EQ(e.layer_bytes, 7552 + 9876);
  // Saved: both layers, the final norm's input (1,024) and rstd (64), dhidden (1,024).
  EXPECT_EQ(e.saved_bytes, (7552 + 4608) + (7552 + 9876) + 1088 + 1024);
}

// Sequence parallelism over 2 ranks: the tiny model's tensor-parallel half (2 q heads and 1 kv head of 8, F 24, V 25)
// holds 8 of the 16 rows of the residual stream.
TEST(MemoryEstimate, SequenceParallelRanksHoldTheirRowsOfTheResidualStream) {
  ModelArgs half = testing::tiny_llama_args();
  half.num_attention_heads = 2;
  half.num_query_groups = 1;
  half.ffn_hidden_size = 24;
  half.vocab_size = 25;
  // A layer: 8 rows x 4 bytes x 2·32 [the norms' inputs] + 16 x 4 x (2·32 [attention and MLP inputs, gathered]
  // + 2·2·8 [q, out] + 2·1·8 [k, v] + 3·24) + 4 x (2·8 [rstd] + 16·2 [lse]) = 2048 + 11776 + 192 = 14,016.
  const ActivationEstimate sp = estimate_activations(half, 2, 8, DType::kF32, recompute(G::kNone), 2);
  EXPECT_EQ(sp.layer_bytes, 14016);
  // Saved: 2 layers + the final norm's input (8·32·4 = 1024) and rstd (32) + dhidden (1024) = 30,112.
  EXPECT_EQ(sp.saved_bytes, 30112);
  // Peak at the loss: + the gathered final norm output 16·32·4 = 2048, logits 16·25·4 = 1600, losses and lse 128.
  EXPECT_EQ(sp.peak_bytes, 33888);
  // Without sequence parallelism every rank holds all 16 rows: 2048 + 64 more per layer.
  EXPECT_EQ(estimate_activations(half, 2, 8, DType::kF32, recompute(G::kNone)).layer_bytes, 14016 + 2112);

  // The plan passes the split on: tensor_model_parallel_size 2 with sequence_parallel.
  TrainingArgs t;
  t.micro_batch_size = 2;
  t.seq_length = 8;
  t.tensor_model_parallel_size = 2;
  const ModelArgs whole = testing::tiny_llama_args();
  const MemoryPlan without = plan_memory(whole, t, kCpuDevice, DType::kF32);
  t.sequence_parallel = true;
  const MemoryPlan with = plan_memory(whole, t, kCpuDevice, DType::kF32);
  const ModelArgs rank = tensor_parallel_shapes(whole, 2);
  EXPECT_EQ(with.activations.peak_bytes,
            estimate_activations(rank, 2, 8, DType::kF32, RecomputeConfig::from(t), 2).peak_bytes);
  EXPECT_LT(with.activations.peak_bytes, without.activations.peak_bytes);
}

// The estimate against what the CPU engine holds: after forward exactly what forward keeps; at the peak at
// least the estimate, and above it only by the gradient temporaries of one layer's backward.
TEST(MemoryEstimate, MatchesTheBytesTheEngineHolds) {
  struct Case {
    const char* name;
    ModelArgs args;
    RecomputeConfig recompute;
  };
  ModelArgs four = testing::tiny_llama_args();
  four.num_layers = 4;
  const std::vector<Case> cases = {
      {"llama none", testing::tiny_llama_args(), recompute(G::kNone)},
      {"llama selective", testing::tiny_llama_args(), recompute(G::kSelective)},
      {"llama full uniform 1", testing::tiny_llama_args(), recompute(G::kFull)},
      {"4 layers full uniform 3", four, recompute(G::kFull, false, 3)},
      {"4 layers full block 2", four, recompute(G::kFull, true, 2)},
      {"qwen3 (q/k norm) none", testing::tiny_qwen3_args(), recompute(G::kNone)},
      {"qwen3 full uniform 2", testing::tiny_qwen3_args(), recompute(G::kFull, false, 2)},
      {"mla low-rank query none", testing::tiny_deepseek_args(true, true, false), recompute(G::kNone)},
      {"mla full-rank query selective", testing::tiny_deepseek_args(false, false, false), recompute(G::kSelective)},
      {"mla full uniform 2", testing::tiny_deepseek_args(true, false, false), recompute(G::kFull, false, 2)},
  };
  for (const Case& c : cases) {
    const int64_t B = 3, T = 16;
    const ActivationEstimate e = estimate_activations(c.args, B, T, DType::kF32, c.recompute);
    const Measured m = measure(c.args, B, T, c.recompute);
    EXPECT_EQ(e.saved_bytes, m.saved) << c.name;
    EXPECT_GE(m.peak, e.peak_bytes) << c.name;
    // One layer's backward temporaries: a few [N, C] and [N, 2F] gradients.
    const int64_t N = B * T;
    int64_t slack = 4 * N * (4 * c.args.hidden_size + 3 * c.args.ffn_hidden_size);
    if (c.args.multi_latent_attention) {
      // MLA's backward splits and joins its heads: dq, dk and their parts and joins (six of [N, H·(Dn+Dr)]), dout
      // and dv ([N, H·Dv]) and the kv up-projection's gradient [N, H·(Dn+Dv)].
      const int64_t H = c.args.num_attention_heads, Dn = c.args.qk_head_dim, Dv = c.args.v_head_dim;
      slack += 4 * N * (6 * H * (Dn + c.args.qk_pos_emb_head_dim) + 2 * H * Dv + H * (Dn + Dv));
    }
    EXPECT_LE(m.peak, e.peak_bytes + slack) << c.name << ": measured peak " << m.peak << ", estimate " << e.peak_bytes;
  }
}

TEST(MemoryPlan, TableRowsForFp32AndMixedPrecision) {
  ModelArgs args = testing::tiny_llama_args();
  TrainingArgs t;
  t.data_parallel_size = 2;  // every buffer through the step (one rank's step-scoped buffers: the test after this)
  t.micro_batch_size = 2;
  t.seq_length = 8;
  const MemoryPlan plan = plan_memory(args, t, kCpuDevice, DType::kF32);
  EXPECT_EQ(plan.parameters, 18720);  // embedding 1600, 2 x 7744 per layer, final norm 32, lm_head 1600
  EXPECT_EQ(plan.param_bytes, 74880);
  EXPECT_EQ(plan.compute_copy_bytes, 0);
  EXPECT_EQ(plan.grad_bytes, 74880);
  EXPECT_EQ(plan.optimizer_bytes, 149760);
  EXPECT_EQ(plan.activations.peak_bytes, 57408);
  EXPECT_EQ(plan.total_bytes(), 74880 + 74880 + 149760 + 57408);
  EXPECT_EQ(plan.device_total_bytes, 0);
  const std::vector<std::string> lines = format_memory_table(plan);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0],
            "memory per device, estimated (cpu: 18720 parameters; micro-batch 2 x 8 tokens, f32 activations, "
            "recompute none):");
  EXPECT_EQ(lines[1], "  parameters (fp32 master)                73.1 KiB");
  EXPECT_EQ(lines[4],
            "  activations per micro-batch (peak)      56.1 KiB  (kept for backward 50.8 KiB, logits chunk 3.1 KiB)");
  EXPECT_EQ(lines[5], "  total                                  348.6 KiB");

  t.recompute_granularity = "full";
  t.recompute_method = "block";
  t.recompute_num_layers = 1;
  const MemoryPlan mixed = plan_memory(args, t, kCpuDevice, DType::kBF16);
  EXPECT_EQ(mixed.compute_copy_bytes, 2 * 18720);
  EXPECT_EQ(mixed.recompute, "full (block, the first 1 layers)");
  const std::vector<std::string> mixed_lines = format_memory_table(mixed);
  ASSERT_EQ(mixed_lines.size(), 7u);
  EXPECT_EQ(mixed_lines[2], "  compute copy (bf16)                     36.6 KiB");
  EXPECT_NE(mixed_lines[0].find("bf16 activations, recompute full (block, the first 1 layers)"), std::string::npos);
  EXPECT_EQ(format_memory_bytes(3 * (int64_t{1} << 30) / 2), "1.50 GiB");
  EXPECT_EQ(format_memory_bytes(12 * (int64_t{1} << 20)), "12.00 MiB");
}

// One rank holds the blocks' gradients only from backward on and its compute copy only until then
// (parallel/unit_residency.h). Backward allocates a layer's gradients while the layers below it keep their activations:
// the peak is at its first layer or its last, or at the loss.
TEST(MemoryPlan, OneRankHoldsTheGradientsAndTheComputeCopyOnlyWhenTheStepNeedsThem) {
  const ModelArgs args = testing::tiny_llama_args();  // 18,720 parameters, embedding and lm_head 1,600 each
  TrainingArgs t;
  t.micro_batch_size = 2;
  t.global_batch_size = 2;
  t.seq_length = 8;
  const MemoryPlan fp32 = plan_memory(args, t, kCpuDevice, DType::kF32);
  EXPECT_TRUE(fp32.step_scoped_buffers);
  // Here the last layer's backward: master, moments and every gradient, and that layer's activations.
  const int64_t everything = 74880 + 74880 + 149760;
  EXPECT_EQ(fp32.total_bytes(), everything + fp32.activations.layer_bytes);
  EXPECT_EQ(fp32.not_at_once_bytes, fp32.activations.peak_bytes - fp32.activations.layer_bytes);
  const std::vector<std::string> lines = format_memory_table(fp32);
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_NE(lines[5].find("not held at once"), std::string::npos) << lines[5];
  EXPECT_NE(lines[5].find("(one rank: gradients come as backward frees the compute copy)"), std::string::npos);
  // bf16: the compute copy is held at the loss and gone by the end of backward.
  const MemoryPlan mixed = plan_memory(args, t, kCpuDevice, DType::kBF16);
  EXPECT_LT(mixed.total_bytes(), mixed.static_bytes() + mixed.activations.peak_bytes);
  EXPECT_GE(mixed.total_bytes(), everything);
  // With gradient accumulation the gradients stay from the first backward through the next forwards; two ranks hold
  // everything through the step.
  t.global_batch_size = 4;
  EXPECT_EQ(plan_memory(args, t, kCpuDevice, DType::kF32).not_at_once_bytes, 0);
  t.global_batch_size = 2;
  t.data_parallel_size = 2;
  const MemoryPlan two = plan_memory(args, t, kCpuDevice, DType::kF32);
  EXPECT_FALSE(two.step_scoped_buffers);
  EXPECT_EQ(two.not_at_once_bytes, 0);
}

// fp8 keeps the codes of its weights (W and Wᵀ, 2 bytes a parameter of its Linear modules) and of its inputs (xᵀ, a
// byte an element, per micro-batch). On the llama3.2_1B shape at micro-batch 4 × 4096 that is 1.81 + 3.50 GiB: an
// H100 measured fp8's peak 5.31 GiB above bf16's (46.16 against 40.85 GiB, docs/perf/fp8.md).
TEST(MemoryPlan, Fp8CountsTheCodesOfItsWeightsAndOfItsInputs) {
  ModelArgs args = testing::tiny_llama_args();
  args.num_layers = 16;
  args.hidden_size = 2048;
  args.ffn_hidden_size = 8192;
  args.num_attention_heads = 32;
  args.num_query_groups = 8;
  args.kv_channels = 64;
  TrainingArgs t;
  t.micro_batch_size = 4;
  t.seq_length = 4096;
  const MemoryPlan bf16 = plan_memory(args, t, kCpuDevice, DType::kBF16);
  EXPECT_EQ(bf16.fp8_weight_codes_bytes, 0);
  EXPECT_EQ(bf16.fp8_input_codes_bytes, 0);

  t.fp8_format = "hybrid";
  t.fp8_recipe = "tensorwise";
  const int64_t layer_weights = 2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 8192 * 2048;  // q, o; k, v; gate, up, down
  const int64_t layer_inputs = 2048 + 2048 + 2048 + 8192;  // q/k/v's, o's, gate_up's, down's, per token
  const MemoryPlan fp8 = plan_memory(args, t, kCpuDevice, DType::kBF16);
  EXPECT_EQ(fp8.fp8_weight_codes_bytes, 2 * 16 * layer_weights);
  EXPECT_EQ(fp8.fp8_input_codes_bytes, 16 * layer_inputs * 4 * 4096);
  // The bf16 copies the codes replace: attention's and the MLP's inputs and the SwiGLU output (o_proj's input, the
  // attention output, stays: attention's backward reads it).
  const int64_t layer_freed = 2048 + 2048 + 8192;
  EXPECT_EQ(fp8.fp8_freed_inputs_bytes, 16 * layer_freed * 2 * 4 * 4096);
  EXPECT_NEAR(static_cast<double>(fp8.total_bytes() - bf16.total_bytes()) / (1 << 30), 1.81 + 3.50 - 6.00, 0.01);
  const std::vector<std::string> lines = format_memory_table(fp8);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "  fp8 codes of the weights (W, W^T)       1.81 GiB"), lines.end());
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "  fp8 codes of the inputs (x^T)           3.50 GiB  (kept for backward)"),
            lines.end());
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "  inputs not kept in bf16                -6.00 GiB  (their fp8 codes stand in)"),
            lines.end());

  // Layers kept in bf16 keep no codes; selective recompute drops the SwiGLU output and so down_proj's codes of it (and
  // it frees no bf16 product for them).
  t.first_last_layers_bf16 = true;
  t.num_layers_at_start_in_bf16 = 1;
  t.num_layers_at_end_in_bf16 = 1;
  t.recompute_granularity = "selective";
  const MemoryPlan kept = plan_memory(args, t, kCpuDevice, DType::kBF16);
  EXPECT_EQ(kept.fp8_weight_codes_bytes, 2 * 14 * layer_weights);
  EXPECT_EQ(kept.fp8_input_codes_bytes, 14 * (layer_inputs - 8192) * 4 * 4096);
  EXPECT_EQ(kept.fp8_freed_inputs_bytes, 14 * (layer_freed - 8192) * 2 * 4 * 4096);

  // A pipeline stage counts its own layers' codes: at pp 2 (8 micro-batches a step) stage 0 holds layers 0-7 (1-7 in
  // fp8) and keeps 2 micro-batches in flight, stage 1 layers 8-15 (8-14 in fp8) and one.
  t.pipeline_model_parallel_size = 2;
  t.global_batch_size = 32;
  for (const auto& [stage, in_flight] : {std::pair{0, 2}, std::pair{1, 1}}) {
    const MemoryPlan staged = plan_memory(args, t, kCpuDevice, DType::kBF16, stage);
    ASSERT_EQ(staged.micro_batches_in_flight, in_flight) << "stage " << stage;
    EXPECT_EQ(staged.fp8_weight_codes_bytes, 2 * 7 * layer_weights) << "stage " << stage;
    EXPECT_EQ(staged.fp8_input_codes_bytes, 7 * (layer_inputs - 8192) * 4 * 4096 * in_flight) << "stage " << stage;
  }
}

// The distributed optimizer keeps 1/dp of the AdamW state per rank (its shards of every bucket), plus the staging
// buffer of the one bucket dp does not divide; the table says which.
// Issue 12 hole 13: a huge micro-batch (or model) ran into bad_alloc after tens of seconds; a plan that cannot fit
// the host (CPU) or device (CUDA) is a UsageError before anything is allocated, naming the keys to change.
TEST(MemoryPlan, APlanThatCannotFitIsAUsageErrorNamingTheKeys) {
  ModelArgs args = testing::tiny_llama_args();
  TrainingArgs t;
  t.micro_batch_size = 2;
  t.seq_length = 8;
  EXPECT_NO_THROW(check_memory_plan_fits(plan_memory(args, t, kCpuDevice, DType::kF32)));

  t.micro_batch_size = int64_t{1} << 30;  // ~2^30 x 8 tokens x ~3.5 KiB each: far beyond any host
  try {
    check_memory_plan_fits(plan_memory(args, t, kCpuDevice, DType::kF32));
    FAIL() << "expected a UsageError";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("micro_batch_size 1073741824"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("the host's memory"), std::string::npos) << error.what();
  }

  t.micro_batch_size = 2;
  MemoryPlan on_gpu = plan_memory(args, t, Device{DeviceType::kCuda, 0}, DType::kBF16);
  on_gpu.device_total_bytes = on_gpu.static_bytes() - 1;  // a device too small for the weights alone
  try {
    check_memory_plan_fits(on_gpu);
    FAIL() << "expected a UsageError";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("parameters, gradients and optimizer state alone"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("cuda:0's memory"), std::string::npos) << error.what();
  }
}

TEST(MemoryPlan, DistributedOptimizerShardsTheOptimizerStatePerRank) {
  ModelArgs args;
  args.num_layers = 2;
  args.hidden_size = 64;
  args.ffn_hidden_size = 176;
  args.num_attention_heads = 4;
  args.num_query_groups = 2;
  args.kv_channels = 16;
  args.vocab_size = 384;
  TrainingArgs t;
  t.micro_batch_size = 2;
  t.seq_length = 32;
  t.data_parallel_size = 3;
  t.ddp_bucket_size = 7001;
  const MemoryPlan replicated = plan_memory(args, t, kCpuDevice, DType::kF32);
  t.use_distributed_optimizer = true;
  const MemoryPlan sharded = plan_memory(args, t, kCpuDevice, DType::kF32);
  const int64_t p = replicated.parameters;
  EXPECT_EQ(replicated.optimizer_bytes, 8 * p);
  EXPECT_EQ(replicated.comm_bytes, 0);
  EXPECT_GE(sharded.optimizer_bytes, 8 * (p / 3));
  EXPECT_LE(sharded.optimizer_bytes, 8 * (p / 3 + 21 * 3));  // at most one rounding per bucket
  EXPECT_GT(sharded.comm_bytes, 0) << p << " parameters are not a multiple of 3";
  EXPECT_EQ(sharded.param_bytes, replicated.param_bytes);
  std::string table;
  for (const std::string& line : format_memory_table(sharded)) table += line + "\n";
  EXPECT_NE(table.find("optimizer state (AdamW, fp32, 1/3 shard)"), std::string::npos) << table;
  EXPECT_NE(table.find("communication buffers"), std::string::npos) << table;
}

// Expert parallelism ep 2 inside dp 4: a rank holds half the experts, and the distributed optimizer shards their
// state over the 2 ranks holding the same experts, the rest over all 4.
TEST(MemoryPlan, ExpertStateShardsOverTheExpertDataParallelRanks) {
  ModelArgs args = testing::tiny_llama_args();
  args.num_experts = 4;
  args.moe_router_topk = 2;
  args.moe_ffn_hidden_size = 24;
  TrainingArgs t;
  t.micro_batch_size = 2;
  t.seq_length = 8;
  t.data_parallel_size = 4;
  t.ddp_bucket_size = 1 << 30;  // one bucket a region: no rounding to bound
  t.use_distributed_optimizer = true;
  const MemoryPlan whole = plan_memory(args, t, kCpuDevice, DType::kF32);
  t.expert_model_parallel_size = 2;
  const MemoryPlan ep = plan_memory(args, t, kCpuDevice, DType::kF32);
  // Each layer's 4 experts hold 3·24·32 parameters each; ep 2 keeps 2 of them.
  const int64_t experts = 2 * 4 * 3 * 24 * 32, mine = experts / 2;
  EXPECT_EQ(ep.parameters, whole.parameters - experts + mine);
  const int64_t dense = whole.parameters - experts;
  EXPECT_NEAR(static_cast<double>(ep.optimizer_bytes), 8.0 * (dense / 4.0 + mine / 2.0), 8.0 * 2);
  EXPECT_NEAR(static_cast<double>(whole.optimizer_bytes), 8.0 * whole.parameters / 4.0, 8.0 * 1);
}

// Under pipeline parallelism a stage's layers keep the whole model's MoE and dense kinds: with the first layer dense,
// the second stage (layers 2-3) holds two MoE layers and the first stage one of each.
TEST(MemoryPlan, PipelineStagesKnowWhichOfTheirLayersAreMoe) {
  ModelArgs args = testing::tiny_llama_args();
  args.num_layers = 4;
  args.num_experts = 4;
  args.moe_router_topk = 2;
  args.moe_ffn_hidden_size = 24;
  args.moe_first_k_dense_replace = 1;
  TrainingArgs t;
  t.micro_batch_size = 2;
  t.seq_length = 8;
  t.pipeline_model_parallel_size = 2;
  for (int stage : {0, 1}) {
    const MemoryPlan plan = plan_memory(args, t, kCpuDevice, DType::kF32, stage);
    ASSERT_EQ(plan.rank_model.num_layers, 2);
    EXPECT_EQ(plan.rank_model.is_moe_layer(0), stage == 1) << stage;
    EXPECT_TRUE(plan.rank_model.is_moe_layer(1)) << stage;
  }
}

// Context parallelism: a rank's activations are those of its chunks (seq_length / cp tokens of each sequence), and
// the distributed optimizer shards over data × context parallel ranks (where the gradients reduce).
TEST(MemoryPlan, ContextParallelRanksHoldTheirChunksAndShardOverDataTimesContext) {
  ModelArgs args;
  args.num_layers = 2;
  args.hidden_size = 64;
  args.ffn_hidden_size = 176;
  args.num_attention_heads = 4;
  args.num_query_groups = 2;
  args.kv_channels = 16;
  args.vocab_size = 384;
  TrainingArgs t;
  t.micro_batch_size = 2;
  t.seq_length = 64;
  t.data_parallel_size = 2;
  t.use_distributed_optimizer = true;
  const MemoryPlan whole = plan_memory(args, t, kCpuDevice, DType::kF32);
  t.context_parallel_size = 2;
  const MemoryPlan cp = plan_memory(args, t, kCpuDevice, DType::kF32);
  EXPECT_EQ(cp.seq_length, 32);
  EXPECT_EQ(cp.activations.peak_bytes,
            estimate_activations(args, 2, 32, DType::kF32, RecomputeConfig::from(t)).peak_bytes);
  EXPECT_LT(cp.activations.peak_bytes, whole.activations.peak_bytes);
  EXPECT_EQ(cp.data_parallel_size, 4);
  EXPECT_LT(cp.optimizer_bytes, whole.optimizer_bytes);
  std::string table;
  for (const std::string& line : format_memory_table(cp)) table += line + "\n";
  EXPECT_NE(table.find("optimizer state (AdamW, fp32, 1/4 shard)"), std::string::npos) << table;
}

// A Llama 3.2 1B shape at 4 x 4096 tokens in bf16, on a device of 80 GiB.
MemoryPlan one_b_plan(int64_t micro_batch_size, const std::string& granularity) {
  ModelArgs args;
  args.num_layers = 16;
  args.hidden_size = 2048;
  args.ffn_hidden_size = 8192;
  args.num_attention_heads = 32;
  args.num_query_groups = 8;
  args.kv_channels = 64;
  args.vocab_size = 128256;
  TrainingArgs t;
  t.micro_batch_size = micro_batch_size;
  t.global_batch_size = 8;
  t.seq_length = 4096;
  t.recompute_granularity = granularity;
  if (granularity == "full") {
    t.recompute_method = "uniform";
    t.recompute_num_layers = 1;
  }
  MemoryPlan plan = plan_memory(args, t, Device{DeviceType::kCuda, 0}, DType::kBF16);
  plan.device_total_bytes = int64_t{80} << 30;
  plan.device_free_bytes = int64_t{79} << 30;
  return plan;
}

TEST(MemoryPlan, OutOfMemoryMessageHasTheRequestTheTableAndWhatToTry) {
  const MemoryPlan plan = one_b_plan(4, "");
  // 1.24 B parameters: 18 bytes each (fp32 master, bf16 copy, fp32 gradient, two fp32 moments) ≈ 20.7 GiB;
  // activations ≈ 19.7 GiB per micro-batch (1.16 GiB a layer + a 1 GiB logits chunk).
  EXPECT_NEAR(static_cast<double>(plan.static_bytes()) / (1 << 30), 20.7, 0.1);
  EXPECT_NEAR(static_cast<double>(plan.activations.peak_bytes) / (1 << 30), 19.7, 0.1);
  const OutOfMemoryError error("[cuda] out of device memory on cuda:0: 3221225472 bytes (3.000 GiB) requested; ...",
                               "cuda:0", uint64_t{3} << 30);
  const std::string message = out_of_memory_message(error, plan);
  for (const char* part : {
           "out of memory on cuda:0: a request for 3.00 GiB (3221225472 bytes) did not fit.\n",
           "  [cuda] out of device memory on cuda:0: 3221225472 bytes",
           "memory per device, estimated (cuda:0: 1235814400 parameters; micro-batch 4 x 4096 tokens, bf16",
           "  optimizer state (AdamW, fp32)",
           "  device memory                          80.00 GiB  (79.00 GiB free at start)",
           "What to try:\n",
           "  - a smaller micro_batch_size (now 4; 2 would need about 10.",
           "  - recompute_granularity: selective (about 15.",
           " or full (about 2.",
           "  - a shorter seq_length (now 4096",
           "use_distributed_optimizer: true",
       }) {
    EXPECT_NE(message.find(part), std::string::npos) << "missing: " << part << "\nin:\n" << message;
  }
  EXPECT_EQ(message.find("alone need"), std::string::npos);
  EXPECT_EQ(error.exit_code(), kExitRuntime);

  // Micro-batch 1 and full recompute already: neither is suggested again.
  const std::string tight = out_of_memory_message(error, one_b_plan(1, "full"));
  EXPECT_EQ(tight.find("micro_batch_size (now"), std::string::npos) << tight;
  EXPECT_EQ(tight.find("recompute_granularity:"), std::string::npos) << tight;
  EXPECT_NE(tight.find("seq_length (now 4096"), std::string::npos) << tight;

  // A device too small for the weights and optimizer alone says so; an unknown request size is left out.
  MemoryPlan small = one_b_plan(1, "");
  small.device_total_bytes = int64_t{16} << 30;
  const std::string hopeless = out_of_memory_message(OutOfMemoryError("[cuda] cudaMalloc failed", "cuda", 0), small);
  EXPECT_NE(hopeless.find("out of memory on cuda:0.\n"), std::string::npos) << hopeless;
  EXPECT_NE(hopeless.find("alone need 20.7"), std::string::npos) << hopeless;
  EXPECT_NE(hopeless.find("What to try: a smaller model, or several GPUs with use_distributed_optimizer"),
            std::string::npos)
      << hopeless;
  EXPECT_EQ(hopeless.find("recompute_granularity:"), std::string::npos) << "no advice that cannot help";
}

}  // namespace
}  // namespace primus
