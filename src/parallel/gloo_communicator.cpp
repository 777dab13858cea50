// GlooCommunicator (gloo_communicator.h): argument checks, the size-1 copies, and the calls into Gloo's
// algorithms, with Gloo's exceptions turned into RuntimeErrors that name the collective and the rank. The
// adapter from our Store to gloo::rendezvous::Store lives here too.
#include "parallel/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <signal.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/bf16.h"
#include "core/error.h"

namespace primus {

namespace {

std::string seconds_str(DistributedTimeout t) { return fmt::format("{:g} s", static_cast<double>(t.count()) / 1000.0); }

// Send/recv pairs use one slot outside the prefixes of Gloo's collectives (0x01..0x08), so that messages
// between a pair match in the order they were posted whatever collectives ran in between.
const uint64_t kP2pSlot = gloo::Slot::build(0x20, 0);
// Tagged transfers (batch_send_recv) match by slot: one per tag, beside the untagged pairs' slot.
uint64_t tagged_slot(uint32_t tag) { return gloo::Slot::build(0x21, tag); }

// --- element types of the reductions ------------------------------------------------------------------------

struct Bf16 {
  uint16_t bits;
};

float combine(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kMin:
      return std::min(a, b);
  }
  return a;
}

// bf16 pairwise step: both operands widened to fp32, combined, rounded once (NCCL does the same per step).
template <ReduceOp kOp>
void bf16_binary(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<Bf16*>(c);
  const auto* x = static_cast<const Bf16*>(a);
  const auto* y = static_cast<const Bf16*>(b);
  for (size_t i = 0; i < n; ++i) {
    out[i].bits = f32_to_bf16(combine(kOp, bf16_to_f32(x[i].bits), bf16_to_f32(y[i].bits)));
  }
}

// Calls f(T{}) with the C++ type of a reduction dtype.
template <typename F>
void with_reduce_type(DType dtype, const std::string& what, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kI32:
      return f(int32_t{});
    case DType::kI64:
      return f(int64_t{});
    case DType::kBF16:
      return f(Bf16{});
    default:
      throw RuntimeError(fmt::format("[distributed] {}: dtype {} cannot be reduced on Gloo (f32, bf16, i32, i64)", what,
                                     dtype_name(dtype)));
  }
}

// The elementwise function of gloo::allreduce (out = a op b).
template <typename T>
gloo::AllreduceOptions::Func allreduce_function(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  if constexpr (std::is_same_v<T, Bf16>) {
    switch (op) {
      case ReduceOp::kSum:
        return &bf16_binary<ReduceOp::kSum>;
      case ReduceOp::kMax:
        return &bf16_binary<ReduceOp::kMax>;
      case ReduceOp::kMin:
        return &bf16_binary<ReduceOp::kMin>;
    }
  } else {
    switch (op) {
      case ReduceOp::kSum:
        return static_cast<Fn>(&gloo::sum<T>);
      case ReduceOp::kMax:
        return static_cast<Fn>(&gloo::max<T>);
      case ReduceOp::kMin:
        return static_cast<Fn>(&gloo::min<T>);
    }
  }
  return nullptr;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  auto* pa = static_cast<const char*>(a.data());
  auto* pb = static_cast<const char*>(b.data());
  return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

uint8_t* bytes(const Tensor& t) { return static_cast<uint8_t*>(t.data()); }

// --- our Store seen as Gloo's ---------------------------------------------------------------------------------

// Gloo's full-mesh rendezvous sets "rank_<i>" (host names) and "<i>" (pair addresses); under our prefix they
// become "host/<i>" and "addr/<i>", and a timeout on one of them names the rank that never arrived.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(primus::Store& store, std::string prefix, DistributedTimeout timeout, std::string group, int size)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout), group_(std::move(group)), size_(size) {}

  void set(const std::string& key, const std::vector<char>& data) override { store_.set(ours(key), data); }

  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return store_.get(ours(key));
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> mapped;
    for (const std::string& k : keys) mapped.push_back(ours(k));
    try {
      store_.wait(mapped, timeout);
    } catch (const RuntimeError& e) {
      // Only a timeout means the rank never came; a lost store (rank 0 ended) is reported as it is.
      int rank = keys.size() == 1 ? rank_of(keys[0]) : -1;
      if (rank < 0 || std::string(e.what()).find("timed out") == std::string::npos) throw;
      throw RuntimeError(
          fmt::format("{}: rank {} of the {} ranks of communicator '{}' never arrived (it did not "
                      "start, died before the rendezvous, or cannot reach MASTER_ADDR)",
                      e.what(), rank, size_, group_));
    }
  }

 private:
  static int rank_of(const std::string& key) {
    std::string digits = key.rfind("rank_", 0) == 0 ? key.substr(5) : key;
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
    return std::stoi(digits);
  }

  std::string ours(const std::string& key) const {
    if (key.rfind("rank_", 0) == 0 && rank_of(key) >= 0) return prefix_ + "host/" + key.substr(5);
    if (rank_of(key) >= 0) return prefix_ + "addr/" + key;
    return prefix_ + key;
  }

  primus::Store& store_;
  std::string prefix_;
  DistributedTimeout timeout_;
  std::string group_;
  int size_;
};

}  // namespace

// --- construction -----------------------------------------------------------------------------------------------

GlooCommunicator::GlooCommunicator(int rank, int size, std::shared_ptr<Store> store, DistributedTimeout timeout,
                                   GlooNetwork network, std::string name)
    : GlooCommunicator(rank, size, std::move(store), timeout, std::move(network), std::move(name), nullptr) {}

GlooCommunicator::GlooCommunicator(int rank, int size, std::shared_ptr<Store> store, DistributedTimeout timeout,
                                   GlooNetwork network, std::string name,
                                   std::shared_ptr<gloo::transport::Device> device)
    : rank_(rank),
      size_(size),
      store_(std::move(store)),
      timeout_(timeout),
      network_(std::move(network)),
      name_(std::move(name)),
      device_(std::move(device)) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw RuntimeError(fmt::format("[distributed] gloo communicator '{}': rank {} of {} is not a place in a group",
                                   name_, rank, size));
  }
  if (timeout.count() <= 0) {
    throw UsageError(fmt::format("[distributed] gloo communicator '{}': the timeout must be positive (got {} ms)",
                                 name_, timeout.count()));
  }
  connect();
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::connect() {
  if (size_ == 1) return;
  if (!store_)
    throw RuntimeError(fmt::format("[distributed] gloo communicator '{}' of {} ranks needs a store", name_, size_));
  try {
    if (!device_) {
      gloo::transport::tcp::attr attr;
      if (!network_.iface.empty()) {
        attr.iface = network_.iface;
      } else {
        attr.hostname = network_.hostname;
      }
      device_ = gloo::transport::tcp::CreateDevice(attr);
    }
  } catch (const std::exception& e) {
    throw RuntimeError(fmt::format("[distributed] gloo: cannot open a TCP device on {} (rank {}): {}",
                                   network_.iface.empty() ? "host " + network_.hostname : "interface " + network_.iface,
                                   rank_, e.what()));
  }
  // Gloo writes to its sockets without MSG_NOSIGNAL: the first write to a peer that died raises SIGPIPE, which
  // would end this process before Gloo can report the error. Ignored (unless someone installed a handler),
  // the write fails with EPIPE and the collective throws, naming itself.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
  // Set before connecting: the pairs take their read/write timeouts from the context at creation.
  context->setTimeout(timeout_);
  GlooStore store(*store_, "gloo/" + name_ + "/", timeout_, name_, size_);
  try {
    context->connectFullMesh(store, device_);
  } catch (const Error&) {
    throw;  // a store timeout, already naming the key and the missing rank
  } catch (const std::exception& e) {
    throw RuntimeError(
        fmt::format("[distributed] rendezvous of communicator '{}' (gloo, rank {} of {}) failed: {} "
                    "(a peer died, or did not answer within the timeout of {})",
                    name_, rank_, size_, e.what(), seconds_str(timeout_)));
  }
  context_ = std::move(context);
}

// --- checks and error translation --------------------------------------------------------------------------

std::string GlooCommunicator::where() const { return fmt::format("rank {} of {} (gloo)", rank_, size_); }

void GlooCommunicator::check_usable(const char* op) const {
  if (!failure_.empty()) {
    throw RuntimeError(fmt::format("[distributed] {} on {}: the communicator failed earlier and is unusable: {}", op,
                                   where(), failure_));
  }
}

void GlooCommunicator::check_cpu(const char* op, const Tensor& t, const char* what) const {
  if (!t.defined())
    throw RuntimeError(fmt::format("[distributed] {} on {}: {} is an undefined tensor", op, where(), what));
  if (!t.device().is_cpu()) {
    throw RuntimeError(fmt::format("[distributed] {} on {}: {} lives on {}; Gloo needs host memory", op, where(), what,
                                   t.device().str()));
  }
}

void GlooCommunicator::check_peer(const char* op, int peer) const {
  if (peer < 0 || peer >= size_) {
    throw RuntimeError(fmt::format("[distributed] {} on {}: rank {} is not in this communicator", op, where(), peer));
  }
}

template <typename F>
void GlooCommunicator::run(const char* op, int64_t count, DType dtype, F&& body) {
  std::string why;
  try {
    body();
    return;
  } catch (const Error&) {
    throw;                             // ours (an unsupported dtype), already explained
  } catch (const std::exception& e) {  // gloo::IoException, gloo::Exception, gloo::EnforceNotMet, system_error
    why = e.what();
  }
  failure_ = fmt::format(
      "[distributed] {} of {} {} on {} failed: {} (a peer died, or did not answer within the timeout of {})", op, count,
      dtype_name(dtype), where(), why, seconds_str(timeout_));
  throw RuntimeError(failure_);
}

// --- collectives --------------------------------------------------------------------------------------------

void GlooCommunicator::all_reduce(Tensor& buf, ReduceOp op, Stream) {
  check_usable("all_reduce");
  check_cpu("all_reduce", buf, "buf");
  const int64_t n = buf.numel();
  const std::string what = fmt::format("all_reduce on {}", where());
  if (size_ == 1 || n == 0) {
    with_reduce_type(buf.dtype(), what, [](auto) {});  // the same dtype errors as a real group
    return;
  }
  const uint32_t tag = next_tag();
  with_reduce_type(buf.dtype(), what, [&](auto zero) {
    using T = decltype(zero);
    run("all_reduce", n, buf.dtype(), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput<T>(static_cast<T*>(buf.data()), static_cast<size_t>(n));
      opts.setReduceFunction(allreduce_function<T>(op));
      opts.setTag(tag);
      gloo::allreduce(opts);
    });
  });
}

void GlooCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, Stream) {
  check_usable("reduce_scatter");
  check_cpu("reduce_scatter", in, "in");
  check_cpu("reduce_scatter", out, "out");
  const int64_t n = out.numel();
  if (in.dtype() != out.dtype() || in.numel() != size_ * n) {
    throw RuntimeError(
        fmt::format("[distributed] reduce_scatter on {}: in is {}, out {}; in needs size x out = {} "
                    "elements of out's dtype",
                    where(), in.describe(), out.describe(), size_ * n));
  }
  const bool in_place = out.data() == bytes(in) + static_cast<size_t>(rank_) * out.nbytes();
  if (!in_place && overlaps(in, out)) {
    throw RuntimeError(
        fmt::format("[distributed] reduce_scatter on {}: out overlaps in without being this rank's "
                    "slice of it",
                    where()));
  }
  const std::string what = fmt::format("reduce_scatter on {}", where());
  if (size_ == 1 || n == 0) {
    with_reduce_type(in.dtype(), what, [](auto) {});
    if (!in_place && n > 0) std::memcpy(out.data(), in.data(), out.nbytes());
    return;
  }
  // Each rank sends block j of its input to rank j (Gloo's tag-based all-to-all), then sums the blocks it received
  // in rank order: the result does not depend on timing, and every message is matched by its tag. Gloo's
  // ReduceScatterHalvingDoubling, used before, matched messages by slots counted per algorithm object and, at a
  // world size that is not a power of two, returned about one run in three with rank 0's block of a small buffer
  // wrong while all-gathers ran between the reduce-scatters (ZeRO-3 with tied embeddings on 3 ranks).
  scratch_.resize(in.nbytes());
  const uint32_t tag = next_tag();
  with_reduce_type(in.dtype(), what, [&](auto zero) {
    using T = decltype(zero);
    run("reduce_scatter", in.numel(), in.dtype(), [&] {
      gloo::AlltoallOptions opts(context_);
      opts.setInput<uint8_t>(bytes(in), in.nbytes());
      opts.setOutput<uint8_t>(reinterpret_cast<uint8_t*>(scratch_.data()), in.nbytes());
      opts.setTag(tag);
      gloo::alltoall(opts);
    });
    const auto* blocks = reinterpret_cast<const T*>(scratch_.data());
    const auto combine_into = allreduce_function<T>(op);
    std::memcpy(out.data(), blocks, out.nbytes());
    for (int r = 1; r < size_; ++r) combine_into(out.data(), out.data(), blocks + r * n, static_cast<size_t>(n));
  });
}

void GlooCommunicator::all_gather(const Tensor& in, Tensor& out, Stream) {
  check_usable("all_gather");
  check_cpu("all_gather", in, "in");
  check_cpu("all_gather", out, "out");
  if (in.dtype() != out.dtype() || out.numel() != size_ * in.numel()) {
    throw RuntimeError(
        fmt::format("[distributed] all_gather on {}: in is {}, out {}; out needs size x in = {} "
                    "elements of in's dtype",
                    where(), in.describe(), out.describe(), size_ * in.numel()));
  }
  const bool in_place = in.data() == bytes(out) + static_cast<size_t>(rank_) * in.nbytes();
  if (!in_place && overlaps(in, out)) {
    throw RuntimeError(
        fmt::format("[distributed] all_gather on {}: in overlaps out without being this rank's slice "
                    "of it",
                    where()));
  }
  if (in.numel() == 0) return;
  if (size_ == 1) {
    if (!in_place) std::memcpy(out.data(), in.data(), in.nbytes());
    return;
  }
  const uint32_t tag = next_tag();
  run("all_gather", in.numel(), in.dtype(), [&] {
    gloo::AllgatherOptions opts(context_);
    if (!in_place) opts.setInput<uint8_t>(bytes(in), in.nbytes());  // no input: Gloo gathers in place
    opts.setOutput<uint8_t>(bytes(out), out.nbytes());
    opts.setTag(tag);
    gloo::allgather(opts);
  });
}

void GlooCommunicator::all_to_all(const Tensor& in, Tensor& out, Stream) {
  check_usable("all_to_all");
  check_cpu("all_to_all", in, "in");
  check_cpu("all_to_all", out, "out");
  if (in.dtype() != out.dtype() || in.numel() != out.numel() || in.numel() % size_ != 0) {
    throw RuntimeError(
        fmt::format("[distributed] all_to_all on {}: in is {}, out {}; both need the same dtype and "
                    "a number of elements divisible by the size {}",
                    where(), in.describe(), out.describe(), size_));
  }
  if (overlaps(in, out)) throw RuntimeError(fmt::format("[distributed] all_to_all on {}: in and out overlap", where()));
  if (in.numel() == 0) return;
  if (size_ == 1) {
    std::memcpy(out.data(), in.data(), in.nbytes());
    return;
  }
  const uint32_t tag = next_tag();
  run("all_to_all", in.numel(), in.dtype(), [&] {
    gloo::AlltoallOptions opts(context_);
    opts.setInput<uint8_t>(bytes(in), in.nbytes());
    opts.setOutput<uint8_t>(bytes(out), out.nbytes());
    opts.setTag(tag);
    gloo::alltoall(opts);
  });
}

void GlooCommunicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                    const std::vector<int64_t>& recv_counts, Stream) {
  check_usable("all_to_all_v");
  check_cpu("all_to_all_v", in, "in");
  check_cpu("all_to_all_v", out, "out");
  auto check_counts = [&](const std::vector<int64_t>& counts, const Tensor& t, const char* what) {
    bool negative = std::any_of(counts.begin(), counts.end(), [](int64_t c) { return c < 0; });
    int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (static_cast<int>(counts.size()) != size_ || negative || total > t.numel()) {
      throw RuntimeError(
          fmt::format("[distributed] all_to_all_v on {}: {} has {} entries summing to {}; it needs {} "
                      "non-negative counts summing to at most {} (the elements of {})",
                      where(), what, counts.size(), total, size_, t.numel(), t.describe()));
    }
  };
  check_counts(send_counts, in, "send_counts");
  check_counts(recv_counts, out, "recv_counts");
  if (in.dtype() != out.dtype()) {
    throw RuntimeError(fmt::format("[distributed] all_to_all_v on {}: in is {}, out {}: dtypes differ", where(),
                                   dtype_name(in.dtype()), dtype_name(out.dtype())));
  }
  if (send_counts[rank_] != recv_counts[rank_]) {
    throw RuntimeError(
        fmt::format("[distributed] all_to_all_v on {}: this rank sends itself {} elements but "
                    "expects {}",
                    where(), send_counts[rank_], recv_counts[rank_]));
  }
  if (overlaps(in, out))
    throw RuntimeError(fmt::format("[distributed] all_to_all_v on {}: in and out overlap", where()));
  const size_t esize = dtype_size(in.dtype());
  if (size_ == 1) {
    if (send_counts[0] > 0) std::memcpy(out.data(), in.data(), static_cast<size_t>(send_counts[0]) * esize);
    return;
  }
  const uint32_t tag = next_tag();
  run("all_to_all_v", std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}), in.dtype(), [&] {
    gloo::AlltoallvOptions opts(context_);
    // Counted in bytes, so one code path serves every dtype.
    std::vector<int64_t> send_bytes, recv_bytes;
    for (int64_t c : send_counts) send_bytes.push_back(c * static_cast<int64_t>(esize));
    for (int64_t c : recv_counts) recv_bytes.push_back(c * static_cast<int64_t>(esize));
    opts.setInput<uint8_t>(bytes(in), send_bytes);
    opts.setOutput<uint8_t>(bytes(out), recv_bytes);
    opts.setTag(tag);
    gloo::alltoallv(opts);
  });
}

void GlooCommunicator::broadcast(Tensor& buf, int root, Stream) {
  check_usable("broadcast");
  check_cpu("broadcast", buf, "buf");
  check_peer("broadcast", root);
  if (size_ == 1 || buf.numel() == 0) return;
  const uint32_t tag = next_tag();
  run("broadcast", buf.numel(), buf.dtype(), [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput<uint8_t>(bytes(buf), buf.nbytes());  // in place on the root too
    opts.setRoot(root);
    opts.setTag(tag);
    gloo::broadcast(opts);
  });
}

void GlooCommunicator::send(const Tensor& buf, int peer, Stream) {
  check_usable("send");
  check_cpu("send", buf, "buf");
  check_peer("send", peer);
  if (peer == rank_) {
    to_self_.emplace_back(bytes(buf), bytes(buf) + buf.nbytes());
    return;
  }
  run("send", buf.numel(), buf.dtype(), [&] {
    auto ub = context_->createUnboundBuffer(buf.data(), buf.nbytes());
    ub->send(peer, kP2pSlot);
    ub->waitSend(timeout_);
  });
}

void GlooCommunicator::recv(Tensor& buf, int peer, Stream) {
  check_usable("recv");
  check_cpu("recv", buf, "buf");
  check_peer("recv", peer);
  if (peer == rank_) {
    if (to_self_.empty()) {
      throw RuntimeError(
          fmt::format("[distributed] recv on {} from itself: no send to itself is pending (it would "
                      "wait forever)",
                      where()));
    }
    if (to_self_.front().size() != buf.nbytes()) {
      throw RuntimeError(fmt::format("[distributed] recv on {} from itself: the pending send has {} bytes, buf {}",
                                     where(), to_self_.front().size(), buf.nbytes()));
    }
    if (buf.nbytes() > 0) std::memcpy(buf.data(), to_self_.front().data(), buf.nbytes());
    to_self_.pop_front();
    return;
  }
  run("recv", buf.numel(), buf.dtype(), [&] {
    auto ub = context_->createUnboundBuffer(buf.data(), buf.nbytes());
    ub->recv(peer, kP2pSlot);
    ub->waitRecv(timeout_);
  });
}

void GlooCommunicator::send_recv(const Tensor& send_buf, int send_peer, Tensor& recv_buf, int recv_peer, Stream) {
  check_usable("send_recv");
  check_cpu("send_recv", send_buf, "send_buf");
  check_cpu("send_recv", recv_buf, "recv_buf");
  check_peer("send_recv", send_peer);
  check_peer("send_recv", recv_peer);
  uint8_t* send_bytes = bytes(send_buf);
  uint8_t* recv_bytes = bytes(recv_buf);
  PRIMUS_CHECK(send_bytes + send_buf.nbytes() <= recv_bytes || recv_bytes + recv_buf.nbytes() <= send_bytes,
               "[gloo send_recv] {}: send_buf {} and recv_buf {} overlap", where(), send_buf.describe(),
               recv_buf.describe());
  if (send_peer == rank_ || recv_peer == rank_) {
    PRIMUS_CHECK(send_peer == rank_ && recv_peer == rank_,
                 "[gloo send_recv] {}: sends to rank {} and receives from rank {}; this rank may be the peer of both "
                 "or of neither",
                 where(), send_peer, recv_peer);
    send(send_buf, send_peer);
    recv(recv_buf, recv_peer);
    return;
  }
  // The receive is posted first, so the peers' sends (which go out only into a posted receive) never wait on this
  // rank's send.
  run("send_recv", send_buf.numel(), send_buf.dtype(), [&] {
    auto in = context_->createUnboundBuffer(recv_bytes, recv_buf.nbytes());
    auto out = context_->createUnboundBuffer(send_bytes, send_buf.nbytes());
    in->recv(recv_peer, kP2pSlot);
    out->send(send_peer, kP2pSlot);
    in->waitRecv(timeout_);
    out->waitSend(timeout_);
  });
}

// A started batch: Gloo's unbound buffers, whose waits block until the peers' matching transfers are done.
class GlooPendingTransfers final : public PendingTransfers {
 public:
  using Buffer = decltype(std::declval<gloo::Context&>().createUnboundBuffer(nullptr, 0));
  GlooPendingTransfers(GlooCommunicator& comm, std::string op, int64_t elements)
      : comm_(comm), op_(std::move(op)), elements_(elements) {}
  ~GlooPendingTransfers() override {
    try {
      wait();
    } catch (const std::exception&) {  // already recorded as the communicator's failure; a destructor cannot throw
    }
  }
  void wait_receives() override {
    comm_.run(op_.c_str(), elements_, DType::kF32, [&] {
      for (; !receives_.empty(); receives_.pop_back()) receives_.back()->waitRecv(comm_.timeout_);
    });
  }
  void wait() override {
    wait_receives();
    comm_.run(op_.c_str(), elements_, DType::kF32, [&] {
      for (; !sends_.empty(); sends_.pop_back()) sends_.back()->waitSend(comm_.timeout_);
    });
  }
  std::vector<Buffer> receives_, sends_;

 private:
  GlooCommunicator& comm_;
  std::string op_;
  int64_t elements_;
};

std::unique_ptr<PendingTransfers> GlooCommunicator::start_batch_send_recv(const std::vector<PeerTransfer>& sends,
                                                                          const std::vector<PeerTransfer>& recvs,
                                                                          Stream) {
  check_usable("batch_send_recv");
  for (const PeerTransfer& t : sends) {
    check_cpu("batch_send_recv", t.tensor, "a send");
    check_peer("batch_send_recv", t.peer);
  }
  for (const PeerTransfer& t : recvs) {
    check_cpu("batch_send_recv", t.tensor, "a receive");
    check_peer("batch_send_recv", t.peer);
  }
  // Transfers to this rank itself go through the queue that send/recv keep for it: sends first.
  for (const PeerTransfer& t : sends) {
    if (t.peer == rank_) send(t.tensor, rank_);
  }
  for (const PeerTransfer& t : recvs) {
    Tensor buf = t.tensor;
    if (t.peer == rank_) recv(buf, rank_);
  }
  int64_t elements = 0;  // for the error: everything the batch moves
  for (const PeerTransfer& t : sends) elements += t.tensor.numel();
  for (const PeerTransfer& t : recvs) elements += t.tensor.numel();
  auto pending =
      std::make_unique<GlooPendingTransfers>(*this, "batch_send_recv " + describe_transfers(sends, recvs), elements);
  // Every receive is posted before any send, so a peer's send (which goes out only into a posted receive) never waits
  // on this rank's sends, whatever order the ranks arrive in.
  run("batch_send_recv", elements, DType::kF32, [&] {
    for (const PeerTransfer& t : recvs) {
      if (t.peer == rank_) continue;
      pending->receives_.push_back(context_->createUnboundBuffer(bytes(t.tensor), t.tensor.nbytes()));
      pending->receives_.back()->recv(t.peer, tagged_slot(t.tag));
    }
    for (const PeerTransfer& t : sends) {
      if (t.peer == rank_) continue;
      pending->sends_.push_back(context_->createUnboundBuffer(bytes(t.tensor), t.tensor.nbytes()));
      pending->sends_.back()->send(t.peer, tagged_slot(t.tag));
    }
  });
  return pending;
}

void GlooCommunicator::barrier() {
  check_usable("barrier");
  if (size_ == 1) return;
  const uint32_t tag = next_tag();
  run("barrier", 0, DType::kU8, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    gloo::barrier(opts);
  });
}

std::unique_ptr<Communicator> GlooCommunicator::split(int color, int key) {
  check_usable("split");
  if (color < 0) {
    throw UsageError(
        fmt::format("[distributed] split on {}: color {} is negative; every rank needs a color >= 0", where(), color));
  }
  // Everyone learns everyone's (color, key) through the parent, then the members of each color connect
  // among themselves under keys of their own.
  Tensor mine = Tensor::empty({2}, DType::kI64);
  Tensor all = Tensor::empty({2 * static_cast<int64_t>(size_)}, DType::kI64);
  static_cast<int64_t*>(mine.data())[0] = color;
  static_cast<int64_t*>(mine.data())[1] = key;
  all_gather(mine, all);
  const auto* pairs = static_cast<const int64_t*>(all.data());
  std::vector<std::tuple<int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < size_; ++r) {
    if (pairs[2 * r] == color) members.emplace_back(pairs[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  const int new_size = static_cast<int>(members.size());
  const int new_rank = static_cast<int>(
      std::find(members.begin(), members.end(), std::make_tuple(int64_t{key}, rank_)) - members.begin());
  const std::string child = fmt::format("{}/split{}/color{}", name_, splits_++, color);
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(new_rank, new_size, store_, timeout_, network_, child, new_size > 1 ? device_ : nullptr));
}

}  // namespace primus
