#include "support/cli_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

extern char** environ;

namespace primus::testing {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string use_default_data() {
  const fs::path dir = fs::canonical("/proc/self/exe").parent_path() / "default_data";
  const std::string command = "PRIMUS_CLI='" + cli_path().string() + "' bash '" PRIMUS_SOURCE_DIR
                              "/scripts/prepare_default_data.sh' '" + dir.string() + "' >&2";
  if (std::system(command.c_str()) != 0) return "";
  setenv("PRIMUS_DEFAULT_DATA", dir.c_str(), 1);
  return dir.string();
}

fs::path cli_path() { return fs::canonical("/proc/self/exe").parent_path().parent_path() / "primus-cli"; }

pid_t spawn_cli(const std::vector<std::string>& args, const std::string& dir) {
  std::string binary = cli_path().string();
  std::vector<char*> argv{binary.data()};
  std::vector<std::string> copies(args);
  for (std::string& arg : copies) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir + "/stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (dir + "/stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid = -1;
  int status = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(status, 0) << "cannot start " << binary;
  return pid;
}

CliResult wait_cli(pid_t pid, const std::string& dir) {
  CliResult result;
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid) {
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
  }
  result.out = read_text(dir + "/stdout");
  result.err = read_text(dir + "/stderr");
  return result;
}

}  // namespace primus::testing
