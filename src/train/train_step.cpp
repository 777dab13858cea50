#include "train/train_step.h"

#include <spdlog/spdlog.h>

#include "data/tokenizer.h"
#include "ops/ops.h"
#include "ops/profile.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace primus {

int64_t micro_batches_per_step(const TrainingArgs& t) {
  return t.global_batch_size / (t.micro_batch_size * t.data_parallel_size);
}

StepResult train_step(LlamaModel& model, AdamW& optimizer, const std::vector<Batch>& batches, const TrainingArgs& t,
                      double lr, StepTimes* times) {
  // The global batch's token count scales every micro-batch's gradient.
  int64_t counted = 0;
  for (const Batch& batch : batches) counted += LlamaModel::counted_tokens(batch.labels);
  PRIMUS_CHECK(counted > 0, "a global batch without any token to predict");
  const float grad_scale = static_cast<float>(1.0 / static_cast<double>(counted));
  Backend& device = backend_for(model.device());
  // Marks between phases, only when the caller wants the times: [start, after forward 1, after backward 1, ...].
  std::vector<std::unique_ptr<DeviceMark>> marks;
  auto mark = [&] {
    if (times != nullptr) marks.push_back(device.mark());
  };
  mark();
  model.params().zero_grads();
  Tensor loss_sum = ops::zeros({1}, DType::kF32, model.device());  // summed on the device: no wait per micro-batch
  for (const Batch& batch : batches) {
    {
      const ops::ProfileScope scope("forward");
      model.forward(ops::to_device(batch.tokens, model.device()), ops::to_device(batch.labels, model.device()),
                    grad_scale, loss_sum, packed_on(batch, model.device()));
    }
    mark();
    {
      const ops::ProfileScope scope("backward");
      model.backward();
    }
    mark();
  }
  StepResult result;
  result.tokens = counted;
  {
    const ops::ProfileScope scope("optimizer");
    const GradClip clip = clip_grad_norm(model.params(), t.clip_grad);
    result.grad_norm = clip.norm;
    // Read while the device is idle anyway (the norm above waited for it), before the optimizer is queued.
    result.loss = static_cast<double>(ops::to_device(loss_sum, kCpuDevice).f32()[0]) / static_cast<double>(counted);
    optimizer.step(model.params(), lr, clip.scale, model.compute_weights());
  }
  mark();
  if (times != nullptr) {
    *times = StepTimes();
    for (size_t i = 0; i + 2 < marks.size(); i += 2) {
      times->forward_ms += device.elapsed_ms(*marks[i], *marks[i + 1]);
      times->backward_ms += device.elapsed_ms(*marks[i + 1], *marks[i + 2]);
    }
    times->optimizer_ms = device.elapsed_ms(*marks[marks.size() - 2], *marks.back());
  }
  return result;
}

double evaluate(LlamaModel& model, const SampleSource& source, const TrainingArgs& t, const PackingOptions& packing) {
  BatchLoader loader(source, t.micro_batch_size, t.seq_length, 0, packing);
  const int64_t micro_batches = t.eval_iters * t.global_batch_size / t.micro_batch_size;
  double loss_sum = 0.0;
  int64_t tokens = 0;
  for (int64_t i = 0; i < micro_batches; ++i) {
    Batch batch = loader.next();
    LossSum s = model.evaluate(ops::to_device(batch.tokens, model.device()), ops::to_device(batch.labels, model.device()),
                               packed_on(batch, model.device()));
    loss_sum += s.loss_sum;
    tokens += s.tokens;
  }
  return loss_sum / static_cast<double>(std::max<int64_t>(tokens, 1));
}

PackingOptions packing_options(const TrainingArgs& t, const Tokenizer& tokenizer) {
  PackingOptions packing{tokenizer.eod_id(), t.reset_position_ids, t.reset_attention_mask, t.eod_mask_loss};
  if (!packing.any() || packing.eod_id >= 0) return packing;
  const char* key = packing.first_key();
  throw UsageError(fmt::format("[config] {}: the {} tokenizer has no end-of-document (EOD) id to split documents at; "
                               "turn {} off or use a tokenizer with an EOS/EOD token",
                               key, tokenizer.name(), key));
}

PackedSequence packed_on(const Batch& batch, Device device) {
  PackedSequence packed;
  if (batch.position_ids.defined()) packed.position_ids = ops::to_device(batch.position_ids, device);
  if (batch.segment_start.defined()) packed.segment_start = ops::to_device(batch.segment_start, device);
  return packed;
}

Device select_device(const std::string& device_key) {
  if (device_key == "cpu") return kCpuDevice;
#if PRIMUS_WITH_CUDA
  std::string why;
  const int count = cuda_device_count(&why);
  if (count > 0) {
    start_cuda_backend(0);
    return Device{DeviceType::kCuda, 0};
  }
  if (device_key == "cuda") throw UsageError(fmt::format("[config] device: cuda, but no CUDA device is usable: {}", why));
  spdlog::info("device auto: no usable CUDA device ({}), so the CPU", why);
#else
  if (device_key == "cuda") throw UsageError("[config] device: cuda, but this binary was built without CUDA");
#endif
  return kCpuDevice;
}

DType compute_dtype(const TrainingArgs& t, Device device) {
  if (!t.bf16) return DType::kF32;
  if (device.is_cpu()) {
    throw UsageError("[config] bf16: true needs a CUDA device; the CPU engine computes in fp32 (set bf16: false)");
  }
  return DType::kBF16;
}

double device_peak_memory_gib(Device device) {
#if PRIMUS_WITH_CUDA
  if (device.type == DeviceType::kCuda) {
    return static_cast<double>(start_cuda_backend(device.index).allocator().stats().peak_allocated_bytes) / (1ull << 30);
  }
#endif
  return 0.0;
}

}  // namespace primus
