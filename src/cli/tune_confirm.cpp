#include "cli/tune_confirm.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"

extern char** environ;

namespace primus::cli {

namespace {

namespace fs = std::filesystem;

// The last line of `text` that starts with `prefix` (the JSON line of `benchmark train`, an error line), or "".
std::string last_line_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string found;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) found = line;
  }
  return found;
}

}  // namespace

ConfirmRun confirm_layout(const std::string& config_path, const std::vector<std::string>& overrides, int ranks,
                          int warmup_steps, int timed_steps) {
  std::vector<std::string> args = {"primus-cli"};
  if (ranks > 1) args.insert(args.end(), {"direct", "--nproc-per-node", std::to_string(ranks)});
  args.insert(args.end(), {"--", "benchmark", "train", "--config", config_path, "--warmup",
                           std::to_string(warmup_steps), "--steps", std::to_string(timed_steps)});
  args.insert(args.end(), overrides.begin(), overrides.end());

  // The child's output goes to files: the JSON line from stdout, the reason of a failure from stderr.
  char dir_template[] = "/tmp/primus-tune-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) throw RuntimeError("[tune] cannot make a temporary directory in /tmp");
  const fs::path dir = dir_template;
  const std::string out_path = (dir / "stdout").string(), err_path = (dir / "stderr").string();
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&files, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, "/proc/self/exe", &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  if (spawned != 0) {
    fs::remove_all(dir);
    throw RuntimeError(fmt::format("[tune] cannot start `benchmark train`: {}", std::strerror(spawned)));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const std::string out = read_file(out_path), err = read_file(err_path);
  fs::remove_all(dir);

  ConfirmRun run;
  const std::string json_line = last_line_starting(out, "{");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !json_line.empty()) {
    const nlohmann::json j = nlohmann::json::parse(json_line, nullptr, false);
    if (!j.is_discarded() && j.contains("tokens_per_s") && j.contains("world_size") && j.contains("step_ms")) {
      run.ok = true;
      run.tokens_per_s_per_gpu = j["tokens_per_s"].get<double>() / std::max(1, j["world_size"].get<int>());
      run.step_ms = j["step_ms"].get<double>();
      return run;
    }
  }
  std::string last = last_line_starting(err, "primus-cli: error");
  if (last.empty()) last = last_line_starting(err, "");
  run.failure = fmt::format("{}: {}",
                            WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status))
                                              : fmt::format("signal {}", WTERMSIG(status)),
                            last.empty() ? "no output" : last);
  return run;
}

}  // namespace primus::cli
