#include "layers/context_parallel.h"

#include <chrono>
#include <future>
#include <utility>
#include <vector>

#include "ops/ops.h"
#include "ops/profile.h"

namespace primus {

namespace {

// Rows [begin, begin + rows) of a tensor whose first dimension is its rows, as a [rows, ...] view.
Tensor rows_of(const Tensor& t, int64_t begin, int64_t rows) {
  Shape shape = t.shape();
  const int64_t per_row = t.numel() / shape[0];
  shape[0] = rows;
  return t.slice_elements(begin * per_row, shape);
}

// A pending ring step: a task on the host, or an event on the device's communication stream.
struct Exchange {
  std::shared_future<void> host;
  std::unique_ptr<DeviceEvent> done;
  bool pending = false;
};

}  // namespace

struct ContextParallelGroup::Ring {
  std::shared_ptr<Communicator> comm;
  std::shared_future<void> last;  // host: the exchange queued last; each runs after the one before it

  // send → rank + 1 and recv ← rank − 1, queued after the compute work queued so far; returns at once.
  Exchange start(const Tensor& send, Tensor& recv) {
    const int next = (comm->rank() + 1) % comm->size(), prev = (comm->rank() + comm->size() - 1) % comm->size();
    Exchange x;
    x.pending = true;
    if (send.device().is_cpu()) {
      // One exchange at a time on the communicator, in the order queued (Gloo takes one thread at a time, and every
      // rank must issue them in the same order).
      // The task drops what it captured once done: std::async keeps the callable in the future's shared state, so a
      // captured `before` would chain every exchange since the start (and its buffers) to the last one.
      x.host = std::async(std::launch::async, [comm = comm, before = last, send = Tensor(send), recv, next, prev]() mutable {
                 if (before.valid()) before.get();
                 before = {};
                 const auto begin = std::chrono::steady_clock::now();
                 comm->send_recv(send, next, recv, prev);
                 send = Tensor();
                 recv = Tensor();
                 ops::Trace::add_span("communication (ring thread)", "context parallel: ring exchange", begin,
                                      std::chrono::steady_clock::now());
               }).share();
      last = x.host;
      return x;
    }
    Backend& backend = backend_for(send.device());
    const Stream comm_stream = backend.stream(StreamKind::kComm);
    const std::unique_ptr<DeviceEvent> produced = backend.record_event(backend.stream(StreamKind::kCompute));
    backend.wait_event(comm_stream, *produced);
    comm->send_recv(send, next, recv, prev, comm_stream);
    backend.record_stream(send, comm_stream);
    backend.record_stream(recv, comm_stream);
    x.done = backend.record_event(comm_stream);
    return x;
  }

  // Later compute (and, on the host, the caller) waits for the exchange; rethrows its failure.
  static void finish(Exchange& x, const Tensor& recv) {
    if (!x.pending) return;
    x.pending = false;
    if (x.host.valid()) {
      x.host.get();
      return;
    }
    Backend& backend = backend_for(recv.device());
    backend.wait_event(backend.stream(StreamKind::kCompute), *x.done);
  }
};

ContextParallelGroup::ContextParallelGroup(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {
  PRIMUS_CHECK(comm_ != nullptr, "[context parallel] no communicator");
  ring_ = std::make_shared<Ring>();
  ring_->comm = comm_;
}

Tensor ContextParallelGroup::local_chunks(const Tensor& sequences) const {
  PRIMUS_CHECK(sequences.ndim() == 2 && sequences.dtype() == DType::kI32 && sequences.device().is_cpu(),
               "[context parallel] sequences {} must be host [B, T] i32", sequences.describe());
  const int64_t B = sequences.dim(0), T = sequences.dim(1), parts = 2 * size();
  PRIMUS_CHECK(T % parts == 0, "[context parallel] a sequence of {} tokens does not split into {} chunks", T, parts);
  const int64_t C = T / parts;
  Tensor local = Tensor::empty({2 * B, C}, DType::kI32);
  for (int half = 0; half < 2; ++half) {
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* src = sequences.i32() + b * T + chunk(half) * C;
      std::copy(src, src + C, local.i32() + (half * B + b) * C);
    }
  }
  return local;
}

Tensor ContextParallelGroup::positions(int64_t batch, int64_t chunk_length) const {
  Tensor positions = Tensor::empty({2 * batch, chunk_length}, DType::kI32);
  for (int half = 0; half < 2; ++half) {
    for (int64_t b = 0; b < batch; ++b) {
      int32_t* row = positions.i32() + (half * batch + b) * chunk_length;
      for (int64_t t = 0; t < chunk_length; ++t) row[t] = static_cast<int32_t>(chunk(half) * chunk_length + t);
    }
  }
  return positions;
}

namespace {

void check_ring_shapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  PRIMUS_CHECK(q.ndim() == 4 && q.dim(0) % 2 == 0 && k.ndim() == 4 && k.dim(0) == q.dim(0) && k.dim(1) == q.dim(1) &&
                   k.dim(3) == q.dim(3) && v.shape() == k.shape(),
               "[context parallel] ring attention takes q [2B, C, Hq, D] and k, v [2B, C, Hkv, D] (two halves of B "
               "chunks), not q {}, k {}, v {}",
               q.describe(), k.describe(), v.describe());
}

// The keys and values of this rank's chunks in one buffer, one message a step: [2 (k, v), 2B, C, Hkv, D].
Tensor pack_kv(const Tensor& k, const Tensor& v) {
  Tensor kv = Tensor::empty({2, k.dim(0), k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), k.device());
  Tensor k_part = kv.slice_elements(0, k.shape()), v_part = kv.slice_elements(k.numel(), v.shape());
  ops::copy(k_part, k);
  ops::copy(v_part, v);
  return kv;
}

// Half `half` (0, 1) of the keys (which 0) or values (1) in a packed [2, 2B, C, Hkv, D] buffer: [B, C, Hkv, D].
Tensor kv_half(const Tensor& kv, int which, int half) {
  const Shape shape{kv.dim(1) / 2, kv.dim(2), kv.dim(3), kv.dim(4)};
  return kv.slice_elements((2 * which + half) * shape_numel(shape), shape);
}

// The blocks of a ring step: (query half, key/value half, mask), in the order they are computed.
struct Block {
  int q_half;
  int kv_half;
  AttentionMask mask;
};
std::vector<Block> step_blocks(int rank, int source) {
  if (source == rank) {
    return {{0, 0, AttentionMask::kCausal}, {1, 0, AttentionMask::kNone}, {1, 1, AttentionMask::kCausal}};
  }
  if (source < rank) return {{0, 0, AttentionMask::kNone}, {1, 0, AttentionMask::kNone}};
  return {{1, 0, AttentionMask::kNone}, {1, 1, AttentionMask::kNone}};
}

}  // namespace

void ContextParallelGroup::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                             Tensor& lse) const {
  check_ring_shapes(q, k, v);
  const ops::ProfileScope scope("context parallel: ring attention");
  const int64_t B = q.dim(0) / 2;
  const int P = size(), r = rank();
  Tensor current = pack_kv(k, v);
  Tensor incoming = Tensor::empty(current.shape(), current.dtype(), current.device());
  Tensor block_out = Tensor::empty(rows_of(q, 0, B).shape(), q.dtype(), q.device());      // [B, C, Hq, D]
  Tensor block_lse = Tensor::empty(rows_of(lse, 0, B).shape(), DType::kF32, q.device());  // [B, Hq, C]
  bool written[2] = {false, false};  // whether out/lse of a query half hold a first block yet
  for (int s = 0; s < P; ++s) {
    Exchange x;
    if (s + 1 < P) x = ring_->start(current, incoming);  // the next step's keys and values, during this one
    for (const Block& blk : step_blocks(r, (r - s + P) % P)) {
      const Tensor qh = rows_of(q, blk.q_half * B, B);
      const Tensor kh = kv_half(current, 0, blk.kv_half), vh = kv_half(current, 1, blk.kv_half);
      Tensor oh = rows_of(out, blk.q_half * B, B), lh = rows_of(lse, blk.q_half * B, B);
      if (!written[blk.q_half]) {
        ops::attention_block_forward(qh, kh, vh, blk.mask, oh, lh);
        written[blk.q_half] = true;
      } else {
        ops::attention_block_forward(qh, kh, vh, blk.mask, block_out, block_lse);
        ops::attention_merge(oh, lh, block_out, block_lse);
      }
    }
    if (s + 1 < P) {
      Ring::finish(x, incoming);
      std::swap(current, incoming);
    }
  }
}

void ContextParallelGroup::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                              const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                                              Tensor& dv) const {
  check_ring_shapes(q, k, v);
  const ops::ProfileScope scope("context parallel: ring attention (backward)");
  const int64_t B = q.dim(0) / 2;
  const int P = size(), r = rank();
  Tensor current = pack_kv(k, v);
  Tensor incoming = Tensor::empty(current.shape(), current.dtype(), current.device());
  // dK, dV accumulators [2 (dk, dv), 2B, C, Hkv, D]: `held` belongs to the keys and values this rank holds now;
  // `arriving` receives the next one; `contrib` takes this rank's contributions while the accumulator travels.
  Tensor held = ops::zeros(current.shape(), current.dtype(), current.device());
  Tensor arriving = Tensor::empty(current.shape(), current.dtype(), current.device());
  Tensor contrib = Tensor::empty(current.shape(), current.dtype(), current.device());
  Tensor block_dq = Tensor::empty(rows_of(q, 0, B).shape(), q.dtype(), q.device());  // [B, C, Hq, D]
  Tensor block_dk = Tensor::empty(kv_half(current, 0, 0).shape(), k.dtype(), k.device());
  Tensor block_dv = Tensor::empty(block_dk.shape(), k.dtype(), k.device());
  bool written[2] = {false, false};  // whether a dq half holds a first block yet
  Exchange gradients;                // the accumulator on its way to this rank (from the previous step)
  for (int s = 0; s < P; ++s) {
    Exchange keys;
    if (s + 1 < P) keys = ring_->start(current, incoming);
    // This step's contributions go straight into the accumulator at s = 0 (it is this rank's own), else aside until
    // the travelling accumulator has arrived.
    Tensor& sink = s == 0 ? held : contrib;
    if (s > 0) ops::zero(contrib);
    for (const Block& blk : step_blocks(r, (r - s + P) % P)) {
      const Tensor qh = rows_of(q, blk.q_half * B, B), oh = rows_of(out, blk.q_half * B, B);
      const Tensor lh = rows_of(lse, blk.q_half * B, B), gh = rows_of(dout, blk.q_half * B, B);
      const Tensor kh = kv_half(current, 0, blk.kv_half), vh = kv_half(current, 1, blk.kv_half);
      Tensor dqh = rows_of(dq, blk.q_half * B, B);
      Tensor& dq_target = written[blk.q_half] ? block_dq : dqh;
      ops::attention_block_backward(qh, kh, vh, blk.mask, oh, lh, gh, dq_target, block_dk, block_dv);
      if (written[blk.q_half]) ops::add_inplace(dqh, block_dq);
      written[blk.q_half] = true;
      Tensor sink_dk = kv_half(sink, 0, blk.kv_half), sink_dv = kv_half(sink, 1, blk.kv_half);
      ops::add_inplace(sink_dk, block_dk);
      ops::add_inplace(sink_dv, block_dv);
    }
    if (s > 0) {
      Ring::finish(gradients, arriving);
      std::swap(held, arriving);
      ops::add_inplace(held, contrib);
    }
    // On to the next rank, which adds its contributions; after the last step it reaches the owner.
    if (P > 1) gradients = ring_->start(held, arriving);
    if (s + 1 < P) {
      Ring::finish(keys, incoming);
      std::swap(current, incoming);
    }
  }
  // This rank's own accumulator, every rank's contributions in it: [dk (both halves), dv (both halves)].
  if (P > 1) {
    Ring::finish(gradients, arriving);
  } else {
    std::swap(held, arriving);
  }
  ops::copy(dk, arriving.slice_elements(0, dk.shape()));
  ops::copy(dv, arriving.slice_elements(dk.numel(), dv.shape()));
}

}  // namespace primus
