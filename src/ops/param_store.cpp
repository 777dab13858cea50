#include "ops/param_store.h"

#include "core/rng.h"
#include "ops/ops.h"


namespace primus {

namespace {
// FNV-1a: a hash of the name that is the same on every platform and build, so initial weights are too.
uint64_t stable_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace

ParamStore::ParamStore(std::vector<ParamSpec> specs, Device device) : specs_(std::move(specs)) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    PRIMUS_CHECK(index_.emplace(specs_[i].name, i).second, "duplicate parameter name {}", specs_[i].name);
    offsets_.push_back(total_);
    total_ += shape_numel(specs_[i].shape);
  }
  ops::start_device(device);
  params_ = Tensor::empty({total_}, DType::kF32, device);
  grads_ = ops::zeros({total_}, DType::kF32, device);
}

size_t ParamStore::index_of(const std::string& name) const {
  auto it = index_.find(name);
  PRIMUS_CHECK(it != index_.end(), "unknown parameter '{}'", name);
  return it->second;
}

Tensor ParamStore::param(const std::string& name) const { return param(index_of(name)); }
Tensor ParamStore::grad(const std::string& name) const { return grad(index_of(name)); }
Tensor ParamStore::param(size_t i) const { return params_.slice_elements(offsets_[i], specs_[i].shape); }
Tensor ParamStore::grad(size_t i) const { return grads_.slice_elements(offsets_[i], specs_[i].shape); }

void ParamStore::initialize(uint64_t seed) {
  // Drawn on the host (the same values on every device), then copied over once.
  Tensor host = Tensor::empty({total_}, DType::kF32);
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& spec = specs_[i];
    Tensor view = host.slice_elements(offsets_[i], spec.shape);
    float* p = view.f32();
    if (spec.init == ParamInit::kOnes) {
      view.fill(1.0f);
      continue;
    }
    // Element k takes the generator's (2k+1, 2k+2)-th outputs, so the loop runs in parallel and still gives the
    // values of one sequential stream (a billion-parameter model initialises in about a second).
    const uint64_t stream = Rng::derive(seed, stable_hash(spec.name)).seed();
    const int64_t n = view.numel();
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; ++k) {
      Rng rng(stream, 2 * static_cast<uint64_t>(k));
      p[k] = static_cast<float>(rng.normal() * spec.init_std);
    }
  }
  ops::copy(params_, host);
}

void ParamStore::zero_grads() { ops::zero(grads_); }

}  // namespace primus
