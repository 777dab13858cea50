// CudaBackend: unpacks the validated op arguments (src/ops checked dtypes, shapes and devices), dispatches on
// the dtype and calls the typed launchers of kernels/<op>.cu; GEMMs go to cuBLASLt, bf16 attention to cuDNN.
// Also the process-wide start-up that registers the backend and its caching allocator.
#include "backend/cuda/cuda_backend.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cublaslt_helpers.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/gpu_runtime.h"
#include "backend/cuda/kernels/fp8_kernels.h"
#include "backend/cuda/kernels/kernels.h"

namespace primus {

struct CudaBackend::State {
  explicit State(int index) : device_index(index), allocator(Device{DeviceType::kCuda, index}) {}
  int device_index;
  gpuStream_t stream = nullptr;       // compute: every op
  gpuStream_t comm_stream = nullptr;  // communication: what parallel/ puts there
  CachingAllocator allocator;
  // Reached events without timing, ready to record again (see CudaEvent).
  std::mutex event_mutex;
  std::vector<gpuEvent_t> event_pool;
  cuda::DeviceError* error = nullptr;  // device memory, see kernels.h
  double* result = nullptr;            // device memory for sum_squares
  cuda::KernelContext ctx;
  std::unique_ptr<CublasLtGemm> gemm;
  // Created on the first bf16 attention: loading cuDNN takes seconds, and fp32-only processes never need it.
  std::unique_ptr<CudnnAttention> attention;
  bool deterministic = false;
};

namespace {

// Calls f with a value of the storage type of `dtype` (float or cuda::bf16); other dtypes are not implemented.
template <typename F>
void dispatch(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kBF16:
      f(cuda::bf16{});
      return;
    default:
      throw RuntimeError(fmt::format("[op {}] dtype {} is not supported on cuda yet", op, dtype_name(dtype)));
  }
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data());
}

template <typename T>
T* ptr_or_null(const Tensor* t) {
  return t != nullptr && t->defined() ? static_cast<T*>(t->data()) : nullptr;
}

std::string device_error_message(const cuda::DeviceError& e) {
  struct Wording {
    const char* op;
    const char* value;
    const char* position;
    const char* range;
  };
  Wording w{"unknown", "value", "position", "its range"};
  switch (e.code) {
    case cuda::kEmbeddingForwardId:
      w = {"embedding_forward", "id", "position", "the table"};
      break;
    case cuda::kEmbeddingBackwardId:
      w = {"embedding_backward", "id", "position", "the table"};
      break;
    case cuda::kCrossEntropyForwardTarget:
      w = {"cross_entropy_forward", "target", "row", "the vocabulary"};
      break;
    case cuda::kCrossEntropyBackwardTarget:
      w = {"cross_entropy_backward", "target", "row", "the vocabulary"};
      break;
    case cuda::kRopePosition:
      w = {"rope", "position", "token", "the rope table"};
      break;
    case cuda::kAttentionSegmentStart:
      w = {"attention", "segment start", "token", "its causal range"};
      break;
    case cuda::kEmbeddingForwardVocabId:
      w = {"embedding_forward", "id", "position", "the vocabulary"};
      break;
    case cuda::kEmbeddingBackwardVocabId:
      w = {"embedding_backward", "id", "position", "the vocabulary"};
      break;
    case cuda::kCrossEntropyShardStatsTarget:
      w = {"cross_entropy_shard_stats", "target", "row", "the vocabulary"};
      break;
    case cuda::kMoeSortExpert:
      w = {"moe_sort", "expert", "routing entry", "the experts"};
      break;
    case cuda::kMoeCapacityExpert:
      w = {"moe_capacity", "expert", "routing entry", "the experts"};
      break;
    case cuda::kMoePadRows:
      w = {"moe_pad_rows", "row count", "local expert", "its padded capacity"};
      break;
    default:
      break;
  }
  return fmt::format("[op {}] {} {} at {} {} is outside {} [0, {}) (found on the GPU, reported at the next wait)", w.op,
                     w.value, e.value, w.position, e.position, w.range, e.limit);
}

}  // namespace

CudaBackend::CudaBackend(int device_index) : state_(std::make_unique<State>(device_index)) {
  State& s = *state_;
  PRIMUS_CUDA_CHECK(gpuSetDevice(device_index));
  gpuDeviceProp_t props{};
  PRIMUS_CUDA_CHECK(gpuGetDeviceProperties(&props, device_index));
  PRIMUS_CUDA_CHECK(gpuStreamCreateWithFlags(&s.stream, gpuStreamNonBlocking));
  // Collectives at the highest priority: the scheduler then starts their blocks ahead of queued compute
  // blocks, so a gradient all-reduce overlapping backward is not delayed to its end.
  int least_priority = 0, greatest_priority = 0;
  PRIMUS_CUDA_CHECK(gpuDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
  PRIMUS_CUDA_CHECK(gpuStreamCreateWithPriority(&s.comm_stream, gpuStreamNonBlocking, greatest_priority));
  PRIMUS_CUDA_CHECK(gpuMalloc(reinterpret_cast<void**>(&s.error), sizeof(cuda::DeviceError)));
  PRIMUS_CUDA_CHECK(gpuMemsetAsync(s.error, 0, sizeof(cuda::DeviceError), s.stream));
  PRIMUS_CUDA_CHECK(gpuMalloc(reinterpret_cast<void**>(&s.result), sizeof(double)));
  s.ctx.stream = s.stream;
  s.ctx.error = s.error;
  s.ctx.allocator = &s.allocator;
  s.ctx.max_shared_bytes = static_cast<int64_t>(props.sharedMemPerBlockOptin);
  s.ctx.compute_capability = props.major * 10 + props.minor;
  s.ctx.multiprocessors = props.multiProcessorCount;
  s.gemm = std::make_unique<CublasLtGemm>();
}

// Only reached if a start fails half-way: the running backend is never destroyed (see start_cuda_backend).
CudaBackend::~CudaBackend() = default;

Device CudaBackend::device() const { return Device{DeviceType::kCuda, state_->device_index}; }

CachingAllocator& CudaBackend::allocator() { return state_->allocator; }

void CudaBackend::report_device_errors() {
  cuda::DeviceError error{};
  PRIMUS_CUDA_CHECK(gpuMemcpyAsync(&error, state_->error, sizeof(error), gpuMemcpyDeviceToHost, state_->stream));
  PRIMUS_CUDA_CHECK(gpuStreamSynchronize(state_->stream));
  if (error.code == cuda::kNoError) return;
  PRIMUS_CUDA_CHECK(gpuMemsetAsync(state_->error, 0, sizeof(cuda::DeviceError), state_->stream));
  throw RuntimeError(device_error_message(error));
}

namespace {

struct CudaMark : DeviceMark {
  gpuEvent_t event = nullptr;
  CudaMark() { PRIMUS_CUDA_CHECK(gpuEventCreate(&event)); }
  ~CudaMark() override { gpuEventDestroy(event); }
  CudaMark(const CudaMark&) = delete;
  CudaMark& operator=(const CudaMark&) = delete;
};

}  // namespace

std::unique_ptr<DeviceMark> CudaBackend::mark() {
  auto m = std::make_unique<CudaMark>();
  PRIMUS_CUDA_CHECK(gpuEventRecord(m->event, state_->stream));
  return m;
}

double CudaBackend::elapsed_ms(const DeviceMark& from, const DeviceMark& to) {
  const auto& a = dynamic_cast<const CudaMark&>(from);
  const auto& b = dynamic_cast<const CudaMark&>(to);
  PRIMUS_CUDA_CHECK(gpuEventSynchronize(b.event));
  float ms = 0.0f;
  PRIMUS_CUDA_CHECK(gpuEventElapsedTime(&ms, a.event, b.event));
  return ms;
}

void CudaBackend::range_push(const char* name) { gpuRangePush(name); }
void CudaBackend::range_pop() { gpuRangePop(); }

void CudaBackend::wait_compute() {
  PRIMUS_CUDA_CHECK(gpuStreamSynchronize(state_->stream));
  report_device_errors();
}

void CudaBackend::synchronize() {
  PRIMUS_CUDA_CHECK(gpuStreamSynchronize(state_->comm_stream));
  wait_compute();
}

namespace {

// An event from the backend's pool; handed back on destruction. Re-recording a pooled event is safe even
// while a stream still waits on an earlier record: cudaStreamWaitEvent captures the record current at the call.
struct CudaEvent : DeviceEvent {
  gpuEvent_t event = nullptr;
  std::mutex* pool_mutex = nullptr;
  std::vector<gpuEvent_t>* pool = nullptr;
  ~CudaEvent() override {
    std::lock_guard<std::mutex> lock(*pool_mutex);
    pool->push_back(event);
  }
};

const CudaEvent& cuda_event(const DeviceEvent& event, const char* op) {
  const auto* e = dynamic_cast<const CudaEvent*>(&event);
  PRIMUS_CHECK(e != nullptr, "[cuda {}] the event was not recorded by the cuda backend", op);
  return *e;
}

}  // namespace

void* CudaBackend::resolve(Stream stream) const {
  return stream.handle != nullptr ? stream.handle : static_cast<void*>(state_->stream);
}

Stream CudaBackend::stream(StreamKind kind) {
  return Stream{kind == StreamKind::kComm ? state_->comm_stream : state_->stream};
}

std::unique_ptr<DeviceEvent> CudaBackend::record_event(Stream stream) {
  auto e = std::make_unique<CudaEvent>();
  e->pool_mutex = &state_->event_mutex;
  e->pool = &state_->event_pool;
  {
    std::lock_guard<std::mutex> lock(state_->event_mutex);
    if (!state_->event_pool.empty()) {
      e->event = state_->event_pool.back();
      state_->event_pool.pop_back();
    }
  }
  if (e->event == nullptr) {
    gpuEvent_t created = nullptr;
    PRIMUS_CUDA_CHECK(gpuEventCreateWithFlags(&created, gpuEventDisableTiming));
    e->event = created;
  }
  PRIMUS_CUDA_CHECK(gpuEventRecord(e->event, static_cast<gpuStream_t>(resolve(stream))));
  return e;
}

void CudaBackend::wait_event(Stream stream, const DeviceEvent& event) {
  PRIMUS_CUDA_CHECK(
      gpuStreamWaitEvent(static_cast<gpuStream_t>(resolve(stream)), cuda_event(event, "wait_event").event, 0));
}

void CudaBackend::wait_host(const DeviceEvent& event) {
  PRIMUS_CUDA_CHECK(gpuEventSynchronize(cuda_event(event, "wait_host").event));
}

void CudaBackend::pin_host(void* ptr, size_t bytes) {
  PRIMUS_CUDA_CHECK(gpuHostRegister(ptr, bytes, gpuHostRegisterDefault));
}

void CudaBackend::unpin_host(void* ptr) { PRIMUS_CUDA_CHECK(gpuHostUnregister(ptr)); }

// cuDNN's attention backward is the one op whose default sums with atomics; cuBLASLt gives the same bits for one
// algorithm, which its heuristic picks the same way for one shape, and our kernels reduce in a fixed order.
void CudaBackend::set_deterministic(bool deterministic) {
  if (deterministic == state_->deterministic) return;
  synchronize();  // the plans of the attention being replaced may still be running
  state_->deterministic = deterministic;
  state_->attention.reset();
}

void CudaBackend::record_stream(const Tensor& t, Stream stream) {
  if (!t.defined() || t.nbytes() == 0) return;
  PRIMUS_CHECK(t.device() == device(), "[cuda record_stream] {} does not live on {}", t.describe(), device().str());
  void* s = resolve(stream);
  if (s == static_cast<void*>(state_->stream)) return;  // the compute stream orders its own reuse
  state_->allocator.record_stream(t.data(), t.nbytes(), s);
}

void CudaBackend::copy(Tensor& dst, const Tensor& src) {
  PRIMUS_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "[op copy] {} <- {}: dtype or size differ",
               dst.describe(), src.describe());
  for (const Tensor* t : {static_cast<const Tensor*>(&dst), &src}) {
    PRIMUS_CHECK(t->device().is_cpu() || t->device() == device(), "[op copy] {} lives on neither the host nor {}",
                 t->describe(), device().str());
  }
  if (dst.nbytes() == 0) return;
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    dst.copy_from(src);
  } else if (dst.device().is_cpu()) {
    PRIMUS_CUDA_CHECK(gpuMemcpyAsync(dst.data(), src.data(), dst.nbytes(), gpuMemcpyDeviceToHost, state_->stream));
    wait_compute();
  } else {
    // A pageable host source is staged by the driver before the call returns, so src may be freed after it.
    const auto kind = src.device().is_cpu() ? gpuMemcpyHostToDevice : gpuMemcpyDeviceToDevice;
    PRIMUS_CUDA_CHECK(gpuMemcpyAsync(dst.data(), src.data(), dst.nbytes(), kind, state_->stream));
  }
}

void CudaBackend::cast(Tensor& dst, const Tensor& src) {
  PRIMUS_CHECK(dst.numel() == src.numel() && dst.device() == device() && src.device() == device(),
               "[op cast] {} <- {}: both must live on {} with one element count", dst.describe(), src.describe(),
               device().str());
  if (dst.dtype() == src.dtype()) {
    copy(dst, src);
  } else if (dst.dtype() == DType::kBF16 && src.dtype() == DType::kF32) {
    cuda::cast(state_->ctx, ptr<float>(src), ptr<cuda::bf16>(dst), src.numel());
  } else if (dst.dtype() == DType::kF32 && src.dtype() == DType::kBF16) {
    cuda::cast(state_->ctx, ptr<cuda::bf16>(src), ptr<float>(dst), src.numel());
  } else {
    throw RuntimeError(fmt::format("[op cast] {} <- {}: only f32 <-> bf16", dst.describe(), src.describe()));
  }
}

void CudaBackend::fill(Tensor& x, float value) {
  dispatch(x.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    cuda::fill<T>(state_->ctx, ptr<T>(x), value, x.numel());
  });
}

void CudaBackend::fill_normal(Tensor& x, uint64_t seed, double std, StreamIndex index) {
  cuda::fill_normal(state_->ctx, ptr<float>(x), seed, std, x.numel(), index);
}

void CudaBackend::zero(Tensor& x) {
  if (x.nbytes() == 0) return;
  PRIMUS_CUDA_CHECK(gpuMemsetAsync(x.data(), 0, x.nbytes(), state_->stream));
}

void CudaBackend::gemm(const GemmArgs& args) {
  const Tensor& a = *args.a;  // [M, K] or [K, M] if trans_a
  const Tensor& b = *args.b;  // [K, N] or [N, K] if trans_b
  Tensor& c = *args.c;        // [M, N]
  RowMajorGemm g;
  g.m = c.dim(0);
  g.n = c.dim(1);
  g.k = args.trans_a ? a.dim(0) : a.dim(1);
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    // The product is empty: C = beta·C (beta 0 never reads C), as on the CPU.
    if (args.beta == 0.0f) {
      zero(c);
    } else {
      scale_inplace(c, args.beta);
    }
    return;
  }
  g.a = a.data();
  g.b = b.data();
  g.c = c.data();
  g.lda = a.dim(1);
  g.ldb = b.dim(1);
  g.trans_a = args.trans_a;
  g.trans_b = args.trans_b;
  g.alpha = args.alpha;
  g.beta = args.beta;
  g.ab_dtype = a.dtype();
  g.c_dtype = c.dtype();
  state_->gemm->run(g, state_->stream);
}

void CudaBackend::embedding_forward(const EmbeddingArgs& args) {
  PRIMUS_CHECK(args.ids->numel() <= std::numeric_limits<int32_t>::max(), "[op embedding_forward] {} tokens exceed {}",
               args.ids->numel(), std::numeric_limits<int32_t>::max());
  const VocabShard shard = resolve_shard(args.shard, args.table->dim(0));
  dispatch(args.table->dtype(), "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    cuda::embedding_forward<T>(state_->ctx, ptr<int32_t>(*args.ids), ptr<T>(*args.table), ptr<T>(*args.out),
                               args.ids->numel(), args.table->dim(0), args.table->dim(1), shard.begin, shard.total);
  });
}

void CudaBackend::embedding_backward(const EmbeddingArgs& args) {
  // The deterministic scatter sorts 32-bit (id, token) pairs; ids sort with the sentinel V.
  PRIMUS_CHECK(args.ids->numel() <= std::numeric_limits<int32_t>::max() &&
                   args.dtable->dim(0) < std::numeric_limits<int32_t>::max(),
               "[op embedding_backward] {} tokens or vocabulary {} exceed the 32-bit sort keys", args.ids->numel(),
               args.dtable->dim(0));
  const VocabShard shard = resolve_shard(args.shard, args.dtable->dim(0));
  dispatch(args.dout->dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    cuda::embedding_backward<T>(state_->ctx, ptr<int32_t>(*args.ids), ptr<T>(*args.dout), ptr<float>(*args.dtable),
                                args.ids->numel(), args.dtable->dim(0), args.dtable->dim(1), shard.begin, shard.total);
  });
}

void CudaBackend::rmsnorm_forward(const RmsNormArgs& args) {
  const int64_t channels = args.x->dim(-1);
  const int64_t rows = channels == 0 ? 0 : args.x->numel() / channels;
  dispatch(args.x->dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    cuda::rmsnorm_forward<T>(state_->ctx, ptr<T>(*args.x), ptr<T>(*args.weight), ptr<T>(*args.y),
                             ptr<float>(*args.rstd), rows, channels, args.eps);
  });
}

void CudaBackend::rmsnorm_backward(const RmsNormArgs& args) {
  const int64_t channels = args.x->dim(-1);
  const int64_t rows = channels == 0 ? 0 : args.x->numel() / channels;
  dispatch(args.x->dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    cuda::rmsnorm_backward<T>(state_->ctx, ptr<T>(*args.x), ptr<T>(*args.weight), ptr<float>(*args.rstd),
                              ptr<T>(*args.dy), ptr_or_null<T>(args.dx), ptr_or_null<float>(args.dweight), rows,
                              channels);
  });
}

namespace {

// Launches the rope kernel for args; sign +1 forward, −1 backward.
void launch_rope(const cuda::KernelContext& ctx, const RopeArgs& args, float sign, const char* op) {
  const Tensor& x = *args.x;  // [B, T, H, D]
  const cuda::RopeShape shape{x.dim(0), x.dim(1), x.dim(2), x.dim(3), args.cos->dim(0), args.interleaved};
  dispatch(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    cuda::rope<T>(ctx, shape, ptr<T>(x), ptr<float>(*args.cos), ptr<float>(*args.sin),
                  ptr_or_null<int32_t>(args.positions), sign);
  });
}

}  // namespace

void CudaBackend::rope_forward(const RopeArgs& args) { launch_rope(state_->ctx, args, 1.0f, "rope_forward"); }

void CudaBackend::rope_backward(const RopeArgs& args) { launch_rope(state_->ctx, args, -1.0f, "rope_backward"); }

namespace {

cuda::AttentionShape attention_shape(const AttentionArgs& args, int64_t max_shared_bytes, const char* op) {
  const cuda::AttentionShape s{args.q->dim(0), args.q->dim(1), args.q->dim(2),
                               args.k->dim(2), args.q->dim(3), args.v->dim(3)};
  PRIMUS_CHECK(s.head_dim <= cuda::kAttentionMaxHeadDim && s.v_dim <= cuda::kAttentionMaxHeadDim,
               "[op {}] head size {} (values {}) exceeds the kernels' {}", op, s.head_dim, s.v_dim,
               cuda::kAttentionMaxHeadDim);
  PRIMUS_CHECK(s.batch <= cuda::kAttentionMaxGridDim && s.q_heads <= cuda::kAttentionMaxGridDim,
               "[op {}] batch {} or {} heads exceed the launch grid ({})", op, s.batch, s.q_heads,
               cuda::kAttentionMaxGridDim);
  const int64_t shared = cuda::attention_shared_bytes(s) + cuda::kAttentionStaticSharedBytes;
  PRIMUS_CHECK(shared <= max_shared_bytes,
               "[op {}] sequence length {} needs {} bytes of shared memory per block, more than the device's {}", op,
               s.seq, shared, max_shared_bytes);
  return s;
}

}  // namespace

namespace {

bool aligned_16(const Tensor* t) { return reinterpret_cast<uintptr_t>(t->data()) % 16 == 0; }

// Whether cuDNN's fused attention takes this call: bf16, head sizes (D and the values' Dv, which may differ: multi-head
// latent attention) multiples of 8 up to 256, every tensor 16-byte aligned, for backward more than one position
// (cuDNN has no one-token backward), and no segments: packed documents (segment_start) run on the native kernels:
// exact, but simple O(T²) ones, much slower.
bool cudnn_takes(const AttentionArgs& args, bool backward) {
  const Tensor& q = *args.q;  // [B, T, Hq, D]
  if (q.dtype() != DType::kBF16 || q.numel() == 0 || args.segment_start != nullptr) return false;
  const int64_t v_dim = args.v->dim(3);
  if (q.dim(3) % 8 != 0 || q.dim(3) > 256 || v_dim % 8 != 0 || v_dim > 256 || (backward && q.dim(1) < 2)) return false;
  for (const Tensor* t : {args.q, args.k, args.v, static_cast<const Tensor*>(args.out)}) {
    if (!aligned_16(t)) return false;
  }
  if (backward) {
    for (const Tensor* t : {args.dout, static_cast<const Tensor*>(args.dq), static_cast<const Tensor*>(args.dk),
                            static_cast<const Tensor*>(args.dv)}) {
      if (!aligned_16(t)) return false;
    }
  }
  return aligned_16(args.lse);
}

AttentionShape cudnn_shape(const AttentionArgs& args) {
  return AttentionShape{args.q->dim(0), args.q->dim(1), args.q->dim(2), args.k->dim(2), args.q->dim(3), args.v->dim(3)};
}

// The softmax scale of the CPU reference (backend/cpu/attention.cpp), rounded the same way.
float attention_scale(const AttentionArgs& args) { return 1.0f / std::sqrt(static_cast<float>(args.q->dim(3))); }

}  // namespace

CudnnAttention& CudaBackend::cudnn_attention() {
  if (!state_->attention) {
    state_->attention = std::make_unique<CudnnAttention>(state_->stream, &state_->allocator, state_->deterministic);
  }
  return *state_->attention;
}

void CudaBackend::attention_forward(const AttentionArgs& args) {
  if (cudnn_takes(args, false)) {
    cudnn_attention().forward(cudnn_shape(args), args.q->data(), args.k->data(), args.v->data(), args.out->data(),
                              ptr<float>(*args.lse), attention_scale(args), args.mask == AttentionMask::kCausal);
    return;
  }
  dispatch(args.q->dtype(), "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    const cuda::AttentionShape shape = attention_shape(args, state_->ctx.max_shared_bytes, "attention_forward");
    cuda::attention_forward<T>(state_->ctx, shape, ptr<T>(*args.q), ptr<T>(*args.k), ptr<T>(*args.v), ptr<T>(*args.out),
                               ptr<float>(*args.lse), ptr_or_null<int32_t>(args.segment_start),
                               args.mask == AttentionMask::kCausal);
  });
}

void CudaBackend::attention_backward(const AttentionArgs& args) {
  if (cudnn_takes(args, true)) {
    cudnn_attention().backward(cudnn_shape(args), args.q->data(), args.k->data(), args.v->data(), args.out->data(),
                               args.dout->data(), ptr<float>(*args.lse), args.dq->data(), args.dk->data(),
                               args.dv->data(), attention_scale(args), args.mask == AttentionMask::kCausal);
    return;
  }
  dispatch(args.q->dtype(), "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    const cuda::AttentionShape shape = attention_shape(args, state_->ctx.max_shared_bytes, "attention_backward");
    cuda::attention_backward<T>(state_->ctx, shape, ptr<T>(*args.q), ptr<T>(*args.k), ptr<T>(*args.v),
                                ptr<T>(*args.out), ptr<float>(*args.lse), ptr<T>(*args.dout), ptr<T>(*args.dq),
                                ptr<T>(*args.dk), ptr<T>(*args.dv), ptr_or_null<int32_t>(args.segment_start),
                                args.mask == AttentionMask::kCausal);
  });
}

void CudaBackend::attention_merge(const AttentionMergeArgs& args) {
  const Tensor& out = *args.out;  // [B, T, Hq, D]
  dispatch(out.dtype(), "attention_merge", [&](auto tag) {
    using T = decltype(tag);
    const cuda::AttentionShape shape{out.dim(0), out.dim(1), out.dim(2), out.dim(2), out.dim(3)};
    cuda::attention_merge<T>(state_->ctx, shape, ptr<T>(*args.out), ptr<float>(*args.lse), ptr<T>(*args.block_out),
                             ptr<float>(*args.block_lse));
  });
}

void CudaBackend::head_concat(const HeadConcatArgs& args) {
  const Tensor &a = *args.a, &b = *args.b;  // [N, H, Da], [N, Hb, Db]
  const cuda::HeadConcatShape shape{a.dim(0), a.dim(1), a.dim(2), b.dim(1), b.dim(2)};
  dispatch(a.dtype(), "head_concat", [&](auto tag) {
    using T = decltype(tag);
    cuda::head_concat<T>(state_->ctx, shape, ptr<T>(a), ptr<T>(b), ptr<T>(*args.out));
  });
}

void CudaBackend::head_concat_backward(const HeadConcatArgs& args) {
  const Tensor &da = *args.da, &db = *args.db;  // [N, H, Da], [N, Hb, Db]
  const cuda::HeadConcatShape shape{da.dim(0), da.dim(1), da.dim(2), db.dim(1), db.dim(2)};
  dispatch(da.dtype(), "head_concat_backward", [&](auto tag) {
    using T = decltype(tag);
    cuda::head_concat_backward<T>(state_->ctx, shape, ptr<T>(*args.dout), ptr<T>(da), ptr<T>(db));
  });
}

void CudaBackend::swiglu_forward(const SwiGluArgs& args) {
  dispatch(args.gate_up->dtype(), "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t f = args.out->dim(-1);
    cuda::swiglu_forward<T>(state_->ctx, ptr<T>(*args.gate_up), ptr<T>(*args.out), args.out->numel() / f, f);
  });
}

void CudaBackend::swiglu_backward(const SwiGluArgs& args) {
  dispatch(args.gate_up->dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t f = args.dout->dim(-1);
    cuda::swiglu_backward<T>(state_->ctx, ptr<T>(*args.gate_up), ptr<T>(*args.dout), ptr<T>(*args.dgate_up),
                             args.dout->numel() / f, f);
  });
}

namespace {

// The grouped GEMM's sizes, checked against the kernels' grid limit.
cuda::GroupedGemmShape grouped_gemm_shape(const GroupedLinearArgs& args, const char* op) {
  const cuda::GroupedGemmShape s{args.x->dim(0), args.w->dim(0), args.w->dim(2), args.w->dim(1)};
  PRIMUS_CHECK(cuda::grouped_gemm_blocks_fit(s), "[op {}] {} rows, {} experts of [{}, {}] exceed the kernels' grid",
               op, s.rows, s.experts, s.out, s.in);
  return s;
}

}  // namespace

// The offsets stay on the device: the kernels read them, the host never waits for them.
void CudaBackend::grouped_linear_forward(const GroupedLinearArgs& args) {
  const cuda::GroupedGemmShape s = grouped_gemm_shape(args, "grouped_linear_forward");
  dispatch(args.x->dtype(), "grouped_linear_forward", [&](auto tag) {
    using T = decltype(tag);
    cuda::grouped_linear_forward<T>(state_->ctx, s, ptr<T>(*args.x), ptr<T>(*args.w), ptr<int32_t>(*args.offsets),
                                    ptr<T>(*args.y));
  });
}

void CudaBackend::grouped_linear_backward(const GroupedLinearArgs& args) {
  const cuda::GroupedGemmShape s = grouped_gemm_shape(args, "grouped_linear_backward");
  dispatch(args.x->dtype(), "grouped_linear_backward", [&](auto tag) {
    using T = decltype(tag);
    if (args.dx != nullptr) {
      cuda::grouped_linear_backward_data<T>(state_->ctx, s, ptr<T>(*args.dy), ptr<T>(*args.w),
                                            ptr<int32_t>(*args.offsets), ptr<T>(*args.dx));
    }
    if (args.dw != nullptr) {
      cuda::grouped_linear_backward_weight<T>(state_->ctx, s, ptr<T>(*args.dy), ptr<T>(*args.x),
                                              ptr<int32_t>(*args.offsets), ptr<float>(*args.dw));
    }
  });
}

void CudaBackend::cross_entropy_forward(const CrossEntropyArgs& args) {
  dispatch(args.logits->dtype(), "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    cuda::cross_entropy_forward<T>(state_->ctx, ptr<T>(*args.logits), ptr<int32_t>(*args.targets),
                                   ptr<float>(*args.losses), ptr<float>(*args.lse), args.targets->numel(),
                                   args.logits->dim(-1));
  });
}

void CudaBackend::cross_entropy_forward_backward(const CrossEntropyArgs& args) {
  dispatch(args.logits->dtype(), "cross_entropy_forward_backward", [&](auto tag) {
    using T = decltype(tag);
    cuda::cross_entropy_forward<T>(state_->ctx, ptr<T>(*args.logits), ptr<int32_t>(*args.targets),
                                   ptr<float>(*args.losses), ptr<float>(*args.lse), args.targets->numel(),
                                   args.logits->dim(-1), args.grad_scale, ptr<T>(*args.dlogits));
  });
}

void CudaBackend::cross_entropy_backward(const CrossEntropyArgs& args) {
  const VocabShard shard = resolve_shard(args.shard, args.logits->dim(-1));
  dispatch(args.logits->dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    cuda::cross_entropy_backward<T>(state_->ctx, ptr<T>(*args.logits), ptr<int32_t>(*args.targets),
                                    ptr<float>(*args.lse), args.grad_scale, ptr<T>(*args.dlogits),
                                    args.targets->numel(), args.logits->dim(-1), shard.begin, shard.total);
  });
}

void CudaBackend::cross_entropy_shard_stats(const CrossEntropyArgs& args) {
  const VocabShard shard = resolve_shard(args.shard, args.logits->dim(-1));
  dispatch(args.logits->dtype(), "cross_entropy_shard_stats", [&](auto tag) {
    using T = decltype(tag);
    cuda::cross_entropy_shard_stats<T>(state_->ctx, ptr<T>(*args.logits), ptr<int32_t>(*args.targets),
                                       ptr<float>(*args.max), ptr<float>(*args.sum_exp), ptr<float>(*args.target_logit),
                                       args.targets->numel(), args.logits->dim(-1), shard.begin, shard.total);
  });
}

void CudaBackend::cross_entropy_finish(const CrossEntropyArgs& args) {
  cuda::cross_entropy_finish(state_->ctx, ptr<float>(*args.max), ptr<float>(*args.sum_exp),
                             ptr<float>(*args.target_logit), ptr<int32_t>(*args.targets), ptr<float>(*args.losses),
                             ptr<float>(*args.lse), args.targets->numel());
}

void CudaBackend::row_max(const Tensor& x, Tensor& max) {
  dispatch(x.dtype(), "row_max", [&](auto tag) {
    using T = decltype(tag);
    cuda::row_max<T>(state_->ctx, ptr<T>(x), ptr<float>(max), max.numel(), x.dim(-1));
  });
}

namespace {

// Index tensors of the MoE kernels hold 32-bit entries; the router's limits are the kernels' (kernels.h).
void check_moe_entries(const char* op, int64_t entries) {
  PRIMUS_CHECK(entries <= std::numeric_limits<int32_t>::max(), "[op {}] {} routing entries exceed the 32-bit slots",
               op, entries);
}

cuda::MoeRouterShape router_shape(const MoeRouterArgs& args, const Tensor& scores, const char* op) {
  const MoeRouting& r = args.routing;
  const int64_t experts = scores.dim(1);
  PRIMUS_CHECK(experts <= cuda::kMoeRouterMaxExperts, "[op {}] {} experts exceed the CUDA router's {}", op, experts,
               cuda::kMoeRouterMaxExperts);
  PRIMUS_CHECK(r.num_groups <= cuda::kMoeRouterMaxGroups, "[op {}] {} expert groups exceed the CUDA router's {}", op,
               r.num_groups, cuda::kMoeRouterMaxGroups);
  check_moe_entries(op, scores.dim(0) * r.topk);
  return cuda::MoeRouterShape{scores.dim(0),
                              experts,
                              r.topk,
                              r.score_function == MoeScoreFunction::kSigmoid,
                              r.normalize,
                              r.scaling_factor,
                              r.num_groups,
                              r.group_topk};
}

void check_moe_topk(const char* op, int64_t topk) {
  PRIMUS_CHECK(topk <= cuda::kMoeMaxTopk, "[op {}] top-k {} exceeds the CUDA kernels' {}", op, topk,
               cuda::kMoeMaxTopk);
}

}  // namespace

void CudaBackend::moe_router_forward(const MoeRouterArgs& args) {
  const cuda::MoeRouterShape shape = router_shape(args, *args.scores, "moe_router_forward");
  cuda::moe_router_forward(state_->ctx, shape, ptr<float>(*args.logits), ptr_or_null<float>(args.expert_bias),
                           ptr<float>(*args.scores), ptr<int32_t>(*args.topk_experts), ptr<float>(*args.topk_weights));
}

void CudaBackend::moe_router_backward(const MoeRouterArgs& args) {
  const cuda::MoeRouterShape shape = router_shape(args, *args.scores, "moe_router_backward");
  cuda::moe_router_backward(state_->ctx, shape, ptr<float>(*args.scores), ptr<int32_t>(*args.topk_experts),
                            ptr<float>(*args.dweights), ptr_or_null<float>(args.dscores), ptr<float>(*args.dlogits));
}

void CudaBackend::moe_sort(const MoeSortArgs& args) {
  check_moe_entries("moe_sort", args.topk_experts->numel());
  cuda::moe_sort(state_->ctx, ptr<int32_t>(*args.topk_experts), args.topk_experts->numel(), args.offsets->numel() - 1,
                 ptr<int32_t>(*args.slots), ptr<int32_t>(*args.offsets));
}

void CudaBackend::moe_capacity(const MoeCapacityArgs& args) {
  check_moe_entries("moe_capacity", args.topk_experts->numel());
  cuda::moe_capacity(state_->ctx, ptr<int32_t>(*args.topk_experts), ptr<float>(*args.topk_weights),
                     args.topk_experts->numel(), args.experts, args.capacity, args.by_position,
                     ptr<int32_t>(*args.kept_experts));
}

void CudaBackend::moe_pad_rows(const MoePadArgs& args) {
  dispatch(args.in->dtype(), "moe_pad_rows", [&](auto tag) {
    using T = decltype(tag);
    cuda::moe_pad_rows<T>(state_->ctx, ptr<T>(*args.in), ptr<int32_t>(*args.offsets), ptr<T>(*args.out),
                          args.offsets->numel() - 1, args.per_expert, args.in->dim(1));
  });
}

void CudaBackend::moe_unpad_rows(const MoePadArgs& args) {
  dispatch(args.in->dtype(), "moe_unpad_rows", [&](auto tag) {
    using T = decltype(tag);
    cuda::moe_unpad_rows<T>(state_->ctx, ptr<T>(*args.in), ptr<int32_t>(*args.offsets), ptr<T>(*args.out),
                            args.out->dim(0), args.offsets->numel() - 1, args.per_expert, args.in->dim(1));
  });
}

void CudaBackend::moe_permute(const MoePermuteArgs& args) {
  check_moe_entries("moe_permute", args.slots->numel());
  dispatch(args.x->dtype(), "moe_permute", [&](auto tag) {
    using T = decltype(tag);
    cuda::moe_permute<T>(state_->ctx, ptr<T>(*args.x), ptr<int32_t>(*args.slots), ptr<T>(*args.out),
                         args.slots->numel(), args.topk, args.x->dim(1));
  });
}

void CudaBackend::moe_permute_backward(const MoePermuteArgs& args) {
  check_moe_entries("moe_permute_backward", args.slots->numel());
  check_moe_topk("moe_permute_backward", args.topk);
  dispatch(args.dx->dtype(), "moe_permute_backward", [&](auto tag) {
    using T = decltype(tag);
    cuda::moe_permute_backward<T>(state_->ctx, ptr<T>(*args.dout), ptr<int32_t>(*args.slots), ptr<T>(*args.dx),
                                  args.dx->dim(0), args.topk, args.dx->dim(1));
  });
}

void CudaBackend::moe_unpermute(const MoePermuteArgs& args) {
  check_moe_entries("moe_unpermute", args.slots->numel());
  check_moe_topk("moe_unpermute", args.topk);
  dispatch(args.y->dtype(), "moe_unpermute", [&](auto tag) {
    using T = decltype(tag);
    cuda::moe_unpermute<T>(state_->ctx, ptr<T>(*args.y), ptr<int32_t>(*args.slots), ptr<float>(*args.weights),
                           ptr<T>(*args.out), args.out->dim(0), args.topk, args.out->dim(1));
  });
}

void CudaBackend::moe_unpermute_backward(const MoePermuteArgs& args) {
  check_moe_entries("moe_unpermute_backward", args.slots->numel());
  dispatch(args.y->dtype(), "moe_unpermute_backward", [&](auto tag) {
    using T = decltype(tag);
    cuda::moe_unpermute_backward<T>(state_->ctx, ptr<T>(*args.y), ptr<int32_t>(*args.slots),
                                    ptr<float>(*args.weights), ptr<T>(*args.dout), ptr<T>(*args.dy),
                                    ptr<float>(*args.dweights), args.weights->dim(0), args.topk, args.y->dim(1));
  });
}

void CudaBackend::moe_aux_loss(const MoeAuxLossArgs& args) {
  cuda::moe_aux_loss(state_->ctx, ptr<float>(*args.scores), ptr<int32_t>(*args.offsets), args.scores->dim(0),
                     args.scores->dim(1), args.topk, args.coeff, args.sigmoid_scores, args.grad_scale,
                     ptr<float>(*args.loss), ptr_or_null<float>(args.dscores));
}

void CudaBackend::moe_z_loss(const MoeAuxLossArgs& args) {
  cuda::moe_z_loss(state_->ctx, ptr<float>(*args.logits), args.logits->dim(0), args.logits->dim(1), args.coeff,
                   args.grad_scale, ptr<float>(*args.loss), ptr_or_null<float>(args.dlogits));
}

void CudaBackend::adamw_step(const AdamWArgs& args) {
  // Step scalars in double, rounded once: the CPU backend's recipe (src/backend/cpu/adamw.cpp).
  const double lr = args.lr;
  const double step = static_cast<double>(args.step);
  cuda::AdamWScalars s{};
  s.beta1 = args.beta1;
  s.beta2 = args.beta2;
  s.one_minus_beta1 = static_cast<float>(1.0 - args.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - args.beta2);
  s.decay = static_cast<float>(1.0 - lr * args.weight_decay);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(args.beta1), step)));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(args.beta2), step)));
  s.eps = args.eps;
  s.grad_scale = args.grad_scale;
  cuda::adamw_step(state_->ctx, ptr<float>(*args.param), ptr<float>(*args.grad), ptr<float>(*args.exp_avg),
                   ptr<float>(*args.exp_avg_sq), ptr_or_null<cuda::bf16>(args.compute_copy), args.param->numel(), s);
}

namespace {

// The tiles of a matrix [rows, cols] under `tiling`, a 0 extent resolved to the whole dimension.
cuda::Fp8Tiles fp8_tiles(Fp8Tiling tiling, int64_t rows, int64_t cols) {
  return {rows, cols, tiling.rows == 0 ? rows : tiling.rows, tiling.cols == 0 ? cols : tiling.cols};
}

}  // namespace

void CudaBackend::fp8_amax(const Fp8AmaxArgs& args) {
  const int64_t rows = args.x->dim(0), cols = args.x->dim(1);
  const cuda::Fp8Tiles tiles = args.transposed ? fp8_tiles(args.tiling, cols, rows) : fp8_tiles(args.tiling, rows, cols);
  dispatch(args.x->dtype(), "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    cuda::fp8_amax<T>(state_->ctx, ptr<T>(*args.x), tiles, args.transposed, args.accumulate, ptr<float>(*args.amax),
                      args.amax->numel());
  });
}

void CudaBackend::fp8_scale(const Fp8ScaleArgs& args) {
  const Fp8ScaleOptions& o = args.options;
  cuda::fp8_scale(state_->ctx, ptr<float>(*args.amax), args.amax->numel(), args.format, o.margin, o.power_of_two,
                  o.keep_previous, ptr<float>(*args.scale), ptr<float>(*args.scale_inv),
                  ptr<int32_t>(*args.non_finite));
}

void CudaBackend::fp8_quantize(const Fp8QuantizeArgs& args) {
  const int64_t rows = args.x->dim(0), cols = args.x->dim(1);
  dispatch(args.x->dtype(), "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    if (args.codes_t == nullptr) {
      cuda::fp8_quantize<T>(state_->ctx, ptr<T>(*args.x), fp8_tiles(args.tiling, rows, cols), false, args.format,
                            ptr<float>(*args.scale), ptr<uint8_t>(*args.codes));
      return;
    }
    cuda::fp8_quantize_pair<T>(state_->ctx, ptr<T>(*args.x), fp8_tiles(args.tiling, rows, cols),
                               fp8_tiles(args.tiling, cols, rows), args.format, ptr<float>(*args.scale),
                               ptr<float>(*args.scale_t), ptr<uint8_t>(*args.codes), ptr<uint8_t>(*args.codes_t));
  });
}

void CudaBackend::fp8_dequantize(const Fp8DequantizeArgs& args) {
  cuda::fp8_dequantize(state_->ctx, ptr<uint8_t>(*args.codes),
                       fp8_tiles(args.tiling, args.codes->dim(0), args.codes->dim(1)), args.format,
                       ptr<float>(*args.scale_inv), ptr<float>(*args.y));
}

namespace {

Fp8ScaleLayout fp8_scale_layout_of(Fp8Tiling tiling) {
  if (tiling.whole_tensor()) return Fp8ScaleLayout::kTensor;
  return tiling.rows == 1 ? Fp8ScaleLayout::kVec128 : Fp8ScaleLayout::kBlock128x128;
}

void check_fp8_gemm_operand(const char* name, const Tensor& codes, Fp8Format format) {
  const bool fnuz = format == Fp8Format::kE4M3Fnuz || format == Fp8Format::kE5M2Fnuz;
  PRIMUS_CHECK(fnuz == kGpuFp8IsFnuz, "[op fp8_gemm] {} is {}: this GPU's fp8 GEMM takes {}", name,
               fp8_format_name(format), kGpuFp8IsFnuz ? "e4m3fnuz / e5m2fnuz" : "e4m3 / e5m2 (OCP)");
  PRIMUS_CHECK(cublaslt::alignment_of(codes.data()) >= 16,
               "[op fp8_gemm] {}'s data is not 16-byte aligned, which cuBLASLt's fp8 GEMM needs", name);
}

}  // namespace

// The fp8 GEMM through cuBLASLt. Tensorwise factors are passed as they are (one f32 on the device) where aligned.
// Block factors are rewritten into cuBLASLt's layout (Fp8ScaleLayout) in a scratch buffer by one small kernel: the
// 1x128 grid [R, K/128] transposed (skipped when K ≤ 128, where the two layouts coincide), the 128x128 grid padded to
// a multiple of 4 columns (skipped when it is one); any factors are copied anyway when not 16-byte aligned. The
// scratch holds R·K/128 floats, 1/128 of the codes it scales, freed back to the stream-ordered allocator when this
// returns. fp8_scale keeps writing plain row-major grids, which the CPU reference and the dequantise op share.
void CudaBackend::fp8_gemm(const Fp8GemmArgs& args) {
  const int64_t m = args.a->dim(0), k = args.a->dim(1), n = args.b->dim(0);
  for (const auto& [dim, value] : {std::pair<const char*, int64_t>{"M (a's rows)", m}, {"N (b's rows)", n},
                                   {"K (a's and b's columns)", k}}) {
    PRIMUS_CHECK(value % 16 == 0,
                 "[op fp8_gemm] {} = {} is not a multiple of 16: cuBLASLt's fp8 GEMM needs M, N and K multiples of 16",
                 dim, value);
  }
  check_fp8_gemm_operand("a", *args.a, args.a_format);
  check_fp8_gemm_operand("b", *args.b, args.b_format);
  PRIMUS_CHECK(cublaslt::alignment_of(args.c->data()) >= 16,
               "[op fp8_gemm] c's data is not 16-byte aligned, which cuBLASLt's fp8 GEMM needs");
  Tensor scratch[2];
  auto scales_for = [&](int which, const Tensor& scale_inv, Fp8ScaleLayout layout) -> const float* {
    const int64_t rows = scale_inv.dim(0), cols = scale_inv.dim(1);
    const bool transpose = layout == Fp8ScaleLayout::kVec128 && cols > 1 && rows > 1;
    const int64_t padded_cols = layout == Fp8ScaleLayout::kBlock128x128 ? (cols + 3) / 4 * 4 : cols;
    // cuBLASLt takes factors only at 16-byte aligned addresses (block grids are read in 16-byte pieces; a tensorwise
    // factor elsewhere failed with CUBLAS_STATUS_NOT_SUPPORTED): one at another offset (a view, as the delayed
    // recipe's per-tensor factors in their group's row are) is copied too.
    const bool aligned = cublaslt::alignment_of(scale_inv.data()) >= 16;
    if (!transpose && padded_cols == cols && aligned) return ptr<float>(scale_inv);
    scratch[which] = Tensor::empty({transpose ? rows * cols : rows * padded_cols}, DType::kF32, device());
    cuda::fp8_scale_layout(state_->ctx, ptr<float>(scale_inv), rows, cols, transpose, padded_cols,
                           ptr<float>(scratch[which]));
    return ptr<float>(scratch[which]);
  };
  RowMajorFp8Gemm g;
  g.a = args.a->data();
  g.b = args.b->data();
  g.c = args.c->data();
  g.m = m;
  g.n = n;
  g.k = k;
  g.a_e5m2 = args.a_format == Fp8Format::kE5M2 || args.a_format == Fp8Format::kE5M2Fnuz;
  g.b_e5m2 = args.b_format == Fp8Format::kE5M2 || args.b_format == Fp8Format::kE5M2Fnuz;
  g.a_layout = fp8_scale_layout_of(args.a_tiling);
  g.b_layout = fp8_scale_layout_of(args.b_tiling);
  g.a_scale = scales_for(0, *args.a_scale_inv, g.a_layout);
  g.b_scale = scales_for(1, *args.b_scale_inv, g.b_layout);
  g.c_dtype = args.c->dtype();
  g.accumulate = args.accumulate;
  g.fast_accumulation = args.fast_accumulation;
  state_->gemm->run_fp8(g, state_->stream);
}

void CudaBackend::add_inplace(Tensor& y, const Tensor& x) {
  dispatch(y.dtype(), "add_inplace", [&](auto tag) {
    using T = decltype(tag);
    cuda::add_inplace<T>(state_->ctx, ptr<T>(y), ptr<T>(x), y.numel());
  });
}

void CudaBackend::scale_inplace(Tensor& x, float s) {
  dispatch(x.dtype(), "scale_inplace", [&](auto tag) {
    using T = decltype(tag);
    cuda::scale_inplace<T>(state_->ctx, ptr<T>(x), s, x.numel());
  });
}

double CudaBackend::sum_squares(const Tensor& x) {
  dispatch(x.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    cuda::sum_squares<T>(state_->ctx, ptr<T>(x), x.numel(), state_->result);
  });
  double total = 0.0;
  PRIMUS_CUDA_CHECK(gpuMemcpyAsync(&total, state_->result, sizeof(double), gpuMemcpyDeviceToHost, state_->stream));
  wait_compute();
  return total;
}

void CudaBackend::sum_into(Tensor& acc, const Tensor& x) {
  cuda::sum_into(state_->ctx, ptr<float>(x), x.numel(), ptr<float>(acc));
}

int cuda_device_count(std::string* why) {
  int count = 0;
  const gpuError_t status = gpuGetDeviceCount(&count);
  if (status != gpuSuccess) {
    (void)gpuGetLastError();
    if (why != nullptr) *why = fmt::format("cudaGetDeviceCount failed: {}", gpuGetErrorString(status));
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "the CUDA driver reports no devices";
  return count;
}

CudaBackend& start_cuda_backend(int device_index) {
  // The fast path is one atomic load: src/ops calls this before every op on a CUDA tensor.
  static std::atomic<CudaBackend*> running{nullptr};
  static std::mutex mutex;
  CudaBackend* backend = running.load(std::memory_order_acquire);
  if (backend == nullptr) {
    std::lock_guard<std::mutex> lock(mutex);
    backend = running.load(std::memory_order_relaxed);
    if (backend == nullptr) {
      std::string why;
      const int count = cuda_device_count(&why);
      if (device_index < 0 || device_index >= count) {
        throw RuntimeError(fmt::format("[cuda] cannot start on device {}: {}", device_index,
                                       count == 0 ? why : fmt::format("only {} devices are visible", count)));
      }
      // Never deleted: tensors with static lifetime may hand memory back after main returns.
      backend = new CudaBackend(device_index);
      register_allocator(DeviceType::kCuda, &backend->allocator());
      register_backend(DeviceType::kCuda, backend);
      running.store(backend, std::memory_order_release);
    }
  }
  PRIMUS_CHECK(backend->device().index == device_index, "[cuda] backend runs on {} but device {} was asked for",
               backend->device().str(), device_index);
  return *backend;
}

}  // namespace primus
