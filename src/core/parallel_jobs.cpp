// run_parallel_jobs: an atomic job counter shared by the threads, the first exception kept under a mutex.
#include "core/parallel_jobs.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace primus {

int default_io_threads() {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cpus, 1, 8);
}

void run_parallel_jobs(size_t count, int threads, const std::function<void(size_t)>& job,
                       const std::function<void()>& tick, std::chrono::milliseconds tick_interval) {
  if (count == 0) {
    if (tick) tick();
    return;
  }
  const size_t workers = std::min(count, static_cast<size_t>(threads > 0 ? threads : default_io_threads()));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex mutex;
  std::condition_variable all_done;
  size_t running = workers;

  auto work = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) break;
      try {
        job(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = std::current_exception();
        failed.store(true);
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (--running == 0) all_done.notify_all();
  };

  // Records a failure outside the jobs (a thread that cannot start, a tick that throws): the jobs stop starting.
  auto fail = [&](std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!first_error) first_error = error;
    failed.store(true);
  };
  std::vector<std::thread> pool;
  pool.reserve(workers);
  for (size_t t = 0; t < workers; ++t) {
    try {
      pool.emplace_back(work);
    } catch (...) {
      fail(std::current_exception());
      std::lock_guard<std::mutex> lock(mutex);
      running -= workers - t;
      break;
    }
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    while (running > 0) {
      if (all_done.wait_for(lock, tick_interval, [&] { return running == 0; })) break;
      if (tick && !failed.load()) {
        lock.unlock();
        try {
          tick();
        } catch (...) {
          fail(std::current_exception());
        }
        lock.lock();
      }
    }
  }
  for (std::thread& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
  if (tick) tick();
}

void PieceReporter::finished(uint64_t bytes) {
  if (!on_bytes_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back(bytes);
}

void PieceReporter::operator()() {
  std::vector<uint64_t> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done.swap(pending_);
  }
  for (uint64_t bytes : done) on_bytes_(bytes);
}

}  // namespace primus
