// `primus-cli benchmark comm` (alias `nccl`): the bandwidth of the collectives the engine uses, over a world
// communicator, in the manner of nccl-tests. Every rank runs it; rank 0 prints a table and writes JSON lines.
//
// For each op and message size (min_bytes, then times step_factor up to max_bytes): warm-up iterations, then
// timed ones, with a barrier before each size; a rank's time is the mean of its timed iterations (on a GPU
// the device work included: the loop ends with a synchronize), and a row reports the slowest rank's time.
// Bandwidths are in GB/s (1e9 bytes/s) as nccl-tests prints them:
//   algbw = bytes / time; busbw = algbw × 2(n−1)/n (all_reduce), × (n−1)/n (reduce_scatter, all_gather,
//   all_to_all), × 1 (send_recv),
// where bytes is the per-rank buffer size of nccl-tests: all_reduce's buffer, reduce_scatter's input,
// all_gather's output, all_to_all's input, the message of send_recv. Sizes are rounded down to whole f32
// elements, and to a multiple of n elements where the op splits the buffer into n blocks.
// send_recv pairs ranks (0,1), (2,3), ...: the even rank sends, the odd one receives (a rank left without a
// partner idles); it needs two ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ops/communicator.h"

namespace primus {

struct CommBenchmarkOptions {
  int64_t min_bytes = 1024;
  int64_t max_bytes = int64_t{1} << 30;
  double step_factor = 2.0;
  int warmup = 5;
  int iters = 20;
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"};
};

struct CommBenchmarkRow {
  std::string op;
  int64_t bytes = 0;
  int64_t elements = 0;  // f32 elements of that buffer
  double time_us = 0.0;  // mean over the timed iterations, max over ranks
  double algbw_gbps = 0.0;
  double busbw_gbps = 0.0;
};

// The ops this benchmark knows, in its order.
const std::vector<std::string>& comm_benchmark_ops();
// "4096", "4K", "4KiB", "1M", "1G" (binary multiples, as nccl-tests reads them) -> bytes; UsageError naming
// `option` otherwise.
int64_t parse_byte_size(const std::string& text, const std::string& option);
// Checks sizes, factor, iterations and op names (aliases sendrecv, allreduce, ... accepted and normalised);
// throws UsageError naming the option.
void validate_comm_benchmark_options(CommBenchmarkOptions& options);

// Picks the device of a `--device cpu|cuda|auto` choice: auto is the GPU LOCAL_RANK when the build has CUDA
// and a device is visible, else the CPU. Starts the CUDA backend on the chosen GPU.
Device select_comm_device(const std::string& choice, int local_rank);

// Runs the sweep on every rank of `comm` (a collective: all ranks call it with the same options) over
// buffers on comm.device(). on_row (may be empty) is called on every rank as each row is complete.
std::vector<CommBenchmarkRow> run_comm_benchmark(Communicator& comm, const CommBenchmarkOptions& options,
                                                 const std::function<void(const CommBenchmarkRow&)>& on_row = {});

// The table for people: a title line naming backend, ranks, device and iterations, the column header, rows.
std::string comm_benchmark_title(const Communicator& comm, const CommBenchmarkOptions& options);
std::string comm_benchmark_header();
std::string comm_benchmark_table_row(const CommBenchmarkRow& row);
// One JSON object (no newline) for scripts: op, backend, device, world_size, dtype, bytes, elements, warmup,
// iters, time_us, algbw_gbps, busbw_gbps.
std::string comm_benchmark_json(const Communicator& comm, const CommBenchmarkOptions& options,
                                const CommBenchmarkRow& row);

}  // namespace primus
