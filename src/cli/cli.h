// Shared pieces of primus-cli: the launcher options parsed before `--`, and the hooks through which each
// commands_*.cpp file registers its subcommands. main.cpp only calls run_cli.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "core/error.h"

namespace primus {
struct LoadedConfig;
}

namespace primus::cli {

// A mode or command that the original Primus has and this one does not yet: exit 2, without a usage hint.
class NotImplementedError : public UsageError {
 public:
  using UsageError::UsageError;
};

// What a command's dry run found. Container mode runs the command's dry run on this machine before it starts
// a container (validating the command and its config early, and learning the run directory to mount); the
// dry run then records here, and prints its report only when `print` is set (a --dry-run of the container).
struct CommandPlan {
  std::string config_path;                 // empty: the command takes no experiment config
  std::optional<ExperimentConfig> config;  // the loaded config, when there is one
  bool print = true;
};

// Everything given before `--`: global flags and the launch mode with its flags.
struct LaunchOptions {
  std::string mode = "direct";  // direct | container | slurm srun | slurm sbatch | slurm node
  bool dry_run = false;
  bool debug = false;
  std::string log_file;                    // direct mode: tee log output here too; empty: console only
  std::vector<std::string> command_words;  // the command after `--`, for the dry-run report
  CommandPlan* plan = nullptr;             // set by container mode: print_dry_run records into it
};

// The work a parsed command will do, run after parsing so that parse errors and command errors stay apart.
using Action = std::function<int()>;

// Each registers one top-level command under `root`; a leaf's callback stores its work in `action`.
void add_train_commands(CLI::App& root, const LaunchOptions& launch, Action& action);
void add_config_commands(CLI::App& root, const LaunchOptions& launch, Action& action);
void add_data_commands(CLI::App& root, const LaunchOptions& launch, Action& action);
void add_benchmark_commands(CLI::App& root, const LaunchOptions& launch, Action& action);
void add_report_commands(CLI::App& root, const LaunchOptions& launch, Action& action);
void add_checkpoint_commands(CLI::App& root, const LaunchOptions& launch, Action& action);
void add_preflight_commands(CLI::App& root, const LaunchOptions& launch, Action& action);
void add_projection_commands(CLI::App& root, const LaunchOptions& launch, Action& action);

// Turns the free arguments of a command into "key=value" overrides. Accepts key=value, --key=value,
// --key value and a bare --flag (meaning flag=true); throws UsageError on anything else.
std::vector<std::string> normalize_overrides(const std::vector<std::string>& args);

// Prints what a command would do under --dry-run: mode, command, config and overrides, and for a loaded
// config (training) the run directory and the main settings. `loaded` may be null (no config involved).
void print_dry_run(const LaunchOptions& launch, const std::string& config_path,
                   const std::vector<std::string>& overrides, const LoadedConfig* loaded);

// Console logging (stderr) plus, when log_file is not empty, a copy in log_file (parent folders created).
void setup_logging(bool debug, const std::string& log_file);

// Prints one "primus-cli: error: ..." line to stderr (and into the log file when one is open).
void report_error(const std::string& message);

// A log write that failed (a full disk under --log-file or the run's logs/train.log): the first is reported on
// stderr at once, and a command that otherwise succeeded then exits 3, because its log is incomplete.
void record_log_write_failure(const std::string& message);
// The command's exit code, turned into 3 (with the reason) when a log write failed during a successful command.
int exit_code_after_logging(int code);

// Parses argv, runs the command and returns the process exit code (0, 1 preflight checks failed, 2 usage, 3 runtime,
// 128+N signal).
int run_cli(int argc, char** argv);

}  // namespace primus::cli
