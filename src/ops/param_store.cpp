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

Shape ParamSpec::whole_shape() const {
  Shape whole = shape;
  if (slice.sliced()) whole[static_cast<size_t>(slice.dim)] = slice.whole;
  return whole;
}

namespace {

// Where this rank's part of a parameter lies in the whole tensor's stream of initial values (row-major).
StreamIndex stream_index(const ParamSpec& spec) {
  if (!spec.slice.sliced()) return {};
  int64_t inner = 1;  // elements per step along the sliced dimension
  for (size_t d = static_cast<size_t>(spec.slice.dim) + 1; d < spec.shape.size(); ++d) inner *= spec.shape[d];
  if (spec.slice.dim == 0) return {spec.slice.offset * inner, 0, 0};
  PRIMUS_CHECK(spec.slice.dim == 1 && spec.shape.size() == 2, "[params] {}: a slice along dimension {} of {} "
               "is not supported", spec.name, spec.slice.dim, shape_str(spec.shape));
  return {spec.slice.offset, spec.shape[1], spec.slice.whole};
}

}  // namespace

void ParamStore::initialize(uint64_t seed) {
  // Drawn where the parameters live: element k of a tensor is normal_at(its stream, k), the same values on every
  // device (core/rng.h), and a GPU draws billions of them in milliseconds instead of seconds on the host.
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& spec = specs_[i];
    Tensor view = params_.slice_elements(offsets_[i], spec.shape);
    if (spec.init == ParamInit::kOnes || spec.init == ParamInit::kZeros) {
      ops::fill(view, spec.init == ParamInit::kOnes ? 1.0f : 0.0f);
    } else {
      ops::fill_normal(view, Rng::derive(seed, stable_hash(spec.name)).seed(), spec.init_std, stream_index(spec));
    }
  }
}

void ParamStore::zero_grads() { ops::zero(grads_); }

}  // namespace primus
