// Flat parameter storage with named views.
// Parameters and their gradients each live in ONE contiguous buffer laid out from a spec table, in the
// order of the table; layers, the optimizer and checkpoint I/O see named views into it. One buffer makes
// fused optimizers, gradient-norm reductions, bucketed all-reduce and sharding simple later on.
// Names follow Hugging Face (`model.layers.0.self_attn.q_proj.weight`).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace primus {

enum class ParamInit { kNormal, kOnes, kZeros };

// [begin, end) elements of a flat buffer (a gradient bucket, an optimizer shard).
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

// Called by a model's backward with [begin, end): elements of the flat gradient buffer whose gradients it has
// finished (data parallelism starts reducing a bucket as soon as its range is final).
using GradsReadyFn = std::function<void(int64_t begin, int64_t end)>;

// What a fully sharded data-parallel wrapper (parallel/fsdp.h) hears from a model as it runs, per parameter unit
// (Model::param_units): before a unit's weights are read and after a forward is done with them, before a backward
// reads them (and writes the unit's gradients) and once it has finished the unit's gradients. Evaluation and
// sampling call the forward hooks too.
class ParamUnitHooks {
 public:
  virtual ~ParamUnitHooks() = default;
  virtual void before_forward(size_t unit) = 0;
  virtual void after_forward(size_t unit) = 0;
  virtual void before_backward(size_t unit) = 0;  // also before a recomputed forward inside backward
  virtual void after_backward(size_t unit) = 0;
  // Finer, from a layer whose few large weights make up most of its unit (a MoE layer's experts; an untied embedding,
  // which backward does not read), inside backward: after the last read of `weights` (a view of the unit's compute
  // weights) and before the first write of `grads` (a view of its gradients). A holder that frees and allocates buffers
  // as the step goes uses them (parallel/unit_residency.h); the rest ignore them.
  virtual void weights_read(const Tensor& /*weights*/) {}
  virtual void grads_to_write(const Tensor& /*grads*/) {}
};

// Storage for a model's modules given from outside, in pieces that tile the flat buffers in order: piece i holds
// ranges[i] as compute weights [>= n_i] in the compute dtype and fp32 gradients [>= n_i], where n_i is the range's
// size (its first n_i elements are the range's, laid out as in the flat buffers). A parameter lies within one
// piece. Fully sharded data parallelism gives one piece per parameter unit; a single rank's residency
// (parallel/unit_residency.h) cuts the experts' weights out of their units.
struct UnitBuffers {
  std::vector<FlatRange> ranges;
  std::vector<Tensor> compute;
  std::vector<Tensor> grads;
};

// The part of a parameter a tensor-parallel rank holds: along `dim`, shape[dim] of the whole tensor's `whole`
// entries, from `offset`. dim < 0: the whole tensor, the same on every tensor-parallel rank (norm weights).
// replica: key/value heads replicated because there are fewer than tensor-parallel ranks: this rank's place among
// the ranks that hold the same slice. Only replica 0 writes it into checkpoints and counts it in the gradient norm.
struct ParamSlice {
  int dim = -1;
  int64_t offset = 0;
  int64_t whole = 0;
  int replica = 0;
  bool sliced() const { return dim >= 0; }
};

// Gradients that the ranks of a tensor-parallel group each hold part of, and that are summed over the group once a
// step, after the micro-batches' backwards (in one collective: parallel/tensor_parallel_grads.h):
//   - `group`: summed over the whole group: a replicated weight applied to each rank's own part of the work (q/k
//     norms over its heads; with sequence parallelism every norm over its rows);
//   - `shared`: key/value projections replicated over tp / num_query_groups ranks (their rows of one key/value
//     group, the same offsets on every rank), each rank's gradient from its own query heads: summed over the ranks
//     that hold the same group. `shared_slot` is this rank's group among `shared_slots`.
struct TensorParallelGradSums {
  std::vector<FlatRange> group;
  std::vector<FlatRange> shared;
  int shared_slot = 0;
  int shared_slots = 1;
  bool empty() const { return group.empty() && shared.empty(); }
};

struct ParamSpec {
  std::string name;
  Shape shape;                // this rank's part (the whole tensor unless sliced)
  ParamInit init = ParamInit::kNormal;
  double init_std = 0.02;     // for kNormal
  bool weight_decay = true;   // Megatron convention: no decay on 1-D tensors (norm weights, biases)
  ParamSlice slice;

  Shape whole_shape() const;
};

class ParamStore {
 public:
  ParamStore() = default;
  ParamStore(std::vector<ParamSpec> specs, Device device);

  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t numel() const { return total_; }
  const Tensor& flat_params() const { return params_; }
  const Tensor& flat_grads() const { return grads_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Named views; throw RuntimeError naming the parameter when unknown.
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  Tensor param(size_t i) const;
  Tensor grad(size_t i) const;
  int64_t offset(size_t i) const { return offsets_[i]; }
  // The position of a parameter in specs(); throws RuntimeError naming it when unknown.
  size_t index_of(const std::string& name) const;

  // Fills parameters from their specs with a random stream per parameter derived from `seed` and its name,
  // so a parameter's initial values do not depend on the others (adding a layer changes no other tensor).
  void initialize(uint64_t seed);
  void zero_grads();

 private:
  std::vector<ParamSpec> specs_;
  std::vector<int64_t> offsets_;
  std::map<std::string, size_t> index_;
  int64_t total_ = 0;
  Tensor params_;  // [total] f32
  Tensor grads_;   // [total] f32
};

}  // namespace primus
