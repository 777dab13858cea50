// Packed documents (reset_position_ids, reset_attention_mask, eod_mask_loss) through the whole model on the GPU:
// the loss and every gradient of a packed micro-batch against the CPU engine on the same batch, fp32 and bf16
// (bf16 attention with segments runs on the native kernels, not cuDNN), and, in fp32, each document of the packed
// batch against that document run alone on the GPU. Tolerances as model_gpu_test: fp32 1e-5 on the loss, 1e-4
// on the gradients; bf16 1e-2 and 5e-2. Skipped, with the reason, where there is no CUDA build or no GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "data/loader.h"
#include "models/model.h"
#include "ops/ops.h"
#include "support/fixed_samples.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

namespace primus {
namespace {

constexpr Device kGpu{DeviceType::kCuda, 0};
constexpr int64_t kSeq = 96;

ModelArgs gpu_args() {
  ModelArgs args = testing::tiny_llama_args();
  args.hidden_size = 64;
  args.kv_channels = 16;  // a head size cuDNN would take: only the segments keep bf16 attention off it
  args.max_position_embeddings = kSeq;
  return args;
}

// Two rows of documents of random tokens (never the EOD id, the vocabulary's last), EOD-separated, the last one
// cut off by the sample's end; row 1 has an empty document (EOD EOD).
Batch packed_batch(const ModelArgs& args, uint64_t seed) {
  Rng rng(seed);
  const int32_t eod = static_cast<int32_t>(args.vocab_size - 1);
  auto sample = [&](const std::vector<int64_t>& lengths) {
    std::vector<int32_t> s;
    for (int64_t n : lengths) {
      for (int64_t i = 0; i < n; ++i) s.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(eod))));
      s.push_back(eod);
    }
    s.resize(kSeq + 1);
    return s;
  };
  const testing::FixedSamples source({sample({30, 17, 80}), sample({5, 0, 41, 1, 60})});
  return BatchLoader(source, 2, kSeq, 0, PackingOptions{eod, true, true, true}).next();
}

struct Result {
  double loss_sum = 0.0;
  int64_t tokens = 0;
  Tensor grads;  // flat fp32, host
};

Result run(const ModelArgs& args, Device device, DType dtype, const Tensor& tokens, const Tensor& labels,
           const PackedSequence& packed = {}) {
  const std::unique_ptr<Model> model = make_model(args, kSeq, device, dtype);
  model->params().initialize(41);
  model->weights_changed();
  model->params().zero_grads();
  const LossSum s = testing::train_micro_batch(*model, tokens, labels, 1.0f, packed);
  return {s.loss_sum, s.tokens, ops::to_device(model->params().flat_grads(), kCpuDevice)};
}

void expect_gpu_tracks_cpu(DType dtype, double loss_tolerance, double grad_tolerance) {
  const ModelArgs args = gpu_args();
  const Batch batch = packed_batch(args, 42);
  const PackedSequence packed{batch.position_ids, batch.segment_start};
  const Result cpu = run(args, kCpuDevice, DType::kF32, batch.tokens, batch.labels, packed);
  const Result gpu = run(args, kGpu, dtype, batch.tokens, batch.labels, packed);
  EXPECT_EQ(gpu.tokens, cpu.tokens);
  EXPECT_NEAR(gpu.loss_sum, cpu.loss_sum, loss_tolerance * cpu.loss_sum);
  EXPECT_LE(testing::relative_error(gpu.grads, cpu.grads), grad_tolerance);
}

TEST(PackedDocumentsGpu, Fp32LossAndGradientsMatchTheCpuEngine) {
  PRIMUS_SKIP_WITHOUT_GPU();
  expect_gpu_tracks_cpu(DType::kF32, 1e-5, 1e-4);
}

TEST(PackedDocumentsGpu, Bf16LossAndGradientsTrackTheCpuEngine) {
  PRIMUS_SKIP_WITHOUT_GPU();
  expect_gpu_tracks_cpu(DType::kBF16, 1e-2, 5e-2);
}

TEST(PackedDocumentsGpu, Fp32EachDocumentGetsItsStandaloneLossAndGradients) {
  PRIMUS_SKIP_WITHOUT_GPU();
  const ModelArgs args = gpu_args();
  const Batch batch = packed_batch(args, 43);
  const PackedSequence packed{batch.position_ids, batch.segment_start};
  int documents = 0;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t begin = 0; begin < kSeq;) {
      int64_t end = begin + 1;
      while (end < kSeq && batch.segment_start.i32()[b * kSeq + end] == begin) ++end;
      SCOPED_TRACE(fmt::format("row {} document [{}, {})", b, begin, end));
      Tensor tokens = Tensor::empty({1, end - begin}, DType::kI32), labels = Tensor::empty({1, end - begin}, DType::kI32);
      std::copy_n(batch.tokens.i32() + b * kSeq + begin, end - begin, tokens.i32());
      std::copy_n(batch.labels.i32() + b * kSeq + begin, end - begin, labels.i32());
      Tensor only = Tensor::empty(batch.labels.shape(), DType::kI32);  // this document's labels alone
      for (int64_t i = 0; i < only.numel(); ++i) {
        const bool inside = i / kSeq == b && i % kSeq >= begin && i % kSeq < end;
        only.i32()[i] = inside ? batch.labels.i32()[i] : kIgnoreLabel;
      }
      const Result alone = run(args, kGpu, DType::kF32, tokens, labels);
      const Result in_pack = run(args, kGpu, DType::kF32, batch.tokens, only, packed);
      EXPECT_EQ(in_pack.tokens, alone.tokens);
      EXPECT_NEAR(in_pack.loss_sum, alone.loss_sum, 1e-5 * alone.loss_sum);
      if (alone.tokens > 0) {
        EXPECT_LE(testing::relative_error(in_pack.grads, alone.grads), 1e-4);
      }
      ++documents;
      begin = end;
    }
  }
  EXPECT_EQ(documents, 8);
}

}  // namespace
}  // namespace primus
