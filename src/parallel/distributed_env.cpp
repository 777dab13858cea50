// DistributedEnv::from_environment (torchrun's variables, checked and named in every error) and
// make_world_communicator: the rendezvous through rank 0's TCP store, then Gloo for CPU ranks or NCCL for a
// CUDA device. Also reduce_op_name (the point-to-point helpers of communicator.h are in point_to_point.cpp).
#include "parallel/distributed_env.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "parallel/gloo_communicator.h"
#include "parallel/store.h"

#if PRIMUS_WITH_CUDA
#include "parallel/nccl/nccl_communicator.h"
#endif

namespace primus {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

namespace {

constexpr const char* kContract =
    "torchrun's contract: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT";

std::optional<std::string> env_text(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<int> env_int(const char* name) {
  std::optional<std::string> text = env_text(name);
  if (!text) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text->c_str(), &end, 10);
  if (errno != 0 || end == text->c_str() || *end != '\0' || value < INT_MIN || value > INT_MAX) {
    throw UsageError(
        fmt::format("[distributed] environment variable {}='{}' is not an integer ({})", name, *text, kContract));
  }
  return static_cast<int>(value);
}

void check_range(const char* name, int value, int lo, int hi, const std::string& why) {
  if (value < lo || value > hi) {
    throw UsageError(fmt::format("[distributed] environment variable {}={} is out of range: {}", name, value, why));
  }
}

// The address of this machine on the route towards the store's host: what peers on other nodes can reach
// (connecting a UDP socket sends nothing, it only picks the route). Loopback when the job is on one machine.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  std::string result;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return result;
  for (addrinfo* a = found; a != nullptr && result.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (::inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) result = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return result;
}

GlooNetwork gloo_network(const DistributedEnv& env) {
  GlooNetwork network;
  if (std::optional<std::string> iface = env_text("GLOO_SOCKET_IFNAME")) {
    network.iface = *iface;  // PyTorch's variable: the user knows better than the route
    return network;
  }
  std::string address = local_address_towards(env.master_addr, env.master_port);
  if (!address.empty()) {
    network.hostname = address;
  } else {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) == 0) network.hostname = name;
  }
  return network;
}

#if PRIMUS_WITH_CUDA
// A world of one still hands NCCL a store (its unique id goes through it), without opening a port.
class LocalStore final : public Store {
 public:
  void set(const std::string& key, const std::vector<char>& value) override {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] = value;
    changed_.notify_all();
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, std::chrono::milliseconds(0));
    std::lock_guard<std::mutex> lock(mutex_);
    return data_.at(key);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    for (const std::string& key : keys) {
      if (!changed_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; })) {
        throw RuntimeError(fmt::format("[distributed] rendezvous: key '{}' was never set in this world of one", key));
      }
    }
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<char>& slot = data_[key];
    int64_t value =
        (slot.empty() ? 0 : std::strtoll(std::string(slot.begin(), slot.end()).c_str(), nullptr, 10)) + delta;
    std::string text = std::to_string(value);
    slot.assign(text.begin(), text.end());
    changed_.notify_all();
    return value;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> data_;
};

// Holds the store for as long as the communicator (or a split of it) may use it.
class StoreKeeper final : public Communicator {
 public:
  StoreKeeper(std::unique_ptr<Communicator> inner, std::shared_ptr<Store> store)
      : inner_(std::move(inner)), store_(std::move(store)) {}
  ~StoreKeeper() override { inner_.reset(); }  // the communicator goes before the store it refers to

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  Device device() const override { return inner_->device(); }
  void all_reduce(Tensor& buf, ReduceOp op, Stream stream) override { inner_->all_reduce(buf, op, stream); }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, Stream stream) override {
    inner_->reduce_scatter(in, out, op, stream);
  }
  void all_gather(const Tensor& in, Tensor& out, Stream stream) override { inner_->all_gather(in, out, stream); }
  void all_to_all(const Tensor& in, Tensor& out, Stream stream) override { inner_->all_to_all(in, out, stream); }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                    const std::vector<int64_t>& recv_counts, Stream stream) override {
    inner_->all_to_all_v(in, send_counts, out, recv_counts, stream);
  }
  void broadcast(Tensor& buf, int root, Stream stream) override { inner_->broadcast(buf, root, stream); }
  void send(const Tensor& buf, int peer, Stream stream) override { inner_->send(buf, peer, stream); }
  void recv(Tensor& buf, int peer, Stream stream) override { inner_->recv(buf, peer, stream); }
  void send_recv(const Tensor& send_buf, int send_peer, Tensor& recv_buf, int recv_peer, Stream stream) override {
    inner_->send_recv(send_buf, send_peer, recv_buf, recv_peer, stream);
  }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> child = inner_->split(color, key);
    if (!child) return child;
    return std::make_unique<StoreKeeper>(std::move(child), store_);
  }

 private:
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<Store> store_;
};
#endif

}  // namespace

DistributedEnv DistributedEnv::from_environment() {
  DistributedEnv env;
  env.world_size = env_int("WORLD_SIZE").value_or(1);
  check_range("WORLD_SIZE", env.world_size, 1, INT_MAX, "a job has at least one rank");
  std::optional<int> rank = env_int("RANK");
  if (!rank && env.world_size > 1) {
    throw UsageError(fmt::format("[distributed] environment variable RANK is not set while WORLD_SIZE={} ({})",
                                 env.world_size, kContract));
  }
  env.rank = rank.value_or(0);
  check_range("RANK", env.rank, 0, env.world_size - 1,
              fmt::format("ranks are 0..WORLD_SIZE-1 = {}", env.world_size - 1));

  std::optional<int> nnodes = env_int("NNODES");
  std::optional<int> local_world = env_int("LOCAL_WORLD_SIZE");
  if (nnodes) check_range("NNODES", *nnodes, 1, env.world_size, fmt::format("1..WORLD_SIZE={}", env.world_size));
  env.local_world_size = local_world.value_or(nnodes ? env.world_size / *nnodes : env.world_size);
  check_range("LOCAL_WORLD_SIZE", env.local_world_size, 1, env.world_size,
              fmt::format("1..WORLD_SIZE={} ranks on a node", env.world_size));
  env.nnodes = nnodes.value_or((env.world_size + env.local_world_size - 1) / env.local_world_size);
  if (nnodes && static_cast<int64_t>(env.nnodes) * env.local_world_size != env.world_size) {
    throw UsageError(
        fmt::format("[distributed] NNODES={} x LOCAL_WORLD_SIZE={} is not WORLD_SIZE={}: every node "
                    "runs the same number of ranks",
                    env.nnodes, env.local_world_size, env.world_size));
  }
  env.local_rank = env_int("LOCAL_RANK").value_or(env.rank % env.local_world_size);
  check_range("LOCAL_RANK", env.local_rank, 0, env.local_world_size - 1,
              fmt::format("0..LOCAL_WORLD_SIZE-1 = {}", env.local_world_size - 1));
  env.node_rank = env_int("NODE_RANK").value_or(env.rank / env.local_world_size);
  check_range("NODE_RANK", env.node_rank, 0, env.nnodes - 1, fmt::format("0..NNODES-1 = {}", env.nnodes - 1));

  std::optional<std::string> addr = env_text("MASTER_ADDR");
  std::optional<int> port = env_int("MASTER_PORT");
  if (env.world_size > 1 && (!addr || !port)) {
    throw UsageError(
        fmt::format("[distributed] environment variable {} is not set while WORLD_SIZE={}: rank 0 serves "
                    "the rendezvous at MASTER_ADDR:MASTER_PORT",
                    !addr ? "MASTER_ADDR" : "MASTER_PORT", env.world_size));
  }
  if (addr) env.master_addr = *addr;
  if (port) {
    env.master_port = *port;
    check_range("MASTER_PORT", env.master_port, 1, 65535, "a TCP port is 1..65535");
  }
  return env;
}

std::unique_ptr<Communicator> make_world_communicator(const DistributedEnv& env, Device device,
                                                      DistributedTimeout timeout) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    throw UsageError(
        fmt::format("[distributed] rank {} of a world of {} is not a place in it", env.rank, env.world_size));
  }
  if (device.is_cpu()) {
    if (env.world_size == 1) return std::make_unique<GlooCommunicator>(0, 1, nullptr, timeout);
    std::shared_ptr<Store> store = make_tcp_store(env.master_addr, env.master_port, env.rank == 0, timeout);
    return std::make_unique<GlooCommunicator>(env.rank, env.world_size, std::move(store), timeout, gloo_network(env));
  }
#if PRIMUS_WITH_CUDA
  std::shared_ptr<Store> store;
  if (env.world_size == 1) {
    store = std::make_shared<LocalStore>();
  } else {
    store = make_tcp_store(env.master_addr, env.master_port, env.rank == 0, timeout);
  }
  std::unique_ptr<Communicator> nccl = make_nccl_communicator(env.rank, env.world_size, *store, device, timeout);
  return std::make_unique<StoreKeeper>(std::move(nccl), std::move(store));
#else
  throw UsageError(
      fmt::format("[distributed] device {} needs NCCL, and this primus-cli was built without CUDA "
                  "(PRIMUS_CUDA=OFF or no CUDA compiler): use the CPU device (Gloo)",
                  device.str()));
#endif
}

}  // namespace primus
