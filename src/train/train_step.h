// One optimizer step and one evaluation pass, shared by `train pretrain` and `benchmark train`, plus the
// device choice and memory figures they report.
#pragma once

#include "config/experiment.h"
#include "data/loader.h"
#include "models/llama.h"
#include "optim/adamw.h"

namespace primus {

class Tokenizer;

// Datasheet dense bf16 peak of an H100/H200 SXM, the denominator of MFU (as in the PyTorch reference).
inline constexpr double kPeakBf16Tflops = 989.0;

struct StepResult {
  double loss = 0.0;       // mean token loss over the global batch
  double grad_norm = 0.0;  // before clipping
  int64_t tokens = 0;      // tokens with a label
};

// Device time of a step's phases, from marks queued between them (ops/profile.h's DeviceMark): summed over
// the micro-batches for forward and backward; optimizer = gradient norm + AdamW. Reading them waits for the
// step's work, so trainers ask only on steps they log.
struct StepTimes {
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  double optimizer_ms = 0.0;
};

// Micro-batches per optimizer step: global_batch_size / (micro_batch_size × data-parallel size).
int64_t micro_batches_per_step(const TrainingArgs& t);

// One optimizer step over a global batch of host micro-batches: each is moved to the model's device, fp32
// gradients of the global batch's mean token loss accumulate, then clipping and one AdamW step with `lr`.
// With `times`, also measures the phases (one wait for the device at the end of the step).
StepResult train_step(LlamaModel& model, AdamW& optimizer, const std::vector<Batch>& micro_batches,
                      const TrainingArgs& t, double lr, StepTimes* times = nullptr);

// Mean token loss over eval_iters global batches read from the start of `source` (the same samples each time),
// with the same packed-document masks as training.
double evaluate(LlamaModel& model, const SampleSource& source, const TrainingArgs& t,
                const PackingOptions& packing = {});

// The packing switches of `t` (reset_position_ids, reset_attention_mask, eod_mask_loss) with the tokenizer's EOD
// id. Throws UsageError naming the key when one is on but the tokenizer has no EOD id.
PackingOptions packing_options(const TrainingArgs& t, const Tokenizer& tokenizer);

// The batch's packed-document tensors on `device` (undefined where the batch has none).
PackedSequence packed_on(const Batch& batch, Device device);

// `device` key: cpu, cuda (error when not built or no GPU), or auto (cuda when usable, else cpu). Starts the
// device backend.
Device select_device(const std::string& device_key);
// The model's compute dtype for `bf16`; throws UsageError for bf16 on the CPU.
DType compute_dtype(const TrainingArgs& t, Device device);
// Peak bytes allocated on the device since start, in GiB; 0 for the CPU (not tracked).
double device_peak_memory_gib(Device device);

}  // namespace primus
