// The small layers of a decoder: token embedding, RMSNorm, and the output projection with loss.
// Each layer holds views of its parameters and gradients (from the flat ParamStore) and has an explicit
// forward that fills a Saved struct and a backward that reads it. Gradients accumulate into the views.
#pragma once

#include "core/tensor.h"

namespace primus {

struct Embedding {
  Tensor table;   // [V, C]
  Tensor dtable;  // [V, C]

  Tensor forward(const Tensor& ids);                  // ids [N] i32 -> [N, C]
  void backward(const Tensor& ids, const Tensor& dout);  // dtable += scatter(dout)
};

struct RmsNormSaved {
  Tensor x;     // [N, C] input
  Tensor rstd;  // [N]
};

struct RmsNorm {
  Tensor weight;   // [C]
  Tensor dweight;  // [C]
  float eps = 1e-5f;

  Tensor forward(const Tensor& x, RmsNormSaved& saved);  // x [N, C] -> [N, C]
  Tensor backward(const Tensor& dy, const RmsNormSaved& saved);  // -> dx [N, C]
};

struct LmLossSaved {
  Tensor hidden;  // [N, C] final-norm output
  Tensor logits;  // [N, V]
  Tensor lse;     // [N]
  Tensor targets; // [N] i32
};

// logits = hidden · headᵀ; per-token cross-entropy. `head` may be the embedding table (tied weights).
struct LmLoss {
  Tensor head;   // [V, C]
  Tensor dhead;  // [V, C]

  Tensor forward(const Tensor& hidden, const Tensor& targets, LmLossSaved& saved);  // -> losses [N]
  // grad_scale is dL/dloss_i for each counted token (1 / tokens in the global batch). Frees the logits.
  Tensor backward(float grad_scale, LmLossSaved& saved);  // -> dhidden [N, C]
};

}  // namespace primus
