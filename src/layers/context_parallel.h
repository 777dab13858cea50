// Context parallelism: a sequence split over the ranks of the cp group, and ring attention over that group (the
// layer-level object the parallel code hands the model, as TensorParallelGroup for tensor parallelism).
//
// The split (load-balanced for the causal mask). A sequence of T tokens is cut into 2·cp chunks of C = T / (2·cp)
// tokens; rank r holds chunks r and 2·cp − 1 − r, so every rank has as many query-key pairs under the causal mask
// as any other. A rank's tokens of a micro-batch of B sequences are laid out chunk-major: chunk r of every sequence,
// then chunk 2·cp − 1 − r of every sequence, i.e. [2, B, C] = 2B rows of C tokens. Everything but attention works
// token by token, so the model runs on those 2B rows as it would on 2B sequences, with each token's position in its
// sequence for RoPE (positions()); attention sees the two halves as contiguous [B, C, H, D] blocks.
//
// The ring. Rank r's keys and values go around the ring (rank r sends to r + 1 and receives from r − 1), so at step
// s = 0 .. cp − 1 rank r holds those of rank src = r − s (mod cp), and attends to them by the causal mask:
//   s = 0 (its own):  half 0 against key half 0, causal; half 1 against key half 0 (all), then key half 1, causal;
//   src < r:          both query halves against the source's key half 0 (its chunk src lies before both);
//   src > r:          query half 1 against both source halves (query chunk r lies before both, chunk 2cp−1−r after).
// Every step is two blocks of C × C (the first three of which two are half causal): the same work on every rank at
// every step. Block results (out, lse) merge through their log-sum-exps (ops::attention_merge). While a step
// computes, the next step's keys and values are already on their way: the exchange runs on the device's
// communication stream, or on CPU ranks on a thread of its own (Gloo is blocking).
//
// Backward goes around the ring once more with the keys and values, and with the accumulated gradients dK, dV of the
// block each rank holds: at step s rank r adds the contributions of its queries (ops::attention_block_backward from
// the merged out and lse: exact) to the accumulator of src's keys and values and passes it on; after cp steps and
// one more exchange each accumulator is back with its owner, holding every rank's contributions. The accumulator a
// rank receives is needed only after that step's blocks are computed, so its exchange overlaps them too.
//
// Precision: merges and accumulations are in the activation dtype (bf16 on the GPU in mixed precision: one rounding
// per ring step, as each block's own output is rounded), the math inside each op in fp32.
#pragma once

#include <memory>

#include "core/tensor.h"
#include "ops/communicator.h"

namespace primus {

class ContextParallelGroup {
 public:
  // One rank: no split, no ring.
  ContextParallelGroup() = default;
  // Over the ranks of `comm` (the cp group, or a split of it), in its rank order. The ring's exchanges run beside the
  // caller's thread (CPU ranks) or on the device's communication stream, so `comm` must be one that nothing else
  // uses while a ring attention runs: give it a split of its own (ProcessGroups may share one communicator between
  // kinds of groups with the same ranks).
  explicit ContextParallelGroup(std::shared_ptr<Communicator> comm);

  int size() const { return comm_ ? comm_->size() : 1; }
  int rank() const { return comm_ ? comm_->rank() : 0; }

  // The chunk (of the 2·size() chunks of a sequence) of this rank's half 0 or 1: rank, 2·size − 1 − rank.
  int64_t chunk(int half) const { return half == 0 ? rank() : 2 * size() - 1 - rank(); }
  // This rank's chunks of host sequences [B, T] (i32; T a multiple of 2·size()): [2B, T / (2·size())], chunk-major.
  Tensor local_chunks(const Tensor& sequences) const;
  // The position in its sequence of each token of local_chunks for B sequences of chunk_length × 2·size() tokens:
  // host [2B, chunk_length] i32.
  Tensor positions(int64_t batch, int64_t chunk_length) const;

  // Causal attention of this rank's queries over the whole sequences (every rank calls it together): q [2B, C, Hq, D],
  // k, v [2B, C, Hkv, D] this rank's chunks (chunk-major, as local_chunks) -> out [2B, C, Hq, D] and lse
  // [2B, Hq, C] (f32), equal to the rows of a one-rank attention_forward over the sequences.
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse) const;
  // Its backward: dq, dk, dv (overwritten) of this rank's chunks, from dout and the forward's out and lse.
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) const;

 private:
  struct Ring;  // the exchanges in flight (context_parallel.cpp)
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<Ring> ring_;
};

}  // namespace primus
