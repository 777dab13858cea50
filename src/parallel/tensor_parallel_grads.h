// The step-level reduction of the gradients a model leaves partial on each tensor-parallel rank
// (TensorParallelGradSums: q/k norms, every norm under sequence parallelism, replicated key/value projections).
// Summing them once per step, after the micro-batches' backwards, replaces a collective per layer per micro-batch;
// sums over the tensor-parallel group and over the data-parallel group commute, so it may run after the
// data-parallel reduction, on whatever part of the gradients this rank then holds.
#pragma once

#include <vector>

#include "ops/communicator.h"
#include "ops/param_store.h"

namespace primus {

// `held[i]` (ranges of the flat gradient buffer) lives in `held_grads[i]` (f32, held[i].size() elements): the whole
// buffer, or this rank's data-parallel shards. Every rank of `tp` must pass the same ranges (the ranks of a
// tensor-parallel group have the same parameter shapes and data-parallel coordinate, so they do). One all-reduce
// over `tp` of one packed buffer: the held parts of sums.group, then sums.shared_slots slots of the held parts of
// sums.shared, this rank's filled at sums.shared_slot and the others zero, so each slot sums over the ranks that
// share that key/value group only.
void sum_tensor_parallel_grads(Communicator& tp, const TensorParallelGradSums& sums,
                               const std::vector<FlatRange>& held, const std::vector<Tensor>& held_grads);

}  // namespace primus
