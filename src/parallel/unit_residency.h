// A single rank's step-scoped buffers: the fp32 gradients, and in mixed precision the compute copy of the weights,
// held only while a training step needs them, as PyTorch's autocast with zero_grad(set_to_none=True) does, instead
// of the ParamStore's flat gradient buffer and the model's compute copy living through the whole step.
//
// The buffers come in pieces: each parameter unit (Model::param_units), with each MoE layer's experts' gate/up and
// down weights cut out as pieces of their own (Model::expert_weight_ranges). Over a step:
//   - a piece's gradients are allocated and zeroed as backward reaches it (its unit's before_backward, or for the
//     experts their layer's grads_to_write, which comes after their data gradient), or in the loss's forward for the
//     first and last unit (a tied or untied output layer forms its gradient there), and freed once the optimizer has
//     read them;
//   - in mixed precision, a piece's compute copy is freed by the step's last backward after its last read (its unit's
//     after_backward, or before it a layer's weights_read naming the whole piece: the experts, an untied embedding)
//     and allocated again as the optimizer writes it.
// So the end of forward holds the compute copy and the activations but no gradients of the blocks, and the end of
// backward the gradients but no compute copy. The optimizer updates the pieces from the smallest: each frees twice
// what it allocates (4 bytes of gradient an element against 2 of compute copy), so the large ones come once the most
// is free.
//
// A compute copy found freed before a forward (a step that stopped between backward and update) is cast again from the
// master weights; a gradient that no backward wrote counts as zero.
#pragma once

#include <functional>
#include <vector>

#include "ops/param_store.h"

namespace primus {

class UnitResidency final : public ParamUnitHooks {
 public:
  // units tile [0, params.numel()) in forward order; expert_weights lie inside them (ascending, disjoint).
  // `params` must outlive this object. Frees the ParamStore's flat gradients.
  UnitResidency(ParamStore& params, std::vector<FlatRange> units, const std::vector<FlatRange>& expert_weights,
                DType compute_dtype);

  // Once: the pieces for the model to bind (Model::bind_units). The compute copies are cast from the master weights as
  // each unit's first forward needs them.
  UnitBuffers take_buffers();

  // Before a training step's first forward; before each of its backwards, with `last` for the step's last one.
  void begin_step();
  void before_step_backward(bool last);
  // Σ g² over every piece's gradients.
  double grad_sum_squares() const;
  // The optimizer's update, piece by piece from the smallest: the piece's compute copy is allocated, `update` called
  // with its range, gradients and compute copy (undefined in fp32), then its gradients freed. Ends the step.
  using UpdateFn = std::function<void(FlatRange range, const Tensor& grads, const Tensor& compute)>;
  void update_pieces(const UpdateFn& update);

  void before_forward(size_t unit) override;
  void after_forward(size_t) override {}
  void before_backward(size_t unit) override;
  void after_backward(size_t unit) override;
  void weights_read(const Tensor& weights) override;
  void grads_to_write(const Tensor& grads) override;

  // For tests and reports: the pieces and whether each one's buffers are allocated now.
  const std::vector<FlatRange>& pieces() const { return ranges_; }
  bool grads_resident(size_t piece) const { return pieces_[piece].grads.resident(); }
  bool compute_resident(size_t piece) const { return pieces_[piece].compute.resident(); }

 private:
  struct Piece {
    size_t unit = 0;
    bool expert = false;  // an expert weight range: its layer reports its reads and writes
    Tensor compute;       // [n] compute dtype, its own storage; in fp32 a view of the master weights
    Tensor grads;         // [n] f32, its own storage
  };

  bool mixed() const { return compute_dtype_ != DType::kF32; }
  bool outer(size_t unit) const { return unit == 0 || unit + 1 == units_.size(); }
  void ensure_grads(Piece& piece);
  void ensure_compute(size_t piece);
  // The piece whose buffer `view` is a view of (buffers: compute or grads).
  size_t piece_of(const Tensor& view, bool grads) const;

  ParamStore& params_;
  std::vector<FlatRange> units_;
  DType compute_dtype_;
  std::vector<FlatRange> ranges_;
  std::vector<Piece> pieces_;
  std::vector<size_t> update_order_;  // piece indices by ascending size
  bool in_step_ = false;
  bool last_backward_ = false;
  bool taken_ = false;
};

}  // namespace primus
