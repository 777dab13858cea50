// The CUDA backend's two streams, its events and the caching allocator across streams (cuda_backend.h,
// caching_allocator.h).
//
// To make "work still pending" certain rather than a race, a StreamGate holds a stream: a host function
// queued on it spins until the test opens the gate (or 30 s pass, so a broken test cannot hang the run),
// and everything queued behind it waits. With the gate closed, a test checks that the dependent work has
// not run (the event really orders it) and that the allocator does not hand out memory that held-back work
// still reads.
//
// Without a usable CUDA device (or in a build without the CUDA backend) every test is skipped with the reason.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "ops/ops.h"
#include "support/test_support.h"
#if PRIMUS_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gpu_runtime.h"
#endif

namespace primus {
namespace {

#if PRIMUS_WITH_CUDA

using namespace std::chrono_literals;
using primus::testing::host_f32;

constexpr Device kGpu{DeviceType::kCuda, 0};
constexpr int64_t kN = int64_t{1} << 20;  // 4 MiB of f32: one size class of its own
constexpr size_t kBytes = kN * sizeof(float);

gpuStream_t raw(Stream s) { return static_cast<gpuStream_t>(s.handle); }

class StreamGate {
 public:
  explicit StreamGate(Stream stream) : open_(std::make_shared<std::atomic<bool>>(false)) {
    // The host function owns a reference, so the flag outlives the gate if the stream runs late.
    auto* held = new std::shared_ptr<std::atomic<bool>>(open_);
    PRIMUS_CUDA_CHECK(gpuLaunchHostFunc(raw(stream), &StreamGate::hold, held));
  }
  ~StreamGate() { open(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void open() { open_->store(true); }

 private:
  static void hold(void* arg) {
    std::unique_ptr<std::shared_ptr<std::atomic<bool>>> flag(static_cast<std::shared_ptr<std::atomic<bool>>*>(arg));
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!(*flag)->load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(100us);
  }
  std::shared_ptr<std::atomic<bool>> open_;
};

// Whether `stream` still has work queued (a query; never waits).
bool busy(Stream stream) {
  const gpuError_t status = gpuStreamQuery(raw(stream));
  (void)gpuGetLastError();  // not-ready must not reach a later launch check
  if (status != gpuSuccess && status != gpuErrorNotReady) PRIMUS_CUDA_CHECK(status);
  return status == gpuErrorNotReady;
}

// Elements of a host copy of `t` that differ from `value`.
int64_t count_not(const Tensor& t, float value) {
  const Tensor h = host_f32(t);
  int64_t wrong = 0;
  for (int64_t i = 0; i < h.numel(); ++i) wrong += h.f32()[i] != value ? 1 : 0;
  return wrong;
}

class Streams : public ::testing::Test {
 protected:
  void SetUp() override {
    PRIMUS_SKIP_WITHOUT_GPU();
    backend_ = &start_cuda_backend(0);
    compute_ = backend_->stream(StreamKind::kCompute);
    comm_ = backend_->stream(StreamKind::kComm);
    backend_->synchronize();
  }
  CudaBackend& b() { return *backend_; }
  Tensor filled(int64_t n, float value) {
    Tensor t = Tensor::empty({n}, DType::kF32, kGpu);
    b().fill(t, value);
    return t;
  }

  CudaBackend* backend_ = nullptr;
  Stream compute_, comm_;
};

TEST_F(Streams, ComputeAndCommAreTwoStreams) {
  EXPECT_NE(compute_.handle, nullptr);
  EXPECT_NE(comm_.handle, nullptr);
  EXPECT_NE(compute_.handle, comm_.handle);
  EXPECT_EQ(b().stream(StreamKind::kCompute).handle, compute_.handle) << "the compute stream must not change";
  EXPECT_EQ(b().stream(StreamKind::kComm).handle, comm_.handle) << "the comm stream must not change";
}

TEST_F(Streams, CommWaitsForAnEventRecordedOnCompute) {
  Tensor src = filled(kN, 1.0f), dst = filled(kN, -1.0f);
  b().synchronize();
  {
    StreamGate gate(compute_);
    b().fill(src, 2.0f);  // held behind the gate
    const auto produced = b().record_event(compute_);
    b().wait_event(comm_, *produced);
    PRIMUS_CUDA_CHECK(gpuMemcpyAsync(dst.data(), src.data(), kBytes, gpuMemcpyDeviceToDevice, raw(comm_)));
    std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(busy(comm_)) << "the copy on the comm stream ran before the compute stream reached the event";
    gate.open();
  }
  PRIMUS_CUDA_CHECK(gpuStreamSynchronize(raw(comm_)));
  EXPECT_EQ(count_not(dst, 2.0f), 0) << "the copy on the comm stream must see the fill queued before the event";
}

TEST_F(Streams, NullStreamIsTheComputeStream) {
  Tensor src = filled(kN, 1.0f), dst = filled(kN, -1.0f);
  b().synchronize();
  {
    StreamGate gate(compute_);
    b().fill(src, 4.0f);
    const auto produced = b().record_event(Stream{});  // null handle: compute
    b().wait_event(comm_, *produced);
    PRIMUS_CUDA_CHECK(gpuMemcpyAsync(dst.data(), src.data(), kBytes, gpuMemcpyDeviceToDevice, raw(comm_)));
    std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(busy(comm_)) << "an event recorded on Stream{} must mark the compute stream";
  }
  PRIMUS_CUDA_CHECK(gpuStreamSynchronize(raw(comm_)));
  EXPECT_EQ(count_not(dst, 4.0f), 0);
}

TEST_F(Streams, WaitHostBlocksUntilTheEventIsReached) {
  Tensor src = filled(kN, 1.0f);
  b().synchronize();
  StreamGate gate(compute_);
  b().fill(src, 3.0f);
  const auto done = b().record_event(compute_);
  std::thread opener([&gate] {
    std::this_thread::sleep_for(100ms);
    gate.open();
  });
  const auto start = std::chrono::steady_clock::now();
  b().wait_host(*done);
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  opener.join();
  EXPECT_GE(waited_ms, 80.0) << "wait_host returned before the gate opened";
  // Read on the comm stream, with no stream order against compute: right only if wait_host waited.
  std::vector<float> host(kN, 0.0f);
  PRIMUS_CUDA_CHECK(gpuMemcpyAsync(host.data(), src.data(), kBytes, gpuMemcpyDeviceToHost, raw(comm_)));
  PRIMUS_CUDA_CHECK(gpuStreamSynchronize(raw(comm_)));
  int64_t wrong = 0;
  for (float v : host) wrong += v != 3.0f ? 1 : 0;
  EXPECT_EQ(wrong, 0) << "after wait_host the fill before the event must be visible";
}

TEST_F(Streams, SynchronizeWaitsForTheCommStreamToo) {
  Tensor src = filled(kN, 6.0f), dst = filled(kN, -1.0f);
  b().synchronize();
  StreamGate gate(comm_);
  PRIMUS_CUDA_CHECK(gpuMemcpyAsync(dst.data(), src.data(), kBytes, gpuMemcpyDeviceToDevice, raw(comm_)));
  std::thread opener([&gate] {
    std::this_thread::sleep_for(100ms);
    gate.open();
  });
  b().synchronize();
  opener.join();
  EXPECT_FALSE(busy(comm_)) << "synchronize() returned with work left on the comm stream";
  EXPECT_EQ(count_not(dst, 6.0f), 0);
}

TEST_F(Streams, EventsFromElsewhereAreRejected) {
  const DeviceEvent host_event{};
  EXPECT_THROW(b().wait_event(comm_, host_event), RuntimeError);
  EXPECT_THROW(b().wait_host(host_event), RuntimeError);
  const Tensor on_host = Tensor::empty({4}, DType::kF32);
  EXPECT_THROW(b().record_stream(on_host, comm_), RuntimeError);
}

TEST_F(Streams, AllocatorKeepsABlockUsedOnCommUntilThatWorkIsDone) {
  CachingAllocator& allocator = b().allocator();
  allocator.release_cached();  // free lists empty: which block comes back is then known
  Tensor a = filled(kN, 5.0f), spare = Tensor::empty({kN}, DType::kF32, kGpu);
  Tensor out = filled(2 * kN, -1.0f);  // another size class
  b().synchronize();
  void* const a_block = a.data();
  void* const spare_block = spare.data();
  const CudaMemoryStats before = allocator.stats();
  {
    StreamGate gate(comm_);
    // Reads a on the comm stream, held behind the gate.
    PRIMUS_CUDA_CHECK(gpuMemcpyAsync(out.data(), a.data(), kBytes, gpuMemcpyDeviceToDevice, raw(comm_)));
    b().record_stream(a, comm_);
    b().record_stream(out, comm_);
    spare = Tensor();  // never recorded: onto the free list at once
    a = Tensor();      // recorded: pending until the comm stream passes the copy
    const CudaMemoryStats freed = allocator.stats();
    EXPECT_EQ(freed.pending_bytes, before.pending_bytes + CachingAllocator::size_class(kBytes));
    EXPECT_EQ(freed.stream_waits, before.stream_waits + 1);

    Tensor c = Tensor::empty({kN}, DType::kF32, kGpu);
    EXPECT_NE(c.data(), a_block) << "the allocator handed out a block the comm stream still reads";
    EXPECT_EQ(c.data(), spare_block) << "an unrecorded block must be reused at once (the fast path)";
    b().fill(c, -7.0f);  // compute writes its new block while the comm copy is still held
    EXPECT_TRUE(busy(comm_));
    gate.open();
    PRIMUS_CUDA_CHECK(gpuStreamSynchronize(raw(comm_)));
    b().synchronize();
    EXPECT_EQ(count_not(out.slice_elements(0, {kN}), 5.0f), 0) << "the comm copy read memory that was reused";

    // The comm stream is past the copy: the next request of that class takes the held block.
    Tensor e = Tensor::empty({kN}, DType::kF32, kGpu);
    EXPECT_EQ(e.data(), a_block) << "a block whose comm work is done must come back into use";
    EXPECT_EQ(allocator.stats().pending_bytes, before.pending_bytes);
  }
}

TEST_F(Streams, ARecordedViewHoldsItsWholeBlock) {
  CachingAllocator& allocator = b().allocator();
  allocator.release_cached();
  Tensor buf = Tensor::empty({kN}, DType::kF32, kGpu);
  void* const block = buf.data();
  const CudaMemoryStats before = allocator.stats();
  b().record_stream(buf.slice_elements(kN / 2, {16}), comm_);
  b().record_stream(buf.slice_elements(kN / 2, {16}), comm_);  // twice: one declaration
  buf = Tensor();
  EXPECT_EQ(allocator.stats().pending_bytes, before.pending_bytes + CachingAllocator::size_class(kBytes));
  EXPECT_EQ(allocator.stats().stream_waits, before.stream_waits + 1);
  PRIMUS_CUDA_CHECK(gpuStreamSynchronize(raw(comm_)));  // the event recorded at the free is reached
  Tensor next = Tensor::empty({kN}, DType::kF32, kGpu);
  EXPECT_EQ(next.data(), block);
  EXPECT_EQ(allocator.stats().pending_bytes, before.pending_bytes);
}

TEST_F(Streams, RecordingOnTheComputeStreamKeepsTheFastPath) {
  CachingAllocator& allocator = b().allocator();
  allocator.release_cached();
  Tensor t = Tensor::empty({kN}, DType::kF32, kGpu);
  void* const block = t.data();
  const CudaMemoryStats before = allocator.stats();
  b().record_stream(t, compute_);
  b().record_stream(t, Stream{});
  t = Tensor();
  EXPECT_EQ(allocator.stats().stream_waits, before.stream_waits);
  EXPECT_EQ(allocator.stats().pending_bytes, before.pending_bytes);
  Tensor again = Tensor::empty({kN}, DType::kF32, kGpu);
  EXPECT_EQ(again.data(), block);
}

TEST_F(Streams, ReleaseCachedReturnsPendingBlocks) {
  CachingAllocator& allocator = b().allocator();
  allocator.release_cached();
  const CudaMemoryStats before = allocator.stats();
  Tensor t = Tensor::empty({kN}, DType::kF32, kGpu);
  b().record_stream(t, comm_);
  t = Tensor();
  EXPECT_GT(allocator.stats().pending_bytes, 0u);
  allocator.release_cached();
  const CudaMemoryStats after = allocator.stats();
  EXPECT_EQ(after.pending_bytes, 0u);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes) << "the pending block should go back to the driver";
}

#else

TEST(Streams, NeedTheCudaBackend) { GTEST_SKIP() << testing::why_no_gpu(); }

#endif

}  // namespace
}  // namespace primus
