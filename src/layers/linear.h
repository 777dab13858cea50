// Linear projection y = x · Wᵀ (no bias, as every projection of Llama/Qwen3), holding views of its weight and
// gradient in the flat ParamStore buffers. A module of its own so that code outside the model can replace or wrap
// one by name (Model::for_each_linear): tensor parallelism with a column- or row-parallel Linear, LoRA with a
// wrapper around the frozen one, FP8 with another GEMM. It keeps no per-micro-batch state: the caller saves the
// input (several projections often share one) and hands it back to backward, so any number of micro-batches
// can be in flight.
#pragma once

#include <initializer_list>
#include <memory>

#include "core/tensor.h"

namespace primus {

// What a module derived from Linear keeps of one input (its own kind of state, opaque to the layers).
struct LinearInputState {
  virtual ~LinearInputState() = default;
  // The layer lets the input go (drop_unread_input): let go of any reference to it too.
  virtual void forget_input() {}
};

// What the Linear modules reading one input keep of it for one micro-batch, besides the input itself (which the
// caller keeps): nothing for a plain Linear; one on fp8 GEMMs keeps the input's codes, so that projections sharing
// an input quantise it once and their backwards do not quantise it again. The layer holds one per input in its
// saved state, passes it to every forward and backward reading that input, and calls end_forward() after the last
// of those forwards (freeing what only the forwards read).
// When what the modules keep stands in for the input in every backward (Linear::backward_reads_input false for each
// module reading it), the layer may free the input after the forwards: drop_unread_input below.
struct LinearSaved {
  std::shared_ptr<LinearInputState> forward_only;
  std::shared_ptr<LinearInputState> for_backward;
  bool input_dropped = false;  // the backwards get an undefined input
  void end_forward() { forward_only.reset(); }
};

class Linear {
 public:
  Linear() = default;
  Linear(Tensor weight, Tensor dweight) : weight_(std::move(weight)), dweight_(std::move(dweight)) {}
  virtual ~Linear() = default;

  // x [N, in] -> [N, out]. `saved` (optional): x's state for this micro-batch, shared by the modules reading x.
  virtual Tensor forward(const Tensor& x, LinearSaved* saved = nullptr);
  // dweight += dyᵀ · x; dy · W goes into dx: assigned when dx is undefined, accumulated by the GEMM otherwise (a
  // layer input that feeds several projections sums their gradients). x [N, in] and `saved` as given to forward,
  // dy [N, out].
  virtual void backward(const Tensor& x, const Tensor& dy, Tensor& dx, LinearSaved* saved = nullptr);
  // Whether backward reads x itself, given what `saved` keeps of it after the forwards (false: an undefined x will
  // do). A plain Linear always does: its weight gradient is dyᵀ · x.
  virtual bool backward_reads_input(const Tensor& x, const LinearSaved* saved) const;

  const Tensor& weight() const { return weight_; }    // [out, in]
  const Tensor& dweight() const { return dweight_; }  // [out, in]
  int64_t in_features() const { return weight_.dim(1); }
  int64_t out_features() const { return weight_.dim(0); }

 protected:
  Tensor weight_;   // the compute weights (a bf16 copy in mixed precision, else the master weights)
  Tensor dweight_;  // fp32 gradient
};

// After the last forward reading x (and saved.end_forward()): when none of `readers` reads x in its backward, marks
// `saved` so (their backwards then get an undefined x) and returns true, and the layer drops its own reference to x.
// An fp8 layer's inputs then live on as their 1-byte transposed codes only, instead of beside them in bf16.
bool drop_unread_input(const Tensor& x, LinearSaved& saved, std::initializer_list<const Linear*> readers);

}  // namespace primus
