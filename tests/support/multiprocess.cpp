#include "support/multiprocess.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace primus::testing {

namespace {

using Clock = std::chrono::steady_clock;

// In the child: runs the body, writes its message and exits; never returns.
[[noreturn]] void run_child(int rank, int write_fd, pid_t parent, const std::function<std::string(int)>& body,
                            int status_if_message) {
  // Dies with the test process (killed by a CTest timeout, say) instead of running on; the parent may have
  // exited before the prctl took effect.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(1);
  int code = 0;
  std::string text;
  try {
    text = body(rank);
    if (!text.empty()) code = status_if_message;
  } catch (const std::exception& e) {
    text = e.what();
    code = 1;
  } catch (...) {
    text = "an exception that is not a std::exception";
    code = 1;
  }
  text.resize(std::min<size_t>(text.size(), 16000));  // below a pipe's buffer, so the write cannot block
  [[maybe_unused]] const ssize_t n = ::write(write_fd, text.data(), text.size());
  ::_exit(code);
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);  // our own child, by its pid
  ::waitpid(pid, nullptr, 0);
}

}  // namespace

std::vector<RankResult> run_ranks(int size, std::chrono::seconds limit, const std::function<std::string(int)>& body,
                                  int status_if_message) {
  const pid_t parent = ::getpid();
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  // The ranks already started would wait for one that cannot start: they are ended before the error is thrown.
  auto cannot_start = [&](int rank, int error) {
    for (pid_t started : pids) kill_and_reap(started);
    for (int fd : pipes) ::close(fd);
    return std::runtime_error("cannot start rank " + std::to_string(rank) + ": " + std::strerror(error));
  };
  for (int rank = 0; rank < size; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) throw cannot_start(rank, errno);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      run_child(rank, fds[1], parent, body, status_if_message);
    }
    if (pid < 0) {
      const int error = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      throw cannot_start(rank, error);
    }
    ::close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<RankResult> results(size);
  const auto deadline = Clock::now() + limit;
  for (int running = size; running > 0 && Clock::now() < deadline;) {
    for (int rank = 0; rank < size; ++rank) {
      int status = 0;
      if (pids[rank] > 0 && ::waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        results[rank].status = WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
        pids[rank] = -1;
        --running;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < size; ++rank) {
    if (pids[rank] > 0) {  // hung
      kill_and_reap(pids[rank]);
      results[rank].message = "still running at the deadline (hung?); ";
    }
    char chunk[4096];
    for (ssize_t n; (n = ::read(pipes[rank], chunk, sizeof(chunk))) > 0;) results[rank].message.append(chunk, n);
    ::close(pipes[rank]);
  }
  return results;
}

}  // namespace primus::testing
