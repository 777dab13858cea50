// `primus-cli benchmark checkpoint`: how fast a checkpoint of a given size is saved and loaded here, through the
// real save and load paths (save_checkpoint, load_checkpoint: the single-file format, CRC32C verification and all).
//
// A Llama-shaped model (untied embeddings, hidden size and layers chosen so that weights and both AdamW moments
// take about the asked size) gets random weights and moments, is saved, zeroed and loaded back twice: warm (the
// files still in the page cache, as right after a save) and cold (the files dropped from the page cache with
// posix_fadvise(DONTNEED) first; the result says how much of them stayed resident, since a kernel may keep pages
// it was asked to drop). Each load must give back the saved bytes (CRC32C of weights and moments), else
// RuntimeError.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace primus {

struct CheckpointBenchmarkOptions {
  double size_gb = 1.0;   // weights + moments, 1e9 bytes
  std::string dir;        // the checkpoint goes into <dir>/checkpoint-benchmark-<pid>, removed afterwards
  int threads = 0;        // I/O threads (0: the default, min(8, CPUs))
  Device device = kCpuDevice;
  bool keep = false;      // leave the checkpoint on disk
};

struct CheckpointLoadTime {
  double verify_s = 0;  // the CRC32C pass over every file
  double read_s = 0;    // bytes into the tensors
  double total_s() const { return verify_s + read_s; }
};

struct CheckpointBenchmarkResult {
  std::string device;
  std::string shape;          // "hidden 2048, 14 layers, ffn 8192, vocab 65536"
  int64_t parameters = 0;
  int64_t bytes = 0;          // the data files (model.safetensors + optimizer.safetensors)
  int threads = 0;
  std::string crc32c;         // "sse4.2" or "software"
  double save_s = 0;          // write, fsync, rename, tracker
  CheckpointLoadTime warm;
  bool cold_measured = false;
  double resident_after_drop = 0;  // fraction of the files' pages still cached after the drop
  CheckpointLoadTime cold;
  std::string kept_dir;       // with keep: where the checkpoint is
};

// UsageError for a size or thread count out of range; RuntimeError for I/O failures and a load that does not give
// the saved bytes back.
CheckpointBenchmarkResult run_checkpoint_benchmark(const CheckpointBenchmarkOptions& options);

// A table for people, and one JSON object for scripts.
std::string format_checkpoint_benchmark(const CheckpointBenchmarkResult& result);
std::string checkpoint_benchmark_json(const CheckpointBenchmarkResult& result);

}  // namespace primus
