// The communicator seam: the collectives the engine uses, over flat contiguous tensors, with two
// implementations behind it: NCCL for GPU ranks (RCCL on AMD has the same API) and Gloo for CPU ranks.
// A world of one is a real communicator (every collective is then a copy or nothing), never a branch in
// the caller. The interface lives in ops, below layers and models, so that tensor parallelism can hand a layer
// its group; the implementations live in parallel/.
//
// Streams. A GPU communicator enqueues each collective on the stream it is given (Backend::stream) and
// returns at once; ordering against other streams is the caller's, through Backend events. A host
// communicator (Gloo) runs the collective on the calling thread and returns when it is done; the stream
// argument is then ignored. Either way a caller that issues a collective on the communication stream and
// waits for it through an event, as parallel/grad_reducer does, overlaps it with compute.
//
// Every collective is called by every rank of the communicator, in the same order, with the same sizes.
// A rank that does not arrive makes the others fail after the communicator's timeout
// (distributed_timeout_minutes) with a RuntimeError naming the collective, not hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace primus {

enum class ReduceOp { kSum, kMax, kMin };

// One tensor of a batch of point-to-point transfers (Communicator::batch_send_recv): sent to, or received from,
// `peer`; a receive's tensor is written in place (a Tensor is a view, so the caller's copy sees the bytes).
struct PeerTransfer {
  Tensor tensor;
  int peer = 0;
  uint32_t tag = 0;
};
// "to rank 1 (tag 7), from rank 3 (tag 9)", for errors.
std::string describe_transfers(const std::vector<PeerTransfer>& sends, const std::vector<PeerTransfer>& recvs);
const char* reduce_op_name(ReduceOp op);

// The transfers of one Communicator::start_batch_send_recv still under way. On a host communicator (Gloo) the waits
// block this thread until the peers' matching transfers are done, or fail after the communicator's timeout naming
// them; on a GPU communicator the transfers are queued on the batch's stream, which orders them against later work
// on it, and the waits return at once (as for the collectives, other streams order through Backend events).
// Destroying it waits for whatever was not waited for, so no buffer is freed under a transfer.
class PendingTransfers {
 public:
  virtual ~PendingTransfers() = default;
  // Returns once the receives have landed: their tensors may be read. The sends may still be under way, waiting for a
  // peer that has not posted its receive yet.
  virtual void wait_receives() = 0;
  // Returns once the sends are done with their tensors too.
  virtual void wait() = 0;
};

// Transfers that were complete when started (a world of one, the default batch, a GPU stream's order).
class CompletedTransfers final : public PendingTransfers {
 public:
  void wait_receives() override {}
  void wait() override {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "nccl" or "gloo", for logs and benchmark tables.
  virtual std::string backend_name() const = 0;
  // The device whose memory the buffers must live in (a CUDA device for NCCL, the CPU for Gloo).
  virtual Device device() const = 0;

  // buf ← op over ranks of buf, in place. f32, bf16 (sum in fp32 where the library does), i32, i64.
  virtual void all_reduce(Tensor& buf, ReduceOp op, Stream stream = {}) = 0;
  // in [size · n] on every rank; out [n] ← op over ranks of in[rank · n, (rank + 1) · n). out may be that
  // slice of in itself (in-place, as NCCL allows), otherwise it must not overlap in.
  virtual void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, Stream stream = {}) = 0;
  // in [n]; out [size · n] ← the concatenation over ranks in rank order. in may be the slice
  // out[rank · n, (rank + 1) · n) itself (in-place).
  virtual void all_gather(const Tensor& in, Tensor& out, Stream stream = {}) = 0;
  // in, out [size · n]: block j of in goes to rank j, block i of out comes from rank i.
  virtual void all_to_all(const Tensor& in, Tensor& out, Stream stream = {}) = 0;
  // Uneven blocks: send_counts[j] elements (from the start of in, blocks back to back) to rank j;
  // recv_counts[i] elements from rank i into out, back to back. Counts are elements, length size().
  virtual void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                            const std::vector<int64_t>& recv_counts, Stream stream = {}) = 0;
  // buf on every rank ← buf of `root`.
  virtual void broadcast(Tensor& buf, int root, Stream stream = {}) = 0;
  // Point to point; a send is matched by the peer's recv of the same size. Between a pair, messages
  // arrive in the order they were sent.
  virtual void send(const Tensor& buf, int peer, Stream stream = {}) = 0;
  virtual void recv(Tensor& buf, int peer, Stream stream = {}) = 0;
  // A send to send_peer and a receive from recv_peer at once: one step of a ring, every rank of which calls it
  // together (ring attention passes key/value blocks so). Matched by the peers' send_recv, or their recv and send.
  // send_buf and recv_buf must not overlap; a peer may be this rank only if both are. The implementations post
  // both sides together (an NCCL group; two Gloo buffers waited for together); this default, for other
  // communicators, orders them for a ring of plain send/recv that cannot wait on itself: even ranks send first,
  // odd ranks receive first.
  virtual void send_recv(const Tensor& send_buf, int send_peer, Tensor& recv_buf, int recv_peer, Stream stream = {}) {
    if (rank() % 2 == 0) {
      send(send_buf, send_peer, stream);
      recv(recv_buf, recv_peer, stream);
    } else {
      recv(recv_buf, recv_peer, stream);
      send(send_buf, send_peer, stream);
    }
  }
  // A batch of point-to-point transfers posted together: every send goes to its peer's receive of the same tag (a
  // pipeline stage tags an activation or gradient by its micro-batch, model chunk and direction, so two of them never
  // mix even when the same two ranks exchange both at once). Every rank named as a peer posts the matching transfers
  // in a batch of its own, and the batches between a pair come in the same order on both sides. Tags below 2^24.
  // start_batch_send_recv returns without waiting for a peer: the tensors must stay alive, the sends unchanged and
  // the receives unread until the returned PendingTransfers says so. The implementations post all the receives, then
  // all the sends (Gloo; an NCCL group on the stream), so no order among the ranks can deadlock; a wait past the
  // timeout fails naming the peers and tags. This default, for other communicators, runs the transfers at once, peer
  // by peer in ascending peer order, the lower rank of each pair sending first (MPI_Ssend's order).
  virtual std::unique_ptr<PendingTransfers> start_batch_send_recv(const std::vector<PeerTransfer>& sends,
                                                                  const std::vector<PeerTransfer>& recvs,
                                                                  Stream stream = {});
  // start_batch_send_recv, then wait for all of it.
  void batch_send_recv(const std::vector<PeerTransfer>& sends, const std::vector<PeerTransfer>& recvs,
                       Stream stream = {});
  // Returns once every rank has called it (a host wait, whatever the device).
  virtual void barrier() = 0;

  // A communicator over the ranks of this one whose `color` equals the caller's, ordered by (key, rank), as
  // MPI_Comm_split / ncclCommSplit. Collective: every rank of this communicator calls it. ParallelDims
  // builds the dp/tp/pp/cp groups this way.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// How long a rank waits for the others (rendezvous, a collective, a store key) before failing with a
// message naming what it waited for: distributed_timeout_minutes (Megatron's key, default 10).
using DistributedTimeout = std::chrono::milliseconds;

}  // namespace primus
