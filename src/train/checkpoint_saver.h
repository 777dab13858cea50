// The trainer's checkpoint saves (sharded_checkpoint.h's three steps), synchronous or asynchronous
// (Megatron's async_save):
//   synchronous    every step of the save runs in save(), which returns once the checkpoint is committed;
//   asynchronous   save() copies the rank's state into pinned host memory (the only time training waits) and
//                  starts a thread that writes the files; at each later step poll() asks every rank whether its
//                  files are written and, once all are, commits on the training thread (the commit's collectives
//                  never run beside training's). A save in flight is finished before the next one starts and by
//                  wait() at the end of the run. A run that dies before the commit leaves the previous checkpoint
//                  as the latest and a temporary the next run removes.
// After each commit the retention policy removes old checkpoints (rank 0).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_snapshot.h"
#include "checkpoint/retention.h"
#include "parallel/data_parallel.h"

namespace primus {

struct CheckpointSaverOptions {
  std::string save_dir;
  std::string config_yaml;  // the effective experiment config, saved beside the weights
  bool async_save = false;
  RetentionPolicy retention;
  CheckpointProgressFn progress;  // bars for synchronous saves (a background write draws none)
};

class CheckpointSaver {
 public:
  CheckpointSaver(const Model& model, const AdamW& optimizer, DataParallel& dp, CheckpointSaverOptions options);
  // A write still in flight is waited for but not committed (the run is failing).
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Every rank at the same step. Waits for a save in flight first. Throws RuntimeError (every rank) when a save
  // fails; the previous checkpoint stays the latest.
  void save(const TrainerState& state);
  // Every rank after each step: commits the save in flight once every rank has written its files.
  void poll();
  // Every rank: the save in flight, if any, written and committed.
  void wait();

 private:
  struct InFlight;
  void commit();

  const Model& model_;
  const AdamW& optimizer_;
  DataParallel& dp_;
  CheckpointSaverOptions options_;
  CheckpointSnapshot snapshot_;
  std::unique_ptr<InFlight> in_flight_;
};

}  // namespace primus
