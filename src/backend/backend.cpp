#include "backend/backend.h"

#include <chrono>

namespace primus {

void Backend::unimplemented(const char* op) const {
  throw RuntimeError(fmt::format("[op {}] not implemented on backend {}", op, name()));
}

void Backend::gemm(const GemmArgs&) { unimplemented("gemm"); }
void Backend::embedding_forward(const EmbeddingArgs&) { unimplemented("embedding_forward"); }
void Backend::embedding_backward(const EmbeddingArgs&) { unimplemented("embedding_backward"); }
void Backend::rmsnorm_forward(const RmsNormArgs&) { unimplemented("rmsnorm_forward"); }
void Backend::rmsnorm_backward(const RmsNormArgs&) { unimplemented("rmsnorm_backward"); }
void Backend::rope_forward(const RopeArgs&) { unimplemented("rope_forward"); }
void Backend::rope_backward(const RopeArgs&) { unimplemented("rope_backward"); }
void Backend::attention_forward(const AttentionArgs&) { unimplemented("attention_forward"); }
void Backend::attention_backward(const AttentionArgs&) { unimplemented("attention_backward"); }
void Backend::attention_merge(const AttentionMergeArgs&) { unimplemented("attention_merge"); }
void Backend::head_concat(const HeadConcatArgs&) { unimplemented("head_concat"); }
void Backend::head_concat_backward(const HeadConcatArgs&) { unimplemented("head_concat_backward"); }
void Backend::moe_router_forward(const MoeRouterArgs&) { unimplemented("moe_router_forward"); }
void Backend::moe_router_backward(const MoeRouterArgs&) { unimplemented("moe_router_backward"); }
void Backend::moe_sort(const MoeSortArgs&) { unimplemented("moe_sort"); }
void Backend::moe_capacity(const MoeCapacityArgs&) { unimplemented("moe_capacity"); }
void Backend::moe_pad_rows(const MoePadArgs&) { unimplemented("moe_pad_rows"); }
void Backend::moe_unpad_rows(const MoePadArgs&) { unimplemented("moe_unpad_rows"); }
void Backend::moe_permute(const MoePermuteArgs&) { unimplemented("moe_permute"); }
void Backend::moe_permute_backward(const MoePermuteArgs&) { unimplemented("moe_permute_backward"); }
void Backend::moe_unpermute(const MoePermuteArgs&) { unimplemented("moe_unpermute"); }
void Backend::moe_unpermute_backward(const MoePermuteArgs&) { unimplemented("moe_unpermute_backward"); }
void Backend::grouped_linear_forward(const GroupedLinearArgs&) { unimplemented("grouped_linear_forward"); }
void Backend::grouped_linear_backward(const GroupedLinearArgs&) { unimplemented("grouped_linear_backward"); }
void Backend::moe_aux_loss(const MoeAuxLossArgs&) { unimplemented("moe_aux_loss"); }
void Backend::moe_z_loss(const MoeAuxLossArgs&) { unimplemented("moe_z_loss"); }
void Backend::swiglu_forward(const SwiGluArgs&) { unimplemented("swiglu_forward"); }
void Backend::swiglu_backward(const SwiGluArgs&) { unimplemented("swiglu_backward"); }
void Backend::cross_entropy_forward(const CrossEntropyArgs&) { unimplemented("cross_entropy_forward"); }
void Backend::cross_entropy_backward(const CrossEntropyArgs&) { unimplemented("cross_entropy_backward"); }
void Backend::cross_entropy_forward_backward(const CrossEntropyArgs& args) {
  cross_entropy_forward(args);
  cross_entropy_backward(args);
}
void Backend::cross_entropy_shard_stats(const CrossEntropyArgs&) { unimplemented("cross_entropy_shard_stats"); }
void Backend::cross_entropy_finish(const CrossEntropyArgs&) { unimplemented("cross_entropy_finish"); }
void Backend::row_max(const Tensor&, Tensor&) { unimplemented("row_max"); }
void Backend::adamw_step(const AdamWArgs&) { unimplemented("adamw_step"); }
void Backend::fp8_amax(const Fp8AmaxArgs&) { unimplemented("fp8_amax"); }
void Backend::fp8_scale(const Fp8ScaleArgs&) { unimplemented("fp8_scale"); }
void Backend::fp8_quantize(const Fp8QuantizeArgs&) { unimplemented("fp8_quantize"); }
void Backend::fp8_dequantize(const Fp8DequantizeArgs&) { unimplemented("fp8_dequantize"); }
void Backend::fp8_gemm(const Fp8GemmArgs&) { unimplemented("fp8_gemm"); }
void Backend::add_inplace(Tensor&, const Tensor&) { unimplemented("add_inplace"); }
void Backend::scale_inplace(Tensor&, float) { unimplemented("scale_inplace"); }
double Backend::sum_squares(const Tensor&) { unimplemented("sum_squares"); }
void Backend::sum_into(Tensor&, const Tensor&) { unimplemented("sum_into"); }
void Backend::cast(Tensor&, const Tensor&) { unimplemented("cast"); }
void Backend::copy(Tensor&, const Tensor&) { unimplemented("copy"); }
void Backend::fill(Tensor&, float) { unimplemented("fill"); }
void Backend::fill_normal(Tensor&, uint64_t, double, StreamIndex) { unimplemented("fill_normal"); }
void Backend::zero(Tensor&) { unimplemented("zero"); }
void Backend::synchronize() { unimplemented("synchronize"); }

namespace {

struct HostMark : DeviceMark {
  std::chrono::steady_clock::time_point time = std::chrono::steady_clock::now();
};

Backend* g_backends[2] = {nullptr, nullptr};

}  // namespace

std::unique_ptr<DeviceMark> Backend::mark() { return std::make_unique<HostMark>(); }

double Backend::elapsed_ms(const DeviceMark& from, const DeviceMark& to) {
  const auto& a = dynamic_cast<const HostMark&>(from);
  const auto& b = dynamic_cast<const HostMark&>(to);
  return std::chrono::duration<double, std::milli>(b.time - a.time).count();
}

// Host defaults: work ran when it was called, so every event is already reached and nothing is reused early.
Stream Backend::stream(StreamKind) { return Stream{}; }
std::unique_ptr<DeviceEvent> Backend::record_event(Stream) { return std::make_unique<DeviceEvent>(); }
void Backend::wait_event(Stream, const DeviceEvent&) {}
void Backend::wait_host(const DeviceEvent&) {}
void Backend::record_stream(const Tensor&, Stream) {}
void Backend::pin_host(void*, size_t) {}
void Backend::unpin_host(void*) {}
void Backend::set_deterministic(bool) {}

void Backend::range_push(const char*) {}
void Backend::range_pop() {}

Backend& backend_for(Device device) {
  Backend* backend = g_backends[static_cast<int>(device.type)];
  if (backend == nullptr) throw RuntimeError(fmt::format("no backend for device {} (not built or not started)", device.str()));
  return *backend;
}

Backend* started_backend(DeviceType type) { return g_backends[static_cast<int>(type)]; }

void register_backend(DeviceType type, Backend* backend) { g_backends[static_cast<int>(type)] = backend; }

}  // namespace primus
