// Pipeline parallelism's side of a step (parallel/pipeline_schedule.h gives the order): the forwards and backwards of
// this stage's model chunks over a step's micro-batches, the activations and gradients exchanged with the other
// stages tick by tick; evaluation's forwards; sampling's forward of one context. Each stage holds the tokens and labels
// of every micro-batch (every rank of a pipeline reads the same samples), so a transfer carries only the hidden state.
#pragma once

#include <memory>
#include <vector>

#include "data/loader.h"
#include "models/model.h"
#include "parallel/parallel_dims.h"
#include "parallel/pipeline_schedule.h"

namespace primus {

struct Pipeline {
  std::shared_ptr<Communicator> stages;     // this rank's pipeline (its rank in it is its stage), for transfers only
  std::shared_ptr<Communicator> embedding;  // first and last stage: the tied embedding's copies (null: untied)
  int chunks = 1;                           // virtual stages per stage
  bool active() const { return stages != nullptr && stages->size() > 1; }
  int stage() const { return stages->rank(); }
  bool last() const { return stages->rank() == stages->size() - 1; }
};

// The pipeline of this rank in `groups` (inactive at pp 1). Collective over the world (it splits a communicator of its
// own off the pp group, so that its transfers never interleave with other users of that group).
Pipeline make_pipeline(const ProcessGroups& groups, bool tied_embeddings);

// Before the first step: the schedule of `micro_batches` per step exists for this pipeline (the interleaved one needs
// a multiple of the stages); UsageError naming the keys if not. Nothing at pp 1.
void check_pipeline_schedule(const Pipeline& pipeline, int64_t micro_batches);

// Forward and backward of every micro-batch (host batches, moved to the model's device here) through the schedule:
// 1F1B, or interleaved when the model has several chunks. The loss chunk adds grad_scale × its token losses to
// loss_sum (only the last stage has any); gradients accumulate in the model's buffers, unreduced.
void pipeline_forward_backward(Model& model, const Pipeline& pipeline, const std::vector<Batch>& batches,
                               float grad_scale, Tensor& loss_sum);

// Evaluation's forwards of the micro-batches (forward-only schedule): Σ token losses (computed on the last stage,
// broadcast in f32) and counted tokens, the same on every stage.
LossSum pipeline_evaluate(Model& model, const Pipeline& pipeline, const std::vector<Batch>& batches);

// The next-token logits of `context` through every stage (each calls it with the same context): the last stage
// computes them and broadcasts them over the pipeline, so every stage returns them.
std::vector<float> pipeline_next_token_logits(Model& model, const Pipeline& pipeline,
                                              const std::vector<int32_t>& context);

// With tied embeddings at pp > 1: the first stage's embedding gradient and the last stage's copy's, summed over the
// embedding group so the two stay equal after the step (Megatron's). A no-op elsewhere.
void sum_tied_embedding_grads(Model& model, const Pipeline& pipeline);
// And their weights: the first stage's broadcast to the last (after initialisation or loading).
void broadcast_tied_embedding(Model& model, const Pipeline& pipeline);

}  // namespace primus
