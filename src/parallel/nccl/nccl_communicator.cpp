// NcclCommunicator: every Communicator entry as NCCL calls on a non-blocking communicator, each through
// PRIMUS_NCCL_CHECK (statement, file, line, rank); the rendezvous through the Store; timeouts by polling
// (see nccl_communicator.h).
//
// Non-blocking mode in practice (NCCL 2.28): a call with work to launch hands the launch to a thread of
// NCCL's and returns ncclInProgress; the communicator's state (ncclCommGetAsyncError) turns to ncclSuccess
// once the work is on the stream. finish() waits for that before returning, so an event recorded after a
// collective is recorded after its kernels, and NCCL's rule (no call on a communicator whose state is in
// progress) holds. The poll yields first and sleeps only after ~100 µs: launches take tens of µs.
#include "parallel/nccl/nccl_communicator.h"

#include <nccl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_runtime.h"
#include "core/error.h"

namespace primus {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(DistributedTimeout t) { return static_cast<double>(t.count()) / 1000.0; }

ncclDataType_t nccl_dtype(DType dtype, const char* op) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    default:
      throw RuntimeError(
          fmt::format("[nccl {}] dtype {} is not supported (f32, bf16, i32, i64)", op, dtype_name(dtype)));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  throw RuntimeError("[nccl] unknown reduce op");
}

// Each communicator made by make_nccl_communicator takes the next key, so one store serves several worlds;
// every rank makes them in the same order, so the numbers agree.
std::atomic<int64_t> g_rendezvous_count{0};

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.data());
  const auto* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// Waits a little longer each round: yields first (a launch takes tens of µs), then sleeps up to 1 ms.
class Backoff {
 public:
  void pause() {
    if (++rounds_ < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(rounds_ < 2000 ? 50 : 1000));
    }
  }

 private:
  int rounds_ = 0;
};

}  // namespace

// Runs an NCCL call of this communicator and finishes it (waits out ncclInProgress); throws RuntimeError
// naming the statement, file, line and rank on failure.
#define PRIMUS_NCCL_CHECK_ON(communicator, stmt) (communicator).finish((stmt), #stmt, __FILE__, __LINE__)
#define PRIMUS_NCCL_CHECK(stmt) PRIMUS_NCCL_CHECK_ON(*this, stmt)

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, Device device, DistributedTimeout timeout)
      : rank_(rank), size_(size), device_(device), timeout_(timeout) {
    CudaBackend& backend = start_cuda_backend(device.index);
    backend_ = &backend;
    compute_ = static_cast<gpuStream_t>(backend.stream(StreamKind::kCompute).handle);
    PRIMUS_CUDA_CHECK(gpuSetDevice(device.index));  // NCCL binds a communicator to the calling thread's device
  }

  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Joins the world of `id` (every rank must, within the timeout).
  void init(const ncclUniqueId& id) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId unique_id = id;
    PRIMUS_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, unique_id, rank_, &config));
    become_ready();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "nccl"; }
  Device device() const override { return device_; }

  void all_reduce(Tensor& buf, ReduceOp op, Stream stream) override {
    check_usable("all_reduce");
    check_buffer(buf, "all_reduce", "buf");
    const ncclDataType_t type = nccl_dtype(buf.dtype(), "all_reduce");
    // One rank: the reduction of a buffer in place is the buffer. NCCL would still launch a copy kernel over
    // it (the whole gradient buffer every step at a world of one: ~1% of the 1B step).
    if (buf.numel() == 0 || size_ == 1) return;
    const gpuStream_t s = stream_for(stream, {&buf});
    PRIMUS_NCCL_CHECK(ncclAllReduce(buf.data(), buf.data(), count(buf), type, nccl_op(op), comm_, s));
  }

  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, Stream stream) override {
    check_usable("reduce_scatter");
    check_buffer(in, "reduce_scatter", "in");
    check_buffer(out, "reduce_scatter", "out");
    check_same_dtype(in, out, "reduce_scatter");
    PRIMUS_CHECK(in.numel() == out.numel() * size_, "[nccl reduce_scatter] in {} must hold size {} × out {}",
                 in.describe(), size_, out.describe());
    check_in_place_slice(in, out, "reduce_scatter", "out");
    const ncclDataType_t type = nccl_dtype(in.dtype(), "reduce_scatter");
    if (out.numel() == 0 || (size_ == 1 && in.data() == out.data())) return;  // one rank, in place: nothing to do
    const gpuStream_t s = stream_for(stream, {&in, &out});
    PRIMUS_NCCL_CHECK(ncclReduceScatter(in.data(), out.data(), count(out), type, nccl_op(op), comm_, s));
  }

  void all_gather(const Tensor& in, Tensor& out, Stream stream) override {
    check_usable("all_gather");
    check_buffer(in, "all_gather", "in");
    check_buffer(out, "all_gather", "out");
    check_same_dtype(in, out, "all_gather");
    PRIMUS_CHECK(out.numel() == in.numel() * size_, "[nccl all_gather] out {} must hold size {} × in {}",
                 out.describe(), size_, in.describe());
    check_in_place_slice(out, in, "all_gather", "in");
    const ncclDataType_t type = nccl_dtype(in.dtype(), "all_gather");
    if (in.numel() == 0 || (size_ == 1 && in.data() == out.data())) return;  // one rank, in place: nothing to do
    const gpuStream_t s = stream_for(stream, {&in, &out});
    PRIMUS_NCCL_CHECK(ncclAllGather(in.data(), out.data(), count(in), type, comm_, s));
  }

  void all_to_all(const Tensor& in, Tensor& out, Stream stream) override {
    check_usable("all_to_all");
    PRIMUS_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0,
                 "[nccl all_to_all] in {} and out {} must have one size, a multiple of the {} ranks", in.describe(),
                 out.describe(), size_);
    const int64_t n = in.numel() / size_;
    exchange(in, std::vector<int64_t>(size_, n), out, std::vector<int64_t>(size_, n), stream, "all_to_all");
  }

  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                    const std::vector<int64_t>& recv_counts, Stream stream) override {
    check_usable("all_to_all_v");
    exchange(in, send_counts, out, recv_counts, stream, "all_to_all_v");
  }

  void broadcast(Tensor& buf, int root, Stream stream) override {
    check_usable("broadcast");
    check_buffer(buf, "broadcast", "buf");
    check_peer(root, "broadcast", "root");
    const ncclDataType_t type = nccl_dtype(buf.dtype(), "broadcast");
    if (buf.numel() == 0) return;
    const gpuStream_t s = stream_for(stream, {&buf});
    PRIMUS_NCCL_CHECK(ncclBroadcast(buf.data(), buf.data(), count(buf), type, root, comm_, s));
  }

  void send(const Tensor& buf, int peer, Stream stream) override {
    check_usable("send");
    check_buffer(buf, "send", "buf");
    check_point_to_point_peer(peer, "send");
    const ncclDataType_t type = nccl_dtype(buf.dtype(), "send");
    if (buf.numel() == 0) return;
    const gpuStream_t s = stream_for(stream, {&buf});
    PRIMUS_NCCL_CHECK(ncclSend(buf.data(), count(buf), type, peer, comm_, s));
  }

  void recv(Tensor& buf, int peer, Stream stream) override {
    check_usable("recv");
    check_buffer(buf, "recv", "buf");
    check_point_to_point_peer(peer, "recv");
    const ncclDataType_t type = nccl_dtype(buf.dtype(), "recv");
    if (buf.numel() == 0) return;
    const gpuStream_t s = stream_for(stream, {&buf});
    PRIMUS_NCCL_CHECK(ncclRecv(buf.data(), count(buf), type, peer, comm_, s));
  }

  // One group of the send and the receive, so that every rank of a ring posts both at once.
  void send_recv(const Tensor& send_buf, int send_peer, Tensor& recv_buf, int recv_peer, Stream stream) override {
    check_usable("send_recv");
    check_buffer(send_buf, "send_recv", "send_buf");
    check_buffer(recv_buf, "send_recv", "recv_buf");
    check_point_to_point_peer(send_peer, "send_recv");
    check_point_to_point_peer(recv_peer, "send_recv");
    PRIMUS_CHECK(!overlaps(send_buf, recv_buf) || send_buf.numel() == 0 || recv_buf.numel() == 0,
                 "[nccl send_recv] send_buf {} and recv_buf {} overlap", send_buf.describe(), recv_buf.describe());
    const ncclDataType_t send_type = nccl_dtype(send_buf.dtype(), "send_recv");
    const ncclDataType_t recv_type = nccl_dtype(recv_buf.dtype(), "send_recv");
    if (send_buf.numel() == 0 && recv_buf.numel() == 0) return;
    const gpuStream_t s = stream_for(stream, {&send_buf, &recv_buf});
    PRIMUS_NCCL_CHECK(ncclGroupStart());
    if (send_buf.numel() > 0)
      PRIMUS_NCCL_CHECK(ncclSend(send_buf.data(), count(send_buf), send_type, send_peer, comm_, s));
    if (recv_buf.numel() > 0)
      PRIMUS_NCCL_CHECK(ncclRecv(recv_buf.data(), count(recv_buf), recv_type, recv_peer, comm_, s));
    PRIMUS_NCCL_CHECK(ncclGroupEnd());
  }

  // One group of every send and receive on the stream: NCCL matches a pair's transfers in the order they were
  // issued, and both sides list them in the order of their tags (the sender's sends, the receiver's receives). The
  // stream orders them against later work (communicator.h), so the batch is complete as far as the host is concerned.
  std::unique_ptr<PendingTransfers> start_batch_send_recv(const std::vector<PeerTransfer>& sends,
                                                          const std::vector<PeerTransfer>& recvs,
                                                          Stream stream) override {
    check_usable("batch_send_recv");
    std::vector<const Tensor*> buffers;
    for (const PeerTransfer& t : sends) {
      check_buffer(t.tensor, "batch_send_recv", "a send");
      check_point_to_point_peer(t.peer, "batch_send_recv");
      buffers.push_back(&t.tensor);
    }
    for (const PeerTransfer& t : recvs) {
      check_buffer(t.tensor, "batch_send_recv", "a receive");
      check_point_to_point_peer(t.peer, "batch_send_recv");
      buffers.push_back(&t.tensor);
    }
    if (buffers.empty()) return std::make_unique<CompletedTransfers>();
    auto by_tag = [](const PeerTransfer& a, const PeerTransfer& b) { return a.tag < b.tag; };
    std::vector<PeerTransfer> ordered_sends = sends, ordered_recvs = recvs;
    std::stable_sort(ordered_sends.begin(), ordered_sends.end(), by_tag);
    std::stable_sort(ordered_recvs.begin(), ordered_recvs.end(), by_tag);
    gpuStream_t s = compute_;  // as stream_for, over a list of any length
    if (stream.handle != nullptr && stream.handle != static_cast<void*>(compute_)) {
      for (const Tensor* t : buffers) backend_->record_stream(*t, stream);
      s = static_cast<gpuStream_t>(stream.handle);
    }
    PRIMUS_NCCL_CHECK(ncclGroupStart());
    for (const PeerTransfer& t : ordered_sends) {
      if (t.tensor.numel() == 0) continue;
      PRIMUS_NCCL_CHECK(ncclSend(t.tensor.data(), count(t.tensor), nccl_dtype(t.tensor.dtype(), "batch_send_recv"),
                                 t.peer, comm_, s));
    }
    for (const PeerTransfer& t : ordered_recvs) {
      if (t.tensor.numel() == 0) continue;
      PRIMUS_NCCL_CHECK(ncclRecv(t.tensor.data(), count(t.tensor), nccl_dtype(t.tensor.dtype(), "batch_send_recv"),
                                 t.peer, comm_, s));
    }
    PRIMUS_NCCL_CHECK(ncclGroupEnd());
    return std::make_unique<CompletedTransfers>();
  }

  // A one-element all-reduce on the compute stream, then a host wait on its event with the deadline: the
  // host waits for the compute work queued before it too.
  void barrier() override {
    check_usable("barrier");
    PRIMUS_NCCL_CHECK(
        ncclAllReduce(barrier_buf_.data(), barrier_buf_.data(), 1, ncclFloat32, ncclSum, comm_, compute_));
    PRIMUS_CUDA_CHECK(gpuEventRecord(barrier_event_, compute_));
    const Clock::time_point deadline = Clock::now() + timeout_;
    Backoff backoff;
    for (;;) {
      const gpuError_t status = gpuEventQuery(barrier_event_);
      if (status == gpuSuccess) return;
      (void)gpuGetLastError();  // not-ready is no error: keep it from later launch checks
      if (status != gpuErrorNotReady) throw_gpu_error(status, "gpuEventQuery(barrier event)", __FILE__, __LINE__);
      check_async_error("barrier", __FILE__, __LINE__);
      if (Clock::now() >= deadline) {
        abort_and_throw(
            fmt::format("[nccl barrier] rank {} of {}: not every rank arrived within {:.1f} s "
                        "(distributed_timeout_minutes); the communicator was aborted",
                        rank_, size_, seconds(timeout_)));
      }
      backoff.pause();
    }
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    check_usable("split");
    PRIMUS_CHECK(color >= 0, "[nccl split] rank {}: color {} is negative; every rank needs a color >= 0", rank_, color);
    // Messages name the parent's rank until the child knows its own.
    auto child = std::make_unique<NcclCommunicator>(rank_, size_, device_, timeout_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    // NCCL runs the split as a job of the parent and sets child->comm_ when it completes: wait for the
    // parent's state whatever the call returned.
    PRIMUS_NCCL_CHECK(ncclCommSplit(comm_, color, key, &child->comm_, &config));
    wait_state("ncclCommSplit", __FILE__, __LINE__);
    PRIMUS_CHECK(child->comm_ != nullptr, "[nccl split] rank {}: ncclCommSplit(color {}, key {}) gave no communicator",
                 rank_, color, key);
    ncclResult_t state = ncclSuccess;
    PRIMUS_NCCL_CHECK_ON(*child, ncclCommGetAsyncError(child->comm_, &state));
    child->finish(state, "ncclCommSplit (state of the new communicator)", __FILE__, __LINE__);
    PRIMUS_NCCL_CHECK_ON(*child, ncclCommUserRank(child->comm_, &child->rank_));
    PRIMUS_NCCL_CHECK_ON(*child, ncclCommCount(child->comm_, &child->size_));
    child->become_ready();
    return child;
  }

 private:
  // The second half of PRIMUS_NCCL_CHECK: any failure but ncclInProgress throws; ncclInProgress waits until
  // the communicator's state leaves it.
  void finish(ncclResult_t status, const char* statement, const char* file, int line) {
    if (status == ncclSuccess) return;
    if (status != ncclInProgress) fail(status, statement, file, line);
    wait_state(statement, file, line);
  }

  // Polls the communicator's state until it leaves ncclInProgress: at most the timeout, then abort; an
  // error state aborts too (NCCL's advice: the communicator is broken).
  void wait_state(const char* statement, const char* file, int line) {
    const Clock::time_point deadline = Clock::now() + timeout_;
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
      if (query != ncclSuccess) fail(query, "ncclCommGetAsyncError(comm_, &state)", file, line);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) abort_and_throw(failure_message(state, statement, file, line));
      if (Clock::now() >= deadline) {
        abort_and_throw(fmt::format(
            "[nccl] {} at {}:{} on rank {} of {}: not done after {:.1f} s (distributed_timeout_minutes): a rank did "
            "not arrive or is stuck; the communicator was aborted",
            statement, file, line, rank_, size_, seconds(timeout_)));
      }
      backoff.pause();
    }
  }

  std::string failure_message(ncclResult_t status, const char* statement, const char* file, int line) const {
    return fmt::format("[nccl] {} failed at {}:{} on rank {} of {}: {} ({})", statement, file, line, rank_, size_,
                       ncclGetErrorString(status), ncclGetLastError(comm_));
  }

  [[noreturn]] void fail(ncclResult_t status, const char* statement, const char* file, int line) const {
    throw RuntimeError(failure_message(status, statement, file, line));
  }

  // An error reported later (a peer failed, a network error): the communicator cannot be trusted again.
  void check_async_error(const char* op, const char* file, int line) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) fail(query, "ncclCommGetAsyncError(comm_, &state)", file, line);
    if (state != ncclSuccess && state != ncclInProgress) {
      abort_and_throw(fmt::format("[nccl {}] rank {} of {}: an earlier NCCL operation failed: {} ({})", op, rank_,
                                  size_, ncclGetErrorString(state), ncclGetLastError(comm_)));
    }
  }

  [[noreturn]] void abort_and_throw(const std::string& message) {
    abort();
    abort_reason_ = message;
    throw RuntimeError(message);
  }

  // ncclCommAbort stops the communicator's kernels and frees it; its result cannot be acted on, only logged.
  void abort() {
    if (comm_ == nullptr) return;
    const ncclResult_t status = ncclCommAbort(comm_);
    if (status != ncclSuccess) {
      spdlog::error("[nccl] ncclCommAbort on rank {} failed: {}", rank_, ncclGetErrorString(status));
    }
    comm_ = nullptr;
    aborted_ = true;
  }

  void check_usable(const char* op) {
    if (aborted_) {
      throw RuntimeError(fmt::format("[nccl {}] rank {}: the communicator was aborted and cannot be used again ({})",
                                     op, rank_, abort_reason_));
    }
    check_async_error(op, __FILE__, __LINE__);
  }

  // Once the communicator is up: the barrier's buffer and event.
  void become_ready() {
    ready_ = true;
    barrier_buf_ = Tensor::empty({1}, DType::kF32, device_);
    backend_->zero(barrier_buf_);
    PRIMUS_CUDA_CHECK(gpuEventCreateWithFlags(&barrier_event_, gpuEventDisableTiming));
  }

  // The stream to enqueue on. Buffers used on a stream other than the compute stream are declared to the
  // allocator, so their memory outlives the collective even if the caller frees them first.
  gpuStream_t stream_for(Stream stream, std::initializer_list<const Tensor*> buffers) {
    if (stream.handle == nullptr || stream.handle == static_cast<void*>(compute_)) return compute_;
    for (const Tensor* t : buffers) backend_->record_stream(*t, stream);
    return static_cast<gpuStream_t>(stream.handle);
  }

  void check_buffer(const Tensor& t, const char* op, const char* name) const {
    PRIMUS_CHECK(t.defined(), "[nccl {}] {} is undefined", op, name);
    PRIMUS_CHECK(t.device() == device_, "[nccl {}] {} {} does not live on the communicator's device {}", op, name,
                 t.describe(), device_.str());
  }

  static void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
    PRIMUS_CHECK(a.dtype() == b.dtype(), "[nccl {}] {} and {} differ in dtype", op, a.describe(), b.describe());
  }

  // `part` is either the slice of `whole` at this rank (in place, as NCCL allows) or disjoint from it.
  void check_in_place_slice(const Tensor& whole, const Tensor& part, const char* op, const char* name) const {
    if (!overlaps(whole, part)) return;
    const auto* own = static_cast<const char*>(whole.data()) + static_cast<size_t>(rank_) * part.nbytes();
    PRIMUS_CHECK(part.data() == own,
                 "[nccl {}] {} overlaps the other buffer but is not its slice for rank {} (the only in-place form)", op,
                 name, rank_);
  }

  void check_peer(int peer, const char* op, const char* name) const {
    PRIMUS_CHECK(peer >= 0 && peer < size_, "[nccl {}] {} {} is outside the {} ranks", op, name, peer, size_);
  }

  // A lone send to this rank waits on the GPU for a recv queued behind it: the stream would hang for good.
  void check_point_to_point_peer(int peer, const char* op) const {
    check_peer(peer, op, "peer");
    PRIMUS_CHECK(peer != rank_,
                 "[nccl {}] rank {} cannot {} itself: a lone send/recv pair to one's own rank deadlocks on the GPU "
                 "(all_to_all exchanges with itself)",
                 op, rank_, op);
  }

  static size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }

  // all_to_all(v): one group of a send and a recv per rank with a non-zero count. Both ends skip zero
  // counts, and they agree on them (my recv_counts[i] is rank i's send_counts[me]).
  void exchange(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                const std::vector<int64_t>& recv_counts, Stream stream, const char* op) {
    check_buffer(in, op, "in");
    check_buffer(out, op, "out");
    check_same_dtype(in, out, op);
    PRIMUS_CHECK(send_counts.size() == static_cast<size_t>(size_) && recv_counts.size() == static_cast<size_t>(size_),
                 "[nccl {}] {} send and {} receive counts for {} ranks", op, send_counts.size(), recv_counts.size(),
                 size_);
    int64_t send_total = 0, recv_total = 0;
    for (int r = 0; r < size_; ++r) {
      PRIMUS_CHECK(send_counts[r] >= 0 && recv_counts[r] >= 0, "[nccl {}] negative count for rank {}", op, r);
      send_total += send_counts[r];
      recv_total += recv_counts[r];
    }
    PRIMUS_CHECK(send_total <= in.numel() && recv_total <= out.numel(),
                 "[nccl {}] counts sum to {} sent from in {} and {} received into out {}", op, send_total,
                 in.describe(), recv_total, out.describe());
    PRIMUS_CHECK(!overlaps(in, out) || in.numel() == 0 || out.numel() == 0,
                 "[nccl {}] in and out overlap; the exchange has no in-place form", op);
    const ncclDataType_t type = nccl_dtype(in.dtype(), op);
    if (send_total == 0 && recv_total == 0) return;
    const gpuStream_t s = stream_for(stream, {&in, &out});
    const size_t element = dtype_size(in.dtype());
    const auto* send_base = static_cast<const char*>(in.data());
    auto* recv_base = static_cast<char*>(out.data());
    PRIMUS_NCCL_CHECK(ncclGroupStart());
    size_t send_offset = 0, recv_offset = 0;
    for (int r = 0; r < size_; ++r) {
      const auto sends = static_cast<size_t>(send_counts[r]);
      const auto recvs = static_cast<size_t>(recv_counts[r]);
      if (sends > 0) PRIMUS_NCCL_CHECK(ncclSend(send_base + send_offset * element, sends, type, r, comm_, s));
      if (recvs > 0) PRIMUS_NCCL_CHECK(ncclRecv(recv_base + recv_offset * element, recvs, type, r, comm_, s));
      send_offset += sends;
      recv_offset += recvs;
    }
    PRIMUS_NCCL_CHECK(ncclGroupEnd());
  }

  ncclComm_t comm_ = nullptr;
  int rank_;
  int size_;
  Device device_;
  DistributedTimeout timeout_;
  Backend* backend_ = nullptr;
  gpuStream_t compute_ = nullptr;
  bool ready_ = false;    // creation (init or split) completed
  bool aborted_ = false;  // comm_ is gone; abort_reason_ says why
  std::string abort_reason_;
  Tensor barrier_buf_;  // [1] f32
  gpuEvent_t barrier_event_ = nullptr;
};

// Finalize flushes outstanding work and leaves the world in step with the other ranks; it is bounded by
// the timeout like every wait, and falls back to abort. A destructor cannot throw: failures are logged.
NcclCommunicator::~NcclCommunicator() {
  if (barrier_event_ != nullptr) (void)gpuEventDestroy(barrier_event_);
  if (comm_ == nullptr) return;
  bool finalized = false;
  if (ready_) {
    ncclResult_t status = ncclCommFinalize(comm_);
    const Clock::time_point deadline = Clock::now() + timeout_;
    Backoff backoff;
    while (status == ncclInProgress && Clock::now() < deadline) {
      backoff.pause();
      ncclResult_t state = ncclSuccess;
      status = ncclCommGetAsyncError(comm_, &state);
      if (status == ncclSuccess) status = state;
    }
    finalized = status == ncclSuccess;
    if (!finalized) {
      spdlog::error("[nccl] ncclCommFinalize on rank {} of {} did not finish ({}); aborting the communicator", rank_,
                    size_, status == ncclInProgress ? "timed out" : ncclGetErrorString(status));
    }
  }
  const ncclResult_t status = finalized ? ncclCommDestroy(comm_) : ncclCommAbort(comm_);
  if (status != ncclSuccess) {
    spdlog::error("[nccl] {} on rank {} failed: {}", finalized ? "ncclCommDestroy" : "ncclCommAbort", rank_,
                  ncclGetErrorString(status));
  }
}

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, Store& store, Device device,
                                                     DistributedTimeout timeout) {
  PRIMUS_CHECK(size >= 1 && rank >= 0 && rank < size, "[nccl] rank {} of a world of {} ranks", rank, size);
  PRIMUS_CHECK(device.type == DeviceType::kCuda, "[nccl] the communicator needs a CUDA device, not {}", device.str());
  // NVLink multicast (NVLS) must stay off on our machines; a user who set the variable decides.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);

  auto communicator = std::make_unique<NcclCommunicator>(rank, size, device, timeout);
  const std::string key = fmt::format("primus/nccl/{}/unique_id", g_rendezvous_count.fetch_add(1));
  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t status = ncclGetUniqueId(&id);
    if (status != ncclSuccess) {
      throw RuntimeError(fmt::format("[nccl] ncclGetUniqueId(&id) failed at {}:{} on rank 0 of {}: {} ({})", __FILE__,
                                     __LINE__, size, ncclGetErrorString(status), ncclGetLastError(nullptr)));
    }
    store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    try {
      store.wait({key}, timeout);
    } catch (const RuntimeError& e) {
      throw RuntimeError(
          fmt::format("[nccl] rank {} of {}: rank 0 never published the NCCL unique id (store key {}): {}", rank, size,
                      key, e.what()));
    }
    const std::vector<char> value = store.get(key);
    PRIMUS_CHECK(value.size() == sizeof(id.internal),
                 "[nccl] rank {}: store key {} holds {} bytes, not an NCCL id of {}", rank, key, value.size(),
                 sizeof(id.internal));
    std::memcpy(id.internal, value.data(), sizeof(id.internal));
  }
  communicator->init(id);
  return communicator;
}

}  // namespace primus
