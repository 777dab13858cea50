// Sharded checkpoints of data-parallel runs: every rank writes the slices of the flat buffers it owns, rank 0
// writes the index and commits. Layout-free (docs PARALLEL.md): the files describe logical tensors by their
// Hugging Face names, so load_checkpoint (checkpoint.h) reads them back into any number of ranks.
//
//   <save>/iter_0000100/shard_<r>_of_<n>.safetensors  rank r's slices, 1-D F32 tensors: `<name>`, `exp_avg.<name>`,
//                                                     `exp_avg_sq.<name>` (`<name>@<first element>` when the
//                                                     rank holds several slices of one tensor)
//                       index.json                    logical tensor -> its slices: {file, key, shape (the whole
//                                                     tensor's), slice [begin, end) of its flattened elements,
//                                                     dtype}
//                       trainer_state.json, config.yaml, config.json, manifest.json   as in checkpoint.h
//
// The save, every rank of `group` calling it together:
//   1. rank 0 removes the temporaries of crashed saves and creates `<save>/iter_N.tmp` (a name every rank
//      derives from N, so none needs to be sent), then broadcasts that it is ready;
//   2. each rank writes and fsyncs its shard there and all_gathers a fixed-size record (status, bytes,
//      CRC32C, slice count), then the flat ranges of its slices; every rank checks that they tile [0, numel)
//      and that no rank failed, and all of them throw together if not (no rank waits for a timeout);
//   3. rank 0 writes index.json, trainer_state.json, config.yaml, config.json and the manifest last, renames
//      the directory into place and replaces the tracker, then broadcasts the outcome; no rank returns
//      before the commit.
// A crash at any point leaves the previous checkpoint as the latest complete one and `iter_N.tmp` behind,
// which the next save removes. The save directory must be one filesystem that every rank sees.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "ops/param_store.h"
#include "parallel/communicator.h"

namespace primus {

// "shard_0_of_4.safetensors"
std::string shard_file_name(int rank, int size);

// Every rank of `group` calls it with its own `ranges` of the flat parameter buffer: disjoint across the
// ranks and together [0, numel). The optimizer must own the ranges (its distributed-optimizer shards) or
// everything (replicated); weights come from the model's flat buffer. Weights and moments on a device are
// copied to the host slice by slice as the shard is written. A group of one writes the single-file format
// (save_checkpoint). Returns the bytes of all shards together (the same on every rank). Throws RuntimeError on
// every rank when any rank failed; the previous checkpoint stays the latest.
int64_t save_sharded_checkpoint(const std::string& save_dir, const Model& model, const AdamW& optimizer,
                                const std::vector<FlatRange>& ranges, Communicator& group, const TrainerState& state,
                                const std::string& config_yaml, const CheckpointProgressFn& progress = {});

}  // namespace primus
