// Sharded checkpoints of multi-rank runs: every rank writes the pieces of the tensors it holds, rank 0 writes the
// index and commits. Layout-free (docs/parallel.md): the files describe logical tensors by their Hugging Face names
// in the whole tensor's coordinates, so load_checkpoint (checkpoint.h) reads them back into any layout: any number
// of data-parallel ranks, with or without the distributed optimizer or FSDP, any tensor-parallel size, one process.
//
//   <save>/iter_0000100/shard_<r>_of_<n>.safetensors  rank r's pieces, 1-D F32 tensors: `<name>`, `exp_avg.<name>`,
//                                                     `exp_avg_sq.<name>` (`<name>@<begin>` when the
//                                                     rank holds several pieces of one tensor); n is the world
//                       index.json                    logical tensor -> its pieces: {file, key, shape (the whole
//                                                     tensor's), box (optional), slice [begin, end), dtype}
//                       trainer_state.json, config.yaml, config.json, manifest.json   as in checkpoint.h
// A piece is elements [begin, end) of a box of the tensor, numbered row-major over the box (tensor_box.h). The box
// is {"offset": [...], "shape": [...]} per dimension: a tensor-parallel rank's part of a sliced parameter (rows
// [o, o + r) of a column-parallel weight: offset [o, 0], shape [r, C]; columns of a row-parallel one: offset
// [0, o], shape [R, c]). Without "box" the piece is a flat range of the whole tensor, as every slice of a
// checkpoint from before tensor parallelism is (format_version 1; with boxes 2, checkpoint_dir.h). A
// data-parallel rank's shard of its part is such a range of its box, which may start and end inside a row. A
// parameter every tensor-parallel rank holds whole (a norm weight) is written by tensor-parallel rank 0 only
// (the caller leaves it out of the other ranks' ranges).
//
// The save, every rank of `group` (the whole job) calling each step together:
//   1. every rank tells the others how many elements it will write; rank 0 removes the temporaries of crashed
//      saves, checks the free space for all of them and creates `<save>/iter_N.tmp` (a name every rank derives
//      from N, so none needs to be sent), then broadcasts that it is ready;
//   2. each rank writes and fsyncs its shard there; this step exchanges nothing, so it may run on a background
//      thread while training goes on (async_save) from a host snapshot of the state (checkpoint_snapshot.h);
//   3. each rank all_gathers a fixed-size record (status, bytes, CRC32C, size of its description), then the
//      description of its pieces (tensor name, whole shape, box, range, key). Every rank checks, per logical
//      tensor, that the ranks agree on its shape and that their pieces hold every element exactly once
//      (coverage_flaw: a rank that holds only some tensors, a pipeline stage, fits the same check), that every
//      tensor of its own model is among them, and that no rank failed; all of them throw together if not (no rank
//      waits for a timeout). Rank 0 writes index.json, trainer_state.json, config.yaml, config.json and the
//      manifest last, renames the directory into place and replaces the tracker, then broadcasts the outcome; no
//      rank returns before the commit. A failed save's temporary directory is removed.
// A crash at any point leaves the previous checkpoint as the latest complete one and `iter_N.tmp` behind,
// which the next save (and the next run's start) removes. The save directory must be one filesystem that every
// rank sees. A group of one writes the single-file format (checkpoint.h) in the same three steps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/tensor_box.h"
#include "ops/param_store.h"
#include "ops/communicator.h"

namespace primus {

// The part of the whole tensor that `spec` describes: its tensor-parallel slice, or the whole tensor.
TensorBox param_box(const ParamSpec& spec);

// Where a save reads the trained state: flat elements [begin, end) of the fp32 weights or of the first or second
// AdamW moment, as 1-D f32 views on any device that hold them in order.
struct SavedState {
  std::function<std::vector<Tensor>(int64_t begin, int64_t end)> weights;
  std::function<std::vector<Tensor>(bool second, int64_t begin, int64_t end)> moments;
};
// The live state: weights from the model's flat buffer (or the optimizer's shards when it holds them), moments
// from the optimizer.
SavedState live_state(const ParamStore& params, const AdamW& optimizer);

// One save of one iteration, in the three steps above.
class CheckpointSave {
 public:
  // Step 1, every rank of `group` together (null: a process alone). `ranges` are the parts of this rank's flat
  // parameter buffer it writes: together, over the ranks, every element of every tensor once (finish() checks).
  // Throws RuntimeError on every rank when rank 0 could not prepare (no room, say).
  CheckpointSave(std::string save_dir, const Model& model, std::vector<FlatRange> ranges, Communicator* group,
                 TrainerState state, std::string config_yaml);
  // Step 2, this rank alone, on any thread: its files from `source`, which must hold its ranges; a device's
  // tensors are copied to the host slice by slice as they are written. A failure is kept for finish().
  void write(const SavedState& source, const CheckpointProgressFn& progress = {}, const CheckpointIo& io = {});
  // Step 3, every rank together. Returns the bytes of all data files together (the same on every rank).
  // Throws RuntimeError on every rank when any rank failed; the previous checkpoint stays the latest.
  int64_t finish();

  const std::string& checkpoint_dir() const { return final_dir_; }
  const TrainerState& state() const { return state_; }

 private:
  std::string save_dir_;
  std::string final_dir_;
  std::string tmp_dir_;
  const Model& model_;
  std::vector<FlatRange> pieces_;  // this rank's ranges cut at tensor boundaries
  Communicator* group_;
  TrainerState state_;
  std::string config_yaml_;
  // What write() did, for finish().
  bool written_ok_ = false;
  std::string write_error_;
  struct DataFile {
    std::string name;
    uint64_t bytes = 0;
    uint32_t crc32c = 0;
  };
  std::vector<DataFile> written_;
};

// The three steps at once, from the live state (group: the job's ranks; a group of one writes the single-file
// format). The optimizer must own this rank's `ranges` (its distributed-optimizer shards) or everything
// (replicated). Returns the bytes of all shards together.
int64_t save_sharded_checkpoint(const std::string& save_dir, const Model& model, const AdamW& optimizer,
                                const std::vector<FlatRange>& ranges, Communicator& group, const TrainerState& state,
                                const std::string& config_yaml, const CheckpointProgressFn& progress = {});

}  // namespace primus
