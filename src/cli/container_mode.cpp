// `primus-cli container` on this machine (see container_mode.h): settings from the flags over the config's
// container: section, the facts build_container_command needs (this binary, the checkout, the run
// directory, GPUs, the environment), two bounded queries of the runtime (is it there, is the image there),
// then the container run itself with signals forwarded.
//
// Invariants:
// - primus-cli never pulls (`--pull never`, and the image is looked up first): a missing image is named at
//   once instead of a long wait on a registry that may not be reachable.
// - The runtime leads its own process group, so a Ctrl-C on the terminal reaches only primus-cli, which
//   forwards it once; it gets SIGTERM if primus-cli dies (PR_SET_PDEATHSIG), which podman and docker pass to
//   the container. A runtime that ends abnormally is followed by `rm -f` of the named container.
#include "cli/container_mode.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/container_command.h"
#include "config/config.h"
#include "core/secrets.h"

extern char** environ;

namespace primus::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr double kQueryTimeout_s = 60;    // `image inspect`: a local lookup, seconds at most when healthy
constexpr double kCleanupTimeout_s = 30;  // `rm -f` of a container left behind

std::map<std::string, std::string> host_environment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string text(*entry);
    size_t equals = text.find('=');
    if (equals != std::string::npos) env[text.substr(0, equals)] = text.substr(equals + 1);
  }
  return env;
}

// The program's path in PATH, or empty.
std::string find_in_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    fs::path candidate = fs::path(dir) / program;
    if (::access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) return candidate.string();
  }
  return "";
}

bool cdi_names_nvidia_gpus() {
  for (const char* dir : {"/etc/cdi", "/var/run/cdi"}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      if (text.str().find("nvidia.com/gpu") != std::string::npos) return true;
    }
  }
  return false;
}

GpuPassthrough detect_gpus() {
  std::error_code ec;
  bool nvidia = fs::exists("/dev/nvidiactl", ec);
  for (const auto& entry : fs::directory_iterator("/dev", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 6 && name.starts_with("nvidia") && std::isdigit(static_cast<unsigned char>(name[6]))) {
      nvidia = true;
    }
  }
  if (nvidia) return cdi_names_nvidia_gpus() ? GpuPassthrough::kNvidiaCdi : GpuPassthrough::kNvidiaGpus;
  if (fs::exists("/dev/kfd", ec)) return GpuPassthrough::kAmd;
  return GpuPassthrough::kNone;
}

std::string describe_gpus(GpuPassthrough gpus) {
  switch (gpus) {
    case GpuPassthrough::kNone:
      return "none found (no /dev/nvidia*, no /dev/kfd)";
    case GpuPassthrough::kNvidiaCdi:
      return "NVIDIA, through CDI (--device nvidia.com/gpu=all)";
    case GpuPassthrough::kNvidiaGpus:
      return "NVIDIA, no CDI spec in /etc/cdi or /var/run/cdi (--gpus all: needs the NVIDIA Container Toolkit)";
    case GpuPassthrough::kAmd:
      return "AMD (--device /dev/kfd --device /dev/dri)";
  }
  return "";
}

// The checkout this binary was built in (<checkout>/build/primus-cli or one level deeper), or empty for an
// installed binary.
std::string find_checkout(const fs::path& executable) {
  std::error_code ec;
  for (fs::path dir : {executable.parent_path().parent_path(), executable.parent_path().parent_path().parent_path()}) {
    if (fs::is_regular_file(dir / "CMakeLists.txt", ec) && fs::is_directory(dir / "src" / "cli", ec)) {
      return dir.string();
    }
  }
  return "";
}

std::string absolute(const std::string& path) { return fs::absolute(path).lexically_normal().string(); }

struct Captured {
  bool timed_out = false;
  int status = 0;  // a waitpid status
  std::string output;
};

// This process's environment with `extra` set over it, for execve.
std::vector<std::string> environment_with(const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::string> entries;
  for (char** entry = environ; *entry != nullptr; ++entry) entries.emplace_back(*entry);
  for (const auto& [name, value] : extra) {
    std::erase_if(entries, [prefix = name + "="](const std::string& entry) { return entry.starts_with(prefix); });
    entries.push_back(name + "=" + value);
  }
  return entries;
}

std::vector<char*> pointers_to(std::vector<std::string>& words) {
  std::vector<char*> pointers;
  for (std::string& word : words) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Runs argv (argv[0] a path) with stdout and stderr captured together, killing it after timeout_s.
Captured run_captured(const std::vector<std::string>& argv, double timeout_s,
                      const std::vector<std::pair<std::string, std::string>>& extra_env = {}) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw RuntimeError(fmt::format("container: pipe: {}", std::strerror(errno)));
  std::vector<std::string> args = argv;
  std::vector<char*> pointers = pointers_to(args);
  std::vector<std::string> env = environment_with(extra_env);
  std::vector<char*> envp = pointers_to(env);
  pid_t pid = ::fork();
  if (pid == 0) {
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::execve(pointers[0], pointers.data(), envp.data());
    ::_exit(127);
  }
  int fork_errno = errno;
  ::close(pipe_fds[1]);
  if (pid < 0) {
    ::close(pipe_fds[0]);
    throw RuntimeError(fmt::format("container: cannot start {}: {}", argv[0], std::strerror(fork_errno)));
  }
  Captured result;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  bool open = true;
  while (open) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd fd{pipe_fds[0], POLLIN, 0};
    int ready = ::poll(&fd, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buffer[4096];
    ssize_t n = ::read(pipe_fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      if (result.output.size() < 64 * 1024) result.output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      open = false;
    }
  }
  ::close(pipe_fds[0]);
  // The output is closed (or the child was killed): it has ended or ends now. A child that closed its output
  // and runs on is killed at the deadline too.
  for (;;) {
    pid_t done = ::waitpid(pid, &result.status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    if (Clock::now() > deadline) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    ::usleep(10000);
  }
  return result;
}

std::string trimmed(const std::string& text) {
  size_t end = text.find_last_not_of(" \n\r\t");
  return end == std::string::npos ? "" : text.substr(0, end + 1);
}

// Fails unless the image is in the runtime's local storage.
void check_image(const std::string& runtime_path, const ContainerRequest& request) {
  const std::string& runtime = request.runtime.value;
  const std::string& image = request.image.value;
  Captured query = run_captured({runtime_path, "image", "inspect", "--format", "{{.Id}}", image}, kQueryTimeout_s);
  if (query.timed_out) {
    throw RuntimeError(
        fmt::format("container: '{} image inspect {}' did not answer within {:g} s; is {} working? "
                    "(try '{} info')",
                    runtime, image, kQueryTimeout_s, runtime, runtime));
  }
  if (WIFEXITED(query.status) && WEXITSTATUS(query.status) == 0) return;
  std::string output = trimmed(query.output);
  bool missing = output.find("image not known") != std::string::npos ||
                 output.find("No such image") != std::string::npos || output.find("no such image") != std::string::npos;
  if (missing) {
    throw UsageError(fmt::format(
        "{} '{}': no such image in {}'s local storage; primus-cli never pulls, so pull or build it first "
        "('{} pull {}', or docs/containers.md for building one offline), and check the name with '{} images'",
        request.image.where, image, runtime, runtime, image, runtime));
  }
  std::string how = WIFEXITED(query.status) ? fmt::format("exited with code {}", WEXITSTATUS(query.status))
                                            : fmt::format("was killed by signal {}", WTERMSIG(query.status));
  throw RuntimeError(fmt::format("container: {} cannot be used here: '{} image inspect {}' {}:\n    {}", runtime,
                                 runtime, image, how, output.empty() ? "(no output)" : output));
}

void remove_container(const std::string& runtime_path, const std::string& name) {
  Captured removal = run_captured({runtime_path, "rm", "-f", name}, kCleanupTimeout_s);
  if (removal.timed_out)
    spdlog::warn("container: '{} rm -f {}' did not finish within {:g} s", runtime_path, name, kCleanupTimeout_s);
}

std::string indented(const std::string& output) {
  std::string text = trimmed(output);
  if (text.empty()) return "    (no output)";
  std::string result = "    ";
  for (char c : text) result += c == '\n' ? std::string("\n    ") : std::string(1, c);
  return result;
}

// Runs `primus-cli --version` in the container as it will be set up for the command: an image the binary
// cannot start in (no loader, missing libraries) or a runtime that cannot start containers fails here with
// the reason, instead of as an exit code that could be mistaken for the command's.
void probe_image(const std::string& runtime_path, const ContainerRequest& request, const ContainerCommand& command) {
  std::vector<std::string> argv = probe_argv(command);
  argv.front() = runtime_path;
  const std::string& runtime = request.runtime.value;
  const std::string probe_name = request.container_name + "-probe";
  Captured probe = run_captured(argv, kQueryTimeout_s, command.secret_env);
  if (probe.timed_out) {
    remove_container(runtime_path, probe_name);
    throw RuntimeError(fmt::format("container: {} did not start a container from image {} within {:g} s ('{}')",
                                   runtime, request.image.value, kQueryTimeout_s, shown_command_line(argv)));
  }
  int code = WIFEXITED(probe.status) ? WEXITSTATUS(probe.status) : 128 + WTERMSIG(probe.status);
  if (code == 0 && probe.output.find("primus-cli ") != std::string::npos) return;
  remove_container(runtime_path, probe_name);
  if (code == 125) {
    throw RuntimeError(fmt::format("container: {} could not start a container from image {} (exit 125):\n{}", runtime,
                                   request.image.value, indented(probe.output)));
  }
  if (request.binary.value == "image") {
    throw RuntimeError(fmt::format(
        "container: the image's own primus-cli (--binary image) could not run in image {} (exit {}):\n{}\n"
        "  Is it an image built by docker/Dockerfile.cuda or docker/Dockerfile.rocm (primus-cli on its PATH)?",
        request.image.value, code, indented(probe.output)));
  }
  throw RuntimeError(fmt::format(
      "container: {} could not be executed in image {} (exit {}):\n{}\n"
      "  It is mounted from this machine at the same path, so the image must hold its loader and shared "
      "libraries (an image of the distribution it was built on: docs/containers.md), or mount them with --volume; "
      "or run the image's own primus-cli with --binary image.",
      request.executable, request.image.value, code, indented(probe.output)));
}

volatile sig_atomic_t g_runtime_pid = 0;
volatile sig_atomic_t g_stop_signal = 0;

void forward_signal(int signal_number) {
  if (g_stop_signal == 0) g_stop_signal = signal_number;
  if (g_runtime_pid > 0) ::kill(static_cast<pid_t>(g_runtime_pid), signal_number);
}

// Starts the runtime with `command` and waits for it, forwarding SIGINT/SIGTERM. Returns its wait status.
int run_runtime(const std::string& runtime_path, const ContainerCommand& command) {
  std::vector<std::string> env_entries = environment_with(command.secret_env);
  std::vector<char*> envp = pointers_to(env_entries);
  std::vector<std::string> args = command.argv;
  std::vector<char*> argv = pointers_to(args);
  const pid_t parent = ::getpid();

  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  sigemptyset(&action.sa_mask);
  action.sa_handler = forward_signal;
  action.sa_flags = SA_RESTART;
  struct sigaction old_int, old_term;
  sigset_t blocked, previous;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &blocked, &previous);
  ::sigaction(SIGINT, &action, &old_int);
  ::sigaction(SIGTERM, &action, &old_term);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::execve(runtime_path.c_str(), argv.data(), envp.data());
    const char* message = "primus-cli: error: container: cannot execute the container runtime\n";
    ssize_t ignored = ::write(STDERR_FILENO, message, std::strlen(message));
    (void)ignored;
    ::_exit(127);
  }
  int fork_errno = errno;
  if (pid > 0) {
    ::setpgid(pid, pid);
    g_runtime_pid = pid;
  }
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    throw RuntimeError(fmt::format("container: cannot start {}: fork: {}", runtime_path, std::strerror(fork_errno)));
  }
  int status = 0;
  // No deadline: this is the job itself, as long as training takes; signals end it.
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_runtime_pid = 0;
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  return status;
}

void print_plan(const std::string& runtime_path, const ContainerRequest& request, const ContainerCommand& command) {
  auto line = [](const std::string& label, const std::string& value) { fmt::print("  {:<12} {}\n", label, value); };
  line("runtime", fmt::format("{} ({}; from {})", request.runtime.value,
                              runtime_path.empty() ? "not found in PATH" : runtime_path, request.runtime.where));
  line("image", fmt::format("{} (from {}; not checked in a dry run)", request.image.value, request.image.where));
  line("gpus", describe_gpus(request.gpus));
  for (const ContainerMount& m : command.mounts) {
    std::string target = m.source == m.destination ? "same path" : m.destination;
    line("mount", fmt::format("{} -> {} ({}, {})", m.source, target, m.options, m.why));
  }
  std::string env;
  for (const std::string& entry : command.shown_env) env += (env.empty() ? "" : " ") + entry;
  line("passed env", env.empty() ? "none" : env);
  line("container", shown_command_line(command.argv));
  std::fflush(stdout);
}

constexpr const char* kContainerFooter =
    R"(The command runs in direct mode inside IMAGE, through `podman run` or `docker run` (--rm, --pull never,
--network host, --ipc host), with these mounted at the same path: the checkout this primus-cli was built in
(read-only; for an installed binary, the binary and its configs/; nothing with --binary image, which runs the
image's own primus-cli), the working directory (read-write, and the container's working directory), the run
directory <workspace>/<exp_name> of the command's config (read-write, created first), the config file's
folder (read-only), and each --volume. GPUs: NVIDIA through
CDI (--device nvidia.com/gpu=all) when a CDI spec names nvidia.com/gpu, else --gpus all; AMD: /dev/kfd and
/dev/dri. Variables PRIMUS_*, NCCL_*, RCCL_*, GLOO_*, CUDA/HIP/ROCR_VISIBLE_DEVICES, NNODES, NODE_RANK,
MASTER_ADDR, MASTER_PORT and OMP_NUM_THREADS are passed on; then the config's container env, then --env.
Values of variables named *TOKEN*, *KEY*, *SECRET*, *PASSWORD* are passed by name (never on a command line)
and shown as *** in logs and dry runs. The command is checked (and its config validated) here first. The image
must exist here: primus-cli never pulls. Before the command, `primus-cli --version` runs in the same setup to
check that the binary starts in the image.
Settings may come from the experiment config's container: section (runtime; options.image, options.volume,
options.env, ...); the flags win (--volume and --env add to the config's).

Exit codes: the command's own code from the container; 2 bad flags, config, image name, an image or
runtime that is not here; 3 the runtime failed (could not start the container or run primus-cli in it).

Examples:
  primus-cli container --image localhost/primus:cuda -- train pretrain --config exp.yaml
  primus-cli container --image localhost/primus:cuda --volume /data:/data:ro --env HF_TOKEN -- train pretrain --config exp.yaml
  primus-cli --dry-run container --runtime docker --image primus:rocm -- train pretrain --config exp.yaml
  primus-cli container --image localhost/primus:cuda -- direct --nproc-per-node 8 -- train pretrain --config exp.yaml)";

}  // namespace

CLI::App* add_container_mode(CLI::App& launcher, ContainerFlags& flags) {
  CLI::App* container = launcher.add_subcommand(
      "container", "Run the command inside a podman or docker container image (direct mode inside)");
  container->add_option("--image", flags.image, "Image to run (default: container.options.image of the config)")
      ->type_name("IMAGE");
  container
      ->add_option("--runtime", flags.runtime,
                   "podman or docker (default: container.runtime of the config, else podman when installed, "
                   "else docker)")
      ->type_name("NAME");
  container
      ->add_option("--binary", flags.binary,
                   "mounted: run this primus-cli, mounted from here (default); image: the image's own primus-cli "
                   "(an image built by docker/Dockerfile.*, e.g. for a host of another distribution)")
      ->type_name("mounted|image");
  container
      ->add_option("--volume,-v", flags.volumes,
                   "Also mount SRC (a path here, made absolute) at DST, with OPTIONS such as ro; repeatable")
      ->type_name("SRC[:DST[:OPTIONS]]")
      ->allow_extra_args(false);
  container
      ->add_option("--env,-e", flags.env,
                   "Set NAME in the container (NAME alone: this environment's value); repeatable; wins over the "
                   "config's")
      ->type_name("NAME[=VALUE]")
      ->allow_extra_args(false);
  container->fallthrough();  // global flags may follow the mode
  container->footer(kContainerFooter);
  return container;
}

void apply_flag_env(const ContainerFlags& flags) {
  for (const std::string& entry : flags.env) {
    size_t equals = entry.find('=');
    if (equals == std::string::npos || equals == 0) continue;  // NAME alone is the host's value already
    ::setenv(entry.substr(0, equals).c_str(), entry.substr(equals + 1).c_str(), 1);
  }
}

int run_container_mode(const LaunchOptions& launch, const ContainerFlags& flags, const CommandPlan& plan,
                       const std::vector<std::string>& command) {
  const ContainerSettings none;
  const ContainerSettings& section = plan.config ? plan.config->container : none;

  ContainerRequest request;
  if (flags.runtime) {
    request.runtime = {*flags.runtime, "--runtime"};
  } else if (section.runtime) {
    request.runtime = *section.runtime;
  } else {
    // Podman first: rootless, daemonless, and what HPC sites without Docker have.
    std::string found = !find_in_path("podman").empty() ? "podman" : !find_in_path("docker").empty() ? "docker" : "";
    if (!found.empty()) {
      request.runtime = {found, "PATH (podman, else docker)"};
    } else if (launch.dry_run) {
      request.runtime = {"podman", "the default; neither podman nor docker is in PATH"};
    } else {
      throw UsageError(
          "no container runtime: neither podman nor docker is in PATH (install Debian's podman, or give --runtime "
          "podman|docker)");
    }
  }
  if (flags.image) {
    request.image = {*flags.image, "--image"};
  } else if (section.image) {
    request.image = *section.image;
  } else {
    request.image = {"", "--image"};
  }
  if (flags.binary) request.binary = {*flags.binary, "--binary"};
  request.volumes = section.volumes;
  for (const std::string& volume : flags.volumes) request.volumes.push_back({volume, "--volume"});
  request.env = section.env;
  for (const std::string& entry : flags.env) request.env.push_back({entry, "--env"});
  request.options = section.options;

  std::error_code ec;
  fs::path executable = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw RuntimeError(fmt::format("container: cannot resolve /proc/self/exe: {}", ec.message()));
  request.executable = executable.string();
  std::string checkout = find_checkout(executable);
  request.program_paths = {checkout.empty() ? executable.string() : checkout};
  // The presets directory this binary reads (PRIMUS_CONFIGS_DIR, beside the binary, or the source tree's).
  if (std::string configs = absolute(find_configs_dir()); fs::is_directory(configs, ec)) {
    request.program_paths.push_back(configs);
  }
  request.working_dir = fs::current_path().string();
  std::vector<std::string> made_dirs;
  if (plan.config) {
    made_dirs.push_back(absolute(plan.config->run_dir()));
    if (!plan.config->train.save.empty()) made_dirs.push_back(absolute(plan.config->train.save));
    request.writable_paths = made_dirs;
    request.readable_paths.push_back(fs::absolute(plan.config_path).parent_path().lexically_normal().string());
  }
  request.gpus = detect_gpus();
  request.host_env = host_environment();
  request.uid = ::getuid();
  request.gid = ::getgid();
  request.debug = launch.debug;
  request.command = command;
  request.container_name = fmt::format("primus-{}-{}", ::getpid(), static_cast<long long>(std::time(nullptr)));

  ContainerCommand built = build_container_command(request);
  std::string runtime_path = find_in_path(request.runtime.value);
  if (launch.dry_run) {
    print_plan(runtime_path, request, built);
    return kExitOk;
  }
  if (runtime_path.empty()) {
    throw UsageError(fmt::format("{} '{}': {} is not installed (not in PATH){}", request.runtime.where,
                                 request.runtime.value, request.runtime.value,
                                 request.runtime.value == "podman" ? "; Debian: apt-get install podman runc" : ""));
  }
  check_image(runtime_path, request);
  for (const std::string& dir : made_dirs) {
    // A bind mount needs its source: the run directory is made here, as the trainer would make it.
    fs::create_directories(dir, ec);
    if (ec) throw UsageError(fmt::format("container: cannot create {} (to mount it): {}", dir, ec.message()));
  }
  probe_image(runtime_path, request, built);

  spdlog::info("container: {} (image {}, gpus: {})", request.container_name, request.image.value,
               describe_gpus(request.gpus));
  spdlog::info("container: {}", shown_command_line(built.argv));
  g_stop_signal = 0;
  int status = run_runtime(runtime_path, built);
  const std::string& runtime = request.runtime.value;
  if (WIFSIGNALED(status)) {
    remove_container(runtime_path, request.container_name);
    throw RuntimeError(fmt::format("container: {} was killed by signal {}; container {} removed", runtime,
                                   WTERMSIG(status), request.container_name));
  }
  int code = WEXITSTATUS(status);
  if (code == 125) {
    remove_container(runtime_path, request.container_name);
    throw RuntimeError(
        fmt::format("container: {} could not start the container (exit 125) from image {}; its own error is above",
                    runtime, request.image.value));
  }
  if (code == 126 || code == 127) {
    // primus-cli never exits so itself: the runtime could not execute it (the probe ran it a moment ago).
    remove_container(runtime_path, request.container_name);
    throw RuntimeError(fmt::format("container: {} could not be executed in image {} (exit {}); the error is above",
                                   request.executable, request.image.value, code));
  }
  if (g_stop_signal != 0) {
    spdlog::info("container: stopped by signal {} (forwarded to the container); exit code {}",
                 static_cast<int>(g_stop_signal), code);
  } else if (code != 0) {
    spdlog::info("container: the command exited with code {}", code);
  }
  return code;
}

}  // namespace primus::cli
