// The I/O job pool: every job once on any number of threads, the first failure rethrown on the calling thread with
// its type and message (so the exit code and the file it names survive the thread), no new job after a failure,
// progress ticks on the calling thread.
#include "core/parallel_jobs.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"

namespace primus {
namespace {

TEST(ParallelJobs, RunsEveryJobOnceOnAnyNumberOfThreads) {
  for (int threads : {0, 1, 2, 3, 8, 64}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}}) {
      std::vector<std::atomic<int>> runs(count);
      run_parallel_jobs(count, threads, [&](size_t i) { runs[i].fetch_add(1); });
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(runs[i].load(), 1) << "job " << i << ", threads " << threads;
    }
  }
}

TEST(ParallelJobs, UsesSeveralThreadsAtOnce) {
  std::mutex mutex;
  std::set<std::thread::id> seen;
  std::atomic<int> inside{0}, most{0};
  run_parallel_jobs(16, 4, [&](size_t) {
    const int now = inside.fetch_add(1) + 1;
    int previous = most.load();
    while (now > previous && !most.compare_exchange_weak(previous, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    inside.fetch_sub(1);
    std::lock_guard<std::mutex> lock(mutex);
    seen.insert(std::this_thread::get_id());
  });
  EXPECT_GT(most.load(), 1);
  EXPECT_GT(seen.size(), 1u);
  EXPECT_EQ(seen.count(std::this_thread::get_id()), 0u);  // the calling thread waits and ticks
}

TEST(ParallelJobs, AWorkersErrorReachesTheCallerWithItsTypeAndFileName) {
  try {
    run_parallel_jobs(50, 4, [](size_t i) {
      if (i == 17) throw RuntimeError("/ckpt/iter_0000001/shard_3_of_8.safetensors: read at offset 4096: I/O error");
    });
    FAIL() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_EQ(e.exit_code(), kExitRuntime);
    EXPECT_NE(std::string(e.what()).find("shard_3_of_8.safetensors"), std::string::npos) << e.what();
  }
  try {
    run_parallel_jobs(8, 3, [](size_t i) {
      if (i == 2) throw UsageError("--dir /nowhere: not a folder");
    });
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    EXPECT_NE(std::string(e.what()).find("/nowhere"), std::string::npos);
  }
}

TEST(ParallelJobs, NoJobStartsAfterAFailure) {
  std::atomic<int> started{0};
  EXPECT_THROW(run_parallel_jobs(1000, 2,
                                 [&](size_t i) {
                                   started.fetch_add(1);
                                   if (i == 0) throw RuntimeError("first job fails");
                                   std::this_thread::sleep_for(std::chrono::milliseconds(5));
                                 }),
               RuntimeError);
  EXPECT_LT(started.load(), 10);
}

TEST(ParallelJobs, TicksOnTheCallingThreadWhileJobsRunAndOnceAtTheEnd) {
  const std::thread::id caller = std::this_thread::get_id();
  int ticks = 0;
  bool on_caller = true;
  run_parallel_jobs(
      4, 2, [](size_t) { std::this_thread::sleep_for(std::chrono::milliseconds(60)); },
      [&] {
        ++ticks;
        on_caller = on_caller && std::this_thread::get_id() == caller;
      },
      std::chrono::milliseconds(10));
  EXPECT_GE(ticks, 3);
  EXPECT_TRUE(on_caller);
}

TEST(ParallelJobs, ATickThatThrowsStopsTheJobsAndIsRethrown) {
  std::atomic<int> started{0};
  EXPECT_THROW(run_parallel_jobs(
                   1000, 2,
                   [&](size_t) {
                     started.fetch_add(1);
                     std::this_thread::sleep_for(std::chrono::milliseconds(5));
                   },
                   [] { throw RuntimeError("progress sink failed"); }, std::chrono::milliseconds(1)),
               RuntimeError);
  EXPECT_LT(started.load(), 1000);
}

TEST(ParallelJobs, DefaultThreadsAreBetweenOneAndEight) {
  EXPECT_GE(default_io_threads(), 1);
  EXPECT_LE(default_io_threads(), 8);
}

}  // namespace
}  // namespace primus
