#include "layers/fp8_linear.h"

#include "core/error.h"
#include "ops/fp8_ops.h"
#include "ops/ops.h"

namespace primus {

namespace {

using Scaling = Fp8Recipe::Scaling;

// A matrix's fp8 codes with what its GEMM needs to read them.
struct Fp8Matrix {
  Tensor codes;      // [R, C] u8
  Tensor scale_inv;  // the codes' tile grid, f32
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Tiling tiling;

  ops::Fp8Operand operand() const {
    return {.codes = &codes, .format = format, .tiling = tiling, .scale_inv = &scale_inv};
  }
};

// The blockwise recipe's tiles (DeepSeek-V3): 1×128 for inputs and gradients, 128×128 for weights, over the matrix
// and, the same way, over its transposed copy. One tile, the whole tensor, otherwise.
Fp8Tiling tiling_for(Scaling scaling, Fp8Role role) {
  if (scaling != Scaling::kBlockwise) return Fp8Tiling{};
  return role == Fp8Role::kWeight ? Fp8Tiling{.rows = 128, .cols = 128} : Fp8Tiling{.rows = 1, .cols = 128};
}

struct Quantised {
  Fp8Matrix plain;       // x [R, C]
  Fp8Matrix transposed;  // xᵀ [C, R], when asked for
};

// Current scaling (tensorwise and blockwise): scales from x's own amaxes, now.
void current_scales(const Fp8Scaling& scaling, const Tensor& x, Fp8Format format, Fp8Tiling tiling, bool transposed,
                    Tensor& scale, Tensor& scale_inv, Tensor& non_finite) {
  const Shape grid = transposed ? ops::fp8_tile_grid(x.dim(1), x.dim(0), tiling)
                                : ops::fp8_tile_grid(x.dim(0), x.dim(1), tiling);
  Tensor amax = Tensor::empty(grid, DType::kF32, x.device());
  ops::fp8_amax(x, tiling, amax, transposed);
  if (tiling.whole_tensor()) scaling.combine_current_amax(amax);
  scale = Tensor::empty(grid, DType::kF32, x.device());
  scale_inv = Tensor::empty(grid, DType::kF32, x.device());
  // Power-of-two block scales keep every dequantised product exact, as Transformer Engine's block recipe does.
  const Fp8ScaleOptions options{.power_of_two = scaling.recipe().scaling == Scaling::kBlockwise};
  ops::fp8_scale(amax, format, options, scale, scale_inv, non_finite);
}

// x [R, C] in `role`'s format and tiles, with its transposed copy when `transposed` (the quantise op then writes both;
// the backward GEMMs that read only the copy pay for the plain codes too). `record` adds x's amax to the delayed
// recipe's step (once per forward).
Quantised quantise(Fp8Scaling& scaling, int handle, Fp8Role role, const Tensor& x, bool transposed, bool record) {
  const Fp8Format format = scaling.format(role);
  const Fp8Tiling tiling = tiling_for(scaling.recipe().scaling, role);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Quantised q;
  q.plain = Fp8Matrix{Tensor::empty({rows, cols}, DType::kU8, x.device()), Tensor(), format, tiling};
  Tensor scale, scale_t;
  if (scaling.recipe().scaling == Scaling::kDelayed) {
    if (record) scaling.record_amax(handle, x);
    scale = scale_t = scaling.scale(handle);
    q.plain.scale_inv = q.transposed.scale_inv = scaling.scale_inv(handle);
  } else {
    current_scales(scaling, x, format, tiling, false, scale, q.plain.scale_inv, scaling.non_finite());
    if (transposed && tiling.whole_tensor()) {
      scale_t = scale;  // one tile: the same scale either way
      q.transposed.scale_inv = q.plain.scale_inv;
    } else if (transposed) {
      current_scales(scaling, x, format, tiling, true, scale_t, q.transposed.scale_inv, scaling.non_finite());
    }
  }
  if (!transposed) {
    ops::fp8_quantize(x, scale, format, tiling, q.plain.codes);
    return q;
  }
  q.transposed.codes = Tensor::empty({cols, rows}, DType::kU8, x.device());
  q.transposed.format = format;
  q.transposed.tiling = tiling;
  ops::fp8_quantize(x, scale, format, tiling, q.plain.codes, scale_t, q.transposed.codes);
  return q;
}

// The codes of an input x kept in a LinearSaved: those of x for the forwards of the modules sharing x, those of xᵀ
// for their backwards. Valid for the x they were made of (the same elements) under the same scaling state and scale
// (delayed: the input's handle). Holding x keeps its memory from being reused for another tensor meanwhile.
struct Fp8SavedInput final : LinearInputState {
  Tensor source;  // held, so that its memory cannot become another tensor's meanwhile; undefined once forgotten
  const Fp8Scaling* scaling = nullptr;
  int handle = -1;
  Fp8Matrix codes;

  // After forget_input the codes stand for the input the layer dropped: they answer an undefined x only.
  bool made_of(const Tensor& x, const Fp8Scaling* s, int h) const {
    if (scaling != s || handle != h) return false;
    if (!source.defined()) return !x.defined();
    return x.defined() && source.shares_storage(x) && source.data() == x.data() && source.shape() == x.shape() &&
           source.dtype() == x.dtype();
  }
  void forget_input() override { source = Tensor(); }
};

// The codes `slot` keeps of x, or null.
const Fp8Matrix* saved_codes(const std::shared_ptr<LinearInputState>& slot, const Tensor& x, const Fp8Scaling* scaling,
                             int handle) {
  const auto* kept = dynamic_cast<const Fp8SavedInput*>(slot.get());
  return kept != nullptr && kept->made_of(x, scaling, handle) ? &kept->codes : nullptr;
}

std::shared_ptr<LinearInputState> keep_codes(const Tensor& x, const Fp8Scaling* scaling, int handle, Fp8Matrix codes) {
  auto kept = std::make_shared<Fp8SavedInput>();
  kept->source = x;
  kept->scaling = scaling;
  kept->handle = handle;
  kept->codes = std::move(codes);
  return kept;
}

}  // namespace

struct Fp8Linear::WeightCodes {
  uint64_t generation = 0;
  Quantised codes;  // W [out, in] and Wᵀ
};

const Fp8Linear::WeightCodes& Fp8Linear::weight_codes() {
  if (weight_codes_ == nullptr || weight_codes_->generation != scaling_->weights_generation()) {
    weight_codes_ = std::make_shared<WeightCodes>(WeightCodes{
        scaling_->weights_generation(), quantise(*scaling_, weight_handle_, Fp8Role::kWeight, weight_, true, true)});
  }
  return *weight_codes_;
}

Fp8Linear::Fp8Linear(const Linear& plain, std::shared_ptr<Fp8Scaling> scaling, const std::string& name,
                     const std::string& input_name)
    : Linear(plain.weight(), plain.dweight()), scaling_(std::move(scaling)), name_(name) {
  if (scaling_->recipe().scaling == Scaling::kDelayed) {
    input_handle_ = scaling_->add_tensor(input_name.empty() ? name + ".input" : input_name, Fp8Role::kInput);
    weight_handle_ = scaling_->add_tensor(name + ".weight", Fp8Role::kWeight);
    grad_handle_ = scaling_->add_tensor(name + ".grad_output", Fp8Role::kGradOutput);
  }
}

Tensor Fp8Linear::forward(const Tensor& x, LinearSaved* saved) {
  PRIMUS_CHECK(x.ndim() == 2 && x.dim(1) == in_features(), "[fp8] {}: input {} for a weight {}", name_, x.describe(),
               weight_.describe());
  const Fp8Matrix* x_codes = saved ? saved_codes(saved->forward_only, x, scaling_.get(), input_handle_) : nullptr;
  Quantised qx;
  if (x_codes == nullptr) {  // the first module to read x: quantise it (and its transposed copy, to keep)
    qx = quantise(*scaling_, input_handle_, Fp8Role::kInput, x, saved != nullptr, true);
    if (saved != nullptr) {
      saved->forward_only = keep_codes(x, scaling_.get(), input_handle_, qx.plain);
      saved->for_backward = keep_codes(x, scaling_.get(), input_handle_, qx.transposed);
    }
    x_codes = &qx.plain;
  }
  const Quantised& qw = weight_codes().codes;
  Tensor y = Tensor::empty({x.dim(0), out_features()}, x.dtype(), x.device());
  // One scale per tensor lets the forward GEMM accumulate in the tensor cores' fast mode, as Transformer Engine's
  // forward does; the gradients' GEMMs keep the precise accumulation.
  const bool fast = scaling_->recipe().scaling != Scaling::kBlockwise;
  ops::fp8_gemm(x_codes->operand(), qw.plain.operand(), y, {.fast_accumulation = fast});
  return y;
}

void Fp8Linear::backward(const Tensor& x, const Tensor& dy, Tensor& dx, LinearSaved* saved) {
  const Fp8Matrix* xt_codes = saved ? saved_codes(saved->for_backward, x, scaling_.get(), input_handle_) : nullptr;
  PRIMUS_CHECK(x.defined() || xt_codes != nullptr, "[fp8] {}: backward without its input or codes of it", name_);
  const Quantised qdy = quantise(*scaling_, grad_handle_, Fp8Role::kGradOutput, dy, true, true);
  const Quantised& qw = weight_codes().codes;
  const bool accumulate = dx.defined();
  if (!accumulate) dx = Tensor::empty({dy.dim(0), in_features()}, dy.dtype(), dy.device());
  ops::fp8_gemm(qdy.plain.operand(), qw.transposed.operand(), dx, {.accumulate = accumulate});
  Quantised qx;
  if (xt_codes == nullptr) {
    qx = quantise(*scaling_, input_handle_, Fp8Role::kInput, x, true, false);
    xt_codes = &qx.transposed;
  }
  ops::fp8_gemm(qdy.transposed.operand(), xt_codes->operand(), dweight_, {.accumulate = true});
}

bool Fp8Linear::backward_reads_input(const Tensor& x, const LinearSaved* saved) const {
  return saved == nullptr || saved_codes(saved->for_backward, x, scaling_.get(), input_handle_) == nullptr;
}

}  // namespace primus
