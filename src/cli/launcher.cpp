// primus-cli argument handling: `primus-cli [global flags] [mode [mode flags]] -- <command> [args]`.
// The words before `--` go to the launcher parser (global flags, mode), the words after it to the command
// parser (train, config, data, benchmark, report). Two parsers rather than one because CLI11 treats `--` as
// "positionals follow", which would swallow the command. This file also owns the mapping from exceptions to
// exit codes, and hands a multi-process direct launch over to the worker pool (worker_pool.h) once the command
// has parsed, a container launch to container_mode.h once the command has been checked here, and a slurm launch
// to slurm_mode.h (srun/sbatch here; `slurm node` becomes a direct launch whose layout comes from Slurm's variables).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <optional>

#include "cli/cli.h"
#include "cli/container_mode.h"
#include "cli/launch_layout.h"
#include "cli/slurm_mode.h"
#include "cli/worker_pool.h"
#include "core/error.h"
#include "tools/build_info.h"

namespace primus::cli {
namespace {

constexpr const char* kLauncherFooter = R"(Commands (given after `--`; `--` may be left out when no mode flags precede):
  train pretrain --config FILE [KEY=VALUE ...]   pretrain a model; resumes from its latest checkpoint
  train posttrain                                 SFT / LoRA (not implemented yet)
  config show --config FILE [KEY=VALUE ...]      the effective config and where each value came from
  config validate --config FILE [KEY=VALUE ...]  check a config: prints OK or the first error
  config schema [--markdown]                      the reference of every config key
  data preprocess --input PATH... --output-prefix P   text/JSONL(.zst) -> Megatron .bin/.idx
  data inspect PREFIX                             documents, tokens, lengths, a decoded sample
  benchmark train --config FILE [KEY=VALUE ...]   time the training step on random tokens
  benchmark gemm|attention|comm|checkpoint        the step's GEMMs and attention, collectives, checkpoint I/O
  report RUN_DIR [--output FILE]                  an HTML page of a run: loss/lr/throughput charts, config
  preflight [--report-dir DIR]                    check host, GPUs, network, GEMM, bandwidth, all-reduce
  projection memory --config FILE [--nnodes N --gpus-per-node G --gpu NAME]   per-GPU memory, FITS or not
  projection performance --config FILE [same]     step time, tokens/s per GPU and MFU, part by part
  tune --config FILE [same] [--confirm K]         the layouts ranked by projected tokens/s, memory a hard limit
Run 'primus-cli -- <command> --help' for the options of a command.

Exit codes: 0 ok, 1 preflight checks failed, 2 bad arguments or config, 3 runtime failure, 128+N stopped by
signal N.

Examples:
  primus-cli -- train pretrain --config exp.yaml
  primus-cli direct --log-file out/run.log -- train pretrain --config exp.yaml train_iters=200 lr=3e-4
  primus-cli direct --nproc-per-node 8 -- train pretrain --config exp.yaml
  primus-cli --dry-run -- train pretrain --config exp.yaml
  primus-cli -- config validate --config exp.yaml)";

constexpr const char* kDirectFooter =
    R"(Workers: with --nproc-per-node N (default for train and benchmark: one per visible GPU), or with
more than one node, the command runs in N worker processes of this binary with torchrun's environment:
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT,
and PRIMUS_LAUNCHED=1. A preset CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES is kept. The console (and
--log-file) shows local rank 0's output, and other ranks' errors and warnings as "[rank K] ...". When a
rank fails, the others get SIGTERM, then SIGKILL 10 s later, and the error names the rank, how it ended and
its last lines (exit 2 or 3). SIGINT/SIGTERM are forwarded to every rank once (they checkpoint and exit);
a second one kills them; the launcher exits 128+N. One GPU, one node and no launch flag: the command runs
in this process, as without the launcher.

Examples:
  primus-cli direct -- train pretrain --config exp.yaml
  primus-cli direct --nproc-per-node 8 --log-file out/run.log -- train pretrain --config exp.yaml
  primus-cli direct --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 -- train pretrain --config exp.yaml
  primus-cli --dry-run direct --nproc-per-node 2 -- benchmark train --config exp.yaml
  primus-cli --debug direct --log-file out/run.log -- train pretrain --config exp.yaml)";

constexpr const char* kContainerHelp = "primus-cli container --help";

constexpr const char* kSlurmFooter =
    R"(Usage: primus-cli slurm [srun|sbatch] [Slurm flags] [--nproc-per-node N] [--master-port P] -- <command>

srun (the default) runs the job in the foreground; sbatch writes a batch script into the run directory
(<workspace>/<exp_name>/slurm/) and submits it, printing the job id (--wait: wait for it and report how it ended).
Flags: -N/--nodes, -p/--partition, -t/--time, -J/--job-name, -A/--account, --gpus-per-node, -o/--output,
-e/--error; they win over the experiment's slurm: section (nodes, partition, time, job_name, account,
gpus_per_node, output, error). Other Slurm flags are passed on as they are. Each node runs one task,
`primus-cli slurm node -- <command>`, which takes NNODES, NODE_RANK and MASTER_ADDR from SLURM_NNODES,
SLURM_NODEID and the first host of SLURM_STEP_NODELIST, and starts one worker per GPU (--gpus-per-node or
--nproc-per-node set the number). A failing node stops the others; the error names the node and the rank.

Examples:
  primus-cli slurm srun -N 2 -p gpu -- train pretrain --config exp.yaml
  primus-cli slurm sbatch -N 4 --gpus-per-node 8 -t 4:00:00 -- train pretrain --config exp.yaml
  primus-cli --dry-run slurm sbatch -N 4 --partition p -- train pretrain --config exp.yaml)";

// The direct-mode options that take a value, in both spellings (ours and torchrun's).
bool takes_value(const std::string& word) {
  for (const char* option :
       {"--log-file", "--log_file", "--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank",
        "--master-addr", "--master_addr", "--master-port", "--master_port"}) {
    if (word == option) return true;
  }
  return false;
}

struct SplitArguments {
  std::vector<std::string> launcher;
  std::vector<std::string> command;
};

// Splits at the first `--`. Without one, the command starts at the first word that is neither a flag, the
// value of a direct-mode option (--log-file, --nproc-per-node, ...), nor the direct mode; container and slurm take
// everything after them.
SplitArguments split_arguments(const std::vector<std::string>& args) {
  auto separator = std::find(args.begin(), args.end(), "--");
  if (separator != args.end()) return {{args.begin(), separator}, {separator + 1, args.end()}};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (takes_value(word)) {
      ++i;
      continue;
    }
    if (word == "container" || word == "slurm") break;
    if (word == "direct" || word.starts_with("-")) continue;
    return {{args.begin(), args.begin() + static_cast<std::ptrdiff_t>(i)},
            {args.begin() + static_cast<std::ptrdiff_t>(i), args.end()}};
  }
  return {args, {}};
}

std::vector<std::string> reversed(std::vector<std::string> words) {
  std::reverse(words.begin(), words.end());
  return words;
}

struct ParsedCommand {
  const CLI::App* app;
  std::string words;  // e.g. "primus-cli -- train pretrain"
};

// The deepest subcommand the parser reached (for help hints).
ParsedCommand deepest_command(const CLI::App& root, const std::string& prefix) {
  ParsedCommand parsed{&root, prefix};
  while (!parsed.app->get_subcommands().empty()) {
    parsed.app = parsed.app->get_subcommands().front();
    parsed.words += " " + parsed.app->get_name();
  }
  return parsed;
}

std::string subcommand_names(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands(std::function<bool(const CLI::App*)>())) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return names;
}

struct UnknownCommand {
  std::string message;
  std::string hint;
};

// CLI11 reports an unknown subcommand word as "A subcommand is required"; name the word instead.
std::optional<UnknownCommand> find_unknown_command(const CLI::App& root, const std::vector<std::string>& words) {
  const CLI::App* app = &root;
  std::string path = "primus-cli --";
  for (const std::string& word : words) {
    if (word.starts_with("-")) break;
    auto subs = app->get_subcommands(std::function<bool(const CLI::App*)>());
    if (subs.empty()) break;  // a leaf: the remaining words are its arguments
    auto match = std::find_if(subs.begin(), subs.end(), [&](const CLI::App* sub) { return sub->get_name() == word; });
    if (match == subs.end()) {
      std::string hint = app == &root ? "primus-cli --help" : path + " --help";
      return UnknownCommand{fmt::format("unknown command '{}' (expected one of: {})", word, subcommand_names(*app)),
                            hint};
    }
    app = *match;
    path += " " + word;
  }
  return std::nullopt;
}

void print_usage_error(const std::string& message, const std::string& hint) {
  report_error(message);
  std::cerr << "run '" << hint << "' for usage\n";
}

// Prints help or the version (exit 0) or the parse error with a hint (exit 2).
int handle_parse_error(const CLI::App& app, const CLI::ParseError& error, const std::string& prefix) {
  if (dynamic_cast<const CLI::CallForHelp*>(&error) != nullptr) {
    std::cout << app.help();
    return kExitOk;
  }
  if (dynamic_cast<const CLI::CallForAllHelp*>(&error) != nullptr) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  }
  if (dynamic_cast<const CLI::CallForVersion*>(&error) != nullptr) {
    std::cout << error.what() << "\n";
    return kExitOk;
  }
  std::string message = error.what();
  ParsedCommand parsed = deepest_command(app, prefix);
  if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr && message == "A subcommand is required") {
    message = fmt::format("'{}' needs a subcommand: {}", parsed.words, subcommand_names(*parsed.app));
  }
  print_usage_error(message, parsed.words + " --help");
  return kExitUsage;
}

// The command line of every worker: this binary with the global flags that shape its run, then the command.
std::vector<std::string> worker_argv(const LaunchOptions& launch, const std::vector<std::string>& words) {
  std::vector<std::string> argv{"primus-cli"};
  if (launch.debug) argv.push_back("--debug");
  argv.push_back("--");
  argv.insert(argv.end(), words.begin(), words.end());
  return argv;
}

// Train, benchmark and preflight use devices, so only they default to one worker per GPU (see
// resolve_launch_layout); `benchmark checkpoint` measures the disk from one process.
bool command_uses_devices(const CLI::App& commands) {
  auto chosen = commands.get_subcommands();
  if (chosen.empty()) return false;
  const std::string& name = chosen.front()->get_name();
  if (name == "benchmark") {
    const auto leaf = chosen.front()->get_subcommands();
    return leaf.empty() || leaf.front()->get_name() != "checkpoint";
  }
  return name == "train" || name == "preflight";
}

// The `--config FILE` and the override words of the parsed command, when it takes a config.
std::optional<CommandExperiment> command_experiment(const CLI::App& commands) {
  const CLI::App* leaf = deepest_command(commands, "").app;
  const CLI::Option* config = leaf->get_option_no_throw("--config");
  if (config == nullptr || config->count() == 0) return std::nullopt;
  return CommandExperiment{config->as<std::string>(), leaf->remaining()};
}

// The parser of the words after `--`: every command family under one root.
void add_commands(CLI::App& commands, const LaunchOptions& launch, Action& action) {
  commands.require_subcommand(1);
  commands.footer(kLauncherFooter);
  add_train_commands(commands, launch, action);
  add_config_commands(commands, launch, action);
  add_data_commands(commands, launch, action);
  add_benchmark_commands(commands, launch, action);
  add_report_commands(commands, launch, action);
  add_checkpoint_commands(commands, launch, action);
  add_preflight_commands(commands, launch, action);
  add_projection_commands(commands, launch, action);
}

// Parses the command words; an exit code when they do not parse, or asked for help (then printed).
std::optional<int> parse_command(CLI::App& commands, const std::vector<std::string>& words) {
  if (words.empty()) {
    print_usage_error("no command given (for example: primus-cli -- train pretrain --config exp.yaml)",
                      "primus-cli --help");
    return kExitUsage;
  }
  if (auto unknown = find_unknown_command(commands, words)) {
    print_usage_error(unknown->message, unknown->hint);
    return kExitUsage;
  }
  try {
    commands.parse(reversed(words));
  } catch (const CLI::ParseError& error) {
    return handle_parse_error(commands, error, "primus-cli --");
  }
  return std::nullopt;
}

// `slurm` is set for `primus-cli slurm srun|sbatch`: the command is parsed (so a bad one fails here, not on the
// nodes) and then submitted instead of run.
int run_command(const LaunchOptions& launch, const LaunchRequest& request, const std::vector<std::string>& words,
                const SlurmArguments* slurm) {
  CLI::App commands{"The commands of primus-cli, given after `--`.", "primus-cli --"};
  Action action;
  add_commands(commands, launch, action);
  if (auto code = parse_command(commands, words)) return *code;

  try {
    // A dry run creates no files, so the log file is opened only for a real run.
    setup_logging(launch.debug, launch.dry_run ? std::string() : launch.log_file);
  } catch (const UsageError& error) {
    print_usage_error(error.what(), "primus-cli direct --help");
    return error.exit_code();
  }
  if (slurm != nullptr) {
    try {
      return run_slurm_job(launch, *slurm, words, command_experiment(commands));
    } catch (const UsageError& error) {
      print_usage_error(error.what(), "primus-cli slurm --help");
      return error.exit_code();
    }
  }
  // A worker (PRIMUS_LAUNCHED=1) runs its command itself, so a launch never nests.
  LaunchLayout layout;
  if (!is_launched_worker()) {
    try {
      layout = resolve_launch_layout(request, command_uses_devices(commands));
    } catch (const UsageError& error) {
      print_usage_error(error.what(), "primus-cli direct --help");
      return error.exit_code();
    }
  } else if (request.any_given()) {
    spdlog::warn("launcher: {}=1: this is a worker already; the launch flags are ignored", kLaunchedVariable);
  }
  try {
    if (layout.multi_process && !launch.dry_run) {
      WorkerPoolOptions pool;
      pool.layout = layout;
      pool.argv = worker_argv(launch, words);
      pool.log_file = launch.log_file;
      if (launch.mode == "slurm node") {
        pool.forward_stop_signals = false;
        pool.alerts_only = layout.node_rank > 0;
      }
      return exit_code_after_logging(run_worker_pool(pool));
    }
    int code = exit_code_after_logging(action());
    if (layout.multi_process && code == kExitOk) {
      // The command has just run its dry run, which validated the config; the workers are what the launch adds.
      std::vector<std::string> argv = worker_argv(launch, words);
      std::error_code ignored;
      std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ignored);
      if (!self.empty()) argv.front() = self.string();
      print_launch_plan(layout, argv);
    }
    return code;
  } catch (const NotImplementedError& error) {
    report_error(error.what());
    return error.exit_code();
  } catch (const UsageError& error) {
    print_usage_error(error.what(), deepest_command(commands, "primus-cli --").words + " --help");
    return error.exit_code();
  }
}

// Container mode: the command is parsed and dry-run here first (bad arguments and configs exit 2 before any
// container starts, and its config tells the run directory to mount), then runs in the container.
int run_container(const LaunchOptions& launch, const ContainerFlags& flags, const std::vector<std::string>& words) {
  setup_logging(launch.debug, "");
  // `direct [flags] -- command` runs as it is inside; the command after its `--` is what is checked here.
  std::vector<std::string> checked = words;
  if (!words.empty() && words.front() == "direct") {
    auto separator = std::find(words.begin() + 1, words.end(), "--");
    if (separator == words.end()) {
      print_usage_error("container: after 'direct' and its flags, give -- and the command", kContainerHelp);
      return kExitUsage;
    }
    checked.assign(separator + 1, words.end());
  }
  apply_flag_env(flags);
  CommandPlan plan;
  plan.print = launch.dry_run;
  LaunchOptions check = launch;
  check.dry_run = true;
  check.plan = &plan;
  CLI::App commands{"The commands of primus-cli, given after `--`.", "primus-cli --"};
  Action action;
  add_commands(commands, check, action);
  if (auto code = parse_command(commands, checked)) return *code;
  try {
    int code = action();
    if (code != kExitOk) return code;
  } catch (const NotImplementedError& error) {
    report_error(error.what());
    return error.exit_code();
  } catch (const UsageError& error) {
    print_usage_error(error.what(), deepest_command(commands, "primus-cli --").words + " --help");
    return error.exit_code();
  }
  try {
    return run_container_mode(launch, flags, plan, words);
  } catch (const UsageError& error) {
    print_usage_error(error.what(), kContainerHelp);
    return error.exit_code();
  }
}

}  // namespace

int run_cli(int argc, char** argv) {
  std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
  SplitArguments split = split_arguments(args);

  LaunchOptions launch;
  CLI::App launcher{"Primus: train large language models. Runs one command in a launch mode.", "primus-cli"};
  launcher.set_version_flag("--version", std::function<std::string()>(version_text),
                            "Print the version and the CUDA, cuDNN and NCCL versions of the build, and exit");
  launcher.add_flag("--dry-run", launch.dry_run,
                    "Print what would run (after validating the config) and exit 0 without running it");
  launcher.add_flag("--debug", launch.debug, "Debug-level logging");
  launcher.require_subcommand(0, 1);
  launcher.footer(kLauncherFooter);

  CLI::App* direct = launcher.add_subcommand(
      "direct", "Run the command on this node: in this process, or in one worker process per GPU (the default mode)");
  direct
      ->add_option("--log-file,--log_file", launch.log_file,
                   "Also write all log output to FILE, appending (parent folders are created)")
      ->type_name("FILE");
  // Unset optionals are what LaunchRequest leaves to the environment and the defaults.
  LaunchRequest request;
  direct
      ->add_option("--nproc-per-node,--nproc_per_node", request.nproc_per_node,
                   "Worker processes on this node (default for train and benchmark: the visible GPUs, from "
                   "CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES or /dev/nvidia*, else 1; other commands: 1)")
      ->type_name("N");
  direct->add_option("--nnodes", request.nnodes, "Nodes in the job (default: $NNODES, else 1)")->type_name("M");
  direct
      ->add_option("--node-rank,--node_rank", request.node_rank,
                   "This node's index, 0..M-1 (default: $NODE_RANK, else 0)")
      ->type_name("R");
  direct
      ->add_option("--master-addr,--master_addr", request.master_addr,
                   "Address of the rank-0 node for the rendezvous (default: $MASTER_ADDR, else 127.0.0.1)")
      ->type_name("A");
  direct
      ->add_option("--master-port,--master_port", request.master_port,
                   "TCP port of the rendezvous on the master (default: $MASTER_PORT, else 29500)")
      ->type_name("P");
  direct->fallthrough();  // global flags may follow the mode
  direct->footer(kDirectFooter);
  ContainerFlags container_flags;
  CLI::App* container = add_container_mode(launcher, container_flags);
  CLI::App* slurm = launcher.add_subcommand(
      "slurm", "Run the command on Slurm nodes: srun (foreground) or sbatch (a batch script in the run directory)");
  slurm->footer(kSlurmFooter);
  slurm->allow_extras();
  slurm->prefix_command();

  try {
    launcher.parse(reversed(split.launcher));
  } catch (const CLI::ParseError& error) {
    return handle_parse_error(launcher, error, "primus-cli");
  }
  launch.command_words = split.command;

  std::optional<SlurmArguments> slurm_arguments;
  if (slurm->parsed()) {
    try {
      slurm_arguments = parse_slurm_arguments(slurm->remaining());
      launch.mode = "slurm " + slurm_arguments->launcher;
      launch.dry_run = launch.dry_run || slurm_arguments->dry_run;
      launch.debug = launch.debug || slurm_arguments->debug;
      if (slurm_arguments->launcher == "node") {
        setup_logging(launch.debug, "");
        request = slurm_node_request(*slurm_arguments);
      }
    } catch (const NodeStopped& stopped) {
      spdlog::warn("{}", stopped.what());
      return stopped.exit_code();
    } catch (const UsageError& error) {
      print_usage_error(error.what(), "primus-cli slurm --help");
      return error.exit_code();
    } catch (const Error& error) {
      report_error(error.what());
      return error.exit_code();
    }
  }
  const SlurmArguments* submit = slurm_arguments && slurm_arguments->launcher != "node" ? &*slurm_arguments : nullptr;

  try {
    if (container->parsed()) {
      launch.mode = "container";
      return run_container(launch, container_flags, split.command);
    }
    return run_command(launch, request, split.command, submit);
  } catch (const Error& error) {
    report_error(error.what());
    return error.exit_code();
  } catch (const std::exception& error) {
    report_error(error.what());
    return kExitRuntime;
  } catch (...) {
    report_error("unknown failure (a non-standard exception)");
    return kExitRuntime;
  }
}

}  // namespace primus::cli
