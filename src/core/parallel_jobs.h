// A small pool for I/O-bound work: job(i) for every i in [0, count) on a few threads, the first failure kept and
// rethrown on the calling thread with its type (a UsageError stays one, so main's exit code is the job's).
//
// Threads are started per call and joined before it returns: the jobs here are large (a 16 MiB read or write, a
// 64 MiB checksum), so a thread's start-up is noise, and no pool outlives the operation that needed it. The
// calling thread only waits, waking every `tick_interval` to run `tick` (progress bars are drawn there, on the
// thread that owns them).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <vector>

namespace primus {

// Threads for checkpoint reads and writes when none are asked for: min(8, the CPUs this process may use). More
// than 8 gained nothing on the H200's NVMe disks and would only contend with the training's own threads.
int default_io_threads();

// Runs job(0) .. job(count - 1), each once, on min(threads, count) threads (threads <= 0: default_io_threads()).
// After a job throws no further job starts (those running finish), and the first exception is rethrown here;
// a job should name its file or item in what it throws. `tick` (optional) runs on the calling thread every
// tick_interval while jobs run, and once at the end when all succeeded.
void run_parallel_jobs(size_t count, int threads, const std::function<void(size_t)>& job,
                       const std::function<void()>& tick = {},
                       std::chrono::milliseconds tick_interval = std::chrono::milliseconds(100));

// Progress of jobs that move bytes: workers say when a piece is done (finished, any thread); as run_parallel_jobs'
// tick (the calling thread) it hands each piece done since the last tick to `on_bytes`, one call a piece, in the
// order they finished. One call a piece keeps progress reports as fine as a loop over the pieces would make them.
class PieceReporter {
 public:
  explicit PieceReporter(std::function<void(uint64_t bytes)> on_bytes) : on_bytes_(std::move(on_bytes)) {}
  void finished(uint64_t bytes);
  void operator()();

 private:
  std::function<void(uint64_t)> on_bytes_;
  std::mutex mutex_;
  std::vector<uint64_t> pending_;
};

}  // namespace primus
