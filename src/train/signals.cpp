// SIGINT/SIGTERM handling for the trainer (see signals.h). The handler touches only a lock-free atomic and
// calls write/_exit, all async-signal-safe.
#include "train/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace primus {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the stop flag must be usable from a signal handler");

void write_stderr(const char* text) {
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void on_stop_signal(int signal_number) {
  int expected = 0;
  if (g_stop_signal.compare_exchange_strong(expected, signal_number)) {
    write_stderr(signal_number == SIGINT ? "\nprimus: SIGINT received" : "\nprimus: SIGTERM received");
    write_stderr(": stopping after the current step (send it again to exit now)\n");
    return;
  }
  write_stderr("\nprimus: second stop signal: exiting now\n");
  ::_exit(128 + signal_number);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a blocking read or write in the loop resumes instead of failing with EINTR; the loop polls the flag.
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

bool stop_requested() { return g_stop_signal.load(std::memory_order_relaxed) != 0; }

int stop_signal() { return g_stop_signal.load(std::memory_order_relaxed); }

void request_stop(int signal_number) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, signal_number);
}

void clear_stop_request() { g_stop_signal.store(0, std::memory_order_relaxed); }

}  // namespace primus
