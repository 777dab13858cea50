// Errors and exit codes. Library code throws; only main() turns an Error into an exit code.
//   UsageError   -> exit 2: bad arguments, config, or user input (files named by the user).
//   RuntimeError -> exit 3: failures while running (corrupt checkpoint, I/O error, broken invariant);
//                   OutOfMemoryError is one, for a device allocation that did not fit.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace primus {

enum ExitCode : int {
  kExitOk = 0,
  kExitChecksFailed = 1,
  kExitUsage = 2,
  kExitRuntime = 3,
};

class Error : public std::runtime_error {
 public:
  Error(int exit_code, const std::string& message) : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Bad input from the user: arguments, config files, data paths. Exit code 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(kExitUsage, message) {}
};

// A failure while running: I/O, corrupt files, broken invariants. Exit code 3.
class RuntimeError : public Error {
 public:
  explicit RuntimeError(const std::string& message) : Error(kExitRuntime, message) {}
};

// A device allocation that failed for lack of memory (the CUDA caching allocator, a runtime call). Exit code 3.
// The trainer and `benchmark train` catch it and throw it again with their memory table and advice added.
class OutOfMemoryError : public RuntimeError {
 public:
  // device: "cuda:0", or "cuda" when unknown; requested_bytes: 0 when unknown.
  OutOfMemoryError(const std::string& message, std::string device, uint64_t requested_bytes)
      : RuntimeError(message), device_(std::move(device)), requested_bytes_(requested_bytes) {}
  const std::string& device() const { return device_; }
  uint64_t requested_bytes() const { return requested_bytes_; }

 private:
  std::string device_;
  uint64_t requested_bytes_;
};

[[noreturn]] void throw_check_failure(const char* expr, const char* file, int line, const std::string& message);

}  // namespace primus

// Invariant check that stays on in release builds. Throws RuntimeError naming the expression and place.
// Usage: PRIMUS_CHECK(a.numel() == b.numel(), "[op rmsnorm] x has {} elements, w {}", a.numel(), b.numel());
#define PRIMUS_CHECK(cond, ...)                                                           \
  do {                                                                                    \
    if (!(cond)) ::primus::throw_check_failure(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
