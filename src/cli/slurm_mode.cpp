// The processes of `primus-cli slurm` (see slurm_mode.h): srun in the foreground with its stderr relayed and
// read for the failing task, sbatch with the script written into the run directory, and the per-node entry's
// calls to scontrol. Every wait on a helper program has a limit, except srun and `sbatch --wait`, which last as
// long as the job (Slurm's --time bounds them).
#include "cli/slurm_mode.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

#include "config/config.h"
#include "core/error.h"

namespace primus::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr double kHelperTimeoutS = 60;  // scontrol, sbatch without --wait

// SIGINT/SIGTERM to us while a helper runs: the handler only counts; run_process's loop acts on them.
volatile sig_atomic_t g_stop_signal = 0;  // the first one
volatile sig_atomic_t g_signal_count = 0;
volatile sig_atomic_t g_last_signal = 0;

void count_signal(int signal_number) {
  if (g_stop_signal == 0) g_stop_signal = signal_number;
  g_last_signal = signal_number;
  g_signal_count = g_signal_count + 1;
}

struct ProcessResult {
  int status = 0;  // wait status
  std::string out;
  std::string err;
};

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return fmt::format("ended with wait status {}", status);
}

// What to do with the n-th SIGINT/SIGTERM that reached us while `pid` runs; by default it is passed on.
using SignalAction = std::function<void(pid_t pid, int signal_number, int count)>;

// Runs argv[0] from PATH with stdin from /dev/null in its own process group (so a Ctrl-C reaches it once, through
// us). stdout is captured or passed through (`on_stdout` sees all of it so far); stderr is captured and, with
// `relay`, also copied to ours line by line (`on_stderr` sees each complete piece). SIGINT and SIGTERM to us go
// to `on_signal`. `timeout_s` (when set) ends it with SIGTERM, then SIGKILL 5 s later, and throws RuntimeError
// naming `what`.
ProcessResult run_process(const std::vector<std::string>& argv, bool capture_stdout, bool relay,
                          std::optional<double> timeout_s, const std::string& what,
                          const std::function<void(const std::string&)>& on_stdout = {},
                          const std::function<void(const std::string&)>& on_stderr = {},
                          const SignalAction& on_signal = {}) {
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  if ((capture_stdout && ::pipe2(out_pipe, O_CLOEXEC) != 0) || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw RuntimeError(fmt::format("{}: pipe: {}", what, std::strerror(errno)));
  }
  std::vector<std::string> args = argv;
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  pointers.push_back(nullptr);

  struct sigaction forward {};
  struct sigaction old_int {};
  struct sigaction old_term {};
  forward.sa_handler = count_signal;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  g_stop_signal = 0;
  g_signal_count = 0;
  ::sigaction(SIGINT, &forward, &old_int);
  ::sigaction(SIGTERM, &forward, &old_term);

  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    if (capture_stdout) ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::execvp(pointers[0], pointers.data());
    std::string message = fmt::format("primus-cli: error: cannot run {}: {}\n", argv[0], std::strerror(errno));
    ssize_t ignored = ::write(STDERR_FILENO, message.data(), message.size());
    (void)ignored;
    ::_exit(127);
  }
  int fork_errno = errno;
  if (capture_stdout) ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    if (capture_stdout) ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    throw RuntimeError(fmt::format("{}: fork: {}", what, std::strerror(fork_errno)));
  }
  ::setpgid(pid, pid);

  ProcessResult result;
  std::string partial;  // stderr after its last newline, relayed once complete
  const auto start = Clock::now();
  bool terminated = false;
  bool killed = false;
  int signals_handled = 0;
  int fds[2] = {capture_stdout ? out_pipe[0] : -1, err_pipe[0]};
  while (fds[0] >= 0 || fds[1] >= 0) {
    pollfd polled[2];
    nfds_t count = 0;
    for (int fd : fds) {
      if (fd >= 0) polled[count++] = {fd, POLLIN, 0};
    }
    int ready = ::poll(polled, count, 500);
    if (ready < 0 && errno != EINTR) break;
    while (signals_handled < g_signal_count) {
      ++signals_handled;
      if (on_signal) {
        on_signal(pid, g_last_signal, signals_handled);
      } else {
        ::kill(pid, g_last_signal);
      }
    }
    for (nfds_t i = 0; ready > 0 && i < count; ++i) {
      if (polled[i].revents == 0) continue;
      char buffer[8192];
      ssize_t n = ::read(polled[i].fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      const bool is_err = polled[i].fd == fds[1];
      if (n <= 0) {
        ::close(polled[i].fd);
        (is_err ? fds[1] : fds[0]) = -1;
        continue;
      }
      if (!is_err) {
        result.out.append(buffer, static_cast<size_t>(n));
        if (on_stdout) on_stdout(result.out);
        continue;
      }
      result.err.append(buffer, static_cast<size_t>(n));
      if (relay) {
        partial.append(buffer, static_cast<size_t>(n));
        size_t newline = partial.rfind('\n');
        if (newline != std::string::npos) {
          std::fwrite(partial.data(), 1, newline + 1, stderr);
          std::fflush(stderr);
          if (on_stderr) on_stderr(partial.substr(0, newline + 1));
          partial.erase(0, newline + 1);
        }
      }
    }
    if (timeout_s) {
      double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      if (!terminated && elapsed > *timeout_s) {
        ::kill(-pid, SIGTERM);
        terminated = true;
      } else if (terminated && !killed && elapsed > *timeout_s + 5) {
        ::kill(-pid, SIGKILL);
        killed = true;
      }
    }
  }
  if (relay && !partial.empty()) std::fprintf(stderr, "%s\n", partial.c_str());
  while (::waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  if (terminated) {
    throw RuntimeError(fmt::format("{} did not finish within {:g} s and was stopped{}", what, *timeout_s,
                                   result.err.empty() ? "" : ": " + result.err));
  }
  if (WIFEXITED(result.status) && WEXITSTATUS(result.status) == 127 &&
      result.err.find("primus-cli: error: cannot run") != std::string::npos) {
    throw RuntimeError(
        fmt::format("{}: cannot run '{}' (is Slurm installed here, and this a Slurm login node?)", what, argv[0]));
  }
  return result;
}

std::string trimmed(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  return text.substr(start);
}

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string self_executable() {
  std::error_code error;
  fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error) throw RuntimeError("slurm: cannot resolve /proc/self/exe: " + error.message());
  return self.string();
}

std::string utc_stamp() {
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y%m%d-%H%M%S", &utc);
  return text;
}

void line(const std::string& label, const std::string& value) { fmt::print("  {:<12} {}\n", label, value); }

// Exit code for the launcher from how the job ended: the failing task's 2 or 3, else 3.
int job_exit_code(int status, const std::optional<SrunFailure>& failure) {
  if (failure && (failure->exit_code == kExitUsage || failure->exit_code == kExitRuntime)) return failure->exit_code;
  if (WIFEXITED(status) && (WEXITSTATUS(status) == kExitUsage || WEXITSTATUS(status) == kExitRuntime)) {
    return WEXITSTATUS(status);
  }
  return kExitRuntime;
}

std::string failure_report(const std::string& job, const std::string& program,
                           const std::optional<SrunFailure>& failure, int status) {
  if (!failure) {
    return fmt::format("{} failed: {} {} and no task reported a failure (see {}'s own error above)", job, program,
                       describe_wait_status(status), program);
  }
  bool one_task = failure->tasks.find_first_of(",-") == std::string::npos;
  return fmt::format(
      "{} failed on node {} (task {}{}): it {}; the other nodes were stopped. The rank's error and last lines are "
      "above",
      job, failure->node, failure->tasks, one_task ? ", NODE_RANK " + failure->tasks : std::string(), failure->how);
}

// The launcher's error reports in a job's output ("primus-cli: error: rank 1 ..." and its indented last lines),
// at most 40 lines; the script's own closing line is left out.
std::string rank_errors(const std::string& text) {
  std::string errors;
  std::istringstream in(text);
  bool inside = false;
  int lines = 0;
  for (std::string row; std::getline(in, row) && lines < 40;) {
    if (row.starts_with("primus-cli: error: ")) {
      inside = row.find("srun exited with code") == std::string::npos;
    } else if (!row.starts_with("    ")) {
      inside = false;
    }
    if (!inside) continue;
    errors += "    " + row + "\n";
    ++lines;
  }
  if (!errors.empty()) errors.pop_back();
  return errors;
}

int run_srun(const SlurmJob& job, const std::vector<std::string>& argv) {
  spdlog::info("slurm: {}", shell_join(argv));
  // srun ends a step it gets SIGTERM for by killing the tasks, which would lose the trainer's checkpoint. The job
  // id (from node 0's "slurm node: job N," line) lets a first stop signal go to every process of the step through
  // scancel instead: the trainer saves a checkpoint and exits 128+N. A second signal goes to srun (it ends the
  // step at once), a third kills srun.
  std::string job_id;
  auto on_stderr = [&](const std::string& text) {
    static const std::regex node_line(R"(slurm node: job (\d+),)");
    std::smatch match;
    if (job_id.empty() && std::regex_search(text, match, node_line)) job_id = match[1];
  };
  auto on_signal = [&](pid_t pid, int signal_number, int count) {
    if (count == 1 && !job_id.empty()) {
      const char* name = signal_number == SIGINT ? "INT" : "TERM";
      spdlog::warn(
          "slurm: SIG{} received: sent to every process of job {} (scancel --signal={}); the ranks save a "
          "checkpoint and stop. Send it again to end the job at once",
          name, job_id, name);
      std::string command = fmt::format("timeout 30 scancel --signal={} {} >&2", name, job_id);
      if (std::system(command.c_str()) != 0) ::kill(pid, SIGTERM);
    } else if (count <= 2) {
      spdlog::warn("slurm: stop signal {}: srun ends the job step now", count);
      ::kill(pid, SIGTERM);
    } else {
      ::kill(pid, SIGKILL);
    }
  };
  ProcessResult result =
      run_process(argv, /*capture_stdout=*/false, /*relay=*/true, std::nullopt, "srun", {}, on_stderr, on_signal);
  if (g_stop_signal != 0) {
    spdlog::warn("slurm: stopped by signal {} (srun {})", static_cast<int>(g_stop_signal),
                 describe_wait_status(result.status));
    return 128 + g_stop_signal;
  }
  if (WIFEXITED(result.status) && WEXITSTATUS(result.status) == 0) {
    spdlog::info("slurm: the job finished on {} node(s)", job.nodes);
    return kExitOk;
  }
  std::optional<SrunFailure> failure = find_failed_task(result.err);
  report_error(failure_report("the slurm job (srun)", "srun", failure, result.status));
  return job_exit_code(result.status, failure);
}

int run_sbatch(const SlurmJob& job, const std::string& script_path) {
  std::vector<std::string> argv{"sbatch", "--parsable"};
  if (job.wait) argv.push_back("--wait");
  argv.push_back(script_path);
  spdlog::info("slurm: {}", shell_join(argv));
  // --parsable prints "JOBID" or "JOBID;CLUSTER" as soon as the job is queued; --wait then waits for its end.
  std::string job_id;
  std::optional<std::string> output;
  auto on_stdout = [&](const std::string& text) {
    size_t newline = text.find('\n');
    if (!job_id.empty() || newline == std::string::npos) return;
    job_id = trimmed(text.substr(0, std::min(newline, text.find(';'))));
    if (job_id.empty()) return;
    output = resolve_output_path(job.output, job_id, job.job_name);
    fmt::print("Submitted batch job {}\n", job_id);
    std::fflush(stdout);
    spdlog::info("slurm: job {}: script {}, output {}{}", job_id, script_path, output.value_or(job.output),
                 job.wait ? "; waiting for it to end" : "");
  };
  ProcessResult result =
      run_process(argv, /*capture_stdout=*/true, /*relay=*/true,
                  job.wait ? std::nullopt : std::optional<double>(kHelperTimeoutS), "sbatch", on_stdout);
  if (job_id.empty()) {
    throw RuntimeError(fmt::format("sbatch {} and submitted nothing{}", describe_wait_status(result.status),
                                   result.err.empty() ? "" : ": " + trimmed(result.err)));
  }
  if (!job.wait) return kExitOk;
  if (g_stop_signal != 0) return 128 + g_stop_signal;
  if (WIFEXITED(result.status) && WEXITSTATUS(result.status) == 0) {
    spdlog::info("slurm: job {} finished on {} node(s)", job_id, job.nodes);
    return kExitOk;
  }
  std::optional<SrunFailure> failure;
  std::string errors;  // the ranks' error reports from the job's output, which the console has not shown
  if (output) {
    std::ifstream in(*output);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    failure = find_failed_task(text);
    errors = rank_errors(text);
  }
  std::string where = output ? *output : std::string("the job's output");
  std::string report = failure_report(fmt::format("slurm job {}", job_id), "sbatch --wait", failure, result.status);
  report = report.substr(0, report.find(". The rank's error"));
  report_error(errors.empty() ? report + "; see " + where : report + ". From " + where + ":\n" + errors);
  return job_exit_code(result.status, failure);
}

}  // namespace

int run_slurm_job(const LaunchOptions& launch, const SlurmArguments& arguments, const std::vector<std::string>& command,
                  const std::optional<CommandExperiment>& experiment) {
  // The config gives the run directory and the slurm: section; loading it here also rejects a bad config before
  // it waits in a queue.
  std::optional<LoadedConfig> loaded;
  if (experiment) loaded = load_experiment_config(experiment->config_path, normalize_overrides(experiment->overrides));
  const fs::path cwd = fs::current_path();
  const std::string run_dir = loaded ? (cwd / loaded->config.run_dir()).lexically_normal().string()
                                     : (cwd / "output").lexically_normal().string();  // scripts in output/slurm/
  const SlurmSettings no_settings;
  SlurmJob job = merge_slurm_job(arguments, loaded ? loaded->config.slurm : no_settings, run_dir,
                                 loaded ? loaded->config.exp_name : std::string("primus"));
  job.debug = job.debug || launch.debug;
  const std::vector<std::string> entry = node_entry_argv(job, self_executable(), command);

  std::string command_text = shell_join(command);
  if (job.launcher == "srun") {
    std::vector<std::string> argv = srun_argv(job, entry);
    if (launch.dry_run) {
      fmt::print("primus-cli dry run: nothing was submitted\n");
      line("mode", "slurm srun");
      line("command", command_text);
      if (experiment) line("config", experiment->config_path + " (valid)");
      line("run dir", run_dir);
      for (const std::string& origin : job.origins) line("slurm", origin);
      line("each node", shell_join(entry));
      line("srun", shell_join(argv));
      std::fflush(stdout);
      return kExitOk;
    }
    return run_srun(job, argv);
  }

  const fs::path script_dir = fs::path(run_dir) / "slurm";
  fs::path script_path = script_dir / ("sbatch-" + utc_stamp() + ".sh");
  for (int n = 2; fs::exists(script_path); ++n)
    script_path = script_dir / fmt::format("sbatch-{}-{}.sh", utc_stamp(), n);
  std::vector<std::string> header{
      fmt::format("Written by primus-cli {} for: primus-cli slurm sbatch ... -- {}", PRIMUS_VERSION, command_text),
      "Submit again with: sbatch " + script_path.string()};
  std::string script = sbatch_script(job, entry, cwd.string(), header);
  if (launch.dry_run) {
    fmt::print("primus-cli dry run: nothing was submitted\n");
    line("mode", "slurm sbatch");
    line("command", command_text);
    if (experiment) line("config", experiment->config_path + " (valid)");
    line("run dir", run_dir);
    for (const std::string& origin : job.origins) line("slurm", origin);
    line("script", script_path.string() + " (not written in a dry run)");
    line("submit", fmt::format("sbatch --parsable{} {}", job.wait ? " --wait" : "", script_path.string()));
    fmt::print("---- batch script ----\n{}---- end of batch script ----\n", script);
    std::fflush(stdout);
    return kExitOk;
  }
  std::error_code error;
  fs::create_directories(script_dir, error);
  if (error) throw RuntimeError(fmt::format("slurm: cannot create {}: {}", script_dir.string(), error.message()));
  {
    std::ofstream out(script_path);
    out << script;
    if (!out) throw RuntimeError(fmt::format("slurm: cannot write {}", script_path.string()));
  }
  fs::permissions(script_path, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add, error);
  return run_sbatch(job, script_path.string());
}

LaunchRequest slurm_node_request(const SlurmArguments& arguments) {
  const std::string job_id = environment("SLURM_JOB_ID");
  std::string nnodes_text = environment("SLURM_NNODES");
  if (nnodes_text.empty()) nnodes_text = environment("SLURM_JOB_NUM_NODES");
  const std::string node_id_text = environment("SLURM_NODEID");
  // The step's nodes, not the job's: an srun on some nodes of an allocation numbers SLURM_NODEID and SLURM_NNODES
  // within the step, and the job's first node may not be in it.
  std::string nodelist = environment("SLURM_STEP_NODELIST");
  if (nodelist.empty()) nodelist = environment("SLURM_JOB_NODELIST");
  if (nodelist.empty()) nodelist = environment("SLURM_NODELIST");
  if (job_id.empty() || nnodes_text.empty() || node_id_text.empty() || nodelist.empty()) {
    throw UsageError(
        "primus-cli slurm node runs inside a Slurm job step (srun starts it on every node): SLURM_JOB_ID, "
        "SLURM_NNODES, SLURM_NODEID and SLURM_JOB_NODELIST must be set");
  }
  auto number = [](const char* name, const std::string& text) {
    char* end = nullptr;
    long value = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || value < 0) {
      throw UsageError(fmt::format("{}={} (from Slurm): not a whole number", name, text));
    }
    return static_cast<int>(value);
  };
  LaunchRequest request;
  request.nnodes = number("SLURM_NNODES", nnodes_text);
  request.node_rank = number("SLURM_NODEID", node_id_text);
  request.nproc_per_node = arguments.nproc_per_node;
  request.master_port = arguments.master_port;

  // The first host as scontrol expands the list; our own expansion if scontrol cannot.
  std::string first_host;
  try {
    ProcessResult hosts = run_process({"scontrol", "show", "hostnames", nodelist}, true, false, kHelperTimeoutS,
                                      "scontrol show hostnames");
    if (WIFEXITED(hosts.status) && WEXITSTATUS(hosts.status) == 0)
      first_host = trimmed(hosts.out.substr(0, hosts.out.find('\n')));
    if (first_host.empty()) spdlog::warn("slurm node: scontrol show hostnames {}: {}", nodelist, trimmed(hosts.err));
  } catch (const RuntimeError& error) {
    spdlog::warn("slurm node: {}", error.what());
  }
  // A stop signal meant for the step (the job was cancelled, another node failed) may have ended scontrol: stop
  // here rather than launch with what it did not say.
  if (g_stop_signal != 0) throw NodeStopped(g_stop_signal);
  if (first_host.empty()) {
    std::vector<std::string> hosts = expand_hostlist(nodelist);
    if (hosts.empty()) throw UsageError(fmt::format("SLURM_JOB_NODELIST={}: no host in it", nodelist));
    first_host = hosts.front();
    spdlog::warn("slurm node: using {}, the first host of {} as primus-cli expands it", first_host, nodelist);
  }
  // Node names need not resolve (they are Slurm's names); NodeAddr is how Slurm itself reaches the node.
  // Three tries: the controller may be busy at the moment every node of a large job asks it.
  std::string address;
  for (int attempt = 1; attempt <= 3 && address.empty(); ++attempt) {
    try {
      ProcessResult node =
          run_process({"scontrol", "show", "node", first_host}, true, false, kHelperTimeoutS, "scontrol show node");
      if (WIFEXITED(node.status) && WEXITSTATUS(node.status) == 0) address = parse_node_addr(node.out);
      if (address.empty()) {
        spdlog::warn("slurm node: scontrol show node {} gave no NodeAddr (try {} of 3; it {}): {} {}", first_host,
                     attempt, describe_wait_status(node.status), trimmed(node.out), trimmed(node.err));
      }
    } catch (const RuntimeError& error) {
      spdlog::warn("slurm node: {} (try {} of 3)", error.what(), attempt);
    }
    if (g_stop_signal != 0) throw NodeStopped(g_stop_signal);
    if (address.empty() && attempt < 3) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (address.empty()) address = first_host;

  const std::string preset = environment("MASTER_ADDR");
  if (!preset.empty() && preset != address && preset != first_host) {
    throw UsageError(fmt::format(
        "MASTER_ADDR={} (from the environment) is not the job's first node {} ({}); unset it: primus-cli slurm sets "
        "MASTER_ADDR to the first node's address",
        preset, first_host, address));
  }
  request.master_addr = address;
  spdlog::info("slurm node: job {}, node {} of {} (SLURM_NODEID {}), master {} = {}", job_id, *request.node_rank,
               *request.nnodes, node_id_text, first_host, address);
  return request;
}

}  // namespace primus::cli
