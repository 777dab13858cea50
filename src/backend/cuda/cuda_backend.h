// The CUDA backend: every Backend entry on one device, checked against the CPU reference backend.
//
// Two streams. The compute stream carries every kernel, copy and GEMM, in program order; the caching
// allocator relies on that (see caching_allocator.h). The communication stream (stream(StreamKind::kComm),
// non-blocking, the device's highest priority so collectives are not starved by compute) carries only what
// parallel/ puts there; order between the two is the caller's, through record_event / wait_event, and memory
// used on it must be declared with record_stream before it is freed. Ops return without waiting for the
// GPU. The host waits only where a value must come back: sum_squares and copies into host tensors (the
// compute stream), wait_host (one event) and synchronize() (both streams). Data errors that kernels find
// (a token id or target outside its range) are recorded on the device and thrown as RuntimeError at the next
// of those waits, naming the op, the position and the value.
//
// Activations dispatch on dtype on the host: fp32, or bf16 for mixed precision (backend/backend.h has the dtype
// of every argument). bf16 GEMMs accumulate in fp32 through cuBLASLt; bf16 attention runs through cuDNN's fused
// flash attention (cudnn_attention.h, created on first use), the simple kernels serving fp32 and the shapes
// cuDNN does not take. One device per process: start_cuda_backend(index) selects it for the calling thread.
//
// This header needs no CUDA headers, so src/ops and tests include it from plain C++.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/caching_allocator.h"

namespace primus {

class CudnnAttention;

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  Device device() const override;

  void gemm(const GemmArgs& args) override;
  void embedding_forward(const EmbeddingArgs& args) override;
  void embedding_backward(const EmbeddingArgs& args) override;
  void rmsnorm_forward(const RmsNormArgs& args) override;
  void rmsnorm_backward(const RmsNormArgs& args) override;
  void rope_forward(const RopeArgs& args) override;
  void rope_backward(const RopeArgs& args) override;
  void attention_forward(const AttentionArgs& args) override;
  void attention_backward(const AttentionArgs& args) override;
  void attention_merge(const AttentionMergeArgs& args) override;
  void head_concat(const HeadConcatArgs& args) override;
  void head_concat_backward(const HeadConcatArgs& args) override;
  void swiglu_forward(const SwiGluArgs& args) override;
  void swiglu_backward(const SwiGluArgs& args) override;
  void grouped_linear_forward(const GroupedLinearArgs& args) override;
  void grouped_linear_backward(const GroupedLinearArgs& args) override;
  void cross_entropy_forward(const CrossEntropyArgs& args) override;
  void cross_entropy_backward(const CrossEntropyArgs& args) override;
  void cross_entropy_forward_backward(const CrossEntropyArgs& args) override;
  void cross_entropy_shard_stats(const CrossEntropyArgs& args) override;
  void cross_entropy_finish(const CrossEntropyArgs& args) override;
  void row_max(const Tensor& x, Tensor& max) override;
  void moe_router_forward(const MoeRouterArgs& args) override;
  void moe_router_backward(const MoeRouterArgs& args) override;
  void moe_sort(const MoeSortArgs& args) override;
  void moe_capacity(const MoeCapacityArgs& args) override;
  void moe_pad_rows(const MoePadArgs& args) override;
  void moe_unpad_rows(const MoePadArgs& args) override;
  void moe_permute(const MoePermuteArgs& args) override;
  void moe_permute_backward(const MoePermuteArgs& args) override;
  void moe_unpermute(const MoePermuteArgs& args) override;
  void moe_unpermute_backward(const MoePermuteArgs& args) override;
  void moe_aux_loss(const MoeAuxLossArgs& args) override;
  void moe_z_loss(const MoeAuxLossArgs& args) override;
  void adamw_step(const AdamWArgs& args) override;
  void fp8_amax(const Fp8AmaxArgs& args) override;
  void fp8_scale(const Fp8ScaleArgs& args) override;
  void fp8_quantize(const Fp8QuantizeArgs& args) override;
  void fp8_dequantize(const Fp8DequantizeArgs& args) override;
  void fp8_gemm(const Fp8GemmArgs& args) override;
  void add_inplace(Tensor& y, const Tensor& x) override;
  void scale_inplace(Tensor& x, float s) override;
  double sum_squares(const Tensor& x) override;
  void sum_into(Tensor& acc, const Tensor& x) override;
  void copy(Tensor& dst, const Tensor& src) override;
  void cast(Tensor& dst, const Tensor& src) override;
  void fill(Tensor& x, float value) override;
  void fill_normal(Tensor& x, uint64_t seed, double std, StreamIndex index) override;
  void zero(Tensor& x) override;
  std::unique_ptr<DeviceMark> mark() override;
  double elapsed_ms(const DeviceMark& from, const DeviceMark& to) override;
  void range_push(const char* name) override;
  void range_pop() override;
  // Waits for both streams, then reports data errors.
  void synchronize() override;

  // The null handle and stream(kCompute) name the compute stream; any other handle is a gpuStream_t.
  Stream stream(StreamKind kind) override;
  // Events come from a pool (created without timing): recording one per collective creates none in steady state.
  std::unique_ptr<DeviceEvent> record_event(Stream stream) override;
  void wait_event(Stream stream, const DeviceEvent& event) override;
  void wait_host(const DeviceEvent& event) override;
  // Declares t's memory (the whole block it is a view of) in use on `stream`; nothing for the compute stream.
  void record_stream(const Tensor& t, Stream stream) override;
  void pin_host(void* ptr, size_t bytes) override;
  void unpin_host(void* ptr) override;
  void set_deterministic(bool deterministic) override;

  CachingAllocator& allocator();

 private:
  struct State;
  // Throws the first data error recorded by a kernel, if any. Call only after the stream has drained.
  void report_device_errors();
  // Waits for the compute stream only (a value read back must not wait for collectives on the other one),
  // then reports data errors.
  void wait_compute();
  // The stream a Stream names: its handle, or the compute stream for the null handle (returned as void*).
  void* resolve(Stream stream) const;
  // The cuDNN attention on this backend's stream and allocator, created on first use.
  CudnnAttention& cudnn_attention();
  std::unique_ptr<State> state_;
};

// Number of CUDA devices this process can use; 0 when there is no driver or no device, with the reason
// in *why. Never throws.
int cuda_device_count(std::string* why = nullptr);

// Starts the CUDA backend on device `device_index` once per process: selects the device, creates the
// stream, cuBLASLt handle and workspace, and registers the backend and its caching allocator for
// DeviceType::kCuda. Later calls with the same index return the running backend at once; another index
// throws. Throws RuntimeError when no such device is usable.
CudaBackend& start_cuda_backend(int device_index = 0);

}  // namespace primus
