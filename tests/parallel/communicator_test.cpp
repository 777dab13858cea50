// The Gloo communicator and its rendezvous, across real processes: each multi-rank test forks its ranks at
// its start (no thread exists yet in the test process), every child joins the world through the TCP store on a
// port of its own and checks every collective against the result computed locally from everyone's inputs
// (each rank regenerates all ranks' random inputs from one seed), then reports 0 or 1 and a message
// (support/multiprocess.h). The parent waits with a deadline and names the rank that failed or hung. Failure
// cases: a rank that never arrives, a peer that stalls, a peer that dies in the middle of a collective, an
// unreachable store, a port in use.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <thread>

#include "collective_checks.h"
#include "core/bf16.h"
#include "parallel/distributed_env.h"
#include "parallel/gloo_communicator.h"
#include "parallel/store.h"
#include "support/multiprocess.h"
#include "support/test_support.h"

namespace primus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

using testing::RankResult;
using testing::run_ranks;

void expect_all_ok(const std::vector<RankResult>& results, uint64_t seed) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].status, 0) << "rank " << rank << " of " << results.size() << " (seed " << seed
                                       << "): " << results[rank].message;
  }
}

// Failure tests print what the ranks reported: the messages a user would read.
void show(const std::vector<RankResult>& results) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    if (!results[rank].message.empty()) std::fprintf(stderr, "  rank %zu: %s\n", rank, results[rank].message.c_str());
  }
}

// The child's rank through torchrun's variables, as a launcher sets them.
DistributedEnv torchrun_env(int rank, int size, int port) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(size).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  return DistributedEnv::from_environment();
}

int thread_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// --- a world of one --------------------------------------------------------------------------------------------

TEST(Communicator, WorldOfOneIsARealCommunicatorWithoutNetwork) {
  const uint64_t seed = std::random_device{}();
  const int threads_before = thread_count();
  std::unique_ptr<Communicator> comm = make_world_communicator(DistributedEnv{}, kCpuDevice, 5s);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend_name(), "gloo");
  EXPECT_EQ(thread_count(), threads_before) << "a world of one starts no Gloo event loop and no store server";
  try {
    testing::check_collectives(*comm, seed);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "seed " << seed << ": " << e.what();
  }
}

// --- every collective at 2, 3 and 4 ranks ---------------------------------------------------------------------

void collectives_on(int size) {
  const uint64_t seed = std::random_device{}();
  const int port = testing::free_port();
  auto results = run_ranks(size, 60s, [&](int rank) {
    std::unique_ptr<Communicator> comm = make_world_communicator(torchrun_env(rank, size, port), kCpuDevice, 20s);
    if (comm->rank() != rank || comm->size() != size) throw std::runtime_error("wrong rank or size");
    testing::check_collectives(*comm, seed);
    return std::string();
  });
  expect_all_ok(results, seed);
}

TEST(Communicator, EveryCollectiveOnTwoRanks) { collectives_on(2); }
TEST(Communicator, EveryCollectiveOnThreeRanks) { collectives_on(3); }
TEST(Communicator, EveryCollectiveOnFourRanks) { collectives_on(4); }

// Groups of one and of three out of four: both run every collective among their members only.
TEST(Communicator, SplitIntoTwoGroupsRunsCollectivesInEach) {
  const uint64_t seed = std::random_device{}();
  const int port = testing::free_port();
  auto results = run_ranks(4, 60s, [&](int rank) {
    auto world = make_world_communicator(torchrun_env(rank, 4, port), kCpuDevice, 20s);
    const int color = rank == 2 ? 0 : 1;
    std::unique_ptr<Communicator> group = world->split(color, rank);
    const int want_size = color == 0 ? 1 : 3;
    const int want_rank = color == 0 ? 0 : (rank < 2 ? rank : rank - 1);
    if (group->size() != want_size || group->rank() != want_rank) {
      throw std::runtime_error(
          fmt::format("split gave rank {} of {}, want {} of {}", group->rank(), group->size(), want_rank, want_size));
    }
    testing::check_collectives(*group, seed + static_cast<uint64_t>(color));
    world->barrier();  // the parent still works after its children did
    return std::string();
  });
  expect_all_ok(results, seed);
}

// --- tagged point-to-point batches (pipeline stages) ---------------------------------------------------------

// Each of `size` ranks sends two tensors to each ring neighbour at once, listed in another order than the receiver
// lists its receives (tags pair them, not positions), receives theirs, and checks their values. `base`: through the
// Communicator's default (peer by peer, lower rank first) instead of Gloo's own.
void tagged_ring(int size, bool base) {
  const int port = testing::free_port();
  auto results = run_ranks(size, 60s, [&](int rank) {
    auto comm = make_world_communicator(torchrun_env(rank, size, port), kCpuDevice, 20s);
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    // Value of the message from `from` to `to` with tag `tag`, element k.
    auto value = [](int from, int to, uint32_t tag, int64_t k) {
      return static_cast<float>(1000 * from + 100 * to + 10 * static_cast<int>(tag) + k);
    };
    auto filled = [&](int to, uint32_t tag, int64_t n) {
      Tensor t = Tensor::empty({n}, DType::kF32);
      for (int64_t k = 0; k < n; ++k) t.f32()[k] = value(rank, to, tag, k);
      return t;
    };
    // Tag 1 carries 3 elements, tag 2 five (to next); tags 3 and 4 likewise (to prev).
    std::vector<PeerTransfer> sends{{filled(next, 2, 5), next, 2}, {filled(prev, 4, 5), prev, 4},
                                    {filled(next, 1, 3), next, 1}, {filled(prev, 3, 3), prev, 3}};
    std::vector<PeerTransfer> recvs{{Tensor::empty({3}, DType::kF32), prev, 1},
                                    {Tensor::empty({5}, DType::kF32), prev, 2},
                                    {Tensor::empty({3}, DType::kF32), next, 3},
                                    {Tensor::empty({5}, DType::kF32), next, 4}};
    if (base) {
      comm->Communicator::start_batch_send_recv(sends, recvs)->wait();
    } else {
      comm->batch_send_recv(sends, recvs);
    }
    for (const PeerTransfer& r : recvs) {
      for (int64_t k = 0; k < r.tensor.numel(); ++k) {
        if (r.tensor.f32()[k] != value(r.peer, rank, r.tag, k)) {
          throw std::runtime_error(fmt::format("rank {}: tag {} from rank {} element {} is {}", rank, r.tag, r.peer,
                                               k, r.tensor.f32()[k]));
        }
      }
    }
    return std::string();
  });
  expect_all_ok(results, 0);
}

TEST(Communicator, TaggedBatchesPairByTagOnTwoAndThreeRanks) {
  tagged_ring(2, false);
  tagged_ring(3, false);
}

TEST(Communicator, TheDefaultBatchOrdersPairsWithoutDeadlock) {
  tagged_ring(2, true);
  tagged_ring(3, true);
}

// A started batch returns without waiting for the peer, and its receives can be waited for apart from its sends:
// rank 0 starts a batch that sends to rank 1 and receives from it; rank 1 sends at once but posts its receive only
// after a pause. Rank 0's start and wait_receives must return before that pause is over, its wait after.
TEST(Communicator, StartedBatchesWaitOnlyForWhatIsWaitedFor) {
  const int port = testing::free_port();
  constexpr auto kPause = 1500ms;
  auto results = run_ranks(2, 60s, [&](int rank) -> std::string {
    auto comm = make_world_communicator(torchrun_env(rank, 2, port), kCpuDevice, 20s);
    Tensor out = Tensor::empty({1000}, DType::kF32), in = Tensor::empty({1000}, DType::kF32);
    for (int64_t k = 0; k < out.numel(); ++k) out.f32()[k] = static_cast<float>(rank * 10000 + k);
    auto expect_received = [&](int from) {
      for (int64_t k = 0; k < in.numel(); ++k) {
        if (in.f32()[k] != static_cast<float>(from * 10000 + k)) {
          throw std::runtime_error(fmt::format("rank {}: element {} is {}", rank, k, in.f32()[k]));
        }
      }
    };
    comm->barrier();
    if (rank == 1) {
      auto sent = comm->start_batch_send_recv({PeerTransfer{out, 0, 5}}, {});
      std::this_thread::sleep_for(kPause);
      comm->batch_send_recv({}, {PeerTransfer{in, 0, 6}});
      sent->wait();
      expect_received(0);
      return std::string();
    }
    const Clock::time_point start = Clock::now();
    auto pending = comm->start_batch_send_recv({PeerTransfer{out, 1, 6}}, {PeerTransfer{in, 1, 5}});
    const double started = seconds_since(start);
    pending->wait_receives();
    const double received = seconds_since(start);
    expect_received(1);
    pending->wait();
    const double sent = seconds_since(start);
    if (started > 0.5 || received > 0.5 || sent < 1.0) {
      throw std::runtime_error(fmt::format("start returned after {:.2f} s, wait_receives after {:.2f} s, wait after "
                                           "{:.2f} s (the peer posted its receive after 1.5 s)",
                                           started, received, sent));
    }
    return std::string();
  });
  expect_all_ok(results, 0);
}

TEST(Communicator, BatchWaitingForAnAbsentPeerNamesItsTransfers) {
  const int port = testing::free_port();
  auto results = run_ranks(2, 20s, [&](int rank) -> std::string {
    auto comm = make_world_communicator(torchrun_env(rank, 2, port), kCpuDevice, 1s);
    comm->barrier();
    if (rank == 1) {
      std::this_thread::sleep_for(2s);  // alive but never sends
      ::_exit(0);
    }
    try {
      comm->batch_send_recv({}, {PeerTransfer{Tensor::empty({4}, DType::kF32), 1, 7}});
    } catch (const RuntimeError& e) {
      return e.what();
    }
    throw std::runtime_error("the receive completed without a sender");
  });
  show(results);
  ASSERT_EQ(results[0].status, 0) << results[0].message;
  EXPECT_NE(results[0].message.find("from rank 1 (tag 7, 4 elements)"), std::string::npos) << results[0].message;
}

// --- failures: each names what it waited for, none hangs --------------------------------------------------------

TEST(Communicator, RankThatNeverArrivesFailsTheOthersWithinTheTimeout) {
  const int port = testing::free_port();
  auto results = run_ranks(3, 20s, [&](int rank) -> std::string {
    if (rank == 2) return "";  // never joins
    const auto start = Clock::now();
    try {
      make_world_communicator(torchrun_env(rank, 3, port), kCpuDevice, 1500ms);
    } catch (const RuntimeError& e) {
      return fmt::format("{:.2f}|{}", seconds_since(start), e.what());
    }
    throw std::runtime_error("the rendezvous succeeded without rank 2");
  });
  show(results);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(results[rank].status, 0) << "rank " << rank << ": " << results[rank].message;
    const std::string& m = results[rank].message;
    const double elapsed = std::stod(m.substr(0, m.find('|')));
    EXPECT_LT(elapsed, 1.5 + 2.0) << m;
    EXPECT_NE(m.find("'gloo/world/addr/2'"), std::string::npos) << m;
    // Rank 0 serves the store and sees its own timeout; rank 1 may instead lose the store when rank 0 exits.
    if (rank == 0) {
      EXPECT_GE(elapsed, 1.4) << m;
      EXPECT_NE(m.find("timed out after 1.5 s"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 2 of the 3 ranks"), std::string::npos) << m;
      EXPECT_NE(m.find(fmt::format("MASTER_PORT={}", port)), std::string::npos) << m;
    }
  }
}

TEST(Communicator, CollectiveTimesOutOnAStalledPeer) {
  const int port = testing::free_port();
  auto results = run_ranks(3, 20s, [&](int rank) -> std::string {
    auto comm = make_world_communicator(torchrun_env(rank, 3, port), kCpuDevice, 1s);
    Tensor buf = Tensor::zeros({256}, DType::kF32);
    comm->all_reduce(buf, ReduceOp::kSum);
    if (rank == 2) {
      std::this_thread::sleep_for(2s);  // alive but never calls the next collective
      ::_exit(0);
    }
    const auto start = Clock::now();
    try {
      comm->all_reduce(buf, ReduceOp::kSum);
    } catch (const RuntimeError& e) {
      return fmt::format("{:.2f}|{}", seconds_since(start), e.what());
    }
    throw std::runtime_error("all_reduce succeeded without rank 2");
  });
  show(results);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(results[rank].status, 0) << "rank " << rank << ": " << results[rank].message;
    const std::string& m = results[rank].message;
    EXPECT_LT(std::stod(m.substr(0, m.find('|'))), 1.9) << m;
    EXPECT_NE(m.find("all_reduce of 256 f32 on rank"), std::string::npos) << m;
    EXPECT_NE(m.find("of 3 (gloo) failed"), std::string::npos) << m;
  }
}

TEST(Communicator, PeerDyingMidCollectiveFailsTheOthers) {
  const int port = testing::free_port();
  auto results = run_ranks(3, 20s, [&](int rank) -> std::string {
    auto comm = make_world_communicator(torchrun_env(rank, 3, port), kCpuDevice, 5s);
    Tensor buf = Tensor::zeros({1024}, DType::kF32);
    comm->all_reduce(buf, ReduceOp::kSum);
    if (rank == 2) ::_exit(0);  // dies without closing anything: the kernel resets its connections
    const auto start = Clock::now();
    std::string first;
    try {
      comm->all_reduce(buf, ReduceOp::kSum);
      return "all_reduce succeeded without rank 2";
    } catch (const RuntimeError& e) {
      first = fmt::format("{:.2f}|{}", seconds_since(start), e.what());
    }
    try {
      comm->barrier();
    } catch (const RuntimeError& e) {
      return first + "|then|" + e.what();
    }
    return first + "|then the barrier succeeded";
  });
  show(results);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(results[rank].status, 0) << "rank " << rank << ": " << results[rank].message;
    const std::string& m = results[rank].message;
    EXPECT_LT(std::stod(m.substr(0, m.find('|'))), 5.0) << m;
    EXPECT_NE(m.find(fmt::format("all_reduce of 1024 f32 on rank {} of 3 (gloo) failed", rank)), std::string::npos)
        << m;
    EXPECT_NE(m.find("|then|[distributed] barrier on rank"), std::string::npos) << m;
    EXPECT_NE(m.find("unusable"), std::string::npos) << m;
  }
}

// --- the store alone ----------------------------------------------------------------------------------------------

TEST(TcpStore, SetGetAddWaitBetweenClients) {
  const int port = testing::free_port();
  std::unique_ptr<Store> server = make_tcp_store("127.0.0.1", port, true, 5s);
  std::unique_ptr<Store> client = make_tcp_store("localhost", port, false, 5s);
  server->set("a", {'x', 'y'});
  EXPECT_EQ(client->get("a"), (std::vector<char>{'x', 'y'}));
  client->set("empty", {});
  EXPECT_TRUE(server->get("empty").empty());
  EXPECT_EQ(client->add("n", 2), 2);
  EXPECT_EQ(server->add("n", 5), 7);
  std::vector<char> big(1 << 20, 'b');
  client->set("big", big);
  EXPECT_EQ(server->get("big"), big);
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    client->set("late", {'1'});
  });
  server->wait({"a", "late"}, 5s);  // returns once the other client set it
  late.join();
  const auto start = Clock::now();
  try {
    server->wait({"a", "never"}, 300ms);
    ADD_FAILURE() << "wait for an unset key returned";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out after 0.3 s waiting for key 'never'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(fmt::format("MASTER_PORT={}", port)), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(start), 2.0);
}

TEST(TcpStore, UnreachableStoreFailsAfterTheTimeoutNamingTheAddress) {
  const int port = testing::free_port();
  const auto start = Clock::now();
  try {
    make_tcp_store("127.0.0.1", port, false, 500ms);
    ADD_FAILURE() << "connected to nobody";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("127.0.0.1:{}", port)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("after 0.5 s"), std::string::npos) << e.what();
  }
  EXPECT_GE(seconds_since(start), 0.4);
  EXPECT_LT(seconds_since(start), 2.0);
}

TEST(TcpStore, PortInUseNamesThePort) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  try {
    make_tcp_store("127.0.0.1", port, true, 1s);
    ADD_FAILURE() << "served on a port in use";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("cannot listen on port {}", port)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT"), std::string::npos) << e.what();
  }
  ::close(fd);
}

// --- torchrun's variables ------------------------------------------------------------------------------------------

class EnvGuard {
 public:
  EnvGuard() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(name);
    }
  }
  ~EnvGuard() {
    for (auto& [name, value] : saved_) {
      if (value)
        setenv(name, value->c_str(), 1);
      else
        unsetenv(name);
    }
  }
  static constexpr const char* kNames[] = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                           "MASTER_ADDR", "MASTER_PORT", "NNODES",     "NODE_RANK"};

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(DistributedEnv, ReadsTorchrunVariables) {
  EnvGuard guard;
  DistributedEnv none = DistributedEnv::from_environment();
  EXPECT_EQ(none.world_size, 1);
  EXPECT_FALSE(none.is_multi_process());
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("NNODES", "2", 1);
  setenv("MASTER_ADDR", "node1", 1);
  setenv("MASTER_PORT", "29511", 1);
  DistributedEnv env = DistributedEnv::from_environment();
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);  // derived: RANK % LOCAL_WORLD_SIZE
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.nnodes, 2);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "node1");
  EXPECT_EQ(env.master_port, 29511);
}

TEST(DistributedEnv, ErrorsNameTheVariable) {
  EnvGuard guard;
  auto read = [] { DistributedEnv::from_environment(); };
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "x1", 1);
  EXPECT_NE(usage_error_of(read).find("RANK='x1' is not an integer"), std::string::npos) << usage_error_of(read);
  setenv("RANK", "2", 1);
  EXPECT_NE(usage_error_of(read).find("RANK=2 is out of range"), std::string::npos) << usage_error_of(read);
  setenv("RANK", "1", 1);
  EXPECT_NE(usage_error_of(read).find("MASTER_ADDR is not set"), std::string::npos) << usage_error_of(read);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  EXPECT_NE(usage_error_of(read).find("MASTER_PORT is not set"), std::string::npos) << usage_error_of(read);
  setenv("MASTER_PORT", "70000", 1);
  EXPECT_NE(usage_error_of(read).find("MASTER_PORT=70000"), std::string::npos) << usage_error_of(read);
  setenv("MASTER_PORT", "29500", 1);
  setenv("NNODES", "2", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  EXPECT_NE(usage_error_of(read).find("NNODES=2 x LOCAL_WORLD_SIZE=2 is not WORLD_SIZE=2"), std::string::npos)
      << usage_error_of(read);
  unsetenv("NNODES");
  setenv("LOCAL_RANK", "3", 1);
  EXPECT_NE(usage_error_of(read).find("LOCAL_RANK=3"), std::string::npos) << usage_error_of(read);
}

#if !PRIMUS_WITH_CUDA
TEST(DistributedEnv, CudaWorldWithoutCudaBuildIsAUsageError) {
  std::string m = usage_error_of([] { make_world_communicator(DistributedEnv{}, Device{DeviceType::kCuda, 0}, 1s); });
  EXPECT_NE(m.find("built without CUDA"), std::string::npos) << m;
}
#endif

}  // namespace
}  // namespace primus
