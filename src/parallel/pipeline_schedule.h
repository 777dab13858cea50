// Pipeline schedules as pure data: for a pipeline of `stages` ranks, each holding `chunks` model chunks (virtual
// stages), and `micro_batches` micro-batches per step, what each stage computes and sends and receives, in lockstep
// ticks. No tensors here; train/pipeline_step.cpp executes a schedule and tests/parallel/pipeline_schedule_test.cpp
// runs all stages' schedules together.
//
// Virtual stage k = chunk · stages + stage (Megatron's interleaved assignment, parallel_dims.h): micro-batch m's
// activation flows k → k + 1 (from the last stage's chunk c to the first stage's chunk c + 1), its gradient back.
//
// Compute order per stage:
//   1F1B (chunks 1): warm-up min(stages − stage − 1, m) forwards, then one forward and one backward alternating,
//   then the cool-down backwards; at most `stages` micro-batches are in flight on a stage.
//   Interleaved (chunks > 1): Megatron's order of the m · chunks virtual micro-batches (groups of `stages`
//   micro-batches go through chunk 0, then chunk 1, ...; backward from the last chunk), warm-up
//   (stages − stage − 1) · 2 + (chunks − 1) · stages forwards. Needs m a multiple of `stages`.
//   Forward only (evaluation): the forwards of that order.
// Ticks: in each tick every stage runs its next computation if its input has arrived (else it idles), then the tick's
// transfers are posted together (Communicator::start_batch_send_recv): a computation's output goes out in the tick
// that computed it and its consumer posts the receive in the same tick, to use it in a later one. Every stage has the
// same number of ticks, so both sides of every transfer post it in batches of the same order (which NCCL's in-order
// matching needs). The ticks order the posts only: train/pipeline_step.cpp waits for nothing but a computation's own
// input, so the stages are not held in lockstep.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace primus {

struct PipelineScheduleSpec {
  int stages = 1;          // pipeline_model_parallel_size
  int chunks = 1;          // virtual stages per stage (1: 1F1B)
  int micro_batches = 1;   // per step, per data-parallel rank
  bool forward_only = false;
};

struct PipelineCompute {
  bool backward = false;
  int micro_batch = 0;
  int chunk = 0;  // of this stage
  bool operator==(const PipelineCompute&) const = default;
};

// One tensor between two stages: the activation (forward) or the gradient (backward) of `micro_batch` at the boundary
// into virtual stage `consumer` (activation: its input; gradient: the gradient of its output).
struct PipelineTransfer {
  int peer = 0;       // the other stage
  int micro_batch = 0;
  int chunk = 0;      // the chunk of this stage that produced it (send) or will consume it (receive)
  bool gradient = false;
  uint32_t tag = 0;   // the same on both sides: from micro-batch, consumer virtual stage and direction
};

struct PipelineTick {
  std::optional<PipelineCompute> compute;
  std::vector<PipelineTransfer> sends;
  std::vector<PipelineTransfer> recvs;
};

struct PipelineSchedule {
  PipelineScheduleSpec spec;
  std::vector<std::vector<PipelineTick>> stages;  // [stage][tick], every stage the same number of ticks
};

// The computations of `stage` in order. Throws UsageError naming the keys when chunks > 1 and micro_batches is not a
// multiple of stages (global_batch_size / (micro_batch_size × data-parallel size) must be then).
std::vector<PipelineCompute> pipeline_compute_order(const PipelineScheduleSpec& spec, int stage);

// Every stage's ticks. Throws RuntimeError if the orders could wait on each other (a bug, which the simulator test
// guards against).
PipelineSchedule make_pipeline_schedule(const PipelineScheduleSpec& spec);

// "1F1B", "interleaved 1F1B (2 virtual stages)" or "forward only", for logs.
std::string describe(const PipelineScheduleSpec& spec);

}  // namespace primus
