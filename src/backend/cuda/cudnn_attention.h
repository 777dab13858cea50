// bf16 grouped-query flash attention, causal or unmasked (a block of ring attention), forward and backward, through
// cuDNN's fused attention.
//
// cuDNN 9.14 (the GPU machine) has no causal mask in its single SDPA operation, so each direction is built as
// a multi-operation graph through the backend C API (no cudnn-frontend here); cuDNN's runtime-fusion engine
// recognises the pattern and compiles one flash kernel for it. docs/perf/attention.md has the graph, the
// measured speed and the version pitfalls this works around. The numerics match the CPU reference
// (backend/cpu/attention.cpp) up to bf16 rounding: fp32 scores and softmax inside, P and dS rounded to bf16
// before their matmuls, dQ accumulated in fp32.
//
// Layouts (all contiguous, every pointer 16-byte aligned):
//   q, dq  [B, T, Hq, D]  bf16      k, dk  [B, T, Hkv, D]  bf16
//   out, dout  [B, T, Hq, Dv]  bf16      v, dv  [B, T, Hkv, Dv]  bf16   (Dv = D, or another: multi-head latent
//                                    attention's 192 and 128, which cuDNN's graphs take as separate d_qk and d_v)
//   lse               [B, Hq, T]     fp32 natural-log log-sum-exp of the scaled scores (forward writes it,
//                                    backward reads it) — the CPU backend's layout.
// Query head h reads kv head h / (Hq / Hkv). D and Dv must be multiples of 8 and at most 256; Hq a multiple of Hkv.
//
// One instance per stream, not thread-safe. Execution plans are built on the first call for each shape
// (0.05–1 s; the first in a process also loads cuDNN, ~5 s) and cached; build every shape once before
// capturing a CUDA graph (by-value scalars such as the softmax scale are frozen into a captured graph).
// Scratch memory (cuDNN's workspace, backward's fp32 softmax_sum and dQ accumulator) is one grow-only buffer
// reused across calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/gpu_runtime.h"
#include "core/allocator.h"

namespace primus {

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t v_dim = 0;  // the value head size Dv; 0: head_dim
  int64_t value_dim() const { return v_dim > 0 ? v_dim : head_dim; }
};

class CudnnAttention {
 public:
  // Creates the cuDNN handle on `stream`. Scratch comes from `allocator` when given (it must order its reuse
  // by `stream`, as the CUDA backend's caching allocator does), else from cudaMallocAsync on `stream`.
  // deterministic: the backward writes dQ without the fp32 accumulator that atomics sum into, and only engines
  // without cuDNN's non-deterministic note run it, so the same inputs give the same bits every run.
  explicit CudnnAttention(gpuStream_t stream, Allocator* allocator = nullptr, bool deterministic = false);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // out = softmax(scale · q kᵀ, causal or unmasked) v and its lse. Enqueued on the stream; returns without waiting.
  void forward(const AttentionShape& shape, const void* q, const void* k, const void* v, void* out, float* lse,
               float scale, bool causal = true);
  // dq, dk, dv (overwritten) from dout and the forward's out and lse (or those of a whole attention the block is part
  // of: the block's contributions, backend.h). dq is non-deterministic in the last bits
  // (fp32 atomics into the accumulator) unless the object was made deterministic. T = 1 is rejected: cuDNN has no
  // backward for one-token sequences.
  void backward(const AttentionShape& shape, const void* q, const void* k, const void* v, const void* out,
                const void* dout, const float* lse, void* dq, void* dk, void* dv, float scale, bool causal = true);

  // Execution plans built so far (one per shape and direction).
  int64_t plan_count() const { return static_cast<int64_t>(plans_.size()); }

 private:
  struct Plan;
  // backward?, causal?, B, T, Hq, Hkv, D, Dv
  using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

  Plan& plan_for(const AttentionShape& shape, bool backward, bool causal);
  void* device_alloc(size_t bytes);
  void device_free(void* ptr, size_t bytes);
  // At least `bytes` of scratch, reallocated only to grow.
  void* scratch(size_t bytes);

  gpuStream_t stream_;
  Allocator* allocator_;
  bool deterministic_;
  void* handle_ = nullptr;  // cudnnHandle_t
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace primus
