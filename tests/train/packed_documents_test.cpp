// Documents packed into one sample with Megatron's reset_position_ids, reset_attention_mask and eod_mask_loss
// (CPU engine). The strong check: with all three on, every document of a packed micro-batch gets the loss and
// the gradients it gets when run alone, so packing changes throughput, never the numbers. With RoPE positions
// restarting and attention confined to the document, the document's logits are its standalone logits; the
// per-document loss and gradient (the other documents' labels ignored) being equal shows that, and that no
// other document reaches it through attention (its gradient would then reach their embeddings). Controls show
// the comparison can fail: without reset_attention_mask the documents mix, and reset_position_ids alone moves
// the loss. Also: training end to end with the keys on, and the errors where they cannot apply.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/file_io.h"
#include "data/blended_dataset.h"
#include "data/indexed_dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "models/model.h"
#include "support/fixed_samples.h"
#include "support/random_documents.h"
#include "support/test_support.h"
#include "support/tiny_models.h"
#include "train/benchmark.h"
#include "train/pretrain.h"
#include "train/train_step.h"

namespace primus {
namespace {

constexpr int64_t kSeq = 24;

// Two rows of packed documents: row 0 is A (9 tokens) EOD, then B cut off at the end of the sample; row 1 is
// C (3) EOD, an empty document (EOD EOD), D (5) EOD, then E. Document tokens are random, never the EOD id.
testing::FixedSamples packed_samples(int64_t vocab, int32_t eod, Rng& rng) {
  auto doc = [&](int64_t n) {
    std::vector<int32_t> d(static_cast<size_t>(n));
    for (int32_t& id : d) id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab - 1)));
    return d;
  };
  auto sample = [&](const std::vector<int64_t>& lengths) {
    std::vector<int32_t> s;
    for (int64_t n : lengths) {
      const std::vector<int32_t> d = doc(n);
      s.insert(s.end(), d.begin(), d.end());
      s.push_back(eod);
    }
    s.resize(kSeq + 1);  // the last document loses its end (and its EOD), as a sample boundary cuts it
    return s;
  };
  return testing::FixedSamples({sample({9, 20}), sample({3, 0, 5, 20})});
}

struct Result {
  double loss_sum = 0.0;
  int64_t tokens = 0;
  Tensor grads;  // flat, host
};

// A model with well-conditioned random weights (the 0.02 init plus N(0, 0.3²), as model_grad_test), identical
// for every call with the same args.
Result run(const ModelArgs& args, const Tensor& tokens, const Tensor& labels, const PackedSequence& packed = {},
           const RecomputeConfig& recompute = {}) {
  const std::unique_ptr<Model> model = make_model(args, kSeq);
  model->params().initialize(21);
  Rng rng(22);
  float* p = model->params().flat_params().f32();
  for (int64_t i = 0; i < model->params().numel(); ++i) p[i] += static_cast<float>(rng.normal() * 0.3);
  model->set_recompute(recompute);
  model->params().zero_grads();
  const LossSum s = testing::train_micro_batch(*model, tokens, labels, 1.0f, packed);  // gradient of Σ losses
  Result r{s.loss_sum, s.tokens, Tensor::empty({model->params().numel()}, DType::kF32)};
  r.grads.copy_from(model->params().flat_grads());
  return r;
}

struct Segment {
  int64_t row, begin, end;
};

std::vector<Segment> segments_of(const Tensor& segment_start) {
  std::vector<Segment> out;
  const int64_t seq = segment_start.dim(1);
  for (int64_t b = 0; b < segment_start.dim(0); ++b) {
    for (int64_t begin = 0; begin < seq;) {
      int64_t end = begin + 1;
      while (end < seq && segment_start.i32()[b * seq + end] == begin) ++end;
      out.push_back({b, begin, end});
      begin = end;
    }
  }
  return out;
}

// [1, end − begin] copy of positions [begin, end) of row `row` of an i32 [B, T] tensor.
Tensor slice(const Tensor& t, const Segment& s) {
  Tensor out = Tensor::empty({1, s.end - s.begin}, DType::kI32);
  std::copy_n(t.i32() + s.row * t.dim(1) + s.begin, s.end - s.begin, out.i32());
  return out;
}

// labels with every position outside the segment ignored.
Tensor only(const Tensor& labels, const Segment& s) {
  Tensor out = Tensor::empty(labels.shape(), DType::kI32);
  for (int64_t i = 0; i < labels.numel(); ++i) {
    const int64_t b = i / labels.dim(1), t = i % labels.dim(1);
    out.i32()[i] = b == s.row && t >= s.begin && t < s.end ? labels.i32()[i] : kIgnoreLabel;
  }
  return out;
}

Batch packed_batch(const ModelArgs& args, const PackingOptions& packing, uint64_t seed) {
  Rng rng(seed);
  const testing::FixedSamples source = packed_samples(args.vocab_size, packing.eod_id, rng);
  return BatchLoader(source, 2, kSeq, 0, packing).next();
}

PackedSequence packed_of(const Batch& batch) { return PackedSequence{batch.position_ids, batch.segment_start}; }

void expect_documents_match_standalone(const ModelArgs& args, uint64_t seed) {
  const int32_t eod = static_cast<int32_t>(args.vocab_size - 1);
  const Batch batch = packed_batch(args, PackingOptions{eod, true, true, true}, seed);
  const std::vector<Segment> segments = segments_of(batch.segment_start);
  ASSERT_EQ(segments.size(), 6u);  // A B | C (empty) D E

  Tensor sum_of_grads = Tensor::zeros({0}, DType::kF32);
  double sum_of_losses = 0.0;
  int64_t counted = 0;
  for (const Segment& s : segments) {
    SCOPED_TRACE(fmt::format("row {} document [{}, {})", s.row, s.begin, s.end));
    const Result alone = run(args, slice(batch.tokens, s), slice(batch.labels, s));
    const Result packed = run(args, batch.tokens, only(batch.labels, s), packed_of(batch));
    EXPECT_EQ(packed.tokens, alone.tokens);
    EXPECT_NEAR(packed.loss_sum, alone.loss_sum, 1e-5 * std::fabs(alone.loss_sum));
    if (alone.tokens == 0) {  // the empty document: no loss, so no gradient at all
      EXPECT_EQ(testing::max_abs_diff(packed.grads, Tensor::zeros(packed.grads.shape(), DType::kF32)), 0.0);
    } else {
      EXPECT_LE(testing::relative_error(packed.grads, alone.grads), 1e-5);
    }
    if (sum_of_grads.numel() == 0) sum_of_grads = Tensor::zeros(alone.grads.shape(), DType::kF32);
    for (int64_t i = 0; i < sum_of_grads.numel(); ++i) sum_of_grads.f32()[i] += alone.grads.f32()[i];
    sum_of_losses += alone.loss_sum;
    counted += alone.tokens;
  }
  // The whole packed micro-batch: the sum over its documents; EOD inputs not counted (eod_mask_loss).
  const Result whole = run(args, batch.tokens, batch.labels, packed_of(batch));
  int64_t eod_inputs = 0;
  for (int64_t i = 0; i < batch.tokens.numel(); ++i) eod_inputs += batch.tokens.i32()[i] == eod;
  EXPECT_EQ(eod_inputs, 4);  // A's; C's, the empty one's and D's (B's and E's are cut off)
  EXPECT_EQ(whole.tokens, 2 * kSeq - eod_inputs);
  EXPECT_EQ(whole.tokens, counted);
  EXPECT_NEAR(whole.loss_sum, sum_of_losses, 1e-5 * sum_of_losses);
  EXPECT_LE(testing::relative_error(whole.grads, sum_of_grads), 1e-5);
}

TEST(PackedDocuments, EachDocumentGetsItsStandaloneLossAndGradients) {
  expect_documents_match_standalone(testing::tiny_llama_args(), 31);
}

TEST(PackedDocuments, EachDocumentGetsItsStandaloneLossAndGradientsQwen3) {
  expect_documents_match_standalone(testing::tiny_qwen3_args(), 32);
}

TEST(PackedDocuments, WithoutTheAttentionMaskDocumentsMix) {
  // The control: the same comparison fails for a later document when it can attend to the earlier ones.
  const ModelArgs args = testing::tiny_llama_args();
  const int32_t eod = static_cast<int32_t>(args.vocab_size - 1);
  const Batch batch = packed_batch(args, PackingOptions{eod, true, false, true}, 33);
  const Segment b{0, 10, kSeq};  // document B of row 0
  const Result alone = run(args, slice(batch.tokens, b), slice(batch.labels, b));
  const Result packed = run(args, batch.tokens, only(batch.labels, b), packed_of(batch));
  EXPECT_GT(std::fabs(packed.loss_sum - alone.loss_sum), 1e-3 * alone.loss_sum);
  EXPECT_GT(testing::relative_error(packed.grads, alone.grads), 1e-2);
}

TEST(PackedDocuments, PositionIdsReachRope) {
  // reset_position_ids alone (documents still attend across) changes the relative positions between
  // documents, hence the loss; counting up from 0 is plain RoPE, identical bits.
  const ModelArgs args = testing::tiny_llama_args();
  const int32_t eod = static_cast<int32_t>(args.vocab_size - 1);
  const Batch batch = packed_batch(args, PackingOptions{eod, true, false, false}, 34);
  const Result plain = run(args, batch.tokens, batch.labels);
  const Result reset = run(args, batch.tokens, batch.labels, packed_of(batch));
  EXPECT_GT(std::fabs(reset.loss_sum - plain.loss_sum), 1e-4 * plain.loss_sum);
  Tensor counting = Tensor::empty(batch.position_ids.shape(), DType::kI32);
  for (int64_t i = 0; i < counting.numel(); ++i) counting.i32()[i] = static_cast<int32_t>(i % kSeq);
  const Result counted = run(args, batch.tokens, batch.labels, PackedSequence{counting, Tensor()});
  EXPECT_EQ(counted.loss_sum, plain.loss_sum);
  EXPECT_EQ(std::memcmp(counted.grads.data(), plain.grads.data(), plain.grads.nbytes()), 0);
}

TEST(PackedDocuments, RecomputeAndEvaluateSeeThePacking) {
  // Full recompute runs the blocks' forward again in backward: with the same packing, identical gradients.
  ModelArgs args = testing::tiny_qwen3_args();
  args.num_layers = 3;
  const int32_t eod = static_cast<int32_t>(args.vocab_size - 1);
  const Batch batch = packed_batch(args, PackingOptions{eod, true, true, true}, 35);
  const Result kept = run(args, batch.tokens, batch.labels, packed_of(batch));
  using G = RecomputeConfig::Granularity;
  const Result recomputed = run(args, batch.tokens, batch.labels, packed_of(batch), RecomputeConfig{G::kFull, false, 2});
  EXPECT_EQ(recomputed.loss_sum, kept.loss_sum);
  EXPECT_EQ(std::memcmp(recomputed.grads.data(), kept.grads.data(), kept.grads.nbytes()), 0);

  const std::unique_ptr<Model> model = make_model(args, kSeq);
  model->params().initialize(21);
  Rng rng(22);
  float* p = model->params().flat_params().f32();
  for (int64_t i = 0; i < model->params().numel(); ++i) p[i] += static_cast<float>(rng.normal() * 0.3);
  const LossSum eval = model->evaluate(batch.tokens, batch.labels, packed_of(batch));
  EXPECT_EQ(eval.tokens, kept.tokens);
  EXPECT_NEAR(eval.loss_sum, kept.loss_sum, 1e-6 * kept.loss_sum);
}

// ---- through the trainer --------------------------------------------------------------------------------------

// A run on many small text files (one document each, EOD-separated by the byte-level tokenizer).
ExperimentConfig documents_run(const std::string& dir) {
  const std::string data = dir + "/docs";
  std::filesystem::create_directories(data);
  Rng rng(36);
  for (int i = 0; i < 40; ++i) {
    std::ofstream out(fmt::format("{}/doc{:02}.txt", data, i));
    const int64_t words = 3 + static_cast<int64_t>(rng.below(20));
    for (int64_t w = 0; w < words; ++w) out << (w % 3 == 0 ? "the " : w % 3 == 1 ? "quick fox " : "jumps. ");
  }
  ExperimentConfig c;
  c.exp_name = "packed";
  c.workspace = dir;
  c.effective_yaml = "exp_name: packed\n";
  c.model = testing::tiny_llama_args();
  c.model.vocab_size = 0;  // the tokenizer's, padded
  TrainingArgs& t = c.train;
  t.train_iters = 3;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;
  t.seq_length = 48;
  t.lr = 1e-3;
  t.lr_decay_iters = 3;
  t.log_interval = 1;
  t.eval_interval = 3;
  t.eval_iters = 1;
  t.split = "90,10";
  t.data_path = {data};
  t.device = "cpu";
  t.reset_position_ids = t.reset_attention_mask = t.eod_mask_loss = true;
  return c;
}

TEST(PackedDocuments, TrainingRunsWithAllThreeKeys) {
  const ExperimentConfig c = documents_run(testing::temp_dir("packed_run"));
  ASSERT_EQ(run_pretrain(c, {}), 0);
  std::istringstream in(read_file(c.run_dir() + "/metrics.jsonl"));
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const nlohmann::json record = nlohmann::json::parse(line);
    EXPECT_TRUE(std::isfinite(record["loss"].get<double>())) << line;
    if (record.contains("eval_loss")) {
      EXPECT_TRUE(std::isfinite(record["eval_loss"].get<double>())) << line;
    }
  }
  EXPECT_EQ(lines, 3);
  EXPECT_NE(read_file(c.run_dir() + "/logs/train.log").find("packed documents (EOD id 256)"), std::string::npos);
}

// ---- where the keys cannot apply -------------------------------------------------------------------------------

class NoEodTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view) const override { return {}; }
  std::string decode(std::span<const int32_t>) const override { return ""; }
  int64_t vocab_size() const override { return 10; }
  int32_t eod_id() const override { return -1; }
  std::string name() const override { return "SentencePieceTokenizer"; }
};

TEST(PackedDocuments, ATokenizerWithoutEodIsAConfigError) {
  TrainingArgs t;
  EXPECT_FALSE(packing_options(t, NoEodTokenizer()).any());  // nothing asked: no error
  t.reset_attention_mask = true;
  try {
    packing_options(t, NoEodTokenizer());
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("[config] reset_attention_mask: the SentencePieceTokenizer tokenizer has no "
                                         "end-of-document (EOD) id"),
              std::string::npos)
        << e.what();
  }
  const PackingOptions ok = packing_options(t, ByteLevelTokenizer());
  EXPECT_EQ(ok.eod_id, ByteLevelTokenizer::kEodId);
  EXPECT_TRUE(ok.reset_attention_mask);
}

TEST(PackedDocuments, IndexedDataWithoutEodIsAConfigError) {
  // Preprocessed without --append-eod, a dataset has no document boundaries: the switches would do nothing.
  const std::string dir = testing::temp_dir("packed_indexed");
  const std::string with = testing::write_random_documents(dir + "/with_eod", 200, 37, true);
  const std::string without = testing::write_random_documents(dir + "/without_eod", 200, 37, false);
  const int32_t eod = ByteLevelTokenizer::kEodId;
  EXPECT_TRUE(datasets_without_eod({with}, eod).empty());
  EXPECT_EQ(datasets_without_eod({"0.5", with, "0.5", without}, eod), std::vector<std::string>{without});

  ExperimentConfig c = documents_run(dir);
  c.train.data_path = {"0.5", with, "0.5", without};
  c.train.reset_position_ids = c.train.reset_attention_mask = false;
  try {
    run_pretrain(c, {});
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("[config] eod_mask_loss: data_path {} has no document ending "
                                                     "with the end-of-document id 256",
                                                     without)),
              std::string::npos)
        << e.what();
  }
  c.train.data_path = {with};
  c.train.split = "80,20";
  EXPECT_EQ(run_pretrain(c, {}), 0);
}

TEST(PackedDocuments, BenchmarkOnMockTokensRefusesTheKeys) {
  ExperimentConfig c;
  c.train.eod_mask_loss = true;
  try {
    run_benchmark_train(c, BenchmarkOptions{});
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("[config] eod_mask_loss: benchmark train runs on mock tokens"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace primus
