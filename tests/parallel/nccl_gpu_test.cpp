// The NCCL communicator (src/parallel/nccl) in a world of one: NCCL will not put two ranks on one GPU, so
// results across ranks need a machine with several GPUs; here every collective is checked as the identity
// (or copy) a world of one makes it, bit for bit, on fresh random inputs, f32 and bf16, with outputs
// poisoned first so an element NCCL does not write fails the comparison. Also the in-place forms, i32/i64,
// the comm stream with events, split(), barrier(), argument errors, and the rendezvous: through the TCP
// store, through an in-test store, its timeout naming the key, and an init whose second rank never comes
// timing out with the communicator aborted (in a child process, so a hang there cannot stall the run).
//
// Without a usable CUDA device (or in a build without the CUDA backend) every test is skipped with the reason.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "parallel/store.h"
#include "support/test_support.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "parallel/nccl/nccl_communicator.h"
#endif

namespace primus {
namespace {

#if PRIMUS_WITH_CUDA

using namespace std::chrono_literals;
using primus::testing::host_f32;
using primus::testing::random_tensor;
using primus::testing::same_bits;

constexpr Device kGpu{DeviceType::kCuda, 0};
constexpr DistributedTimeout kTimeout = 60s;

// A Store in memory, for rendezvous inside one process.
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::vector<char>& value) override {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
    changed_.notify_all();
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, 10s);
    std::lock_guard<std::mutex> lock(mutex_);
    return values_.at(key);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    for (const std::string& key : keys) {
      if (!changed_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; })) {
        throw RuntimeError(fmt::format("[store] key {} was not set within {} ms", key, timeout.count()));
      }
    }
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_[key] += delta;
  }
  std::vector<std::string> keys() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [key, value] : values_) out.push_back(key);
    return out;
  }
  size_t value_size(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return values_.at(key).size();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> values_;
  std::map<std::string, int64_t> counters_;
};

Backend& gpu_backend() { return start_cuda_backend(0); }

// One world-of-one communicator for the whole binary (creating one takes NCCL a while). Never destroyed, as
// the backend: tearing NCCL down while the process exits is not what these tests check (split and the TCP
// store test destroy theirs).
MemoryStore& world_store() {
  static MemoryStore* store = new MemoryStore;
  return *store;
}
Communicator& world() {
  static Communicator* comm = make_nccl_communicator(0, 1, world_store(), kGpu, kTimeout).release();
  return *comm;
}

// Fresh N(0, 1) values on the GPU in `dtype` (bf16 rounded from f32 on the device).
Tensor random_on_gpu(int64_t n, DType dtype, Rng& rng) {
  Tensor f = ops::to_device(random_tensor({n}, rng), kGpu);
  if (dtype == DType::kF32) return f;
  Tensor t = Tensor::empty({n}, dtype, kGpu);
  gpu_backend().cast(t, f);
  return t;
}

Tensor clone(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  gpu_backend().copy(c, t);
  return c;
}

Tensor poisoned(int64_t n, DType dtype) {
  Tensor t = Tensor::empty({n}, dtype, kGpu);
  gpu_backend().fill(t, std::nanf(""));
  return t;
}

const char* name(DType dtype) { return dtype_name(dtype); }

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    PRIMUS_SKIP_WITHOUT_GPU();
    gpu_backend();
  }
  Rng rng_{0x5eed};
};

constexpr int64_t kSizes[] = {1, 33, 4099};
constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16};

TEST_F(Nccl, WorldOfOneAfterARendezvousThroughTheStore) {
  Communicator& comm = world();
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.backend_name(), "nccl");
  EXPECT_EQ(comm.device(), kGpu);
  // Rank 0 published NCCL's unique id (128 bytes) under a key of its own.
  const std::vector<std::string> keys = world_store().keys();
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(keys[0].rfind("primus/nccl/", 0), 0u) << keys[0];
  EXPECT_EQ(world_store().value_size(keys[0]), 128u);
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  ASSERT_NE(nvls, nullptr) << "NCCL_NVLS_ENABLE must be set before NCCL starts";
}

TEST_F(Nccl, AllReduceEveryOpIsTheIdentity) {
  for (DType dtype : kFloatTypes) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        const Tensor x = random_on_gpu(n, dtype, rng_);
        Tensor buf = clone(x);
        world().all_reduce(buf, op);
        EXPECT_TRUE(same_bits(buf, x)) << "all_reduce " << reduce_op_name(op) << " " << name(dtype) << " n=" << n;
      }
    }
  }
}

TEST_F(Nccl, AllReduceIntegers) {
  for (DType dtype : {DType::kI32, DType::kI64}) {
    const int64_t n = 37;
    Tensor host = Tensor::empty({n}, dtype);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = static_cast<int64_t>(rng_.below(1u << 30)) - (1 << 29);
      if (dtype == DType::kI32) {
        host.i32()[i] = static_cast<int32_t>(v);
      } else {
        static_cast<int64_t*>(host.data())[i] = v << 20;  // beyond 32 bits
      }
    }
    Tensor buf = ops::to_device(host, kGpu);
    world().all_reduce(buf, ReduceOp::kSum);
    EXPECT_TRUE(same_bits(buf, host)) << name(dtype);
  }
}

TEST_F(Nccl, ReduceScatterOutOfPlaceAndInPlace) {
  for (DType dtype : kFloatTypes) {
    for (int64_t n : kSizes) {
      const Tensor in = random_on_gpu(n, dtype, rng_);
      Tensor out = poisoned(n, dtype);
      world().reduce_scatter(in, out, ReduceOp::kSum);
      EXPECT_TRUE(same_bits(out, in)) << "reduce_scatter " << name(dtype) << " n=" << n;
      // In place: out is this rank's slice of in (all of it in a world of one).
      Tensor buf = clone(in);
      Tensor slice = buf.slice_elements(0, {n});
      world().reduce_scatter(buf, slice, ReduceOp::kSum);
      EXPECT_TRUE(same_bits(slice, in)) << "in-place reduce_scatter " << name(dtype) << " n=" << n;
    }
  }
}

TEST_F(Nccl, AllGatherOutOfPlaceAndInPlace) {
  for (DType dtype : kFloatTypes) {
    for (int64_t n : kSizes) {
      const Tensor in = random_on_gpu(n, dtype, rng_);
      Tensor out = poisoned(n, dtype);
      world().all_gather(in, out);
      EXPECT_TRUE(same_bits(out, in)) << "all_gather " << name(dtype) << " n=" << n;
      Tensor buf = clone(in);
      world().all_gather(buf.slice_elements(0, {n}), buf);
      EXPECT_TRUE(same_bits(buf, in)) << "in-place all_gather " << name(dtype) << " n=" << n;
    }
  }
}

TEST_F(Nccl, AllToAllAndUnevenCounts) {
  for (DType dtype : kFloatTypes) {
    for (int64_t n : kSizes) {
      const Tensor in = random_on_gpu(n, dtype, rng_);
      Tensor out = poisoned(n, dtype);
      world().all_to_all(in, out);
      EXPECT_TRUE(same_bits(out, in)) << "all_to_all " << name(dtype) << " n=" << n;
    }
    // all_to_all_v: 7 of 10 elements go out, into an output of 12; the rest of the output stays untouched.
    const Tensor in = random_on_gpu(10, dtype, rng_);
    Tensor out = poisoned(12, dtype);
    world().all_to_all_v(in, {7}, out, {7});
    EXPECT_TRUE(same_bits(out.slice_elements(0, {7}), in.slice_elements(0, {7}))) << "all_to_all_v " << name(dtype);
    const Tensor rest = host_f32(out.slice_elements(7, {5}));
    for (int64_t i = 0; i < 5; ++i) EXPECT_TRUE(std::isnan(rest.f32()[i])) << "all_to_all_v wrote past its count";
    // Zero counts send and receive nothing.
    Tensor untouched = poisoned(4, dtype);
    world().all_to_all_v(in, {0}, untouched, {0});
    EXPECT_TRUE(std::isnan(host_f32(untouched).f32()[0]));
  }
}

TEST_F(Nccl, BroadcastFromRootZero) {
  for (DType dtype : kFloatTypes) {
    const Tensor x = random_on_gpu(33, dtype, rng_);
    Tensor buf = clone(x);
    world().broadcast(buf, 0);
    EXPECT_TRUE(same_bits(buf, x)) << name(dtype);
  }
}

TEST_F(Nccl, CollectiveOnTheCommStreamOrderedByEvents) {
  Backend& backend = gpu_backend();
  const Stream compute = backend.stream(StreamKind::kCompute);
  const Stream comm = backend.stream(StreamKind::kComm);
  for (DType dtype : kFloatTypes) {
    const Tensor x = random_on_gpu(4099, dtype, rng_);
    Tensor buf = clone(x);  // written on compute
    const auto produced = backend.record_event(compute);
    backend.wait_event(comm, *produced);
    world().all_reduce(buf, ReduceOp::kSum, comm);
    Tensor gathered = poisoned(4099, dtype);
    world().all_gather(buf, gathered, comm);
    const auto done = backend.record_event(comm);
    backend.wait_event(compute, *done);
    EXPECT_TRUE(same_bits(gathered, x)) << name(dtype);  // read back on compute, after the event
  }
  backend.synchronize();
}

TEST_F(Nccl, BarrierReturns) {
  world().barrier();
  world().barrier();
}

TEST_F(Nccl, SplitMakesAWorkingCommunicator) {
  std::unique_ptr<Communicator> child = world().split(0, 0);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->rank(), 0);
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->backend_name(), "nccl");
  const Tensor x = random_on_gpu(33, DType::kBF16, rng_);
  Tensor buf = clone(x);
  child->all_reduce(buf, ReduceOp::kSum);
  EXPECT_TRUE(same_bits(buf, x));
  child->barrier();
  // A split of a split works too, and the parent is still usable.
  std::unique_ptr<Communicator> grandchild = child->split(3, 7);
  EXPECT_EQ(grandchild->size(), 1);
  grandchild->barrier();
  world().barrier();
  EXPECT_THROW(world().split(-1, 0), RuntimeError);
}

TEST_F(Nccl, BadArgumentsThrowNamingTheCollective) {
  Tensor f16 = Tensor::empty({8}, DType::kF16, kGpu);
  try {
    world().all_reduce(f16, ReduceOp::kSum);
    ADD_FAILURE() << "an f16 all_reduce should throw";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos) << e.what();
  }
  Tensor on_host = Tensor::empty({8}, DType::kF32);
  EXPECT_THROW(world().all_reduce(on_host, ReduceOp::kSum), RuntimeError);
  Tensor in = poisoned(8, DType::kF32), out = poisoned(4, DType::kF32), bf = poisoned(8, DType::kBF16);
  EXPECT_THROW(world().reduce_scatter(in, out, ReduceOp::kSum), RuntimeError);  // sizes
  EXPECT_THROW(world().all_gather(in, out), RuntimeError);                      // sizes
  EXPECT_THROW(world().all_gather(in, bf), RuntimeError);                       // dtypes
  EXPECT_THROW(world().all_to_all(in, in), RuntimeError);                       // no in-place form
  EXPECT_THROW(world().all_to_all_v(in, {9}, out, {0}), RuntimeError);          // more than in holds
  EXPECT_THROW(world().all_to_all_v(in, {1, 1}, out, {1, 1}), RuntimeError);    // counts for two ranks
  EXPECT_THROW(world().broadcast(in, 1), RuntimeError);                         // no rank 1
  EXPECT_THROW(world().send(in, 0), RuntimeError);  // a lone send to itself would hang the stream
  EXPECT_THROW(world().recv(in, 0), RuntimeError);
  EXPECT_THROW(world().send(in, 1), RuntimeError);
  // Still usable after rejected calls.
  world().barrier();
}

TEST_F(Nccl, RendezvousThroughTheTcpStore) {
  const int port = testing::free_port();
  std::unique_ptr<Store> store = make_tcp_store("127.0.0.1", port, /*serve=*/true, 30s);
  std::unique_ptr<Communicator> comm = make_nccl_communicator(0, 1, *store, kGpu, kTimeout);
  const Tensor x = random_on_gpu(33, DType::kF32, rng_);
  Tensor buf = clone(x);
  comm->all_reduce(buf, ReduceOp::kMax);
  EXPECT_TRUE(same_bits(buf, x));
  comm->barrier();
}

TEST_F(Nccl, RendezvousTimesOutNamingTheKey) {
  MemoryStore empty;  // rank 0 never publishes
  const auto start = std::chrono::steady_clock::now();
  try {
    make_nccl_communicator(1, 2, empty, kGpu, 300ms);
    ADD_FAILURE() << "rank 1 should time out waiting for rank 0's unique id";
  } catch (const RuntimeError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("primus/nccl/"), std::string::npos) << message;
    EXPECT_NE(message.find("unique id"), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

// Rank 0 of two with no rank 1: the non-blocking init never completes, so after the timeout the
// communicator is aborted and creation throws naming the call. Run in a fresh child process ("threadsafe"
// death tests re-execute the binary), with an alarm: if NCCL's abort itself hung, the child dies of SIGALRM
// and the test fails instead of stalling.
TEST(NcclDeathTest, InitTimesOutWhenARankNeverJoins) {
  PRIMUS_SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        alarm(120);
        MemoryStore store;
        try {
          make_nccl_communicator(0, 2, store, kGpu, 3s);
          std::fprintf(stderr, "creation returned without rank 1\n");
          std::_Exit(1);
        } catch (const RuntimeError& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::_Exit(0);
        }
      },
      ::testing::ExitedWithCode(0), "ncclCommInitRankConfig.*not done after 3.0 s");
}

#else

TEST(Nccl, NeedsTheCudaBackend) { GTEST_SKIP() << testing::why_no_gpu(); }

#endif

}  // namespace
}  // namespace primus
