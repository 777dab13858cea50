// The mixture-of-experts block that replaces the dense MLP in the MoE layers of Mixtral, Qwen3-MoE and the like:
// a router (gate Linear, top-k over softmax or sigmoid scores), dropless routed experts (SwiGLU each, all experts'
// GEMMs as grouped GEMMs over expert-contiguous rows) and an optional shared expert that sees every token.
//
// Mixed precision (CUDA, bf16): the token rows, the experts' compute weights and their GEMMs in bf16, the router
// (logits, scores, top-k weights, aux and z losses) in fp32, weight gradients in fp32.
//
// Model code stays single-device: the tokens reach the experts through a TokenDispatcher. The local one (here)
// permutes rows within the process; expert parallelism will inject one that sends rows to the ranks holding their
// experts (all-to-all) behind the same interface.
#pragma once

#include <memory>
#include <vector>

#include "layers/attention.h"
#include "layers/linear.h"
#include "ops/moe_ops.h"
#include "ops/param_store.h"

namespace primus {

// Where the routed rows of one forward went, for the combine and both backwards.
struct DispatchState {
  int64_t tokens = 0;      // N
  int64_t topk = 1;
  Tensor slots;            // [N·k] i32: this rank's routing entries in expert order
  Tensor routed_offsets;   // [E + 1] i32: this rank's routing entries per expert, of all E (the aux loss's counts)
  Tensor offsets;          // [E_local + 1] i32: each local expert's rows of the dispatched [M, C]
  // Expert parallelism (AllToAllTokenDispatcher): rows sent to / received from each rank of the ep group, the
  // received rows' order in the expert-contiguous [M, C] (regroup[i]: the received row that row i is), and the rows
  // that came back after the experts, in expert order [N·k, C] (combine keeps them for combine_backward).
  std::vector<int64_t> send_rows, recv_rows;
  Tensor regroup;          // [M] i32
  Tensor returned;         // [N·k, C]
  // Expert capacity: topk_experts may name expert E for a dropped entry (moe_capacity). Such entries sort past
  // every expert (moe_sort over E + 1 buckets), are sent nowhere and come back as zero rows, so they add nothing to
  // their token and get no gradient. `kept`: this rank's entries that some expert computes (N·k without drops).
  bool may_drop = false;   // set by the layer before dispatch
  int64_t kept = 0;
};

// Rows [0, rows) of t [R, C] (a view; t itself when rows == R).
Tensor first_rows(const Tensor& t, int64_t rows);
// rows [R, C] followed by zero rows up to [total, C] (rows itself when R == total): the rows of dropped entries.
Tensor with_zero_rows(const Tensor& rows, int64_t total);

// Moves token rows to the experts and back. dispatch: x [N, C] and each token's experts [N, k] → the rows the local
// experts compute on, expert-contiguous [M, C], state.offsets their ranges (`experts`: E, all of the layer's; with
// state.may_drop an entry may name E: dropped, not dispatched).
// combine: the experts' outputs [M, C] → [N, C], each token's k outputs weighted by topk_weights [N, k]. The
// backwards take the gradients the other way. A dispatcher keeps nothing between calls: several micro-batches'
// states may be alive at once.
class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  virtual Tensor dispatch(const Tensor& x, const Tensor& topk_experts, int64_t experts, DispatchState& state) = 0;
  virtual Tensor combine(const Tensor& expert_out, const Tensor& topk_weights, DispatchState& state) = 0;
  // -> d expert_out [M, C]; dweights [N, k] (overwritten).
  virtual Tensor combine_backward(const Tensor& dout, const Tensor& expert_out, const Tensor& topk_weights,
                                  const DispatchState& state, Tensor& dweights) = 0;
  // -> dx [N, C].
  virtual Tensor dispatch_backward(const Tensor& drows, const DispatchState& state) = 0;
  // How many ranks' rows one expert receives (expert parallelism: the ep group; else 1): padding to capacity pads
  // each local expert to this many times the per-rank capacity, as Megatron's drop-and-pad all-to-all does.
  virtual int64_t source_ranks() const { return 1; }
};

// Every expert in this process: a permutation of the rows (moe_sort, moe_permute, moe_unpermute).
class LocalTokenDispatcher final : public TokenDispatcher {
 public:
  Tensor dispatch(const Tensor& x, const Tensor& topk_experts, int64_t experts, DispatchState& state) override;
  Tensor combine(const Tensor& expert_out, const Tensor& topk_weights, DispatchState& state) override;
  Tensor combine_backward(const Tensor& dout, const Tensor& expert_out, const Tensor& topk_weights,
                          const DispatchState& state, Tensor& dweights) override;
  Tensor dispatch_backward(const Tensor& drows, const DispatchState& state) override;
};

// The load-balancing settings (Megatron's keys).
struct MoeBalancing {
  float aux_loss_coeff = 0.0f;  // 0 or load_balancing_type none: no aux loss
  bool per_sequence = false;    // seq_aux_loss: the aux loss per sequence of the micro-batch, averaged (DeepSeek)
  float z_loss_coeff = 0.0f;    // 0: no z-loss
};

// Token dropping (Megatron's moe_expert_capacity_factor, moe_token_drop_policy, moe_pad_expert_input_to_capacity):
// each expert computes at most ceil(N·k / E × factor) of the N·k routing entries of the tokens this process routes
// (one micro-batch on one rank, before any all-to-all); the others are dropped: they add nothing to their token
// (the residual carries it) and get no gradient. The aux loss and tokens_per_expert count the router's choices.
struct MoeCapacity {
  double factor = 0.0;       // 0: dropless
  bool by_position = false;  // drop policy position (keep the earliest tokens); false: probs (the largest weights)
  bool pad = false;          // pad each expert's rows with zero rows to the capacity (the same outputs)
};

struct MoeSaved {
  Tensor input;                    // [N, C]
  Tensor logits, scores;           // [N, E] f32 (in every run)
  Tensor topk_experts;             // [N, k] i32
  Tensor topk_weights;             // [N, k]
  Tensor choice_offsets;           // [E + 1] i32: the router's choices per expert, before any drop (aux loss, metrics)
  DispatchState dispatch;
  Tensor padded_offsets;           // [E_local + 1] i32 with padding to capacity (the GEMMs' offsets), else undefined
  int64_t padded_rows = 0;         // each local expert's rows once padded
  int64_t unpadded_rows = 0;       // the dispatched rows M before padding
  Tensor combined;                 // [M, C] the experts' outputs the dispatcher combined (expert_out without padding)
  Tensor rows;                     // [M, C] the dispatched rows
  Tensor gate_up;                  // [M, 2F]
  Tensor act;                      // [M, F]
  Tensor expert_out;               // [M, C]
  Tensor dscores_aux;              // [N, E] grad_scale × the aux loss's gradient (undefined without it)
  Tensor dlogits_z;                // [N, E] grad_scale × the z-loss's gradient (undefined without it)
  MlpSaved shared;                 // the shared expert's
  Tensor aux_loss, z_loss;         // [1] each: this forward's loss values (for metrics), undefined when off
};

// The routing of the training forwards since the tally was last cleared, kept for metrics: per micro-batch the
// experts' row offsets and the loss values, left on the device until read.
struct MoeRoutingTally {
  std::vector<Tensor> offsets;     // [E + 1] i32 each: this rank's routing entries per expert (choice_offsets)
  std::vector<Tensor> kept_offsets;  // [E + 1] i32 each, with a capacity: the entries the experts computed
  std::vector<Tensor> aux_losses;  // [1] each, with its coefficient (none without the aux loss)
  std::vector<Tensor> z_losses;    // [1] each, with its coefficient (none without the z-loss)
};

struct MoeLayer {
  std::unique_ptr<Linear> gate;  // router [E, C]
  Tensor expert_bias;            // [E] or undefined: added to the scores for selection only
  // The experts this process holds: all E, or (expert parallelism) E_local = E / ep of them, whose rows the dispatcher
  // brings; the router scores all E.
  Tensor gate_up_weight;         // [E_local, 2F, C]: expert e's gate_proj (w1) rows then up_proj (w3) rows
  Tensor gate_up_grad;           // [E_local, 2F, C]
  Tensor down_weight;            // [E_local, C, F] (w2)
  Tensor down_grad;              // [E_local, C, F]
  std::unique_ptr<SwiGluMlp> shared_expert;  // null without one
  MoeRouting routing;
  MoeBalancing balancing;
  MoeCapacity capacity;
  std::shared_ptr<TokenDispatcher> dispatcher = std::make_shared<LocalTokenDispatcher>();

  int64_t experts() const { return gate->weight().dim(0); }  // E, the router's outputs
  // x [N, C] -> [N, C], the rows of `sequences` sequences of N / sequences tokens each, one after another (the
  // sequence-level aux loss's). aux_grad_scale: the weight of this micro-batch's aux and z losses in the step's
  // objective (their gradients are formed here and kept for backward, as LmLoss does).
  Tensor forward(const Tensor& x, int64_t sequences, float aux_grad_scale, MoeSaved& saved);
  // -> dx [N, C]; releases `saved`. hooks (optional): told as the experts' weights are read for the last time and
  // before their gradients are written (ParamUnitHooks::weights_read, grads_to_write).
  Tensor backward(const Tensor& dy, MoeSaved& saved, ParamUnitHooks* hooks = nullptr);

  MoeRoutingTally tally;
  // Adds a training forward's routing to the tally (not a recomputed forward's: it would count twice).
  void record_routing(const MoeSaved& saved);
};

}  // namespace primus
