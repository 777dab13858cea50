// Process management of the multi-process launcher (see worker_pool.h). One thread, one poll loop over the
// workers' stdout/stderr pipes and a self-pipe that the signal handlers write to (SIGINT, SIGTERM, SIGCHLD),
// so the handlers do nothing but write(2) and all decisions happen in the loop.
//
// Invariants:
// - Each worker leads its own process group: a Ctrl-C on the terminal reaches only the launcher, which
//   forwards it once. (Were the workers in the terminal's group they would see it twice, and the trainer
//   treats a second signal as "exit now, without a checkpoint".) Signals go to the whole group, so a worker's
//   own helpers stop with it.
// - A worker dies with the launcher (PR_SET_PDEATHSIG = SIGKILL): a launcher killed hard leaves no rank behind
//   holding a GPU.
// - A reaped worker's pipes are drained without blocking and closed then: a grandchild that keeps them open
//   cannot keep the launcher waiting.
#include "cli/worker_pool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>

#include "cli/cli.h"
#include "core/error.h"

extern char** environ;

namespace primus::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kTailLines = 20;
constexpr size_t kMaxLineBytes = 64 * 1024;  // a longer line without a newline is passed on in pieces
constexpr int kPollIntervalMs = 1000;        // also bounds how late a missed SIGCHLD is noticed

constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGCHLD, SIGPIPE};

int g_signal_pipe_write = -1;

void on_launcher_signal(int signal_number) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(signal_number);
  ssize_t ignored = ::write(g_signal_pipe_write, &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

// "SIGTERM", from glibc's table; "signal N" for one it does not name (the real-time signals).
std::string signal_name(int signal_number) {
  const char* abbreviation = ::sigabbrev_np(signal_number);
  return abbreviation != nullptr ? fmt::format("SIG{}", abbreviation) : fmt::format("signal {}", signal_number);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by " + signal_name(WTERMSIG(status));
  return fmt::format("ended with wait status {}", status);
}

// Lines of another rank worth showing: spdlog's error, critical and warning levels, primus-cli's error line,
// and the C++ runtime's last words before abort().
bool is_alert_line(const std::string& line) {
  for (const char* mark : {"[error]", "[critical]", "[warning]", "primus-cli: error:", "terminate called"}) {
    if (line.find(mark) != std::string::npos) return true;
  }
  return false;
}

// False when the write failed (errno says why): a closed console or a full disk must not stop the launcher.
bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::string errno_text() { return std::strerror(errno); }

struct Stream {
  int fd = -1;
  bool is_stderr = false;
  std::string partial;  // bytes after the last newline
};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out;
  Stream err{-1, true, {}};
  std::deque<std::string> tail;  // last kTailLines lines, both streams in arrival order
};

class WorkerPool {
 public:
  explicit WorkerPool(const WorkerPoolOptions& options) : options_(options) {}
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool();

  int run();

 private:
  void install_signal_handlers();
  void restore_signal_handlers();
  std::vector<std::string> worker_env(int local_rank) const;
  void start(Worker& worker);
  void poll_once();
  void read_stream(Worker& worker, Stream& stream);
  void take_lines(Worker& worker, Stream& stream, bool at_end);
  void handle_line(Worker& worker, const Stream& stream, const std::string& line);
  void reap();
  void on_worker_end(Worker& worker, int status);
  bool is_expected_end(int status) const;
  void on_launcher_signal_received(int signal_number);
  void signal_running(int signal_number);
  void enforce_deadline();
  bool any_running() const;
  int finish();
  std::string failure_message(const Worker& worker) const;
  void write_console(int fd, const std::string& text);

  WorkerPoolOptions options_;
  std::vector<Worker> workers_;
  int signal_pipe_[2] = {-1, -1};
  int dev_null_ = -1;
  int log_fd_ = -1;
  struct sigaction old_actions_[std::size(kHandledSignals)] = {};
  bool handlers_installed_ = false;

  int stop_signal_ = 0;                       // the first SIGINT/SIGTERM that reached the launcher
  std::optional<size_t> first_failure_;       // index into workers_
  bool failure_before_signal_ = false;        // the failure, not a signal, is why the ranks were stopped
  bool killed_ = false;                       // SIGKILL was sent to every running rank
  std::vector<int> checks_failed_;            // ranks that exited 1: their checks failed (preflight), not a crash
  std::optional<Clock::time_point> kill_at_;  // when the ranks still running get SIGKILL
};

WorkerPool::~WorkerPool() {
  // Reached with workers running only through an exception: leave none behind.
  for (Worker& worker : workers_) {
    if (!worker.running) continue;
    ::kill(-worker.pid, SIGKILL);
    ::kill(worker.pid, SIGKILL);
    int status = 0;
    while (::waitpid(worker.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  for (Worker& worker : workers_) {
    close_fd(worker.out.fd);
    close_fd(worker.err.fd);
  }
  restore_signal_handlers();
  close_fd(signal_pipe_[0]);
  close_fd(signal_pipe_[1]);
  close_fd(dev_null_);
  close_fd(log_fd_);
}

void WorkerPool::install_signal_handlers() {
  if (::pipe2(signal_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw RuntimeError("launcher: pipe: " + errno_text());
  g_signal_pipe_write = signal_pipe_[1];
  for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    sigemptyset(&action.sa_mask);
    // SIGPIPE is ignored: a console closed under the launcher (`| head`) must not kill it and, through
    // PDEATHSIG, every rank with it.
    action.sa_handler = kHandledSignals[i] == SIGPIPE ? SIG_IGN : on_launcher_signal;
    action.sa_flags = SA_RESTART | (kHandledSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    ::sigaction(kHandledSignals[i], &action, &old_actions_[i]);
  }
  handlers_installed_ = true;
}

void WorkerPool::restore_signal_handlers() {
  if (!handlers_installed_) return;
  for (size_t i = 0; i < std::size(kHandledSignals); ++i) ::sigaction(kHandledSignals[i], &old_actions_[i], nullptr);
  handlers_installed_ = false;
  g_signal_pipe_write = -1;
}

// The launcher's environment with the rank's contract variables set over it. A preset CUDA_VISIBLE_DEVICES or
// HIP_VISIBLE_DEVICES passes through unchanged.
std::vector<std::string> WorkerPool::worker_env(int local_rank) const {
  std::vector<std::pair<std::string, std::string>> contract = worker_environment(options_.layout, local_rank);
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string text(*entry);
    std::string key = text.substr(0, text.find('='));
    bool replaced = false;
    for (const auto& [name, value] : contract) replaced = replaced || name == key;
    if (!replaced) env.push_back(std::move(text));
  }
  for (const auto& [name, value] : contract) env.push_back(name + "=" + value);
  return env;
}

void WorkerPool::start(Worker& worker) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0)
    throw RuntimeError(fmt::format("launcher: rank {}: pipe: {}", worker.rank, errno_text()));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    std::string reason = errno_text();
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw RuntimeError(fmt::format("launcher: rank {}: pipe: {}", worker.rank, reason));
  }
  worker.out.fd = out_pipe[0];
  worker.err.fd = err_pipe[0];

  // Everything the child needs is built before fork(): after it only async-signal-safe calls are made.
  std::vector<std::string> env = worker_env(worker.local_rank);
  std::vector<char*> envp;
  for (std::string& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options_.argv;
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const char* executable = options_.executable.c_str();
  const pid_t launcher_pid = ::getpid();

  // Signals stay blocked across fork() so that none runs the launcher's handler in the child.
  sigset_t blocked;
  sigset_t previous;
  sigemptyset(&blocked);
  for (int signal_number : kHandledSignals) sigaddset(&blocked, signal_number);
  ::sigprocmask(SIG_BLOCK, &blocked, &previous);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher_pid) ::_exit(128 + SIGKILL);  // the launcher died before prctl took effect
    ::dup2(dev_null_, STDIN_FILENO);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    for (int signal_number : kHandledSignals) ::signal(signal_number, SIG_DFL);  // SIG_IGN would survive exec
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::execve(executable, argv.data(), envp.data());
    const char* message = "primus-cli: error: launcher: cannot execute the worker binary\n";
    ssize_t ignored = ::write(STDERR_FILENO, message, std::strlen(message));
    (void)ignored;
    ::_exit(127);
  }
  int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    throw RuntimeError(fmt::format("launcher: cannot start rank {}: fork: {}", worker.rank, std::strerror(fork_errno)));
  }
  ::setpgid(pid, pid);  // also here, so that a signal sent right away already finds the group
  ::fcntl(worker.out.fd, F_SETFL, O_NONBLOCK);
  ::fcntl(worker.err.fd, F_SETFL, O_NONBLOCK);
  worker.pid = pid;
  worker.running = true;
  spdlog::info("launcher: rank {} (local {}) started, pid {}", worker.rank, worker.local_rank, pid);
}

void WorkerPool::write_console(int fd, const std::string& text) {
  write_all(fd, text);
  if (log_fd_ >= 0 && !write_all(log_fd_, text)) {
    record_log_write_failure(fmt::format("--log-file {}: {}", options_.log_file, errno_text()));
  }
}

void WorkerPool::handle_line(Worker& worker, const Stream& stream, const std::string& line) {
  worker.tail.push_back(line);
  if (worker.tail.size() > kTailLines) worker.tail.pop_front();
  if (worker.local_rank == 0 && !options_.alerts_only) {
    write_console(stream.is_stderr ? STDERR_FILENO : STDOUT_FILENO, line + "\n");
  } else if (is_alert_line(line)) {
    write_console(STDERR_FILENO, fmt::format("[rank {}] {}\n", worker.rank, line));
  }
}

void WorkerPool::take_lines(Worker& worker, Stream& stream, bool at_end) {
  size_t start = 0;
  size_t newline = stream.partial.find('\n');
  while (newline != std::string::npos) {
    handle_line(worker, stream, stream.partial.substr(start, newline - start));
    start = newline + 1;
    newline = stream.partial.find('\n', start);
  }
  stream.partial.erase(0, start);
  if (stream.partial.size() >= kMaxLineBytes || (at_end && !stream.partial.empty())) {
    handle_line(worker, stream, stream.partial);
    stream.partial.clear();
  }
}

// Reads what is there without blocking; closes the stream at its end.
void WorkerPool::read_stream(Worker& worker, Stream& stream) {
  char buffer[65536];
  while (stream.fd >= 0) {
    ssize_t n = ::read(stream.fd, buffer, sizeof(buffer));
    if (n > 0) {
      stream.partial.append(buffer, static_cast<size_t>(n));
      take_lines(worker, stream, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    take_lines(worker, stream, true);
    close_fd(stream.fd);
  }
}

void WorkerPool::poll_once() {
  std::vector<pollfd> fds{{signal_pipe_[0], POLLIN, 0}};
  std::vector<std::pair<Worker*, Stream*>> owners{{nullptr, nullptr}};
  for (Worker& worker : workers_) {
    for (Stream* stream : {&worker.out, &worker.err}) {
      if (stream->fd < 0) continue;
      fds.push_back({stream->fd, POLLIN, 0});
      owners.emplace_back(&worker, stream);
    }
  }
  int timeout_ms = kPollIntervalMs;
  if (kill_at_ && !killed_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at_ - Clock::now()).count();
    timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, kPollIntervalMs));
  }
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;  // timeout or EINTR: the caller reaps anyway

  if (fds[0].revents != 0) {
    unsigned char signals[64];
    ssize_t n;
    while ((n = ::read(signal_pipe_[0], signals, sizeof(signals))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (signals[i] == SIGINT || signals[i] == SIGTERM) on_launcher_signal_received(signals[i]);
      }
    }
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents != 0) read_stream(*owners[i].first, *owners[i].second);
  }
}

// Ranks found ended in one pass are handled deaths-by-signal first: a rank that dies takes its peers down
// with errors from their collectives within milliseconds, and the dead one is the cause to name.
void WorkerPool::reap() {
  std::vector<std::pair<Worker*, int>> ended;
  for (Worker& worker : workers_) {
    if (!worker.running) continue;
    int status = 0;
    if (::waitpid(worker.pid, &status, WNOHANG) == worker.pid) ended.emplace_back(&worker, status);
  }
  std::stable_partition(ended.begin(), ended.end(), [](const auto& end) { return WIFSIGNALED(end.second); });
  for (auto& [worker, status] : ended) on_worker_end(*worker, status);
}

// What a rank does when asked to stop: exit 0 or 128+N after the forwarded signal, die by it, or by our SIGKILL.
bool WorkerPool::is_expected_end(int status) const {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  if (stop_signal_ == 0 && !first_failure_ && !options_.forward_stop_signals) {
    // Under Slurm the step's signal reaches the ranks and us at about the same time; a rank it ended may be
    // reaped before our own copy is read. That is a stop, not a failure.
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) - 128 : WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return code == SIGINT || code == SIGTERM;
  }
  if (stop_signal_ == 0 && !first_failure_) return false;
  if (WIFEXITED(status)) return WEXITSTATUS(status) == 128 + SIGINT || WEXITSTATUS(status) == 128 + SIGTERM;
  if (!WIFSIGNALED(status)) return false;
  int signal_number = WTERMSIG(status);
  return signal_number == SIGINT || signal_number == SIGTERM || (killed_ && signal_number == SIGKILL);
}

void WorkerPool::on_worker_end(Worker& worker, int status) {
  worker.running = false;
  worker.status = status;
  read_stream(worker, worker.out);
  read_stream(worker, worker.err);
  close_fd(worker.out.fd);
  close_fd(worker.err.fd);

  // Exit 1 is a result (preflight found a failed check), not a crash: the other ranks finish, the launcher exits 1.
  if (WIFEXITED(status) && WEXITSTATUS(status) == kExitChecksFailed && stop_signal_ == 0 && !first_failure_) {
    spdlog::info("launcher: rank {} (pid {}) exited with code 1 (checks failed)", worker.rank, worker.pid);
    checks_failed_.push_back(worker.rank);
    return;
  }
  bool expected = is_expected_end(status);
  if (expected && stop_signal_ == 0 && !first_failure_ && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    stop_signal_ = WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status) - 128;
    spdlog::warn("launcher: rank {} was stopped by {} from Slurm", worker.rank, signal_name(stop_signal_));
  }
  if (expected) {
    spdlog::info("launcher: rank {} (pid {}) {}", worker.rank, worker.pid, describe_status(status));
    return;
  }
  spdlog::error("launcher: rank {} (pid {}) {}", worker.rank, worker.pid, describe_status(status));
  if (first_failure_) return;
  first_failure_ = static_cast<size_t>(&worker - workers_.data());
  failure_before_signal_ = stop_signal_ == 0;
  kill_at_ = Clock::now() +
             std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.failure_grace_s));
  if (!any_running()) return;
  if (stop_signal_ == 0) {
    spdlog::warn("launcher: stopping the other ranks (SIGTERM; SIGKILL after {:g} s)", options_.failure_grace_s);
    signal_running(SIGTERM);
  } else {
    spdlog::warn("launcher: ranks still stopping get SIGKILL in {:g} s", options_.failure_grace_s);
  }
}

void WorkerPool::on_launcher_signal_received(int signal_number) {
  if (stop_signal_ == 0 && !first_failure_ && !options_.forward_stop_signals) {
    stop_signal_ = signal_number;
    spdlog::warn(
        "launcher: {} received; the ranks got it from Slurm too, so it is not forwarded (send it again to "
        "kill the ranks now)",
        signal_name(signal_number));
    return;
  }
  if (stop_signal_ == 0 && !first_failure_) {
    stop_signal_ = signal_number;
    spdlog::warn(
        "launcher: {} received: forwarded to every rank (training saves a checkpoint and stops; send it "
        "again to kill the ranks now)",
        signal_name(signal_number));
    signal_running(signal_number);
    return;
  }
  if (stop_signal_ == 0) stop_signal_ = signal_number;
  if (killed_) return;
  spdlog::warn("launcher: {} received again: killing every rank (SIGKILL)", signal_name(signal_number));
  signal_running(SIGKILL);
  killed_ = true;
}

void WorkerPool::signal_running(int signal_number) {
  for (Worker& worker : workers_) {
    if (!worker.running) continue;
    // The group first (the worker and its helpers); the pid alone if the group is not formed yet.
    if (::kill(-worker.pid, signal_number) != 0) ::kill(worker.pid, signal_number);
  }
}

void WorkerPool::enforce_deadline() {
  if (!kill_at_ || killed_ || Clock::now() < *kill_at_ || !any_running()) return;
  std::string ranks;
  for (const Worker& worker : workers_) {
    if (worker.running) ranks += (ranks.empty() ? "" : ", ") + std::to_string(worker.rank);
  }
  spdlog::warn("launcher: rank(s) {} still running {:g} s after the failure: SIGKILL", ranks, options_.failure_grace_s);
  signal_running(SIGKILL);
  killed_ = true;
}

bool WorkerPool::any_running() const {
  for (const Worker& worker : workers_) {
    if (worker.running) return true;
  }
  return false;
}

std::string WorkerPool::failure_message(const Worker& worker) const {
  std::string others;
  if (workers_.size() > 1) {
    others =
        options_.layout.nnodes > 1 ? "; the other ranks on this node were stopped" : "; the other ranks were stopped";
  }
  std::string message =
      fmt::format("rank {} (pid {}) {}{}.", worker.rank, worker.pid, describe_status(worker.status), others);
  if (worker.tail.empty()) return message + fmt::format(" Rank {} printed nothing.", worker.rank);
  message += fmt::format(" Last lines of rank {}:", worker.rank);
  for (const std::string& line : worker.tail) message += "\n    " + line;
  return message;
}

int WorkerPool::finish() {
  if (first_failure_) {
    const Worker& failed = workers_[*first_failure_];
    report_error(failure_message(failed));
    if (failure_before_signal_) {
      int code = WIFEXITED(failed.status) ? WEXITSTATUS(failed.status) : kExitRuntime;
      return code == kExitUsage || code == kExitRuntime ? code : kExitRuntime;
    }
  }
  if (stop_signal_ != 0) {
    spdlog::info("launcher: stopped by {}", signal_name(stop_signal_));
    return 128 + stop_signal_;
  }
  if (!checks_failed_.empty()) {
    spdlog::info("launcher: all {} rank(s) finished; checks failed on rank(s) {}", workers_.size(),
                 fmt::join(checks_failed_, ", "));
    return kExitChecksFailed;
  }
  spdlog::info("launcher: all {} rank(s) finished", workers_.size());
  return kExitOk;
}

int WorkerPool::run() {
  if (!options_.log_file.empty()) {
    // The launcher's logger has the same file open for append; whole-line writes keep the two apart.
    log_fd_ = ::open(options_.log_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (log_fd_ < 0) throw UsageError(fmt::format("--log-file {}: cannot open: {}", options_.log_file, errno_text()));
  }
  dev_null_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (dev_null_ < 0) throw RuntimeError("launcher: cannot open /dev/null: " + errno_text());
  install_signal_handlers();

  const LaunchLayout& layout = options_.layout;
  spdlog::info("launcher: starting {} rank(s) on node {} of {} (world size {}, master {}:{})", layout.nproc_per_node,
               layout.node_rank, layout.nnodes, layout.world_size(), layout.master_addr, layout.master_port);
  workers_.resize(static_cast<size_t>(layout.nproc_per_node));
  for (int local = 0; local < layout.nproc_per_node; ++local) {
    Worker& worker = workers_[static_cast<size_t>(local)];
    worker.local_rank = local;
    worker.rank = layout.global_rank(local);
    start(worker);
  }
  while (any_running()) {
    poll_once();
    reap();
    enforce_deadline();
  }
  return finish();
}

}  // namespace

int run_worker_pool(const WorkerPoolOptions& options) {
  WorkerPool pool(options);
  return pool.run();
}

}  // namespace primus::cli
