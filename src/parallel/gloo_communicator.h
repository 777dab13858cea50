// GlooCommunicator: the Communicator of CPU ranks, over Gloo's TCP transport (Debian's libgloo). Gloo's own
// algorithms do all the communication: allreduce (ring), allgather (ring), alltoall(v) (also under reduce-scatter,
// whose received blocks are then summed in rank order), broadcast (binomial tree), the dissemination barrier, and
// send/recv through unbound buffers.
// Each call runs on the calling thread and returns when it is done; the stream argument is ignored. One thread
// at a time: the per-call tags that match a call with its peers' advance in call order, which must be the same
// on every rank.
//
// Rendezvous: ranks publish their pair addresses in the Store (rank 0's TCP store) under "gloo/<name>/" keys,
// so two communicators never read each other's keys: the world is named "world", the k-th split of a
// communicator N with color c is "N/split<k>/color<c>".
//
// A communicator of one rank opens no socket and needs no store: every collective is then the copy (or
// nothing) its definition asks for. Sends to oneself (at any size) go through a local queue.
//
// Dtypes: reductions take f32, i32, i64 and bf16 (each pairwise step adds in fp32 and rounds, as NCCL does);
// copies (all_gather, all_to_all(v), broadcast, send/recv) take any dtype.
//
// send returns once the peer has posted the matching recv and the bytes went out (Gloo's TCP transport only
// sends into a posted receive), so two ranks that both send first wait for each other: order an exchange
// (the lower rank sends first), as with MPI_Ssend, or use send_recv, which posts its receive before its send.
//
// Failures: a Gloo error (a peer closed its connections, a wait passed the timeout) becomes a RuntimeError
// naming the collective, the element count, the dtype and this rank. Gloo has then closed the pairs, so the
// communicator is unusable: later calls fail at once, repeating the first error.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ops/communicator.h"
#include "parallel/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace primus {

// Where the peers reach this rank's Gloo TCP device.
struct GlooNetwork {
  std::string hostname = "127.0.0.1";  // an address or a host name of this machine
  std::string iface;                   // a network interface (GLOO_SOCKET_IFNAME); when set, used instead
};

class GlooCommunicator final : public Communicator {
 public:
  // Rank `rank` of `size`: connects to every other rank through `store` (kept alive by this communicator
  // and its splits) and fails after `timeout` naming the rank that did not arrive. size 1: `store` may be
  // null and nothing is opened.
  GlooCommunicator(int rank, int size, std::shared_ptr<Store> store, DistributedTimeout timeout,
                   GlooNetwork network = {}, std::string name = "world");
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "gloo"; }
  Device device() const override { return kCpuDevice; }
  const std::string& name() const { return name_; }

  void all_reduce(Tensor& buf, ReduceOp op, Stream stream = {}) override;
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, Stream stream = {}) override;
  void all_gather(const Tensor& in, Tensor& out, Stream stream = {}) override;
  void all_to_all(const Tensor& in, Tensor& out, Stream stream = {}) override;
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                    const std::vector<int64_t>& recv_counts, Stream stream = {}) override;
  void broadcast(Tensor& buf, int root, Stream stream = {}) override;
  void send(const Tensor& buf, int peer, Stream stream = {}) override;
  void recv(Tensor& buf, int peer, Stream stream = {}) override;
  void send_recv(const Tensor& send_buf, int send_peer, Tensor& recv_buf, int recv_peer, Stream stream = {}) override;
  std::unique_ptr<PendingTransfers> start_batch_send_recv(const std::vector<PeerTransfer>& sends,
                                                          const std::vector<PeerTransfer>& recvs,
                                                          Stream stream = {}) override;
  void barrier() override;
  // color >= 0 (a rank outside every group has no NCCL_SPLIT_NOCOLOR here: give it a color of its own).
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  // A split's child shares the parent's TCP device (one Gloo event-loop thread per process).
  GlooCommunicator(int rank, int size, std::shared_ptr<Store> store, DistributedTimeout timeout, GlooNetwork network,
                   std::string name, std::shared_ptr<gloo::transport::Device> device);
  friend class GlooPendingTransfers;
  void connect();
  // Runs one Gloo call; turns Gloo's exceptions into a RuntimeError naming `op`, and remembers it.
  template <typename F>
  void run(const char* op, int64_t count, DType dtype, F&& body);
  void check_usable(const char* op) const;
  void check_cpu(const char* op, const Tensor& t, const char* what) const;
  void check_peer(const char* op, int peer) const;
  uint32_t next_tag() { return tag_++; }
  std::string where() const;

  int rank_;
  int size_;
  std::shared_ptr<Store> store_;
  DistributedTimeout timeout_;
  GlooNetwork network_;
  std::string name_;
  std::shared_ptr<gloo::transport::Device> device_;  // null at size 1
  std::shared_ptr<gloo::Context> context_;           // null at size 1
  // Every rank calls the collectives in the same order, so counters advanced per call agree across ranks.
  uint32_t tag_ = 0;
  int splits_ = 0;
  std::deque<std::vector<char>> to_self_;  // sends to this rank, not received yet
  std::vector<char> scratch_;              // reduce_scatter's received blocks
  std::string failure_;                    // the first Gloo failure; empty while usable
};

}  // namespace primus
