#include "train/pipeline_step.h"

#include <fmt/format.h>

#include <map>
#include <tuple>

#include "ops/ops.h"
#include "ops/profile.h"
#include "train/train_step.h"

namespace primus {

namespace {

const char* const kEmbedding = "model.embed_tokens.weight";

// A micro-batch's inputs on the model's device.
struct DeviceBatch {
  Tensor tokens;
  Tensor labels;
  PackedSequence packed;
};

std::vector<DeviceBatch> to_device(const std::vector<Batch>& batches, Device device) {
  std::vector<DeviceBatch> out;
  for (const Batch& b : batches) {
    out.push_back({ops::to_device(b.tokens, device), ops::to_device(b.labels, device), packed_on(b, device)});
  }
  return out;
}

// A stage's transfers during one step. A tick's transfers start after its computation without waiting for the
// peers (Communicator::start_batch_send_recv); a computation waits only for its own input. So a stage never waits for
// a peer to take what it sent, only for what it needs, and the stages run ahead of each other as far as the schedule's
// dependencies allow instead of in lockstep (the interleaved schedule's bubble depends on it: docs/perf/).
class StageMailbox {
 public:
  StageMailbox(const Pipeline& pipeline, Shape hidden_shape, DType dtype, Device device)
      : pipeline_(pipeline), shape_(std::move(hidden_shape)), dtype_(dtype), device_(device) {}

  // The activation or gradient of `micro_batch` for `chunk`, once it has landed.
  Tensor take(int micro_batch, int chunk, bool gradient) {
    const auto it = inbox_.find({micro_batch, chunk, gradient});
    PRIMUS_CHECK(it != inbox_.end(), "[pipeline] stage {}: the {} of micro-batch {} for chunk {} was never posted",
                 pipeline_.stage(), gradient ? "gradient" : "activation", micro_batch, chunk);
    Arrival arrival = std::move(it->second);
    inbox_.erase(it);
    arrival.pending->wait_receives();
    return arrival.tensor;
  }

  // Starts the tick's sends of `outgoing` and its receives into fresh buffers.
  void post(const PipelineTick& tick, const Tensor& outgoing) {
    if (tick.sends.empty() && tick.recvs.empty()) return;
    std::vector<PeerTransfer> sends, recvs;
    for (const PipelineTransfer& t : tick.sends) {
      PRIMUS_CHECK(outgoing.defined(), "[pipeline] stage {}: nothing to send to stage {}", pipeline_.stage(), t.peer);
      sends.push_back({outgoing, t.peer, t.tag});
    }
    for (const PipelineTransfer& t : tick.recvs) {
      recvs.push_back({Tensor::empty(shape_, dtype_, device_), t.peer, t.tag});
    }
    std::shared_ptr<PendingTransfers> pending = pipeline_.stages->start_batch_send_recv(sends, recvs);
    for (size_t i = 0; i < tick.recvs.size(); ++i) {
      const PipelineTransfer& t = tick.recvs[i];
      inbox_[{t.micro_batch, t.chunk, t.gradient}] = Arrival{recvs[i].tensor, pending};
    }
    if (!sends.empty()) in_flight_.push_back({outgoing, std::move(pending)});
  }

  // Waits for the peers to have taken every send; every receive must have been taken.
  void finish() {
    for (Arrival& sent : in_flight_) sent.pending->wait();
    in_flight_.clear();
    PRIMUS_CHECK(inbox_.empty(), "[pipeline] stage {}: {} transfers left unused after the step", pipeline_.stage(),
                 inbox_.size());
  }

 private:
  struct Arrival {
    Tensor tensor;  // received into, or sent from (kept alive until the peer has it)
    std::shared_ptr<PendingTransfers> pending;
  };
  const Pipeline& pipeline_;
  Shape shape_;
  DType dtype_;
  Device device_;
  std::map<std::tuple<int, int, bool>, Arrival> inbox_;  // by (micro-batch, consuming chunk, gradient)
  std::vector<Arrival> in_flight_;
};

std::string span_name(int stage, bool backward, int micro_batch, int chunk) {
  return fmt::format("stage {} {} micro-batch {} chunk {}", stage, backward ? "backward" : "forward", micro_batch,
                     chunk);
}

Shape hidden_shape(const Model& model, const Tensor& tokens) {
  return {model.chunk_rows(tokens.numel()), model.args().hidden_size};
}

}  // namespace

Pipeline make_pipeline(const ProcessGroups& groups, bool tied_embeddings) {
  Pipeline p;
  p.chunks = groups.dims.vpp();
  if (groups.pp->size() == 1) return p;
  p.stages = std::shared_ptr<Communicator>(groups.pp->split(0, groups.pp->rank()));
  if (tied_embeddings) p.embedding = groups.embedding;
  return p;
}

void check_pipeline_schedule(const Pipeline& pipeline, int64_t micro_batches) {
  if (!pipeline.active()) return;
  pipeline_compute_order(
      PipelineScheduleSpec{pipeline.stages->size(), pipeline.chunks, static_cast<int>(micro_batches), false}, 0);
}

void pipeline_forward_backward(Model& model, const Pipeline& pipeline, const std::vector<Batch>& batches,
                               float grad_scale, Tensor& loss_sum) {
  const int stage = pipeline.stage();
  const PipelineSchedule schedule = make_pipeline_schedule(PipelineScheduleSpec{
      pipeline.stages->size(), model.num_chunks(), static_cast<int>(batches.size()), false});
  const std::vector<DeviceBatch> inputs = to_device(batches, model.device());
  // Every micro-batch's hidden state has one shape.
  StageMailbox mailbox(pipeline, hidden_shape(model, inputs.front().tokens), model.compute_dtype(), model.device());
  std::map<std::pair<int, int>, std::unique_ptr<MicroBatchContext>> contexts;  // (micro-batch, chunk)
  for (const PipelineTick& tick : schedule.stages[static_cast<size_t>(stage)]) {
    Tensor outgoing;
    if (tick.compute) {
      const PipelineCompute& c = *tick.compute;
      const DeviceBatch& in = inputs[static_cast<size_t>(c.micro_batch)];
      if (!c.backward) {
        const bool embeds = stage == 0 && c.chunk == 0;
        const Tensor input = embeds ? Tensor() : mailbox.take(c.micro_batch, c.chunk, false);
        const ops::ProfileScope scope(span_name(stage, false, c.micro_batch, c.chunk));
        contexts[{c.micro_batch, c.chunk}] =
            model.forward_chunk(c.chunk, in.tokens, in.labels, input, grad_scale, loss_sum, outgoing, in.packed);
      } else {
        const bool loss_chunk = pipeline.last() && c.chunk + 1 == model.num_chunks();
        const Tensor grad = loss_chunk ? Tensor() : mailbox.take(c.micro_batch, c.chunk, true);
        auto it = contexts.find({c.micro_batch, c.chunk});
        PRIMUS_CHECK(it != contexts.end(), "[pipeline] stage {}: backward of micro-batch {} chunk {} before its forward",
                     stage, c.micro_batch, c.chunk);
        const ops::ProfileScope scope(span_name(stage, true, c.micro_batch, c.chunk));
        outgoing = model.backward_chunk(*it->second, grad);
        contexts.erase(it);
      }
    }
    mailbox.post(tick, outgoing);
  }
  mailbox.finish();
  PRIMUS_CHECK(contexts.empty(), "[pipeline] stage {}: {} contexts left after the step", stage, contexts.size());
}

LossSum pipeline_evaluate(Model& model, const Pipeline& pipeline, const std::vector<Batch>& batches) {
  const int stage = pipeline.stage();
  const PipelineSchedule schedule = make_pipeline_schedule(PipelineScheduleSpec{
      pipeline.stages->size(), model.num_chunks(), static_cast<int>(batches.size()), true});
  const std::vector<DeviceBatch> inputs = to_device(batches, model.device());
  StageMailbox mailbox(pipeline, hidden_shape(model, inputs.front().tokens), model.compute_dtype(), model.device());
  LossSum total;
  for (const PipelineTick& tick : schedule.stages[static_cast<size_t>(stage)]) {
    Tensor outgoing;
    if (tick.compute) {
      const PipelineCompute& c = *tick.compute;
      const DeviceBatch& in = inputs[static_cast<size_t>(c.micro_batch)];
      const Tensor input = stage == 0 && c.chunk == 0 ? Tensor() : mailbox.take(c.micro_batch, c.chunk, false);
      const ops::ProfileScope scope(span_name(stage, false, c.micro_batch, c.chunk));
      LossSum loss;
      outgoing = model.evaluate_chunk(c.chunk, in.tokens, in.labels, input, loss, in.packed);
      total.loss_sum += loss.loss_sum;
      total.tokens += loss.tokens;
    }
    mailbox.post(tick, outgoing);
  }
  mailbox.finish();
  // The losses from the last stage; the token counts every stage knows from its labels.
  Tensor loss = Tensor::empty({1}, DType::kF32);
  loss.f32()[0] = static_cast<float>(total.loss_sum);
  Tensor on_device = ops::to_device(loss, pipeline.stages->device());
  pipeline.stages->broadcast(on_device, pipeline.stages->size() - 1);
  total.loss_sum = static_cast<double>(ops::to_device(on_device, kCpuDevice).f32()[0]);
  total.tokens = 0;
  for (const Batch& b : batches) total.tokens += counted_tokens(b.labels);
  return total;
}

std::vector<float> pipeline_next_token_logits(Model& model, const Pipeline& pipeline,
                                              const std::vector<int32_t>& context) {
  // The virtual stages in order, one after another (one micro-batch): chunk v of stage s is virtual stage v·pp + s.
  const int stages = pipeline.stages->size(), stage = pipeline.stage();
  const int virtual_stages = stages * model.num_chunks();
  const Shape shape{model.chunk_rows(static_cast<int64_t>(context.size())), model.args().hidden_size};
  std::vector<float> logits;
  Tensor hidden;
  for (int k = 0; k < virtual_stages; ++k) {
    if (k % stages != stage) continue;
    const int chunk = k / stages;
    if (k > 0) {
      Tensor buf = Tensor::empty(shape, model.compute_dtype(), model.device());
      pipeline.stages->batch_send_recv({}, {PeerTransfer{buf, (k - 1) % stages, static_cast<uint32_t>(k)}});
      hidden = buf;
    }
    hidden = model.logits_chunk(chunk, context, hidden, logits);
    if (k + 1 < virtual_stages) {
      pipeline.stages->batch_send_recv({PeerTransfer{hidden, (k + 1) % stages, static_cast<uint32_t>(k + 1)}}, {});
    }
  }
  // The last stage has them; the others learn their number, then the values.
  Tensor count = Tensor::empty({1}, DType::kI64);
  static_cast<int64_t*>(count.data())[0] = static_cast<int64_t>(logits.size());
  pipeline.stages->broadcast(count, stages - 1);
  Tensor values = Tensor::empty({static_cast<int64_t*>(count.data())[0]}, DType::kF32);
  if (pipeline.last()) std::copy(logits.begin(), logits.end(), values.f32());
  Tensor on_device = ops::to_device(values, pipeline.stages->device());
  pipeline.stages->broadcast(on_device, stages - 1);
  values = ops::to_device(on_device, kCpuDevice);
  return std::vector<float>(values.f32(), values.f32() + values.numel());
}

void sum_tied_embedding_grads(Model& model, const Pipeline& pipeline) {
  if (!pipeline.active() || pipeline.embedding == nullptr || pipeline.embedding->size() == 1) return;
  ParamStore& params = model.params();
  const size_t i = params.index_of(kEmbedding);
  Tensor grad = params.flat_grads().slice_elements(params.offset(i), {shape_numel(params.specs()[i].shape)});
  pipeline.embedding->all_reduce(grad, ReduceOp::kSum);
}

void broadcast_tied_embedding(Model& model, const Pipeline& pipeline) {
  if (!pipeline.active() || pipeline.embedding == nullptr || pipeline.embedding->size() == 1) return;
  ParamStore& params = model.params();
  const size_t i = params.index_of(kEmbedding);
  Tensor weight = params.flat_params().slice_elements(params.offset(i), {shape_numel(params.specs()[i].shape)});
  pipeline.embedding->broadcast(weight, 0);
  model.weights_changed();
}

}  // namespace primus
