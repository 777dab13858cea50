// Ranks as forked processes, for tests that need several real processes: each child runs a body and reports an
// exit status and a message on a pipe; the parent waits with a deadline and ends every child on every path.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace primus::testing {

struct RankResult {
  int status = -1;      // exit code; 1000 + signal when killed; -1 when it ran past the deadline
  std::string message;  // what the body returned or, with status 1, the exception's message
};

// Forks `size` children running body(rank) and waits for them all. Fork before the test process starts any
// thread (a child inherits only the forking one). A body that returns exits with 0, or with
// `status_if_message` when it returned a non-empty message; one that throws exits with 1. A child never
// returns into the test binary (it _exit()s: no atexit handlers, no gtest teardown) and dies with the test
// process; ranks still running at `limit` are killed, and if a fork fails those already started are killed
// before the error is thrown, so no rank outlives the call.
std::vector<RankResult> run_ranks(int size, std::chrono::seconds limit,
                                  const std::function<std::string(int rank)>& body, int status_if_message = 0);

}  // namespace primus::testing
