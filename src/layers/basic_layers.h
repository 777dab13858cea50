// The small layers of a decoder: token embedding, RMSNorm, and the output projection with loss.
// Each layer holds views of its parameters and gradients (from the flat ParamStore) and has an explicit
// forward that fills a Saved struct and a backward that reads it. Gradients accumulate into the views.
#pragma once

#include "core/tensor.h"
#include "layers/tensor_parallel.h"
#include "ops/ops.h"

namespace primus {

// Under tensor parallelism the table holds the rank's rows of the vocabulary (`vocab`): other ids give zero rows,
// and the ranks' rows are summed over `tp`.
struct Embedding {
  Tensor table;   // [V, C] (this rank's rows)
  Tensor dtable;  // [V, C]
  VocabShard vocab;
  TensorParallelGroup tp;

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
  Tensor dhidden;  // [N, C] the loss gradient w.r.t. the hidden states, computed in forward
};

// logits = hidden · headᵀ and per-token cross-entropy, `head` possibly the embedding table (tied weights).
// The rows go through in chunks whose logits fit max_logits_bytes, so the [N, V] logits never exist whole:
// in training each chunk's loss gradient is formed right away (grad_scale is known before the step: 1 / the
// global batch's counted tokens), multiplied into dhidden and accumulated into dhead, and the chunk's logits
// are dropped. That costs no extra GEMM against keeping the logits for backward, and saves their memory
// (4 GiB for 16,384 tokens of a 128K vocabulary in bf16).
//
// Vocabulary-parallel (Megatron's vocab_parallel_cross_entropy) under tensor parallelism: `head` holds the rank's
// rows of the vocabulary; each chunk's row maxima, Σ exp and target logits are reduced over `tp`, so the full
// logits are never on one rank; the hidden states' gradient is summed over `tp` too, unless `dhidden_partial`
// (sequence parallelism: the caller reduce-scatters its rows instead).
struct LmLoss {
  Tensor head;   // [V, C] (this rank's rows)
  Tensor dhead;  // [V, C]
  VocabShard vocab;
  TensorParallelGroup tp;
  bool dhidden_partial = false;
  int64_t max_logits_bytes = int64_t{1} << 30;  // one chunk's logits

  // Training: losses [N] f32 (0 for ignored targets); dhead += the gradient of grad_scale × Σ losses, whose
  // gradient w.r.t. hidden goes to saved.dhidden.
  Tensor forward_with_grad(const Tensor& hidden, const Tensor& targets, float grad_scale, LmLossSaved& saved);
  // Evaluation: losses [N] f32 only.
  Tensor forward(const Tensor& hidden, const Tensor& targets) const;
  Tensor backward(LmLossSaved& saved) const;  // -> dhidden [N, C] (saved's, released)
  Tensor logits(const Tensor& hidden) const;  // hidden [n, C] -> [n, V] (this rank's columns)

 private:
  // One chunk's losses and lse [n] from its logits [n, V] (this rank's columns) and targets [n].
  void losses_of_chunk(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse) const;
};

}  // namespace primus
