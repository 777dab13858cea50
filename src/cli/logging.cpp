// Logging setup for primus-cli: the default spdlog logger writes to stderr (stdout stays clean for command
// output such as `config show`), and with --log-file also to a file. Errors that end the process are
// written to both, so a log file records why a run stopped.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <mutex>

#include "cli/cli.h"
#include "observe/progress.h"

namespace primus::cli {
namespace {

std::shared_ptr<spdlog::logger> g_file_logger;  // writes only to the --log-file file; null without one

std::mutex g_log_failure_mutex;
std::string g_log_failure;  // the first failed log write; empty while none failed
int64_t g_log_failures = 0;

}  // namespace

void record_log_write_failure(const std::string& message) {
  const std::lock_guard<std::mutex> lock(g_log_failure_mutex);
  if (g_log_failures++ > 0) return;
  g_log_failure = message;
  // Straight to stderr: the logger is what failed.
  std::fprintf(stderr, "primus-cli: error: writing the log failed: %s; lines may be missing from it\n", message.c_str());
  std::fflush(stderr);
}

int exit_code_after_logging(int code) {
  const std::lock_guard<std::mutex> lock(g_log_failure_mutex);
  if (code != kExitOk || g_log_failures == 0) return code;
  std::fprintf(stderr,
               "primus-cli: error: the command finished, but %lld log write(s) failed (the first: %s): the log is "
               "incomplete\n",
               static_cast<long long>(g_log_failures), g_log_failure.c_str());
  std::fflush(stderr);
  return kExitRuntime;
}

void setup_logging(bool debug, const std::string& log_file) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  console->set_pattern("[%H:%M:%S] [%^%l%$] %v");
  // The guard first: it erases a progress bar on the terminal before the console sink writes the line.
  std::vector<spdlog::sink_ptr> sinks{make_progress_log_guard(), console};
  if (!log_file.empty()) {
    std::filesystem::path path(log_file);
    std::error_code error;
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), error);
    if (error) {
      throw UsageError(fmt::format("--log-file {}: cannot create folder {}: {}", log_file, path.parent_path().string(),
                                   error.message()));
    }
    std::shared_ptr<spdlog::sinks::basic_file_sink_mt> file;
    try {
      file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_file, /*truncate=*/false);
    } catch (const spdlog::spdlog_ex& e) {
      throw UsageError(fmt::format("--log-file {}: cannot open: {}", log_file, e.what()));
    }
    file->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    sinks.push_back(file);
    g_file_logger = std::make_shared<spdlog::logger>("primus-cli-file", file);
    g_file_logger->flush_on(spdlog::level::trace);
    g_file_logger->set_error_handler(record_log_write_failure);
  }
  auto logger = std::make_shared<spdlog::logger>("primus", sinks.begin(), sinks.end());
  spdlog::level::level_enum level = debug ? spdlog::level::debug : spdlog::level::info;
  logger->set_level(level);
  // Flush every line when a file is attached: a run killed hard still leaves a complete log.
  logger->flush_on(log_file.empty() ? spdlog::level::warn : spdlog::level::trace);
  // spdlog's own handler prints a note and goes on, and the command would then succeed without its log.
  logger->set_error_handler(record_log_write_failure);
  spdlog::set_default_logger(logger);
  spdlog::set_level(level);
}

void report_error(const std::string& message) {
  clear_progress_line();
  std::fprintf(stderr, "primus-cli: error: %s\n", message.c_str());
  std::fflush(stderr);
  if (g_file_logger) g_file_logger->error("primus-cli: error: {}", message);
}

}  // namespace primus::cli
