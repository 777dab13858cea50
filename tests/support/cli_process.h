// Running the built primus-cli binary from tests: <build>/tests/NAME_test -> <build>/primus-cli.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace primus::testing {

struct CliResult {
  int exit_code = -1;  // the exit status, or 1000 + signal number when killed
  std::string out;
  std::string err;
};

std::filesystem::path cli_path();
// Starts primus-cli with `args`; stdout and stderr go to `dir`/stdout and `dir`/stderr. Returns the pid.
pid_t spawn_cli(const std::vector<std::string>& args, const std::string& dir);
// Waits for the child and collects its exit code and output.
CliResult wait_cli(pid_t pid, const std::string& dir);
std::string read_text(const std::filesystem::path& path);

// The example configs' data (scripts/prepare_default_data.sh: GPT-2's tokenizer from its npm package, Debian's
// fortunes as an indexed dataset), prepared once in <build>/tests/default_data and pointed to by
// PRIMUS_DEFAULT_DATA, which configs/examples/*.yaml read. Empty when the script failed (its output is on stderr).
std::string use_default_data();

}  // namespace primus::testing
